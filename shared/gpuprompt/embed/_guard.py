"""The int8 embedder's quality guard: int8 against fp32 on a fixed corpus, before it may serve."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuprompt._int8 import onnxruntime
from gpuprompt.embed._int8 import GUARD_BATCH, RECIPE, OnnxForward
from gpuprompt.errors import ConfigurationError, QualityError
from gpuprompt.validation import check_number

__all__ = [
    "EDGE_TEXTS",
    "GUARD_QUERIES",
    "agreement_at_10",
    "prose_set",
    "QualityReport",
    "QualityThresholds",
    "guard_corpus",
    "measure",
    "quality_error",
    "recall_at_10",
]

GUARD_QUERIES = 1000
"""Labelled queries of the documented guard."""
EDGE_TEXTS = (
    "", "x", "ok", "Thanks!", "?", "42", "hello hello hello hello", "Größe M oder L? Taille 38, ¿hay descuento?",
    "SKU P000123", "red " * 200, "longword " * 400,
)
"""Texts at the edges (empty, one character, repeated, non-English, truncated) also in the guard's cosines."""


@dataclass(frozen=True, kw_only=True)
class QualityThresholds:
    """The quality guard's floor for a quantised embedder, compared with fp32 on a built-in corpus.

    Attributes:
        cosine_mean: least mean cosine between int8 and fp32 vectors of the same texts.
        cosine_min: least cosine for any single text.
        recall_at_10: least share of fp32's recall@10 that int8 keeps on the 2,000-product catalogue
            (int8 recall@10 / fp32 recall@10, relevance from the products' attributes).
        agreement_at_10: least mean share of fp32's top-10 neighbours that int8 also returns, over
            real prose (:func:`prose_set`: 200 paragraphs of Python's language reference as queries
            over 1,000 others). Measured on all-MiniLM-L6-v2: bf16 compute of the same model keeps
            0.993, the int8 recipe 0.963. The default, 0.95, refuses a recipe or model that reorders
            more than one neighbour in twenty; ``0.98`` asks int8 to be nearly as exact as bf16, which
            no W8A8 recipe measured so far reaches at 2x fp32's speed (int8 is then refused, or fp32 kept
            under ``quantize="auto"``; on a CPU with AMX, ``dtype="bfloat16"`` keeps 0.993).
    """

    cosine_mean: float = 0.99
    cosine_min: float = 0.98
    recall_at_10: float = 0.98
    agreement_at_10: float = 0.95

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
        agreement_at_10: mean share of fp32's top-10 paragraphs that int8 also returns in its top 10,
            for each query paragraph of :func:`prose_set` (real prose, where neighbours are ranked by
            meaning rather than by shared attributes).
        texts: vectors compared for the cosines.
        queries: labelled queries behind the recall figures.
        products: catalogue size.
        paragraphs: prose paragraphs searched for the agreement figure.
        paragraph_queries: prose paragraphs used as its queries.
        recipe: :data:`RECIPE`.
        onnxruntime: the onnxruntime version that measured it.
    """

    cosine_mean: float
    cosine_min: float
    recall_at_10: float
    fp32_recall_at_10: float
    int8_recall_at_10: float
    overlap_at_10: float
    agreement_at_10: float
    texts: int
    queries: int
    products: int
    paragraphs: int
    paragraph_queries: int
    recipe: str
    onnxruntime: str

    def failures(self, thresholds: QualityThresholds) -> list[str]:
        """The figures under ``thresholds``, each as ``"name X < floor Y"`` (empty: it passes)."""
        out = []
        for name in ("cosine_mean", "cosine_min", "recall_at_10", "agreement_at_10"):
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
            f"top-10 agreement with fp32 on prose {self.agreement_at_10:.4f} ({self.paragraph_queries} paragraphs "
            f"over {self.paragraphs}); top-10 overlap on the catalogue {self.overlap_at_10:.4f}"
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


def guard_corpus(products: int = 2000, queries: int = GUARD_QUERIES) -> tuple[list[str], list[str], list[list[int]]]:
    """The guard's fixed corpus: catalogue texts, labelled queries and each query's relevant products.

    The catalogue is the demo's synthetic one (:func:`gpuprompt._corpus.catalogue`). Queries are
    generated from products' attributes (type, colour, material, price); a product is relevant when
    it has every attribute the query names.

    Returns:
        ``(product_texts, query_texts, relevant)``, ``relevant[i]`` the product indices for query i.
    """
    from gpuprompt._corpus import catalogue

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


def prose_set(paragraphs: int = 1000, queries: int = 200) -> tuple[list[str], list[str]]:
    """Real prose for the agreement figure: paragraphs of Python's language reference
    (:func:`gpuprompt._corpus.prose_paragraphs`, which ships with every Python), each once (topics
    repeat some), shuffled with a fixed seed; ``paragraphs`` to search and the next ``queries`` as
    queries, none of them also in the corpus."""
    from gpuprompt._corpus import prose_paragraphs

    texts = list(dict.fromkeys(prose_paragraphs(20)))
    random.Random(1).shuffle(texts)
    return texts[:paragraphs], texts[paragraphs : paragraphs + queries]


def agreement_at_10(reference: tuple[np.ndarray, np.ndarray], other: tuple[np.ndarray, np.ndarray]) -> float:
    """Mean share of the reference's top-10 (by cosine) that ``other`` also returns in its top 10.

    Args:
        reference: ``(queries, corpus)`` normalised vectors of one model.
        other: the same texts' vectors from another (the int8 model).
    """
    k = min(10, reference[1].shape[0])
    if k == 0 or reference[0].shape[0] == 0:
        return 1.0
    tops = [np.argsort(-(q @ c.T), axis=1, kind="stable")[:, :k] for q, c in (reference, other)]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(*tops)]))


def measure(model: Any, path: Path, *, products: int = 2000, queries: int = GUARD_QUERIES) -> QualityReport:
    """Compare the int8 model at ``path`` with ``model`` (fp32) on :func:`guard_corpus` and :func:`prose_set`
    (``products // 2`` paragraphs searched by ``queries // 5`` others: 1,000 and 200 by default)."""
    import torch

    ort = onnxruntime()
    texts, questions, relevant = guard_corpus(products, queries)
    paragraphs, asks = prose_set(products // 2, queries // 5)
    corpus = texts + questions + list(EDGE_TEXTS) + paragraphs + asks
    int8 = OnnxForward(path, model)
    try:
        with torch.inference_mode():
            fp_vectors = _encode(lambda f: model(f)["sentence_embedding"], model, corpus)
            q8_vectors = _encode(int8, model, corpus)
    finally:
        int8.close()
    e = len(corpus) - len(paragraphs) - len(asks)
    p = e + len(paragraphs)
    agreement = agreement_at_10((fp_vectors[p:], fp_vectors[e:p]), (q8_vectors[p:], q8_vectors[e:p]))
    fp_vectors, q8_vectors = fp_vectors[:e], q8_vectors[:e]  # the cosines: catalogue, questions, edge texts
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
        agreement_at_10=agreement,
        texts=len(cosines),
        queries=len(questions),
        products=n,
        paragraphs=len(paragraphs),
        paragraph_queries=len(asks),
        recipe=RECIPE,
        onnxruntime=ort.__version__,
    )


def _encode(forward: Callable[[dict[str, Any]], Any], model: Any, texts: Sequence[str]) -> np.ndarray:
    """Normalised embeddings of ``texts`` (length-sorted batches of 64, original order kept)."""
    import torch

    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    rows: list[np.ndarray] = []
    for start in range(0, len(order), GUARD_BATCH):
        batch = [texts[i] for i in order[start : start + GUARD_BATCH]]
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
