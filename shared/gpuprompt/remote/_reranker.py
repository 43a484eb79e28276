"""RemoteReranker: the :class:`~gpuprompt.Reranker` calls of the adapters, served by a running
``gpuprompt serve --rerank-model`` (``POST /v1/rerank`` and ``/score``) or by another server of the
same Cohere-shaped ``/v1/rerank`` API (vLLM serving a cross-encoder, infinity). No torch, no model.
text-embeddings-inference serves ``/rerank`` in a shape of its own (``texts`` in, a list out), which
``gpuprompt serve`` also answers but this client does not send."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from gpuprompt.errors import ClosedError, ConfigurationError, EngineError, GPUPromptError, InputTypeError, describe
from gpuprompt.remote._client import SERVICE, RemoteClient, client_for
from gpuprompt.remote._config import RemoteConfig
from gpuprompt.remote._embedder import _match, _model_ids
from gpuprompt.rerank import RerankHit, check_documents, check_top_n
from gpuprompt.validation import check_str
from gpuprompt.wire import HEALTH, MAX_RERANK_DOCUMENTS, MODELS, RERANK, SCORE, redact

__all__ = ["RemoteReranker"]


class RemoteReranker:
    """Reranking by a server, behind the :class:`~gpuprompt.protocols.RerankerLike` calls.

    The server batches every worker's pairs together; the same checks as in process run here
    before anything is sent (a bad query, a ``None`` document, ``top_n`` < 1: typed errors naming
    the item). Nothing connects until the first call (or :meth:`load`).

    Example:
        >>> reranker = RemoteReranker("http://127.0.0.1:8000")      # gpuprompt serve --rerank-model ...
        >>> reranker.rerank("red dress", ["Aurora dress: red cotton", "blue jeans"], top_n=1)
        [RerankHit(index=0, score=0.9981, document='Aurora dress: red cotton')]

    Args:
        base_url: the server (``http://host:port``), or a :class:`RemoteConfig`; None reads
            ``GPUPROMPT_URL``.
        model: the rerank model to ask for (checked against the served one on load); None for the
            server's.
        api_key: the server's API key (with a URL).
        client: a :class:`RemoteClient` to use instead of the process's shared one.
        **options: other :class:`RemoteConfig` fields (``read_timeout``, ``max_retries``, ...).
    """

    def __init__(self, base_url: str | RemoteConfig | None = None, *, model: str | None = None,
                 api_key: str | None = None, client: RemoteClient | None = None, **options: Any) -> None:
        check_str(model, "model", allow_none=True, allow_empty=False, error=ConfigurationError)
        self.client = client_for(base_url, api_key, client, options, owner="RemoteReranker")
        self.model = model
        self._served: str | None = None
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"<RemoteReranker {redact(self.client.root)!r} model={self._served or self.model!r}>"

    @property
    def model_id(self) -> str:
        """The served rerank model's id (asks the server once)."""
        self.load()
        assert self._served is not None
        return self._served

    @property
    def device(self) -> str:
        """``"remote"``: the model runs on the server."""
        return "remote"

    # ------------------------------------------------------------------ loading
    def load(self) -> RemoteReranker:
        """Ask the server which rerank model it serves (``GET /health``, ``GET /v1/models``).

        Raises:
            ConfigurationError: a gpuprompt server that serves no reranker (``--rerank-model``
                unset), or a ``model`` the server does not serve.
        """
        self._check_open()
        if self._served is None:
            models = self.client.request("GET", MODELS)
            try:
                health = self.client.request("GET", HEALTH)
            except GPUPromptError:  # not a gpuprompt server: the model list must do
                health = {}
            self._choose(health, models)
        return self

    async def aload(self) -> RemoteReranker:
        """Async :meth:`load` (never blocks the caller's loop)."""
        self._check_open()
        if self._served is None:
            models = await self.client.arequest("GET", MODELS)
            try:
                health = await self.client.arequest("GET", HEALTH)
            except GPUPromptError:
                health = {}
            self._choose(health, models)
        return self

    def _choose(self, health: Any, models: Any) -> None:
        listed = _model_ids(models, self.client.root)
        root = redact(self.client.root)
        if isinstance(health, Mapping) and "rerank_model" in health:  # a gpuprompt server
            served = health.get("rerank_model")
            if not isinstance(served, str) or not served:
                raise ConfigurationError(
                    f"the gpuprompt server at {root} reranks nothing: start it with --rerank-model NAME (a cross-encoder) "
                    "to serve /v1/rerank."
                )
            candidates = [served]
        else:
            candidates = listed
        if self.model is None:
            if not candidates:
                raise EngineError(f"{SERVICE} at {root} lists no models; is base_url a rerank server?")
            chosen = candidates[0]
        else:
            chosen = _match(self.model, candidates)
            if chosen is None:
                raise ConfigurationError(
                    f"the server at {root} serves the rerank model {candidates[0] if len(candidates) == 1 else candidates}, "
                    f"not {self.model!r}; pass that name as the model, or none for the server's."
                )
        with self._lock:
            self._served = chosen

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this RemoteReranker was closed; create a new one.")

    # ------------------------------------------------------------------ requests
    def _rerank_body(self, query: Any, documents: Any, top_n: Any) -> tuple[list[str], dict[str, Any]]:
        checked = check_str(query, "query")
        texts = check_documents(documents, MAX_RERANK_DOCUMENTS)
        top_n = check_top_n(top_n)
        # More than there are keeps them all, here as in process; peers cap top_n at the documents.
        body = {"model": self._served, "query": checked, "documents": texts,
                "top_n": None if top_n is None else min(top_n, max(1, len(texts))), "return_documents": False}
        return texts, body

    def _hits(self, answer: Any, documents: list[str], top_n: int | None) -> list[RerankHit]:
        """The answer's results as hits, best first, after checking them: each index once and in
        range, finite scores, no more than ``top_n`` (a peer that ignores it is cut here)."""
        where = redact(self.client.url(RERANK))
        try:
            hits = [self._hit(item, documents) for item in answer["results"]]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise EngineError(f"{SERVICE} at {where} sent a malformed rerank answer ({exc!r}).") from exc
        if len({hit.index for hit in hits}) != len(hits):
            raise EngineError(f"{SERVICE} at {where} sent a rerank answer that ranks a document twice.")
        expected = len(documents) if top_n is None else min(top_n, len(documents))
        if len(hits) < expected:
            raise EngineError(f"{SERVICE} at {where} ranked {len(hits)} of the {len(documents)} documents, "
                              f"{expected} asked for.")
        return sorted(hits, key=lambda hit: (-hit.score, hit.index))[:expected]

    @staticmethod
    def _hit(item: Any, documents: list[str]) -> RerankHit:
        index, score = item["index"], item["relevance_score"]
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(documents):
            raise ValueError(f"index {index!r} is not a position in the {len(documents)} documents")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise ValueError(f"relevance_score {score!r} is not a finite number")
        return RerankHit(index, float(score), documents[index])

    def rerank(self, query: str, documents: Sequence[str], top_n: int | None = None) -> list[RerankHit]:
        """The documents ordered by the server's cross-encoder, best first (as :meth:`Reranker.rerank`)."""
        texts, body = self._rerank_body(query, documents, top_n)
        if not texts:
            return []
        self.load()
        body["model"] = self._served
        return self._hits(self.client.request("POST", RERANK, body, idempotent=True), texts, top_n)

    async def arerank(self, query: str, documents: Sequence[str], top_n: int | None = None) -> list[RerankHit]:
        """Async :meth:`rerank` (the caller's loop never waits on the network)."""
        texts, body = self._rerank_body(query, documents, top_n)
        if not texts:
            return []
        await self.aload()
        body["model"] = self._served
        return self._hits(await self.client.arequest("POST", RERANK, body, idempotent=True), texts, top_n)

    @staticmethod
    def _pairs(pairs: Any) -> list[tuple[str, str]]:
        if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence):
            raise InputTypeError(f"'pairs' must be a list of (query, document) str pairs (got {describe(pairs)}).")
        out = []
        for i, pair in enumerate(pairs):
            if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
                raise InputTypeError(f"'pairs[{i}]' must be a (query, document) pair of str (got {describe(pair)}).")
            out.append((check_str(pair[0], f"pairs[{i}][0]"), check_str(pair[1], f"pairs[{i}][1]")))
        check_documents([d for _, d in out], MAX_RERANK_DOCUMENTS)
        return out  # type: ignore[return-value]

    def _scores(self, answer: Any, n: int) -> list[float]:
        try:
            data = sorted(answer["data"], key=lambda item: int(item["index"]))
            scores = [float(item["score"]) for item in data]
            indexes = [item["index"] for item in data]
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineError(f"{SERVICE} at {redact(self.client.url(SCORE))} sent a malformed score answer "
                              f"({exc!r}).") from exc
        if len(scores) != n:
            raise EngineError(f"{SERVICE} answered {len(scores)} scores for {n} pairs.")
        if indexes != list(range(n)) or any(isinstance(i, bool) for i in indexes) \
                or not all(math.isfinite(s) for s in scores):
            raise EngineError(f"{SERVICE} at {redact(self.client.url(SCORE))} sent a malformed score answer: each "
                              f"pair's index 0..{n - 1} once, with a finite score, expected.")
        return scores

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """The server's score of each (query, document) pair, in order (``POST /score``)."""
        checked = self._pairs(pairs)
        if not checked:
            return []
        self.load()
        body = {"model": self._served, "text_1": [q for q, _ in checked], "text_2": [d for _, d in checked]}
        return self._scores(self.client.request("POST", SCORE, body, idempotent=True), len(checked))

    async def ascore(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """Async :meth:`score`."""
        checked = self._pairs(pairs)
        if not checked:
            return []
        await self.aload()
        body = {"model": self._served, "text_1": [q for q, _ in checked], "text_2": [d for _, d in checked]}
        return self._scores(await self.client.arequest("POST", SCORE, body, idempotent=True), len(checked))

    def close(self) -> None:
        """Refuse further calls (the shared connection pool stays open for other users)."""
        self._closed = True
