"""Window selection for sessions that hold tool calls: an assistant turn that calls tools and the
tool results that answer it form one unit, which a window takes or drops whole.

A chat API refuses a tool result whose call is not in the messages before it, and a call whose
results are missing leaves the model answering a question it never saw answered; so a window never
splits a unit. Sessions without any tool turn never come here: ``ContextCache._select`` keeps its
one-turn-per-unit path for them (the same turns, in the same order, as before tool turns existed).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuprompt.context._types import Turn

__all__ = ["replayable", "select_units", "tool_units"]


def tool_units(turns: Sequence[Turn]) -> list[list[int]]:
    """Partition ``turns`` (a session's live turns, oldest first) into units of positions.

    Every turn but a tool result is the head of its own unit. A tool result joins the unit of the
    latest earlier assistant turn holding a call with its ``tool_call_id``; one without an id joins
    the call turn directly before its run of tool results. A tool result that finds no call (its call
    was dropped by the turn cap, or never stored) is in no unit: windows never return it.

    Returns:
        The units in the order of their first turn, each its positions in ascending order.
    """
    units: list[list[int]] = []
    by_id: dict[str, list[int]] = {}
    current: list[int] | None = None  # the call turn a run of tool results follows
    for i, turn in enumerate(turns):
        if turn.role == "tool":
            unit = current if turn.tool_call_id is None else by_id.get(turn.tool_call_id)
            if unit is not None:
                unit.append(i)
            continue
        unit = [i]
        units.append(unit)
        current = unit if turn.tool_calls else None
        for call in turn.tool_calls:
            by_id[call.id] = unit
    return units


def replayable(turns: Sequence[Turn]) -> list[Turn]:
    """``turns`` (a session's live turns, oldest first) without the tool results at their head: the
    turn cap drops the oldest turns one by one, so it can drop a call and keep its results, which a
    chat API refuses when the conversation is replayed. A tool result later on is the caller's, and
    is kept."""
    head = 0
    while head < len(turns) and turns[head].role == "tool":
        head += 1
    return list(turns[head:])


def select_units(
    turns: Sequence[Turn],
    units: list[list[int]],
    scores: list[float] | None,
    max_turns: int,
    max_tokens: int | None,
    recent: int | None,
) -> list[int]:
    """The positions of the turns a window returns, ascending: ``ContextCache.window``'s rules over
    units instead of turns.

    The latest units whose turns fit ``recent`` come first (stopping at the first that does not
    fit); then, with ``scores`` (each turn's similarity to the query), the other units from the most
    relevant (a unit scores as its best turn), each taken when it fits what is left of
    ``max_turns``; without scores, the next latest units while they fit. Under ``max_tokens`` the
    least relevant older units go first, then the oldest recent ones. With one-turn units this is
    the same choice as the plain path.

    Args:
        turns: the session's live turns, oldest first.
        units: :func:`tool_units` of ``turns``.
        scores: per-turn similarity to the query, or None without a query.
        max_turns: most turns returned.
        max_tokens: most tokens returned, or None.
        recent: latest turns considered first (None: half of ``max_turns`` with a query, else all).
    """
    if recent is None:
        recent = max_turns // 2 if scores is not None else max_turns
    recent = min(recent, max_turns)
    sizes = [len(unit) for unit in units]
    used, k = 0, len(units)
    recent_units: list[int] = []  # latest first
    while k > 0 and used + sizes[k - 1] <= recent:
        k -= 1
        used += sizes[k]
        recent_units.append(k)
    older: list[int] = []  # most relevant (or most recent) first
    if scores is None:
        while k > 0 and used + sizes[k - 1] <= max_turns:
            k -= 1
            used += sizes[k]
            older.append(k)
    else:
        best = [max(scores[i] for i in units[u]) for u in range(k)]
        for u in sorted(range(k), key=lambda u: -best[u]):
            if used >= max_turns:
                break
            if used + sizes[u] <= max_turns:
                used += sizes[u]
                older.append(u)
    chosen = set(older) | set(recent_units)
    if max_tokens is not None:
        cost = {u: sum(turns[i].tokens for i in units[u]) for u in chosen}
        total = sum(cost.values())
        for u in [*reversed(older), *reversed(recent_units)]:  # least relevant older, then oldest recent
            if total <= max_tokens:
                break
            chosen.discard(u)
            total -= cost[u]
    return sorted(i for u in chosen for i in units[u])
