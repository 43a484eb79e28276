"""Session fixtures for the LlamaIndex adapter tests: one embedder and one engine per backend.

The engines come from the Runtime with the same configuration the LangChain tests use, so a full
test session starts each engine once.
"""

from __future__ import annotations

import importlib.util

import pytest
from support.engines import LI_VLLM

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="session")
def li_embed():
    """GPUPromptEmbedding on the runtime's shared bundled MiniLM, loaded once."""
    from llamaindex_gpuprompt import GPUPromptEmbedding

    embed = GPUPromptEmbedding()
    embed.embedder.load()
    return embed


@pytest.fixture(scope="session")
def li_llm():
    """GPUPromptLLM on the transformers backend (fast start), tiny outputs."""
    from llamaindex_gpuprompt import GPUPromptLLM

    llm = GPUPromptLLM(backend="transformers", max_tokens=12)
    llm.engine.load()
    return llm


@pytest.fixture(scope="session")
def li_vllm():
    """GPUPromptLLM on vLLM (its CPU build here): the backend with JSON-schema guided decoding."""
    if not HAS_VLLM:
        pytest.skip("needs vLLM (pip install 'gpuprompt[cpu]' or 'gpuprompt[vllm]')")
    from llamaindex_gpuprompt import GPUPromptLLM

    llm = GPUPromptLLM(**LI_VLLM, max_tokens=48)  # the session's one vLLM engine
    llm.engine.load()
    return llm


def _metadata(product: dict, i: int) -> dict:
    meta = dict(product["metadata"])
    meta["tags"] = [meta["material"], meta["colour"]] + (["sale"] if meta["price"] < 60 else [])
    if i % 3:
        meta["rating"] = round(3.0 + (i * 7 % 20) / 10, 1)  # some products have no rating at all
    meta["note"] = "" if i % 4 == 0 else ("final sale" if i % 4 == 1 else None)
    return meta


@pytest.fixture(scope="session")
def catalogue_nodes(li_embed):
    """A factory of fresh, embedded LlamaIndex nodes over 60 products of the demo catalogue.

    Each node has its product's metadata (plus list, missing and empty fields), a SOURCE document
    (one per product type) and PREVIOUS/NEXT links inside that document. Embeddings are computed
    once per session; every call returns new node objects.
    """
    from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode

    from gpuprompt.apps.demo import catalogue

    products = catalogue(60)
    vectors = li_embed.get_text_embedding_batch([p["text"] for p in products])

    def make() -> list:
        nodes = []
        for i, (product, vector) in enumerate(zip(products, vectors)):
            node = TextNode(id_=product["id"], text=product["text"], metadata=_metadata(product, i), embedding=list(vector))
            node.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=f"doc-{product['metadata']['type']}")
            nodes.append(node)
        by_doc: dict[str, list] = {}
        for node in nodes:
            by_doc.setdefault(node.ref_doc_id, []).append(node)
        for members in by_doc.values():
            for before, after in zip(members, members[1:]):
                before.relationships[NodeRelationship.NEXT] = RelatedNodeInfo(node_id=after.node_id)
                after.relationships[NodeRelationship.PREVIOUS] = RelatedNodeInfo(node_id=before.node_id)
        return nodes

    return make
