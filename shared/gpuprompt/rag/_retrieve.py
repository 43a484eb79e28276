"""Retrieval by text: one function for every surface that searches an index with query texts
(the RAG pipeline, the server's collection query and chat), in any of three modes.

* ``"dense"``: the texts are embedded and the vectors searched (``index.asearch``).
* ``"lexical"``: the texts' words are ranked by BM25 over the stored documents
  (``index.alexical_search``); nothing is embedded.
* ``"hybrid"``: both legs under the same filter, fused (``index.ahybrid_search``): reciprocal rank
  fusion by default, weighted normalised scores with ``alpha`` (1 = dense only, 0 = lexical only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuprompt.errors import ConfigurationError, GPUPromptError, InvalidInputError, describe
from gpuprompt.index._fusion import DEFAULT_RRF_K, check_fusion

if TYPE_CHECKING:
    from gpuprompt.index import Hit

__all__ = ["MODES", "Retrieval", "asearch_texts", "check_retrieval", "lexical_capable"]

MODES = ("dense", "lexical", "hybrid")
"""The retrieval modes, in the order a request names them."""


@dataclass(frozen=True)
class Retrieval:
    """How texts are searched (checked by :func:`check_retrieval`).

    Attributes:
        mode: ``"dense"``, ``"lexical"`` or ``"hybrid"``.
        alpha: hybrid only: the dense leg's weight of a weighted fusion; None: reciprocal rank fusion.
        fusion: hybrid only: ``"rrf"`` or ``"weighted"`` (None: weighted with ``alpha``, else rrf).
        fetch_k: hybrid only: candidates each leg fetches (None: ``max(20, 4 * k)``).
        rrf_k: hybrid only: the reciprocal rank fusion constant.
    """

    mode: str = "dense"
    alpha: float | None = None
    fusion: str | None = None
    fetch_k: int | None = None
    rrf_k: int = DEFAULT_RRF_K

    def fusion_options(self) -> dict[str, Any]:
        """The keyword arguments of ``hybrid_search`` this retrieval passes."""
        return {"alpha": self.alpha, "fusion": self.fusion, "fetch_k": self.fetch_k, "rrf_k": self.rrf_k}


def check_retrieval(
    mode: Any = "dense",
    *,
    alpha: Any = None,
    fusion: Any = None,
    fetch_k: Any = None,
    rrf_k: Any = DEFAULT_RRF_K,
    error: type[GPUPromptError] = InvalidInputError,
) -> Retrieval:
    """A checked :class:`Retrieval`.

    Raises:
        InvalidInputError (or ``error``): an unknown mode; ``alpha``/``fusion``/``fetch_k`` with a
            mode other than hybrid; ``alpha`` outside [0, 1] or NaN; ``alpha`` with ``fusion="rrf"``.
    """
    if not isinstance(mode, str) or mode not in MODES:
        raise error(f"'mode' must be one of {list(MODES)} (got {describe(mode)}).")
    if mode != "hybrid":
        given = [name for name, value in (("alpha", alpha), ("fusion", fusion), ("fetch_k", fetch_k)) if value is not None]
        if given:
            raise error(f"{', '.join(repr(g) for g in given)} fuse the two legs of mode 'hybrid' (got mode {mode!r}): "
                        "drop them, or search with mode='hybrid'.")
        return Retrieval(mode)
    try:
        plan = check_fusion(1, alpha=alpha, fusion=fusion, fetch_k=fetch_k, rrf_k=rrf_k)
    except InvalidInputError as exc:
        raise error(str(exc)) from None
    return Retrieval("hybrid", plan.alpha if alpha is not None else None, fusion, fetch_k, plan.rrf_k)


def lexical_capable(index: Any, mode: str, error: type[GPUPromptError] = ConfigurationError) -> None:
    """Refuse a lexical or hybrid mode on an index without a lexical leg
    (:class:`~gpuprompt.protocols.HybridSearchLike`)."""
    if mode == "dense":
        return
    method = "alexical_search" if mode == "lexical" else "ahybrid_search"
    if not callable(getattr(index, method, None)):
        raise error(
            f"mode {mode!r} needs an index with a lexical leg (VectorIndex, MilvusIndex, RemoteIndex: "
            f"gpuprompt.protocols.HybridSearchLike), got {type(index).__name__}; use mode='dense' with it."
        )


async def asearch_texts(
    index: Any,
    embedder: Any,
    texts: Sequence[str],
    k: int,
    filter: Mapping[str, Any] | None = None,
    retrieval: Retrieval | None = None,
    *,
    priority: int = 0,
) -> list[list[Hit]]:
    """The ``k`` best records of ``index`` for each text, by ``retrieval``'s mode.

    Args:
        index: an :class:`~gpuprompt.protocols.IndexLike` (with a lexical leg for lexical and hybrid).
        embedder: embeds the texts for the dense and hybrid modes (unused for lexical).
        texts: the query texts.
        k: hits per text.
        filter: a metadata filter, a pre-filter of both legs.
        retrieval: the mode and fusion (default: dense).
        priority: the embedder's scheduling priority.

    Raises:
        ConfigurationError: a lexical or hybrid mode over an index without a lexical leg.
        InvalidInputError, FilterError: bad texts, ``k`` or filter (from the index).
    """
    retrieval = retrieval or Retrieval()
    lexical_capable(index, retrieval.mode)
    if retrieval.mode == "lexical":
        return await index.alexical_search(list(texts), k, filter)
    vectors = await embedder.aembed_tensor(list(texts), priority=priority)
    if retrieval.mode == "dense":
        return await index.asearch(vectors, k, filter=filter)
    return await index.ahybrid_search(vectors, list(texts), k, filter, **retrieval.fusion_options())
