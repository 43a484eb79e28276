"""Prompt preparation shared by every backend: chat template (tools included), token counts,
context-window checks and left truncation (drop the oldest turns, keep the system message(s) and
the last turn, never part of a tool-call exchange).
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuprompt.errors import ContextLengthError, InputTypeError, InvalidInputError, describe
from gpuprompt.llm._tool_format import ToolPlan, build_chat, plan_tools, template_supports_tools
from gpuprompt.llm._types import GenerationRequest

__all__ = ["ChatFormatter", "Prepared"]


@dataclass(frozen=True)
class Prepared:
    """A validated request, tokenized and fitted to the context window.

    Attributes:
        request: the caller's request.
        request_id: its id (the caller's or a generated one).
        token_ids: the prompt's token ids, as the backend will see them.
        max_tokens: the request's ``max_tokens`` capped by the room left in the window.
        dropped_messages: messages removed by ``truncate="left"`` (tokens, for a raw prompt).
        tool_plan: how tools are constrained and parsed (None: no tools bound).
        guided: the constraint the backend applies: the request's own, or the tool calls' schema
            (``{"json": ...}``); None when unconstrained.
    """

    request: GenerationRequest
    request_id: str
    token_ids: list[int]
    max_tokens: int
    dropped_messages: int = 0
    tool_plan: ToolPlan | None = None
    guided: Mapping[str, Any] | None = None

    @property
    def prompt_tokens(self) -> int:
        """Tokens in the prompt."""
        return len(self.token_ids)


class ChatFormatter:
    """Applies a tokenizer's chat template and fits prompts to a context window.

    Thread-safe: calls share one tokenizer under a lock (fast tokenizers are not safe to share
    between threads that change their settings).

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        context_window: the most prompt + generated tokens the engine holds for one request.
        model_name: the model's name, for error messages.
    """

    def __init__(self, tokenizer: Any, context_window: int, model_name: str) -> None:
        self.tokenizer = tokenizer
        self.context_window = context_window
        self.model_name = model_name
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<ChatFormatter {self.model_name!r} context_window={self.context_window}>"

    # ------------------------------------------------------------------ encoding
    @functools.cached_property
    def native_tools(self) -> bool:
        """Whether the model's chat template renders ``tools=`` itself (read once)."""
        return template_supports_tools(self.tokenizer)

    @functools.cached_property
    def template_variables(self) -> frozenset[str]:
        """The names the chat template reads from its context (``messages``, ``tools``,
        ``enable_thinking``, ...), read once from its source; empty without a template."""
        template = getattr(self.tokenizer, "chat_template", None)
        sources = list(template.values()) if isinstance(template, dict) else [template]
        try:
            from jinja2 import meta
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            environment = ImmutableSandboxedEnvironment()
            return frozenset().union(*(meta.find_undeclared_variables(environment.parse(source))
                                       for source in sources if isinstance(source, str)))
        except Exception:  # noqa: BLE001 - a template jinja cannot parse reads everything, as far as we know
            return frozenset({"*"})

    def _tool_role(self) -> bool:
        """Whether the template accepts ``tool`` turns (checked once)."""
        known = getattr(self, "_tool_role_ok", None)
        if known is None:
            try:
                with self._lock:
                    self.tokenizer.apply_chat_template(
                        [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}], tokenize=False
                    )
                known = True
            except Exception:  # noqa: BLE001 - any template error means: no tool role
                known = False
            self._tool_role_ok = known
        return known

    def plan(self, request: GenerationRequest) -> ToolPlan | None:
        """The request's tool plan under this model's template (None without tools)."""
        return plan_tools(request, self.native_tools)

    def render(self, messages: Sequence[Mapping[str, Any]], plan: ToolPlan | None = None) -> str:
        """The chat template applied to ``messages`` (and the tools of ``plan``), with the
        assistant's generation prompt."""
        has_tool_turns = any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
        if plan is not None or has_tool_turns:
            native = self.native_tools
            chat, tools = build_chat(messages, plan, native=native, tool_role=native or self._tool_role())
        else:
            chat, tools = [dict(m) for m in messages], None
        extra: dict[str, Any] = {"tools": tools} if tools is not None else {}
        try:
            with self._lock:
                return self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, **extra)
        except Exception as exc:  # jinja templates raise their own errors (e.g. unsupported roles)
            if getattr(self.tokenizer, "chat_template", None) is None:
                raise InvalidInputError(
                    f"model {self.model_name!r} has no chat template, so 'messages' cannot be used; "
                    "pass a raw 'prompt' instead."
                ) from exc
            raise InvalidInputError(
                f"the chat template of {self.model_name!r} rejected these messages: {exc}."
            ) from exc

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], plan: ToolPlan | None = None) -> list[int]:
        """Token ids of the rendered chat (the template holds the special tokens already)."""
        text = self.render(messages, plan)
        with self._lock:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_prompt(self, prompt: str) -> list[int]:
        """Token ids of a raw prompt (special tokens added as the tokenizer's default)."""
        with self._lock:
            return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])

    def count(
        self, messages_or_prompt: str | Sequence[Mapping[str, Any]] | GenerationRequest, *, tools: Any = None
    ) -> int:
        """Tokens of a raw prompt (str), of chat messages with the template applied (and the
        ``tools`` rendered into it), or of a whole GenerationRequest.

        Raises:
            InputTypeError: neither a str nor a list of message dicts.
        """
        return len(self.tokenize(messages_or_prompt, tools=tools))

    def tokenize(
        self, messages_or_prompt: str | Sequence[Mapping[str, Any]] | GenerationRequest, *, tools: Any = None
    ) -> list[int]:
        """The token ids :meth:`count` counts: a raw prompt's, or chat messages' with the template
        (and ``tools``) applied, or a whole GenerationRequest's.

        Raises:
            InputTypeError: neither a str nor a list of message dicts.
        """
        if isinstance(messages_or_prompt, str):
            if tools:
                raise InvalidInputError("'tools' need chat messages (got a raw prompt str).")
            return self._encode(GenerationRequest(prompt=messages_or_prompt))  # checked as a request's prompt
        if isinstance(messages_or_prompt, GenerationRequest):
            return self._encode(messages_or_prompt)
        if not isinstance(messages_or_prompt, Sequence):
            raise InputTypeError(
                f"'messages_or_prompt' must be a str or a list of message dicts (got {describe(messages_or_prompt)})."
            )
        request = GenerationRequest(messages=messages_or_prompt, tools=tools or ())
        return self._encode(request)

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        """Each id as the tokenizer's vocabulary spells it (``convert_ids_to_tokens``).

        Raises:
            InputTypeError: ``ids`` is not a list.
            InvalidInputError: an id outside the vocabulary.
        """
        self._check_ids(ids)
        with self._lock:
            return [str(piece) for piece in self.tokenizer.convert_ids_to_tokens(list(ids))]

    def _check_ids(self, ids: Sequence[int]) -> None:
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            raise InputTypeError(f"'tokens' must be a list of token ids (got {describe(ids)}).")
        size = len(self.tokenizer)
        for i, token in enumerate(ids):
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < size:
                raise InvalidInputError(f"'tokens[{i}]' must be a token id in [0, {size}) (got {describe(token)}).")

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of token ids (special tokens included, as the tokenizer decodes them).

        Raises:
            InputTypeError: ``ids`` is not a list.
            InvalidInputError: an id outside the vocabulary.
        """
        self._check_ids(ids)
        with self._lock:
            return str(self.tokenizer.decode(list(ids)))

    def _encode(self, request: GenerationRequest, plan: ToolPlan | None = None) -> list[int]:
        if request.messages is not None:
            return self.encode_chat(request.messages, plan if plan is not None else self.plan(request))
        assert request.prompt is not None
        return self.encode_prompt(request.prompt)

    # ------------------------------------------------------------------ fitting
    def prepare(self, request: GenerationRequest) -> Prepared:
        """Tokenize ``request`` and fit it to the context window.

        With ``truncate="error"`` the prompt must leave room for at least one new token. With
        ``truncate="left"`` the oldest turns are dropped until the prompt leaves room for
        ``max_tokens`` new tokens; the system message(s) and the last turn are always kept, and
        if they alone take more than the window allows, the request fails.

        Raises:
            ContextLengthError: the prompt does not fit (the error carries both lengths).
            InvalidInputError: the prompt is empty, or the chat template rejected the messages.
        """
        if not isinstance(request, GenerationRequest):
            raise InputTypeError(f"'request' must be a GenerationRequest (got {describe(request)}).")
        window = self.context_window
        limit = window - 1
        plan = self.plan(request)
        ids = self._encode(request, plan)
        if not ids:
            raise InvalidInputError("'prompt' must not be empty (got '' that is a str); pass some text.")
        dropped = 0
        if request.truncate == "left":
            target = max(1, window - request.max_tokens)
            if len(ids) > target:
                if request.messages is not None:
                    ids, dropped = self._truncate_messages(request.messages, target, plan)
                else:
                    dropped = len(ids) - target
                    ids = ids[-target:]
        if len(ids) > limit:
            hint = (
                "even the system message(s) and the last turn are too long; shorten them or raise max_model_len"
                if request.truncate == "left"
                else "shorten the prompt, raise max_model_len, or pass truncate='left' to drop the oldest turns"
            )
            raise ContextLengthError(
                f"the prompt has {len(ids)} tokens but the context window of {self.model_name!r} is {window} "
                f"tokens (the prompt may take at most {limit}, leaving room for one new token); {hint}.",
                prompt_tokens=len(ids),
                max_context=window,
            )
        request_id = request.request_id or uuid.uuid4().hex
        max_tokens = min(request.max_tokens, window - len(ids))
        guided = request.guided if plan is None or plan.kind != "json" else plan.guided
        return Prepared(request, request_id, ids, max_tokens, dropped, plan, guided)

    def _truncate_messages(
        self, messages: Sequence[Mapping[str, Any]], target: int, plan: ToolPlan | None = None
    ) -> tuple[list[int], int]:
        """Drop the fewest oldest turns so the rendered chat takes at most ``target`` tokens.

        Returns the token ids and the number of messages dropped; when even the smallest keepable
        chat exceeds ``target`` that chat is returned (the caller decides whether it still fits).
        """
        messages = list(messages)
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=len(messages) - 1)
        droppable = [i for i, m in enumerate(messages[:last_user]) if m["role"] != "system"]

        def kept(k: int) -> list[Mapping[str, str]]:
            gone = set(droppable[:k])
            # History should restart on a user turn, not on an orphaned assistant reply or tool
            # result (so an assistant's tool calls and their results go together).
            for i in droppable[k:]:
                if messages[i]["role"] in ("assistant", "tool"):
                    gone.add(i)
                else:
                    break
            return [m for i, m in enumerate(messages) if i not in gone]

        # Token count falls as more turns go: binary-search the fewest drops that fit.
        low, high = 1, len(droppable)
        best: tuple[list[int], int] | None = None
        while low <= high:
            mid = (low + high) // 2
            chat = kept(mid)
            ids = self.encode_chat(chat, plan)
            if len(ids) <= target:
                best = (ids, len(messages) - len(chat))
                high = mid - 1
            else:
                low = mid + 1
        if best is not None:
            return best
        chat = kept(len(droppable))
        return self.encode_chat(chat, plan), len(messages) - len(chat)
