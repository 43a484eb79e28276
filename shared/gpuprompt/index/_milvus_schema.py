"""MilvusIndex's options, its collection schema, and the rows it writes (checked against Milvus's limits).

Nothing here imports pymilvus until a collection is opened or created.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from gpuprompt.errors import ConfigurationError, DependencyError, InvalidInputError, VectorStoreError, describe
from gpuprompt.index._milvus_filters import FOLDED_SUFFIX, SCALAR_KINDS, literal
from gpuprompt.validation import check_choice, check_int, check_number, check_str, fail

__all__ = [
    "GPU_INDEX_TYPES",
    "INDEX_TYPES",
    "LEXICAL_FIELD",
    "MilvusOptions",
    "check_rows",
    "create_collection",
    "existing_layout",
    "has_lexical",
    "open_client",
    "resolve_options",
]

INDEX_TYPES = (
    "HNSW",
    "FLAT",
    "IVF_FLAT",
    "IVF_SQ8",
    "IVF_PQ",
    "AUTOINDEX",
    "GPU_CAGRA",
    "GPU_IVF_FLAT",
    "GPU_IVF_PQ",
    "GPU_BRUTE_FORCE",
)
"""The ``index_type`` values accepted. ``GPU_*`` need a Milvus server built with GPU support (Milvus
Lite accepts the names and searches exactly); the rest run on any Milvus."""
GPU_INDEX_TYPES = tuple(name for name in INDEX_TYPES if name.startswith("GPU_"))
METRICS = {"cosine": "COSINE", "ip": "IP", "l2": "L2"}
MAX_DIM = 32_768
MAX_ID_BYTES = 4_096
MAX_VARCHAR_BYTES = 65_535
MAX_JSON_BYTES = 65_536
RESERVED = ("id", "vector", "document", "metadata")
LEXICAL_FIELD = "lexical"
_TAKEN = (*RESERVED, LEXICAL_FIELD)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")
_SCHEMES = ("http://", "https://", "tcp://", "grpc://", "unix:")
_DEFAULT_BUILD = {
    "HNSW": {"M": 16, "efConstruction": 200},
    "IVF_FLAT": {"nlist": 1024},
    "IVF_SQ8": {"nlist": 1024},
    "IVF_PQ": {"nlist": 1024, "m": 16, "nbits": 8},
    "GPU_CAGRA": {"intermediate_graph_degree": 64, "graph_degree": 32},
    "GPU_IVF_FLAT": {"nlist": 1024},
    "GPU_IVF_PQ": {"nlist": 1024, "m": 16, "nbits": 8},
}


@dataclass(frozen=True)
class MilvusOptions:
    """The checked options of one :class:`~gpuprompt.index.MilvusIndex` (see its docstring)."""

    dim: int
    metric: str = "cosine"
    uri: str = "gpuprompt_milvus.db"
    token: str = ""
    collection: str = "gpuprompt"
    index_type: str = "HNSW"
    index_params: dict[str, Any] = field(default_factory=dict)
    search_params: dict[str, Any] = field(default_factory=dict)
    scalar_fields: dict[str, str] = field(default_factory=dict)
    max_batch_size: int = 64
    max_wait_ms: float = 2.0
    max_queue: int = 10_000

    @property
    def is_lite(self) -> bool:
        """Whether ``uri`` is a local Milvus Lite file."""
        return not self.uri.startswith(_SCHEMES)

    @property
    def milvus_metric(self) -> str:
        return METRICS[self.metric]

    def build_params(self) -> dict[str, Any]:
        return {**_DEFAULT_BUILD.get(self.index_type, {}), **self.index_params}

    def search_params_for(self, limit: int) -> dict[str, Any]:
        """Search parameters for ``limit`` results (HNSW's ``ef`` and CAGRA's ``itopk_size`` >= limit)."""
        params = dict(self.search_params)
        if self.index_type == "HNSW":
            params["ef"] = max(int(params.get("ef", 64)), limit)
        elif self.index_type == "GPU_CAGRA":
            params["itopk_size"] = max(int(params.get("itopk_size", 128)), limit)
        elif self.index_type in ("IVF_FLAT", "IVF_SQ8", "IVF_PQ", "GPU_IVF_FLAT", "GPU_IVF_PQ"):
            params.setdefault("nprobe", 16)
        return {"params": params}


def resolve_options(dim: Any, options: Mapping[str, Any]) -> MilvusOptions:
    """Check every constructor option of MilvusIndex (loads nothing).

    Raises:
        ConfigurationError: an unknown option (the valid ones are listed) or a bad value, named.
    """
    known = {name for name in MilvusOptions.__dataclass_fields__ if name != "dim"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigurationError(f"unknown MilvusIndex option(s) {unknown}; valid options are {sorted(known)}.")
    err = ConfigurationError
    dim = check_int(dim, "dim", min=1, max=MAX_DIM, error=err)
    values = dict(options)
    metric = check_choice(values.get("metric", "cosine"), "metric", tuple(METRICS), error=err)
    uri = check_str(values.get("uri", "gpuprompt_milvus.db"), "uri", allow_empty=False, error=err)
    if not uri.startswith(_SCHEMES) and not uri.endswith(".db"):
        raise fail(
            "uri",
            "a Milvus Lite file ending in '.db' or a server address such as 'http://localhost:19530'",
            uri,
            error=err,
        )
    token = check_str(values.get("token", ""), "token", error=err)
    collection = check_str(values.get("collection", "gpuprompt"), "collection", error=err)
    if not _NAME.match(collection):
        raise fail("collection", "a Milvus collection name: letters, digits and '_', not starting with a digit", collection, error=err)
    index_type = check_choice(values.get("index_type", "HNSW"), "index_type", INDEX_TYPES, error=err)
    return MilvusOptions(
        dim=dim,  # type: ignore[arg-type]
        metric=metric,
        uri=uri,
        token=token,
        collection=collection,
        index_type=index_type,
        index_params=_params(values.get("index_params"), "index_params"),
        search_params=_params(values.get("search_params"), "search_params"),
        scalar_fields=_scalar_fields(values.get("scalar_fields")),
        max_batch_size=check_int(values.get("max_batch_size", 64), "max_batch_size", min=1, error=err),  # type: ignore[arg-type]
        max_wait_ms=check_number(values.get("max_wait_ms", 2.0), "max_wait_ms", min=0, max=60_000, error=err),  # type: ignore[arg-type]
        max_queue=check_int(values.get("max_queue", 10_000), "max_queue", min=1, error=err),  # type: ignore[arg-type]
    )


def _params(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise fail(name, "a dict of str to int, float or str, or None", value, error=ConfigurationError)
    for key, item in value.items():
        check_str(key, f"{name} key", allow_empty=False, error=ConfigurationError)
        if isinstance(item, bool) or not isinstance(item, (int, float, str)):
            raise fail(f"{name}[{key!r}]", "an int, float or str", item, error=ConfigurationError)
        if isinstance(item, float) and not math.isfinite(item):
            raise fail(f"{name}[{key!r}]", "a finite number", item, error=ConfigurationError)
    return dict(value)


def _scalar_fields(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise fail(
            "scalar_fields", "a dict of metadata key to kind, such as {'price': 'float'}, or None", value, error=ConfigurationError
        )
    out: dict[str, str] = {}
    for key, kind in value.items():
        if not isinstance(key, str) or not _NAME.match(key) or key in _TAKEN or key.endswith(FOLDED_SUFFIX):
            raise fail(
                "scalar_fields key",
                f"a metadata key made of letters, digits and '_' (not {list(_TAKEN)}, not ending in {FOLDED_SUFFIX!r})",
                key,
                error=ConfigurationError,
            )
        out[key] = check_choice(kind, f"scalar_fields[{key!r}]", SCALAR_KINDS, error=ConfigurationError)
    return out


# ---------------------------------------------------------------------------------------- schema
def import_pymilvus() -> Any:
    """The pymilvus module, or a DependencyError naming the install command."""
    try:
        import pymilvus
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise DependencyError("MilvusIndex needs pymilvus (and milvus-lite for a local file): "
                              "pip install 'gpuprompt[milvus]'") from exc
    return pymilvus


def open_client(uri: str, token: str = "") -> Any:
    """A ``MilvusClient`` for ``uri`` whose failures are typed (see :class:`_TypedClient`).

    Raises:
        ConfigurationError: a Milvus Lite file that cannot be opened (held by another process).
        VectorStoreError: the server cannot be reached.
    """
    pymilvus = import_pymilvus()
    if not uri.startswith(_SCHEMES):
        _quiet_lite_probes()
    with _typed(uri, "connecting"):
        return _TypedClient(pymilvus.MilvusClient(uri=uri, token=token), uri)


class _UnimplementedProbe(logging.Filter):
    """Drops gRPC's error log of an RPC the in-process Milvus Lite server does not implement.

    pymilvus probes optional methods (``AllocTimestamp`` while waiting for an index build) and falls
    back when they are missing; Milvus Lite's gRPC servicer answers UNIMPLEMENTED, which grpc logs
    at ERROR with a traceback although nothing failed. Every other gRPC log record passes.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, NotImplementedError) and "Method not implemented" in str(exc))


def _quiet_lite_probes() -> None:
    grpc_server = logging.getLogger("grpc._server")
    if not any(isinstance(f, _UnimplementedProbe) for f in grpc_server.filters):
        grpc_server.addFilter(_UnimplementedProbe())


_READS = frozenset({"search", "hybrid_search", "query", "get", "query_iterator", "search_iterator"})
"""The calls that need the collection loaded: after a Milvus server restart it comes back released."""


class _TypedClient:
    """A ``MilvusClient`` proxy: every call's pymilvus / gRPC failure becomes a gpuprompt error
    naming the address and what Milvus said (iterators it returns are wrapped the same way).

    A read refused because the collection is not loaded (a Milvus server restarted since this
    handle loaded it) loads the collection again and is retried once: without that a long-lived
    handle, such as a server's, would fail every read until its process restarted.
    """

    def __init__(self, client: Any, uri: str) -> None:
        self._client = client
        self._uri = uri

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._client, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            with _typed(self._uri, name):
                try:
                    out = target(*args, **kwargs)
                except Exception as exc:
                    collection = args[0] if args else kwargs.get("collection_name")
                    if name not in _READS or not isinstance(collection, str) or not _not_loaded(exc):
                        raise
                    self._client.load_collection(collection)
                    out = target(*args, **kwargs)
            if hasattr(out, "next") and hasattr(out, "close") and not isinstance(out, (list, dict)):
                return _TypedClient(out, self._uri)
            return out

        return call


def _not_loaded(exc: BaseException) -> bool:
    """Whether Milvus refused a read because the collection is not loaded (code 101)."""
    if not _is_milvus_failure(exc):
        return False
    code = getattr(exc, "code", None)
    text = str(getattr(exc, "message", "") or exc).lower()
    return code == 101 or "not loaded" in text or "released" in text


class _typed:
    """Translate pymilvus / gRPC failures inside the block (a context manager)."""

    def __init__(self, uri: str, operation: str) -> None:
        self.uri, self.operation = uri, operation

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if exc is None or not _is_milvus_failure(exc):
            return False
        from gpuprompt.wire import redact  # the one credential scrubber (a light module)

        where = redact(self.uri)
        said = str(getattr(exc, "message", "") or exc) or type(exc).__name__
        if not self.uri.startswith(_SCHEMES) and self.operation == "connecting":
            raise ConfigurationError(
                f"the Milvus Lite file {where!r} could not be opened ({said}). Milvus Lite locks a .db file to "
                "one process: if another process has it open, close that one, use another file, or serve the "
                "file to several processes with `milvus-lite server` and pass its http:// address."
            ) from exc
        raise VectorStoreError(
            f"Milvus at {where!r} failed while {self.operation}: {said}. Check that the Milvus server is up "
            "and reachable from here (and the collection exists), then retry."
        ) from exc


def _is_milvus_failure(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    return module.startswith(("pymilvus", "grpc", "milvus_lite"))


def create_collection(client: Any, options: MilvusOptions) -> None:
    """Create the collection: id, vector, document, metadata (JSON) and the declared scalar fields."""
    pymilvus = import_pymilvus()
    types = pymilvus.DataType
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", types.VARCHAR, is_primary=True, max_length=MAX_ID_BYTES)
    schema.add_field("vector", types.FLOAT_VECTOR, dim=options.dim)
    schema.add_field("document", types.VARCHAR, max_length=MAX_VARCHAR_BYTES, nullable=True)
    schema.add_field("metadata", types.JSON)
    kinds = {"int": types.INT64, "float": types.DOUBLE, "bool": types.BOOL}
    for name, kind in options.scalar_fields.items():
        if kind == "str":
            schema.add_field(name, types.VARCHAR, max_length=MAX_VARCHAR_BYTES, nullable=True)
            schema.add_field(name + FOLDED_SUFFIX, types.VARCHAR, max_length=MAX_VARCHAR_BYTES, nullable=True)
        else:
            schema.add_field(name, kinds[kind], nullable=True)
    schema.add_field(LEXICAL_FIELD, types.SPARSE_FLOAT_VECTOR)  # BM25 term weights (index._milvus_lexical)
    index = client.prepare_index_params()
    index.add_index(
        "vector", index_type=options.index_type, metric_type=options.milvus_metric, params=options.build_params()
    )
    index.add_index(LEXICAL_FIELD, index_type="SPARSE_INVERTED_INDEX", metric_type="IP")
    client.create_collection(options.collection, schema=schema, index_params=index, consistency_level="Strong")


def existing_layout(client: Any, collection: str) -> tuple[int, str, str, dict[str, str]]:
    """``(dim, metric, index_type, scalar_fields)`` of a collection this class created.

    Raises:
        ConfigurationError: the collection was not made by MilvusIndex (fields missing, or of
            other types).
    """
    pymilvus = import_pymilvus()
    types = pymilvus.DataType
    described = client.describe_collection(collection)
    fields = {f["name"]: f for f in described["fields"]}
    if not all(name in fields for name in RESERVED):
        raise ConfigurationError(
            f"the Milvus collection {collection!r} has fields {sorted(fields)}, not those of a MilvusIndex "
            f"({list(RESERVED)}); pass another collection= name."
        )
    wanted = {"id": types.VARCHAR, "vector": types.FLOAT_VECTOR, "document": types.VARCHAR, "metadata": types.JSON}
    other = {name: getattr(fields[name]["type"], "name", str(fields[name]["type"]))
             for name, kind in wanted.items() if fields[name]["type"] != kind}
    if other or not fields["id"].get("is_primary") or fields["id"].get("auto_id"):
        raise ConfigurationError(
            f"the Milvus collection {collection!r} has the field names of a MilvusIndex but not its layout "
            f"(a MilvusIndex has a VARCHAR primary key 'id' without auto_id, a FLOAT_VECTOR 'vector', a VARCHAR "
            f"'document' and a JSON 'metadata'; this one has {other or 'another primary key'}"
            f"{', auto_id' if fields['id'].get('auto_id') else ''}); pass another collection= name."
        )
    dim = int(fields["vector"]["params"]["dim"])
    index = _vector_index(client, collection)
    metric = {v: k for k, v in METRICS.items()}.get(str(index.get("metric_type", "")).upper(), "cosine")
    kinds = {types.VARCHAR: "str", types.INT64: "int", types.DOUBLE: "float", types.BOOL: "bool"}
    scalars = {
        name: kinds[f["type"]]
        for name, f in fields.items()
        if name not in RESERVED and not name.endswith(FOLDED_SUFFIX) and f["type"] in kinds
    }
    return dim, metric, str(index.get("index_type", "HNSW")), scalars


def _vector_index(client: Any, collection: str) -> dict[str, Any]:
    """The description of the dense field's index (a collection with a lexical leg has two)."""
    described: dict[str, Any] = {}
    for name in client.list_indexes(collection):
        described = client.describe_index(collection, name)
        if described.get("field_name", "vector") == "vector":
            return described
    return described


def has_lexical(client: Any, collection: str) -> bool:
    """Whether the collection has the sparse field of the lexical leg (collections made before it do not)."""
    return any(f["name"] == LEXICAL_FIELD for f in client.describe_collection(collection)["fields"])


# ---------------------------------------------------------------------------------------- rows
def _utf8(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def check_rows(
    ids: list[str], vectors: Any, documents: list[str | None], metadatas: list[dict[str, Any]], options: MilvusOptions
) -> list[dict[str, Any]]:
    """The Milvus rows of a checked upsert; refuses what Milvus cannot store, naming the item.

    Raises:
        InvalidInputError: an id over 4,096 bytes or holding a control character, a document over
            65,535 bytes, metadata over 65,536 bytes of JSON, or a declared scalar field holding a
            value of another kind.
    """
    rows: list[dict[str, Any]] = []
    scalar = options.scalar_fields
    for i, (key, vector, document, metadata) in enumerate(zip(ids, vectors, documents, metadatas)):
        if _utf8(key) > MAX_ID_BYTES:
            raise InvalidInputError(f"'ids[{i}]' must be at most {MAX_ID_BYTES} bytes of UTF-8 in Milvus (got {_utf8(key)}).")
        control = next((ch for ch in key if literal(ch) is None), None)  # what no id expression can spell
        if control is not None:
            raise InvalidInputError(
                f"'ids[{i}]' holds a control character (U+{ord(control):04X}), which a Milvus expression cannot "
                f"spell, so the record could never be read or deleted by id (got {key!r}); remove control "
                "characters (newlines, tabs) from ids stored in Milvus."
            )
        if document is not None and _utf8(document) > MAX_VARCHAR_BYTES:
            raise InvalidInputError(
                f"'documents[{i}]' must be at most {MAX_VARCHAR_BYTES} bytes of UTF-8 in Milvus (got "
                f"{_utf8(document)}); split long documents into chunks."
            )
        text = json.dumps(metadata, ensure_ascii=False, allow_nan=False)
        if _utf8(text) > MAX_JSON_BYTES:
            raise InvalidInputError(
                f"'metadatas[{i}]' must be at most {MAX_JSON_BYTES} bytes as JSON in Milvus (got {_utf8(text)})."
            )
        row: dict[str, Any] = {"id": key, "vector": vector.tolist(), "document": document, "metadata": metadata}
        for name, kind in scalar.items():
            value = metadata.get(name)
            row[name] = _scalar(value, kind, f"metadatas[{i}][{name!r}]")
            if kind == "str":
                row[name + FOLDED_SUFFIX] = None if value is None else value.casefold()
        rows.append(row)
    return rows


def _scalar(value: Any, kind: str, name: str) -> Any:
    if value is None:
        return None
    ok = {
        "str": isinstance(value, str) and _utf8(value) <= MAX_VARCHAR_BYTES,
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        # A float column holds ints exactly up to 2**53.
        "float": not isinstance(value, bool) and (isinstance(value, float) or (isinstance(value, int) and abs(value) <= 2**53)),
    }[kind]
    if not ok:
        raise InvalidInputError(
            f"'{name}' must be a {kind} or None: it is a declared scalar field of the Milvus collection (got "
            f"{describe(value)}); store it under another key, or declare the field with its kind."
        )
    return float(value) if kind == "float" else value
