"""Ray Serve: the RAG core (embedder + index + LLM + :class:`~gpuprompt.RAGPipeline`) as a deployment.

``build_app(...)`` returns a Serve application; ``serve.run(app)`` puts it behind Serve's HTTP
proxy, scaled in replicas (fixed or autoscaled). Each replica holds one embedder, one index and an
in-replica LLM engine; the MicroBatchers inside batch the replica's concurrent requests, so a
replica takes up to ``max_ongoing_requests`` (256) at once rather than Serve's default of 5, which
would starve the batchers. The HTTP route is a thin adapter: it validates the body with the
server's schema types, calls :meth:`RAGPipeline.aanswer` and maps errors as ``gpuprompt serve``
does. Importing ``gpuprompt`` never imports Ray; this module imports it in :func:`build_app`.

Example:
    >>> import ray
    >>> from ray import serve
    >>> from gpuprompt.apps.ray import build_app
    >>> app = build_app(index_path="kb-index", llm={"backend": "vllm"}, num_replicas=2,
    ...                 ray_actor_options={"num_gpus": 1})
    >>> serve.run(app, route_prefix="/rag")
    >>> # curl -X POST localhost:8000/rag -d '{"question": "Does the red dress shrink?"}'
    >>> # {"answer": "...", "sources": [{"id": "doc-7#0", "score": 0.71, ...}], "session_id": "...", ...}
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuprompt.errors import ConfigurationError, DependencyError, describe
from gpuprompt.llm._types import MAX_TOKENS_LIMIT
from gpuprompt.remote import RemoteConfig, RemoteLLM
from gpuprompt.validation import check_int, check_str, fail

if TYPE_CHECKING:
    from gpuprompt.embed import EmbedderConfig
    from gpuprompt.llm import LLMConfig

__all__ = ["DEFAULT_MAX_ONGOING_REQUESTS", "RAGDeployment", "build_app"]

DEFAULT_MAX_ONGOING_REQUESTS = 256
"""Requests one replica takes at once: enough for the batchers to form full batches."""


class RAGDeployment:
    """One Serve replica: loads the embedder, the index and the LLM once, answers POSTed questions.

    The body is ``{"question": str, "session_id"?: str, "k"?: int, "filter"?: {...},
    "max_tokens"?: int}``; the reply ``{"answer", "sources": [{"id", "score", "document",
    "metadata"}], "session_id", "finish_reason", "usage", "timings"}``. Without a ``session_id``
    each request is its own conversation. Errors are the OpenAI-style envelope of ``gpuprompt
    serve`` (400 for a bad body, 429 when a queue is full, 503 when the model is gone).

    Args:
        index_path: a saved index (``VectorIndex`` snapshot or ``MilvusIndex`` pointer) or None for
            an empty index.
        embedder: :class:`~gpuprompt.EmbedderConfig` fields.
        llm: :class:`~gpuprompt.llm.LLMConfig` fields (an in-replica engine), or
            ``{"remote": base_url, "model": ..., "api_key": ...}`` (:class:`gpuprompt.remote.RemoteLLM`).
        pipeline: :class:`~gpuprompt.RAGPipeline` keyword options (``k``, ``max_tokens``, ...).
    """

    def __init__(
        self, index_path: str | None, embedder: dict[str, Any], llm: dict[str, Any], pipeline: dict[str, Any]
    ) -> None:
        from gpuprompt.rag import RAGPipeline
        from gpuprompt.runtime import get_runtime

        runtime = get_runtime()
        emb_options = dict(embedder)
        model = emb_options.pop("model", None)
        self.embedder = runtime.embedder(model, **emb_options).load()
        llm_options = dict(llm)
        if "remote" in llm_options:
            self.llm: Any = RemoteLLM(llm_options.pop("remote"), **llm_options)  # connects at the first answer
        else:
            self.llm = runtime.llm(llm_options.pop("model", None), **llm_options).load()
        if index_path is None:
            from gpuprompt.index import VectorIndex

            self.index = VectorIndex(self.embedder.dim)
        else:
            from gpuprompt.index import load_index

            self.index = load_index(index_path)
        self.pipeline = RAGPipeline(self.index, self.llm, embedder=self.embedder, **pipeline)

    async def __call__(self, request: Any) -> Any:
        """``POST``: one RAG turn (see the class docstring)."""
        from pydantic import ValidationError
        from starlette.responses import JSONResponse

        from gpuprompt.server.errors import error_body, error_response, validation_message

        if request.method != "POST":
            body = error_body("POST a JSON object such as {\"question\": \"...\"}.", "invalid_request_error",
                              code="method_not_allowed")
            return JSONResponse(body, 405, headers={"Allow": "POST"})
        try:
            ask = _ask_model().model_validate_json(await request.body())
        except ValidationError as exc:
            message, param, _ = validation_message(exc.errors())
            return JSONResponse(error_body(message, "invalid_request_error", param, "invalid_value"), 400)
        session = ask.session_id or f"serve-{uuid.uuid4().hex}"
        try:
            answer = await self.pipeline.aanswer(
                session, ask.question, k=ask.k, filter=ask.filter, max_tokens=ask.max_tokens
            )
        except Exception as exc:  # noqa: BLE001 - mapped to a status like `gpuprompt serve` does
            return error_response(exc)
        t, usage = answer.timings, answer.usage
        return JSONResponse({
            "answer": answer.answer,
            "sources": [
                {"id": h.id, "score": float(h.score), "document": h.document, "metadata": dict(h.metadata)}
                for h in answer.sources
            ],
            "session_id": session,
            "finish_reason": answer.finish_reason,
            "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                      "total_tokens": usage.total_tokens},
            "timings": {"embed_s": t.embed_s, "retrieve_s": t.retrieve_s, "context_s": t.context_s,
                        "generate_s": t.generate_s, "total_s": t.total_s},
        })

    def check_health(self) -> None:
        """Serve's health probe: a closed engine fails the replica, which Serve then replaces."""
        if getattr(self.llm, "closed", False):
            raise RuntimeError("the replica's LLM engine is closed")


_ASK_MODEL: Any = None


def _ask_model() -> Any:
    """The request body's schema, from the server's field types (one validation for both)."""
    global _ASK_MODEL
    if _ASK_MODEL is None:
        from typing import Annotated

        from pydantic import Field

        from gpuprompt.server.schemas.base import ChatK, JSONObject, Name, Text, TokenCount, _Strict

        class AskRequest(_Strict):
            """``POST``: one RAG turn."""

            question: Annotated[Text, Field(min_length=1)]
            session_id: Name | None = None
            k: ChatK | None = None
            filter: JSONObject | None = None
            max_tokens: TokenCount | None = None

        _ASK_MODEL = AskRequest
    return _ASK_MODEL


def build_app(
    *,
    index_path: str | os.PathLike[str] | None = None,
    llm: LLMConfig | Mapping[str, Any] | str | None = None,
    llm_model: str | None = None,
    llm_api_key: str | None = None,
    embedder: EmbedderConfig | Mapping[str, Any] | None = None,
    k: int = 4,
    max_tokens: int = 128,
    system_prompt: str | None = None,
    num_replicas: int | str = 1,
    autoscaling_config: Mapping[str, Any] | None = None,
    max_ongoing_requests: int = DEFAULT_MAX_ONGOING_REQUESTS,
    ray_actor_options: Mapping[str, Any] | None = None,
    name: str = "gpuprompt-rag",
) -> Any:
    """A Ray Serve application answering RAG questions over ``index_path``.

    Args:
        index_path: the saved index each replica loads (a path every node can read), or None for
            an empty one.
        llm: the in-replica engine's :class:`~gpuprompt.llm.LLMConfig` or its fields (default:
            the bundled SmolLM2, backend ``"auto"``), or the URL of a remote OpenAI-compatible
            fleet (``"http://router:8000/v1"``: vLLM servers behind a router, or ``gpuprompt
            serve``), called through :class:`gpuprompt.remote.RemoteLLM` (it sends the session as
            ``X-Session-ID``, so a fleet's router keeps a conversation on one replica; a busy
            server's 429 comes back as a 429 of the deployment); then replicas load no LLM.
        llm_model: with a URL, the ``model`` to ask for (None: the server's one model).
        llm_api_key: with a URL, the bearer token (travels to the replicas in the deployment's
            arguments).
        embedder: the :class:`~gpuprompt.EmbedderConfig` or its fields (default: bundled MiniLM).
        k: documents retrieved per question.
        max_tokens: most tokens per answer (a request may ask for fewer or more).
        system_prompt: the pipeline's instructions (default: :data:`~gpuprompt.rag.DEFAULT_SYSTEM_PROMPT`).
        num_replicas: replicas, or ``"auto"`` (Serve's autoscaling; tune with ``autoscaling_config``).
        autoscaling_config: Serve's autoscaling options (then leave ``num_replicas`` at 1 or "auto").
        max_ongoing_requests: requests per replica at once (>= 1; default 256 so batches form).
        ray_actor_options: per-replica resources, for example ``{"num_gpus": 1}``.
        name: the deployment's name.

    Returns:
        A ``ray.serve.Application``: pass it to ``serve.run``.

    Raises:
        ConfigurationError: a bad option (checked here, before any replica starts).
        DependencyError: ``ray[serve]`` is not installed.
    """
    try:
        from ray import serve
    except ImportError as exc:
        raise DependencyError(
            f"build_app needs Ray Serve: pip install 'ray[serve]==2.60.*' (never 'ray[llm]') ({exc})"
        ) from exc
    from gpuprompt.embed import EmbedderConfig
    from gpuprompt.llm import LLMConfig

    if isinstance(llm, str):
        RemoteConfig(base_url=llm, api_key=llm_api_key)  # checks the options here, not in a replica
        if llm_model is not None and (not isinstance(llm_model, str) or not llm_model):
            raise fail("llm_model", "a non-empty str or None", llm_model, error=ConfigurationError)
        llm_fields: dict[str, Any] = {"remote": llm, "model": llm_model, "api_key": llm_api_key}
    else:
        if llm_model is not None or llm_api_key is not None:
            raise ConfigurationError("'llm_model' and 'llm_api_key' go with a remote 'llm' URL; set 'model' in 'llm'.")
        llm_fields = _fields(_config(llm, LLMConfig, "llm"))
    emb_config = _config(embedder, EmbedderConfig, "embedder")
    if index_path is not None:
        if not isinstance(index_path, (str, os.PathLike)) or not os.fspath(index_path):
            raise fail("index_path", "a path or None", index_path, error=ConfigurationError)
        index_path = os.fspath(index_path)
    check_int(k, "k", min=1, max=100, error=ConfigurationError)
    check_int(max_tokens, "max_tokens", min=1, max=MAX_TOKENS_LIMIT, error=ConfigurationError)
    check_int(max_ongoing_requests, "max_ongoing_requests", min=1, max=1_000_000, error=ConfigurationError)
    check_str(name, "name", allow_empty=False, error=ConfigurationError)
    check_str(system_prompt, "system_prompt", allow_none=True, error=ConfigurationError)
    if num_replicas != "auto":
        check_int(num_replicas, "num_replicas", min=1, max=100_000, error=ConfigurationError)
    for option, value in (("autoscaling_config", autoscaling_config), ("ray_actor_options", ray_actor_options)):
        if value is not None and not isinstance(value, Mapping):
            raise fail(option, "a dict or None", value, error=ConfigurationError)
    pipeline: dict[str, Any] = {"k": k, "max_tokens": max_tokens}
    if system_prompt is not None:
        pipeline["system_prompt"] = system_prompt
    options: dict[str, Any] = {"name": name, "max_ongoing_requests": max_ongoing_requests}
    if autoscaling_config is not None:
        options["autoscaling_config"] = dict(autoscaling_config)
    else:
        options["num_replicas"] = num_replicas
    if ray_actor_options is not None:
        options["ray_actor_options"] = dict(ray_actor_options)
    deployment = serve.deployment(RAGDeployment, **options)
    return deployment.bind(index_path, _fields(emb_config), llm_fields, pipeline)


def _config(value: Any, cls: type, name: str) -> Any:
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - valid, key=str)
        if unknown:
            raise ConfigurationError(f"unknown '{name}' option(s) {unknown}; valid options: {sorted(valid)}.")
        return cls(**value)
    raise ConfigurationError(f"'{name}' must be a {cls.__name__}, a dict of its fields or None (got {describe(value)}).")


def _fields(config: Any) -> dict[str, Any]:
    """A config as plain fields to ship to the replica (it rebuilds the config there)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
