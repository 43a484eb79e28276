"""GPUPromptRerank: a LlamaIndex node postprocessor over gpuprompt's batched cross-encoder (a drop-in
for ``SentenceTransformerRerank``).

The core :class:`~gpuprompt.Reranker` scores the pairs of every concurrent query together. The class
gets its runtime once (:func:`gpuprompt.connect`): with ``base_url`` (or ``GPUPROMPT_URL``) the
cross-encoder is a running ``gpuprompt serve --rerank-model``'s, else the process's shared one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from llama_index.core.bridge.pydantic import Field, PrivateAttr, ValidationError
from llama_index.core.callbacks import CBEventType, EventPayload
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError, describe
from gpuprompt.rerank import RerankerConfig, check_top_n
from gpuprompt.runtime import connect
from gpuprompt.validation import configuration_error

if TYPE_CHECKING:
    from gpuprompt.protocols import RerankerLike
    from gpuprompt.remote import RemoteRuntime
    from gpuprompt.runtime import Runtime

__all__ = ["GPUPromptRerank"]

_CORE = RerankerConfig()
_LLAMA_MAX_LENGTH = 512  # SentenceTransformerRerank's max_length
_POSITIONAL = ("top_n", "model", "device", "keep_retrieval_score")  # SentenceTransformerRerank's order


class GPUPromptRerank(BaseNodePostprocessor):
    """Rerank retrieved nodes with a cross-encoder, batched across every concurrent query.

    A drop-in for ``SentenceTransformerRerank(model=..., top_n=...)``: the same text per node (its
    content with embed-mode metadata), the same order, ``node.score`` set to the cross-encoder's
    score (the retrieval score kept in ``metadata["retrieval_score"]`` with
    ``keep_retrieval_score=True``). Constructing it loads nothing.

    Example:
        .. code-block:: python

            from llamaindex_gpuprompt import GPUPromptRerank

            rerank = GPUPromptRerank(model="cross-encoder/ms-marco-MiniLM-L-6-v2", top_n=3)
            engine = index.as_query_engine(similarity_top_k=20, node_postprocessors=[rerank])
            engine.query("Will the red dress shrink?")

        Remote mode: ``GPUPromptRerank(base_url="http://127.0.0.1:8000", top_n=3)`` (a server started
        with ``--rerank-model``); no torch in this process.
    """

    model: str | None = Field(default=None, description="Cross-encoder folder or hub id; None for "
                              "cross-encoder/ms-marco-MiniLM-L-6-v2.")
    top_n: int | None = Field(default=2, description="Nodes returned, best first (None: all of them, reordered).")
    device: str = Field(default="auto", description="'auto' (cuda > mps > cpu), 'cpu', 'cuda', 'cuda:N' or 'mps'.")
    max_length: int = Field(default=_LLAMA_MAX_LENGTH, description="Most tokens of a (query, node) pair (as "
                            "SentenceTransformerRerank's 512); longer ones are truncated.")
    keep_retrieval_score: bool = Field(default=False, description="Keep the retrieval score in "
                                       "metadata['retrieval_score'].")
    dtype: Literal["float16", "bfloat16", "float32"] | None = Field(
        default=None, description="Compute dtype; None = fp16 on CUDA, fp32 elsewhere. 'bfloat16' on a CPU with AMX "
        "or AVX512-BF16 runs prepacked bf16 layers (measured on 2 cores: 2.8x fp32's requests/s, 0.978 of "
        "fp32's top-3 kept).")
    quantize: Literal["int8", "auto"] | None = Field(default=None, description="int8 forward pass on CPU "
                                                     "(guarded on ranking agreement), or 'auto'.")
    backend: Literal["torch", "onnx"] = Field(default="torch", description="'onnx': the same fp32 cross-encoder "
                                              "exported once to ONNX and run by onnxruntime on CPU (the 'quant' "
                                              "extra; scores equal torch's to about 1e-6).")
    base_url: str | None = Field(default=None, description="A running gpuprompt serve --rerank-model (remote mode); "
                                 "None: GPUPROMPT_URL or in process.")
    api_key: str | None = Field(default=None, exclude=True, repr=False, description="The server's API key.")
    timeout: float | None = Field(default=None, description="Remote mode: seconds a request may wait for an "
                                  "answer (None reads GPUPROMPT_TIMEOUT, else 60).")

    _runtime: Runtime | RemoteRuntime | None = PrivateAttr(default=None)
    _reranker: RerankerLike | None = PrivateAttr(default=None)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # SentenceTransformerRerank's positional order: GPUPromptRerank(3) is top_n=3, as there.
        if len(args) > len(_POSITIONAL):
            raise ConfigurationError(
                f"GPUPromptRerank takes at most {len(_POSITIONAL)} positional arguments ({', '.join(_POSITIONAL)}), "
                f"as SentenceTransformerRerank does (got {len(args)}); pass the others by name."
            )
        for name, value in zip(_POSITIONAL, args):
            if name in kwargs:
                raise ConfigurationError(f"GPUPromptRerank got '{name}' twice: by position and by name; pass it once.")
            kwargs[name] = value
        check_top_n(kwargs.get("top_n"), error=ConfigurationError)  # before pydantic would read True as 1
        try:
            super().__init__(**kwargs)
        except ValidationError as exc:
            raise configuration_error(exc, "GPUPromptRerank") from exc
        local = {"device": (self.device, "auto"), "max_length": (self.max_length, _LLAMA_MAX_LENGTH),
                 "dtype": (self.dtype, None), "quantize": (self.quantize, None),
                 "backend": (self.backend, "torch")}
        self._runtime = connect(self.base_url, api_key=self.api_key, timeout=self.timeout, owner="GPUPromptRerank",
                                local_options=local)
        if self._runtime.remote:
            self.base_url, self.api_key = self._runtime.config.base_url, self._runtime.config.api_key
        else:
            RerankerConfig(model=self.model, **self._options())

    @classmethod
    def class_name(cls) -> str:
        return "GPUPromptRerank"

    def _options(self) -> dict[str, Any]:
        return {"device": self.device, "max_length": self.max_length, "dtype": self.dtype, "quantize": self.quantize,
                "backend": self.backend}

    @property
    def reranker(self) -> RerankerLike:
        """The runtime's shared reranker for these settings (not loaded yet)."""
        if self._reranker is None:
            assert self._runtime is not None
            options = {} if self._runtime.remote else self._options()
            self._reranker = self._runtime.reranker(self.model, **options)
        return self._reranker

    def _inputs(self, nodes: Any, query_bundle: Any) -> tuple[str, list[str]]:
        if query_bundle is None:
            raise InvalidInputError("GPUPromptRerank needs the query: pass query_bundle (or query_str) with the nodes.")
        if not isinstance(query_bundle, QueryBundle):
            raise InputTypeError(f"'query_bundle' must be a QueryBundle (got {describe(query_bundle)}).")
        if not isinstance(nodes, list):
            raise InputTypeError(f"'nodes' must be a list of NodeWithScore (got {describe(nodes)}).")
        for position, node in enumerate(nodes):
            if not isinstance(node, NodeWithScore):
                raise InputTypeError(f"'nodes[{position}]' must be a NodeWithScore (got {describe(node)}).")
        return query_bundle.query_str, [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes]

    def _apply(self, nodes: list[NodeWithScore], hits: list[Any]) -> list[NodeWithScore]:
        out = []
        for hit in hits:
            node = nodes[hit.index]
            if self.keep_retrieval_score:
                node.node.metadata["retrieval_score"] = node.score
            node.score = hit.score
            out.append(node)
        return out

    def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
                           ) -> list[NodeWithScore]:
        query, texts = self._inputs(nodes, query_bundle)
        if not texts:
            return []
        payload = {EventPayload.NODES: nodes, EventPayload.MODEL_NAME: self.model or "default",
                   EventPayload.QUERY_STR: query, EventPayload.TOP_K: self.top_n}
        with self.callback_manager.event(CBEventType.RERANKING, payload=payload) as event:
            kept = self._apply(nodes, self.reranker.rerank(query, texts, top_n=self.top_n))
            event.on_end(payload={EventPayload.NODES: kept})
        return kept

    async def _apostprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
                                  ) -> list[NodeWithScore]:
        query, texts = self._inputs(nodes, query_bundle)
        if not texts:
            return []
        reranker = self.reranker
        await reranker.aload()
        payload = {EventPayload.NODES: nodes, EventPayload.MODEL_NAME: self.model or "default",
                   EventPayload.QUERY_STR: query, EventPayload.TOP_K: self.top_n}
        with self.callback_manager.event(CBEventType.RERANKING, payload=payload) as event:
            kept = self._apply(nodes, await reranker.arerank(query, texts, top_n=self.top_n))
            event.on_end(payload={EventPayload.NODES: kept})
        return kept
