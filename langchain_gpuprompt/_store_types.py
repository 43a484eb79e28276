"""The LangGraph store's entries and errors: one item with its bookkeeping, and the namespace errors
(LangGraph's ``InvalidNamespaceError`` and ours at once)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuprompt.errors import InputTypeError, InvalidInputError
from langgraph.store.base import (
    InvalidNamespaceError,
    Item,
)

if TYPE_CHECKING:
    pass


__all__ = ["NamespaceError", "NamespaceTypeError", "_Entry", "_Path"]

_Path = tuple[tuple[str, ...], str]

class NamespaceError(InvalidInputError, InvalidNamespaceError):
    """A refused namespace: gpuprompt's ``InvalidInputError`` and LangGraph's ``InvalidNamespaceError``.

    Code written against LangGraph's ``BaseStore`` contract (which documents
    ``InvalidNamespaceError``) and code catching gpuprompt errors both catch it.
    """


class NamespaceTypeError(InputTypeError, InvalidNamespaceError):
    """A namespace (or one of its labels) of the wrong type; see :class:`NamespaceError`."""


@dataclass
class _Entry:
    item: Item
    record_ids: list[str] = field(default_factory=list)
    ttl_minutes: float | None = None
    expires_at: float | None = None
    order: int = 0
    """When the item was created (ns since the epoch, plus its position in the batch): a remote
    listing's order, the insertion order of the in-process map."""
    ns_order: int | None = None
    """The ``order`` of the item that created its namespace (remote: a listing's namespace order)."""


