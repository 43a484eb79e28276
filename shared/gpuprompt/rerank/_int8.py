"""The reranker's int8 backend on CPU: the cross-encoder exported to ONNX once, rewritten to int8 by the
kernel's recipe (:func:`gpuprompt._int8.quantize_onnx`: per-token activations, per-channel weights,
SmoothQuant calibrated on real prose), and a guard on ranking agreement with fp32.

A reranker's output is an order, not a vector: the guard ranks 20 real paragraphs (Python's own
language reference, which ships with every Python) for each of its 60 queries with both forward
passes and compares the top 3 and the top 1. Under the thresholds ``quantize="int8"`` refuses to
load (``QualityError`` naming the figures) and ``quantize="auto"`` keeps fp32.

Measured on the random-head MiniLM-L6 cross-encoder of the tests (:func:`gpuprompt.models.random_cross_encoder`;
2 cores): bf16 compute of the same model keeps 0.983 of fp32's top-3 and 0.967 of its top-1; this
recipe keeps 0.93 / 0.97 (mean score error 0.006) at 2.0x fp32's speed. On that model fp32's 3rd and
4th scores differ by a median 0.002, so any perturbation reorders them: keeping the FFN output
layers in fp32 (``keep=``) cut the error to 0.005 but the speed to 1.8x, and lifted top-3 to only
0.92. A trained cross-encoder separates relevant from irrelevant passages by whole logits; the
defaults (0.9 / 0.9) hold on the test model and leave room for noise among near-ties.

Fusing attention first (onnxruntime's transformer optimizer, ``MultiHeadAttention`` with the Q/K/V
MatMuls kept outside for this rewrite, ``SkipLayerNormalization`` and ``BiasGelu`` folding the bias
adds) was measured and not kept: the same rewrite on the fused graph ran 256 guard pairs in batches
of 32 in 8.5 s against 8.0 s unfused (one onnxruntime thread, best of 3, 2-core AVX512-VNNI EPYC),
with the same score error (0.080 vs 0.082 mean logit error against fp32).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuprompt._corpus import prose_paragraphs
from gpuprompt._int8 import (
    COMPLETE_MARK,
    SlicedSession,
    build_fp32,
    build_once,
    channel_maxima,
    fingerprint,
    onnxruntime,
    quantize_onnx,
    row_slices,
    weight_format,
)
from gpuprompt.errors import ModelLoadError, QualityError

__all__ = ["RECIPE", "OnnxScorer", "RankingReport", "build_int8", "build_onnx", "guard_error", "guard_set", "measure"]

logger = logging.getLogger(__name__)

RECIPE = "rerank-int8-sq-pertoken-v1"
"""Names the export + rewrite + guard recipe; a new recipe builds a new cache folder."""

_MODEL_FILE = "model.int8.onnx"
_REPORT_FILE = "quality.json"
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_GUARD_QUERIES = 60
_GUARD_DOCUMENTS = 20
_BATCH = 32
_SMOOTHING_ALPHA = 0.7  # measured 0.35 / 0.5 / 0.7 on the guard set: 0.7 kept the most top-3 agreement


@dataclass(frozen=True)
class RankingReport:
    """What the guard measured for one int8 reranker (cached next to it, so it is measured once).

    Attributes:
        top3_agreement: mean share of fp32's top-3 documents that int8 also ranks in its top 3.
        top1_agreement: share of queries whose best document both pick.
        score_error: mean absolute difference of the scores (after the activation).
        queries: queries of the guard.
        documents: documents ranked per query.
        recipe: :data:`RECIPE`.
        onnxruntime: the onnxruntime version that measured it.
    """

    top3_agreement: float
    top1_agreement: float
    score_error: float
    queries: int
    documents: int
    recipe: str
    onnxruntime: str

    def failures(self, thresholds: Any) -> list[str]:
        """The figures under ``thresholds``, each as ``"name X < floor Y"`` (empty: it passes)."""
        out = []
        for name in ("top3_agreement", "top1_agreement"):
            value, floor = getattr(self, name), getattr(thresholds, name)
            if value < floor:
                out.append(f"{name} {value:.4f} < {floor:g}")
        return out

    def summary(self) -> str:
        """The figures in one line."""
        return (f"top-3 agreement with fp32 {self.top3_agreement:.4f}, top-1 {self.top1_agreement:.4f}, mean score "
                f"error {self.score_error:.5f} ({self.queries} queries x {self.documents} documents of real prose)")


def guard_error(report: RankingReport, thresholds: Any, model_id: str) -> QualityError | None:
    """The error to raise when ``report`` is under ``thresholds``, else None."""
    failed = report.failures(thresholds)
    if not failed:
        return None
    return QualityError(
        f"the int8 reranker of {model_id!r} fell under its ranking guard: {'; '.join(failed)} ({report.summary()}). "
        "Use quantize=None (fp32), quantize='auto' (int8 only when it passes), or lower "
        "RerankerConfig.quantize_guard if these figures are acceptable to you.",
        report=report,
        failed=failed,
    )


# ---------------------------------------------------------------------------------------- runtime
class OnnxScorer(SlicedSession):
    """The onnxruntime forward pass (the int8 graph, or the fp32 one of ``backend="onnx"``): padded
    features in, logits out, a batch run as one-thread slices.

    Args:
        path: the ONNX file (logits out, as :func:`export_onnx` writes it).
        threads: slices run at once (default: torch's thread count).
        name: the slice threads' name prefix.
    """

    def __init__(self, path: Path, *, threads: int | None = None, name: str = "gpuprompt-rerank-int8") -> None:
        super().__init__(path, threads=threads, name=name)

    def __call__(self, features: dict[str, Any]) -> Any:
        """``features`` (right-padded tensors) -> a ``(batch, labels)`` float32 tensor of logits."""
        import torch

        arrays = {name: np.asarray(value) for name, value in features.items()}
        mask = arrays["attention_mask"]
        slices = row_slices(mask.sum(axis=1).tolist(), self._threads, width=int(mask.shape[1]))
        parts = self.map_slices(lambda part: self._run(arrays, part), slices)
        return torch.from_numpy(parts[0] if len(parts) == 1 else np.concatenate(parts))

    def _run(self, arrays: dict[str, np.ndarray], part: tuple[int, int, int]) -> np.ndarray:
        start, stop, length = part
        feed = {name: arrays[name][start:stop, :length].astype(np.int64) for name in self._inputs}
        return self._session.run(["logits"], feed)[0]


# ---------------------------------------------------------------------------------------- export
def export_onnx(model: Any, tokenizer: Any, path: Path) -> None:
    """Export the sequence-classification model (logits out) to ONNX, fp32, with eager attention."""
    import copy

    import torch

    traced = copy.deepcopy(model).float().to("cpu").eval()
    if hasattr(traced, "set_attn_implementation"):
        traced.set_attn_implementation("eager")
    sample = tokenizer(["a short query", "a longer query, so the trace sees padding"],
                       ["a document", "another document with more words in it"], padding=True, return_tensors="pt")
    names = [n for n in _INPUTS if n in sample]

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = traced

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.model(**dict(zip(names, tensors))).logits

    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes["logits"] = {0: "batch"}
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Logits().eval(), tuple(sample[n] for n in names), str(path), input_names=names,
                          output_names=["logits"], dynamic_axes=axes, opset_version=17, do_constant_folding=True,
                          dynamo=False)


# ---------------------------------------------------------------------------------------- guard
def guard_set(queries: int = _GUARD_QUERIES, documents: int = _GUARD_DOCUMENTS) -> list[tuple[str, list[str]]]:
    """The guard's fixed queries, each with its ``documents`` paragraphs: a paragraph's first
    sentence as the query, that paragraph among others of real prose as the candidates."""
    paragraphs = prose_paragraphs()
    rng = random.Random(23)
    out = []
    for source in rng.sample(range(len(paragraphs)), queries):
        others = rng.sample([i for i in range(len(paragraphs)) if i != source], documents - 1)
        candidates = [paragraphs[i] for i in [source, *others]]
        rng.shuffle(candidates)
        query = paragraphs[source].split(". ")[0][:200]
        out.append((query, candidates))
    return out


def _features(tokenizer: Any, pairs: Sequence[tuple[str, str]], max_length: int) -> dict[str, np.ndarray]:
    encoded = tokenizer([q for q, _ in pairs], [d for _, d in pairs], truncation="longest_first",
                        max_length=max_length, padding=True, return_tensors="np")
    return {name: np.asarray(encoded[name]) for name in _INPUTS if name in encoded}


def _pairs_batches(tokenizer: Any, pairs: list[tuple[str, str]], max_length: int) -> Iterator[dict[str, np.ndarray]]:
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
    for start in range(0, len(order), _BATCH):
        yield _features(tokenizer, [pairs[i] for i in order[start:start + _BATCH]], max_length)


def _scores(run: Any, tokenizer: Any, pairs: list[tuple[str, str]], max_length: int, activation: str) -> np.ndarray:
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
    out = np.empty(len(pairs), dtype=np.float32)
    for start in range(0, len(order), _BATCH):
        rows = order[start:start + _BATCH]
        logits = np.asarray(run(_features(tokenizer, [pairs[i] for i in rows], max_length)), dtype=np.float32)
        scores = logits[:, 0] if logits.ndim > 1 else logits
        out[rows] = 1 / (1 + np.exp(-scores)) if activation == "sigmoid" else scores
    return out


def _torch_logits(model: Any) -> Any:
    """``features -> logits`` through ``model`` in fp32 on CPU (the reference of the guard and the check)."""
    import torch

    reference = model.float().to("cpu").eval()

    def fp32(features: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            return reference(**{k: torch.from_numpy(v) for k, v in features.items()}).logits.numpy()

    return fp32


def measure(model: Any, tokenizer: Any, path: Path, activation: str, max_length: int) -> RankingReport:
    """Rank the guard set with fp32 ``model`` and the int8 model at ``path``; compare the orders."""
    ort = onnxruntime()
    cases = guard_set()
    pairs = [(query, document) for query, documents in cases for document in documents]
    fp32 = _torch_logits(model)
    int8 = OnnxScorer(path)
    try:
        fp = _scores(fp32, tokenizer, pairs, max_length, activation)
        q8 = _scores(lambda f: int8(f).numpy(), tokenizer, pairs, max_length, activation)
    finally:
        int8.close()
    top3, top1, n = [], [], _GUARD_DOCUMENTS
    for case in range(len(cases)):
        a, b = fp[case * n:(case + 1) * n], q8[case * n:(case + 1) * n]
        order_a = np.argsort(-a, kind="stable")
        order_b = np.argsort(-b, kind="stable")
        top3.append(len(set(order_a[:3].tolist()) & set(order_b[:3].tolist())) / 3)
        top1.append(float(order_a[0] == order_b[0]))
    return RankingReport(top3_agreement=float(np.mean(top3)), top1_agreement=float(np.mean(top1)),
                         score_error=float(np.mean(np.abs(fp - q8))), queries=len(cases), documents=n, recipe=RECIPE,
                         onnxruntime=ort.__version__)


# ---------------------------------------------------------------------------------------- build
def build_int8(model: Any, tokenizer: Any, model_path: str, model_id: str, activation: str, *,
               root: Path | None = None, max_length: int = 512) -> tuple[Path, RankingReport]:
    """Export, quantise and measure once; return the cached int8 model and its guard report.

    Raises:
        DependencyError: onnxruntime or onnx is missing.
        ModelLoadError: the export or the rewrite failed.
    """
    ort = onnxruntime()
    from gpuprompt.models import cache_dir

    root = root or cache_dir() / "models"
    name = model_id.rstrip("/").rsplit("/", 1)[-1] or "reranker"
    weights = weight_format()  # u8 weights where this CPU's u8 x s8 kernel saturates
    recipe = RECIPE if weights == "s8" else f"{RECIPE}-u8"
    target = root / f"{name}-{recipe}-{fingerprint(model_path, recipe + activation)}"
    report = _read_report(target)
    if report is not None and report.onnxruntime == ort.__version__:
        return target / _MODEL_FILE, report

    def build(tmp: Path) -> None:
        logger.info("building the int8 reranker of %s in %s (once: export, quantise, ranking guard)", model_id, target)
        fp32 = tmp / "model.fp32.onnx"
        export_onnx(model, tokenizer, fp32)
        calibration = [(q, d) for q, documents in guard_set(24, 8) for d in documents]
        maxima = channel_maxima(fp32, _pairs_batches(tokenizer, calibration, max_length))
        quantize_onnx(fp32, tmp / _MODEL_FILE, maxima=maxima, alpha=_SMOOTHING_ALPHA, weight_dtype=weights)
        fp32.unlink()
        measured = measure(model, tokenizer, tmp / _MODEL_FILE, activation, max_length)
        (tmp / _REPORT_FILE).write_text(json.dumps(dataclasses.asdict(measured), indent=2) + "\n")

    stale = report is not None  # measured by another onnxruntime: build and measure again
    if stale:
        import shutil

        shutil.rmtree(target, ignore_errors=True)
    build_once(target, build, ready=lambda folder: _read_report(folder) is not None, what=repr(model_id))
    report = _read_report(target)
    if report is None:
        raise ModelLoadError(f"the int8 reranker of {model_id!r} was built but its report cannot be read ({target}).")
    return target / _MODEL_FILE, report


def build_onnx(model: Any, tokenizer: Any, model_path: str, model_id: str, *, root: Path | None = None,
               max_length: int = 512) -> Path:
    """The fp32 ONNX export of the cross-encoder (``backend="onnx"``), built once and checked: the
    logits of real (query, passage) pairs through it must equal torch's (see
    :func:`gpuprompt._int8.build_fp32`).

    Raises:
        DependencyError: onnxruntime or onnx is missing.
        ModelLoadError: the export failed or does not compute what torch computes.
    """

    def check(path: Path) -> tuple[np.ndarray, np.ndarray]:
        pairs = [(query, document) for query, documents in guard_set(8, 4) for document in documents]
        features = _features(tokenizer, pairs, max_length)
        scorer = OnnxScorer(path, threads=1)
        try:
            return _torch_logits(model)(features), scorer(features).numpy()
        finally:
            scorer.close()

    return build_fp32(model_path, model_id, "rerank", export=lambda path: export_onnx(model, tokenizer, path),
                      check=check, root=root)


def _read_report(folder: Path) -> RankingReport | None:
    if not (folder / COMPLETE_MARK).is_file() or not (folder / _MODEL_FILE).is_file():
        return None
    try:
        return RankingReport(**json.loads((folder / _REPORT_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None
