"""ONNX on CPU, shared by the onnxruntime backends of the embedder and the reranker (int8 and fp32).

A transformer exported to ONNX is rewritten so that every ``MatMul`` with a constant weight runs as
onnxruntime's ``MatMulIntegerToFloat`` with per-output-channel int8 weights and per-token int8
activations, after SmoothQuant moves outlier channels from the activations into the weights
(:func:`quantize_onnx`; the measurements behind the recipe are in :mod:`gpuprompt.embed._int8`).
Each model is built once into the models cache (:func:`build_once`) and run by one-thread
sessions (:func:`session`). ``backend="onnx"`` runs the plain fp32 export the same way
(:func:`build_fp32`), checked against torch when it is built.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from gpuprompt.errors import DependencyError, ModelLoadError

logger = logging.getLogger(__name__)

__all__ = [
    "COMPLETE_MARK",
    "INSTALL_HINT",
    "FP32_RECIPE",
    "build_fp32",
    "build_once",
    "channel_maxima",
    "fingerprint",
    "onnxruntime",
    "quantize_onnx",
    "row_slices",
    "session",
    "weight_format",
    "write_json_atomic",
]

INSTALL_HINT = "pip install 'gpuprompt[quant]' (onnxruntime and onnx)"

COMPLETE_MARK = ".gpuprompt-complete"
"""The file that marks a built folder as complete (written last, before the rename into place)."""


def onnxruntime() -> Any:
    """The onnxruntime module (onnx checked too: the rewrite needs it), or a DependencyError naming both."""
    try:
        import onnx  # noqa: F401 - the rewrite needs it; checked here so the hint names both
        import onnxruntime as ort
    except ImportError as exc:
        raise DependencyError(f"quantize='int8' needs onnxruntime and onnx: {INSTALL_HINT}") from exc
    return ort


_WEIGHT_FORMAT: str | None = None
_FORMAT_LOCK = threading.Lock()


def weight_format() -> str:
    """``"s8"`` where onnxruntime multiplies uint8 activations by int8 weights exactly, else ``"u8"``.

    On x86 CPUs without VNNI (AVX2 only, for example AMD EPYC before Zen 4), onnxruntime's u8 x s8
    kernel adds pairs of products into 16-bit lanes (``vpmaddubsw``), which saturate for full-range
    operands: measured on such a CPU, a 256 x 384 x 1536 product was off by 22% at its worst and the
    int8 embedder's top-10 agreement with fp32 fell from 0.963 to 0.920. The u8 x u8 kernel widens
    to 16 bits first and is exact (about 1.3x slower per GEMM there). Where VNNI or AMX does the u8 x
    s8 product (``vpdpbusd``), or on ARM, s8 weights are exact and faster. The answer comes from
    running the kernel itself on full-range operands, once per process, not from a list of CPU flags.
    """
    global _WEIGHT_FORMAT
    with _FORMAT_LOCK:
        if _WEIGHT_FORMAT is None:
            _WEIGHT_FORMAT = "s8" if _u8s8_is_exact() else "u8"
        return _WEIGHT_FORMAT


def _u8s8_is_exact() -> bool:
    from onnx import TensorProto, helper, numpy_helper

    rows, depth, cols = 16, 256, 64
    rng = np.random.default_rng(0)
    a = np.full((rows, depth), 255, np.uint8)  # the worst case: every pair of products at the top
    a[1::2] = rng.integers(0, 256, size=(rows // 2, depth), dtype=np.uint8)
    b = np.full((depth, cols), 127, np.int8)
    b[:, 1::2] = rng.integers(-127, 128, size=(depth, cols // 2), dtype=np.int8)
    node = helper.make_node("MatMulIntegerToFloat", ["a", "b", "one", "one", "zero"], ["y"], domain="com.microsoft")
    graph = helper.make_graph(
        [node], "probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, depth])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, cols])],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(1.0, np.float32), "one"),
         numpy_helper.from_array(np.array(128, np.uint8), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    got = session(model.SerializeToString()).run(["y"], {"a": a})[0]
    exact = (a.astype(np.int64) - 128) @ b.astype(np.int64)
    return bool(np.array_equal(got, exact.astype(np.float32)))


def session(path: Path | str | bytes, *, threads: int = 1) -> Any:
    """An onnxruntime CPU session of ``threads`` intra-op threads whose idle threads never spin.

    Idle pool threads must not spin between batches: they would take the cores from the tokenizer
    and from callers' threads (2 cores here).
    """
    ort = onnxruntime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = path if isinstance(path, bytes) else str(path)
    try:
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelLoadError(f"onnxruntime could not load {path if not isinstance(path, bytes) else 'the graph'}: "
                             f"{exc}; delete the folder to rebuild it.") from exc


class SlicedSession:
    """A one-thread onnxruntime session whose batches run as row slices on a few long-lived threads.

    Threads that only call onnxruntime run no torch op, so they start no OpenMP team of their own.
    Subclasses cut a batch with :func:`row_slices` and run the parts through :meth:`map_slices`.

    Args:
        path: the int8 ONNX file.
        threads: slices run at once (default: torch's thread count).
        name: the slice threads' name prefix.
    """

    def __init__(self, path: Path, *, threads: int | None = None, name: str = "gpuprompt-int8") -> None:
        import torch

        self._threads = max(1, threads or torch.get_num_threads())
        self._session = session(path, threads=1)
        self._inputs = [i.name for i in self._session.get_inputs()]
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._name = name
        self.path = path

    def map_slices(self, run: Callable[[tuple[int, int, int]], Any], slices: list[tuple[int, int, int]]) -> list[Any]:
        """``run`` over every slice, on the calling thread when there is one slice, else on the pool."""
        if len(slices) == 1:
            return [run(slices[0])]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix=self._name)
            pool = self._pool
        return list(pool.map(run, slices))

    def close(self) -> None:
        """Release the session and the slice threads."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        self._session = None


def row_slices(lengths: list[int], parts: int, *, width: int, right_padded: bool = True) -> list[tuple[int, int, int]]:
    """``(start, stop, length)`` slices of a padded batch's rows, ``parts`` of about equal token
    count, each cut to its own longest row when padding is on the right (less padding).

    A batch's slices run as one-thread sessions on cores of their own: the int8 graphs have
    hundreds of small nodes, and splitting each over two cores gained little (measured on an idle
    2-core machine: 32 short questions took 24 ms on two intra-op threads and 12.5 ms as two
    one-thread halves). Per-token scales make every row independent, so a split never changes a row.
    """
    import itertools

    rows = len(lengths)
    parts = max(1, min(parts, rows))
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
        length = max(lengths[start:stop]) if right_padded else width
        out.append((start, stop, max(1, int(length))))
    return out


def channel_maxima(path: Path, batches: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-channel max |activation| of every constant-weight MatMul's input, over ``batches``.

    Args:
        path: the fp32 ONNX graph.
        batches: feature dicts (numpy arrays by input name, ``attention_mask`` among them), as the
            model's own tokenizer makes them; padding tokens do not count.
    """
    import onnx

    ort = onnxruntime()
    graph_model = onnx.load(str(path))
    weights = {init.name for init in graph_model.graph.initializer}
    matmuls = [n for n in graph_model.graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    names = list(dict.fromkeys(n.input[0] for n in matmuls))
    known = {o.name for o in graph_model.graph.output}
    for name in names:
        if name not in known:
            graph_model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    runner = ort.InferenceSession(graph_model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = [i.name for i in runner.get_inputs()]
    maxima: dict[str, np.ndarray] = {}
    for features in batches:
        mask = np.asarray(features["attention_mask"]).astype(bool).reshape(-1)
        outputs = runner.run(names, {n: np.asarray(features[n]) for n in inputs})
        for name, value in zip(names, outputs):
            rows = value.reshape(-1, value.shape[-1])[mask]  # padding tokens do not count
            peak = np.abs(rows).max(axis=0)
            maxima[name] = np.maximum(maxima[name], peak) if name in maxima else peak
    return maxima


def quantize_onnx(src: Path, dst: Path, *, maxima: dict[str, np.ndarray] | None = None, alpha: float = 0.5,
                  keep: Callable[[str], bool] | None = None, weight_dtype: str = "s8") -> int:
    """Rewrite every constant-weight ``MatMul`` of ``src`` to per-token x per-channel int8.

    ``y = x @ W`` becomes ``step = max|x| / 127 per token row; q = QuantizeLinear(x, step, 128)
    (per row); y = MatMulIntegerToFloat(q, Wq, 1, w_scale, 128) * step``: symmetric int8 activations per token
    (one scale per row, so a text never depends on its batch-mates), symmetric int8 weights per
    output channel. The MatMuls that read the same tensor (Q, K, V) share one quantised input.

    With ``maxima`` (:func:`channel_maxima`), activations are smoothed first (SmoothQuant): input
    channel j is divided by ``s_j = max|x_j|**alpha / max|W_j|**(1 - alpha)`` and weight row j
    multiplied by it, which is exact in real arithmetic and moves outlier channels' range from the
    activations (one scale per token) to the weights (one scale per output channel).

    Args:
        keep: MatMul node names for which it returns True stay in fp32 (layers that move the
            output most, kept in higher precision).
        weight_dtype: ``"s8"`` (int8 weights) or ``"u8"`` (the same values + 128 as uint8, zero point
            128: the same arithmetic, for CPUs whose u8 x s8 kernel saturates; see
            :func:`weight_format`).

    Returns:
        How many MatMuls were rewritten.
    """
    import onnx
    from onnx import helper, numpy_helper

    if weight_dtype not in ("s8", "u8"):
        raise ValueError(f"weight_dtype must be 's8' or 'u8', not {weight_dtype!r}")
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
        if node.op_type != "MatMul" or node.input[1] not in weights or (keep is not None and keep(node.name)):
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
        levels = np.clip(np.round(w / scale), -127, 127)
        stored = (levels + 128).astype(np.uint8) if weight_dtype == "u8" else levels.astype(np.int8)
        extra += [
            numpy_helper.from_array(stored, q + "w"),
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
                [p + "q", q + "w", "q8_one", q + "scale", "q8_zero"] + (["q8_zero"] if weight_dtype == "u8" else []),
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


def fingerprint(model_path: str, recipe: str) -> str:
    """A short digest of a model's files and a recipe: every file's name and whole content, so a model
    saved again in place (a fine-tune of the same shapes) gets a new build, and a copy of the same
    files shares it. A hub id stands for its snapshot in the local Hugging Face cache, else its name.
    Reading the files costs about a second per GB."""
    path = Path(model_path)
    digest = hashlib.sha256(recipe.encode())
    if not path.is_dir():
        path = _hub_snapshot(model_path) or path
    if not path.is_dir():  # a hub id that is not in the local cache: its name is all we know
        digest.update(model_path.encode())
        return digest.hexdigest()[:12]
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path)}:{_file_digest(file)}\n".encode())
    return digest.hexdigest()[:12]


def _hub_snapshot(model_id: str) -> Path | None:
    """The local snapshot folder of a hub id (no network), or None."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not a hub id, not cached, or no huggingface_hub: use the name
        return None


def build_once(target: Path, build: Callable[[Path], None], *, ready: Callable[[Path], bool], what: str) -> None:
    """Build ``target`` once across processes: the first to arrive builds under a file lock while
    others wait; the folder is written under a temporary name and renamed when complete (with
    :data:`COMPLETE_MARK`), so a crash never leaves a half folder that looks finished.

    Args:
        target: the folder to build.
        build: fills a fresh temporary folder.
        ready: whether a folder holds a usable build (checked again under the lock).
        what: names the model in messages.

    Raises:
        DependencyError, ModelLoadError: from ``build``; any other failure as ModelLoadError.
    """
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock", timeout=1800):
        if ready(target):
            return
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name[:40]}-", dir=target.parent))
        try:
            build(tmp)
            (tmp / COMPLETE_MARK).write_text(target.name + "\n")
            if target.exists():  # a leftover without the mark (an interrupted older build)
                shutil.rmtree(target)
            os.replace(tmp, target)
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, (DependencyError, ModelLoadError)):
                raise
            raise ModelLoadError(f"building the ONNX model of {what} failed: {exc}") from exc


FP32_RECIPE = "onnx-fp32-v1"
"""Names the fp32 export + check recipe; a new recipe builds a new cache folder."""

FP32_MODEL_FILE = "model.onnx"
FP32_TOLERANCE = 1e-4
"""Most difference of the export's outputs from torch's, relative to their largest magnitude (at
least 1): measured 3e-7 on MiniLM's sentence embeddings, 2e-6 on a cross-encoder's logits, 1e-7 on
XLM-R, MPNet, DistilBERT and DeBERTa-v2 architectures."""


def build_fp32(model_path: str, model_id: str, kind: str, *, export: Callable[[Path], None],
               check: Callable[[Path], tuple[np.ndarray, np.ndarray]], root: Path | None = None) -> Path:
    """The fp32 ONNX export of a model, built once into the models cache and checked against torch.

    Args:
        model_path: the model's folder (fingerprinted for the cache name).
        model_id: its name, for the folder name and messages.
        kind: ``"embed"`` or ``"rerank"`` (a model can be both, exported differently).
        export: writes the ONNX graph to the given path.
        check: ``(torch outputs, onnx outputs)`` of a few real inputs for the graph at the given path.
        root: where models go (default ``cache_dir() / "models"``).

    Raises:
        DependencyError: onnxruntime or onnx is missing.
        ModelLoadError: the export failed, or its outputs differ from torch's by more than
            :data:`FP32_TOLERANCE` (the message gives the figure).
    """
    ort = onnxruntime()
    from gpuprompt.models import cache_dir

    root = root or cache_dir() / "models"
    name = model_id.rstrip("/").rsplit("/", 1)[-1] or "model"
    target = root / f"{name}-{kind}-{FP32_RECIPE}-{fingerprint(model_path, FP32_RECIPE + kind)}"

    def build(tmp: Path) -> None:
        export(tmp / FP32_MODEL_FILE)
        reference, outputs = check(tmp / FP32_MODEL_FILE)
        reference, outputs = np.asarray(reference, dtype=np.float64), np.asarray(outputs, dtype=np.float64)
        scale = max(1.0, float(np.abs(reference).max(initial=0.0)))
        diff = float(np.abs(reference - outputs).max(initial=0.0)) / scale if reference.shape == outputs.shape \
            else float("inf")
        if not diff <= FP32_TOLERANCE:
            raise ModelLoadError(
                f"the ONNX export of {model_id!r} does not compute what torch computes (relative difference {diff:.3g} "
                f"> {FP32_TOLERANCE:g} on real inputs); use backend='torch' for this model."
            )
        write_json_atomic(tmp / "check.json", {"max_relative_difference": diff, "onnxruntime": ort.__version__,
                                               "model_sha256": _file_digest(tmp / FP32_MODEL_FILE)})

    def ready(folder: Path) -> bool:
        """A finished build whose graph is still the one that was checked (else it is built again)."""
        if not (folder / COMPLETE_MARK).is_file() or not (folder / FP32_MODEL_FILE).is_file():
            return False
        try:
            recorded = json.loads((folder / "check.json").read_text())["model_sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            recorded = None
        if recorded == _file_digest(folder / FP32_MODEL_FILE):
            return True
        logger.warning("the cached ONNX model in %s is not the one checked against torch; building it again", folder)
        return False

    build_once(target, build, ready=ready, what=repr(model_id))
    return target / FP32_MODEL_FILE


def _file_digest(path: Path) -> str:
    """The sha256 of a file's content (read in chunks, not whole into memory)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON beside ``path`` and rename it into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
