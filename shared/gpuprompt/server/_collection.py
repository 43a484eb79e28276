"""One collection of the server (:class:`Collection`: its index, pipeline and log), how the server
names it in Milvus (reversibly, for ``--vector-uri``), the embedder it recorded, and the serve flags
that make its vectors."""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from gpuprompt.wire import COLLECTION_NAME_PATTERN

logger = logging.getLogger("gpuprompt.server")

if TYPE_CHECKING:
    from gpuprompt.index import IndexLike
    from gpuprompt.index.durable import CollectionLog
    from gpuprompt.rag import RAGPipeline

T = TypeVar("T")


__all__ = ["MILVUS_PREFIX", "Collection", "milvus_collection", "recorded_embedder", "server_name"]

MILVUS_PREFIX = "gpuprompt_c_"
"""The prefix of the Milvus collections that hold a server's collections."""
_ESCAPES = {"_": "_u", ".": "_d", "-": "_h"}
_UNESCAPES = {v[1]: k for k, v in _ESCAPES.items()}


def milvus_collection(name: str) -> str:
    """The Milvus collection of server collection ``name`` (reversible: see :func:`server_name`)."""
    return MILVUS_PREFIX + "".join(_ESCAPES.get(c, c) for c in name)


def server_name(milvus_name: str) -> str | None:
    """The server collection held by Milvus collection ``milvus_name``; None if it holds none."""
    if not milvus_name.startswith(MILVUS_PREFIX):
        return None
    out, chars = [], iter(milvus_name[len(MILVUS_PREFIX) :])
    for c in chars:
        if c == "_":
            c = _UNESCAPES.get(next(chars, ""), "")
            if not c:
                return None
        out.append(c)
    name = "".join(out)
    return name if re.match(COLLECTION_NAME_PATTERN, name) else None



def _discard(index: IndexLike) -> None:
    """Delete a dropped collection's records where they outlive the index (Milvus), and close it."""
    drop = getattr(index, "drop", None)
    if callable(drop):
        drop()
    else:
        index.close()


def recorded_embedder(index: IndexLike) -> str | None:
    """The identity of the embedder an index recorded at its first add naming one (blocking: a
    MilvusIndex reads it from its collection's properties); None when no add named one."""
    from gpuprompt.index import IndexConfig

    config = getattr(index, "config", None)
    if isinstance(config, IndexConfig):
        return config.embedder
    recorded = getattr(index, "embedder", None)
    return recorded if isinstance(recorded, str) else None


def _serve_flags_for(identity: str) -> str:
    """The ``serve`` flags that embed like ``identity`` (``model[;int8][;unnormalized]``)."""
    model, *flags = identity.split(";")
    quantize = "--embed-quantize int8" if "int8" in flags else "without --embed-quantize"
    return f"--embedding-model {model}, {quantize}"


@dataclass
class Collection:
    """One collection: its index and its RAG pipeline (and, under a data dir, its log)."""

    name: str
    index: IndexLike
    rag: RAGPipeline | None
    """Answers its chat; None on a server with no chat model (``--chat-model none``)."""
    log: CollectionLog | None = None
    """Where its writes are logged before they are applied (None: not persisted by this server)."""
    writers: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    """Logged writes queue here, on the event loop, rather than each holding a worker thread."""

    def session_key(self, session_id: str) -> str:
        """The ContextCache key of a client's session in this collection."""
        return f"{self.name}/{session_id}"
