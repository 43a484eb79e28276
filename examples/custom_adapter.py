"""A retriever for a framework gpuprompt does not ship an adapter for, written from the public API only.

The shape is a Haystack-style component (``write_documents`` then ``run(query) -> {"documents": ...}``),
but nothing here imports Haystack: the point is what an adapter needs from gpuprompt, which is what
``langchain_gpuprompt`` and ``llamaindex_gpuprompt`` use too (docs/adapters.md walks through it):

* :func:`gpuprompt.connect` once, in the constructor: in process, or a ``gpuprompt serve`` when
  ``base_url`` (or ``GPUPROMPT_URL``) names one. Everything after that is the same code.
* the protocols of :mod:`gpuprompt.protocols` (``EmbedderLike``, ``IndexLike``, ``TextSearchLike``,
  ``HybridSearchLike``): what the runtime's objects answer, in process and remote alike.
* :mod:`gpuprompt.validation` for the boundary checks and :mod:`gpuprompt.errors` for the typed errors.
* :func:`gpuprompt.bridge.run_sync` to offer a sync method over async core calls without blocking a
  caller's event loop.

Run it: ``python examples/custom_adapter.py`` (in process), or start ``gpuprompt serve`` and run
``GPUPROMPT_URL=http://127.0.0.1:8000 python examples/custom_adapter.py`` (the documents then live
in the server's collection ``custom-adapter-demo``; this process loads no model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuprompt import connect
from gpuprompt.bridge import run_sync
from gpuprompt.errors import InputTypeError
from gpuprompt.protocols import HybridSearchLike, IndexLike, TextSearchLike
from gpuprompt.validation import check_int, check_str, check_str_list, fail

__all__ = ["Retriever"]


class Retriever:
    """Documents in, the best matches for a query out; the same class in process and remote.

    Args:
        collection: the server collection to use in remote mode (required there: a server
            collection is shared and outlives this process); ignored in process.
        base_url: a running ``gpuprompt serve``; None reads ``GPUPROMPT_URL``, else in process.
        api_key: that server's key (None reads ``GPUPROMPT_API_KEY``).
        timeout: seconds a request to the server may wait (None reads ``GPUPROMPT_TIMEOUT``).
        top_k: how many documents :meth:`run` returns by default.
        mode: ``"dense"`` (vectors), ``"lexical"`` (BM25) or ``"hybrid"`` (both, fused).
    """

    def __init__(
        self,
        *,
        collection: str = "custom-adapter-demo",
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        top_k: int = 4,
        mode: str = "dense",
    ) -> None:
        self.top_k = check_int(top_k, "top_k", min=1)
        if mode not in ("dense", "lexical", "hybrid"):
            raise fail("mode", "'dense', 'lexical' or 'hybrid'", mode)
        self.mode = mode
        # The one decision between in process and remote, made by the core.
        self.runtime = connect(base_url, api_key=api_key, timeout=timeout, owner="Retriever")
        self.embedder = self.runtime.embedder()
        index: IndexLike = (
            self.runtime.index(collection=collection) if self.runtime.remote else self.runtime.index(self.embedder.dim)
        )
        self.index = index

    def write_documents(self, documents: Sequence[Mapping[str, Any]]) -> int:
        """Store ``[{"id": ..., "content": ..., "meta": {...}}, ...]`` (upsert by id); returns how many.

        Raises:
            InputTypeError: ``documents`` is not a list of dicts with a str ``content``.
        """
        if isinstance(documents, (str, bytes, Mapping)) or not isinstance(documents, Sequence):
            raise fail("documents", "a list of {'id', 'content', 'meta'} dicts", documents, error=InputTypeError)
        for position, doc in enumerate(documents):
            if not isinstance(doc, Mapping):
                raise fail(f"documents[{position}]", "a dict with 'content'", doc, error=InputTypeError)
        texts = check_str_list([doc.get("content") for doc in documents], "documents[].content")
        vectors = self.embedder.embed(texts)  # batched with every other caller of this embedder
        ids = [doc.get("id") for doc in documents]
        metas = [dict(doc.get("meta") or {}) for doc in documents]
        return len(self.index.add(ids, vectors, texts, metas, embedder=self.embedder.identity))

    async def run_async(self, query: str, *, top_k: int | None = None,
                        filters: Mapping[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
        """The ``top_k`` best documents for ``query`` under ``filters`` (gpuprompt's filter language)."""
        check_str(query, "query", allow_empty=False)
        k = self.top_k if top_k is None else check_int(top_k, "top_k", min=1)
        if self.mode != "dense":
            if not isinstance(self.index, HybridSearchLike):
                raise fail("mode", "'dense' for this index (it has no lexical leg)", self.mode)
            if self.mode == "lexical":
                hits = (await self.index.alexical_search([query], k, filter=filters))[0]
            else:
                vectors = await self.embedder.aembed([query])
                hits = (await self.index.ahybrid_search(vectors, [query], k, filter=filters))[0]
        elif isinstance(self.index, TextSearchLike):  # remote: the server embeds and searches, one request
            hits = (await self.index.asearch_text([query], k, filter=filters))[0]
        else:
            vectors = await self.embedder.aembed([query])
            hits = (await self.index.asearch(vectors, k, filter=filters))[0]
        return {"documents": [{"id": h.id, "content": h.document, "meta": h.metadata, "score": h.score}
                              for h in hits]}

    def run(self, query: str, *, top_k: int | None = None,
            filters: Mapping[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
        """Sync :meth:`run_async` (safe to call from inside a running event loop too)."""
        return run_sync(self.run_async(query, top_k=top_k, filters=filters))


def main() -> None:
    retriever = Retriever(mode="hybrid")
    retriever.write_documents([
        {"id": "p1", "content": "Aurora dress, red cotton, article SKU-48213-QX, 49 EUR.", "meta": {"type": "dress"}},
        {"id": "p2", "content": "Borealis jacket, blue wool, article SKU-11007-JA, 120 EUR.", "meta": {"type": "jacket"}},
        {"id": "p3", "content": "Returns are free within 30 days of delivery.", "meta": {"type": "policy"}},
    ])
    for question in ("Is SKU-48213-QX made of cotton?", "how do I send something back?"):
        best = retriever.run(question, top_k=1)["documents"][0]
        print(f"{question!r} -> {best['id']}: {best['content']}")


if __name__ == "__main__":
    main()
