"""IndexConfig: the one frozen, keyword-only configuration of a :class:`~gpuprompt.VectorIndex`.

Every option is checked once, in ``__post_init__``; snapshots store it whole (``asdict``) and loads rebuild it.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpuprompt.batching import MAX_WAIT_MS_LIMIT
from gpuprompt.device import check_device
from gpuprompt.errors import ConfigurationError, EmbedderMismatchError, InvalidInputError, describe
from gpuprompt.validation import check_bool, check_choice, check_int, check_number, check_str, check_text, fail

__all__ = [
    "ANN_THRESHOLD",
    "AUTO_ANN_FACTORY",
    "BACKENDS",
    "OPTIONS",
    "IndexConfig",
    "check_option_names",
    "resolve_config",
]

Metric = Literal["cosine", "ip", "l2"]
BackendName = Literal["auto", "faiss", "torch"]

ANN_THRESHOLD = 50_000
"""``backend="auto"`` on a CPU: exact search up to this many records, a faiss HNSW index above."""

AUTO_ANN_FACTORY = "HNSW32"
"""The faiss index ``backend="auto"`` switches to above :data:`ANN_THRESHOLD` records on a CPU."""

METRICS = ("cosine", "ip", "l2")
BACKENDS = ("auto", "faiss", "torch")
_DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True, kw_only=True)
class IndexConfig:
    """Everything that configures one :class:`~gpuprompt.VectorIndex` (all but its records).

    ``VectorIndex(dim, **options)`` builds one from its keyword options;
    ``VectorIndex(config=IndexConfig(...))`` takes one directly; ``index.config`` returns the
    current one (``switch_backend`` and ``set_search_params`` replace it); a snapshot stores it.

    Backends (``backend=``):

    * ``"torch"``: exact search in one device matrix (fp16 on CUDA, fp32 elsewhere), top-k merged
      block by block so memory stays bounded at millions of vectors.
    * ``"faiss"``: any faiss ``index_factory`` string (default ``"Flat"``), on the CPU, or on a GPU
      (Flat, IVF) with a faiss GPU build. Indexes that cannot remove (HNSW) keep tombstones and are
      rebuilt when tombstones pass ``compact_fraction`` of the records. Indexes that need training
      (IVF, PQ) are searched exactly until enough records arrive, then trained.
    * ``"auto"`` (default): faiss when ``index_factory`` is given; else torch on CUDA, and on a
      CPU exact torch search up to :data:`ANN_THRESHOLD` (50,000) records -- measured here 3x
      faster than a faiss Flat index in batches of 32 -- then a faiss ``HNSW32`` index (built once
      from the stored vectors; ids, documents and metadata are kept).

    Example:
        >>> from gpuprompt.index import IndexConfig, VectorIndex
        >>> config = IndexConfig(dim=384, metric="ip", backend="faiss", index_factory="HNSW32")
        >>> VectorIndex(config=config).config.replace(ef_search=128).ef_search
        128

    Attributes:
        dim: vector dimension.
        metric: ``"cosine"``, ``"ip"`` (inner product) or ``"l2"``.
        backend: ``"auto"``, ``"faiss"`` or ``"torch"``.
        device: ``"auto"`` (cuda > mps > cpu), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``
            (the form is checked here; availability at first use).
        index_factory: a faiss ``index_factory`` string (``"Flat"``, ``"HNSW32"``,
            ``"IVF1024,Flat"``, ...); implies faiss. Parsed by faiss when the backend is built.
        ef_search: HNSW ``efSearch`` (default 64; always at least k).
        ef_construction: HNSW ``efConstruction`` when building (default 100).
        nprobe: IVF lists probed per query (default ``max(8, nlist // 128)``).
        dtype: the torch backend's storage dtype; None = fp16 on CUDA, fp32 elsewhere.
        ann_threshold: the record count above which ``"auto"`` on a CPU switches to HNSW.
        compact_fraction: rebuild an index with tombstones once they exceed this share of records.
        max_batch_size: most search requests coalesced into one backend call.
        max_wait_ms: with ``min_batch_size`` > 1, the longest the busy search worker lets a short
            queue gather after a batch (idle, it never waits).
        min_batch_size: the searches a busy worker gathers before its next batch (within
            ``max_wait_ms``); 1, the default, takes whatever queued behind the running batch.
        max_queue: most search requests waiting; more raise ``QueueFullError``.
        embedder: which embedder produced the stored vectors (an
            :attr:`~gpuprompt.Embedder.identity` such as ``"sentence-transformers/all-MiniLM-L6-v2;int8"``),
            or None while unknown. Recorded by the first :meth:`~gpuprompt.VectorIndex.add` that names
            one (or given here); vectors from another embedder are then refused with
            :class:`~gpuprompt.errors.EmbedderMismatchError`. Saved in snapshots; cleared by ``clear()``.

    Raises:
        ConfigurationError: a value of the wrong type or range, a malformed device string, or
            ``index_factory`` with ``backend="torch"``.
    """

    dim: int
    metric: Metric = "cosine"
    backend: BackendName = "auto"
    device: str = "auto"
    index_factory: str | None = None
    ef_search: int | None = None
    ef_construction: int | None = None
    nprobe: int | None = None
    dtype: str | None = None
    ann_threshold: int = ANN_THRESHOLD
    compact_fraction: float = 0.25
    max_batch_size: int = 64
    max_wait_ms: float = 2.0
    min_batch_size: int = 1
    max_queue: int = 10_000
    embedder: str | None = None

    def __post_init__(self) -> None:
        # Checked in this order so the first bad option named is the one it always was; stored
        # normalised (Python ints and floats, factory stripped) so asdict() is plain JSON.
        self._set("dim", check_int(self.dim, "dim", min=1, max=MAX_DIM, error=ConfigurationError))
        check_choice(self.metric, "metric", METRICS, error=ConfigurationError)
        check_choice(self.backend, "backend", BACKENDS, error=ConfigurationError)
        check_device(self.device)
        self._set("index_factory", _check_factory(self.index_factory))
        _check_factory_parses(self.index_factory)
        if self.index_factory is not None and self.backend == "torch":
            raise ConfigurationError("'index_factory' is a faiss option; use backend='faiss' or 'auto' with it.")
        for name in ("ef_search", "ef_construction", "nprobe"):
            self._set(name, check_int(getattr(self, name), name, min=1, allow_none=True, error=ConfigurationError))
        if self.dtype is not None:
            check_choice(self.dtype, "dtype", _DTYPES, error=ConfigurationError)
        self._set("ann_threshold", check_int(self.ann_threshold, "ann_threshold", min=0, error=ConfigurationError))
        fraction = check_number(self.compact_fraction, "compact_fraction", min=0, max=10, error=ConfigurationError)
        if fraction == 0:
            raise fail("compact_fraction", "a number in (0, 10]", self.compact_fraction, error=ConfigurationError)
        self._set("compact_fraction", fraction)
        self._set("max_batch_size", check_int(self.max_batch_size, "max_batch_size", min=1, error=ConfigurationError))
        wait = check_number(self.max_wait_ms, "max_wait_ms", min=0, max=MAX_WAIT_MS_LIMIT, error=ConfigurationError)
        self._set("max_wait_ms", wait)
        self._set("min_batch_size", check_int(self.min_batch_size, "min_batch_size", min=1, max=self.max_batch_size,
                                              error=ConfigurationError))
        self._set("max_queue", check_int(self.max_queue, "max_queue", min=1, error=ConfigurationError))
        try:
            check_embedder_name(self.embedder, allow_none=True)
        except InvalidInputError as exc:
            raise ConfigurationError(str(exc)) from None

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def replace(self, **changes: Any) -> IndexConfig:
        """A copy with some fields changed, validated like a new one.

        Raises:
            ConfigurationError: an unknown field (the message lists the valid ones) or a bad value.
        """
        check_option_names(changes, [field.name for field in dataclasses.fields(self)])
        return dataclasses.replace(self, **changes)

    @property
    def batch_options(self) -> dict[str, Any]:
        """The search queue's options, as :class:`~gpuprompt.batching.MicroBatcher` takes them."""
        return {"max_batch_size": self.max_batch_size, "max_wait_ms": self.max_wait_ms,
                "min_batch_size": self.min_batch_size, "max_queue": self.max_queue}


OPTIONS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(IndexConfig) if field.name != "dim")
"""The keyword options of :class:`VectorIndex` (and of :meth:`VectorIndex.load`): every field but ``dim``."""


def resolve_config(dim: Any, config: Any, options: Mapping[str, Any]) -> IndexConfig:
    """The config of ``VectorIndex(dim, config=..., **options)``: built from ``dim`` and the options,
    or ``config`` with the options applied (``dim``, if given too, must equal ``config.dim``).

    Raises:
        ConfigurationError: an unknown option (named, with the valid ones), a bad value, or a
            ``config`` that is not an IndexConfig or disagrees with ``dim``.
    """
    check_option_names(options, OPTIONS)
    if config is None:
        return IndexConfig(dim=dim, **options)
    if not isinstance(config, IndexConfig):
        raise fail("config", "an IndexConfig", config, error=ConfigurationError)
    if dim is not None and dim != config.dim:
        raise fail("dim", f"None or config.dim ({config.dim})", dim, fix="Pass one of them.", error=ConfigurationError)
    return dataclasses.replace(config, **options) if options else config


def check_option_names(options: Mapping[str, Any], valid: Sequence[str]) -> None:
    """Refuse the first option not in ``valid``, naming it and listing the valid ones.

    Raises:
        ConfigurationError: ``'name' must be a VectorIndex option: one of ...``, with a close match.
    """
    for name, value in options.items():
        if name not in valid:
            close = difflib.get_close_matches(str(name), valid, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigurationError(
                f"'{name}' must be a VectorIndex option: one of {', '.join(valid)} "
                f"(got {name}={describe(value)}).{hint}"
            )


def check_embedder_name(value: Any, *, allow_none: bool = False) -> str | None:
    """Check an embedder identity (a non-empty, well-formed str of at most 512 characters).

    Raises:
        InputTypeError: not a str. InvalidInputError: empty, too long or malformed.
    """
    return check_str(value, "embedder", allow_none=allow_none, allow_empty=False, max_length=512)


def check_embedder_args(embedder: Any, allow_other: Any) -> None:
    """Check :meth:`~gpuprompt.VectorIndex.add`'s ``embedder`` and ``allow_other_embedder`` arguments."""
    check_embedder_name(embedder, allow_none=True)
    check_bool(allow_other, "allow_other_embedder")


def record_embedder(config: IndexConfig, embedder: str | None, allow_other: bool) -> IndexConfig:
    """The config after an add of vectors made by ``embedder``: the record set by the first add that
    names one; an add from another embedder refused unless ``allow_other`` (the record is kept).

    Raises:
        EmbedderMismatchError: ``embedder`` differs from the recorded one and ``allow_other`` is False.
    """
    if embedder is None or embedder == config.embedder:
        return config
    if config.embedder is None:
        return dataclasses.replace(config, embedder=embedder)
    if allow_other:
        return config
    raise EmbedderMismatchError(
        f"this index holds vectors from embedder {config.embedder!r}; vectors from {embedder!r} are "
        "in another space and would rank wrongly. Embed with the index's embedder, or pass "
        "allow_other_embedder=True if mixing is intended.",
        expected=config.embedder,
        got=embedder,
    )


MAX_DIM = 65_536
"""The widest vectors accepted (embedding models stay far below; a typo must not allocate gigabytes)."""

_FACTORY_TOKEN = re.compile(
    r"(IDMap2?|L2norm|Flat|BFlat|HNSW|NSG|NNDescent|IVF|IMI|RCQ|PQ|SQ|OPQ|PCA|RR|ITQ|LSH|RFlat|Refine|RQ|LSQ|PRQ|PLSQ"
    r"|ZnLattice|Residual|Pad|CAGRA)"
)


def _check_factory_parses(index_factory: str | None) -> None:
    """Refuse a factory string that cannot be a faiss factory, at construction, without importing faiss.

    Each comma-separated part must start with one of faiss's factory words (``Flat``, ``HNSW32``,
    ``IVF1024``, ``PQ16``, ``OPQ16_64``, ``PCA64``, ``SQ8``, ``Refine(...)``, ...): a typo or a value
    from the wrong field fails where it was given (rule 10) while construction still loads nothing
    (rule 5). What only faiss can judge (``PQ16`` needs a dimension divisible by 16) is checked when
    the index is built.
    """
    if index_factory is None:
        return
    for part in index_factory.split(","):
        if not _FACTORY_TOKEN.match(part.strip()):
            raise ConfigurationError(
                f"'index_factory' must be a faiss factory string such as 'HNSW32' or 'IVF1024,Flat' (got "
                f"{index_factory!r}: {part.strip()!r} is no faiss factory component)."
            )


def _check_factory(index_factory: Any) -> str | None:
    if index_factory is not None and (not isinstance(index_factory, str) or not index_factory.strip()):
        raise fail(
            "index_factory", "None or a faiss factory string such as 'HNSW32'", index_factory, error=ConfigurationError
        )
    if index_factory is not None:
        try:
            check_text(index_factory, "index_factory")
        except InvalidInputError as exc:
            raise ConfigurationError(str(exc)) from None
    return index_factory.strip() if index_factory else None
