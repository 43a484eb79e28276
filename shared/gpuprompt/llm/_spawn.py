"""Start engine subprocesses without re-running the user's script in them.

vLLM starts its engine core with ``spawn``; by default a spawned child re-imports the parent's
``__main__`` (as ``__mp_main__``), so a script without an ``if __name__ == "__main__":`` guard has
its whole body run again inside the engine process: its side effects happen twice and it competes
with the engine for the cores. The engine core's entry point lives in vLLM, not in the user's
script, so it never needs the script: while :func:`no_main_reimport` is active, processes started
by ``spawn`` or ``forkserver`` skip that re-import.
"""

from __future__ import annotations

import multiprocessing.spawn as _mp_spawn
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["no_main_reimport"]

_lock = threading.Lock()
_active = 0
_original: Any = None


def _preparation_data(name: str) -> dict[str, Any]:
    data = _original(name)
    if _active:
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


@contextmanager
def no_main_reimport() -> Iterator[None]:
    """While active, a process started with ``spawn`` / ``forkserver`` does not re-run ``__main__``.

    Objects the child unpickles must then live in importable modules (vLLM's own entry points
    do); anything defined in the user's script is not available in the child.
    """
    global _active, _original
    with _lock:
        if _original is None:
            _original = _mp_spawn.get_preparation_data
            _mp_spawn.get_preparation_data = _preparation_data
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
