"""The contract between :class:`~gpuprompt.LLMEngine` and its inference backends.

A backend receives :class:`~gpuprompt.llm._job.Job` objects already tokenized and fitted to the
context window, computes them, and reports through the job: text pieces, then exactly one
``finish`` or ``fail``. It never blocks the submitting thread on model work.
"""

from __future__ import annotations

import atexit
import logging
import sys
import weakref
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from gpuprompt.llm._config import LLMConfig
from gpuprompt.llm._job import Job
from gpuprompt.wire import EXTRA_SAMPLING

__all__ = ["ALL_SAMPLING_FIELDS", "Backend"]

ALL_SAMPLING_FIELDS: frozenset[str] = frozenset(EXTRA_SAMPLING)
"""Every optional sampling field (:data:`gpuprompt.wire.EXTRA_SAMPLING`): what a backend that
honours them all declares as its ``sampling_fields``."""

logger = logging.getLogger(__name__)


class Backend(ABC):
    """An inference backend behind :class:`~gpuprompt.LLMEngine`.

    Args:
        config: the engine's configuration.
        model_path: the resolved model folder (or hub id).
        context_window: the most prompt + new tokens per request.
        device: the resolved torch device string.
    """

    name: ClassVar[str]
    supports_structured_output: ClassVar[bool] = False
    sampling_fields: ClassVar[frozenset[str]] = frozenset()
    """The optional GenerationRequest sampling fields this backend honours (beyond temperature,
    top_p, seed and stop, which every backend honours)."""
    guided_kinds: ClassVar[frozenset[str]] = frozenset()
    """The guided-decoding kinds it honours: ``json``, ``json_object``, ``regex``, ``choice``."""

    @property
    def capabilities(self) -> dict[str, Any]:
        """What this backend honours (for profiles and docs)."""
        return {
            "backend": self.name,
            "sampling": sorted({"temperature", "top_p", "seed", "stop", "max_tokens"} | self.sampling_fields),
            "guided": sorted(self.guided_kinds),
            "tools": "json" in self.guided_kinds,
            "structured_output": self.supports_structured_output,
            "prefix_cache": False,
        }

    def check(self, prepared: Any) -> None:
        """Refuse, before it is queued, a prepared request this backend cannot run as asked (an
        invalid constraint, a token id outside the vocabulary). The default accepts everything."""

    def __init__(self, config: LLMConfig, model_path: str, context_window: int, device: str) -> None:
        self.config = config
        self.model_path = model_path
        self.context_window = context_window
        self.device = device

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.model_path!r} device={self.device!r}>"

    @abstractmethod
    def start(self) -> None:
        """Load the model and start serving (blocking). Raises on failure, leaving nothing running."""

    @abstractmethod
    def submit(self, job: Job) -> None:
        """Queue ``job``; return at once. Sets the job's cancel hook.

        Raises:
            ClosedError: the backend was closed.
            EngineDeadError: the backend died.
            QueueFullError: too many requests are waiting.
        """

    def submit_many(self, jobs: Sequence[Job], *, coalesce: bool = False) -> None:
        """Queue several jobs together (a backend that batches may form one batch of them).

        Args:
            jobs: the jobs.
            coalesce: the caller is a coroutine on a running event loop and will await its jobs:
                the backend may hold them until the end of the loop's current iteration to batch
                them with the other requests submitted in it. Never set by sync callers, whose
                thread blocks (it may be a loop thread) until their jobs end.
        """
        for job in jobs:
            self.submit(job)

    def reset_prefix_cache(self) -> bool:
        """Forget cached prompt prefixes; False when the backend keeps none."""
        return False

    @abstractmethod
    def close(self) -> None:
        """Stop serving: pending jobs fail with ``ClosedError``; release the model."""

    def close_at_exit(self) -> None:
        """Close this backend when the interpreter exits, if it is still alive then (held weakly).

        A script that never closes its engine must still exit quietly: a batch thread left
        running torch work while the interpreter tears down aborts the process (SIGABRT,
        "terminate called without an active exception"), and vLLM's output handler must stop
        before its engine core goes. Call it at the end of :meth:`start`, after the libraries'
        own exit hooks are registered, so this one runs first.
        """
        atexit.register(_close_at_exit, weakref.ref(self))


def _close_at_exit(ref: weakref.ref[Backend]) -> None:
    backend = ref()
    if backend is not None:
        try:
            _mend_closed_log_streams()
            backend.close()
        except Exception:  # noqa: BLE001 - exit must go on
            logger.debug("closing %r at exit failed", backend, exc_info=True)


def _mend_closed_log_streams() -> None:
    """Point log handlers whose stream is already closed at the process's own stderr.

    By exit time a test runner may have closed the stream a library's handler was given (pytest's
    capture file): vLLM's shutdown lines would each print "--- Logging error --- ValueError: I/O
    operation on closed file" with a traceback. They go to stderr, as in a plain script.
    """
    if sys.__stderr__ is None or sys.__stderr__.closed:
        return
    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values()
                                      if isinstance(v, logging.Logger))]
    for log in loggers:
        for handler in log.handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "closed", False):
                with handler.lock:  # not setStream: it flushes the closed stream first
                    handler.stream = sys.__stderr__
