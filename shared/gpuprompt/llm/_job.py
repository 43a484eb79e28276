"""One in-flight generation: the channel between a backend (producer) and its caller (consumer).

A backend pushes text pieces and one terminal event from any thread; the caller reads them with a
blocking ``next_event`` (sync callers) or ``anext_event`` (async callers, without blocking their
loop). A job ends exactly once: finished, failed or aborted.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuprompt.llm._chat import Prepared
from gpuprompt.llm._tool_format import ToolOutputParser
from gpuprompt.llm._tools import ToolCallDelta
from gpuprompt.llm._types import GenerationResult, Timings, Usage

__all__ = ["End", "Failure", "Job", "Text"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Text:
    """New generated text (prose, when tools are in play) and new tool-call pieces."""

    text: str
    tool_calls: tuple[ToolCallDelta, ...] = ()


@dataclass(frozen=True)
class End:
    """The job finished (``"stop"``, ``"length"``, ``"tool_calls"`` or ``"abort"``)."""

    result: GenerationResult


@dataclass(frozen=True)
class Failure:
    """The job failed."""

    error: BaseException


Event = Text | End | Failure


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)



class StopScanner:
    """Finds the first stop string in a text that grows at its end, searching each part once.

    ``hold`` is how many trailing characters could still be the start of a stop string: a
    streamer hands out text only up to ``len(text) - hold`` until the end.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self._searched = 0

    def match(self, text: str) -> tuple[int, str] | None:
        """The stop string that ends first in ``text`` (the grown text), ties to the earlier one
        in the list, and where it begins; None when none ends in the part not searched before
        (vLLM's rule, so both backends stop at the same place)."""
        if not self.stops:
            return None
        searched, self._searched = self._searched, len(text)
        best: tuple[int, str] | None = None
        for stop in self.stops:
            at = text.find(stop, max(0, searched - len(stop) + 1))
            if at >= 0 and (best is None or at + len(stop) < best[0] + len(best[1])):
                best = (at, stop)
        return best

    def skip(self, text: str) -> None:
        """Take ``text`` (the grown text) as searched without looking in it: a later :meth:`match`
        finds only stop strings that end after it (as vLLM before ``min_tokens``)."""
        self._searched = len(text)


class Job:
    """One request's life in a backend and its event channel.

    Args:
        prepared: the tokenized, fitted request.
        model: the engine's model name (copied into the result).
        on_end: called once with the terminal event, from the producer's thread (the engine's
            counters).
    """

    def __init__(self, prepared: Prepared, model: str, on_end: Callable[[Job, End | Failure], None]) -> None:
        self.prepared = prepared
        self.model = model
        self.submitted_at = time.monotonic()
        self.started_at: float | None = None
        self.first_token_at: float | None = None
        self.cancelled = threading.Event()
        self._on_end = on_end
        self._cond = threading.Condition()
        self._events: deque[Event] = deque()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None
        self._pieces: list[str] = []
        self._ended = False
        self._cancel_hook: Callable[[], None] | None = None
        # With tools in play the model's raw text is parsed into prose and tool calls as it comes.
        plan = prepared.tool_plan
        self._parser = ToolOutputParser(plan) if plan is not None and plan.kind != "off" else None
        # Stop strings of a parsed reply apply to its prose (the answer the user reads), not to the
        # raw text (call or wrapper JSON): the job checks them itself, holding back the prose that
        # could still begin one, and asks the backend to end the row when one is met.
        self._stops = StopScanner(tuple(prepared.request.stop) if self._parser is not None else ())
        self._prose = ""  # the parser's prose, cut at the first stop string once met
        self._sent = 0  # characters of _prose handed out
        self._stop_hit = False
        self._stop_reason: int | str | None = None  # the prose's stop string, once met
        self.backend_state: Any = None  # whatever the backend needs to find this job again

    def __repr__(self) -> str:
        state = "ended" if self._ended else ("cancelled" if self.cancelled.is_set() else "open")
        return f"<Job {self.request_id} {state} prompt_tokens={self.prepared.prompt_tokens}>"

    @property
    def request_id(self) -> str:
        """The request's id."""
        return self.prepared.request_id

    @property
    def ended(self) -> bool:
        """Whether the terminal event was pushed."""
        return self._ended

    @property
    def backend_stops(self) -> tuple[str, ...]:
        """The stop strings the backend must match in the raw text: the request's, unless the job
        matches them itself in the parsed prose (a reply with tools)."""
        return () if self._parser is not None else tuple(self.prepared.request.stop)

    @property
    def stop_requested(self) -> bool:
        """A stop string was met in the parsed prose: the backend should end this row (``"stop"``)."""
        return self._stop_hit

    # ------------------------------------------------------------------ producer side
    def mark_started(self, at: float | None = None) -> None:
        """The backend began computing this job (ends its queue wait)."""
        if self.started_at is None:
            self.started_at = time.monotonic() if at is None else at

    def mark_first_token(self, at: float | None = None) -> None:
        """The first new token exists (text may still be held back for stop strings)."""
        if self.first_token_at is None:
            self.first_token_at = time.monotonic() if at is None else at
            if self.started_at is None:
                self.started_at = self.first_token_at

    def push_text(self, text: str) -> None:
        """Deliver new text to the caller."""
        if not text:
            return
        hook = None
        with self._cond:
            if self._ended or self._stop_hit:
                return
            self._pieces.append(text)
            if self._parser is None:
                self._post(Text(text))
                return
            prose, calls = self._parser.feed(text)
            prose = self._cut(prose, final=False)
            if prose or calls:
                self._post(Text(prose, calls))
            if self._stop_hit:
                hook = self._cancel_hook
        if hook is not None:
            hook()  # a backend that cannot end the row itself aborts it; finish() then says "stop"

    def _cut(self, prose: str, *, final: bool) -> str:
        """The prose that can be handed out now: cut at the first stop string, and (until the end)
        without the tail that could still begin one. Called with self._cond held."""
        if not self._stops.stops:
            return prose
        if not self._stop_hit:
            self._prose += prose
            hit = self._stops.match(self._prose)
            if hit is not None:
                self._prose = self._prose[: hit[0]]
                self._stop_hit, self._stop_reason = True, hit[1]
        safe = len(self._prose) if (final or self._stop_hit) else max(0, len(self._prose) - self._stops.hold)
        new = self._prose[self._sent : safe] if safe > self._sent else ""
        self._sent = max(self._sent, safe)
        return new

    def finish(self, finish_reason: str, completion_tokens: int, cached_tokens: int = 0,
               stop_reason: int | str | None = None) -> bool:
        """End the job with a result; False when it had already ended.

        Args:
            finish_reason: ``"stop"``, ``"length"`` or ``"abort"`` (a reply of tool calls becomes
                ``"tool_calls"`` here).
            completion_tokens: tokens generated.
            cached_tokens: prompt tokens the prefix cache served.
            stop_reason: the stop token id or stop string that ended a ``"stop"`` reply (None for
                the end-of-sequence token).
        """
        with self._cond:
            if self._ended:
                return False
            text, tool_calls = "".join(self._pieces), ()
            if self._parser is not None:
                # A call the token limit cut short comes back with its partial arguments, as OpenAI's.
                prose, calls = ("", ()) if self._stop_hit else self._parser.finish(cut=finish_reason == "length")
                prose = self._cut(prose, final=True)
                if self._stop_hit:  # the row ended (or was aborted) at a stop string in the prose
                    finish_reason, stop_reason = "stop", self._stop_reason
                if prose or calls:
                    self._post(Text(prose, calls))
                text = self._prose if self._stops.stops else self._parser.text
                tool_calls = tuple(self._parser.calls)
                if not tool_calls and not text.strip() and finish_reason != "abort":
                    logger.debug("request %s: a reply with tools held neither prose nor a tool call "
                                 "(finish_reason %s); the model wrote %r", self.request_id, finish_reason,
                                 "".join(self._pieces))
                # "length" (the token limit) and "abort" stay: OpenAI says "tool_calls" only when
                # the model ended its reply with calls.
                if tool_calls and finish_reason not in ("abort", "length"):
                    finish_reason = "tool_calls"
            now = time.monotonic()
            started = self.started_at if self.started_at is not None else now
            first = self.first_token_at if self.first_token_at is not None else now
            prompt_tokens = self.prepared.prompt_tokens
            result = GenerationResult(
                text=text,
                finish_reason=finish_reason,
                usage=Usage(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens, cached_tokens),
                timings=Timings(
                    queued_s=max(0.0, started - self.submitted_at),
                    ttft_s=max(0.0, first - self.submitted_at),
                    total_s=max(0.0, now - self.submitted_at),
                ),
                model=self.model,
                request_id=self.request_id,
                tool_calls=tool_calls,
                stop_reason=stop_reason if finish_reason == "stop" else None,
            )
            event = End(result)
            self._ended = True
            self._post(event)
        self._on_end(self, event)
        return True

    def fail(self, error: BaseException) -> bool:
        """End the job with an error; False when it had already ended."""
        with self._cond:
            if self._ended:
                return False
            event = Failure(error)
            self._ended = True
            self._post(event)
        self._on_end(self, event)
        return True

    def _post(self, event: Event) -> None:
        # Called with self._cond held.
        self._events.append(event)
        self._cond.notify_all()
        waiter = self._waiter
        if waiter is not None:
            loop, future = waiter
            try:
                loop.call_soon_threadsafe(_wake, future)
            except RuntimeError:  # the caller's loop is closed: nobody is listening any more
                pass

    def discard(self) -> bool:
        """Mark a job the backend never took as ended, silently; False when it had ended already."""
        with self._cond:
            if self._ended:
                return False
            self._ended = True
            return True

    # ------------------------------------------------------------------ consumer side
    def set_cancel_hook(self, hook: Callable[[], None]) -> None:
        """How the backend aborts this job; runs at once if the job was already cancelled."""
        self._cancel_hook = hook
        if self.cancelled.is_set() and not self._ended:
            hook()

    def cancel(self) -> None:
        """Ask the backend to abort this job (idempotent; a no-op once ended)."""
        if self._ended or self.cancelled.is_set():
            return
        self.cancelled.set()
        hook = self._cancel_hook
        if hook is not None:
            hook()

    def next_event(self, timeout: float | None = None) -> Event:
        """Block until the next event (works on any thread, needs no event loop)."""
        with self._cond:
            while not self._events:
                if not self._cond.wait(timeout):
                    raise TimeoutError(f"no event from request {self.request_id} within {timeout} s")
            return self._events.popleft()

    async def anext_event(self) -> Event:
        """Await the next event without blocking the caller's loop."""
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._events:
                    return self._events.popleft()
                future = loop.create_future()
                self._waiter = (loop, future)
            try:
                await future
            finally:
                with self._cond:
                    self._waiter = None
