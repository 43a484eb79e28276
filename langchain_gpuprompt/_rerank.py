"""LangChain document compressor over gpuprompt's batched cross-encoder (a drop-in for ``CrossEncoderReranker``).

The core :class:`~gpuprompt.Reranker` does the work: the pairs of every concurrent chain share its
batches, sorted by length, with a score cache. The class gets its runtime once
(:func:`gpuprompt.connect`): with ``base_url`` (or ``GPUPROMPT_URL``) the cross-encoder is a running
``gpuprompt serve --rerank-model``'s, else the process's shared one; it then only delegates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, ValidationError

from gpuprompt.errors import ConfigurationError, InputTypeError, describe
from gpuprompt.rerank import RerankerConfig, check_top_n
from gpuprompt.runtime import connect
from gpuprompt.validation import configuration_error

if TYPE_CHECKING:
    from gpuprompt.protocols import RerankerLike
    from gpuprompt.remote import RemoteRuntime
    from gpuprompt.runtime import Runtime

__all__ = ["GPUPromptReranker"]

_CORE = RerankerConfig()


class GPUPromptReranker(BaseDocumentCompressor):
    """Rerank retrieved documents with a cross-encoder, batched across every concurrent call.

    A drop-in for LangChain's ``CrossEncoderReranker`` (``ContextualCompressionRetriever``'s
    ``base_compressor``): the documents come back best first, at most ``top_n`` of them, each a
    copy with its metadata plus ``relevance_score`` (the cross-encoder's score). Constructing the
    class loads nothing; the model loads on the first call and is shared by every instance with the
    same settings in the process (LangChain and LlamaIndex rerankers alike).

    Setup:
        .. code-block:: bash

            pip install "gpuprompt[langchain]"

    Use (before: ``CrossEncoderReranker(model=HuggingFaceCrossEncoder(model_name=...), top_n=3)``):
        .. code-block:: python

            from langchain_classic.retrievers import ContextualCompressionRetriever
            from langchain_gpuprompt import GPUPromptReranker

            reranker = GPUPromptReranker(model="cross-encoder/ms-marco-MiniLM-L-6-v2", top_n=3)
            retriever = ContextualCompressionRetriever(
                base_compressor=reranker, base_retriever=store.as_retriever(search_kwargs={"k": 20})
            )
            docs = retriever.invoke("Will the red dress shrink?")
            docs[0].metadata["relevance_score"]
            # 7.12...

    Async (concurrent chains share batches; the event loop never runs the model):
        .. code-block:: python

            docs = await reranker.acompress_documents(docs, "Will the red dress shrink?")

    Remote mode (the cross-encoder of ``gpuprompt serve --rerank-model ...``; no torch here):
        .. code-block:: python

            reranker = GPUPromptReranker(base_url="http://127.0.0.1:8000", top_n=3)

    No cross-encoder weights ship on the package index: bring a trained one (a hub id, or a local
    folder of any Hugging Face sequence-classification model).
    """

    model: str | None = Field(default=None, alias="model_name")
    """Cross-encoder folder or hub id (also ``model_name=``); None for
    ``cross-encoder/ms-marco-MiniLM-L-6-v2`` (needs the hub or the HF cache)."""
    top_n: int | None = 3
    """Most documents returned (None: all of them, reordered)."""
    device: str = _CORE.device
    """Torch device: 'auto' (cuda > mps > cpu), 'cpu', 'cuda', 'cuda:N' or 'mps'."""
    max_length: int | None = _CORE.max_length
    """Most tokens of a (query, document) pair; longer ones are truncated (None: the model's)."""
    dtype: Literal["float16", "bfloat16", "float32"] | None = _CORE.dtype
    """Compute dtype; None = fp16 on CUDA, fp32 elsewhere. 'bfloat16' on a CPU with AMX or
    AVX512-BF16 runs prepacked bf16 layers (measured on 2 cores: 2.8x fp32's requests/s, 0.978 of
    fp32's top-3 kept)."""
    quantize: Literal["int8", "auto"] | None = None
    """None: full precision; 'int8': int8 forward pass on CPU (the 'quant' extra), guarded on ranking
    agreement with fp32; 'auto': int8 where it runs and passes."""
    backend: Literal["torch", "onnx"] = "torch"
    """'torch': the model's own forward pass; 'onnx': the same fp32 cross-encoder exported once to
    ONNX and run by onnxruntime on CPU (the 'quant' extra; scores equal torch's to about 1e-6)."""
    batch_size: int = _CORE.batch_size
    """Most pairs per batch (pairs of concurrent calls share batches)."""
    base_url: str | None = None
    """A running ``gpuprompt serve --rerank-model`` to rerank on (remote mode); None reads ``GPUPROMPT_URL``."""
    api_key: SecretStr | None = None
    """The server's API key (remote mode); None reads ``GPUPROMPT_API_KEY`` with ``GPUPROMPT_URL``."""
    timeout: float | None = None
    """Remote mode: seconds a request to the server may wait for an answer (None reads
    ``GPUPROMPT_TIMEOUT``, else 60)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), populate_by_name=True)

    _runtime: Runtime | RemoteRuntime | None = PrivateAttr(default=None)
    _reranker: RerankerLike | None = PrivateAttr(default=None)

    def __init__(self, **data: Any) -> None:
        check_top_n(data.get("top_n"), error=ConfigurationError)  # before pydantic would read True as 1
        if "model" in data and "model_name" in data:
            raise ConfigurationError("pass the cross-encoder once: model= or model_name= (its alias), not both.")
        try:
            super().__init__(**data)
        except ValidationError as exc:  # a field of the wrong type: our typed error, naming it
            raise configuration_error(exc, "GPUPromptReranker") from exc
        local = {name: (getattr(self, name), getattr(_CORE, name)) for name in ("device", "max_length", "dtype",
                                                                              "quantize", "backend", "batch_size")}
        self._runtime = connect(self.base_url, api_key=self.api_key, timeout=self.timeout, owner="GPUPromptReranker",
                                local_options=local)
        if self._runtime.remote:
            config = self._runtime.config
            self.base_url = config.base_url
            if config.api_key is not None:
                self.api_key = SecretStr(config.api_key)
        else:
            self._options()  # the core checks the settings now (loads nothing)

    def _options(self) -> dict[str, Any]:
        options = {"device": self.device, "max_length": self.max_length, "dtype": self.dtype,
                   "quantize": self.quantize, "backend": self.backend, "batch_size": self.batch_size}
        RerankerConfig(model=self.model, **options)
        return options

    @property
    def reranker(self) -> RerankerLike:
        """The runtime's shared reranker for these settings (not loaded yet): the process's
        :class:`~gpuprompt.Reranker`, or in remote mode the server's (a ``RemoteReranker``)."""
        if self._reranker is None:
            assert self._runtime is not None
            options = {} if self._runtime.remote else self._options()
            self._reranker = self._runtime.reranker(self.model, **options)
        return self._reranker

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """The documents reordered by relevance to ``query``, best first, at most ``top_n``.

        Raises:
            InputTypeError: ``documents`` is not a list of ``Document``, or ``query`` not a str.
            InvalidInputError: a text with a lone surrogate, or more documents than the cap.
        """
        texts = _texts(documents)
        if not texts:
            return []
        return _ranked(documents, self.reranker.rerank(query, texts, top_n=self.top_n))

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """Async :meth:`compress_documents`: batched with every concurrent caller; the event loop
        never waits on the model (nor on a thread pool)."""
        texts = _texts(documents)
        if not texts:
            return []
        reranker = self.reranker
        await reranker.aload()  # type: ignore[attr-defined]
        return _ranked(documents, await reranker.arerank(query, texts, top_n=self.top_n))

    def __repr__(self) -> str:
        where = f", base_url={self._runtime.config.shown_url!r}" if self._runtime is not None and self._runtime.remote \
            else f", device={self.device!r}"
        return f"GPUPromptReranker(model={self.model!r}, top_n={self.top_n}{where})"


def _texts(documents: Any) -> list[str]:
    if isinstance(documents, (Document, str, bytes)) or not isinstance(documents, Sequence):
        raise InputTypeError(f"'documents' must be a list of Document (got {describe(documents)}).")
    for position, document in enumerate(documents):
        if not isinstance(document, Document):
            raise InputTypeError(f"'documents[{position}]' must be a Document (got {describe(document)}).")
    return [document.page_content for document in documents]


def _ranked(documents: Sequence[Document], hits: Sequence[Any]) -> list[Document]:
    out = []
    for hit in hits:
        source = documents[hit.index]
        out.append(Document(id=source.id, page_content=source.page_content,
                            metadata={**source.metadata, "relevance_score": hit.score}))
    return out
