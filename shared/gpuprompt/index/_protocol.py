"""Checks and loading for anything :class:`~gpuprompt.protocols.IndexLike` (the protocol itself lives in
:mod:`gpuprompt.protocols`): :func:`check_index` and :func:`load_index`, which reopens whatever
``save`` wrote (a VectorIndex snapshot or a MilvusIndex pointer).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from gpuprompt.errors import ConfigurationError
from gpuprompt.protocols import IndexLike
from gpuprompt.validation import check_path, fail

__all__ = ["IndexLike", "check_index", "load_index"]

_MILVUS_POINTER = "milvus.json"


def check_index(value: Any, name: str = "index", *, allow_none: bool = False) -> IndexLike | None:
    """``value`` if it is an index (a VectorIndex, a MilvusIndex or anything satisfying :class:`IndexLike`).

    Raises:
        ConfigurationError: anything else, named.
    """
    if value is None and allow_none:
        return None
    # Looked up statically: on Python 3.11 isinstance() on a runtime Protocol reads properties,
    # and MilvusIndex.count would connect to Milvus.
    if not all(_has(value, member) for member in _MEMBERS):
        expected = "a gpuprompt.VectorIndex, a gpuprompt.MilvusIndex or another IndexLike" + (" or None" if allow_none else "")
        raise fail(name, expected, value, error=ConfigurationError)
    return value


def _has(value: Any, member: str) -> bool:
    try:
        inspect.getattr_static(value, member)
    except AttributeError:
        return False
    return True


_MEMBERS = tuple(sorted(name for name in IndexLike.__dict__ if not name.startswith("_") or name == "__len__"))


def load_index(path: str | Path, device: str = "auto", **options: Any) -> IndexLike:
    """Reopen what an index's ``save(path)`` wrote: a VectorIndex snapshot, or a MilvusIndex pointer.

    Args:
        path: the folder given to ``save``.
        device: where a VectorIndex runs (a MilvusIndex ignores it).
        **options: load options of that index class.

    Raises:
        SnapshotError: nothing loadable at ``path``.
    """
    folder = Path(check_path(path, "path"))
    if (folder / _MILVUS_POINTER).is_file():
        from gpuprompt.index._milvus import MilvusIndex

        return MilvusIndex.load(folder, device, **options)
    from gpuprompt.index._index import VectorIndex

    return VectorIndex.load(folder, device, **options)
