"""RemoteEmbedder: the :class:`~gpuprompt.Embedder` interface the adapters use, served by a running
``gpuprompt serve`` (``POST /v1/embeddings``, float32 vectors sent as base64). No torch, no model."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuprompt.errors import ClosedError, ConfigurationError, EngineError, GPUPromptError
from gpuprompt.remote._client import SERVICE, RemoteClient, client_for
from gpuprompt.remote._config import RemoteConfig
from gpuprompt.wire import EMBEDDINGS, HEALTH, MAX_EMBEDDING_INPUTS, MODELS, decode_vectors, redact

if TYPE_CHECKING:
    import torch

__all__ = ["MAX_INPUTS_PER_REQUEST", "RemoteEmbedder"]

MAX_INPUTS_PER_REQUEST = MAX_EMBEDDING_INPUTS
"""Most texts per ``POST /v1/embeddings`` (the server's limit, OpenAI's too); more are split."""
_PROBE = "dimension probe"


class RemoteEmbedder:
    """Embeddings from a running ``gpuprompt serve``: the same vectors as the in-process
    :class:`~gpuprompt.Embedder` of the server's model, batched there with every other worker's texts.

    Calls are idempotent, so a refused connection or a 429/502/503/504 is retried with backoff
    (``RemoteConfig.max_retries``); bad input comes back as ``InvalidInputError``. Nothing
    connects until the first call.

    Example:
        >>> embedder = RemoteEmbedder("http://127.0.0.1:8000")
        >>> embedder.embed(["red dress", "blue jeans"]).shape
        (2, 384)
        >>> embedder.model_id
        'sentence-transformers/all-MiniLM-L6-v2'

    Args:
        base_url: the server (``http://host:port``), or a :class:`RemoteConfig`.
        model: the embedding model to ask for (checked against the served ones on load); None
            for the server's.
        api_key: the server's API key (with a URL; a config carries its own).
        client: a :class:`RemoteClient` to use instead of the process's shared one for the config.
        **options: other :class:`RemoteConfig` fields (``connect_timeout``, ``read_timeout``,
            ``max_retries``, ...), with a URL.
    """

    def __init__(
        self,
        base_url: str | RemoteConfig | None = None,
        *,
        model: str | None = None,
        api_key: str | None = None,
        client: RemoteClient | None = None,
        **options: Any,
    ) -> None:
        client = client_for(base_url, api_key, client, options, owner="RemoteEmbedder")
        if model is not None and (not isinstance(model, str) or not model):
            raise ConfigurationError(f"'model' must be None or a non-empty str (got a {type(model).__name__}).")
        self.client = client
        self.model = model
        self._model_id: str | None = None
        self._identity: str | None = None
        self._dim: int | None = None
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"<RemoteEmbedder {redact(self.client.root)!r} model={self._model_id or self.model!r}>"

    # ------------------------------------------------------------------ identity
    @property
    def model_id(self) -> str:
        """The served embedding model's id (asks the server once)."""
        self.load()
        assert self._model_id is not None
        return self._model_id

    @property
    def dim(self) -> int:
        """The embedding dimension (embeds a probe text once, if no call told it yet)."""
        if self._dim is None:
            self.embed([_PROBE])
        assert self._dim is not None
        return self._dim

    @property
    def identity(self) -> str:
        """Which embedder produces these vectors: the server's own identity (model, ``;int8`` when it
        serves a quantised embedder), else the served model's id. Loads (asks the server) on first use."""
        if self._identity is None:
            self.load()
        return self._identity or self.model_id

    @property
    def normalize(self) -> bool:
        """Always True: the server's embedder normalises."""
        return True

    @property
    def device(self) -> str:
        """``"remote"``: the model runs on the server."""
        return "remote"

    # ------------------------------------------------------------------ loading
    def load(self) -> RemoteEmbedder:
        """Ask the server which embedding model it serves (``GET /health``, ``GET /v1/models``);
        a ``model`` it does not serve raises ``ConfigurationError`` naming the served ones."""
        self._check_open()
        if self._model_id is None or self._identity is None:
            models = self.client.request("GET", MODELS)
            try:
                health = self.client.request("GET", HEALTH)
            except GPUPromptError:  # not a gpuprompt server: the model list must do
                health = {}
            self._choose(_health(health), models)
        return self

    async def aload(self) -> RemoteEmbedder:
        """Async :meth:`load` (never blocks the caller's loop)."""
        self._check_open()
        if self._model_id is None or self._identity is None:
            models = await self.client.arequest("GET", MODELS)
            try:
                health = await self.client.arequest("GET", HEALTH)
            except GPUPromptError:  # not a gpuprompt server: the model list must do
                health = {}
            self._choose(_health(health), models)
        return self

    def _choose(self, health: dict[str, Any], models: Any) -> None:
        chosen = _served_model(self.model, health.get("embedding_model"), _model_ids(models, self.client.root),
                               "embedding", self.client.root)
        identity = health.get("embedder_identity")
        with self._lock:
            self._model_id = chosen
            self._identity = identity if isinstance(identity, str) and identity else chosen

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this RemoteEmbedder was closed; create a new one.")

    # ------------------------------------------------------------------ embedding
    @staticmethod
    def _chunks(texts: Sequence[str]) -> list[list[str]]:
        from gpuprompt.embed import validate_texts

        texts = validate_texts(texts)
        return [texts[start:start + MAX_INPUTS_PER_REQUEST] for start in range(0, len(texts), MAX_INPUTS_PER_REQUEST)]

    def _body(self, chunk: list[str]) -> dict[str, Any]:
        body: dict[str, Any] = {"input": chunk, "encoding_format": "base64"}
        if self.model is not None:
            body["model"] = self._model_id  # the served id (load() matched it)
        return body

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` on the server; blocks this thread (safe from many threads at once).

        Args:
            texts: a list of str (more than 2048 are sent in several requests).

        Returns:
            A float32 array of shape ``(len(texts), dim)``, L2-normalised.

        Raises:
            InputTypeError: ``texts`` is not a list of str (the message names the bad item).
            QueueFullError: the server stayed busy through every retry (``retry_after`` set).
            EngineDeadError: the server cannot be reached or its model died.
        """
        chunks = self._chunks(texts)
        if self.model is not None:
            self.load()  # the served id to ask for
        self._check_open()
        if not chunks:
            return np.empty((0, self.dim), dtype=np.float32)
        parts = [self._vectors(self.client.request("POST", EMBEDDINGS, self._body(chunk), idempotent=True),
                               len(chunk))
                 for chunk in chunks]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        """Async :meth:`embed`: never blocks the caller's loop; cancelling the task abandons the request."""
        chunks = self._chunks(texts)
        if self.model is not None:
            await self.aload()
        self._check_open()
        if not chunks:
            if self._dim is None:
                await self.aembed([_PROBE])
            return np.empty((0, self.dim), dtype=np.float32)
        parts = [self._vectors(await self.client.arequest("POST", EMBEDDINGS, self._body(chunk), idempotent=True),
                               len(chunk))
                 for chunk in chunks]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def embed_tensor(self, texts: Sequence[str]) -> torch.Tensor:
        """:meth:`embed` as a CPU ``torch`` tensor (imports torch: for local indexes fed by a server)."""
        import torch

        return torch.from_numpy(self.embed(texts))

    async def aembed_tensor(self, texts: Sequence[str]) -> torch.Tensor:
        """Async :meth:`embed_tensor`."""
        import torch

        return torch.from_numpy(await self.aembed(texts))

    def _vectors(self, answer: Any, count: int) -> np.ndarray:
        where = redact(self.client.root)
        try:
            items = sorted(answer["data"], key=lambda item: item["index"])
            rows = [_row(item["embedding"]) for item in items]
            model = answer.get("model")
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineError(f"{SERVICE} at {where} sent a malformed embeddings answer ({exc!r}).") from exc
        if len(rows) != count or len({row.shape[0] for row in rows}) > 1 or not rows[0].shape[0]:
            raise EngineError(f"{SERVICE} at {where} sent {len(rows)} embeddings of sizes "
                              f"{sorted({row.shape[0] for row in rows})} for {count} texts.")
        matrix = np.stack(rows)
        with self._lock:
            if self._dim is None:
                self._dim = int(matrix.shape[1])
            if self._model_id is None and isinstance(model, str) and model:
                self._model_id = model
        if matrix.shape[1] != self._dim:
            raise EngineError(f"{SERVICE} at {where} changed its embedding size from {self._dim} to "
                              f"{matrix.shape[1]}: another model is served there now; build a new RemoteEmbedder.")
        return matrix

    def close(self) -> None:
        """Refuse further calls (the shared connection pool stays open for other users)."""
        self._closed = True


def _row(value: Any) -> np.ndarray:
    if isinstance(value, str):
        return decode_vectors(value, name="embedding")
    if isinstance(value, list):
        return np.asarray(value, dtype=np.float32)
    raise ValueError(f"an embedding must be base64 text or a list of floats (got a {type(value).__name__})")


def _health(answer: Any) -> dict[str, Any]:
    return answer if isinstance(answer, dict) else {}


def _model_ids(answer: Any, root: str) -> list[str]:
    try:
        return [card["id"] for card in answer["data"] if isinstance(card, dict) and isinstance(card.get("id"), str)]
    except (KeyError, TypeError) as exc:
        raise EngineError(f"{SERVICE} at {redact(root)} did not answer an OpenAI model list; is base_url the "
                          "server's address?") from exc


def _served_model(wanted: str | None, role: Any, listed: list[str], kind: str, root: str) -> str:
    """The served id of the ``kind`` model to use: ``wanted`` matched against the server's model of that
    role (``/health`` names it) or, from another server, against every listed model."""
    served = [role] if isinstance(role, str) and role else listed
    if wanted is None:
        if not served:
            raise EngineError(f"{SERVICE} at {redact(root)} lists no models; is base_url a gpuprompt server?")
        return served[0] if served is not listed or kind == "chat" else served[-1]
    chosen = _match(wanted, served)
    if chosen is None:
        raise ConfigurationError(
            f"the server at {redact(root)} serves the {kind} model {served[0] if len(served) == 1 else served}, "
            f"not {wanted!r}; pass that name as the model, or none for the server's."
        )
    return chosen


def _match(wanted: str, served: list[str]) -> str | None:
    """The served id naming ``wanted`` (the same id, or the same last path part)."""
    if wanted in served:
        return wanted
    tail = wanted.rstrip("/").rsplit("/", 1)[-1]
    return next((name for name in served if name.rstrip("/").rsplit("/", 1)[-1] == tail), None)
