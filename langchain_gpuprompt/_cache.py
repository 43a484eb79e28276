"""LangChain LLM cache that also answers prompts *similar* to a cached one, over gpuprompt's AnswerCache.

The core :class:`~gpuprompt.AnswerCache` does the work (exact key first, then one device similarity
search within the namespace; LRU and TTL bounds); this adapter maps ``llm_string`` to its namespace
and LangChain's chat-prompt JSON to the text that is compared. With ``base_url`` (or ``GPUPROMPT_URL``)
the answers live in a running ``gpuprompt serve`` (the runtime of :func:`gpuprompt.connect` hands out its
:class:`gpuprompt.remote.RemoteAnswerCache`), shared by every worker; generations then travel as JSON (:func:`_to_json` / :func:`_from_json`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpuprompt.answer_cache import DEFAULT_MAX_ENTRIES, DEFAULT_TTL_SECONDS
from gpuprompt.device import check_device
from gpuprompt.errors import EngineError, InputTypeError, describe
from gpuprompt.protocols import AnswerCacheLike
from gpuprompt.runtime import connect
from gpuprompt.validation import check_str, fail
from langchain_core.caches import RETURN_VAL_TYPE, BaseCache
from langchain_core.embeddings import Embeddings
from langchain_core.messages import message_to_dict, messages_from_dict
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, Generation, GenerationChunk

from langchain_gpuprompt._embeddings import GPUPromptEmbeddings

if TYPE_CHECKING:
    import torch
    from pydantic import SecretStr

__all__ = ["GPUPromptSemanticCache"]


class GPUPromptSemanticCache(BaseCache):
    """A semantic LLM cache: a prompt close enough to a cached one gets the cached answer.

    A lookup first tries the exact ``(prompt, llm_string)`` pair (always a hit when cached), then
    the cached prompt of the same ``llm_string`` most similar to the new one, and returns its
    generations when the cosine similarity is at least ``score_threshold``. Different models or
    settings (different ``llm_string``) never share entries. For chat models the similarity is
    taken over the messages' text, not over LangChain's JSON serialisation of them. A prompt longer
    than the embedder reads (256 tokens for the bundled MiniLM) is matched exactly only: its
    vector would stand for its beginning alone, and in a RAG prompt (retrieved context, then the
    question) every question would look like the first. The cache is bounded: at most
    ``max_entries`` answers (the least recently used go first), each living ``ttl_seconds``.

    Use:
        .. code-block:: python

            from langchain_core.globals import set_llm_cache
            from langchain_gpuprompt import ChatGPUPrompt, GPUPromptSemanticCache

            set_llm_cache(GPUPromptSemanticCache(score_threshold=0.95))
            llm = ChatGPUPrompt()
            llm.invoke("What is your return policy?")    # generated, then cached
            llm.invoke("What's your return policy?")     # similar enough: served from the cache

    Remote mode (one cache in a running ``gpuprompt serve``, shared by every worker process of the
    app; this process imports no torch and loads no model):
        .. code-block:: python

            set_llm_cache(GPUPromptSemanticCache(base_url="http://127.0.0.1:8000", score_threshold=0.95))
            # or set GPUPROMPT_URL (and GPUPROMPT_API_KEY) and keep GPUPromptSemanticCache()

        The server embeds the prompts with its own embedder and bounds the cache (its
        ``max_entries`` and ``ttl_seconds``); each cache object keeps its own ``score_threshold``.
        Workers whose models have the same ``llm_string`` share answers; others never do.
        Generations travel as JSON (their ``generation_info`` must be JSON), and :meth:`clear`
        without ``llm_string`` clears the server's cache for every worker.

    Args:
        embedding: the embeddings for prompts (default: the runtime's shared embedder). With
            :class:`GPUPromptEmbeddings` its core embedder is used directly (batched, the prompt
            vectors never leave the device); any other LangChain ``Embeddings`` works too.
        score_threshold: the least cosine similarity, in [-1, 1], that counts as the same prompt.
        max_entries: most answers kept; the least recently used go first.
        ttl_seconds: an answer's lifetime in seconds (None: no expiry).
        device: where the prompt vectors of a non-gpuprompt ``embedding`` are kept (a gpuprompt
            embedder keeps them on its own device).
        base_url: a running ``gpuprompt serve`` to keep the answers in (remote mode); None reads
            ``GPUPROMPT_URL`` unless an ``embedding`` is given, and without it the answers stay in
            this process. Not with ``embedding``, ``max_entries``, ``ttl_seconds`` or ``device``.
        api_key: that server's API key; None reads ``GPUPROMPT_API_KEY`` with ``GPUPROMPT_URL``.
        timeout: remote mode: seconds a request to the server may wait for an answer (None reads
            ``GPUPROMPT_TIMEOUT``, else 60); a silent server raises ``RequestTimeoutError``.

    Raises:
        ConfigurationError: an option of the wrong type or range, an in-process option together
            with a server, an ``api_key`` without one, or a malformed URL or key.
        InputTypeError: ``embedding`` is not a LangChain ``Embeddings``.
    """

    def __init__(
        self,
        embedding: Embeddings | None = None,
        *,
        score_threshold: float = 0.95,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        ttl_seconds: float | None = DEFAULT_TTL_SECONDS,
        device: str = "auto",
        base_url: str | None = None,
        api_key: str | SecretStr | None = None,
        timeout: float | None = None,
    ) -> None:
        if embedding is not None and not isinstance(embedding, Embeddings):
            raise fail(
                "embedding", "a LangChain Embeddings (e.g. GPUPromptEmbeddings()) or None", embedding,
                error=InputTypeError,
            )
        check_device(device)
        # A given embedding keeps the cache in process (GPUPROMPT_URL alone does not move it).
        implicit_env = embedding is None or base_url is not None or api_key is not None
        runtime = connect(
            base_url,
            api_key=api_key,
            timeout=timeout,
            owner="GPUPromptSemanticCache",
            local_options={
                "embedding": (embedding, None),
                "max_entries": (max_entries, DEFAULT_MAX_ENTRIES),
                "ttl_seconds": (ttl_seconds, DEFAULT_TTL_SECONDS),
                "device": (device, "auto"),
            },
            environ=None if implicit_env else {},
        )
        self._embedding = embedding
        self._connect_args = {"base_url": base_url, "api_key": api_key, "timeout": timeout}
        # In process the options size this cache and its embedder is the given one's; a server's
        # cache is sized by the server (connect() refused those options above).
        options = {} if runtime.remote else {"max_entries": max_entries, "ttl_seconds": ttl_seconds}
        # Entries are stored as JSON in both modes (one code path, and a caller's later change to
        # its generations can never change the cache).
        self._answers: AnswerCacheLike = runtime.answer_cache(
            _core_embedder(embedding, device), score_threshold=score_threshold, **options
        )

    def __repr__(self) -> str:
        return f"<GPUPromptSemanticCache over {self._answers!r}>"

    @property
    def score_threshold(self) -> float:
        """The least cosine similarity that counts as the same prompt."""
        return self._answers.score_threshold  # type: ignore[return-value]

    @property
    def max_entries(self) -> int:
        """Most answers kept (in remote mode the server's bound, asked once)."""
        return self._answers.max_entries  # type: ignore[return-value]

    @property
    def ttl_seconds(self) -> float | None:
        """An answer's lifetime in seconds (None: no expiry; in remote mode the server's, asked once)."""
        return self._answers.ttl_seconds

    @property
    def embeddings(self) -> Embeddings:
        """The embeddings used for prompts (in remote mode, the server's)."""
        if self._embedding is None:
            self._embedding = GPUPromptEmbeddings(**self._connect_args)
        return self._embedding

    @property
    def answer_cache(self) -> AnswerCacheLike:
        """The core cache holding the answers (its ``stats()`` count hits, misses and evictions): an
        :class:`~gpuprompt.AnswerCache` in process, a :class:`gpuprompt.remote.RemoteAnswerCache` of
        the server's in remote mode. Entries are the generations as JSON (:func:`_to_json`)."""
        return self._answers

    # ------------------------------------------------------------------ sync
    def lookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        """The cached generations for ``prompt`` (or a similar enough one) under ``llm_string``.

        Raises:
            InputTypeError: ``prompt`` or ``llm_string`` is not a str.
            InvalidInputError: ``prompt`` or ``llm_string`` holds a lone surrogate.
        """
        text = _search_text(prompt, llm_string)
        return _from_json(self._answers.lookup(prompt, llm_string, text=text))

    def update(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        """Cache ``return_val`` for ``prompt`` under ``llm_string`` (replacing an older entry).

        Raises:
            InputTypeError: ``prompt`` or ``llm_string`` is not a str, or ``return_val`` is not a
                list of ``Generation``.
            InvalidInputError: ``prompt`` or ``llm_string`` holds a lone surrogate. Nothing
                cached changes.
        """
        text = _search_text(prompt, llm_string)
        self._answers.update(prompt, llm_string, _to_json(_generations(return_val)), text=text)

    def clear(self, *, llm_string: str | None = None, **kwargs: Any) -> None:
        """Forget every cached entry, or only those of ``llm_string`` (in remote mode: of the
        server, for every worker).

        Raises:
            InputTypeError, InvalidInputError: ``llm_string`` is not a well-formed str or None.
        """
        self._answers.clear(llm_string)

    # ------------------------------------------------------------------ async
    async def alookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        """Async :meth:`lookup`: the prompt is embedded by the batched embedder, off the loop."""
        text = _search_text(prompt, llm_string)
        return _from_json(await self._answers.alookup(prompt, llm_string, text=text))

    async def aupdate(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        """Async :meth:`update`."""
        text = _search_text(prompt, llm_string)
        await self._answers.aupdate(prompt, llm_string, _to_json(_generations(return_val)), text=text)

    async def aclear(self, *, llm_string: str | None = None, **kwargs: Any) -> None:
        """Async :meth:`clear`."""
        await self._answers.aclear(llm_string)


class _EmbeddingsOnDevice:
    """Any LangChain ``Embeddings`` as the core's embedder interface: float lists to a device tensor."""

    def __init__(self, embeddings: Embeddings, device: str) -> None:
        self._embeddings = embeddings
        self._device = device

    def _tensor(self, rows: Any) -> torch.Tensor:
        import torch

        from gpuprompt.device import resolve_device
        from gpuprompt.validation import check_real_matrix

        return torch.from_numpy(check_real_matrix(rows, "embeddings")).to(resolve_device(self._device))

    def embed_tensor(self, texts: list[str]) -> torch.Tensor:
        return self._tensor(self._embeddings.embed_documents(texts))

    async def aembed_tensor(self, texts: list[str]) -> torch.Tensor:
        rows = await self._embeddings.aembed_documents(texts)
        return await asyncio.to_thread(self._tensor, rows)  # resolving the device imports torch

    async def aload(self) -> None:
        return None


def _core_embedder(embedding: Embeddings | None, device: str) -> Any:
    """The core embedder behind ``embedding``: None for the runtime's shared one, a
    :class:`GPUPromptEmbeddings`' own core embedder (batched; prompt vectors never leave the
    device), or any other LangChain ``Embeddings`` wrapped to hand vectors to the device."""
    if embedding is None:
        return None
    if isinstance(embedding, GPUPromptEmbeddings):
        return embedding.embedder
    return _EmbeddingsOnDevice(embedding, device)


def _generations(return_val: Any) -> tuple[Generation, ...]:
    """``return_val`` as an immutable tuple of ``Generation`` (a later change by the caller to its
    list cannot change the cache)."""
    if isinstance(return_val, (str, bytes)) or not isinstance(return_val, Sequence):
        raise InputTypeError(f"'return_val' must be a list of Generation (got {describe(return_val)}).")
    for position, generation in enumerate(return_val):
        if not isinstance(generation, Generation):
            raise InputTypeError(f"'return_val[{position}]' must be a Generation (got {describe(generation)}).")
    return tuple(return_val)


_GENERATION_TYPES: dict[str, type[Generation]] = {
    cls.__name__: cls for cls in (Generation, GenerationChunk, ChatGeneration, ChatGenerationChunk)
}


def _to_json(generations: tuple[Generation, ...]) -> list[dict[str, Any]]:
    """Generations as the JSON a remote cache stores: class name, text or message, generation_info."""
    out: list[dict[str, Any]] = []
    for generation in generations:
        name = type(generation).__name__
        if _GENERATION_TYPES.get(name) is not type(generation):  # a subclass travels as its LangChain base
            name = "ChatGeneration" if isinstance(generation, ChatGeneration) else "Generation"
        item: dict[str, Any] = {"type": name, "generation_info": generation.generation_info}
        if isinstance(generation, ChatGeneration):
            item["message"] = message_to_dict(generation.message)
        else:
            item["text"] = generation.text
        out.append(item)
    return out


def _from_json(value: Any) -> list[Generation] | None:
    """The generations of a remote cache's JSON (None for a miss); only the four generation
    classes and LangChain's message types are ever built from it."""
    if value is None:
        return None
    try:
        generations: list[Generation] = []
        for item in value:
            cls = _GENERATION_TYPES[item["type"]]
            if issubclass(cls, ChatGeneration):
                message = messages_from_dict([item["message"]])[0]
                generations.append(cls(message=message, generation_info=item["generation_info"]))
            else:
                generations.append(cls(text=item["text"], generation_info=item["generation_info"]))
        return generations
    except (KeyError, TypeError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        raise EngineError(
            f"the remote cache answered an entry that is not a list of LangChain generations ({str(value)[:200]!r}); "
            "was it written by another client under the same llm_string? Clear it with "
            "cache.clear(llm_string=...)."
        ) from exc


def _search_text(prompt: Any, llm_string: Any) -> str:
    """The text whose similarity is compared for ``prompt`` (both arguments checked first).

    For chat models LangChain's cache prompt is the JSON serialisation of the message list, whose
    shared boilerplate would make every conversation look alike; the messages' text is used
    instead. The JSON is only read, never turned back into objects. A prompt with a lone surrogate
    is refused even where its text would not hold it: it could never be cached, so a lookup refuses
    it up front instead of letting the model run and the update fail.
    """
    check_str(prompt, "prompt")
    check_str(llm_string, "llm_string")
    if not prompt.startswith("["):
        return prompt
    try:
        messages = json.loads(prompt)
    except (ValueError, RecursionError):  # not JSON, or JSON nested beyond the parser's stack
        return prompt
    texts: list[str] = []
    for message in messages if isinstance(messages, list) else []:
        kwargs = message.get("kwargs") if isinstance(message, dict) else None
        content = kwargs.get("content") if isinstance(kwargs, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
    joined = "\n".join(texts)
    try:
        joined.encode("utf-8")  # a JSON escape such as "\\ud800" decodes to a lone surrogate
    except UnicodeEncodeError:
        return prompt
    return joined if texts else prompt
