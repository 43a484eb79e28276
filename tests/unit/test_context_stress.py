"""ContextCache under concurrency: every window is checked against a sequential model.

Writer threads append numbered turns (``"turn 17: ..."``) to their own session while reader
threads (and one asyncio reader) call ``window``/``awindow``/``turns`` on the same sessions. The
per-session turn cap is small, so old turns are evicted on almost every append. Every result must
equal what a single-threaded cache would return at some instant between the call's start and its
end: one consistent snapshot of the session, scored and selected as a whole.

The embedder here is a stub whose scores are exact small integers (so the expected top-k is known
without ties) -- it tests the cache's snapshot logic, not a model. The same test runs on CUDA when
one is present (marked ``gpu``), where device writes and reads are asynchronous.
"""

from __future__ import annotations

import asyncio
import random
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuprompt import ContextCache

CAP = 12
"""The per-session turn cap: evictions shift the kept turns on nearly every append."""
SESSIONS = 3
READERS = 3
DURATION_S = 4.0
"""How long the writers and readers run (the whole test stays well under 30 s)."""
MIN_WINDOWS = 300
"""Fewest windows that must have been checked for the run to count."""


def position(index: int) -> int:
    """A turn's score coordinate: distinct for any 1009 consecutive turn indexes."""
    return (index * 389) % 1009


def turn_text(index: int) -> str:
    """The text of turn ``index``: its number first, then 0..4 filler words (varied token counts)."""
    return f"turn {index}: " + " ".join(["word"] * (index % 5))


def turn_role(index: int) -> str:
    return "user" if index % 2 == 0 else "assistant"


def tokens(index: int) -> int:
    return len(turn_text(index).split())


class YieldingQuery:
    """A query vector whose move to the device yields the GIL first, as a host-to-device copy does.

    Both the old and the fixed cache call ``.to(device)`` between taking a session's snapshot and
    scoring it, so this widens exactly the moment a concurrent append must not be able to affect.
    """

    def __init__(self, vector: Any) -> None:
        self.vector = vector

    def to(self, device: Any) -> Any:
        time.sleep(0)
        return self.vector.to(device)


class IndexEmbedder:
    """Stub embedder: ``"turn i: ..."`` -> ``(position(i), 1, 0, 0)``; ``"query s"`` -> ``(s, 0, 0, 0)``.

    Scores are small integers, exact in float32, and distinct among any 1009 consecutive turns.
    With ``yielding=True`` query vectors are :class:`YieldingQuery` objects.
    """

    dim = 4

    def __init__(self, device: str = "cpu", *, yielding: bool = False) -> None:
        self.device = device
        self.yielding = yielding

    def _row(self, text: str) -> list[float]:
        if text.startswith("turn "):
            return [float(position(int(text[5 : text.index(":")]))), 1.0, 0.0, 0.0]
        if text.startswith("query "):
            return [float(text[6:]), 0.0, 0.0, 0.0]
        raise AssertionError(f"unexpected text {text!r}")

    def embed_tensor(self, texts: Sequence[str]) -> Any:
        import torch

        out = torch.tensor([self._row(t) for t in texts], dtype=torch.float32, device=self.device)
        if self.yielding and texts and texts[0].startswith("query "):
            return [YieldingQuery(row) for row in out]
        return out

    async def aembed_tensor(self, texts: Sequence[str]) -> Any:
        return self.embed_tensor(texts)


def expected_window(
    count: int, sign: int | None, max_turns: int, max_tokens: int | None, recent: int | None
) -> list[int]:
    """The sequential model: the window over turns ``[count - CAP, count)`` as turn indexes."""
    live = list(range(max(0, count - CAP), count))
    n = len(live)
    if max_turns == 0 or n == 0:
        return []
    keep_recent = recent if recent is not None else (max_turns // 2 if sign is not None else max_turns)
    keep_recent = min(keep_recent, max_turns, n)
    recent_ids = live[n - keep_recent :]
    older = live[: n - keep_recent]
    room = min(max_turns - keep_recent, len(older))
    if sign is not None:
        ranked = sorted(older, key=lambda i: -sign * position(i))[:room]
    else:
        ranked = list(reversed(older))[:room]
    chosen = ranked + recent_ids
    if max_tokens is not None:
        total = sum(tokens(i) for i in chosen)
        kept = set(chosen)
        for i in list(reversed(ranked)) + recent_ids:
            if total <= max_tokens:
                break
            kept.discard(i)
            total -= tokens(i)
        chosen = [i for i in chosen if i in kept]
    return sorted(chosen)


@dataclass
class Progress:
    """One session's writer progress: turns whose append has started / has returned."""

    started: int = 0
    completed: int = 0


@dataclass
class Tally:
    """Windows checked, how many were inconsistent, and the first few problems."""

    checked: int = 0
    failed: int = 0
    examples: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, problem: str | None) -> None:
        with self.lock:
            self.checked += 1
            if problem is not None:
                self.failed += 1
                if len(self.examples) < 5:
                    self.examples.append(problem)


def check_turns(result: list[Any]) -> str | None:
    """Each returned turn is the true turn of its number: text, role, index and token count agree."""
    for turn in result:
        if (
            turn.text != turn_text(turn.index)
            or turn.role != turn_role(turn.index)
            or turn.tokens != tokens(turn.index)
        ):
            return f"turn {turn.index} carries another turn's data: {turn!r}"
    indexes = [t.index for t in result]
    if indexes != sorted(set(indexes)):
        return f"not chronological or duplicated: {indexes}"
    return None


def check_window(result: list[Any], low: int, high: int, call: tuple) -> str | None:
    """``result`` must be the model's window for some turn count in ``[low, high]``."""
    problem = check_turns(result)
    if problem is not None:
        return problem
    indexes = [t.index for t in result]
    for count in range(low, high + 1):
        if expected_window(count, *call) == indexes:
            return None
    return (
        f"window {indexes} for (sign, max_turns, max_tokens, recent)={call} matches no snapshot with "
        f"{low}..{high} turns appended; e.g. with {high}: {expected_window(high, *call)}"
    )


def random_call(rng: random.Random) -> tuple[int | None, int, int | None, int | None]:
    sign = rng.choice([None, 1, -1, 1, -1])
    max_turns = rng.choice([0, 1, 3, 5, 8, 12, 20])
    max_tokens = rng.choice([None, None, None, 4, 10, 25])
    recent = rng.choice([None, None, 0, 1, 2, 4])
    return sign, max_turns, max_tokens, recent


def run_stress(device: str) -> Tally:
    """Run writers and readers for ``DURATION_S``; return the tally of checked windows."""
    cache = ContextCache(
        IndexEmbedder(device, yielding=True),  # type: ignore[arg-type]
        max_turns_per_session=CAP,
        ttl_seconds=None,
        token_counter=lambda text: len(text.split()),
    )
    sessions = [f"stress-{s}" for s in range(SESSIONS)]
    progress = {s: Progress() for s in sessions}
    tally = Tally()
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(session: str, seed: int) -> None:
        rng = random.Random(seed)
        state = progress[session]
        try:
            while not stop.is_set():
                size = rng.choice([1, 1, 1, 2, 3])
                first = state.started
                batch = [(turn_role(i), turn_text(i)) for i in range(first, first + size)]
                state.started += size
                if size == 1:
                    returned = [cache.append(session, *batch[0])]
                else:
                    returned = cache.extend(session, [{"role": r, "content": t} for r, t in batch])
                assert [t.index for t in returned] == list(range(first, first + size))
                state.completed += size
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    def one_read(rng: random.Random, session: str, use_async: bool, loop: asyncio.AbstractEventLoop | None) -> None:
        state = progress[session]
        low = state.completed
        if rng.random() < 0.1:
            result = cache.turns(session)
            high = state.started
            indexes = [t.index for t in result]
            problem = check_turns(result)
            if problem is None and not any(indexes == list(range(max(0, c - CAP), c)) for c in range(low, high + 1)):
                problem = f"turns() {indexes} is no snapshot with {low}..{high} turns appended"
            tally.record(problem)
            return
        call = random_call(rng)
        sign, max_turns, max_tokens, recent = call
        query = None if sign is None else f"query {sign}"
        if use_async:
            assert loop is not None
            result = loop.run_until_complete(
                cache.awindow(session, query, max_turns=max_turns, max_tokens=max_tokens, recent=recent)
            )
        else:
            result = cache.window(session, query, max_turns=max_turns, max_tokens=max_tokens, recent=recent)
        high = state.started
        tally.record(check_window(result, low, high, call))

    def reader(seed: int, use_async: bool) -> None:
        rng = random.Random(seed)
        loop = asyncio.new_event_loop() if use_async else None
        try:
            while not stop.is_set():
                one_read(rng, rng.choice(sessions), use_async, loop)
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)
        finally:
            if loop is not None:
                loop.close()

    threads = [threading.Thread(target=writer, args=(s, i)) for i, s in enumerate(sessions)]
    threads += [threading.Thread(target=reader, args=(100 + r, False)) for r in range(READERS)]
    threads.append(threading.Thread(target=reader, args=(999, True)))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: more interleavings per second
    try:
        for t in threads:
            t.start()
        time.sleep(DURATION_S)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
    assert all(not t.is_alive() for t in threads), "a thread did not finish"
    # After the run, the sequential model holds exactly: the last CAP turns of every session.
    for session in sessions:
        total = progress[session].completed
        assert [t.index for t in cache.turns(session)] == list(range(max(0, total - CAP), total))
    stats = cache.stats()
    assert stats.turns == sum(min(CAP, p.completed) for p in progress.values())
    assert stats.dropped_turns == sum(max(0, p.completed - CAP) for p in progress.values())
    return tally


def _assert_consistent(device: str) -> None:
    started = time.perf_counter()
    tally = run_stress(device)
    elapsed = time.perf_counter() - started
    print(f"\n[{device}] checked {tally.checked} windows in {elapsed:.1f} s, {tally.failed} inconsistent")
    assert tally.checked >= MIN_WINDOWS, f"only {tally.checked} windows checked; the machine was too busy"
    assert tally.failed == 0, (
        f"{tally.failed} of {tally.checked} windows were inconsistent; first: {tally.examples[:3]}"
    )


def test_model_is_self_consistent() -> None:
    """The sequential model agrees with a quiet cache (so a stress failure is the cache's, not the model's)."""
    cache = ContextCache(
        IndexEmbedder(),  # type: ignore[arg-type]
        max_turns_per_session=CAP,
        ttl_seconds=None,
        token_counter=lambda text: len(text.split()),
    )
    rng = random.Random(7)
    for count in range(1, 40):
        cache.append("q", turn_role(count - 1), turn_text(count - 1))
        for _ in range(20):
            call = random_call(rng)
            sign = call[0]
            query = None if sign is None else f"query {sign}"
            got = cache.window("q", query, max_turns=call[1], max_tokens=call[2], recent=call[3])
            assert [t.index for t in got] == expected_window(count, *call), (count, call)
            assert check_turns(got) is None


class _InterleavingQuery:
    """A query vector whose move to the device first runs ``action``: it opens the moment between a
    window's snapshot (under the lock) and its scoring (outside it), deterministically."""

    def __init__(self, vector: Any, action: Any) -> None:
        self.vector = vector
        self.action = action

    def to(self, device: Any) -> Any:
        self.action()
        return self.vector.to(device)


class _HookEmbedder(IndexEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.hook: Any = None

    def embed_tensor(self, texts: Sequence[str]) -> Any:
        out = super().embed_tensor(texts)
        if self.hook is not None and texts[0].startswith("query "):
            return [_InterleavingQuery(out[0], self.hook)]
        return out


@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("max_turns", [4, 6, 9])
def test_append_between_snapshot_and_scoring_does_not_change_the_window(sign: int, max_turns: int) -> None:
    """The old race, made deterministic: appends that evict turns land after the window took its
    snapshot but before it scored it. The window must still be the snapshot's."""
    embedder = _HookEmbedder()
    cache = ContextCache(
        embedder,  # type: ignore[arg-type]
        max_turns_per_session=CAP,
        ttl_seconds=None,
        token_counter=lambda text: len(text.split()),
    )
    count = 20
    for i in range(count):
        cache.append("h", turn_role(i), turn_text(i))

    def interleave() -> None:
        embedder.hook = None
        for i in range(count, count + 3):
            cache.append("h", turn_role(i), turn_text(i))

    embedder.hook = interleave
    got = cache.window("h", f"query {sign}", max_turns=max_turns)
    assert embedder.hook is None, "the interleaved appends did not run"
    assert [t.index for t in got] == expected_window(count, sign, max_turns, None, None)
    assert check_turns(got) is None
    # The appends themselves landed: the next window sees them.
    after = cache.window("h", f"query {sign}", max_turns=max_turns)
    assert [t.index for t in after] == expected_window(count + 3, sign, max_turns, None, None)


def test_windows_are_snapshot_consistent_under_concurrent_appends() -> None:
    _assert_consistent("cpu")


@pytest.mark.gpu
def test_windows_are_snapshot_consistent_on_cuda() -> None:
    _assert_consistent("cuda")
