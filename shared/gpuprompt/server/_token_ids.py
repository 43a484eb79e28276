"""Embedding input given as token ids: read back to text when that is exact, else a clear 400.

langchain-openai's ``OpenAIEmbeddings`` (and Langflow's OpenAI Embeddings node, built on it)
tokenize with tiktoken by default and send the ids. They are ids of OpenAI's ``cl100k_base``
vocabulary (every OpenAI embedding model, and the fallback for unknown model names), not of the
served model, so they cannot be embedded as ids. When tiktoken and that vocabulary are available
(online, or ``TIKTOKEN_CACHE_DIR`` pointing at a copy), the ids are decoded to text and accepted
only if the text encodes back to exactly the same ids: then the text is the one the client
tokenized. Anything else (no vocabulary, ids of another vocabulary, a chunk cut inside a word)
gets a 400 naming the one setting to change.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from gpuprompt.server._errors import ApiError

__all__ = ["TOKEN_IDS_FIX", "decode_token_ids"]

logger = logging.getLogger("gpuprompt.server")

ENCODING = "cl100k_base"
TOKEN_IDS_FIX = (
    "Send the text instead: langchain-openai OpenAIEmbeddings: pass check_embedding_ctx_length=False; Langflow's "
    "OpenAI Embeddings node: turn off 'TikToken Enable' (and set 'TikToken Model Name' to a Hugging Face "
    "tokenizer such as sentence-transformers/all-MiniLM-L6-v2)."
)

_lock = threading.Lock()
_encodings: dict[str | None, tuple[Any, str]] = {}  # TIKTOKEN_CACHE_DIR -> (encoding or None, why not)


def _encoding() -> tuple[Any, str]:
    """tiktoken's ``cl100k_base`` (loaded once per cache folder), or None and the reason."""
    key = os.environ.get("TIKTOKEN_CACHE_DIR")
    with _lock:
        if key not in _encodings:
            try:
                import tiktoken
                from tiktoken_ext.openai_public import cl100k_base

                # Built here rather than by tiktoken.get_encoding, whose process-wide registry
                # would ignore a later TIKTOKEN_CACHE_DIR.
                _encodings[key] = (tiktoken.Encoding(**cl100k_base()), "")
            except ImportError:
                _encodings[key] = (None, "the server has no tiktoken (pip install tiktoken)")
            except Exception as exc:  # noqa: BLE001 - offline download failure, corrupt cache, ...
                why = f"tiktoken could not load {ENCODING} ({type(exc).__name__}); an offline server needs " \
                      "TIKTOKEN_CACHE_DIR pointing at a folder holding it"
                logger.warning("token-id embedding input is refused: %s", why)
                _encodings[key] = (None, why)
        return _encodings[key]


def _refuse(param: str, why: str) -> ApiError:
    return ApiError(
        400,
        f"'{param}' holds token ids, which this server can only read back when they are the exact "
        f"{ENCODING} (tiktoken) encoding of a text, and {why}. {TOKEN_IDS_FIX}",
        param=param,
        code="invalid_value",
    )


def decode_token_ids(inputs: list[list[int]]) -> list[str]:
    """The texts the clients tokenized, one per list of ids (blocking: call it off the event loop).

    Raises:
        ApiError: 400 naming the input that cannot be read back exactly, and the setting to change.
    """
    encoding, why = _encoding()
    if encoding is None:
        raise _refuse("input", why)
    texts = []
    for index, ids in enumerate(inputs):
        param = f"input[{index}]" if len(inputs) > 1 else "input"
        if any(token < 0 or token >= encoding.n_vocab for token in ids):
            raise _refuse(param, f"some ids lie outside {ENCODING}'s {encoding.n_vocab} tokens")
        try:
            text = encoding.decode_bytes(ids).decode("utf-8")
        except (KeyError, ValueError):
            raise _refuse(param, f"these ids do not decode to UTF-8 text under {ENCODING}") from None
        if encoding.encode(text, allowed_special="all") != list(ids):
            raise _refuse(param, f"these ids are not the {ENCODING} encoding of the text they decode to "
                          "(another tokenizer, or a chunk cut inside a word)")
        texts.append(text)
    return texts
