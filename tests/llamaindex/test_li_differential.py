"""Differential tests against LlamaIndex's own SimpleVectorStore (exact cosine search).

The same nodes and the same queries -- with filters and node-id restrictions -- must give the same
top-k node ids, in the same order, with the same similarities.
"""

from __future__ import annotations

import numpy as np
import pytest
from llama_index.core.vector_stores import SimpleVectorStore
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
)

from llamaindex_gpuprompt import GPUPromptVectorStore

F = MetadataFilter
OP = FilterOperator

QUESTIONS = [
    "a red dress for a summer wedding",
    "something warm in wool for winter",
    "which jeans do not shrink in the wash?",
    "cheap linen shirt",
    "dry clean only silk",
    "navy rain jacket",
]

FILTERS: list[MetadataFilters | None] = [
    None,
    MetadataFilters(filters=[F(key="type", value="dress")]),
    MetadataFilters(filters=[F(key="price", value=120, operator=OP.LT)]),
    MetadataFilters(filters=[F(key="price", value=120, operator=OP.GTE), F(key="material", value="cotton", operator=OP.NE)]),
    MetadataFilters(filters=[F(key="colour", value=["red", "navy", "black"], operator=OP.IN)]),
    MetadataFilters(filters=[F(key="material", value=["wool", "silk"], operator=OP.NIN)]),
    MetadataFilters(filters=[F(key="tags", value=["sale", "linen"], operator=OP.ANY)]),
    MetadataFilters(filters=[F(key="tags", value=["sale", "cotton"], operator=OP.ALL)]),
    MetadataFilters(filters=[F(key="tags", value="silk", operator=OP.CONTAINS)]),
    MetadataFilters(filters=[F(key="wash", value="machine wash", operator=OP.TEXT_MATCH)]),
    MetadataFilters(filters=[F(key="wash", value="DRY CLEAN", operator=OP.TEXT_MATCH_INSENSITIVE)]),
    MetadataFilters(filters=[F(key="rating", value=None, operator=OP.IS_EMPTY)]),
    MetadataFilters(filters=[F(key="rating", value=4.0, operator=OP.GT)]),
    MetadataFilters(filters=[F(key="type", value="coat"), F(key="type", value="sweater")], condition=FilterCondition.OR),
    MetadataFilters(
        filters=[F(key="type", value="dress"), F(key="price", value=100, operator=OP.GT)], condition=FilterCondition.NOT
    ),
    # LlamaIndex's stores write the node's ref_doc_id under these three keys: filtering by document.
    MetadataFilters(filters=[F(key="doc_id", value="doc-dress")]),
    MetadataFilters(filters=[F(key="ref_doc_id", value=["doc-coat", "doc-jeans"], operator=OP.IN)]),
    MetadataFilters(filters=[F(key="document_id", value="doc-dress", operator=OP.NE), F(key="price", value=80, operator=OP.LT)]),
]


@pytest.fixture(scope="module")
def pair(catalogue_nodes):
    ours = GPUPromptVectorStore()
    stock = SimpleVectorStore()
    ours.add(catalogue_nodes())
    stock.add(catalogue_nodes())
    return ours, stock


@pytest.fixture(scope="module")
def question_vectors(li_embed):
    return li_embed.get_text_embedding_batch(QUESTIONS)


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: "none" if f is None else f.model_dump_json()[:70])
@pytest.mark.parametrize("k", [1, 4, 10])
def test_same_top_k_as_simple_vector_store(pair, question_vectors, filters, k) -> None:
    ours, stock = pair
    for vector in question_vectors:
        query = VectorStoreQuery(query_embedding=vector, similarity_top_k=k, filters=filters)
        expected = stock.query(query)
        got = ours.query(query)
        assert got.ids == expected.ids
        np.testing.assert_allclose(got.similarities, expected.similarities, atol=1e-5)


def test_same_results_with_node_id_restrictions(pair, question_vectors, catalogue_nodes) -> None:
    ours, stock = pair
    allowed = [n.node_id for n in catalogue_nodes()[::3]]
    for vector in question_vectors:
        for filters in (None, MetadataFilters(filters=[F(key="price", value=100, operator=OP.LT)])):
            query = VectorStoreQuery(query_embedding=vector, similarity_top_k=5, node_ids=allowed, filters=filters)
            assert ours.query(query).ids == stock.query(query).ids


def test_same_results_after_deletes(catalogue_nodes, question_vectors) -> None:
    ours, stock = GPUPromptVectorStore(), SimpleVectorStore()
    ours.add(catalogue_nodes())
    stock.add(catalogue_nodes())
    for store in (ours, stock):
        store.delete("doc-dress")
        store.delete_nodes(filters=MetadataFilters(filters=[F(key="price", value=50, operator=OP.LT)]))
    for vector in question_vectors:
        query = VectorStoreQuery(query_embedding=vector, similarity_top_k=6)
        assert ours.query(query).ids == stock.query(query).ids
