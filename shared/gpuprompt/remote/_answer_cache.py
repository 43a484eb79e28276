"""RemoteAnswerCache: the :class:`~gpuprompt.AnswerCache` calls of the semantic LLM cache, served by a
running ``gpuprompt serve`` (``/v1/cache``), so every worker shares one cache. No torch, no model here.

Values are JSON (the adapter turns its framework's answers into JSON and back). Lookups and clears
are idempotent and retried like GETs; updates are not (the caller's answer is already in hand).
"""

from __future__ import annotations

from typing import Any

from gpuprompt.answer_cache import AnswerCacheStats
from gpuprompt.errors import ConfigurationError, EngineError
from gpuprompt.remote._client import SERVICE, RemoteClient, client_for
from gpuprompt.remote._config import RemoteConfig
from gpuprompt.validation import check_number, check_str
from gpuprompt.wire import CACHE, CACHE_CLEAR, CACHE_LOOKUP, CACHE_UPDATE, MAX_ANSWER_BYTES, check_answer, redact

__all__ = ["MAX_ANSWER_BYTES", "RemoteAnswerCache", "check_answer"]


_STATS = ("entries", "exact_hits", "similar_hits", "misses", "evicted", "expired")


class RemoteAnswerCache:
    """A running ``gpuprompt serve``'s semantic answer cache, with the :class:`~gpuprompt.AnswerCache`
    methods the adapters call: ``lookup`` / ``update`` / ``clear`` / ``stats`` and their async
    ``a*`` twins.

    Semantics are the server's AnswerCache's: the exact ``(prompt, namespace)`` first, then the
    most similar cached prompt of the namespace, embedded by the server's embedder, at this
    object's ``score_threshold`` (or a lookup's own). Every client naming the same server and
    namespace shares entries; different namespaces never do. The server bounds the cache (its
    ``max_entries`` and ``ttl_seconds``). Checks run here first (the same messages as in
    process), so a refused call sends nothing. Nothing connects until the first call.

    Example:
        >>> answers = RemoteAnswerCache("http://127.0.0.1:8000", score_threshold=0.9)
        >>> answers.update("What is your return policy?", "smollm2", {"text": "30 days, free returns."})
        >>> answers.lookup("What's your return policy?", "smollm2")
        {'text': '30 days, free returns.'}
        >>> answers.lookup("What's your return policy?", "another-model") is None
        True

    Args:
        base_url: the server (``http://host:port``), or a :class:`RemoteConfig`.
        api_key: the server's API key (with a URL; a config carries its own).
        score_threshold: the least cosine similarity, in [-1, 1], that counts as the same prompt.
        client: a :class:`RemoteClient` to use instead of the process's shared one for the config.
        **options: other :class:`RemoteConfig` fields (``connect_timeout``, ``max_retries``, ...),
            with a URL.

    Raises:
        ConfigurationError: a malformed URL, key, option or ``score_threshold``, or a ``client``
            that is not a RemoteClient.
    """

    def __init__(
        self,
        base_url: str | RemoteConfig | None = None,
        *,
        api_key: str | None = None,
        score_threshold: float = 0.95,
        client: RemoteClient | None = None,
        **options: Any,
    ) -> None:
        self.score_threshold = check_number(score_threshold, "score_threshold", min=-1.0, max=1.0,
                                            error=ConfigurationError)
        client = client_for(base_url, api_key, client, options, owner="RemoteAnswerCache")
        self.client = client
        self._info: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<RemoteAnswerCache {redact(self.client.root)!r} score_threshold={self.score_threshold}>"

    # ------------------------------------------------------------------ bodies
    def _lookup_body(self, prompt: Any, namespace: Any, text: Any, score_threshold: Any) -> dict[str, Any]:
        body = _key(prompt, namespace, text)
        threshold = self.score_threshold if score_threshold is None else score_threshold
        body["score_threshold"] = check_number(threshold, "score_threshold", min=-1.0, max=1.0)
        return body

    def _read(self, answer: Any) -> Any:
        if not isinstance(answer, dict) or not isinstance(answer.get("hit"), bool):
            raise EngineError(
                f"{SERVICE} at {redact(self.client.url('/cache/lookup'))} answered a lookup without 'hit' "
                f"({str(answer)[:200]!r}); is base_url a gpuprompt serve of this version?"
            )
        return answer.get("answer") if answer["hit"] else None

    # ------------------------------------------------------------------ lookups and updates
    def lookup(
        self, prompt: str, namespace: str, *, text: str | None = None, score_threshold: float | None = None
    ) -> Any | None:
        """The value cached for ``prompt`` (or a similar enough prompt) in ``namespace``, or None.

        Args:
            prompt: the prompt, matched exactly first.
            namespace: the model or settings the value belongs to; namespaces never mix.
            text: what the similarity is measured on, when not the prompt itself.
            score_threshold: this lookup's threshold (default: this object's).

        Raises:
            InputTypeError: ``prompt``, ``namespace`` or ``text`` is not a str.
            InvalidInputError: one holds a lone surrogate, or ``score_threshold`` is not a number
                in [-1, 1]. Nothing is sent on a refused call.
            EngineError, EngineDeadError, QueueFullError, RequestTimeoutError: the server's
                answer or the transport's failure (see :mod:`gpuprompt.remote`).
        """
        body = self._lookup_body(prompt, namespace, text, score_threshold)
        return self._read(self.client.request("POST", CACHE_LOOKUP, body, idempotent=True))

    async def alookup(
        self, prompt: str, namespace: str, *, text: str | None = None, score_threshold: float | None = None
    ) -> Any | None:
        """Async :meth:`lookup` (never blocks the caller's loop)."""
        body = self._lookup_body(prompt, namespace, text, score_threshold)
        return self._read(await self.client.arequest("POST", CACHE_LOOKUP, body, idempotent=True))

    def update(self, prompt: str, namespace: str, value: Any, *, text: str | None = None) -> None:
        """Cache ``value`` for ``prompt`` in ``namespace`` (replacing an older entry); ``text`` as
        in :meth:`lookup`. Not retried: a failed update leaves the cache as it was or updated.

        Raises:
            InputTypeError, InvalidInputError: a bad ``prompt``, ``namespace`` or ``text`` (see
                :meth:`lookup`), or a ``value`` that is not JSON, is null, or is larger than
                :data:`MAX_ANSWER_BYTES` as JSON.
            EngineError, EngineDeadError, QueueFullError, RequestTimeoutError: see :meth:`lookup`.
        """
        self.client.request("POST", CACHE_UPDATE, _update_body(prompt, namespace, value, text), idempotent=False)

    async def aupdate(self, prompt: str, namespace: str, value: Any, *, text: str | None = None) -> None:
        """Async :meth:`update`."""
        body = _update_body(prompt, namespace, value, text)
        await self.client.arequest("POST", CACHE_UPDATE, body, idempotent=False)

    # ------------------------------------------------------------------ housekeeping
    def clear(self, namespace: str | None = None) -> None:
        """Forget every entry of ``namespace``, or, with None, every entry of the server (for every
        client of it).

        Raises:
            InputTypeError, InvalidInputError: a bad ``namespace``.
            EngineError, EngineDeadError, QueueFullError, RequestTimeoutError: see :meth:`lookup`.
        """
        if namespace is None:
            self.client.request("DELETE", CACHE, idempotent=True)
        else:
            self.client.request("POST", CACHE_CLEAR, _namespace(namespace), idempotent=True)

    async def aclear(self, namespace: str | None = None) -> None:
        """Async :meth:`clear`."""
        if namespace is None:
            await self.client.arequest("DELETE", CACHE, idempotent=True)
        else:
            await self.client.arequest("POST", CACHE_CLEAR, _namespace(namespace), idempotent=True)

    def stats(self) -> AnswerCacheStats:
        """A snapshot of the server cache's counters (every client's lookups)."""
        return self._stats(self.client.request("GET", CACHE))

    async def astats(self) -> AnswerCacheStats:
        """Async :meth:`stats`."""
        return self._stats(await self.client.arequest("GET", CACHE))

    @property
    def max_entries(self) -> int:
        """Most answers the server keeps (asked once, on first use)."""
        return int(self._bounds()["max_entries"])

    @property
    def ttl_seconds(self) -> float | None:
        """An answer's lifetime on the server, in seconds (None: no expiry; asked once)."""
        ttl = self._bounds()["ttl_seconds"]
        return None if ttl is None else float(ttl)

    def _bounds(self) -> dict[str, Any]:
        if self._info is None:
            self.stats()
        assert self._info is not None
        return self._info

    def _stats(self, answer: Any) -> AnswerCacheStats:
        fields = (*_STATS, "max_entries")
        if not isinstance(answer, dict) or not all(isinstance(answer.get(f), int) for f in fields) \
                or not isinstance(answer.get("ttl_seconds"), (int, float, type(None))):
            raise EngineError(
                f"{SERVICE} at {redact(self.client.url('/cache'))} answered GET /v1/cache without the cache's "
                f"counters ({str(answer)[:200]!r}); is base_url a gpuprompt serve of this version?"
            )
        self._info = answer
        return AnswerCacheStats(**{f: answer[f] for f in _STATS})


def _namespace(namespace: Any) -> dict[str, Any]:
    check_str(namespace, "namespace")
    return {"namespace": namespace}


def _key(prompt: Any, namespace: Any, text: Any) -> dict[str, Any]:
    """The fields naming an entry, checked as :class:`~gpuprompt.AnswerCache` checks them."""
    check_str(prompt, "prompt")
    check_str(namespace, "namespace")
    check_str(text, "text", allow_none=True)
    body: dict[str, Any] = {"namespace": namespace, "prompt": prompt}
    if text is not None and text != prompt:  # the server measures the prompt itself without one
        body["text"] = text
    return body


def _update_body(prompt: Any, namespace: Any, value: Any, text: Any) -> dict[str, Any]:
    body = _key(prompt, namespace, text)
    body["answer"] = check_answer(value, "value")
    return body
