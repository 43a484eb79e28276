"""A remote client used before a fork and then in the forked children (gunicorn ``--preload``,
celery prefork, ``multiprocessing`` with ``fork``): each process gets its own connections, so no
process reads another's answers and no acknowledged write is lost or doubled."""

from __future__ import annotations

import asyncio
import multiprocessing
import sys

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no fork on Windows")


def _child(url: str, k: int, results) -> None:  # runs in a forked process
    try:
        import gpuprompt

        cache = gpuprompt.connect(url).context_cache()
        acknowledged = [cache.append(f"fork-child-{k}", "user", f"c{k}-{i}").text for i in range(10)]
        turns = asyncio.run(cache.aturns(f"fork-child-{k}"))
        results.put((k, acknowledged, [t.text for t in turns]))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put((k, f"{type(exc).__name__}: {exc}", None))


def test_forked_children_get_their_own_connections(live) -> None:
    import gpuprompt

    cache = gpuprompt.connect(live.url).context_cache()
    cache.clear("fork-parent")
    cache.append("fork-parent", "user", "before the fork")  # the sync pool holds a connection now
    asyncio.run(cache.aturns("fork-parent"))  # and the async pool, on its loop thread
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    children = [context.Process(target=_child, args=(live.url, k, results)) for k in range(3)]
    for child in children:
        child.start()
    parent = [cache.append("fork-parent", "user", f"p{i}").text for i in range(10)]
    got = sorted(results.get(timeout=120) for _ in children)
    for child in children:
        child.join(30)
    for k, acknowledged, stored in got:
        expected = [f"c{k}-{i}" for i in range(10)]
        assert acknowledged == expected, acknowledged
        assert stored == expected
    assert parent == [f"p{i}" for i in range(10)]
    assert [t.text for t in cache.turns("fork-parent")] == ["before the fork", *parent]
