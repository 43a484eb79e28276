"""GPUPromptEmbedding: a LlamaIndex ``BaseEmbedding`` over the shared, batched gpuprompt Embedder.

Every call, sync or async, goes through the core Embedder's one batch queue, so the query
embeddings of many concurrent ``aquery`` calls are computed together in one forward pass. The class
gets its runtime once (:func:`gpuprompt.connect`): with ``base_url`` (or ``GPUPROMPT_URL``) that
queue is a running ``gpuprompt serve``'s (a ``RemoteEmbedder``), else the process's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from gpuprompt.embed import QUANTIZE_CHOICES, EmbedderConfig
from gpuprompt.errors import ConfigurationError, InputTypeError, describe
from gpuprompt.models import BUNDLED_EMBEDDING_MODEL
from gpuprompt.runtime import connect
from gpuprompt.validation import check_choice, check_str, check_str_list, configuration_error, fail
from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import (
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from llama_index.core.schema import BaseNode

from llamaindex_gpuprompt._common import check_options

if TYPE_CHECKING:
    from gpuprompt.embed import Embedder
    from gpuprompt.protocols import EmbedderLike
    from gpuprompt.remote import RemoteRuntime
    from gpuprompt.runtime import Runtime

__all__ = ["GPUPromptEmbedding"]

_EMBEDDER_OPTIONS = tuple(field.name for field in dataclasses.fields(EmbedderConfig))

class GPUPromptEmbedding(BaseEmbedding):
    """LlamaIndex embedding model backed by gpuprompt's batched, device-cached Embedder.

    Concurrent callers share one batch queue (and one loaded model per process, shared with the
    LangChain classes); texts already embedded come from the device cache without running the
    model. Async methods await the core directly: no thread per call, no blocking of the loop.

    Setup:
        ``pip install 'gpuprompt[llamaindex]'``; the bundled all-MiniLM-L6-v2 works offline.

    Example:
        >>> from llamaindex_gpuprompt import GPUPromptEmbedding
        >>> embed = GPUPromptEmbedding()                 # loads nothing yet
        >>> len(embed.get_query_embedding("red summer dress"))
        384
        >>> vectors = await embed.aget_text_embedding_batch(["a", "b"])   # in an async function
        >>> small = GPUPromptEmbedding(quantize="int8")  # int8 forward pass on CPU, checked vs fp32
        >>> shared = GPUPromptEmbedding(base_url="http://127.0.0.1:8000")  # a gpuprompt serve's vectors

    Remote mode: with ``base_url`` (or ``GPUPROMPT_URL``, and ``GPUPROMPT_API_KEY``) the vectors come
    from a running ``gpuprompt serve``, batched there with every other worker's texts; this process
    imports no torch and loads no model. ``device``, ``quantize``, ``embedder_options``,
    ``normalize=False`` and ``embedder`` configure a local model and are refused with it.

    Args:
        model_name: a local sentence-transformers folder, a hub id available offline, or the
            default (the bundled all-MiniLM-L6-v2).
        embedder: an already built :class:`gpuprompt.Embedder` to use instead of the runtime's
            shared one (then ``device``, ``normalize``, ``quantize`` and ``embedder_options`` are
            ignored).
        base_url: a running ``gpuprompt serve`` (remote mode); None reads ``GPUPROMPT_URL``.
        api_key: that server's API key; None reads ``GPUPROMPT_API_KEY`` with ``GPUPROMPT_URL``.
        **kwargs: the fields below and those of ``BaseEmbedding``.
    """

    model_config = ConfigDict(extra="forbid")

    model_name: str = Field(
        default=BUNDLED_EMBEDDING_MODEL,
        description="A local sentence-transformers folder or a hub id; the default is the bundled model.",
    )
    device: str = Field(default="auto", description="'auto' (cuda > mps > cpu), 'cpu', 'cuda', 'cuda:N' or 'mps'.")
    normalize: bool = Field(default=True, description="L2-normalise embeddings (inner product = cosine).")
    quantize: Literal["int8", "auto"] | None = Field(
        default=None,
        description="None: full precision; 'int8': int8 forward pass on CPU (onnxruntime, the 'quant' extra), "
        "checked against fp32 by the core's quality guard; 'auto': int8 where it runs and passes the guard.",
    )
    query_instruction: str | None = Field(
        default=None, description="Text prepended to every query (for instruction-tuned models such as e5 or bge)."
    )
    text_instruction: str | None = Field(default=None, description="Text prepended to every document text.")
    embedder_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Other gpuprompt.EmbedderConfig fields: batch_size, max_wait_ms, cache_size, dtype, "
        "quantize_guard, ...",
    )
    # The core batches across calls; a large framework chunk only lets it sort more texts by length.
    embed_batch_size: int = Field(default=512, gt=0, le=2048, description="Texts per framework chunk.")
    base_url: str | None = Field(
        default=None, description="A running gpuprompt serve to embed on (remote mode); None: GPUPROMPT_URL or in process."
    )
    api_key: str | None = Field(default=None, exclude=True, repr=False, description="The server's API key (remote mode).")
    timeout: float | None = Field(
        default=None, description="Remote mode: seconds a request to the server may wait for an answer (None reads "
        "GPUPROMPT_TIMEOUT, else 60).")

    _embedder: EmbedderLike | None = PrivateAttr(default=None)
    _runtime: Runtime | RemoteRuntime | None = PrivateAttr(default=None)

    @field_validator("quantize", mode="before")
    @classmethod
    def _check_quantize(cls, value: Any) -> str | None:
        # The core's own check and message (also when an ``embedder`` is passed and no config is built).
        return check_choice(value, "quantize", (None, *QUANTIZE_CHOICES), error=ConfigurationError)

    @field_validator("query_instruction", "text_instruction", mode="before")
    @classmethod
    def _check_instruction(cls, value: Any, info: ValidationInfo) -> str | None:
        # Well-formed text: a lone surrogate here would make every later embedding call fail.
        return check_str(value, str(info.field_name), allow_none=True, error=ConfigurationError)

    def __init__(self, model_name: str = BUNDLED_EMBEDDING_MODEL, *, embedder: Embedder | None = None, **kwargs: Any):
        if embedder is not None:
            from gpuprompt.embed import Embedder

            if not isinstance(embedder, Embedder):
                raise ConfigurationError(f"'embedder' must be a gpuprompt.Embedder or None (got {describe(embedder)}).")
            model_name = embedder.model_id
        check_options(
            "embedder_options",
            kwargs.get("embedder_options"),
            ("model", "device", "normalize", "quantize"),
            valid=_EMBEDDER_OPTIONS,
        )
        try:
            super().__init__(model_name=model_name, **kwargs)
        except ValidationError as exc:  # a field of the wrong type: our typed error, naming it
            raise configuration_error(exc, "GPUPromptEmbedding") from exc
        self._runtime = connect(
            self.base_url,
            api_key=self.api_key,
            timeout=self.timeout,
            owner="GPUPromptEmbedding",
            local_options={"device": (self.device, "auto"), "quantize": (self.quantize, None),
                           "normalize": (self.normalize, True), "embedder_options": (self.embedder_options, {}),
                           "embedder": (embedder, None)},
        )
        if self._runtime.remote:
            self.base_url, self.api_key = self._runtime.config.base_url, self._runtime.config.api_key
        elif embedder is None:
            # The core checks the settings now (pure Python, loads nothing): a bad option fails
            # here, not at the first embedding.
            self._config()
        self._embedder = embedder

    @classmethod
    def class_name(cls) -> str:
        return "GPUPromptEmbedding"

    def __repr__(self) -> str:
        if self._runtime is not None and self._runtime.remote:
            return f"GPUPromptEmbedding(model_name={self.model_name!r}, base_url={self._runtime.config.shown_url!r})"
        quantize = f", quantize={self.quantize!r}" if self.quantize else ""
        return f"GPUPromptEmbedding(model_name={self.model_name!r}, device={self.device!r}{quantize})"

    # ------------------------------------------------------------------ the core object
    def _config(self) -> EmbedderConfig:
        model = None if self.model_name == BUNDLED_EMBEDDING_MODEL else self.model_name
        return EmbedderConfig(
            model=model, device=self.device, normalize=self.normalize, quantize=self.quantize, **self.embedder_options
        )

    @property
    def remote(self) -> bool:
        """Whether the vectors come from a running ``gpuprompt serve`` (remote mode)."""
        assert self._runtime is not None
        return self._runtime.remote

    @property
    def embedder(self) -> EmbedderLike:
        """The runtime's shared embedder for this config (obtained on first use): the process's
        :class:`~gpuprompt.Embedder`, or in remote mode the server's (a ``RemoteEmbedder``)."""
        if self._embedder is None:
            assert self._runtime is not None
            if self._runtime.remote:
                model = None if self.model_name == BUNDLED_EMBEDDING_MODEL else self.model_name
                self._embedder = self._runtime.embedder(model)
            else:
                config = self._config()
                options = {k: v for k, v in dataclasses.asdict(config).items() if k != "model"}
                self._embedder = self._runtime.embedder(config.model, **options)
        return self._embedder

    def _queries(self, query: Any) -> list[str]:
        check_str(query, "query")
        return [self.query_instruction + query if self.query_instruction else query]

    def _texts(self, texts: Any, name: str = "texts") -> list[str]:
        texts = check_str_list(texts, name)
        prefix = self.text_instruction
        return [prefix + text for text in texts] if prefix else texts

    # ------------------------------------------------------------------ public entries
    # BaseEmbedding's batch methods iterate their argument before any hook runs: a bare str would
    # be embedded character by character ("abc" -> 3 vectors). They are checked here first.
    def get_text_embedding_batch(self, texts: list[str], show_progress: bool = False, **kwargs: Any) -> list[Embedding]:
        """Embed a list of texts (chunked by ``embed_batch_size``; the core batches across calls).

        Raises:
            InputTypeError: ``texts`` is not a list of str (a bare str is refused, not split).
            InvalidInputError: a text holds a lone surrogate.
        """
        return super().get_text_embedding_batch(check_str_list(texts, "texts"), show_progress, **kwargs)

    async def aget_text_embedding_batch(
        self, texts: list[str], show_progress: bool = False, **kwargs: Any
    ) -> list[Embedding]:
        """Async :meth:`get_text_embedding_batch`."""
        return await super().aget_text_embedding_batch(check_str_list(texts, "texts"), show_progress, **kwargs)

    def get_agg_embedding_from_queries(
        self, queries: list[str], agg_fn: Callable[..., Embedding] | None = None
    ) -> Embedding:
        """The aggregate (mean by default) of the queries' embeddings.

        Raises:
            InputTypeError: ``queries`` is not a list of str (a bare str is refused, not split).
            InvalidInputError: ``queries`` is empty (the mean of nothing is NaN).
        """
        return super().get_agg_embedding_from_queries(_query_list(queries), agg_fn)

    async def aget_agg_embedding_from_queries(
        self, queries: list[str], agg_fn: Callable[..., Embedding] | None = None
    ) -> Embedding:
        """Async :meth:`get_agg_embedding_from_queries`."""
        return await super().aget_agg_embedding_from_queries(_query_list(queries), agg_fn)

    def __call__(self, nodes: Sequence[BaseNode], **kwargs: Any) -> Sequence[BaseNode]:
        """Embed ``nodes`` in place (the ingestion-pipeline transform).

        Raises:
            InputTypeError: ``nodes`` is not a list of LlamaIndex nodes.
        """
        return super().__call__(_node_list(nodes), **kwargs)

    async def acall(self, nodes: Sequence[BaseNode], **kwargs: Any) -> Sequence[BaseNode]:
        """Async :meth:`__call__`."""
        return await super().acall(_node_list(nodes), **kwargs)

    # ------------------------------------------------------------------ BaseEmbedding hooks
    def _get_query_embedding(self, query: str) -> Embedding:
        return self.embedder.embed(self._queries(query))[0].tolist()

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return (await self.embedder.aembed(self._queries(query)))[0].tolist()

    def _get_text_embedding(self, text: str) -> Embedding:
        check_str(text, "text")
        return self.embedder.embed(self._texts([text]))[0].tolist()

    async def _aget_text_embedding(self, text: str) -> Embedding:
        check_str(text, "text")
        return (await self.embedder.aembed(self._texts([text])))[0].tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self.embedder.embed(self._texts(texts)).tolist()

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return (await self.embedder.aembed(self._texts(texts))).tolist()


def _query_list(queries: Any) -> list[str]:
    queries = check_str_list(queries, "queries")
    if not queries:
        raise fail("queries", "a non-empty list of str", queries, fix="The mean of no embeddings is undefined.")
    return queries


def _node_list(nodes: Any) -> list[BaseNode]:
    if isinstance(nodes, (BaseNode, str, bytes)) or not isinstance(nodes, Sequence):
        raise fail("nodes", "a list of LlamaIndex nodes", nodes, error=InputTypeError)
    for i, node in enumerate(nodes):
        if not isinstance(node, BaseNode):
            raise fail(f"nodes[{i}]", "a LlamaIndex node", node, error=InputTypeError)
    return list(nodes)
