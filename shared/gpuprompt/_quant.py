"""int8 embedding on CPU: the transformer exported to ONNX once, rewritten to int8, and a quality guard.

Only the forward pass changes: tokenisation, truncation, pooling and normalisation stay the
SentenceTransformer's own code, so an int8 :class:`~gpuprompt.Embedder` batches, caches and counts
tokens exactly as the fp32 one does.

The recipe, chosen by measurement on all-MiniLM-L6-v2 (2 cores; the ``embed-quant`` bench gives the
end-to-end figures): every ``MatMul`` with a constant weight runs as onnxruntime's
``MatMulIntegerToFloat`` with **per-output-channel** symmetric int8 weights and **per-token**
symmetric int8 activations (each token row scaled by its own max-abs at run time), after
SmoothQuant (alpha 0.5, calibrated on a small built-in corpus) moves outlier channels from the
activations into the weights. Cosine to fp32, mean / min:

* torch dynamic int8 of every Linear (the issue's measurement, 512 short texts): 0.951 / 0.934;
* ``onnxruntime.quantization.quantize_dynamic``, per-channel (2,300 catalogue texts and
  questions): 0.993 / 0.983 -- it scales activations per tensor, over the whole padded batch, so a
  vector also depended on its batch-mates;
* onnxruntime ``MatMulNBits`` 8-bit blockwise: 0.9997, but only 1.0-1.3x the fp32 speed here;
* per-token (3,000 guard texts): 0.9976 / 0.9959; per-token + SmoothQuant: 0.9989 / 0.9977 (kept;
  the min is 0.986 once the guard's :data:`EDGE_TEXTS` such as ``"?"`` and ``""`` are included).

With per-row scales a text's vector never depends on the batch it lands in: batched, concurrent
and one-at-a-time vectors are bit-identical, as :class:`Int8Forward` relies on.

On CUDA ``quantize`` stays off: ``"int8"`` is refused and ``"auto"`` keeps fp16. What int8 would buy
there (reasoned, not measured: no GPU was available for this work): fp16 already runs the GEMMs on
tensor cores, and for a 22M-parameter encoder at embedding batch sizes the time goes mostly to
kernel launches, attention, LayerNorm and GELU, which int8 does not touch; int8 GEMMs would halve
the weights' memory (about 45 MB to 23 MB, immaterial on a GPU) and add per-token quantise /
dequantise passes between layers. A real GPU gain would need fused int8 kernels (TensorRT or a
compiled graph), not a drop-in forward swap; onnxruntime's CPU kernels used here do not run on CUDA.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import os
import random
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuprompt._validate import check_number
from gpuprompt.errors import ConfigurationError, DependencyError, ModelLoadError, QualityError

__all__ = [
    "EDGE_TEXTS",
    "QUANTIZE_CHOICES",
    "RECIPE",
    "Int8Forward",
    "QualityReport",
    "QualityThresholds",
    "build_int8",
    "calibration_texts",
    "channel_maxima",
    "export_onnx",
    "guard_corpus",
    "measure",
    "quality_error",
    "quantize_onnx",
    "recall_at_10",
]

logger = logging.getLogger(__name__)

QUANTIZE_CHOICES = ("int8", "auto")
"""What ``EmbedderConfig.quantize`` accepts besides None (full precision)."""

RECIPE = "int8-sq-pertoken-v1"
"""Names the export + rewrite + guard recipe; a new recipe builds a new cache folder."""

INSTALL_HINT = "pip install 'gpuprompt[quant]' (onnxruntime and onnx)"

_COMPLETE_MARK = ".gpuprompt-complete"
_MODEL_FILE = "model.int8.onnx"
_REPORT_FILE = "quality.json"
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_GUARD_QUERIES = 1000
_GUARD_BATCH = 64
EDGE_TEXTS = (
    "", "x", "ok", "Thanks!", "?", "42", "hello hello hello hello", "Größe M oder L? Taille 38, ¿hay descuento?",
    "SKU P000123", "red " * 200, "longword " * 400,
)
"""Texts at the edges (empty, one character, repeated, non-English, truncated) also in the guard's cosines."""
_SMOOTHING_ALPHA = 0.5  # measured 0.35 / 0.5 / 0.6 / 0.7: 0.5 kept the most top-10 overlap with fp32


@dataclass(frozen=True, kw_only=True)
class QualityThresholds:
    """The quality guard's floor for a quantised embedder, compared with fp32 on a built-in corpus.

    Attributes:
        cosine_mean: least mean cosine between int8 and fp32 vectors of the same texts.
        cosine_min: least cosine for any single text.
        recall_at_10: least share of fp32's recall@10 that int8 keeps on the 2,000-product catalogue
            (int8 recall@10 / fp32 recall@10, relevance from the products' attributes).
    """

    cosine_mean: float = 0.99
    cosine_min: float = 0.98
    recall_at_10: float = 0.98

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            check_number(getattr(self, field.name), f"quantize_guard.{field.name}", min=0.0, max=1.0,
                         error=ConfigurationError)


@dataclass(frozen=True)
class QualityReport:
    """What the guard measured for one int8 model (cached next to it, so it is measured once).

    Attributes:
        cosine_mean: mean cosine between int8 and fp32 vectors over the guard corpus.
        cosine_min: the smallest of those cosines.
        recall_at_10: int8 recall@10 divided by fp32 recall@10 (attribute-labelled queries over the
            catalogue): the share of fp32's retrieval quality that int8 keeps.
        fp32_recall_at_10: fp32's labelled recall@10.
        int8_recall_at_10: int8's labelled recall@10.
        overlap_at_10: mean share of fp32's top-10 products that int8 also returns in its top-10.
            Informational, not gated: the catalogue holds many near-identical products (for 42% of
            the queries the 10th and 11th fp32 scores differ by less than 0.001), so even bf16
            compute of the same model (cosine 0.99994) keeps only 0.978 of fp32's top-10 here.
        texts: vectors compared for the cosines.
        queries: labelled queries behind the recall figures.
        products: catalogue size.
        recipe: :data:`RECIPE`.
        onnxruntime: the onnxruntime version that measured it.
    """

    cosine_mean: float
    cosine_min: float
    recall_at_10: float
    fp32_recall_at_10: float
    int8_recall_at_10: float
    overlap_at_10: float
    texts: int
    queries: int
    products: int
    recipe: str
    onnxruntime: str

    def failures(self, thresholds: QualityThresholds) -> list[str]:
        """The figures under ``thresholds``, each as ``"name X < floor Y"`` (empty: it passes)."""
        out = []
        for name in ("cosine_mean", "cosine_min", "recall_at_10"):
            value, floor = getattr(self, name), getattr(thresholds, name)
            if value < floor:
                out.append(f"{name} {value:.4f} < {floor:g}")
        return out

    def summary(self) -> str:
        """The figures in one line."""
        return (
            f"cosine to fp32 mean {self.cosine_mean:.4f} min {self.cosine_min:.4f} over {self.texts} texts; "
            f"recall@10 kept {self.recall_at_10:.4f} (int8 {self.int8_recall_at_10:.4f} / fp32 "
            f"{self.fp32_recall_at_10:.4f}, {self.queries} queries over {self.products} products); "
            f"top-10 overlap with fp32 {self.overlap_at_10:.4f}"
        )


def quality_error(report: QualityReport, thresholds: QualityThresholds, model_id: str) -> QualityError | None:
    """The error to raise when ``report`` is under ``thresholds``, else None."""
    failed = report.failures(thresholds)
    if not failed:
        return None
    return QualityError(
        f"the int8 model of {model_id!r} fell under the quality guard: {'; '.join(failed)} "
        f"({report.summary()}). Use quantize=None (fp32), quantize='auto' (int8 only when it passes), "
        "or lower EmbedderConfig.quantize_guard if these figures are acceptable to you.",
        report=report,
        failed=failed,
    )


# ---------------------------------------------------------------------------------------- runtime
class Int8Forward:
    """The int8 forward pass: the ONNX transformer, then the SentenceTransformer's own later modules.

    A batch is split into ``threads`` slices of about equal token count, each run by a one-thread
    onnxruntime call on a core of its own. The int8 graph has ~300 small nodes, and splitting each
    of them over two cores gained little (measured on an idle 2-core machine: 32 short questions
    took 24 ms on two intra-op threads and 12.5 ms as two one-thread halves, fp32 torch 49 ms;
    64 product descriptions 195 / 163 ms, fp32 torch 423 ms). Per-token scales make every
    row independent of the others, so the split never changes a vector; each slice is also cut to
    its own longest text (less padding).

    Args:
        path: the int8 ONNX file.
        model: the loaded ``SentenceTransformer`` (its first module is the one replaced).
        threads: slices run at once (default: torch's thread count).
    """

    def __init__(self, path: Path, model: Any, *, threads: int | None = None) -> None:
        ort = _onnxruntime()
        import torch

        self._threads = max(1, threads or torch.get_num_threads())
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Idle pool threads must not spin between batches: they would take the cores from the
        # tokenizer and from callers' threads (2 cores here).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise ModelLoadError(f"onnxruntime could not load {path}: {exc}; delete the folder to rebuild it.") from exc
        self._inputs = [i.name for i in self._session.get_inputs()]
        self._tail = list(model)[1:]
        tokenizer = getattr(model, "tokenizer", None)
        self._right_padded = getattr(tokenizer, "padding_side", "right") == "right"
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.path = path

    def __call__(self, features: dict[str, Any]) -> Any:
        """``features`` from ``SentenceTransformer.preprocess`` -> ``(batch, dim)`` sentence embeddings."""
        import torch

        slices = self._slices(features["attention_mask"])
        if len(slices) == 1:
            return self._tail_of(features, self._run(features, slices[0]))
        pool = self._executor()
        hidden = list(pool.map(lambda part: self._run(features, part), slices))
        return torch.cat([self._tail_of(features, h, part) for h, part in zip(hidden, slices)])

    def _slices(self, mask: Any) -> list[tuple[int, int, int]]:
        """``(start, stop, length)`` row slices of about equal token count, one per thread."""
        lengths = mask.sum(dim=1).tolist()
        rows = len(lengths)
        width = int(mask.shape[1])
        parts = min(self._threads, rows)
        bounds = [0]
        if parts > 1:
            total, running, k = sum(lengths), 0, 1
            for i, n in enumerate(lengths):
                running += n
                if k < parts and running >= total * k / parts and i + 1 < rows:
                    bounds.append(i + 1)
                    k += 1
        bounds.append(rows)
        out = []
        for start, stop in itertools.pairwise(bounds):
            length = max(lengths[start:stop]) if self._right_padded else width
            out.append((start, stop, max(1, int(length))))
        return out

    def _run(self, features: dict[str, Any], part: tuple[int, int, int]) -> Any:
        start, stop, length = part
        feed = {name: features[name][start:stop, :length].numpy() for name in self._inputs}
        return self._session.run(["token_embeddings"], feed)[0]

    def _tail_of(self, features: dict[str, Any], hidden: Any, part: tuple[int, int, int] | None = None) -> Any:
        import torch

        if part is not None:
            start, stop, length = part
            features = {k: v[start:stop, :length] if isinstance(v, torch.Tensor) and v.dim() == 2 else v
                        for k, v in features.items()}
        else:
            features = dict(features)
            length = hidden.shape[1]
            features = {k: v[:, :length] if isinstance(v, torch.Tensor) and v.dim() == 2 else v
                        for k, v in features.items()}
        features["token_embeddings"] = torch.from_numpy(hidden)
        for module in self._tail:
            features = module(features)
        return features["sentence_embedding"]

    def _executor(self) -> ThreadPoolExecutor:
        # Long-lived threads that only call onnxruntime (no torch op, so no OpenMP team of their own).
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="gpuprompt-int8")
            return self._pool

    def close(self) -> None:
        """Release the session and the slice threads."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        self._session = None  # type: ignore[assignment]


# ------------------------------------------------------------------------------ build (once, cached)
def build_int8(
    model: Any,
    model_path: str,
    model_id: str,
    *,
    root: Path | None = None,
    products: int = 2000,
    queries: int = _GUARD_QUERIES,
) -> tuple[Path, QualityReport]:
    """Export, quantise and measure once; return the cached int8 model and its guard report.

    The first process to arrive builds under a file lock while others wait; the folder is written
    under a temporary name and renamed when complete (model, report and a completion mark), so a
    crash never leaves a half folder that looks finished. A report measured by another onnxruntime
    version is measured again (the kernels changed), without re-exporting.

    Args:
        model: the loaded fp32 ``SentenceTransformer`` on CPU (the export source and the guard's
            reference).
        model_path: its folder (fingerprinted for the cache name).
        model_id: its name, for the folder name and messages.
        root: where int8 models go (default ``cache_dir() / "models"``).
        products: catalogue size of the guard (the defaults are the documented guard; smaller
            sizes, for tests, build a folder of their own).
        queries: labelled queries of the guard.

    Raises:
        DependencyError: onnxruntime or onnx is missing.
        ModelLoadError: the export or the rewrite failed (for example an architecture the recipe
            does not handle).
    """
    ort = _onnxruntime()
    from filelock import FileLock

    from gpuprompt.models import cache_dir

    root = root or cache_dir() / "models"
    root.mkdir(parents=True, exist_ok=True)
    name = model_id.rstrip("/").rsplit("/", 1)[-1] or "model"
    suffix = "" if (products, queries) == (2000, _GUARD_QUERIES) else f"-g{products}x{queries}"
    target = root / f"{name}-{RECIPE}-{_fingerprint(model_path)}{suffix}"
    report = _read_report(target)
    if report is not None and report.onnxruntime == ort.__version__:
        return target / _MODEL_FILE, report
    with FileLock(str(target) + ".lock", timeout=1800):
        report = _read_report(target)
        if report is not None and report.onnxruntime == ort.__version__:
            return target / _MODEL_FILE, report
        if report is not None:  # built, but measured by another onnxruntime: measure again
            logger.info("re-measuring %s with onnxruntime %s (was %s)", target, ort.__version__, report.onnxruntime)
            report = measure(model, target / _MODEL_FILE, products=products, queries=queries)
            _write_json_atomic(target / _REPORT_FILE, dataclasses.asdict(report))
            return target / _MODEL_FILE, report
        logger.info("building the int8 model of %s in %s (once: export, quantise, quality guard)", model_id, target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-int8-", dir=root))
        try:
            fp32 = tmp / "model.fp32.onnx"
            export_onnx(model, fp32)
            maxima = channel_maxima(fp32, model, calibration_texts())
            quantize_onnx(fp32, tmp / _MODEL_FILE, maxima=maxima, alpha=_SMOOTHING_ALPHA)
            fp32.unlink()
            report = measure(model, tmp / _MODEL_FILE, products=products, queries=queries)
            (tmp / _REPORT_FILE).write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
            (tmp / _COMPLETE_MARK).write_text(RECIPE + "\n")
            if target.exists():  # a leftover without the mark (an interrupted older build)
                shutil.rmtree(target)
            os.replace(tmp, target)
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, (DependencyError, ModelLoadError)):
                raise
            raise ModelLoadError(f"building the int8 model of {model_id!r} failed: {exc}") from exc
    return target / _MODEL_FILE, report


def export_onnx(model: Any, path: Path) -> None:
    """Export the ``SentenceTransformer``'s transformer (token embeddings out) to ONNX, fp32.

    The export traces a copy with eager attention (plain MatMul + Softmax), so the loaded model
    keeps its own attention implementation.
    """
    import copy

    import torch

    transformer = model[0]
    auto = getattr(transformer, "auto_model", None) or getattr(transformer, "model", None)
    if auto is None or not hasattr(model, "preprocess"):
        raise ModelLoadError(
            f"int8 export needs a SentenceTransformer whose first module wraps a transformers model (got "
            f"{type(transformer).__name__}); use quantize=None for this model."
        )
    auto = copy.deepcopy(auto).float().eval()
    if hasattr(auto, "set_attn_implementation"):
        auto.set_attn_implementation("eager")
    features = model.preprocess(["a short text", "a longer text, so that the trace sees padding and a mask"])
    names = [n for n in _INPUTS if isinstance(features.get(n), torch.Tensor)]

    class TokenEmbeddings(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.auto = auto

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.auto(**dict(zip(names, tensors))).last_hidden_state

    axes = {n: {0: "batch", 1: "sequence"} for n in [*names, "token_embeddings"]}
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about shapes the graph keeps dynamic
        torch.onnx.export(
            TokenEmbeddings().eval(),
            tuple(features[n].cpu() for n in names),
            str(path),
            input_names=names,
            output_names=["token_embeddings"],
            dynamic_axes=axes,
            opset_version=17,
            do_constant_folding=True,
            dynamo=False,
        )


def channel_maxima(path: Path, model: Any, texts: Sequence[str]) -> dict[str, np.ndarray]:
    """Per-channel max |activation| of every constant-weight MatMul's input, over ``texts``."""
    import onnx

    ort = _onnxruntime()
    graph_model = onnx.load(str(path))
    weights = {init.name for init in graph_model.graph.initializer}
    matmuls = [n for n in graph_model.graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    names = list(dict.fromkeys(n.input[0] for n in matmuls))
    known = {o.name for o in graph_model.graph.output}
    for name in names:
        if name not in known:
            graph_model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(graph_model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = [i.name for i in session.get_inputs()]
    maxima: dict[str, np.ndarray] = {}
    for start in range(0, len(texts), _GUARD_BATCH):
        features = model.preprocess(list(texts[start : start + _GUARD_BATCH]))
        mask = features["attention_mask"].numpy().astype(bool).reshape(-1)
        outputs = session.run(names, {n: features[n].numpy() for n in inputs})
        for name, value in zip(names, outputs):
            rows = value.reshape(-1, value.shape[-1])[mask]  # padding tokens do not count
            peak = np.abs(rows).max(axis=0)
            maxima[name] = np.maximum(maxima[name], peak) if name in maxima else peak
    return maxima


def calibration_texts() -> list[str]:
    """The built-in calibration corpus: other products, questions and chat than the guard's."""
    from gpuprompt.demo import catalogue, customer_questions

    return [item["text"] for item in catalogue(160, seed=3)] + customer_questions(96, seed=5)


def quantize_onnx(src: Path, dst: Path, *, maxima: dict[str, np.ndarray] | None = None, alpha: float = 0.5) -> int:
    """Rewrite every constant-weight ``MatMul`` of ``src`` to per-token x per-channel int8.

    ``y = x @ W`` becomes ``step = max|x| / 127 per token row; q = QuantizeLinear(x, step, 128)
    (per row); y = MatMulIntegerToFloat(q, Wq, 1, w_scale, 128) * step``: symmetric int8 activations per token
    (one scale per row, so a text never depends on its batch-mates), symmetric int8 weights per
    output channel. The MatMuls that read the same tensor (Q, K, V) share one quantised input.

    With ``maxima`` (:func:`channel_maxima`), activations are smoothed first (SmoothQuant): input
    channel j is divided by ``s_j = max|x_j|**alpha / max|W_j|**(1 - alpha)`` and weight row j
    multiplied by it, which is exact in real arithmetic and moves outlier channels' range from the
    activations (one scale per token) to the weights (one scale per output channel).

    Returns:
        How many MatMuls were rewritten.
    """
    import onnx
    from onnx import helper, numpy_helper

    graph_model = onnx.load(str(src))
    graph = graph_model.graph
    weights = {init.name: init for init in graph.initializer}
    extra = [
        numpy_helper.from_array(np.array(1e-6, np.float32), "q8_eps"),
        numpy_helper.from_array(np.array(1 / 127, np.float32), "q8_step"),
        numpy_helper.from_array(np.array(1.0, np.float32), "q8_one"),
        numpy_helper.from_array(np.array(128, np.uint8), "q8_zero"),
        numpy_helper.from_array(np.array([1], np.int64), "q8_axis1"),
        numpy_helper.from_array(np.array([1], np.int64), "q8_vector"),  # the shape of a 1-element vector
    ]
    # Every activation here is (batch, sequence, width), like the token ids: their shape gives the
    # leading dims and the token-row count once, shared by every quantised MatMul.
    ids = graph.input[0].name
    nodes: list[Any] = [
        helper.make_node("Shape", [ids], ["q8_lead"], name="q8_Lead"),
        helper.make_node("Size", [ids], ["q8_tokens"], name="q8_Tokens"),
        helper.make_node("Reshape", ["q8_tokens", "q8_vector"], ["q8_rows"], name="q8_Rows"),
        helper.make_node("Expand", ["q8_zero", "q8_rows"], ["q8_row_zero"], name="q8_RowZero"),
    ]
    shapes: set[int] = set()
    quantised: dict[str, str] = {}
    smoothing: dict[str, np.ndarray] = {}
    count = 0
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in weights:
            nodes.append(node)
            continue
        x = node.input[0]
        w = numpy_helper.to_array(weights[node.input[1]]).astype(np.float32)  # (in, out)
        if x not in quantised:
            p = quantised[x] = f"q8_in{len(quantised)}_"
            source = x
            width = w.shape[0]
            extra.append(numpy_helper.from_array(np.array([-1, width], np.int64), p + "rows_shape"))
            if maxima is not None:
                # One smoothing per input tensor, from the first weight that reads it (Q, K and V
                # read one tensor: their rows are scaled alike).
                smooth = _smoothing(maxima[x], w, alpha)
                smoothing[x] = smooth
                extra.append(numpy_helper.from_array((1 / smooth).astype(np.float32), p + "smooth"))
                nodes.append(helper.make_node("Mul", [x, p + "smooth"], [p + "smoothed"], name=p + "Smooth"))
                source = p + "smoothed"
            # Rows of (tokens, width); a per-axis QuantizeLinear over axis 0 scales each token row by
            # its own step (max|row| / 127) in one pass.
            nodes += [
                helper.make_node("Reshape", [source, p + "rows_shape"], [p + "rows"], name=p + "Rows"),
                helper.make_node("Abs", [p + "rows"], [p + "abs"], name=p + "Abs"),
                helper.make_node("ReduceMax", [p + "abs"], [p + "max"], name=p + "ReduceMax", axes=[1], keepdims=0),
                helper.make_node("Max", [p + "max", "q8_eps"], [p + "r"], name=p + "Max"),
                helper.make_node("Mul", [p + "r", "q8_step"], [p + "row_step"], name=p + "RowStep"),
                helper.make_node("QuantizeLinear", [p + "rows", p + "row_step", "q8_row_zero"], [p + "q"],
                                 name=p + "Quantize", axis=0),
                helper.make_node("Unsqueeze", [p + "row_step", "q8_axis1"], [p + "step_col"], name=p + "StepColumn"),
            ]
        p, q = quantised[x], f"q8_mm{count}_"
        count += 1
        if x in smoothing:
            w = w * smoothing[x][:, None]
        scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / 127
        extra += [
            numpy_helper.from_array(np.clip(np.round(w / scale), -127, 127).astype(np.int8), q + "w"),
            numpy_helper.from_array(scale.astype(np.float32), q + "scale"),
        ]
        out_width = int(w.shape[1])
        if out_width not in shapes:  # (batch, sequence, width) for each output width, built once
            shapes.add(out_width)
            extra.append(numpy_helper.from_array(np.array([out_width], np.int64), f"q8_width{out_width}"))
            nodes.append(helper.make_node("Concat", ["q8_lead", f"q8_width{out_width}"], [f"q8_shape{out_width}"],
                                          name=f"q8_Shape{out_width}", axis=0))
        # onnxruntime's MatMulIntegerToFloat applies the scalar activation step and the per-column
        # weight scales in the GEMM's output stage (a separate Cast + Mul measured ~20% of the
        # forward); the per-row scale, which it cannot take, is one Mul after it.
        nodes += [
            helper.make_node(
                "MatMulIntegerToFloat",
                [p + "q", q + "w", "q8_one", q + "scale", "q8_zero"],
                [q + "col"],
                name=q + "MatMulIntegerToFloat",
                domain="com.microsoft",
            ),
            helper.make_node("Mul", [q + "col", p + "step_col"], [q + "rows"], name=q + "RowScale"),
            helper.make_node("Reshape", [q + "rows", f"q8_shape{out_width}"], [node.output[0]], name=q + "Unrows"),
        ]
    if count == 0:
        raise ModelLoadError(f"{src} has no MatMul with a constant weight: nothing to quantise.")
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(extra)
    if not any(opset.domain == "com.microsoft" for opset in graph_model.opset_import):
        graph_model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    used = {name for node in graph.node for name in node.input}
    kept = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    onnx.save(graph_model, str(dst))
    return count


def _smoothing(activation_max: np.ndarray, w: np.ndarray, alpha: float) -> np.ndarray:
    weight_max = np.abs(w).max(axis=1)
    smooth = np.maximum(activation_max, 1e-5) ** alpha / np.maximum(weight_max, 1e-5) ** (1 - alpha)
    return np.clip(smooth, 1e-4, 1e4).astype(np.float32)


# ------------------------------------------------------------------------------------------- guard
def guard_corpus(products: int = 2000, queries: int = _GUARD_QUERIES) -> tuple[list[str], list[str], list[list[int]]]:
    """The guard's fixed corpus: catalogue texts, labelled queries and each query's relevant products.

    The catalogue is the demo's synthetic one (:func:`gpuprompt.demo.catalogue`). Queries are
    generated from products' attributes (type, colour, material, price); a product is relevant when
    it has every attribute the query names.

    Returns:
        ``(product_texts, query_texts, relevant)``, ``relevant[i]`` the product indices for query i.
    """
    from gpuprompt.demo import catalogue

    items = catalogue(products)
    rng = random.Random(16)
    query_texts: list[str] = []
    relevant: list[list[int]] = []
    templates: list[tuple[str, Callable[[dict[str, Any], dict[str, Any]], bool]]] = [
        ("Do you have a {colour} {type} in {material}?",
         lambda m, p: m["type"] == p["type"] and m["colour"] == p["colour"] and m["material"] == p["material"]),
        ("How much does the {colour} {type} cost?",
         lambda m, p: m["type"] == p["type"] and m["colour"] == p["colour"]),
        ("Is there a {material} {type} under 100 EUR?",
         lambda m, p: m["type"] == p["type"] and m["material"] == p["material"] and m["price"] < 100),
        ("I need a {type} made of {material}.",
         lambda m, p: m["type"] == p["type"] and m["material"] == p["material"]),
    ]
    while len(query_texts) < queries:
        pick = rng.choice(items)["metadata"]
        template, matches = rng.choice(templates)
        hits = [i for i, item in enumerate(items) if matches(item["metadata"], pick)]
        if hits:
            query_texts.append(template.format(**pick))
            relevant.append(hits)
    return [item["text"] for item in items], query_texts, relevant


def measure(model: Any, path: Path, *, products: int = 2000, queries: int = _GUARD_QUERIES) -> QualityReport:
    """Compare the int8 model at ``path`` with ``model`` (fp32) on :func:`guard_corpus`."""
    import torch

    ort = _onnxruntime()
    texts, questions, relevant = guard_corpus(products, queries)
    corpus = texts + questions + list(EDGE_TEXTS)
    int8 = Int8Forward(path, model)
    try:
        with torch.inference_mode():
            fp_vectors = _encode(lambda f: model(f)["sentence_embedding"], model, corpus)
            q8_vectors = _encode(int8, model, corpus)
    finally:
        int8.close()
    cosines = np.sum(fp_vectors * q8_vectors, axis=1)
    n = len(texts)
    m = n + len(questions)
    fp_recall, fp_top = recall_at_10(fp_vectors[n:m], fp_vectors[:n], relevant)
    q8_recall, q8_top = recall_at_10(q8_vectors[n:m], q8_vectors[:n], relevant)
    overlap = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(fp_top, q8_top)]))
    return QualityReport(
        cosine_mean=float(cosines.mean()),
        cosine_min=float(cosines.min()),
        recall_at_10=q8_recall / fp_recall if fp_recall > 0 else 0.0,
        fp32_recall_at_10=fp_recall,
        int8_recall_at_10=q8_recall,
        overlap_at_10=overlap,
        texts=len(cosines),
        queries=len(questions),
        products=n,
        recipe=RECIPE,
        onnxruntime=ort.__version__,
    )


def _encode(forward: Callable[[dict[str, Any]], Any], model: Any, texts: Sequence[str]) -> np.ndarray:
    """Normalised embeddings of ``texts`` (length-sorted batches of 64, original order kept)."""
    import torch

    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    rows: list[np.ndarray] = []
    for start in range(0, len(order), _GUARD_BATCH):
        batch = [texts[i] for i in order[start : start + _GUARD_BATCH]]
        vectors = forward(model.preprocess(batch))
        rows.append(torch.nn.functional.normalize(vectors.float(), p=2, dim=1).numpy())
    stacked = np.concatenate(rows)
    out = np.empty_like(stacked)
    out[order] = stacked
    return out


def recall_at_10(queries: np.ndarray, corpus: np.ndarray, relevant: list[list[int]]) -> tuple[float, np.ndarray]:
    """Labelled recall@10 (relevant in the top 10 / min(relevant, 10), averaged) and the top-10 rows."""
    scores = queries @ corpus.T
    top = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    recall = [len(set(top[i].tolist()) & set(rel)) / min(len(rel), 10) for i, rel in enumerate(relevant)]
    return float(np.mean(recall)), top


# ----------------------------------------------------------------------------------------- helpers
def _onnxruntime() -> Any:
    try:
        import onnx  # noqa: F401 - the rewrite needs it; checked here so the hint names both
        import onnxruntime
    except ImportError as exc:
        raise DependencyError(f"quantize='int8' needs onnxruntime and onnx: {INSTALL_HINT}") from exc
    return onnxruntime


def _fingerprint(model_path: str) -> str:
    """A short digest of a model folder: every file's name and size, and the weights' first MiB."""
    path = Path(model_path)
    digest = hashlib.sha256(RECIPE.encode())
    if not path.is_dir():  # a hub id: its name is all we know
        digest.update(model_path.encode())
        return digest.hexdigest()[:12]
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path)}:{file.stat().st_size}\n".encode())
        if file.suffix in (".safetensors", ".bin"):
            with file.open("rb") as handle:
                digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:12]


def _read_report(folder: Path) -> QualityReport | None:
    if not (folder / _COMPLETE_MARK).is_file() or not (folder / _MODEL_FILE).is_file():
        return None
    try:
        data = json.loads((folder / _REPORT_FILE).read_text())
        return QualityReport(**data)
    except (OSError, ValueError, TypeError):
        return None  # unreadable or of another layout: rebuilt


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
