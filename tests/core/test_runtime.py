"""Runtime: device resolution, one instance per config, thread-safe creation, shutdown."""

from __future__ import annotations

import threading
import time

import pytest

from gpuprompt import Runtime, get_runtime, resolve_device
from gpuprompt.errors import ClosedError, ConfigurationError
from gpuprompt.runtime import default_dtype


def test_resolve_device_on_this_machine() -> None:
    import torch

    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available() and torch.backends.mps.is_available():
        expected = "mps"
    assert resolve_device("auto") == expected
    assert resolve_device("cpu") == "cpu"


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "", 3, None])
def test_bad_device_strings(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="'device' must be"):
        resolve_device(bad)  # type: ignore[arg-type]


def test_cuda_requested_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        with pytest.raises(ConfigurationError, match="does not exist"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")
    else:
        with pytest.raises(ConfigurationError, match="CUDA is not available"):
            resolve_device("cuda:1")


def test_default_dtype() -> None:
    assert default_dtype("cuda:0") == "float16"
    assert default_dtype("cpu") == "float32"


def test_same_config_same_instance_and_one_build_under_races() -> None:
    runtime = Runtime(device="cpu")
    builds: list[int] = []

    def factory() -> object:
        time.sleep(0.05)
        builds.append(1)
        return object()

    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(runtime.get_or_create("k", factory))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and all(r is results[0] for r in results)
    assert runtime.get_or_create("other", object) is not results[0]


def test_embedder_registry_is_lazy_and_shared() -> None:
    runtime = Runtime(device="cpu")
    a = runtime.embedder(batch_size=16)
    assert a is runtime.embedder(batch_size=16)
    assert a is not runtime.embedder(batch_size=32)
    assert "not loaded" in repr(a)  # asking for it loaded nothing
    runtime.shutdown()


def test_shutdown_closes_components_and_refuses_new_ones() -> None:
    runtime = Runtime(device="cpu")

    class Closable:
        closed = False

        def close(self) -> None:
            self.closed = True

    item = runtime.get_or_create("c", Closable)
    runtime.shutdown()
    assert item.closed
    with pytest.raises(ClosedError):
        runtime.get_or_create("d", Closable)
    runtime.shutdown()  # twice is fine


def test_get_runtime_is_a_process_singleton() -> None:
    assert get_runtime() is get_runtime()


def test_bundled_model_aliases_share_one_embedder() -> None:
    runtime = Runtime(device="cpu")
    assert runtime.embedder() is runtime.embedder("sentence-transformers/all-MiniLM-L6-v2")
    assert runtime.embedder() is runtime.embedder("all-MiniLM-L6-v2")
    runtime.shutdown()


def test_importing_the_runtime_imports_no_component_module() -> None:
    import subprocess
    import sys

    code = (
        "import sys, gpuprompt.runtime; "
        "mods = [m for m in ('gpuprompt.embed', 'gpuprompt.context', 'gpuprompt.llm', 'gpuprompt.index', "
        "'gpuprompt.rag', 'torch') if m in sys.modules]; print(mods)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_context_cache_is_shared_per_embedder_and_options(embedder) -> None:
    from gpuprompt import Runtime

    rt = Runtime(device="cpu")
    try:
        first = rt.context_cache(embedder)
        assert rt.context_cache(embedder) is first
        assert rt.context_cache(embedder, max_turns_per_session=10) is not first
        first.append("s1", "user", "Does the Aurora dress shrink?")
        assert [t.text for t in rt.context_cache(embedder).turns("s1")] == ["Does the Aurora dress shrink?"]
    finally:
        rt.shutdown()
