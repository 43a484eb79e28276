"""Grouped search: the best record of each of the ``k`` best groups (records sharing metadata values).

One over-fetch plan serves the sync and the async search; callers never write the loop again.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuprompt.errors import InputTypeError, describe
from gpuprompt.index._checks import check_k
from gpuprompt.index.filters import field_value
from gpuprompt.validation import check_str

if TYPE_CHECKING:
    from gpuprompt.protocols import IndexLike
    from gpuprompt.index._types import Hit

__all__ = ["GroupSearchMixin"]

_Plan = Generator[int, "list[Hit]", "list[Hit]"]


def _fields(group_by: Any) -> tuple[str, ...]:
    fields = (group_by,) if isinstance(group_by, str) else group_by
    if not isinstance(fields, Sequence) or isinstance(fields, (str, bytes)) or not fields:
        raise InputTypeError(f"'group_by' must be a metadata field name or a list of them (got {describe(group_by)}).")
    return tuple(check_str(field, f"group_by[{i}]", allow_empty=False) for i, field in enumerate(fields))


def _plan(k: int, fields: tuple[str, ...], size: int) -> _Plan:
    """Search for ``k`` hits, then twice as many, ... until ``k`` groups are found or nothing is left.

    Yields how many hits to ask for; is sent each answer; returns the best hit of each group.
    """
    fetch = min(k, size)
    best: list[Hit] = []
    while fetch > 0:
        hits = yield fetch
        seen: set[tuple[Any, ...]] = set()
        best = []
        for hit in hits:
            group = tuple(_key(field_value(hit.metadata, field)) for field in fields)
            if group not in seen:
                seen.add(group)
                best.append(hit)
                if len(best) == k:
                    return best
        if len(hits) < fetch or fetch >= size:
            break
        fetch = min(2 * fetch, size)
    return best


def _key(value: Any) -> Any:
    # Metadata values are JSON: lists and dicts become hashable by their canonical text.
    if isinstance(value, (list, dict)):
        import json

        return ("json", json.dumps(value, sort_keys=True))
    return (type(value).__name__, value)


class GroupSearchMixin:
    """``search_groups`` / ``asearch_groups`` for :class:`~gpuprompt.VectorIndex` (mixed into it)."""

    def search_groups(
        self: IndexLike, query: Any, k: int, *, group_by: str | Sequence[str], filter: Mapping[str, Any] | None = None
    ) -> list[Hit]:
        """The best record of each of the ``k`` best groups, best first (``query``: one vector).

        Records are grouped by the values of the ``group_by`` metadata fields (dotted names reach
        into nested dicts; a missing field is a value of its own). The index over-fetches until
        ``k`` groups are found, so an item stored as several records counts once. Milvus calls
        this a grouping search.

        Raises:
            InvalidInputError: a bad ``k``, ``group_by`` or query; FilterError: a bad filter.
        """
        plan = _plan(check_k(k), _fields(group_by), self.count)
        try:
            fetch = next(plan)
            while True:
                fetch = plan.send(self.search(query, fetch, filter=filter)[0])
        except StopIteration as done:
            return done.value

    async def asearch_groups(
        self: IndexLike, query: Any, k: int, *, group_by: str | Sequence[str], filter: Mapping[str, Any] | None = None
    ) -> list[Hit]:
        """Async :meth:`search_groups` (the searches join the batch worker's batches)."""
        plan = _plan(check_k(k), _fields(group_by), self.count)
        try:
            fetch = next(plan)
            while True:
                fetch = plan.send((await self.asearch(query, fetch, filter=filter))[0])
        except StopIteration as done:
            return done.value
