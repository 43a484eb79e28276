"""Whether a measurement ran alone: the CPU that processes outside the bench used meanwhile.

A 1-minute load average cannot tell: a side with 32 caller threads raises it past 30 on its own.
This counts CPU time instead, from Linux's ``/proc``: all the machine's busy time minus the bench
process's own and its finished (waited-for) children's, the sides it spawned.
"""

from __future__ import annotations

import os
import time

__all__ = ["OTHER_CORES_LIMIT", "OtherLoad"]

OTHER_CORES_LIMIT = 0.25
"""Most cores (mean over a measurement) other processes may use for it to count as alone."""


def _busy_ticks() -> int | None:
    try:
        with open("/proc/stat") as handle:
            fields = [int(x) for x in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq + steal


def _own_ticks() -> int:
    with open("/proc/self/stat") as handle:
        after_name = handle.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in after_name[11:15])  # utime, stime, cutime, cstime


class OtherLoad:
    """Started at construction; :meth:`cores` is the mean number of cores other processes kept busy
    since then (0.0 where ``/proc`` is missing: not Linux, nothing measured)."""

    def __init__(self) -> None:
        self._start = (time.monotonic(), _busy_ticks(), _own_ticks())

    def cores(self) -> float:
        """Mean cores used by processes other than this one and its waited-for children so far."""
        started, busy, own = self._start
        now_busy = _busy_ticks()
        elapsed = time.monotonic() - started
        if busy is None or now_busy is None or elapsed <= 0:
            return 0.0
        ticks = os.sysconf("SC_CLK_TCK")
        other = (now_busy - busy) - (_own_ticks() - own)
        return max(0.0, other / ticks / elapsed)
