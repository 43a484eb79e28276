"""Input validation of VectorIndex: vectors, ids, documents, metadatas, k and filters.

Each check runs before anything is queued or stored, naming the bad item; what passes is safe to store and save.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuprompt.errors import DimensionMismatchError, InputTypeError, InvalidInputError, describe
from gpuprompt.index.filters import compile_filter, filter_key
from gpuprompt.validation import check_int, check_metadata, check_number, check_str

__all__ = [
    "SQUARED_NORM_LIMIT",
    "Upsert",
    "check_filter",
    "check_id_list",
    "check_k",
    "check_lambda",
    "check_matrix",
    "check_storable",
    "check_upsert",
    "is_tensor",
    "squared_norms",
]

SQUARED_NORM_LIMIT = float(np.finfo(np.float32).max) / 4
"""The largest squared norm a vector may have under the ``"ip"`` and ``"l2"`` metrics.

Under it every inner product, squared norm and squared L2 distance of two accepted vectors is a
finite float32 (``|q - x|^2 <= (|q| + |x|)^2 <= 4 * limit``), so no score overflows or turns NaN.
Cosine scores do not depend on scale and take any finite vector.
"""

_INT_TENSORS = ("torch.int32", "torch.int64", "torch.int16", "torch.int8", "torch.uint8")


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor (without importing torch)."""
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def check_k(k: Any, name: str = "k") -> int:
    """``k`` as an int >= 1 (bools, floats and strings refused)."""
    return int(check_int(k, name, min=1))  # type: ignore[arg-type]


def check_lambda(lambda_mult: Any) -> float:
    """MMR's ``lambda_mult`` as a float in [0, 1]."""
    return float(check_number(lambda_mult, "lambda_mult", min=0.0, max=1.0))  # type: ignore[arg-type]


def check_filter(filter: Any) -> str | None:
    """The cache key of a metadata filter (None for no filter, or one that selects everything).

    Raises:
        FilterError: a malformed filter (the message names the path in it).
    """
    if filter is None:
        return None
    compile_filter(filter)
    return filter_key(filter) or None


# ---------------------------------------------------------------------------------------- vectors
def check_matrix(value: Any, name: str, *, dim: int, metric: str, allow_1d: bool) -> Any:
    """A (n, dim) float32 numpy array or torch tensor of real numbers, checked for shape and range.

    Only real numbers are taken (ints and floats; not bools, complex numbers, numeric strings
    or objects). Values must be finite once converted to float32, and under the ``"ip"`` and
    ``"l2"`` metrics each vector's squared norm at most :data:`SQUARED_NORM_LIMIT`.

    Raises:
        InputTypeError: not numbers, or numbers of the wrong kind.
        InvalidInputError: the wrong number of axes, NaN / inf, or a vector too long for the metric.
        DimensionMismatchError: rows of another dimension.
    """
    if is_tensor(value):
        tensor = value.detach()
        if not (tensor.is_floating_point() or str(tensor.dtype) in _INT_TENSORS):
            raise InputTypeError(f"'{name}' must be a tensor of real numbers (got a tensor of {tensor.dtype}).")
        if tensor.ndim == 1 and allow_1d:
            tensor = tensor.unsqueeze(0)
        _check_shape(tuple(tensor.shape), name, dim, allow_1d)
        tensor = tensor.float()
        _check_values(tensor, name, metric)
        return tensor
    if isinstance(value, (str, bytes)) or value is None:
        raise InputTypeError(f"'{name}' must be a 2-D array of numbers of shape (n, {dim}) (got {describe(value)}).")
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InputTypeError(
            f"'{name}' must be a 2-D array of numbers of shape (n, {dim}) (got {describe(value)}: {exc})."
        ) from exc
    if array.dtype.kind not in "iuf" and not (array.size == 0 and array.dtype.kind in "bO"):
        raise InputTypeError(
            f"'{name}' must be a 2-D array of numbers of shape (n, {dim}): ints or floats (got "
            f"{describe(value)}, an array of {array.dtype}); convert strings and complex values yourself."
        )
    with np.errstate(over="ignore", invalid="ignore"):
        array = array.astype(np.float32, copy=False)  # float64 beyond float32's range becomes inf: refused
    if array.ndim == 1 and allow_1d:
        array = array.reshape(1, -1)
    _check_shape(array.shape, name, dim, allow_1d)
    _check_values(array, name, metric)
    return np.ascontiguousarray(array)


def _check_values(matrix: Any, name: str, metric: str) -> None:
    """Refuse rows that are not finite, or too long for the metric (one host sync)."""
    if matrix.shape[0] == 0:
        return
    if is_tensor(matrix):
        import torch

        finite = torch.isfinite(matrix).all(dim=1)
        bad = ~finite
        if metric != "cosine":
            bad = bad | (squared_norms(matrix) > SQUARED_NORM_LIMIT)
        if not bool(bad.any()):
            return
        row = int(bad.nonzero()[0, 0])
        row_finite = bool(finite[row])
        values = matrix[row].detach().cpu().double().numpy()
    else:
        finite = np.isfinite(matrix).all(axis=1)
        bad = ~finite
        if metric != "cosine":
            bad |= squared_norms(matrix) > SQUARED_NORM_LIMIT
        if not bad.any():
            return
        row = int(np.flatnonzero(bad)[0])
        row_finite = bool(finite[row])
        values = matrix[row].astype(np.float64)
    if not row_finite:
        raise InvalidInputError(
            f"'{name}[{row}]' must be finite (got a vector with NaN or inf values, or values beyond float32's "
            "range of 3.4e38)."
        )
    raise InvalidInputError(
        f"'{name}[{row}]' must have a squared norm of at most {SQUARED_NORM_LIMIT:.3g} under metric "
        f"{metric!r}, or scores would overflow float32 (got a vector whose squared norm is "
        f"{float(np.dot(values, values)):.3g}); scale the vectors down, or use metric='cosine', which ignores scale."
    )


def _check_shape(shape: tuple[int, ...], name: str, dim: int, allow_1d: bool) -> None:
    if len(shape) != 2:
        hint = " or one vector of shape (dim,)" if allow_1d else "; wrap a single vector in a list: [vector]"
        raise InvalidInputError(f"'{name}' must be a 2-D array of shape (n, {dim}){hint} (got shape {shape}).")
    if shape[1] != dim and shape[0] != 0:
        raise DimensionMismatchError(
            f"'{name}' must have dimension {dim}, the index's (got {shape[1]}, shape {shape}); embed with "
            "the model the index was built with.",
            expected=dim,
            got=int(shape[1]),
        )


def check_storable(vectors: np.ndarray, positions: Sequence[int], backend: Any, metric: str) -> None:
    """Refuse values the backend's storage dtype cannot hold (fp16: +-65504), naming the first.

    Args:
        vectors: the rows about to be stored.
        positions: each row's index in the caller's ``vectors``, for the message.
        backend: the backend that will store them (``max_abs`` None: no limit).
        metric: the index's metric, for the message.
    """
    limit = getattr(backend, "max_abs", None)
    if limit is None:
        return
    large = np.abs(vectors).max(axis=1) > limit
    if large.any():
        raise InvalidInputError(
            f"'vectors[{positions[int(np.flatnonzero(large)[0])]}]' must hold values within +-{limit:g} to be stored "
            f"as {backend.describe()} under metric {metric!r} (got a larger one); pass "
            "dtype='float32' or 'bfloat16', or scale the vectors down."
        )


def squared_norms(matrix: Any) -> Any:
    """Row squared norms of a float32 numpy array or torch tensor, overflowing only if the result does.

    Each row is scaled by its largest absolute value before squaring, so intermediate squares of
    large values never overflow; the result is inf exactly when the squared norm exceeds float32.
    Rows holding NaN or inf give NaN or inf.
    """
    if is_tensor(matrix):
        import torch

        scale = matrix.abs().amax(dim=1, keepdim=True)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        return (matrix / scale).pow(2).sum(dim=1) * scale.squeeze(1).pow(2)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        scale = np.abs(matrix).max(axis=1, keepdims=True) if matrix.shape[1] else np.ones((matrix.shape[0], 1))
        scale = np.where(scale > 0, scale, 1).astype(np.float32)
        scaled = matrix / scale
        return np.einsum("ij,ij->i", scaled, scaled) * np.square(scale[:, 0])


# ---------------------------------------------------------------------------------------- records
@dataclass
class Upsert:
    """A checked :meth:`VectorIndex.add`: the ids as given, and the rows to store.

    Attributes:
        ids: one id per vector, in the order given (generated ones filled in): add's result.
        positions: the rows kept, ascending: each id's last occurrence (a repeated id's last wins).
        unique_ids: the kept rows' ids.
        vectors: the kept rows, ``(len(positions), dim)`` float32 numpy.
        documents: the kept rows' documents.
        metadatas: the kept rows' metadata (detached JSON copies).
    """

    ids: list[str]
    positions: list[int]
    unique_ids: list[str]
    vectors: np.ndarray
    documents: list[str | None]
    metadatas: list[dict[str, Any]]


def check_upsert(ids: Any, vectors: Any, documents: Any, metadatas: Any, *, dim: int, metric: str) -> Upsert:
    """Check every argument of :meth:`VectorIndex.add` and keep each id's last occurrence.

    Raises:
        DimensionMismatchError, InvalidInputError, InputTypeError: as :meth:`VectorIndex.add` documents.
    """
    matrix = check_matrix(vectors, "vectors", dim=dim, metric=metric, allow_1d=False)
    if is_tensor(matrix):
        matrix = matrix.cpu().numpy()
    n = matrix.shape[0]
    id_list = _ids_for_add(ids, n)
    docs = _documents(documents, n)
    metas = _metadatas(metadatas, n)
    last = {key: position for position, key in enumerate(id_list)}
    order = sorted(last.values())
    kept = matrix if len(order) == n else matrix[np.asarray(order, dtype=np.int64)]
    return Upsert(
        id_list, order, [id_list[i] for i in order], kept, [docs[i] for i in order], [metas[i] for i in order]
    )


def _is_list_like(value: Any) -> bool:
    """A sequence, or a 1-D numpy array (a 0-d array cannot be iterated)."""
    return isinstance(value, Sequence) or (isinstance(value, np.ndarray) and value.ndim == 1)


def check_id_list(ids: Any, name: str = "ids") -> list[str]:
    """A list of well-formed str ids (a bare str is refused: it is not a list)."""
    if isinstance(ids, (str, bytes)):
        raise InputTypeError(
            f"'{name}' must be a list of str (got a bare {type(ids).__name__} {ids!r}); wrap it: [{ids!r}]."
        )
    if not _is_list_like(ids):
        raise InputTypeError(f"'{name}' must be a list of str (got {describe(ids)}).")
    out = list(ids)
    for i, key in enumerate(out):
        check_str(key, f"{name}[{i}]")
    return [str(key) for key in out]


def _ids_for_add(ids: Any, n: int) -> list[str]:
    """One non-empty str id per vector; None (or None items) become fresh ``uuid4().hex`` ids."""
    if ids is None:
        return [uuid.uuid4().hex for _ in range(n)]
    if isinstance(ids, (str, bytes)) or not _is_list_like(ids):
        raise InputTypeError(f"'ids' must be None or a list of str (got {describe(ids)}).")
    out: list[str] = []
    for i, key in enumerate(ids):
        if key is None:
            out.append(uuid.uuid4().hex)
            continue
        check_str(key, f"ids[{i}]")
        if not key:
            raise InvalidInputError(f"'ids[{i}]' must be a non-empty str (got ''); pass None to generate one.")
        out.append(str(key))
    if len(out) != n:
        raise InvalidInputError(f"'ids' and 'vectors' must have the same length (got {len(out)} ids and {n} vectors).")
    return out


def _documents(documents: Any, n: int) -> list[str | None]:
    """One well-formed str or None per vector."""
    if documents is None:
        return [None] * n
    if isinstance(documents, (str, bytes)) or not isinstance(documents, Sequence):
        raise InputTypeError(f"'documents' must be None or a list of str (got {describe(documents)}).")
    if len(documents) != n:
        raise InvalidInputError(
            f"'documents' and 'vectors' must have the same length (got {len(documents)} documents and {n} vectors)."
        )
    for i, document in enumerate(documents):
        check_str(document, f"documents[{i}]", allow_none=True)
    return [None if document is None else str(document) for document in documents]


def _metadatas(metadatas: Any, n: int) -> list[dict[str, Any]]:
    """One detached JSON metadata dict per vector (None becomes ``{}``)."""
    if metadatas is None:
        return [{} for _ in range(n)]
    if isinstance(metadatas, (str, bytes, Mapping)) or not isinstance(metadatas, Sequence):
        raise InputTypeError(
            f"'metadatas' must be None or a list of dicts, one per vector (got {describe(metadatas)})."
        )
    if len(metadatas) != n:
        raise InvalidInputError(
            f"'metadatas' and 'vectors' must have the same length (got {len(metadatas)} metadatas and {n} vectors)."
        )
    # A detached JSON copy: ints within int64, finite floats, well-formed text, no cycles, at most
    # MAX_DEPTH levels; anything accepted here saves, filters and loads.
    return [check_metadata(metadata, f"metadatas[{i}]") for i, metadata in enumerate(metadatas)]
