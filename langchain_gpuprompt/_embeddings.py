"""LangChain ``Embeddings`` over the shared gpuprompt Embedder (batched, device-cached).

The adapter only converts types: the core Embedder does the batching across concurrent calls,
the de-duplication and the device cache.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from gpuprompt._validate import check_str, configuration_error
from gpuprompt.embedder import EmbedderConfig

if TYPE_CHECKING:
    import torch

    from gpuprompt.embedder import Embedder

# Defaults come from the core config: the same settings must reach the same shared Embedder
# (and batch queue) whether it is asked for from LangChain, LlamaIndex or the core.
_CORE = EmbedderConfig()

__all__ = ["GPUPromptEmbeddings"]


class GPUPromptEmbeddings(BaseModel, Embeddings):
    """Drop-in LangChain embeddings backed by gpuprompt's batched Embedder.

    Concurrent calls (threads or asyncio tasks) are coalesced into batched forward passes, and
    every text already seen is served from a cache kept on the device. Constructing the class
    loads nothing; the model loads on the first call and is shared by every instance with the
    same settings in the process (LangChain and LlamaIndex classes alike).

    Setup:
        .. code-block:: bash

            pip install "gpuprompt[langchain]"

    Instantiate:
        .. code-block:: python

            from langchain_gpuprompt import GPUPromptEmbeddings

            embeddings = GPUPromptEmbeddings()          # bundled all-MiniLM-L6-v2, best device

    Embed:
        .. code-block:: python

            vector = embeddings.embed_query("red summer dress")
            len(vector), type(vector[0])
            # (384, <class 'float'>)
            vectors = embeddings.embed_documents(["red dress", "blue jeans"])
            len(vectors)
            # 2

    Async (concurrent tasks share batches; the event loop never runs model code):
        .. code-block:: python

            vector = await embeddings.aembed_query("red summer dress")
    """

    model: str | None = None
    """Local sentence-transformers folder or hub id; None for the bundled all-MiniLM-L6-v2."""
    device: str = _CORE.device
    """Torch device: 'auto' (cuda > mps > cpu), 'cpu', 'cuda', 'cuda:N' or 'mps'."""
    normalize: bool = _CORE.normalize
    """L2-normalise the embeddings (inner product then equals cosine similarity)."""
    dtype: str | None = _CORE.dtype
    """Compute dtype ('float16', 'bfloat16', 'float32'); None = fp16 on CUDA, fp32 elsewhere."""
    batch_size: int = _CORE.batch_size
    """Most texts per forward pass."""
    max_batch_tokens: int = _CORE.max_batch_tokens
    """Most (non-padded) tokens per forward pass."""
    max_wait_ms: float = _CORE.max_wait_ms
    """Longest a queued text waits for its batch to fill while the model is busy."""
    max_queue: int = _CORE.max_queue
    """Most texts waiting in the batch queue; more raises QueueFullError."""
    cache_size: int = _CORE.cache_size
    """Embeddings kept in the device cache (LRU); 0 disables the cache."""
    show_progress: bool = _CORE.show_progress
    """Show a progress bar for bulk calls."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    _embedder: Embedder | None = PrivateAttr(default=None)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:  # a field of the wrong type: our typed error, naming it
            raise configuration_error(exc, "GPUPromptEmbeddings") from exc
        # Check the options now (pure Python, loads nothing) so a bad value fails at construction
        # with the core's typed ConfigurationError (pydantic would wrap it inside a validator).
        self._config()

    def _config(self) -> EmbedderConfig:
        return EmbedderConfig(
            model=self.model,
            device=self.device,
            normalize=self.normalize,
            dtype=self.dtype,
            batch_size=self.batch_size,
            max_batch_tokens=self.max_batch_tokens,
            max_wait_ms=self.max_wait_ms,
            max_queue=self.max_queue,
            cache_size=self.cache_size,
            show_progress=self.show_progress,
        )

    @property
    def embedder(self) -> Embedder:
        """The shared core :class:`~gpuprompt.Embedder` for these settings (not loaded yet)."""
        if self._embedder is None:
            from gpuprompt.runtime import get_runtime

            options = {k: v for k, v in dataclasses.asdict(self._config()).items() if k != "model"}
            self._embedder = get_runtime().embedder(self.model, **options)
        return self._embedder

    # ------------------------------------------------------------------ core-typed access
    def embed_tensor(self, texts: list[str]) -> torch.Tensor:
        """Embed ``texts`` and keep the result on the device: a ``(n, dim)`` float32 tensor."""
        return self.embedder.embed_tensor(texts)

    async def aembed_tensor(self, texts: list[str]) -> torch.Tensor:
        """Async :meth:`embed_tensor`."""
        return await (await self._aembedder()).aembed_tensor(texts)

    async def _aembedder(self) -> Embedder:
        if self._embedder is None:
            # The first lookup resolves the device, which imports torch: keep that off the loop.
            await asyncio.to_thread(lambda: self.embedder)
        assert self._embedder is not None
        return self._embedder

    # ------------------------------------------------------------------ LangChain API
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed search documents.

        Args:
            texts: the texts to embed.

        Returns:
            One list of Python floats per text, in order.

        Raises:
            InputTypeError: ``texts`` is not a list of str -- a bare str is refused, not embedded
                character by character (the message names the bad item).
            InvalidInputError: a text holds a lone surrogate.
        """
        return self.embedder.embed(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        """Embed one query text; concurrent callers share batched forward passes.

        Raises:
            InputTypeError: ``text`` is not a str.
            InvalidInputError: ``text`` holds a lone surrogate.
        """
        _check_text(text)
        return self.embedder.embed([text])[0].tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Async :meth:`embed_documents`: batched with other tasks' texts, never blocks the loop."""
        return (await (await self._aembedder()).aembed(texts)).tolist()

    async def aembed_query(self, text: str) -> list[float]:
        """Async :meth:`embed_query`: batched with other tasks' texts, never blocks the loop."""
        _check_text(text)
        return (await (await self._aembedder()).aembed([text]))[0].tolist()

    def __repr__(self) -> str:
        return f"GPUPromptEmbeddings(model={self.model!r}, device={self.device!r})"


def _check_text(text: Any) -> None:
    check_str(text, "text")
