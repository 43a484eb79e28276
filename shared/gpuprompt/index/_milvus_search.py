"""MilvusIndex's batch runner: one multi-query Milvus search per distinct filter and leg (dense, and
the sparse BM25 leg of lexical and hybrid requests), re-checked, topped up and fused.

The Milvus expression of a filter selects a superset of its matches (see
:mod:`gpuprompt.index._milvus_filters`); every hit is re-checked with the compiled predicate, and a
query left short by the re-check is searched again with a wider window, then exactly over the
matching ids, so each query gets ``min(k, matches)`` hits, as from VectorIndex.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from gpuprompt.errors import InvalidInputError
from gpuprompt.index._milvus_filters import ids_expression
from gpuprompt.index._milvus_schema import LEXICAL_FIELD as LEXICAL
from gpuprompt.index._search import SearchRequest
from gpuprompt.index._types import Hit
from gpuprompt.index.filters import Predicate, compile_filter

__all__ = ["LIMIT_CAP", "check_server_k", "run_milvus_batch"]

LIMIT_CAP = 16_384
"""Milvus's largest ``limit`` (topk) per search on a server."""
_COUNT_ABOVE = 1_024  # a k above this is first cut to the collection's size
_SPARSE_PARAMS = {"metric_type": "IP"}

_Found = tuple[Hit, Any]  # a hit and its vector (None unless MMR asked for vectors)


def check_server_k(index: Any, k: int, name: str = "k") -> None:
    """Refuse a ``k`` over Milvus's topk limit on a server (Milvus Lite has none)."""
    if not index.options.is_lite and k > LIMIT_CAP:
        raise InvalidInputError(
            f"'{name}' must be at most {LIMIT_CAP} on a Milvus server, its topk limit (got {k}); page with filters instead."
        )


def run_milvus_batch(index: Any, client: Any, requests: list[SearchRequest]) -> list[Any]:
    """Answer a batch of search / MMR / lexical / hybrid requests (per request: one list of hits per
    query): per distinct filter, one multi-query dense search and one multi-query sparse search."""
    results: list[Any] = [None] * len(requests)
    groups: dict[str | None, list[int]] = {}
    for i, request in enumerate(requests):
        groups.setdefault(request.key, []).append(i)
    for members in groups.values():
        filter = requests[members[0]].filter
        dense_members = [i for i in members if requests[i].mode != "lexical"]
        found: list[list[_Found]] = []
        queries = np.empty((0, 1), dtype=np.float32)
        if dense_members:
            queries = np.concatenate([_numpy(requests[i].queries) for i in dense_members], axis=0)
            k = max(requests[i].dense_k for i in dense_members)
            if k > _COUNT_ABOVE:
                k = max(1, min(k, index.count))
            with_vectors = any(requests[i].mmr is not None for i in dense_members)
            found = _search(index, client, queries, k, filter, with_vectors)
        words = _lexical_leg(index, client, [requests[i] for i in members], filter)
        start = 0
        for i in members:
            request = requests[i]
            if request.mode == "lexical":
                results[i] = [[hit for hit, _ in hits] for hits in words.pop(0)]
                continue
            stop = start + int(request.queries.shape[0])
            if request.mode == "hybrid":
                results[i] = _fused(request, found[start:stop], words.pop(0))
            elif request.mmr is not None:
                # only this request's own fetch_k candidates: the batch's k may be another caller's
                results[i] = [_mmr(queries[start], found[start][: request.k], *request.mmr)]
            else:
                results[i] = [[hit for hit, _ in found[q][: request.k]] for q in range(start, stop)]
            start = stop
    return results


def _lexical_leg(index: Any, client: Any, requests: list[SearchRequest],
                 filter: Mapping[str, Any] | None) -> list[list[list[_Found]]]:
    """The sparse (BM25) candidates of the lexical and hybrid requests, in order: per request, per text."""
    wanted = [r for r in requests if r.mode == "lexical" or (r.mode == "hybrid" and r.fusion is not None
                                                               and r.fusion.alpha != 1.0)]
    taken = {id(r) for r in wanted}
    skipped = {id(r) for r in requests if r.mode == "hybrid" and id(r) not in taken}
    if not wanted and not skipped:
        return []
    counts = index._lexical_counts()
    vectors: list[dict[int, float]] = []
    for request in wanted:
        assert request.texts is not None
        vectors.extend(counts.query_vector(text) for text in request.texts)
    asked = [q for q, vector in enumerate(vectors) if vector]
    k = max((r.dense_k if r.mode == "hybrid" else r.k for r in wanted), default=1)
    answered = _search(index, client, [vectors[q] for q in asked], k, filter, False, field=LEXICAL) if asked else []
    per_query: list[list[_Found]] = [[] for _ in vectors]
    for q, hits in zip(asked, answered):
        per_query[q] = hits
    out: list[list[list[_Found]]] = []
    at = 0
    for request in requests:
        if request.mode == "dense":
            continue
        if id(request) in skipped:
            out.append([[] for _ in request.texts or []])
            continue
        n = len(request.texts or [])
        keep = request.dense_k if request.mode == "hybrid" else request.k
        out.append([hits[:keep] for hits in per_query[at:at + n]])
        at += n
    return out


def _fused(request: SearchRequest, dense: list[list[_Found]], words: list[list[_Found]]) -> list[list[Hit]]:
    """Fuse each query's two legs with the core's fusion (the same as VectorIndex's)."""
    from gpuprompt.index._fusion import fuse

    fusion = request.fusion
    assert fusion is not None
    out = []
    for dense_hits, word_hits in zip(dense, words):
        by_id: dict[str, Hit] = {}
        number: dict[str, int] = {}

        def leg(hits: list[_Found], by_id: dict[str, Hit] = by_id, number: dict[str, int] = number) -> tuple[Any, Any]:
            for hit, _ in hits:
                by_id.setdefault(hit.id, hit)
                number.setdefault(hit.id, len(number))
            return (np.asarray([h.score for h, _ in hits], dtype=np.float32),
                    np.asarray([number[h.id] for h, _ in hits], dtype=np.int64))

        first = None if fusion.alpha == 0.0 else leg(dense_hits[: fusion.fetch_k])
        second = None if fusion.alpha == 1.0 else leg(word_hits[: fusion.fetch_k])
        scores, rows = fuse(first, second, fusion, request.k)
        ids = list(number)
        out.append([dataclasses.replace(by_id[ids[int(r)]], score=float(s)) for s, r in zip(scores, rows)])
    return out


def _search(
    index: Any, client: Any, queries: Any, k: int, filter: Mapping[str, Any] | None, with_vectors: bool,
    field: str = "vector",
) -> list[list[_Found]]:
    options = index.options
    expr = index._expression(filter)
    predicate = compile_filter(filter) if filter else None
    fields = ["document", "metadata"] + (["vector"] if with_vectors else [])
    cap = LIMIT_CAP if not options.is_lite else max(LIMIT_CAP, k)
    dense = field == "vector"
    metric = options.metric if dense else "ip"
    out: list[list[_Found]] = [[] for _ in range(len(queries))]
    short: list[int] = []
    pending = list(range(len(queries)))
    limit = min(k, cap)
    while pending:
        raw = client.search(
            options.collection,
            data=_rows(queries, pending),
            limit=limit,
            filter=expr,
            output_fields=fields,
            anns_field=field,
            search_params=options.search_params_for(limit) if dense else _SPARSE_PARAMS,
        )
        again: list[int] = []
        for q, hits in zip(pending, raw):
            kept = [found for found in (_found(hit, metric) for hit in hits) if _keep(predicate, found)]
            if len(kept) >= k or len(hits) < limit:
                out[q] = kept[:k]
            elif limit >= cap:
                out[q] = kept
                short.append(q)
            else:
                again.append(q)
        pending, limit = again, min(limit * 4, cap)
    if short:
        _exactly(index, client, queries, k, filter, fields, short, out, field)
    return out


def _exactly(
    index: Any,
    client: Any,
    queries: Any,
    k: int,
    filter: Mapping[str, Any] | None,
    fields: list[str],
    short: list[int],
    out: list[list[_Found]],
    field: str = "vector",
) -> None:
    """The rare case of a filter Milvus narrows poorly: search only the ids that match exactly."""
    allowed = index._matching_ids(client, filter)
    expression = ids_expression(allowed)
    if expression is None:
        return
    options = index.options
    dense = field == "vector"
    limit = min(k, len(allowed), LIMIT_CAP if not options.is_lite else len(allowed))
    raw = client.search(
        options.collection,
        data=_rows(queries, short),
        limit=limit,
        filter=expression,
        output_fields=fields,
        anns_field=field,
        search_params=options.search_params_for(limit) if dense else _SPARSE_PARAMS,
    )
    for q, hits in zip(short, raw):
        out[q] = [_found(hit, options.metric if dense else "ip") for hit in hits][:k]


def _rows(queries: Any, picked: list[int]) -> list[Any]:
    """The query rows ``picked``: dense rows as lists, sparse ones as the dicts they are."""
    if isinstance(queries, np.ndarray):
        return queries[picked].tolist()  # type: ignore[no-any-return]
    return [queries[q] for q in picked]


def _found(hit: Any, metric: str) -> _Found:
    entity = hit["entity"]
    distance = float(hit["distance"])
    score = 1.0 / (1.0 + max(distance, 0.0)) if metric == "l2" else distance
    metadata = entity.get("metadata")
    if isinstance(metadata, str):
        import json

        metadata = json.loads(metadata)
    hit_obj = Hit(str(hit["id"]), score, entity.get("document"), dict(metadata or {}))
    vector = entity.get("vector")
    return hit_obj, (np.asarray(vector, dtype=np.float32) if vector is not None else None)


def _keep(predicate: Predicate | None, found: _Found) -> bool:
    return predicate is None or predicate(found[0].metadata)


def _mmr(query: np.ndarray, candidates: list[_Found], k: int, lambda_mult: float) -> list[Hit]:
    if not candidates:
        return []
    import torch

    from gpuprompt.index._mmr import mmr_select

    matrix = torch.from_numpy(np.stack([vector for _, vector in candidates]))
    order = mmr_select(torch.from_numpy(np.ascontiguousarray(query, dtype=np.float32)), matrix, k, lambda_mult)
    return [candidates[p][0] for p in order]


def _numpy(queries: Any) -> np.ndarray:
    if isinstance(queries, np.ndarray):
        return np.ascontiguousarray(queries, dtype=np.float32)
    return queries.detach().float().cpu().numpy()
