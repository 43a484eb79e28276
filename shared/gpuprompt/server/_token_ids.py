"""Embedding input given as token ids: refused by default with a 400 naming the setting to change;
read back to text only when the server is started with ``--accept-token-ids``.

langchain-openai's ``OpenAIEmbeddings`` (and Langflow's OpenAI Embeddings node, built on it)
tokenize with tiktoken by default and send the ids. They are ids of OpenAI's ``cl100k_base``
vocabulary (every OpenAI embedding model, and the fallback for unknown model names), not of the
served model, so they cannot be embedded as ids.

Reading them back cannot be made sound: ids of another vocabulary (the served model's own, as
vLLM accepts, or ``o200k_base``) usually decode to some cl100k text that encodes back to the same
ids, and would be embedded as that garbage text. So the default is a 400 that names the client
setting to change (send text). A server whose clients are known to send cl100k ids opts in with
``--accept-token-ids``: the vocabulary is then loaded once at start (online, or
``TIKTOKEN_CACHE_DIR`` pointing at a copy; the start fails if it cannot be), and ids are accepted
when they decode to UTF-8 text that encodes back to exactly the same ids. Inputs are capped
(8,191 ids each, OpenAI's limit; 300,000 per request) before any decoding.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from gpuprompt.errors import ConfigurationError
from gpuprompt.server.errors import ApiError

__all__ = ["MAX_IDS_PER_INPUT", "MAX_IDS_PER_REQUEST", "TOKEN_IDS_FIX", "decode_token_ids", "load_encoding"]

logger = logging.getLogger("gpuprompt.server")

ENCODING = "cl100k_base"
MAX_IDS_PER_INPUT = 8191
"""Most ids in one input (OpenAI's own limit for its embedding models)."""
MAX_IDS_PER_REQUEST = 300_000
"""Most ids in one request (OpenAI's per-request limit)."""
TOKEN_IDS_FIX = (
    "Send the text instead: langchain-openai OpenAIEmbeddings: pass check_embedding_ctx_length=False; Langflow's "
    "OpenAI Embeddings node: turn off 'TikToken Enable' (and set 'TikToken Model Name' to a Hugging Face "
    "tokenizer such as sentence-transformers/all-MiniLM-L6-v2)."
)

_lock = threading.Lock()
_encodings: dict[str | None, Any] = {}  # TIKTOKEN_CACHE_DIR -> the loaded encoding (successes only)


def load_encoding() -> Any:
    """tiktoken's ``cl100k_base``, loaded once per ``TIKTOKEN_CACHE_DIR`` (blocking: may download).

    Raises:
        ConfigurationError: tiktoken is missing or the vocabulary cannot be loaded (says why and how to
            fix it). A failure is not remembered: a later call tries again.
    """
    key = os.environ.get("TIKTOKEN_CACHE_DIR")
    with _lock:
        if key in _encodings:
            return _encodings[key]
        try:
            import tiktoken
            from tiktoken_ext.openai_public import cl100k_base
        except ImportError:
            raise ConfigurationError(
                "reading token-id embedding input needs tiktoken (pip install tiktoken, or the server extra)."
            ) from None
        try:
            # Built here rather than by tiktoken.get_encoding, whose process-wide registry would
            # ignore a later TIKTOKEN_CACHE_DIR.
            encoding = tiktoken.Encoding(**cl100k_base())
        except Exception as exc:  # noqa: BLE001 - offline download failure, corrupt cache, ...
            raise ConfigurationError(
                f"tiktoken could not load {ENCODING} ({type(exc).__name__}: {exc}); an offline server needs "
                "TIKTOKEN_CACHE_DIR pointing at a folder holding it."
            ) from None
        _encodings[key] = encoding
        return encoding


def _refuse(param: str, why: str) -> ApiError:
    return ApiError(
        400,
        f"'{param}' holds token ids, and {why}. {TOKEN_IDS_FIX}",
        param=param,
        code="invalid_value",
    )


def decode_token_ids(inputs: list[list[int]], *, accept: bool) -> list[str]:
    """The texts the clients tokenized, one per list of ids (blocking: call it off the event loop).

    Args:
        inputs: one list of ids per input.
        accept: whether this server reads token ids at all (``--accept-token-ids``); False refuses.

    Raises:
        ApiError: 400 naming the input that is refused or cannot be read back exactly, and the
            setting to change.
    """
    param_of = (lambda i: f"input[{i}]") if len(inputs) > 1 else (lambda i: "input")
    for index, ids in enumerate(inputs):
        if len(ids) > MAX_IDS_PER_INPUT:
            raise _refuse(param_of(index), f"one input holds at most {MAX_IDS_PER_INPUT} ids (got {len(ids)})")
    total = sum(len(ids) for ids in inputs)
    if total > MAX_IDS_PER_REQUEST:
        raise _refuse("input", f"one request holds at most {MAX_IDS_PER_REQUEST} ids (got {total})")
    if not accept:
        raise _refuse("input", "this server does not read token ids: they are ids of another tokenizer "
                      f"(tiktoken's {ENCODING}), not of the served model (a server that knows its clients send "
                      f"{ENCODING} ids can opt in with --accept-token-ids)")
    try:
        encoding = load_encoding()
    except ConfigurationError as exc:
        raise _refuse("input", f"this server cannot read them: {exc}") from None
    texts = []
    for index, ids in enumerate(inputs):
        param = param_of(index)
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
