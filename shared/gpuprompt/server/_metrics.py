"""Prometheus metrics of one server app: HTTP traffic, stage latencies, and the core's own counters.

Each app has its own registry (two apps in one process never clash). The core's queue depths,
batch sizes and cache hit rates are read from the components' ``stats()`` at scrape time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from gpuprompt.context import ContextCache
    from gpuprompt.embed import Embedder
    from gpuprompt.index import VectorIndex
    from gpuprompt.llm import LLMEngine

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

logger = logging.getLogger("gpuprompt.server")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


class _CoreCollector(Collector):
    """Reads the core components' counters at scrape time."""

    def __init__(
        self,
        embedder: Callable[[], Embedder | None],
        llm: Callable[[], LLMEngine | None],
        memory: Callable[[], ContextCache | None],
        collections: Callable[[], dict[str, VectorIndex]],
    ) -> None:
        self._embedder = embedder
        self._llm = llm
        self._memory = memory
        self._collections = collections

    def collect(self) -> Iterator[Any]:
        embedder = self._embedder()
        if embedder is not None:
            yield from _embedder_families(embedder)
        llm = self._llm()
        if llm is not None:
            yield from _llm_families(llm)
        memory = self._memory()
        if memory is not None:
            stats = memory.stats()
            yield _gauge("gpuprompt_context_sessions", "Conversation sessions held by the context cache.", stats.sessions)
            yield _gauge("gpuprompt_context_turns", "Turns held by the context cache, all sessions.", stats.turns)
            yield _counter("gpuprompt_context_evicted_sessions", "Sessions evicted by the LRU bound.", stats.evicted_sessions)
            yield _counter("gpuprompt_context_expired_sessions", "Sessions dropped by the TTL.", stats.expired_sessions)
            yield _counter("gpuprompt_context_dropped_turns", "Turns dropped by the per-session bound.", stats.dropped_turns)
        yield from _collection_families(self._collections())


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _embedder_families(embedder: Embedder) -> Iterator[Any]:
    stats = embedder.stats()
    batcher = stats.batcher
    yield _gauge("gpuprompt_embedder_queue_depth", "Texts waiting in the embedder's batch queue.", batcher.queue_depth)
    yield _counter("gpuprompt_embedder_batches", "Forward passes run by the embedder.", batcher.batches)
    yield _counter("gpuprompt_embedder_batched_texts", "Texts encoded in those forward passes.", batcher.items)
    yield _gauge("gpuprompt_embedder_batch_size_mean", "Mean texts per embedder forward pass.", batcher.mean_batch_size)
    yield _gauge("gpuprompt_embedder_batch_size_max", "Largest embedder forward pass.", batcher.max_batch_size)
    wait = GaugeMetricFamily(
        "gpuprompt_embedder_queue_wait_seconds", "Recent queue wait of embedder texts, by quantile.", labels=["quantile"]
    )
    wait.add_metric(["0.5"], batcher.queue_wait_p50_ms / 1000.0)
    wait.add_metric(["0.95"], batcher.queue_wait_p95_ms / 1000.0)
    yield wait
    yield _counter("gpuprompt_embedder_texts", "Texts asked of the embedder.", stats.texts)
    yield _counter("gpuprompt_embedder_cache_hits", "Texts served from the device embedding cache.", stats.cache_hits)
    yield _counter("gpuprompt_embedder_cache_misses", "Texts the embedder had to encode.", stats.cache_misses)
    looked_up = stats.cache_hits + stats.cache_misses
    yield _gauge(
        "gpuprompt_embedder_cache_hit_ratio",
        "Share of distinct texts served from the embedding cache since start.",
        stats.cache_hits / looked_up if looked_up else 0.0,
    )
    yield _gauge("gpuprompt_embedder_cache_entries", "Embeddings held in the device cache.", stats.cache_entries)


def _collection_families(indexes: dict[str, VectorIndex]) -> Iterator[Any]:
    labels = ["collection"]
    documents = GaugeMetricFamily("gpuprompt_collection_documents", "Records stored per collection.", labels=labels)
    depth = GaugeMetricFamily(
        "gpuprompt_collection_search_queue_depth", "Searches waiting in a collection's batch queue.", labels=labels
    )
    searches = CounterMetricFamily(
        "gpuprompt_collection_searches", "Searches served by a collection's batched index.", labels=labels
    )
    mean = GaugeMetricFamily(
        "gpuprompt_collection_search_batch_size_mean", "Mean searches per batched index call.", labels=labels
    )
    largest = GaugeMetricFamily(
        "gpuprompt_collection_search_batch_size_max", "Largest batched index call.", labels=labels
    )
    for name, index in sorted(indexes.items()):
        try:
            stats = index.stats()
        except Exception:  # noqa: BLE001 - one collection that cannot be read must not break the scrape
            logger.warning("collection %r has no stats (its index cannot be read); left out of /metrics", name)
            continue
        documents.add_metric([name], stats.count)
        depth.add_metric([name], stats.batcher.queue_depth)
        searches.add_metric([name], stats.batcher.items)
        mean.add_metric([name], stats.batcher.mean_batch_size)
        largest.add_metric([name], stats.batcher.max_batch_size)
    yield from (documents, depth, searches, mean, largest)


def _llm_families(llm: LLMEngine) -> Iterator[Any]:
    stats = llm.stats()
    yield _gauge("gpuprompt_llm_in_flight", "Generation requests queued or running in the engine.", stats.in_flight)
    yield _counter("gpuprompt_llm_requests", "Generation requests accepted by the engine.", stats.requests)
    yield _counter("gpuprompt_llm_completed", "Generation requests that finished.", stats.completed)
    yield _counter("gpuprompt_llm_aborted", "Generation requests cancelled by their caller.", stats.aborted)
    yield _counter("gpuprompt_llm_failed", "Generation requests that failed.", stats.failed)
    yield _counter("gpuprompt_llm_prompt_tokens", "Prompt tokens of finished requests.", stats.prompt_tokens)
    yield _counter("gpuprompt_llm_completion_tokens", "Generated tokens of finished requests.", stats.completion_tokens)


class Metrics:
    """The metrics of one app, in their own registry.

    Args:
        embedder: returns the app's embedder (or None before it exists).
        llm: returns the app's engine (or None).
        memory: returns the app's context cache (or None).
        collections: returns ``{collection name: its VectorIndex}``.
    """

    def __init__(
        self,
        *,
        embedder: Callable[[], Embedder | None],
        llm: Callable[[], LLMEngine | None],
        memory: Callable[[], ContextCache | None],
        collections: Callable[[], dict[str, VectorIndex]],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http_requests = Counter(
            "gpuprompt_http_requests", "HTTP requests answered.", ["method", "route", "status"], registry=r
        )
        self.http_latency = Histogram(
            "gpuprompt_http_request_duration_seconds",
            "HTTP request latency, to the last byte (streams included).",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.http_in_flight = Gauge("gpuprompt_http_in_flight", "Model requests being served now.", registry=r)
        self.rejected = Counter(
            "gpuprompt_http_rejected", "Requests refused before reaching a model.", ["reason"], registry=r
        )
        self.stage_latency = Histogram(
            "gpuprompt_rag_stage_seconds",
            "Per-stage latency of collection chat answers.",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gpuprompt_llm_time_to_first_token_seconds",
            "Time from request to first generated token.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.generation_latency = Histogram(
            "gpuprompt_llm_generation_seconds",
            "Time from request to last generated token.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.embedding_latency = Histogram(
            "gpuprompt_embedding_seconds", "Time to embed one request's texts.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.embedding_inputs = Histogram(
            "gpuprompt_embedding_request_texts", "Texts per embedding request.", buckets=_SIZE_BUCKETS, registry=r
        )
        self.rerank_latency = Histogram(
            "gpuprompt_rerank_seconds", "Time to score one rerank (or score) request's pairs.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.rerank_documents = Histogram(
            "gpuprompt_rerank_request_documents", "Documents (pairs) per rerank or score request.",
            buckets=_SIZE_BUCKETS, registry=r,
        )
        r.register(_CoreCollector(embedder, llm, memory, collections))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
