"""Timeouts and retries for LLM calls: one policy, shared by every surface.

The engine applies it; the LangChain chat model, the LlamaIndex LLM and the server only pass
their settings through, so a timeout means the same thing (the request is aborted in the
backend) and a retry the same thing (only back-pressure and transient engine errors, with
exponential backoff; a dead engine or bad input is never retried) everywhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from gpuprompt.errors import (
    ClosedError,
    ConfigurationError,
    EngineDeadError,
    EngineError,
    InvalidInputError,
    QueueFullError,
    RequestTimeoutError,
)
from gpuprompt.validation import check_int, check_number, fail

__all__ = ["CallPolicy", "check_call_policy"]

T = TypeVar("T")

MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_RETRIES = 100


MAX_RETRY_AFTER_S = 60.0
"""The longest wait a server's ``Retry-After`` can impose on one retry."""


@dataclass(frozen=True)
class CallPolicy:
    """How long one call may take and how often it is retried.

    Attributes:
        timeout: most seconds for one attempt (None: no limit). A timed-out attempt is aborted
            in the backend and raises :class:`~gpuprompt.errors.RequestTimeoutError`; it is not
            retried (the engine is busy, not failing).
        max_retries: further attempts after a ``QueueFullError`` or a transient ``EngineError``.
        backoff: seconds before the first retry; doubled for each further one.
    """

    timeout: float | None = None
    max_retries: int = 0
    backoff: float = 0.05

    def __post_init__(self) -> None:
        if self.timeout is not None:
            timeout = check_number(self.timeout, "timeout", min=0, max=MAX_TIMEOUT_S)
            if timeout == 0:
                raise fail("timeout", "a number > 0 or None", self.timeout)
            object.__setattr__(self, "timeout", timeout)
        check_int(self.max_retries, "max_retries", min=0, max=MAX_RETRIES)
        object.__setattr__(self, "backoff", check_number(self.backoff, "backoff", min=0, max=60.0))

    @property
    def trivial(self) -> bool:
        """No timeout and no retries: the call can take the direct path."""
        return self.timeout is None and self.max_retries == 0

    def _delay(self, exc: Exception, attempt: int) -> float:
        """Seconds before the next attempt: the backoff, or longer when a server said when to retry."""
        wait = self.backoff * 2**attempt
        retry_after = getattr(exc, "retry_after", None)
        if isinstance(retry_after, (int, float)) and retry_after > wait:
            wait = min(float(retry_after), MAX_RETRY_AFTER_S)
        return wait

    def run_blocking(self, call: Callable[[], T]) -> T:
        """Call ``call()`` with this policy's retries on the calling thread (no timeout: a sync
        call with a timeout goes through :func:`gpuprompt.bridge.run_sync` and :meth:`run`)."""
        for attempt in range(self.max_retries + 1):
            try:
                return call()
            except (QueueFullError, EngineError) as exc:
                if isinstance(exc, (EngineDeadError, ClosedError)) or attempt == self.max_retries:
                    raise
                time.sleep(self._delay(exc, attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    async def run(self, call: Callable[[], Awaitable[T]]) -> T:
        """Await ``call()`` under this policy."""
        for attempt in range(self.max_retries + 1):
            try:
                if self.timeout is None:
                    return await call()
                try:
                    return await asyncio.wait_for(call(), self.timeout)
                except asyncio.TimeoutError:
                    raise RequestTimeoutError(
                        f"the request took longer than timeout={self.timeout:g} s and was aborted; raise the "
                        "timeout or lower max_tokens."
                    ) from None
            except (QueueFullError, EngineError) as exc:
                if isinstance(exc, (EngineDeadError, ClosedError)) or attempt == self.max_retries:
                    raise
                await asyncio.sleep(self._delay(exc, attempt))
        raise AssertionError("unreachable")  # pragma: no cover


def check_call_policy(timeout: object, max_retries: object) -> CallPolicy:
    """A component's ``timeout`` / ``max_retries`` settings as a policy, or ``ConfigurationError``
    at construction (a value accepted there must never fail a later call)."""
    try:
        return CallPolicy(timeout=timeout, max_retries=max_retries)  # type: ignore[arg-type]
    except InvalidInputError as exc:
        raise ConfigurationError(str(exc)) from None
