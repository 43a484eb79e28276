"""The remote backend: an OpenAI-compatible server (vLLM, a fleet behind vllm-router, or ``gpuprompt serve``).

The engine still renders the chat template, fits the prompt to the context window and builds tool
and output constraints with the model's own tokenizer (loaded here; no weights); this backend
sends the prepared prompt to ``POST /v1/completions`` and streams the reply back as the job's
events. A vLLM server gets the prompt as token ids, so its token counts are exactly ours;
``gpuprompt serve`` (which refuses token-id prompts) gets the same tokens as text.

Requests run on one private event-loop thread with one pooled ``httpx.AsyncClient``. Cancelling a
job closes its stream, which aborts the request on the server. HTTP errors become the engine's
typed errors; nothing is retried here (the engine's ``CallPolicy`` decides).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any, ClassVar

from gpuprompt.errors import (
    ClosedError,
    ConfigurationError,
    DependencyError,
    EngineError,
    InvalidInputError,
    QueueFullError,
    RequestTimeoutError,
)
from gpuprompt.llm._backend import Backend
from gpuprompt.llm._job import Job
from gpuprompt.models import BUNDLED_CHAT_MODEL
from gpuprompt.wire import api_root, error_from_status, guided_body, redact, sampling_body

__all__ = ["RemoteBackend"]

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
"""Most seconds to open a connection (a refused one fails at once)."""
READ_TIMEOUT_S = 600.0
"""Most seconds between two pieces of a reply (a queued request may wait this long for its first)."""
PROBE_TIMEOUT_S = 30.0
"""Most seconds for the start-up ``GET /v1/models``."""
MAX_CONNECTIONS = 1024
_CLOSE_TIMEOUT_S = 30.0
_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort", "eos": "stop"}


class RemoteBackend(Backend):
    """An OpenAI-compatible server behind :class:`~gpuprompt.LLMEngine` (``backend="remote"``).

    The server must serve the same model as ``LLMEngine(model=...)`` names: its tokenizer renders
    and counts the prompts here. Requests carry their ``session_id`` in ``config.session_header``
    so a router hashing on it keeps a conversation on the replica that holds its prefix cache.
    """

    name: ClassVar[str] = "remote"
    supports_structured_output: ClassVar[bool] = True
    sampling_fields: ClassVar[frozenset[str]] = frozenset(
        {"top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias"}
    )
    guided_kinds: ClassVar[frozenset[str]] = frozenset({"json", "json_object", "regex", "choice"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.root = api_root(self.config.base_url or "")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._httpx: Any = None
        self._jobs: set[Job] = set()
        self._jobs_lock = threading.Lock()
        self._closed = False
        self._tokenizer: Any = None
        self._tokenizer_lock = threading.Lock()
        self.server_kind = "openai"
        """``"vllm"``, ``"gpuprompt"`` or ``"openai"`` (another server), from ``GET /v1/models``."""
        self.served_model: str | None = None
        self.token_id_prompts = True
        """Whether prompts go as token ids (not to ``gpuprompt serve``, which refuses them)."""

    def __repr__(self) -> str:
        return f"<RemoteBackend {redact(self.root)!r} server={self.server_kind} model={self.served_model!r}>"

    @property
    def capabilities(self) -> dict[str, Any]:
        capabilities = super().capabilities
        capabilities["prefix_cache"] = self.server_kind == "vllm"
        capabilities["server"] = self.server_kind
        capabilities["base_url"] = redact(self.root)
        return capabilities

    # ------------------------------------------------------------------ start
    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers

    def start(self) -> None:
        try:
            import httpx
        except ImportError as exc:
            raise DependencyError("backend='remote' needs httpx: pip install httpx") from exc
        self._httpx = httpx
        models = self._probe(httpx)
        self._choose_model(models)
        if not self.token_id_prompts:
            self._decode([])  # load the tokenizer now, not on the first request
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=_run_loop, args=(loop,), name="gpuprompt-remote-llm", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread

        async def make_client() -> Any:
            return httpx.AsyncClient(
                headers=self._headers(),
                timeout=httpx.Timeout(CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S, pool=None),
                limits=httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=64),
            )

        self._client = asyncio.run_coroutine_threadsafe(make_client(), loop).result(_CLOSE_TIMEOUT_S)
        logger.info("remote LLM backend at %s (%s server, model %r)", redact(self.root), self.server_kind, self.served_model)

    def _probe(self, httpx: Any) -> list[dict[str, Any]]:
        """``GET /v1/models``: the server is up, speaks the API, and serves which models."""
        url = f"{self.root}/models"
        try:
            reply = httpx.get(url, headers=self._headers(), timeout=httpx.Timeout(PROBE_TIMEOUT_S,
                                                                                  connect=CONNECT_TIMEOUT_S))
        except httpx.HTTPError as exc:
            raise EngineError(
                f"could not reach the LLM server at {redact(url)} ({type(exc).__name__}); start it or fix base_url."
            ) from exc
        if reply.status_code != 200:
            raise error_from_status(reply.status_code, reply.content, reply.headers, url)
        try:
            data = reply.json()["data"]
            return [card for card in data if isinstance(card, dict) and isinstance(card.get("id"), str)]
        except (ValueError, KeyError, TypeError) as exc:
            raise EngineError(f"{redact(url)} did not answer an OpenAI model list; is base_url an OpenAI-compatible API?") \
                from exc

    def _choose_model(self, cards: list[dict[str, Any]]) -> None:
        owners = {str(card.get("owned_by", "")) for card in cards}
        self.server_kind = "vllm" if "vllm" in owners else "gpuprompt" if "gpuprompt" in owners else "openai"
        self.token_id_prompts = self.server_kind != "gpuprompt"
        wanted = {self.config.model or BUNDLED_CHAT_MODEL, self.model_path} - {None}
        tails = {str(name).rstrip("/").rsplit("/", 1)[-1] for name in wanted}
        chosen = next((c for c in cards if c["id"] in wanted), None) or next(
            (c for c in cards if c["id"].rstrip("/").rsplit("/", 1)[-1] in tails), None
        )
        if chosen is None:
            if cards:
                # Prompts are rendered and counted with the local tokenizer: another model would get ids of
                # the wrong vocabulary and answer garbage with status 200. Refuse to start instead.
                raise ConfigurationError(
                    f"the LLM server at {redact(self.root)} serves {[c['id'] for c in cards]}, none of them "
                    f"{self.config.model or BUNDLED_CHAT_MODEL!r}; pass model= (gpuprompt serve: --chat-model) the "
                    "served model's id or a local copy of it: its tokenizer renders the prompts here."
                )
            self.served_model = None  # a server that lists no models: its default model
        else:
            self.served_model = chosen["id"]
            limit = chosen.get("max_model_len")
            if isinstance(limit, int) and 0 < limit < self.context_window:
                raise ConfigurationError(
                    f"the server's model {chosen['id']!r} holds {limit} tokens but max_model_len is "
                    f"{self.context_window}; pass max_model_len={limit} (or start the server with a longer one)."
                )

    # ------------------------------------------------------------------ requests
    def body(self, job: Job) -> dict[str, Any]:
        """The JSON body of ``POST /v1/completions`` for ``job`` (streamed, usage included)."""
        prepared = job.prepared
        request = prepared.request
        body: dict[str, Any] = {
            "max_tokens": prepared.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.served_model is not None:
            body["model"] = self.served_model
        if self.token_id_prompts:
            body["prompt"] = list(prepared.token_ids)
        else:
            # gpuprompt serve re-tokenizes this text into the same ids (special tokens included).
            body["prompt"] = self._decode(prepared.token_ids)
        if job.backend_stops:  # a reply with tools: the job matches them in its prose instead
            body["stop"] = list(job.backend_stops)
        body.update(sampling_body(request))
        body.update(guided_body(prepared.guided, structured_outputs=True))
        return body

    def _request_headers(self, job: Job) -> dict[str, str]:
        session = getattr(job.prepared.request, "session_id", None)
        header = self.config.session_header
        return {header: session} if header and session else {}

    def submit(self, job: Job) -> None:
        loop = self._loop
        if self._closed or loop is None or self._client is None:
            raise ClosedError("this remote LLM engine was closed; create a new LLMEngine.")
        body = self.body(job)
        with self._jobs_lock:
            self._jobs.add(job)
        job.set_cancel_hook(lambda: _call_soon(loop, self._cancel, job))
        if not _call_soon(loop, self._spawn, job, body):
            with self._jobs_lock:
                self._jobs.discard(job)
            raise ClosedError("this remote LLM engine was closed; create a new LLMEngine.")

    def _spawn(self, job: Job, body: dict[str, Any]) -> None:
        # On the loop thread. A job cancelled before it got here never reaches the server.
        if job.cancelled.is_set() or job.ended:
            job.finish("abort", 0)
            with self._jobs_lock:
                self._jobs.discard(job)
            return
        task = asyncio.get_running_loop().create_task(self._run(job, body))
        # A task cancelled before its first step never runs _run's handlers: end the job here then.
        task.add_done_callback(lambda _task: self._ended(job))
        job.backend_state = task

    def _ended(self, job: Job) -> None:
        job.finish("abort", 0)  # a no-op when _run ended it
        with self._jobs_lock:
            self._jobs.discard(job)

    def _cancel(self, job: Job) -> None:
        # On the loop thread, after _spawn for the same job (call_soon keeps FIFO order).
        task = job.backend_state
        if isinstance(task, asyncio.Task) and not task.done():
            task.cancel()

    def _decode(self, token_ids: list[int]) -> str:
        with self._tokenizer_lock:
            if self._tokenizer is None:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            return self._tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    async def _run(self, job: Job, body: dict[str, Any]) -> None:
        httpx = self._httpx
        url = f"{self.root}/completions"
        tokens = cached = 0
        reason = "length"
        ended = False  # [DONE] or a finish_reason arrived: the reply is whole
        try:
            async with self._client.stream("POST", url, json=body, headers=self._request_headers(job)) as reply:
                if reply.status_code != 200:
                    raise error_from_status(reply.status_code, await reply.aread(), reply.headers, self.root)
                job.mark_started()
                async for line in reply.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        ended = True
                        break
                    chunk = json.loads(data)
                    if "error" in chunk and not chunk.get("choices"):
                        error = chunk["error"]
                        status = error.get("code") if isinstance(error, dict) else None
                        raise error_from_status(status if isinstance(status, int) else 500, chunk, None, self.root)
                    for choice in chunk.get("choices") or ():
                        text = choice.get("text") or ""
                        if text:
                            job.mark_first_token()
                            job.push_text(text)
                        if choice.get("finish_reason"):
                            reason = _FINISH_REASONS.get(str(choice["finish_reason"]), "stop")
                            ended = True
                    usage = chunk.get("usage")
                    if usage:
                        tokens = int(usage.get("completion_tokens") or 0)
                        details = usage.get("prompt_tokens_details") or {}
                        cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
            if not ended:
                raise EngineError(
                    f"the LLM server at {redact(self.root)} ended request {job.request_id}'s stream before it "
                    "finished (no finish_reason, no [DONE]): the reply may be cut short; retry it."
                )
            job.finish(reason, tokens, cached)
        except asyncio.CancelledError:
            # Leaving the ``async with`` closed the connection: the server aborts the request.
            job.finish("abort", tokens, cached)
        except (QueueFullError, InvalidInputError, EngineError, ConfigurationError, RequestTimeoutError) as exc:
            job.fail(exc)
        except httpx.TimeoutException as exc:
            job.fail(EngineError(f"the LLM server at {redact(self.root)} did not answer request {job.request_id} "
                                 f"in time ({type(exc).__name__})."))
        except httpx.HTTPError as exc:
            job.fail(EngineError(f"the LLM server at {redact(self.root)} failed on request {job.request_id}: "
                                 f"{type(exc).__name__}: {exc}"))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            job.fail(EngineError(f"the LLM server at {redact(self.root)} sent a malformed stream for "
                                 f"{job.request_id}: {exc!r}"))
        finally:
            with self._jobs_lock:
                self._jobs.discard(job)

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop, client = self._loop, self._client
        with self._jobs_lock:
            jobs = list(self._jobs)
        for job in jobs:
            job.fail(ClosedError(f"the LLM engine was closed while request {job.request_id} was pending."))
        if loop is not None and not loop.is_closed():

            async def shutdown() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                if tasks:
                    await asyncio.wait(tasks, timeout=_CLOSE_TIMEOUT_S)
                if client is not None:
                    await client.aclose()

            try:
                asyncio.run_coroutine_threadsafe(shutdown(), loop).result(_CLOSE_TIMEOUT_S * 2)
            except Exception:  # closing must go on
                logger.exception("error while closing the remote LLM client")
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join(_CLOSE_TIMEOUT_S)
            if not loop.is_running():
                loop.close()
        self._client = None
        self._loop = self._thread = None


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> bool:
    try:
        loop.call_soon_threadsafe(fn, *args)
        return True
    except RuntimeError:  # the loop is closed
        return False


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()
