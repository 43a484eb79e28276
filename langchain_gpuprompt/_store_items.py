"""Where the LangGraph store keeps its items: a map in this process, or a server collection (remote
mode), behind one interface; and the filters that select them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpuprompt.errors import ConfigurationError, InvalidInputError, describe
from gpuprompt.validation import (
    check_str,
    fail,
)
from langgraph.store.base import (
    Item,
    MatchCondition,
    SearchOp,
)

if TYPE_CHECKING:
    from gpuprompt.index import Hit


from langchain_gpuprompt._store_types import _Entry, _Path

_ITEM = ("ns", "key")
"""The metadata fields that identify one stored item (its namespace and key)."""


def _metadata(namespace: tuple[str, ...], key: str, value: Mapping[str, Any]) -> dict[str, Any]:
    # Namespace labels by position ("ns.0", "ns.1", ...) make a prefix an equality pre-filter.
    return {"ns": {str(i): label for i, label in enumerate(namespace)}, "key": key, "value": dict(value)}


def _core_filter(op: SearchOp) -> dict[str, Any] | None:
    clauses: list[dict[str, Any]] = [{f"ns.{i}": label} for i, label in enumerate(op.namespace_prefix)]
    for name, condition in (op.filter or {}).items():
        clauses.extend(_value_clauses(("value", name), condition))
    if not clauses:
        return None
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


def _value_clauses(path: tuple[str, ...], condition: Any) -> list[dict[str, Any]]:
    """LangGraph's filter on an item's value, in the core's language: ``{"color": "red"}`` ->
    ``{"value.color": "red"}``; operators map one to one; a nested dict matches nested fields."""
    name = ".".join(path)
    if isinstance(condition, Mapping):
        if any(str(op).startswith("$") for op in condition):
            return [{name: {op: operand}} for op, operand in condition.items()]
        if not condition:
            return [{name: {"$exists": True}}]
        return [clause for sub, value in condition.items() for clause in _value_clauses((*path, str(sub)), value)]
    if isinstance(condition, tuple):
        condition = list(condition)
    return [{name: condition}]


def _namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    pattern = tuple(condition.path)
    if len(namespace) < len(pattern):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, pattern)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(pattern))
    else:
        raise InvalidInputError(f"'match_type' must be 'prefix' or 'suffix' (got {describe(condition.match_type)}).")
    return all(wanted == "*" or label == wanted for label, wanted in pairs)


# ---------------------------------------------------------------------- the item map
# The store's semantics live in GPUPromptStore above; where the items are kept is one of these
# two maps (and the vectors are in the GPUPromptVectorStore's index, in process or a server
# collection). Both answer with _Entry objects; the store calls ``touch`` after changing an
# entry's expiry, so a remote map writes it back.

_DEFAULT_COLLECTION = "langgraph_store"
_ITEMS_SUFFIX = ".items"
_COLLECTION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,57}$"  # the server's pattern, room left for ".items"
_MAX_RECORD_ID_LENGTH = 4096  # the server's (and Milvus's) longest record id


class _LocalItems:
    """Items in process memory, by namespace then key (insertion order kept: a listing's order)."""

    def __init__(self) -> None:
        self._data: dict[tuple[str, ...], dict[str, _Entry]] = {}

    def __len__(self) -> int:
        return sum(len(keys) for keys in self._data.values())

    def get_many(self, paths: list[_Path]) -> dict[_Path, _Entry]:
        found = {}
        for namespace, key in paths:
            entry = self._data.get(namespace, {}).get(key)
            if entry is not None:
                found[(namespace, key)] = entry
        return found

    def namespaces(self) -> list[tuple[str, ...]]:
        return [ns for ns, keys in self._data.items() if keys]

    def candidates(self, core_filter: dict[str, Any] | None) -> list[_Entry]:
        from gpuprompt.index.filters import matches

        return [
            entry
            for keys in self._data.values()
            for entry in keys.values()
            if matches(core_filter, _metadata(entry.item.namespace, entry.item.key, entry.item.value))
        ]

    def expired(self, now: float) -> list[_Entry]:
        return [
            entry
            for keys in self._data.values()
            for entry in keys.values()
            if entry.expires_at is not None and entry.expires_at <= now
        ]

    def apply(self, changes: list[tuple[_Path, _Entry | None]]) -> None:
        for (namespace, key), entry in changes:  # in order: an emptied namespace goes, a new one comes last
            if entry is not None:
                self._data.setdefault(namespace, {})[key] = entry
            elif key in self._data.get(namespace, {}):
                del self._data[namespace][key]
                if not self._data[namespace]:
                    del self._data[namespace]

    def touch(self, entries: list[_Entry]) -> None:
        """Nothing to do: the entries are the stored ones, changed in place."""


class _RemoteItems:
    """Items as records of a server collection (``<collection>.items``), shared by every process
    using it: id ``[namespace, key]`` as JSON, metadata the item's searchable form (as the vector
    records carry it) plus its bookkeeping, and a constant unit vector (never searched)."""

    def __init__(self, index: Any) -> None:
        self.index = index

    def __len__(self) -> int:
        return self.index.count

    def get_many(self, paths: list[_Path]) -> dict[_Path, _Entry]:
        if not paths:
            return {}
        entries = (_decode_item(record) for record in self.index.get([_item_id(path) for path in paths]))
        return {(entry.item.namespace, entry.item.key): entry for entry in entries}

    def namespaces(self) -> list[tuple[str, ...]]:
        return list(dict.fromkeys(tuple(json.loads(rid)[0]) for rid in self.index.ids()))

    def _entries(self, core_filter: dict[str, Any] | None) -> list[_Entry]:
        ids = self.index.ids(core_filter)
        return [_decode_item(record) for record in self.index.get(ids)] if ids else []

    def candidates(self, core_filter: dict[str, Any] | None) -> list[_Entry]:
        # The in-process order: namespaces by creation (a namespace emptied and filled again is
        # new), then items by creation (an item deleted and put again is new).
        return sorted(self._entries(core_filter), key=lambda entry: (entry.ns_order or 0, entry.order))

    def expired(self, now: float) -> list[_Entry]:
        return self._entries({"expires_at": {"$lte": now}})

    def apply(self, changes: list[tuple[_Path, _Entry | None]]) -> None:
        import numpy as np

        self._namespace_orders(changes)
        written = [entry for _, entry in changes if entry is not None]
        if written:
            vectors = np.zeros((len(written), self.index.dim), dtype=np.float32)
            vectors[:, 0] = 1.0
            self.index.add(
                [_item_id((entry.item.namespace, entry.item.key)) for entry in written],
                vectors,
                metadatas=[_encode_item(entry) for entry in written],
            )
        removed = [_item_id(path) for path, entry in changes if entry is None]
        if removed:
            self.index.delete(removed)

    def touch(self, entries: list[_Entry]) -> None:
        self.apply([((entry.item.namespace, entry.item.key), entry) for entry in entries])

    def _namespace_orders(self, changes: list[tuple[_Path, _Entry | None]]) -> None:
        """Give each new item its namespace's creation order: the one of the namespace's live
        items, or its own when the namespace is new (or emptied earlier in this batch)."""
        decided: dict[tuple[str, ...], int] = {}
        removed: set[str] = set()
        for path, entry in changes:
            if entry is None:
                removed.add(_item_id(path))
                continue
            namespace = path[0]
            if entry.ns_order is None and namespace not in decided:
                exact = [{f"ns.{i}": label} for i, label in enumerate(namespace)]
                exact.append({f"ns.{len(namespace)}": {"$exists": False}})
                live = [rid for rid in self.index.ids({"$and": exact}) if rid not in removed]
                records = self.index.get(live[:1]) if live else []
                if records:
                    decided[namespace] = _decode_item(records[0]).ns_order or 0
            if entry.ns_order is None:
                entry.ns_order = decided.setdefault(namespace, entry.order)


def _remote_runtime(base_url: Any, api_key: Any, collection: Any, device: str, timeout: Any) -> Any:
    """The runtime of a remote store's server, or None to keep the store in process.

    As for the vector store, a store is remote when it names a server (``base_url`` / ``api_key``)
    or a collection; ``GPUPROMPT_URL`` then supplies a missing ``base_url``, but alone it keeps
    the items in process (a server collection is shared and outlives the process).
    """
    if base_url is None and api_key is None and collection is None:
        return None
    import re

    from gpuprompt.runtime import connect

    if collection is not None:
        check_str(collection, "collection", error=ConfigurationError)
        if not re.match(_COLLECTION_PATTERN, collection):
            raise fail("collection", "a collection name of 1-58 letters, digits, '.', '_' or '-', starting with a "
                       "letter or digit", collection, error=ConfigurationError)
    runtime = connect(base_url, api_key=api_key, timeout=timeout, owner="GPUPromptStore",
                      local_options={"device": (device, "auto")})
    if not runtime.remote:
        raise ConfigurationError(
            f"GPUPromptStore got collection={collection!r}, a collection of a running `gpuprompt serve`, but no "
            "server: pass base_url='http://host:port' (or set GPUPROMPT_URL), or drop collection to keep the store "
            "in process."
        )
    return runtime


def _item_id(path: _Path) -> str:
    return json.dumps([list(path[0]), path[1]])


def _hit_path(hit: Hit) -> _Path:
    namespace, key, _ = json.loads(hit.id)
    return (tuple(namespace), key)


def _check_record_ids(ids: list[str]) -> None:
    for record_id in ids:
        if len(record_id) > _MAX_RECORD_ID_LENGTH:
            raise InvalidInputError(
                f"a namespace and key must fit a server record id of {_MAX_RECORD_ID_LENGTH} characters as JSON "
                f"(got {len(record_id)}: {record_id[:80]!r}...); use a shorter key or namespace."
            )


def _encode_item(entry: _Entry) -> dict[str, Any]:
    item = entry.item
    metadata = _metadata(item.namespace, item.key, item.value)
    # The bookkeeping as one JSON text (two metadata nodes, within what _check_put left free).
    metadata["item"] = json.dumps({
        "created_at": item.created_at.isoformat(),
        "updated_at": item.updated_at.isoformat(),
        "ttl": entry.ttl_minutes,
        "record_ids": entry.record_ids,
        "order": entry.order,
        "ns_order": entry.ns_order,
    })
    if entry.expires_at is not None:
        metadata["expires_at"] = entry.expires_at
    return metadata


def _decode_item(record: Any) -> _Entry:
    metadata = record.metadata
    book = json.loads(metadata["item"])
    labels = metadata["ns"]
    item = Item(
        value=metadata["value"],
        key=metadata["key"],
        namespace=tuple(labels[str(i)] for i in range(len(labels))),
        created_at=datetime.fromisoformat(book["created_at"]),
        updated_at=datetime.fromisoformat(book["updated_at"]),
    )
    return _Entry(item=item, record_ids=list(book["record_ids"]), ttl_minutes=book["ttl"],
                  expires_at=metadata.get("expires_at"), order=int(book["order"]), ns_order=book["ns_order"])
