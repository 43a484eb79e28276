"""The gpuprompt exception tree: every error the library raises on purpose.

Each message says what was wrong, what was got, and how to fix it. The tree::

    GPUPromptError
    ├── InvalidInputError (ValueError)         bad argument to a call; nothing stored changed
    │   ├── InputTypeError (TypeError)         an item of the wrong type (None, bytes, bare str, ...)
    │   ├── DimensionMismatchError             vector of the wrong dimension
    │   ├── FilterError                        malformed metadata filter (names the path in it)
    │   ├── EmbedderMismatchError              vectors of another embedder than an index's (or session's)
    │   ├── UnsupportedFeatureError            a request field the backend cannot honour (names the field)
    │   └── ContextLengthError                 prompt longer than the model's context window
    ├── ConfigurationError (ValueError)        bad constructor / config option
    ├── DependencyError (ImportError)          optional package missing (names the install command)
    ├── ModelLoadError                         a model could not be found, converted or loaded
    │   └── QualityError                       a quantised model fell under its quality guard (names the figures)
    ├── QueueFullError                         backpressure: a bounded queue is full, retry later
    ├── RequestTimeoutError (TimeoutError)     a request took longer than its timeout; it was aborted
    ├── ClosedError                            the batcher / engine / runtime was closed
    ├── EngineError                            the inference backend failed
    │   ├── EngineDeadError                    the backend died; every pending request gets this
    │   └── SessionStoreError                  the session store (Redis) failed, was unreachable or timed out
    ├── DeviceOutOfMemoryError                 the accelerator ran out of memory, even after splitting
    ├── SnapshotError                          a saved snapshot is missing, truncated or tampered with
    └── StorageError (OSError)                 the file system refused to read or write a path

Backend exceptions are mapped into this tree at the boundary, with ``raise ... from exc``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ClosedError",
    "ConfigurationError",
    "ContextLengthError",
    "DependencyError",
    "DeviceOutOfMemoryError",
    "DimensionMismatchError",
    "EmbedderMismatchError",
    "EngineDeadError",
    "EngineError",
    "FilterError",
    "GPUPromptError",
    "InputTypeError",
    "InvalidInputError",
    "ModelLoadError",
    "QualityError",
    "QueueFullError",
    "RequestTimeoutError",
    "SessionStoreError",
    "SnapshotError",
    "StorageError",
    "UnsupportedFeatureError",
    "VectorStoreError",
    "describe",
]


def describe(value: Any) -> str:
    """Render ``value`` for an error message: a short repr plus its type name.

    Bounded in depth and length (``reprlib``), so describing a hostile value (nested 10,000 deep,
    cyclic, huge) never fails or recurses deeply itself.
    """
    try:
        text = _REPR.repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__} object>"
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} that is a {type(value).__name__}"


def _short_repr() -> Any:
    import reprlib

    short = reprlib.Repr()
    short.maxlevel = 3
    short.maxstring = 60
    short.maxother = 60
    short.maxlong = 40
    short.maxdict = short.maxlist = short.maxtuple = short.maxset = 6
    return short


_REPR = _short_repr()


class GPUPromptError(Exception):
    """Base class of every error gpuprompt raises on purpose."""


class InvalidInputError(GPUPromptError, ValueError):
    """An argument to a call was invalid. Nothing already stored was changed."""


class InputTypeError(InvalidInputError, TypeError):
    """An argument (or one item of it) had the wrong type."""


class DimensionMismatchError(InvalidInputError):
    """A vector's dimension differs from the index's or model's dimension."""

    def __init__(self, message: str, *, expected: int | None = None, got: int | None = None):
        super().__init__(message)
        self.expected = expected
        self.got = got


class FilterError(InvalidInputError):
    """A metadata filter is malformed; ``path`` says where inside the filter."""

    def __init__(self, message: str, *, path: str = "$"):
        super().__init__(f"{message} (at filter path {path})")
        self.path = path


class ContextLengthError(InvalidInputError):
    """A prompt does not fit in the model's context window."""

    def __init__(self, message: str, *, prompt_tokens: int, max_context: int):
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.max_context = max_context


class ConfigurationError(GPUPromptError, ValueError):
    """A constructor argument or configuration value is invalid."""


class DependencyError(GPUPromptError, ImportError):
    """An optional dependency is missing; the message names the install command."""


class ModelLoadError(GPUPromptError):
    """A model could not be located, converted or loaded."""


class EmbedderMismatchError(InvalidInputError):
    """Vectors from one embedder were added to an index that holds another embedder's vectors.

    Vectors of two models (or of one model at two precisions) do not share a space: mixing them
    silently ranks wrong. Pass ``allow_other_embedder=True`` when mixing is intended.

    Attributes:
        expected: the embedder recorded by the index.
        got: the embedder of the rejected vectors.
    """

    def __init__(self, message: str, *, expected: str | None = None, got: str | None = None):
        super().__init__(message)
        self.expected = expected
        self.got = got


class UnsupportedFeatureError(InvalidInputError):
    """A request asked for something the chosen backend cannot honour (a sampling field, a kind
    of guided decoding). It is refused, never silently ignored.

    Attributes:
        field: the name of the request field that cannot be honoured.
        backend: the backend's name.
    """

    def __init__(self, message: str, *, field: str | None = None, backend: str | None = None):
        super().__init__(message)
        self.field = field
        self.backend = backend


class QualityError(ModelLoadError):
    """A quantised model fell under its quality guard; it was not loaded.

    Attributes:
        report: the guard's figures (a ``gpuprompt.embed.QualityReport``), or None.
        failed: each figure under its floor, as ``"name value < floor"``.
    """

    def __init__(self, message: str, *, report: Any = None, failed: list[str] | None = None):
        super().__init__(message)
        self.report = report
        self.failed = list(failed or [])


class QueueFullError(GPUPromptError):
    """A bounded request queue is full. Retry later or raise ``max_queue``.

    Attributes:
        retry_after: seconds the server asked the caller to wait before retrying (its
            ``Retry-After`` header) when the queue was a remote one; None when unknown.
    """

    def __init__(self, *args: object, retry_after: float | None = None) -> None:
        super().__init__(*args)
        self.retry_after = retry_after


class RequestTimeoutError(GPUPromptError, TimeoutError):
    """A request took longer than its ``timeout``; it was aborted (nothing keeps running for it)."""


class ClosedError(GPUPromptError):
    """The component was closed; no new work is accepted and pending work is failed."""


class EngineError(GPUPromptError):
    """The inference backend failed while serving a request."""


class EngineDeadError(EngineError):
    """The inference backend died; it cannot serve further requests."""


class SessionStoreError(EngineError):
    """The session store (Redis) failed, was unreachable or did not answer in time. A write that
    timed out may still be applied by the store later; nothing is retried, so none is applied twice."""


class VectorStoreError(EngineError):
    """The vector database (a Milvus server, cluster or Milvus Lite file) failed or could not be
    reached; the message names the address and what Milvus said."""


class DeviceOutOfMemoryError(GPUPromptError, MemoryError):
    """The accelerator ran out of memory even for the smallest batch."""


class SnapshotError(GPUPromptError):
    """A persisted snapshot is missing, truncated, tampered with or of another format."""


class StorageError(GPUPromptError, OSError):
    """The file system refused to read or write a path: no permission, a read-only or full disk.
    The message names the path and what to change; a save that failed so keeps the previous
    snapshot.

    Attributes:
        errno: the refusal's error number (``errno.EACCES``, ...), or None.
        filename: the path the file system refused.
    """

    def __init__(self, message: str, *, errno: int | None = None, filename: str | None = None) -> None:
        super().__init__(message)
        self.errno = errno
        self.filename = filename

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""  # the message, not OSError's "[Errno n] ..." form
