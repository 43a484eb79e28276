"""Start engine subprocesses without re-running the user's script in them.

vLLM starts its engine core with ``spawn``; by default a spawned child re-imports the parent's
``__main__`` (as ``__mp_main__``), so a script without an ``if __name__ == "__main__":`` guard has
its whole body run again inside the engine process: its side effects happen twice and it competes
with the engine for the cores. The engine core's entry point lives in vLLM, not in the user's
script, so it never needs the script: while :func:`no_main_reimport` is active, processes started
by ``spawn`` or ``forkserver`` skip that re-import.

They also die with their parent: on Linux each such child asks the kernel for ``SIGKILL`` when
the thread that started it exits (``prctl(PR_SET_PDEATHSIG)``), so a ``kill -9`` of a process that
started a vLLM engine does not leave the engine core behind holding its (GPU) memory; vLLM's own
workers already exit when the engine core goes. The child runs this module as its ``__mp_main__``
in place of the user's script, which is where that request is made.
"""

from __future__ import annotations

import multiprocessing.spawn as _mp_spawn
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["die_with_parent", "no_main_reimport"]

PARENT_ENV = "GPUPROMPT_SPAWN_PARENT"
"""The starting process's pid, read by the child to notice a parent that died before it was guarded."""
_PR_SET_PDEATHSIG = 1

_lock = threading.Lock()
_active = 0
_original: Any = None


def _preparation_data(name: str) -> dict[str, Any]:
    data = _original(name)
    if _active:
        data.pop("init_main_from_path", None)
        # The child imports this module as its __mp_main__ (it has no side effect but the guard).
        data["init_main_from_name"] = __name__
    return data


def die_with_parent(parent_pid: int | None = None) -> bool:
    """Ask Linux to ``SIGKILL`` this process when its parent (the thread that started it) exits.

    Args:
        parent_pid: the pid the parent had; when this process was already orphaned (its parent
            died before the request was made), it exits at once.

    Returns:
        True when the kernel took the request; False on other systems (nothing is done).
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the parent is already gone: nobody will ever use this process
    return True


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
        os.environ[PARENT_ENV] = str(os.getpid())
    try:
        yield
    finally:
        with _lock:
            _active -= 1


if __name__ == "__mp_main__":  # a child started under no_main_reimport, before its target runs
    # Popped: this module stays the child's __main__, so the processes it spawns in turn (vLLM's
    # workers, which watch the engine core through their own death pipe) run it too, and must
    # neither compare against the wrong parent nor be tied to a short-lived thread of the child.
    _parent = os.environ.pop(PARENT_ENV, "")
    if _parent.isdigit():
        die_with_parent(int(_parent))
