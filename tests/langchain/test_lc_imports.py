"""The public surface of langchain_gpuprompt, and that importing it stays light."""

from __future__ import annotations

import json
import subprocess
import sys

import langchain_gpuprompt

EXPECTED_ALL = [
    "ChatGPUPrompt",
    "GPUPromptChatMessageHistory",
    "GPUPromptEmbeddings",
    "GPUPromptReranker",
    "GPUPromptRetriever",
    "GPUPromptSemanticCache",
    "GPUPromptStore",
    "GPUPromptVectorStore",
]


def test_all_is_pinned() -> None:
    assert sorted(langchain_gpuprompt.__all__) == sorted(EXPECTED_ALL)


def test_every_name_resolves() -> None:
    for name in EXPECTED_ALL:
        assert getattr(langchain_gpuprompt, name).__name__ == name


def test_unknown_name_is_an_attribute_error() -> None:
    try:
        langchain_gpuprompt.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected AttributeError")


_PROBE = """
import json, sys
import langchain_gpuprompt
from langchain_gpuprompt import (ChatGPUPrompt, GPUPromptChatMessageHistory, GPUPromptEmbeddings,
    GPUPromptReranker, GPUPromptSemanticCache, GPUPromptStore, GPUPromptVectorStore)
objs = [GPUPromptEmbeddings(), ChatGPUPrompt(), GPUPromptVectorStore(GPUPromptEmbeddings()),
        GPUPromptSemanticCache(), GPUPromptStore(), GPUPromptChatMessageHistory(session_id="s"), GPUPromptReranker()]
heavy = sorted(m for m in ("torch", "faiss", "vllm", "transformers", "sentence_transformers") if m in sys.modules)
print(json.dumps(heavy))
"""


def test_import_and_construction_load_nothing_heavy() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
