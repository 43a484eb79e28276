"""MilvusIndex's batch runner: one multi-query Milvus search per distinct filter, re-checked and topped up.

The Milvus expression of a filter selects a superset of its matches (see
:mod:`gpuprompt.index._milvus_filters`); every hit is re-checked with the compiled predicate, and a
query left short by the re-check is searched again with a wider window, then exactly over the
matching ids, so each query gets ``min(k, matches)`` hits, as from VectorIndex.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from gpuprompt.errors import InvalidInputError
from gpuprompt.index._milvus_filters import literal
from gpuprompt.index._search import SearchRequest
from gpuprompt.index._types import Hit
from gpuprompt.index.filters import Predicate, compile_filter

__all__ = ["LIMIT_CAP", "check_server_k", "run_milvus_batch"]

LIMIT_CAP = 16_384
"""Milvus's largest ``limit`` (topk) per search on a server."""
_COUNT_ABOVE = 1_024  # a k above this is first cut to the collection's size

_Found = tuple[Hit, Any]  # a hit and its vector (None unless MMR asked for vectors)


def check_server_k(index: Any, k: int, name: str = "k") -> None:
    """Refuse a ``k`` over Milvus's topk limit on a server (Milvus Lite has none)."""
    if not index.options.is_lite and k > LIMIT_CAP:
        raise InvalidInputError(
            f"'{name}' must be at most {LIMIT_CAP} on a Milvus server, its topk limit (got {k}); page with filters instead."
        )


def run_milvus_batch(index: Any, client: Any, requests: list[SearchRequest]) -> list[Any]:
    """Answer a batch of search / MMR requests (per request: one list of hits per query)."""
    results: list[Any] = [None] * len(requests)
    groups: dict[str | None, list[int]] = {}
    for i, request in enumerate(requests):
        groups.setdefault(request.key, []).append(i)
    for members in groups.values():
        queries = np.concatenate([_numpy(requests[i].queries) for i in members], axis=0)
        k = max(requests[i].k for i in members)
        if k > _COUNT_ABOVE:
            k = max(1, min(k, index.count))
        with_vectors = any(requests[i].mmr is not None for i in members)
        found = _search(index, client, queries, k, requests[members[0]].filter, with_vectors)
        start = 0
        for i in members:
            request = requests[i]
            stop = start + int(request.queries.shape[0])
            if request.mmr is not None:
                # only this request's own fetch_k candidates: the batch's k may be another caller's
                results[i] = [_mmr(queries[start], found[start][: request.k], *request.mmr)]
            else:
                results[i] = [[hit for hit, _ in found[q][: request.k]] for q in range(start, stop)]
            start = stop
    return results


def _search(
    index: Any, client: Any, queries: np.ndarray, k: int, filter: Mapping[str, Any] | None, with_vectors: bool
) -> list[list[_Found]]:
    options = index.options
    expr = index._expression(filter)
    predicate = compile_filter(filter) if filter else None
    fields = ["document", "metadata"] + (["vector"] if with_vectors else [])
    cap = LIMIT_CAP if not options.is_lite else max(LIMIT_CAP, k)
    out: list[list[_Found]] = [[] for _ in range(queries.shape[0])]
    short: list[int] = []
    pending = list(range(queries.shape[0]))
    limit = min(k, cap)
    while pending:
        raw = client.search(
            options.collection,
            data=queries[pending].tolist(),
            limit=limit,
            filter=expr,
            output_fields=fields,
            search_params=options.search_params_for(limit),
        )
        again: list[int] = []
        for q, hits in zip(pending, raw):
            kept = [found for found in (_found(hit, options.metric) for hit in hits) if _keep(predicate, found)]
            if len(kept) >= k or len(hits) < limit:
                out[q] = kept[:k]
            elif limit >= cap:
                out[q] = kept
                short.append(q)
            else:
                again.append(q)
        pending, limit = again, min(limit * 4, cap)
    if short:
        _exactly(index, client, queries, k, filter, fields, short, out)
    return out


def _exactly(
    index: Any,
    client: Any,
    queries: np.ndarray,
    k: int,
    filter: Mapping[str, Any] | None,
    fields: list[str],
    short: list[int],
    out: list[list[_Found]],
) -> None:
    """The rare case of a filter Milvus narrows poorly: search only the ids that match exactly."""
    allowed = [key for key in (literal(key) for key in index._matching_ids(client, filter)) if key is not None]
    if not allowed:
        return
    options = index.options
    limit = min(k, len(allowed), LIMIT_CAP if not options.is_lite else len(allowed))
    raw = client.search(
        options.collection,
        data=queries[short].tolist(),
        limit=limit,
        filter=f"id in [{', '.join(allowed)}]",
        output_fields=fields,
        search_params=options.search_params_for(limit),
    )
    for q, hits in zip(short, raw):
        out[q] = [_found(hit, options.metric) for hit in hits][:k]


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
