"""The one text splitter of gpuprompt: fixed-size character windows that end at whitespace.

Deterministic (the same text and settings always give the same chunks), so chunk ids derived from
(source, chunk number) are stable and a re-run upserts instead of duplicating.
"""

from __future__ import annotations

from gpuprompt.errors import ConfigurationError
from gpuprompt.validation import check_int, check_str

__all__ = ["DEFAULT_CHUNK_OVERLAP", "DEFAULT_CHUNK_SIZE", "check_chunking", "chunk_text"]

DEFAULT_CHUNK_SIZE = 800
"""Characters per chunk: about 200 word pieces, inside the bundled MiniLM's 256-token window."""

DEFAULT_CHUNK_OVERLAP = 100
"""Characters shared by consecutive chunks, so a sentence cut at a boundary is whole in one of them."""

_MAX_SIZE = 10_000_000


def check_chunking(chunk_size: int, chunk_overlap: int) -> None:
    """Refuse a chunk size below 1 or an overlap that is negative or not smaller than the size.

    Raises:
        ConfigurationError: naming the bad value and the valid range.
    """
    check_int(chunk_size, "chunk_size", min=1, max=_MAX_SIZE, error=ConfigurationError)
    check_int(chunk_overlap, "chunk_overlap", min=0, max=_MAX_SIZE, error=ConfigurationError)
    if chunk_overlap >= chunk_size:
        raise ConfigurationError(
            f"'chunk_overlap' must be smaller than 'chunk_size' (got {chunk_overlap} >= {chunk_size}); "
            f"a common choice is about an eighth of the size, such as {chunk_size // 8}."
        )


def chunk_text(text: str, chunk_size: int = DEFAULT_CHUNK_SIZE, chunk_overlap: int = DEFAULT_CHUNK_OVERLAP) -> list[str]:
    """Split ``text`` into windows of at most ``chunk_size`` characters.

    A window ends at the last whitespace in its second half when there is one (else it cuts a long
    word), and the next window starts ``chunk_overlap`` characters before that end, moved forward to
    a word start. Chunks are stripped; a text of whitespace only gives no chunk.

    Example:
        >>> chunk_text("one two three four five", chunk_size=10, chunk_overlap=4)
        ['one two', 'two three', 'four five']

    Raises:
        InputTypeError: ``text`` is not a str.
        ConfigurationError: a bad size or overlap (see :func:`check_chunking`).
    """
    check_str(text, "text")
    check_chunking(chunk_size, chunk_overlap)
    n = len(text)
    start = _skip_space(text, 0)
    chunks: list[str] = []
    while start < n:
        end = min(start + chunk_size, n)
        if end < n:
            cut = _last_space(text, start + chunk_size // 2, end)
            if cut > start:
                end = cut
        piece = text[start:end].strip()
        if piece:
            chunks.append(piece)
        if end >= n:
            break
        nxt = max(end - chunk_overlap, start + 1)
        if nxt < end and not text[nxt - 1].isspace():
            # Start the overlap at a word start rather than inside a word.
            space = _first_space(text, nxt, end)
            nxt = space + 1 if space >= 0 else end
        start = _skip_space(text, nxt)
    return chunks


def _skip_space(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i].isspace():
        i += 1
    return i


def _last_space(text: str, low: int, high: int) -> int:
    """The position of the last whitespace in ``text[low:high + 1]`` (the char at ``high`` ends the
    window if it is a space), or -1."""
    for i in range(min(high, len(text) - 1), low - 1, -1):
        if text[i].isspace():
            return i
    return -1


def _first_space(text: str, low: int, high: int) -> int:
    for i in range(low, high):
        if text[i].isspace():
            return i
    return -1
