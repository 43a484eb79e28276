"""The GPUPromptVectorStore contract tests of test_li_vector_store.py, run again with a MilvusIndex
(Milvus Lite) under the store: every test there that takes the ``store`` fixture."""

from __future__ import annotations

import importlib.util
import inspect
import sys
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pymilvus")
if importlib.util.find_spec("milvus_lite") is None:
    pytest.skip("milvus-lite is not installed", allow_module_level=True)

from llamaindex_gpuprompt import GPUPromptVectorStore

sys.path.insert(0, str(Path(__file__).parent))
import test_li_vector_store as contract

# Every contract test that runs against the `store` fixture, collected here under the Milvus store;
# but tampering with VectorIndex's snapshot files: a MilvusIndex saves a pointer (Milvus keeps the
# data), covered in tests/core/test_milvus_index.py.
_SNAPSHOT_FORMAT = {"test_tampered_or_missing_snapshots_are_refused"}
for _name, _test in vars(contract).items():
    if _name.startswith("test_") and _name not in _SNAPSHOT_FORMAT and "store" in inspect.signature(_test).parameters:
        globals()[f"{_name}_on_milvus"] = _test
nodes = contract.nodes


@pytest.fixture(scope="module")
def milvus_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.getbasetemp() / "li_milvus.db")


@pytest.fixture
def store(nodes, milvus_uri: str):
    from gpuprompt.index import MilvusIndex

    index = MilvusIndex(len(nodes[0].embedding), uri=milvus_uri, collection=f"li_{uuid.uuid4().hex}")
    store = GPUPromptVectorStore(index=index)
    store.add(nodes)
    yield store
    index.close()


def test_the_contract_tests_were_found() -> None:
    found = [name for name in globals() if name.endswith("_on_milvus")]
    assert len(found) >= 12, found


def test_the_store_wraps_a_milvus_index(store) -> None:
    assert type(store.client).__name__ == "MilvusIndex"
