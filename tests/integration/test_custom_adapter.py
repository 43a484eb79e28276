"""examples/custom_adapter.py, an adapter written from the public API only (docs/adapters.md): the
same class answers the same in process and against a server, in every retrieval mode."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from support.asgi import InProcessServer

from gpuprompt import get_runtime
from gpuprompt.errors import InputTypeError, InvalidInputError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_adapter.py"
DOCS = [
    {"id": "p1", "content": "Aurora dress, red cotton, article SKU-48213-QX, 49 EUR.", "meta": {"type": "dress"}},
    {"id": "p2", "content": "Borealis jacket, blue wool, article SKU-11007-JA, 120 EUR.", "meta": {"type": "jacket"}},
    {"id": "p3", "content": "Returns are free within 30 days of delivery.", "meta": {"type": "policy"}},
    {"id": "p4", "content": "Celeste dress, green linen, article SKU-90321-LN, 65 EUR.", "meta": {"type": "dress"}},
]
QUESTIONS = ["Is SKU-48213-QX made of cotton?", "how do I send something back?", "a warm winter jacket"]


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("custom_adapter_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_imports_only_public_gpuprompt_modules() -> None:
    tree = ast.parse(EXAMPLE.read_text())
    modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    ours = [m for m in modules if m.split(".")[0] == "gpuprompt"]
    assert ours and not [m for m in ours if any(part.startswith("_") for part in m.split("."))]


@pytest.fixture(scope="module")
def server(embedder) -> InProcessServer:
    from gpuprompt.server import create_app

    served = InProcessServer(create_app(embedder=embedder, llm=get_runtime().llm(backend="transformers"),
                                        preload=False)).start()
    yield served
    served.stop()


@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
def test_in_process_and_remote_answer_alike(server: InProcessServer, embedder, mode: str) -> None:
    module = _example()
    local = module.Retriever(mode=mode, top_k=2)
    remote = module.Retriever(mode=mode, top_k=2, base_url=server.url, collection=f"adapter-{mode}")
    assert not local.runtime.remote and remote.runtime.remote
    assert local.write_documents(DOCS) == remote.write_documents(DOCS) == len(DOCS)
    for question in QUESTIONS:
        if mode == "lexical" and question == "a warm winter jacket":
            continue  # no word in common with any document: the lexical leg finds nothing, either way
        mine, theirs = local.run(question), remote.run(question)
        assert [d["id"] for d in mine["documents"]] == [d["id"] for d in theirs["documents"]]
        assert [d["score"] for d in mine["documents"]] == pytest.approx([d["score"] for d in theirs["documents"]],
                                                                       abs=1e-4)
    if mode != "dense":  # the code's exact tokens: what the lexical leg is for
        assert local.run(QUESTIONS[0], top_k=1)["documents"][0]["id"] == "p1"
    filtered = remote.run("a dress", filters={"type": "dress"})["documents"]
    assert filtered and {d["meta"]["type"] for d in filtered} == {"dress"}


def test_bad_input_is_typed() -> None:
    module = _example()
    retriever = module.Retriever()
    with pytest.raises(InputTypeError, match="documents"):
        retriever.write_documents("not a list")
    with pytest.raises(InputTypeError, match=r"documents\[0\]"):
        retriever.write_documents(["a bare string"])
    with pytest.raises(InvalidInputError, match="query"):
        retriever.run("")
    with pytest.raises(InvalidInputError, match="mode"):
        module.Retriever(mode="fuzzy")
