"""LangGraph ``BaseStore`` (long-term memory) with semantic search on gpuprompt's embedder and index.

Items live in memory by (namespace, key); their indexed fields are embedded by the core Embedder
and searched in the core VectorIndex, with the namespace prefix and the value filter applied as
one pre-filter in the core's filter language.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.embeddings import Embeddings
from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    ensure_embeddings,
    get_text_at_path,
    tokenize_path,
)

from gpuprompt.errors import ConfigurationError, InputTypeError, InvalidInputError, describe
from langchain_gpuprompt._embeddings import GPUPromptEmbeddings
from langchain_gpuprompt._vectorstores import GPUPromptVectorStore

if TYPE_CHECKING:
    from gpuprompt.index import Hit

__all__ = ["GPUPromptStore"]

_Path = tuple[tuple[str, ...], str]


@dataclass
class _Entry:
    item: Item
    record_ids: list[str] = field(default_factory=list)
    ttl_minutes: float | None = None
    expires_at: float | None = None


@dataclass
class _Reads:
    """A batch's reads, answered against the state before the batch's writes (as LangGraph's
    InMemoryStore does)."""

    results: list[Result]
    searches: list[tuple[int, SearchOp]]
    puts: dict[_Path, PutOp]


class GPUPromptStore(BaseStore):
    """LangGraph long-term memory store with GPU-backed semantic search.

    A drop-in for LangGraph's ``InMemoryStore``: the same namespaces, items, filters, pagination
    and batch semantics, but ``search(namespace, query=...)`` embeds with gpuprompt's batched
    Embedder (device cache included) and ranks in its VectorIndex, with the namespace prefix and
    ``filter`` applied *before* the top-k cut. Items may expire (TTL) when configured.

    Instantiate:
        .. code-block:: python

            from langchain_gpuprompt import GPUPromptStore

            store = GPUPromptStore()                                # semantic search on "$" (the whole value)
            store = GPUPromptStore(index={"fields": ["text"]})      # embed only the "text" field
            store = GPUPromptStore(ttl={"default_ttl": 60})         # items expire 60 min after last access

    Use:
        .. code-block:: python

            store.put(("users", "42", "memories"), "m1", {"text": "prefers cotton dresses"})
            store.put(("users", "42", "memories"), "m2", {"text": "lives in Oslo"})
            [item.key for item in store.search(("users", "42"), query="what fabric do they like?", limit=1)]
            # ['m1']

    With LangGraph:
        .. code-block:: python

            graph = builder.compile(store=GPUPromptStore())

    Args:
        index: semantic-search settings in LangGraph's ``IndexConfig`` shape: ``fields`` (JSON
            paths to embed, default ``["$"]``) and ``embed`` (LangChain ``Embeddings`` or an
            embedding function; default the bundled :class:`GPUPromptEmbeddings`). ``dims`` is
            accepted and checked by the index on the first put. ``False`` turns semantic search
            off (a plain key-value store).
        ttl: LangGraph ``TTLConfig``: ``default_ttl`` (minutes) and ``refresh_on_read``. Expired
            items are never returned and are removed (with their vectors) at the next operation.
        device: where the vector index lives.
        clock: the monotonic clock TTLs are measured on (seconds).
    """

    supports_ttl: bool = True

    def __init__(
        self,
        *,
        index: IndexConfig | Literal[False] | None = None,
        ttl: TTLConfig | None = None,
        device: str = "auto",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if index is not None and index is not False and not isinstance(index, Mapping):
            raise ConfigurationError(
                "'index' must be None, False or an IndexConfig dict like {'fields': ['text']} "
                f"(got {describe(index)})."
            )
        if ttl is not None and not isinstance(ttl, Mapping):
            raise ConfigurationError(
                f"'ttl' must be None or a TTLConfig dict like {{'default_ttl': 60}} (got {describe(ttl)})."
            )
        self.ttl_config = dict(ttl) if ttl is not None else None  # type: ignore[assignment]
        default_ttl = (ttl or {}).get("default_ttl")
        if default_ttl is not None and (not isinstance(default_ttl, (int, float)) or default_ttl <= 0):
            raise ConfigurationError(f"'ttl.default_ttl' must be None or minutes > 0 (got {describe(default_ttl)}).")
        self._vectors: GPUPromptVectorStore | None = None
        self._fields: list[tuple[str, Any]] = []
        if index is not False:
            config = dict(index or {})
            embed = config.get("embed")
            embeddings: Embeddings = GPUPromptEmbeddings() if embed is None else ensure_embeddings(embed)
            self._vectors = GPUPromptVectorStore(embeddings, device=device)
            fields = config.get("fields") or ["$"]
            self._fields = [(path, path if path == "$" else tokenize_path(path)) for path in fields]
        self.index_config = (  # type: ignore[assignment]
            {"fields": [path for path, _ in self._fields], "embed": self._vectors.embedding}
            if self._vectors is not None
            else None
        )
        self._clock = clock
        self._lock = threading.RLock()
        self._data: dict[tuple[str, ...], dict[str, _Entry]] = {}

    def __repr__(self) -> str:
        items = sum(len(keys) for keys in self._data.values())
        return f"<GPUPromptStore items={items} semantic={self._vectors is not None}>"

    @property
    def embeddings(self) -> Embeddings | None:
        """The embeddings used for semantic search (None when it is off)."""
        return self._vectors.embedding if self._vectors is not None else None

    # ------------------------------------------------------------------ batch API
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run get / search / put / list-namespaces operations; reads see the state before the
        batch's writes, and puts to the same item keep the last one."""
        reads = self._read(ops)
        for position, op in reads.searches:
            reads.results[position] = self._search(op)
        if reads.puts:
            self._apply(reads.puts, self._embed_puts(reads.puts))
        return reads.results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async :meth:`batch`: queries and new texts are embedded by the batched embedder and
        searched in the index off the event loop; concurrent calls share batches."""
        reads = self._read(ops)
        if reads.searches:
            found = await asyncio.gather(*(self._asearch(op) for _, op in reads.searches))
            for (position, _), result in zip(reads.searches, found):
                reads.results[position] = result
        if reads.puts:
            vectors = await self._aembed_puts(reads.puts)
            await asyncio.to_thread(self._apply, reads.puts, vectors)
        return reads.results

    def sweep_ttl(self) -> int:
        """Remove expired items (and their vectors) now; returns how many. Every operation also
        sweeps first, so calling this is only needed to free memory while the store is idle."""
        now = self._clock()
        with self._lock:
            expired = [
                (namespace, key)
                for namespace, keys in self._data.items()
                for key, entry in keys.items()
                if entry.expires_at is not None and entry.expires_at <= now
            ]
            record_ids = [rid for ns, key in expired for rid in self._data[ns][key].record_ids]
            if record_ids and self._vectors is not None:
                self._vectors.delete(record_ids)
            for namespace, key in expired:
                del self._data[namespace][key]
                if not self._data[namespace]:
                    del self._data[namespace]
        return len(expired)

    # ------------------------------------------------------------------ reads
    def _read(self, ops: Iterable[Op]) -> _Reads:
        ops = list(ops)
        for position, op in enumerate(ops):
            _check_op(op, position)
        self.sweep_ttl()
        reads = _Reads(results=[None] * len(ops), searches=[], puts={})
        with self._lock:
            for position, op in enumerate(ops):
                if isinstance(op, GetOp):
                    entry = self._data.get(tuple(op.namespace), {}).get(op.key)
                    if entry is not None and op.refresh_ttl:
                        self._refresh(entry)
                    reads.results[position] = entry.item if entry is not None else None
                elif isinstance(op, SearchOp):
                    reads.searches.append((position, op))
                elif isinstance(op, ListNamespacesOp):
                    reads.results[position] = self._list_namespaces(op)
                else:
                    reads.puts[(tuple(op.namespace), op.key)] = op
        return reads

    def _refresh(self, entry: _Entry) -> None:
        if entry.ttl_minutes is not None:
            entry.expires_at = self._clock() + entry.ttl_minutes * 60.0

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        namespaces = [ns for ns, keys in self._data.items() if keys]
        if op.match_conditions:
            namespaces = [ns for ns in namespaces if all(_namespace_matches(c, ns) for c in op.match_conditions)]
        if op.max_depth is not None:
            namespaces = sorted({ns[: op.max_depth] for ns in namespaces})
        else:
            namespaces = sorted(namespaces)
        return namespaces[op.offset : op.offset + op.limit]

    def _candidates(self, op: SearchOp, core_filter: dict[str, Any] | None) -> list[_Entry]:
        from gpuprompt.index.filters import matches

        prefix = tuple(op.namespace_prefix)
        with self._lock:
            return [
                entry
                for namespace, keys in self._data.items()
                if namespace[: len(prefix)] == prefix
                for entry in keys.values()
                if matches(core_filter, _metadata(entry.item.namespace, entry.item.key, entry.item.value))
            ]

    def _search(self, op: SearchOp) -> list[SearchItem]:
        core_filter = _core_filter(op)
        if not op.query or self._vectors is None:
            return self._listing(op, core_filter)
        need = op.offset + op.limit
        ranked: list[tuple[float, _Entry]] = []
        if need > 0:
            vectors = self._vectors._embed_query(op.query)
            index = self._vectors._ensure_index(int(vectors.shape[1]))
            k = need
            while True:
                hits = index.search(vectors, k, filter=core_filter)[0]
                ranked = self._rank(hits)
                if len(ranked) >= need or len(hits) < k:
                    break
                k *= 2
        return self._page(op, core_filter, ranked)

    async def _asearch(self, op: SearchOp) -> list[SearchItem]:
        core_filter = _core_filter(op)
        if not op.query or self._vectors is None:
            return self._listing(op, core_filter)
        need = op.offset + op.limit
        ranked: list[tuple[float, _Entry]] = []
        if need > 0:
            vectors = await self._vectors._aembed_query(op.query)
            index = self._vectors._ensure_index(int(vectors.shape[1]))
            k = need
            while True:
                hits = (await index.asearch(vectors, k, filter=core_filter))[0]
                ranked = self._rank(hits)
                if len(ranked) >= need or len(hits) < k:
                    break
                k *= 2
        return self._page(op, core_filter, ranked)

    def _rank(self, hits: list[Hit]) -> list[tuple[float, _Entry]]:
        # An item indexed on several fields has several vectors: it ranks by its best one.
        seen: set[_Path] = set()
        ranked: list[tuple[float, _Entry]] = []
        with self._lock:
            for hit in hits:
                namespace, key, _ = json.loads(hit.id)
                path = (tuple(namespace), key)
                entry = self._data.get(path[0], {}).get(key)
                if path in seen or entry is None or hit.id not in entry.record_ids:
                    continue  # a duplicate vector, or an item replaced or deleted meanwhile
                seen.add(path)
                ranked.append((float(hit.score), entry))
        return ranked

    def _page(
        self, op: SearchOp, core_filter: dict[str, Any] | None, ranked: list[tuple[float, _Entry]]
    ) -> list[SearchItem]:
        kept: list[tuple[float | None, _Entry]] = list(ranked[op.offset : op.offset + op.limit])
        if len(kept) < op.limit:
            # Matching items with nothing to embed still fill the page, unscored (as InMemoryStore).
            unscored = [entry for entry in self._candidates(op, core_filter) if not entry.record_ids]
            kept.extend((None, entry) for entry in unscored[: op.limit - len(kept)])
        return self._results(op, kept)

    def _listing(self, op: SearchOp, core_filter: dict[str, Any] | None) -> list[SearchItem]:
        entries = self._candidates(op, core_filter)[op.offset : op.offset + op.limit]
        return self._results(op, [(None, entry) for entry in entries])

    def _results(self, op: SearchOp, kept: list[tuple[float | None, _Entry]]) -> list[SearchItem]:
        if op.refresh_ttl:
            with self._lock:
                for _, entry in kept:
                    self._refresh(entry)
        return [
            SearchItem(
                namespace=entry.item.namespace,
                key=entry.item.key,
                value=entry.item.value,
                created_at=entry.item.created_at,
                updated_at=entry.item.updated_at,
                score=score,
            )
            for score, entry in kept
        ]

    # ------------------------------------------------------------------ writes
    def _texts(self, puts: dict[_Path, PutOp]) -> tuple[list[str], list[str], list[dict[str, Any]]]:
        texts: list[str] = []
        ids: list[str] = []
        metadatas: list[dict[str, Any]] = []
        if self._vectors is None:
            return texts, ids, metadatas
        for (namespace, key), op in puts.items():
            if op.value is None or op.index is False:
                continue
            paths = self._fields if op.index is None else [(p, tokenize_path(p)) for p in op.index]
            for path, tokens in paths:
                found = get_text_at_path(op.value, tokens)
                names = [path] if len(found) == 1 else [f"{path}.{i}" for i in range(len(found))]
                for name, text in zip(names, found):
                    texts.append(text)
                    ids.append(json.dumps([list(namespace), key, name]))
                    metadatas.append(_metadata(namespace, key, op.value))
        return texts, ids, metadatas

    def _embed_puts(self, puts: dict[_Path, PutOp]) -> tuple[list[str], list[str], list[dict[str, Any]], Any]:
        texts, ids, metadatas = self._texts(puts)
        vectors = self._vectors._embed_documents(texts) if texts and self._vectors is not None else None
        return texts, ids, metadatas, vectors

    async def _aembed_puts(self, puts: dict[_Path, PutOp]) -> tuple[list[str], list[str], list[dict[str, Any]], Any]:
        texts, ids, metadatas = self._texts(puts)
        vectors = await self._vectors._aembed_documents(texts) if texts and self._vectors is not None else None
        return texts, ids, metadatas, vectors

    def _apply(
        self, puts: dict[_Path, PutOp], embedded: tuple[list[str], list[str], list[dict[str, Any]], Any]
    ) -> None:
        texts, ids, metadatas, vectors = embedded
        now = datetime.now(timezone.utc)
        with self._lock:
            if vectors is not None and self._vectors is not None:
                # Added first: a rejected add (bad metadata, wrong dimension) leaves everything as it was.
                index = self._vectors._ensure_index(int(vectors.shape[1]))
                index.add(ids, vectors, documents=texts, metadatas=metadatas)
            new_ids: dict[_Path, list[str]] = {}
            for record_id in ids:
                namespace, key, _ = json.loads(record_id)
                new_ids.setdefault((tuple(namespace), key), []).append(record_id)
            stale: list[str] = []
            for path, op in puts.items():
                namespace, key = path
                old = self._data.get(namespace, {}).get(key)
                fresh = new_ids.get(path, [])
                if old is not None:
                    stale.extend(rid for rid in old.record_ids if rid not in fresh)
                if op.value is None:
                    if old is not None:
                        del self._data[namespace][key]
                        if not self._data[namespace]:
                            del self._data[namespace]
                    continue
                item = Item(
                    value=dict(op.value),
                    key=key,
                    namespace=namespace,
                    created_at=old.item.created_at if old is not None else now,
                    updated_at=now,
                )
                entry = _Entry(item=item, record_ids=fresh, ttl_minutes=op.ttl)
                self._refresh(entry)
                self._data.setdefault(namespace, {})[key] = entry
            if stale and self._vectors is not None:
                self._vectors.delete(stale)


# ---------------------------------------------------------------------- helpers
def _check_op(op: Any, position: int) -> None:
    if not isinstance(op, (GetOp, SearchOp, PutOp, ListNamespacesOp)):
        raise InputTypeError(
            f"'ops[{position}]' must be a GetOp, SearchOp, PutOp or ListNamespacesOp (got {describe(op)})."
        )
    if isinstance(op, PutOp):
        if not op.namespace or not all(isinstance(label, str) and label for label in op.namespace):
            raise InvalidInputError(
                f"'ops[{position}].namespace' must be a non-empty tuple of non-empty str "
                f"(got {describe(op.namespace)})."
            )
        if op.value is not None:
            if not isinstance(op.value, Mapping):
                raise InputTypeError(f"'ops[{position}].value' must be a dict or None (got {describe(op.value)}).")
            try:
                json.dumps(op.value)
            except (TypeError, ValueError) as exc:
                raise InvalidInputError(
                    f"'ops[{position}].value' must be JSON-serialisable (got {describe(op.value)}): {exc}."
                ) from exc
        if op.ttl is not None and (not isinstance(op.ttl, (int, float)) or op.ttl <= 0):
            raise InvalidInputError(f"'ops[{position}].ttl' must be None or minutes > 0 (got {describe(op.ttl)}).")
    if isinstance(op, SearchOp):
        for name in ("limit", "offset"):
            value = getattr(op, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidInputError(f"'ops[{position}].{name}' must be an int >= 0 (got {describe(value)}).")
        if op.query is not None and not isinstance(op.query, str):
            raise InputTypeError(f"'ops[{position}].query' must be None or a str (got {describe(op.query)}).")


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
