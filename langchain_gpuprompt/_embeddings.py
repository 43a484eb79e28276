"""LangChain ``Embeddings`` over the shared gpuprompt Embedder (batched, device-cached).

The adapter only converts types: the core Embedder does the batching across concurrent calls,
the de-duplication and the device cache. ``HuggingFaceEmbeddings``' own arguments
(``model_name``, ``model_kwargs``, ``encode_kwargs``, ``query_encode_kwargs``) are translated to
the core's settings here, so swapping the import is the whole migration. The class gets its runtime
once (:func:`gpuprompt.connect`): with ``base_url`` (or ``GPUPROMPT_URL``) the embedder is a
running ``gpuprompt serve``'s, else the process's shared one; it then only delegates.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from gpuprompt.embed import EmbedderConfig
from gpuprompt.errors import ConfigurationError, describe
from gpuprompt.runtime import connect
from gpuprompt.validation import check_bool, check_str, configuration_error, fail
from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, ValidationError

if TYPE_CHECKING:
    import torch
    from gpuprompt.protocols import EmbedderLike
    from gpuprompt.remote import RemoteRuntime
    from gpuprompt.runtime import Runtime

# Defaults come from the core config: the same settings must reach the same shared Embedder
# (and batch queue) whether it is asked for from LangChain, LlamaIndex or the core.
_CORE = EmbedderConfig()

__all__ = ["GPUPromptEmbeddings"]

_MODEL_KWARGS = ("device", "backend", "prompts", "default_prompt_name", "trust_remote_code")
"""The ``SentenceTransformer(...)`` arguments (``model_kwargs``) with a meaning here."""
_ENCODE_KWARGS = ("normalize_embeddings", "batch_size", "prompt", "prompt_name", "show_progress_bar", "precision",
                  "convert_to_numpy")
"""The ``SentenceTransformer.encode(...)`` arguments (``encode_kwargs``) with a meaning here."""


class GPUPromptEmbeddings(BaseModel, Embeddings):
    """Drop-in LangChain embeddings backed by gpuprompt's batched Embedder.

    Concurrent calls (threads or asyncio tasks) are coalesced into batched forward passes, and
    every text already seen is served from a cache kept on the device. Constructing the class
    loads nothing; the model loads on the first call and is shared by every instance with the
    same settings in the process (LangChain and LlamaIndex classes alike).

    It takes the arguments ``HuggingFaceEmbeddings`` users already pass, with the same meaning:
    ``model_name``, ``model_kwargs={"device": ..., "prompts": {...}, "default_prompt_name": ...}``,
    ``encode_kwargs={"normalize_embeddings": ..., "batch_size": ..., "prompt": ...,
    "prompt_name": ...}`` and ``query_encode_kwargs`` (used for queries instead of
    ``encode_kwargs`` when given), plus ``query_instruction`` / ``embed_instruction`` as in
    ``HuggingFaceBgeEmbeddings``. Other keys raise ``ConfigurationError`` naming the key (they
    would change nothing here, or need a setting of this class instead).
    Differences: ``normalize`` defaults to True (``HuggingFaceEmbeddings`` to False; the bundled
    MiniLM normalises in its own pipeline, so its vectors are equal either way), prompt names are
    looked up in ``model_kwargs["prompts"]`` only, and a prompt's tokens are always pooled.

    Setup:
        .. code-block:: bash

            pip install "gpuprompt[langchain]"

    Instantiate:
        .. code-block:: python

            from langchain_gpuprompt import GPUPromptEmbeddings

            embeddings = GPUPromptEmbeddings()          # bundled all-MiniLM-L6-v2, best device
            # or, exactly as with HuggingFaceEmbeddings:
            embeddings = GPUPromptEmbeddings(
                model_name="sentence-transformers/all-MiniLM-L6-v2",
                model_kwargs={"device": "cpu"},
                encode_kwargs={"normalize_embeddings": True, "batch_size": 32},
            )

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

    Remote mode (the vectors of a running ``gpuprompt serve``, batched there with every worker's
    texts; this process imports no torch and loads no model):
        .. code-block:: python

            embeddings = GPUPromptEmbeddings(base_url="http://127.0.0.1:8000", api_key="...")
            # or set GPUPROMPT_URL (and GPUPROMPT_API_KEY) and keep GPUPromptEmbeddings()

        Instructions and prompts still apply (here, as text). Settings of a local model
        (``device``, ``dtype``, ``quantize``, ``backend``, ``batch_size``, ``max_batch_tokens``, ``max_wait_ms``,
        ``max_queue``, ``cache_size``, ``show_progress``, ``normalize=False``) are refused with
        ``base_url``: the server's own flags set them.
    """

    model: str | None = Field(default=None, alias="model_name")
    """Local sentence-transformers folder or hub id (also ``model_name=``); None for the bundled
    all-MiniLM-L6-v2."""
    device: str = _CORE.device
    """Torch device: 'auto' (cuda > mps > cpu), 'cpu', 'cuda', 'cuda:N' or 'mps'."""
    normalize: bool = _CORE.normalize
    """L2-normalise the embeddings (inner product then equals cosine similarity)."""
    dtype: str | None = _CORE.dtype
    """Compute dtype ('float16', 'bfloat16', 'float32'); None = fp16 on CUDA, fp32 elsewhere."""
    quantize: Literal["int8", "auto"] | None = None
    """None: full precision; 'int8': int8 forward pass on CPU (onnxruntime, the 'quant' extra),
    checked against fp32 by the core's quality guard; 'auto': int8 where it runs and passes it."""
    backend: Literal["torch", "onnx"] = "torch"
    """'torch': the model's own forward pass; 'onnx': the same fp32 model exported once to ONNX and
    run by onnxruntime on CPU (the 'quant' extra; vectors equal torch's to about 1e-7, about 1.15x
    torch's speed on 2 cores)."""
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
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    """``HuggingFaceEmbeddings`` style: ``device``, ``prompts`` (name -> text), ``default_prompt_name``."""
    encode_kwargs: dict[str, Any] = Field(default_factory=dict)
    """``HuggingFaceEmbeddings`` style: ``normalize_embeddings``, ``batch_size``, ``prompt``,
    ``prompt_name``, ``show_progress_bar`` (and ``precision="float32"``, ``convert_to_numpy=True``)."""
    query_encode_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Like ``encode_kwargs``, used for queries instead of it when not empty (as in
    ``HuggingFaceEmbeddings``); ``normalize_embeddings`` must match the documents'."""
    query_instruction: str = ""
    """Text put before every query (``HuggingFaceBgeEmbeddings`` style), for e5/bge-like models."""
    embed_instruction: str = ""
    """Text put before every document (``HuggingFaceBgeEmbeddings`` style)."""
    multi_process: bool = False
    """Accepted for ``HuggingFaceEmbeddings`` compatibility; must stay False (the core batches)."""
    cache_folder: str | None = None
    """Accepted for ``HuggingFaceEmbeddings`` compatibility; must stay None (pass a folder as
    ``model_name``, or set ``HF_HOME``)."""
    base_url: str | None = None
    """A running ``gpuprompt serve`` to embed on (remote mode); None reads ``GPUPROMPT_URL``, and
    without it the model runs in this process."""
    api_key: SecretStr | None = None
    """The server's API key (remote mode); None reads ``GPUPROMPT_API_KEY`` when ``GPUPROMPT_URL`` is used."""
    timeout: float | None = Field(default=None, alias="request_timeout")
    """Remote mode: seconds a request to the server may wait for an answer (also ``request_timeout=``);
    None reads ``GPUPROMPT_TIMEOUT``, else 60."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), populate_by_name=True)

    _embedder: EmbedderLike | None = PrivateAttr(default=None)
    _runtime: Runtime | RemoteRuntime | None = PrivateAttr(default=None)
    _doc_prefix: str = PrivateAttr(default="")
    _query_prefix: str = PrivateAttr(default="")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:  # a field of the wrong type: our typed error, naming it
            raise configuration_error(exc, "GPUPromptEmbeddings") from exc
        # Check the options now (pure Python, loads nothing) so a bad value fails at construction
        # with the core's typed ConfigurationError (pydantic would wrap it inside a validator).
        self._translate_hf_arguments()
        local = ("device", "dtype", "quantize", "backend", "batch_size", "max_batch_tokens", "max_wait_ms", "max_queue",
                 "cache_size", "show_progress", "normalize")
        self._runtime = connect(
            self.base_url,
            api_key=self.api_key,
            timeout=self.timeout,
            owner="GPUPromptEmbeddings",
            local_options={name: (getattr(self, name), getattr(_CORE, name)) for name in local},
        )
        if self._runtime.remote:
            config = self._runtime.config
            self.base_url = config.base_url
            if config.api_key is not None:
                self.api_key = SecretStr(config.api_key)
        else:
            self._config()

    # ------------------------------------------------------------------ HuggingFaceEmbeddings args
    def _translate_hf_arguments(self) -> None:
        """Fold ``model_kwargs`` / ``encode_kwargs`` / ``query_encode_kwargs`` into this class's
        own settings and the two text prefixes (checked, not loaded)."""
        if self.multi_process is not False:
            raise fail("multi_process", "False", self.multi_process, error=ConfigurationError,
                       fix="The core already batches every caller's texts on one shared model.")
        if self.cache_folder is not None:
            raise fail("cache_folder", "None", self.cache_folder, error=ConfigurationError,
                       fix="Pass the model's local folder as model_name=..., or set HF_HOME for the hub cache.")
        model_kwargs = _check_kwargs(self.model_kwargs, "model_kwargs", _MODEL_KWARGS)
        encode = _check_kwargs(self.encode_kwargs, "encode_kwargs", _ENCODE_KWARGS)
        query = _check_kwargs(self.query_encode_kwargs, "query_encode_kwargs", _ENCODE_KWARGS) or encode
        query_name = "query_encode_kwargs" if self.query_encode_kwargs else "encode_kwargs"
        if model_kwargs.get("trust_remote_code", False) is not False:
            raise fail("model_kwargs['trust_remote_code']", "False", model_kwargs["trust_remote_code"],
                       error=ConfigurationError, fix="gpuprompt runs no code shipped with a model.")
        if "device" in model_kwargs:
            self.device = _merge("device", self.device, model_kwargs["device"], "model_kwargs['device']",
                                 explicit="device" in self.model_fields_set)
        if "backend" in model_kwargs:  # SentenceTransformer(backend="onnx"): our onnxruntime forward pass
            self.backend = _merge("backend", self.backend, model_kwargs["backend"], "model_kwargs['backend']",
                                  explicit="backend" in self.model_fields_set)
        for kwargs, name in ((encode, "encode_kwargs"), (query, query_name)):
            for key in ("precision", "convert_to_numpy"):
                if key in kwargs and kwargs[key] != {"precision": "float32", "convert_to_numpy": True}[key]:
                    raise fail(f"{name}['{key}']", repr({"precision": "float32", "convert_to_numpy": True}[key]),
                               kwargs[key], error=ConfigurationError,
                               fix="Vectors are returned as float32 lists (see quantize= for int8 compute).")
        if "normalize_embeddings" in encode:
            check_bool(encode["normalize_embeddings"], "encode_kwargs['normalize_embeddings']", error=ConfigurationError)
            self.normalize = _merge("normalize", self.normalize, encode["normalize_embeddings"],
                                    "encode_kwargs['normalize_embeddings']", explicit="normalize" in self.model_fields_set)
        if query.get("normalize_embeddings", self.normalize) != self.normalize:
            raise ConfigurationError(
                f"'{query_name}['normalize_embeddings']' must equal the documents' setting ({self.normalize}) (got "
                f"{describe(query['normalize_embeddings'])}): queries and documents share one embedder and are "
                "compared with each other."
            )
        if "batch_size" in encode:
            self.batch_size = _merge("batch_size", self.batch_size, encode["batch_size"], "encode_kwargs['batch_size']",
                                     explicit="batch_size" in self.model_fields_set)
        if "show_progress_bar" in encode:
            check_bool(encode["show_progress_bar"], "encode_kwargs['show_progress_bar']", error=ConfigurationError)
            self.show_progress = encode["show_progress_bar"]
        self._doc_prefix = _prefix(self.embed_instruction, "embed_instruction", encode, "encode_kwargs", model_kwargs)
        self._query_prefix = _prefix(self.query_instruction, "query_instruction", query, query_name, model_kwargs)

    @property
    def model_name(self) -> str | None:
        """The model setting under ``HuggingFaceEmbeddings``' name (same as :attr:`model`)."""
        return self.model

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
            quantize=self.quantize,
            backend=self.backend,
        )

    @property
    def remote(self) -> bool:
        """Whether the vectors come from a running ``gpuprompt serve`` (remote mode)."""
        assert self._runtime is not None
        return self._runtime.remote

    @property
    def embedder(self) -> EmbedderLike:
        """The runtime's shared embedder for these settings (not loaded yet): the process's
        :class:`~gpuprompt.Embedder`, or in remote mode the server's (a ``RemoteEmbedder``)."""
        if self._embedder is None:
            assert self._runtime is not None
            options = {} if self._runtime.remote else {
                k: v for k, v in dataclasses.asdict(self._config()).items() if k != "model"}
            self._embedder = self._runtime.embedder(self.model, **options)
        return self._embedder

    # ------------------------------------------------------------------ core-typed access
    def embed_tensor(self, texts: list[str]) -> torch.Tensor:
        """Embed ``texts`` (document prefix applied) and keep the result on the device: a
        ``(n, dim)`` float32 tensor."""
        return self.embedder.embed_tensor(self._documents(texts))

    async def aembed_tensor(self, texts: list[str]) -> torch.Tensor:
        """Async :meth:`embed_tensor`."""
        return await (await self._aembedder()).aembed_tensor(self._documents(texts))

    def embed_query_tensor(self, texts: list[str]) -> torch.Tensor:
        """Embed query ``texts`` (query prefix applied, as :meth:`embed_query`) and keep the result
        on the device: a ``(n, dim)`` float32 tensor."""
        return self.embedder.embed_tensor(self._queries(texts))

    async def aembed_query_tensor(self, texts: list[str]) -> torch.Tensor:
        """Async :meth:`embed_query_tensor`."""
        return await (await self._aembedder()).aembed_tensor(self._queries(texts))

    async def _aembedder(self) -> EmbedderLike:
        if self._embedder is None:
            # The first lookup resolves the device, which imports torch: keep that off the loop.
            await asyncio.to_thread(lambda: self.embedder)
        assert self._embedder is not None
        return self._embedder

    def _documents(self, texts: list[str]) -> list[str]:
        if not self._doc_prefix:
            return texts  # the core validates the list and names a bad item
        from gpuprompt.embed import validate_texts

        return [self._doc_prefix + text for text in validate_texts(texts)]

    def _query(self, text: str) -> list[str]:
        _check_text(text)
        return [self._query_prefix + text]

    def _queries(self, texts: list[str]) -> list[str]:
        if not self._query_prefix:
            return texts  # the core validates the list and names a bad item
        from gpuprompt.embed import validate_texts

        return [self._query_prefix + text for text in validate_texts(texts)]

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
        return self.embedder.embed(self._documents(texts)).tolist()

    def embed_query(self, text: str) -> list[float]:
        """Embed one query text; concurrent callers share batched forward passes.

        Raises:
            InputTypeError: ``text`` is not a str.
            InvalidInputError: ``text`` holds a lone surrogate.
        """
        return self.embedder.embed(self._query(text))[0].tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Async :meth:`embed_documents`: batched with other tasks' texts, never blocks the loop."""
        return (await (await self._aembedder()).aembed(self._documents(texts))).tolist()

    async def aembed_query(self, text: str) -> list[float]:
        """Async :meth:`embed_query`: batched with other tasks' texts, never blocks the loop."""
        return (await (await self._aembedder()).aembed(self._query(text)))[0].tolist()

    def __repr__(self) -> str:
        if self._runtime is not None and self._runtime.remote:
            return f"GPUPromptEmbeddings(model={self.model!r}, base_url={self._runtime.config.shown_url!r})"
        quantize = f", quantize={self.quantize!r}" if self.quantize else ""
        quantize += f", backend={self.backend!r}" if self.backend != "torch" else ""
        return f"GPUPromptEmbeddings(model={self.model!r}, device={self.device!r}{quantize})"


def _check_text(text: Any) -> None:
    check_str(text, "text")


def _check_kwargs(value: Mapping[str, Any], name: str, valid: tuple[str, ...]) -> dict[str, Any]:
    unknown = sorted(str(key) for key in value if key not in valid)
    if unknown:
        hints = {"model_kwargs": " (for a compute dtype use dtype=..., for int8 quantize='int8')"}
        raise ConfigurationError(
            f"{name} key(s) {unknown} have no meaning for GPUPromptEmbeddings; valid keys: {list(valid)}"
            f"{hints.get(name, '')}."
        )
    return dict(value)


def _merge(field: str, current: Any, given: Any, given_name: str, *, explicit: bool) -> Any:
    """``given`` (a HuggingFace-style argument) unless ``field`` was also set to something else."""
    if explicit and given != current:
        raise ConfigurationError(
            f"'{field}' and '{given_name}' disagree ({describe(current)} vs {describe(given)}): set one of them."
        )
    return given


def _prefix(instruction: str, instruction_name: str, kwargs: Mapping[str, Any], name: str,
            model_kwargs: Mapping[str, Any]) -> str:
    """The text put before each text: an instruction, or a sentence-transformers prompt."""
    check_str(instruction, instruction_name, error=ConfigurationError)
    prompts = model_kwargs.get("prompts") or {}
    if not isinstance(prompts, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise fail("model_kwargs['prompts']", "a dict of prompt name -> prompt text", prompts, error=ConfigurationError)
    prompt = kwargs.get("prompt")
    prompt_name = kwargs.get("prompt_name", model_kwargs.get("default_prompt_name") if prompt is None else None)
    if prompt is not None and "prompt_name" in kwargs:
        raise ConfigurationError(f"'{name}' holds both 'prompt' and 'prompt_name': pass one of them.")
    if prompt_name is not None:
        check_str(prompt_name, f"{name}['prompt_name']", error=ConfigurationError)
        if prompt_name not in prompts:
            raise ConfigurationError(
                f"'{name}['prompt_name']' names prompt {prompt_name!r}, which model_kwargs['prompts'] does not hold "
                f"(it holds {sorted(prompts)}); gpuprompt reads no prompts from the model's own config: pass "
                "model_kwargs={'prompts': {...}} or the text as 'prompt'."
            )
        prompt = prompts[prompt_name]
    check_str(prompt, f"{name}['prompt']", allow_none=True, error=ConfigurationError)
    if prompt and instruction:
        raise ConfigurationError(
            f"set either '{instruction_name}' or a prompt in '{name}', not both (both put text before each input)."
        )
    return instruction or prompt or ""
