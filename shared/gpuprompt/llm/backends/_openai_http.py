"""The remote backend: an OpenAI-compatible server (vLLM, a fleet behind vllm-router, or ``gpuprompt serve``).

The engine still renders the chat template, fits the prompt to the context window and builds tool
and output constraints with the model's own tokenizer (loaded here; no weights); this backend
sends the prepared prompt to ``POST /v1/completions`` and streams the reply back as the job's
events. A vLLM server gets the prompt as token ids, so its token counts are exactly ours;
``gpuprompt serve`` (which refuses token-id prompts) gets the same tokens as text.

Requests run on the loop thread of one pooled :class:`~gpuprompt._http.HttpClient` (the HTTP client
remote mode uses too). Cancelling a job closes its stream, which aborts the request on the
server. HTTP errors become the engine's typed errors (:mod:`gpuprompt.wire`); nothing is retried
here (the engine's ``CallPolicy`` decides).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, ClassVar

from gpuprompt._http import HttpClient
from gpuprompt.errors import (
    ClosedError,
    EngineDeadError,
    ConfigurationError,
    EngineError,
    InvalidInputError,
    QueueFullError,
    RequestTimeoutError,
)
from gpuprompt.llm._backend import ALL_SAMPLING_FIELDS, Backend
from gpuprompt.llm._job import Job
from gpuprompt.models import BUNDLED_CHAT_MODEL
from gpuprompt.wire import COMPLETIONS, MODELS, api_root, guided_body, redact, sampling_body, wire_stop_reason

__all__ = ["RemoteBackend"]

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
"""Most seconds to open a connection (a refused one fails at once)."""
READ_TIMEOUT_S = 600.0
"""Most seconds between two pieces of a reply (a queued request may wait this long for its first)."""
PROBE_TIMEOUT_S = 30.0
"""Most seconds for the start-up ``GET /v1/models``."""
MAX_CONNECTIONS = 1024
_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort", "eos": "stop"}


class RemoteBackend(Backend):
    """An OpenAI-compatible server behind :class:`~gpuprompt.LLMEngine` (``backend="remote"``).

    The server must serve the same model as ``LLMEngine(model=...)`` names: its tokenizer renders
    and counts the prompts here. Requests carry their ``session_id`` in ``config.session_header``
    so a router hashing on it keeps a conversation on the replica that holds its prefix cache.
    """

    name: ClassVar[str] = "remote"
    supports_structured_output: ClassVar[bool] = True
    sampling_fields: ClassVar[frozenset[str]] = ALL_SAMPLING_FIELDS
    guided_kinds: ClassVar[frozenset[str]] = frozenset({"json", "json_object", "regex", "choice"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.root = api_root(self.config.base_url or "")
        self._http: HttpClient | None = None
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
        capabilities["prefix_cache"] = self.server_kind in ("vllm", "gpuprompt")  # both of its backends keep one
        capabilities["server"] = self.server_kind
        capabilities["base_url"] = redact(self.root)
        return capabilities

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        self._http = HttpClient(self.root, api_key=self.config.api_key, connect_timeout=CONNECT_TIMEOUT_S,
                                read_timeout=READ_TIMEOUT_S, max_connections=MAX_CONNECTIONS,
                                service="the LLM server", name="gpuprompt-remote-llm")
        try:
            models = self._probe(self._http)
            self._choose_model(models)
            if not self.token_id_prompts:
                self._decode([])  # load the tokenizer now, not on the first request
            self._http.loop_thread.start()
            _ = self._http.aclient  # the pool, on the loop thread
        except BaseException:
            self._http.close()
            self._http = None
            raise
        logger.info("remote LLM backend at %s (%s server, model %r)", redact(self.root), self.server_kind, self.served_model)

    def _probe(self, http: HttpClient) -> list[dict[str, Any]]:
        """``GET /v1/models``: the server is up, speaks the API, and serves which models."""
        url = http.url(MODELS)
        try:
            answer = http.request("GET", MODELS, timeout=PROBE_TIMEOUT_S)
        except (EngineDeadError, RequestTimeoutError) as exc:
            raise EngineError(
                f"could not reach the LLM server at {redact(url)} ({exc}); start it or fix base_url."
            ) from exc
        try:
            data = answer["data"]
            return [card for card in data if isinstance(card, dict) and isinstance(card.get("id"), str)]
        except (KeyError, TypeError) as exc:
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
        http = self._http
        if self._closed or http is None:
            raise ClosedError("this remote LLM engine was closed; create a new LLMEngine.")
        body = self.body(job)
        thread = http.loop_thread
        with self._jobs_lock:
            self._jobs.add(job)
        job.set_cancel_hook(lambda: thread.call_soon(self._cancel, job))
        if not thread.call_soon(self._spawn, job, body):
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
        assert self._http is not None
        tokens = cached = 0
        reason, stop_reason = "length", None
        ended = False  # [DONE] or a finish_reason arrived: the reply is whole
        events = self._http.events(COMPLETIONS, body, self._request_headers(job), on_open=job.mark_started)
        try:
            try:
                async for chunk in events:
                    for choice in chunk.get("choices") or ():
                        text = choice.get("text") or ""
                        if text:
                            job.mark_first_token()
                            job.push_text(text)
                        if choice.get("finish_reason"):
                            reason = _FINISH_REASONS.get(str(choice["finish_reason"]), "stop")
                            stop_reason = wire_stop_reason(choice.get("stop_reason"))
                            ended = True
                    usage = chunk.get("usage")
                    if usage:
                        tokens = int(usage.get("completion_tokens") or 0)
                        details = usage.get("prompt_tokens_details") or {}
                        cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
            except EngineError as exc:
                if "without [DONE]" not in str(exc):
                    raise  # else judged below: a finish_reason without [DONE] is a whole reply
            if not ended:
                raise EngineError(
                    f"the LLM server at {redact(self.root)} ended request {job.request_id}'s stream before it "
                    "finished (no finish_reason, no [DONE]): the reply may be cut short; retry it."
                )
            job.finish(reason, tokens, cached, stop_reason)
        except asyncio.CancelledError:
            # Closing the event stream closed the connection: the server aborts the request.
            job.finish("abort", tokens, cached)
        except RequestTimeoutError as exc:
            job.fail(EngineError(f"the LLM server at {redact(self.root)} did not answer request {job.request_id} "
                                 f"in time ({exc})."))
        except (QueueFullError, InvalidInputError, EngineError, ConfigurationError) as exc:
            job.fail(exc)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            job.fail(EngineError(f"the LLM server at {redact(self.root)} sent a malformed stream for "
                                 f"{job.request_id}: {exc!r}"))
        finally:
            await events.aclose()
            with self._jobs_lock:
                self._jobs.discard(job)

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._jobs_lock:
            jobs = list(self._jobs)
        for job in jobs:
            job.fail(ClosedError(f"the LLM engine was closed while request {job.request_id} was pending."))
        http, self._http = self._http, None
        if http is not None:
            http.close()  # cancels the jobs' tasks on its loop, closes the pool, stops the loop
