"""The lexical leg's tokenizer: words, and codes such as ``SKU-48213-QX`` kept whole as well as in parts.

Text is NFKC-normalised and case-folded; a token is a run of letters and digits, and runs joined by
``- _ . / : #`` with no space between them form a *code* (a SKU, a model number, an error code, a
version), indexed whole and by each part. So ``"article SKU-48213-QX, size M"`` gives ``article``,
``sku-48213-qx``, ``sku``, ``48213``, ``qx``, ``size``, ``m``: a question naming the code matches its
whole form (rare, so a high weight), and one naming a part still finds it. Trailing punctuation
never sticks to a token (whitespace splitting would keep ``"SKU-48213-QX,"``, which no query ever
matches). Common English words are left out of plain text (not of codes).

Scripts written without spaces between words (Chinese, Japanese kana, Thai, Lao, Khmer, Myanmar)
have no word boundaries to split at: a run of them gives each character and each pair of adjacent
characters, as Lucene's CJK analyzer does with pairs (``"東京タワー"`` gives ``東``, ``東京``, ``京``,
``京タ``, ...), so a query naming ``東京`` finds the text that holds it inside a longer run. Text
without those scripts tokenises exactly as before.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

__all__ = ["STOPWORDS", "term_counts", "tokenize"]

_TOKEN = re.compile(r"[^\W_]+(?:[-_./:#][^\W_]+)*")
_UNSPACED = re.compile(
    "[\u0e00-\u0eff"  # Thai, Lao
    "\u1000-\u109f"  # Myanmar
    "\u1780-\u17ff"  # Khmer
    "\u3005\u3040-\u30ff\u31f0-\u31ff"  # 々, Hiragana, Katakana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs
    "\U00020000-\U0003134f]+"
)
_JOINERS = re.compile(r"[-_./:#]")
STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these they "
    "this to was will with i you we he she do does did have has had me my our your what which who whom how when "
    "where why can could would should am been being were its than so".split()
)
"""Words too common to tell documents apart (the classic English list of search engines)."""


def tokenize(text: str) -> list[str]:
    """The lexical tokens of ``text``, in order (codes whole, then their parts; in scripts written
    without spaces, characters and pairs of characters)."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    out: list[str] = []
    start = 0
    for run in _UNSPACED.finditer(folded):
        _words(folded[start:run.start()], out)
        _characters(run.group(0), out)
        start = run.end()
    _words(folded[start:] if start else folded, out)
    return out


def _characters(run: str, out: list[str]) -> None:
    """Each character of an unspaced run (combining marks only inside pairs) and each adjacent pair."""
    for i, char in enumerate(run):
        if not unicodedata.category(char).startswith("M"):
            out.append(char)
        if i + 1 < len(run):
            out.append(run[i:i + 2])


def _words(folded: str, out: list[str]) -> None:
    for match in _TOKEN.finditer(folded):
        token = match.group(0)
        if _JOINERS.search(token):
            out.append(token)
            out.extend(part for part in _JOINERS.split(token) if part)
        elif token not in STOPWORDS:
            out.append(token)


def term_counts(text: str) -> Counter[str]:
    """Each token of ``text`` with its count (its term frequency)."""
    return Counter(tokenize(text))
