"""LangChain LLM cache that also answers prompts *similar* to a cached one (gpuprompt embedder + index).

Exact repeats are found by key without embedding anything; other prompts are embedded by the
batched core Embedder and looked up in a core VectorIndex, pre-filtered to the same ``llm_string``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from typing import Any

from langchain_core.caches import RETURN_VAL_TYPE, BaseCache
from langchain_core.embeddings import Embeddings
from langchain_core.outputs import Generation

from gpuprompt._validate import check_str
from gpuprompt.errors import ConfigurationError, InputTypeError, describe
from langchain_gpuprompt._embeddings import GPUPromptEmbeddings
from langchain_gpuprompt._vectorstores import GPUPromptVectorStore

__all__ = ["GPUPromptSemanticCache"]


class GPUPromptSemanticCache(BaseCache):
    """A semantic LLM cache: a prompt close enough to a cached one gets the cached answer.

    A lookup first tries the exact ``(prompt, llm_string)`` pair (always a hit when cached), then
    the cached prompt of the same ``llm_string`` most similar to the new one, and returns its
    generations when the cosine similarity is at least ``score_threshold``. Different models or
    settings (different ``llm_string``) never share entries. For chat models the similarity is
    taken over the messages' text, not over LangChain's JSON serialisation of them.

    Use:
        .. code-block:: python

            from langchain_core.globals import set_llm_cache
            from langchain_gpuprompt import ChatGPUPrompt, GPUPromptSemanticCache

            set_llm_cache(GPUPromptSemanticCache(score_threshold=0.95))
            llm = ChatGPUPrompt()
            llm.invoke("What is your return policy?")    # generated, then cached
            llm.invoke("What's your return policy?")     # similar enough: served from the cache

    Args:
        embedding: the embeddings for prompts (default: the bundled :class:`GPUPromptEmbeddings`).
        score_threshold: the least cosine similarity, in [-1, 1], that counts as the same prompt.
        device: where the cache's vector index lives.
    """

    def __init__(
        self,
        embedding: Embeddings | None = None,
        *,
        score_threshold: float = 0.95,
        device: str = "auto",
    ) -> None:
        number = isinstance(score_threshold, (int, float)) and not isinstance(score_threshold, bool)
        if not number or not -1.0 <= score_threshold <= 1.0:
            raise ConfigurationError(
                f"'score_threshold' must be a cosine similarity in [-1, 1] (got {describe(score_threshold)})."
            )
        self.score_threshold = float(score_threshold)
        self._store = GPUPromptVectorStore(embedding if embedding is not None else GPUPromptEmbeddings(), device=device)
        self._generations: dict[str, list[Generation]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<GPUPromptSemanticCache entries={len(self._generations)} score_threshold={self.score_threshold}>"

    @property
    def embeddings(self) -> Embeddings:
        """The embeddings used for prompts."""
        return self._store.embedding

    # ------------------------------------------------------------------ sync
    def lookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        """The cached generations for ``prompt`` (or a similar enough one) under ``llm_string``.

        Raises:
            InputTypeError: ``prompt`` or ``llm_string`` is not a str.
            InvalidInputError: ``prompt`` or ``llm_string`` holds a lone surrogate.
        """
        exact = self._exact(prompt, llm_string)
        if exact is not None or not self._generations:
            return exact
        hits = self._store.similarity_search_with_score(_search_text(prompt), k=1, filter={"llm_string": llm_string})
        return self._accept(hits)

    def update(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        """Cache ``return_val`` for ``prompt`` under ``llm_string`` (replacing an older entry).

        Raises:
            InputTypeError: ``prompt`` or ``llm_string`` is not a str, or ``return_val`` is not a
                list of ``Generation``.
            InvalidInputError: ``prompt`` or ``llm_string`` holds a lone surrogate. Nothing
                cached changes.
        """
        key = self._check_update(prompt, llm_string, return_val)
        self._store.add_texts([_search_text(prompt)], [{"llm_string": llm_string}], ids=[key])
        with self._lock:
            self._generations[key] = list(return_val)

    def clear(self, **kwargs: Any) -> None:
        """Forget every cached entry."""
        with self._lock:
            self._generations.clear()
            self._store.delete()

    # ------------------------------------------------------------------ async
    async def alookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        """Async :meth:`lookup`: the prompt is embedded by the batched embedder, off the loop."""
        exact = self._exact(prompt, llm_string)
        if exact is not None or not self._generations:
            return exact
        hits = await self._store.asimilarity_search_with_score(
            _search_text(prompt), k=1, filter={"llm_string": llm_string}
        )
        return self._accept(hits)

    async def aupdate(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        """Async :meth:`update`."""
        key = self._check_update(prompt, llm_string, return_val)
        await self._store.aadd_texts([_search_text(prompt)], [{"llm_string": llm_string}], ids=[key])
        with self._lock:
            self._generations[key] = list(return_val)

    async def aclear(self, **kwargs: Any) -> None:
        """Async :meth:`clear`."""
        self.clear()

    # ------------------------------------------------------------------ helpers
    def _exact(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        key = _key(_check_str("prompt", prompt), _check_str("llm_string", llm_string))
        with self._lock:
            found = self._generations.get(key)
        return list(found) if found is not None else None

    def _accept(self, hits: Sequence[tuple[Any, float]]) -> RETURN_VAL_TYPE | None:
        if not hits or hits[0][1] < self.score_threshold:
            return None
        with self._lock:
            found = self._generations.get(hits[0][0].id)
        return list(found) if found is not None else None

    @staticmethod
    def _check_update(prompt: str, llm_string: str, return_val: Any) -> str:
        key = _key(_check_str("prompt", prompt), _check_str("llm_string", llm_string))
        if isinstance(return_val, (str, bytes)) or not isinstance(return_val, Sequence):
            raise InputTypeError(f"'return_val' must be a list of Generation (got {describe(return_val)}).")
        for position, generation in enumerate(return_val):
            if not isinstance(generation, Generation):
                raise InputTypeError(f"'return_val[{position}]' must be a Generation (got {describe(generation)}).")
        return key


def _search_text(prompt: str) -> str:
    """The text to embed for ``prompt``.

    For chat models LangChain's cache prompt is the JSON serialisation of the message list, whose
    shared boilerplate would make every conversation look alike; the similarity is then taken over
    the messages' text. The JSON is only read, never turned back into objects.
    """
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


def _check_str(name: str, value: Any) -> str:
    # Well-formed text too: a prompt with a lone surrogate could never be cached (nor embedded),
    # so a lookup refuses it up front instead of letting the model run and the update fail.
    return check_str(value, name)


def _key(prompt: str, llm_string: str) -> str:
    digest = hashlib.sha256()
    digest.update(llm_string.encode("utf-8", "surrogatepass"))
    digest.update(b"\0")
    digest.update(prompt.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()
