"""The lexical leg's tokenizer: words, and codes such as ``SKU-48213-QX`` kept whole as well as in parts.

Text is NFKC-normalised and case-folded; a token is a run of letters and digits, and runs joined by
``- _ . / : #`` with no space between them form a *code* (a SKU, a model number, an error code, a
version), indexed whole and by each part. So ``"article SKU-48213-QX, size M"`` gives ``article``,
``sku-48213-qx``, ``sku``, ``48213``, ``qx``, ``size``, ``m``: a question naming the code matches its
whole form (rare, so a high weight), and one naming a part still finds it. Trailing punctuation
never sticks to a token (whitespace splitting would keep ``"SKU-48213-QX,"``, which no query ever
matches). Common English words are left out of plain text (not of codes).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

__all__ = ["STOPWORDS", "term_counts", "tokenize"]

_TOKEN = re.compile(r"[^\W_]+(?:[-_./:#][^\W_]+)*")
_JOINERS = re.compile(r"[-_./:#]")
STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these they "
    "this to was will with i you we he she do does did have has had me my our your what which who whom how when "
    "where why can could would should am been being were its than so".split()
)
"""Words too common to tell documents apart (the classic English list of search engines)."""


def tokenize(text: str) -> list[str]:
    """The lexical tokens of ``text``, in order (codes whole, then their parts)."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    out: list[str] = []
    for match in _TOKEN.finditer(folded):
        token = match.group(0)
        if _JOINERS.search(token):
            out.append(token)
            out.extend(part for part in _JOINERS.split(token) if part)
        elif token not in STOPWORDS:
            out.append(token)
    return out


def term_counts(text: str) -> Counter[str]:
    """Each token of ``text`` with its count (its term frequency)."""
    return Counter(tokenize(text))
