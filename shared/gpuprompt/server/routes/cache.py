"""The semantic answer cache over HTTP: one server-side :class:`~gpuprompt.AnswerCache` for every remote
``GPUPromptSemanticCache`` (:class:`gpuprompt.remote.RemoteAnswerCache`), same semantics as in process.

Routes (behind the server's API key, like every ``/v1`` route)::

    POST   /v1/cache/lookup   {namespace, prompt, text?, score_threshold?}  -> cache.lookup {hit, answer}
    POST   /v1/cache/update   {namespace, prompt, text?, answer}            -> cache.updated
    POST   /v1/cache/clear    {namespace}: forget one namespace             -> cache.cleared
    DELETE /v1/cache          forget every entry                            -> cache.cleared
    GET    /v1/cache          counters and bounds                           -> cache

One cache, created with the routes over the server's embedder (nothing loads until the first
lookup or update) and bounded by :data:`MAX_ENTRIES` and :data:`TTL_SECONDS`: a lookup tries the
exact ``(namespace, prompt)`` first, then the most similar prompt of the namespace, at the
caller's own ``score_threshold``. A namespace is the caller's model and settings (LangChain's
``llm_string``): callers of different namespaces never share an entry, callers of the same one
(every worker of an app) do. The cache keys a namespace by its SHA-256 and a prompt by the
SHA-256 of both, so only answers and vectors take memory: at most :data:`MAX_ENTRIES` answers of
at most :data:`MAX_ANSWER_BYTES` each.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Annotated, Any, Literal

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import AfterValidator, BaseModel

from gpuprompt.answer_cache import DEFAULT_MAX_ENTRIES, DEFAULT_TTL_SECONDS
from gpuprompt.server._http import json_response
from gpuprompt.server.schemas.base import Text, _number, _run, _Strict
from gpuprompt.server.state import State
from gpuprompt.wire import CACHE, CACHE_CLEAR, CACHE_LOOKUP, CACHE_UPDATE, MAX_ANSWER_BYTES, V1, check_answer

__all__ = [
    "MAX_ANSWER_BYTES",
    "MAX_ENTRIES",
    "TTL_SECONDS",
    "CacheCleared",
    "CacheInfo",
    "ClearNamespaceRequest",
    "LookupRequest",
    "LookupResponse",
    "UpdateRequest",
    "namespace_key",
    "router",
]

MAX_ENTRIES = DEFAULT_MAX_ENTRIES
"""Most answers the server keeps (the in-process default); the least recently used go first."""
TTL_SECONDS = DEFAULT_TTL_SECONDS
"""An answer's lifetime on the server, in seconds (the in-process default)."""


def namespace_key(namespace: str) -> str:
    """The server cache's namespace for a caller's ``namespace``: its SHA-256 in hex (an
    ``llm_string`` can be long; the hash is what the cache holds per entry)."""
    return hashlib.sha256(namespace.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------- schemas
Threshold = _number(-1.0, 1.0)
"""A cosine similarity threshold."""
Answer = Annotated[Any, AfterValidator(_run(check_answer))]
"""A cacheable answer (see :func:`check_answer`)."""


class LookupRequest(_Strict):
    """``POST /v1/cache/lookup``: the answer cached for a prompt or for the most similar one."""

    namespace: Text
    """The caller's model and settings (LangChain's ``llm_string``); namespaces never mix."""
    prompt: Text
    """The prompt, matched exactly first."""
    text: Text | None = None
    """What similarity is measured on, when not the prompt (a chat prompt's messages' text)."""
    score_threshold: Threshold | None = None
    """The least cosine similarity of a similar prompt's answer; None: the server cache's 0.95."""


class UpdateRequest(_Strict):
    """``POST /v1/cache/update``: cache an answer (replacing the prompt's older one)."""

    namespace: Text
    """As in :class:`LookupRequest`."""
    prompt: Text
    """The prompt it server.answers."""
    text: Text | None = None
    """As in :class:`LookupRequest`."""
    answer: Answer
    """The answer: any JSON value but null, at most :data:`MAX_ANSWER_BYTES` as JSON."""


class ClearNamespaceRequest(_Strict):
    """``POST /v1/cache/clear``: forget every answer of one namespace."""

    namespace: Text
    """The namespace to forget (``DELETE /v1/cache`` forgets them all)."""


class LookupResponse(BaseModel):
    """The answer of a lookup."""

    object: Literal["cache.lookup"] = "cache.lookup"
    hit: bool
    """Whether an answer was found (the exact prompt, or one similar enough)."""
    answer: Any = None
    """The cached answer, or None on a miss."""


class CacheCleared(BaseModel):
    """The answer of an update or a clear."""

    object: Literal["cache.updated", "cache.cleared"]
    namespace: str | None = None
    """The namespace written or cleared; None when every entry was cleared."""


class CacheInfo(BaseModel):
    """``GET /v1/cache``: the counters of :class:`~gpuprompt.answer_cache.AnswerCacheStats` and the bounds."""

    object: Literal["cache"] = "cache"
    entries: int
    exact_hits: int
    similar_hits: int
    misses: int
    evicted: int
    expired: int
    max_entries: int
    """Most answers kept."""
    ttl_seconds: float | None
    """An answer's lifetime (None: no expiry)."""
    max_answer_bytes: int
    """Largest answer accepted, as JSON."""


# ---------------------------------------------------------------------- routes
router = APIRouter()

@router.post(V1 + CACHE_LOOKUP, response_model=LookupResponse, tags=["cache"])
async def lookup(server: State, body: LookupRequest) -> Response:
    """The answer cached for ``prompt`` in ``namespace``, or for its most similar cached prompt
    there when at least ``score_threshold`` similar (only then is the text embedded, batched
    with every concurrent request)."""
    found = await server.answers.alookup(body.prompt, namespace_key(body.namespace), text=body.text,
                                  score_threshold=body.score_threshold)
    return json_response(LookupResponse(hit=found is not None, answer=found))

@router.post(V1 + CACHE_UPDATE, response_model=CacheCleared, tags=["cache"])
async def update(server: State, body: UpdateRequest) -> Response:
    """Cache ``answer`` for ``prompt`` in ``namespace`` (the text is embedded once, here)."""
    await server.answers.aupdate(body.prompt, namespace_key(body.namespace), body.answer, text=body.text)
    return json_response(CacheCleared(object="cache.updated", namespace=body.namespace))

@router.post(V1 + CACHE_CLEAR, response_model=CacheCleared, tags=["cache"])
async def clear_namespace(server: State, body: ClearNamespaceRequest) -> Response:
    """Forget every answer of one namespace (an unknown one too: clearing is idempotent)."""
    await asyncio.to_thread(server.answers.clear, namespace_key(body.namespace))
    return json_response(CacheCleared(object="cache.cleared", namespace=body.namespace))

@router.delete(V1 + CACHE, response_model=CacheCleared, tags=["cache"])
async def clear_all(server: State) -> Response:
    """Forget every answer of every namespace (for every client of this server)."""
    await asyncio.to_thread(server.answers.clear)
    return json_response(CacheCleared(object="cache.cleared"))

@router.get(V1 + CACHE, response_model=CacheInfo, tags=["cache"])
async def info(server: State) -> Response:
    """The cache's counters and bounds."""
    stats = server.answers.stats()
    return json_response(
        CacheInfo(
            entries=stats.entries, exact_hits=stats.exact_hits, similar_hits=stats.similar_hits,
            misses=stats.misses, evicted=stats.evicted, expired=stats.expired, max_entries=server.answers.max_entries,
            ttl_seconds=server.answers.ttl_seconds, max_answer_bytes=MAX_ANSWER_BYTES,
        )
    )

