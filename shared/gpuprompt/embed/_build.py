"""Build the embedder's ONNX models once into the models cache, shared by every process: the int8
one (export, rewrite, guard) and the fp32 one of ``backend="onnx"`` (export, check against torch)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from gpuprompt._int8 import (
    COMPLETE_MARK,
    build_fp32,
    build_once,
    channel_maxima,
    fingerprint,
    onnxruntime,
    quantize_onnx,
    weight_format,
    write_json_atomic,
)
from gpuprompt.embed._guard import GUARD_QUERIES, QualityReport, measure
from gpuprompt.embed._int8 import RECIPE, OnnxForward, calibration_batches, calibration_texts, export_onnx

__all__ = ["build_int8", "build_onnx"]

logger = logging.getLogger(__name__)

_MODEL_FILE = "model.int8.onnx"
_REPORT_FILE = "quality.json"
_SMOOTHING_ALPHA = 0.5  # measured 0.35 / 0.5 / 0.6 / 0.7: 0.5 kept the most top-10 overlap with fp32


def build_int8(
    model: Any,
    model_path: str,
    model_id: str,
    *,
    root: Path | None = None,
    products: int = 2000,
    queries: int = GUARD_QUERIES,
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
    ort = onnxruntime()
    from gpuprompt.models import cache_dir

    root = root or cache_dir() / "models"
    name = model_id.rstrip("/").rsplit("/", 1)[-1] or "model"
    suffix = "" if (products, queries) == (2000, GUARD_QUERIES) else f"-g{products}x{queries}"
    weights = weight_format()  # u8 weights where this CPU's u8 x s8 kernel saturates
    recipe = RECIPE if weights == "s8" else f"{RECIPE}-u8"
    target = root / f"{name}-{recipe}-{fingerprint(model_path, recipe)}{suffix}"
    report = _read_report(target)
    if report is not None and report.onnxruntime == ort.__version__:
        return target / _MODEL_FILE, report
    if report is not None:  # built, but measured by another onnxruntime: measure again
        logger.info("re-measuring %s with onnxruntime %s (was %s)", target, ort.__version__, report.onnxruntime)
        report = measure(model, target / _MODEL_FILE, products=products, queries=queries)
        write_json_atomic(target / _REPORT_FILE, dataclasses.asdict(report))
        return target / _MODEL_FILE, report

    def build(tmp: Path) -> None:
        logger.info("building the int8 model of %s in %s (once: export, quantise, quality guard)", model_id, target)
        fp32 = tmp / "model.fp32.onnx"
        export_onnx(model, fp32)
        maxima = channel_maxima(fp32, calibration_batches(model, calibration_texts()))
        quantize_onnx(fp32, tmp / _MODEL_FILE, maxima=maxima, alpha=_SMOOTHING_ALPHA, weight_dtype=weights)
        fp32.unlink()
        built = measure(model, tmp / _MODEL_FILE, products=products, queries=queries)
        (tmp / _REPORT_FILE).write_text(json.dumps(dataclasses.asdict(built), indent=2) + "\n")

    build_once(target, build, ready=lambda folder: _read_report(folder) is not None, what=repr(model_id))
    report = _read_report(target)
    assert report is not None
    return target / _MODEL_FILE, report


def build_onnx(model: Any, model_path: str, model_id: str, *, root: Path | None = None) -> Path:
    """The fp32 ONNX export of ``model``'s transformer (``backend="onnx"``), built once and checked:
    the sentence embeddings of real texts through it must equal torch's (see
    :func:`gpuprompt._int8.build_fp32`).

    Raises:
        DependencyError: onnxruntime or onnx is missing.
        ModelLoadError: the export failed or does not compute what torch computes.
    """
    import torch

    def check(path: Path) -> tuple[Any, Any]:
        texts = calibration_texts()[::8] + ["?", "", "a"]
        with torch.inference_mode():
            reference = model(model.preprocess(texts))["sentence_embedding"].float().numpy()
        forward = OnnxForward(path, model, threads=1)
        try:
            with torch.inference_mode():
                return reference, forward(model.preprocess(texts)).float().numpy()
        finally:
            forward.close()

    return build_fp32(model_path, model_id, "embed", export=lambda path: export_onnx(model, path), check=check,
                      root=root)


def _read_report(folder: Path) -> QualityReport | None:
    if not (folder / COMPLETE_MARK).is_file() or not (folder / _MODEL_FILE).is_file():
        return None
    try:
        data = json.loads((folder / _REPORT_FILE).read_text())
        return QualityReport(**data)
    except (OSError, ValueError, TypeError):
        return None  # unreadable or of another layout: rebuilt
