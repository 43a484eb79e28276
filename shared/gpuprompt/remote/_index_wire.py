"""RemoteIndex's wire side: request bodies (upserts in parts that fit, searches by vector or by text),
answers read back into the core's types, and the batcher that coalesces this process's searches."""

from __future__ import annotations

import base64
import json
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuprompt.batching import MicroBatcher
from gpuprompt.errors import (
    ClosedError,
    EngineError,
    QueueFullError,
    RequestTimeoutError,
    describe,
)
from gpuprompt.index._checks import is_tensor
from gpuprompt.index._fusion import Fusion
from gpuprompt.index._search import SearchRequest, request_cost
from gpuprompt.index._types import Hit, Record
from gpuprompt.wire import MAX_RECORDS_PER_REQUEST, encode_vectors

if TYPE_CHECKING:
    from gpuprompt.index._checks import Upsert


BODY_BUDGET = 8 * 1024 * 1024
"""Bytes per request body a client aims under (the server's default limit is 16 MiB)."""


def _size(value: Any) -> int:
    size = getattr(value, "size", None)
    if callable(size):  # a torch tensor's size() is its shape
        size = value.numel()
    return size if isinstance(size, int) else 0


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _b64(matrix: Any) -> str:
    if is_tensor(matrix):
        matrix = matrix.detach().cpu().numpy()
    return encode_vectors(matrix)


def _upsert_bodies(upsert: Upsert, embedder: str | None, allow_other: bool) -> Iterator[dict[str, Any]]:
    """The upsert request bodies of a checked add: at most 2048 records and about 8 MiB each."""
    row_bytes = upsert.vectors.shape[1] * 16 // 3 + 64
    start, n = 0, len(upsert.unique_ids)
    while start < n:
        end, budget = start, 0
        while end < n and end - start < MAX_RECORDS_PER_REQUEST:
            document, metadata = upsert.documents[end], upsert.metadatas[end]
            cost = row_bytes + len(upsert.unique_ids[end]) * 4 + (len(document) * 4 if document else 0)
            cost += len(json.dumps(metadata, ensure_ascii=False)) * 2 if metadata else 0
            if end > start and budget + cost > BODY_BUDGET:
                break
            budget += cost
            end += 1
        documents = upsert.documents[start:end]
        yield {
            "ids": upsert.unique_ids[start:end],
            "vectors": _b64(upsert.vectors[start:end]),
            "documents": documents if any(d is not None for d in documents) else None,
            "metadatas": upsert.metadatas[start:end],
            "embedder": embedder,
            "allow_other_embedder": allow_other,
        }
        start = end


@dataclass(frozen=True)
class TextSearch:
    """A queued search by query texts (the server embeds them for dense and hybrid)."""

    texts: list[str]
    k: int
    filter: Mapping[str, Any] | None
    key: str | None
    mmr: tuple[int, float] | None = None
    mode: str = "dense"
    fusion: Fusion | None = None


def _cost(request: SearchRequest | TextSearch) -> int:
    return len(request.texts) if isinstance(request, TextSearch) else request_cost(request)


def _search_body(request: SearchRequest | TextSearch) -> dict[str, Any]:
    body: dict[str, Any] = {"k": request.k, "filter": request.filter}
    if isinstance(request, TextSearch) or request.mode == "lexical":
        assert request.texts is not None
        body["texts"] = request.texts
    else:
        body["queries"] = _b64(request.queries)
        if request.texts is not None:
            body["texts"] = request.texts
    if request.mode != "dense":
        body["mode"] = request.mode
        fusion = request.fusion
        if fusion is not None:
            body.update(fusion=fusion.method, alpha=fusion.alpha, fetch_k=fusion.fetch_k, rrf_k=fusion.rrf_k)
    if request.mmr is not None:
        body["mmr"] = {"k": request.mmr[0], "lambda_mult": request.mmr[1]}
    return body


def _object(answer: Any, where: str) -> dict[str, Any]:
    if not isinstance(answer, dict):
        raise EngineError(f"{where} sent {describe(answer)} where a JSON object was expected; is base_url a "
                          "gpuprompt server?")
    return answer


def _hit(item: Mapping[str, Any]) -> Hit:
    metadata = item.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise TypeError(f"hit metadata must be an object (got {describe(metadata)})")
    return Hit(str(item["id"]), float(item["score"]), item.get("document"), metadata)


def _vector(value: Any) -> np.ndarray:
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value, validate=True), dtype="<f4").astype(np.float32)
    return np.asarray(value, dtype=np.float32)


def _records(answer: Any, where: str) -> list[Record]:
    try:
        return [Record(str(item["id"]), _vector(item["vector"]), item.get("document"), dict(item.get("metadata") or {}))
                for item in _object(answer, where)["data"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineError(f"{where} sent a malformed records answer ({exc!r}).") from exc


def _ids(answer: Any, where: str) -> list[str]:
    ids = _object(answer, where).get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise EngineError(f"{where} sent a malformed ids answer.")
    return ids


def _batcher(index: Any, max_batch_cost: int) -> MicroBatcher[SearchRequest, Any]:
    ref = weakref.ref(index)

    def run(requests: list[SearchRequest]) -> list[Any]:
        target = ref()
        if target is None:
            raise ClosedError("the RemoteIndex behind this search was garbage-collected.")
        return target._run_batch(requests)

    batcher: MicroBatcher[SearchRequest, Any] = MicroBatcher(
        run,
        name="remote-search",
        cost=_cost,
        max_batch_cost=max_batch_cost,
        # Only a refused search is worth isolating; a busy, slow or gone server fails the whole batch.
        fatal=(EngineError, ClosedError, QueueFullError, RequestTimeoutError),
        **index._batch_options,
    )
    weakref.finalize(index, batcher.close, timeout=0)
    return batcher
