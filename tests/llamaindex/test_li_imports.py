"""The public surface of llamaindex_gpuprompt is pinned, and importing it loads nothing heavy."""

from __future__ import annotations

import subprocess
import sys

import llamaindex_gpuprompt

EXPECTED_ALL = [
    "GPUPromptContextMemoryBlock",
    "GPUPromptEmbedding",
    "GPUPromptLLM",
    "GPUPromptRerank",
    "GPUPromptVectorStore",
    "to_core_filter",
]

HEAVY = ("torch", "faiss", "vllm", "transformers", "sentence_transformers")


def test_all_is_pinned() -> None:
    assert sorted(llamaindex_gpuprompt.__all__) == EXPECTED_ALL
    for name in llamaindex_gpuprompt.__all__:
        assert getattr(llamaindex_gpuprompt, name) is not None


def test_unknown_name_raises_attribute_error() -> None:
    try:
        llamaindex_gpuprompt.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected AttributeError")


def _heavy_modules_after(code: str) -> list[str]:
    probe = code + f"\nimport sys\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return [m for m in out.strip().split(",") if m]


def test_import_loads_no_torch_nor_llama_index() -> None:
    code = "import llamaindex_gpuprompt\nimport sys\nassert 'llama_index.core' not in sys.modules"
    assert _heavy_modules_after(code) == []


def test_public_classes_and_construction_load_nothing_heavy() -> None:
    code = (
        "from llamaindex_gpuprompt import *\n"
        "GPUPromptEmbedding(); GPUPromptVectorStore(); GPUPromptLLM(); GPUPromptContextMemoryBlock(); GPUPromptRerank()\n"
    )
    assert _heavy_modules_after(code) == []


def test_option_dicts_may_not_repeat_fields() -> None:
    import pytest

    from gpuprompt.errors import ConfigurationError
    from llamaindex_gpuprompt import GPUPromptEmbedding, GPUPromptLLM, GPUPromptVectorStore

    with pytest.raises(ConfigurationError, match=r"'embedder_options' must not hold \['device'\]"):
        GPUPromptEmbedding(embedder_options={"device": "cpu"})
    with pytest.raises(ConfigurationError, match=r"'engine_options' must not hold \['backend'\]"):
        GPUPromptLLM(engine_options={"backend": "vllm", "dtype": "float32"})
    with pytest.raises(ConfigurationError, match=r"'index_options' must not hold \['metric'\]"):
        GPUPromptVectorStore(index_options={"metric": "l2"})
    with pytest.raises(ConfigurationError, match="'engine_options' must be a dict"):
        GPUPromptLLM(engine_options=3)
