"""How the server names and inspects its collections: the reversible Milvus collection names of
``--vector-uri``, the embedder a collection recorded, and the serve flags that make its vectors."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, TypeVar

from gpuprompt.wire import COLLECTION_NAME_PATTERN

logger = logging.getLogger("gpuprompt.server")

if TYPE_CHECKING:
    from gpuprompt.index import IndexLike

T = TypeVar("T")


__all__ = ["MILVUS_PREFIX", "milvus_collection", "recorded_embedder", "server_name"]

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
