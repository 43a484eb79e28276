"""Pydantic models of vLLM's tokenizer routes, ``POST /tokenize`` and ``POST /detokenize``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, StrictBool, StrictInt, model_validator

from gpuprompt.server.schemas.base import ModelName, Text, _OpenAIRequest
from gpuprompt.server.schemas.chat import MAX_TOOLS, ChatMessage, ToolDefinition

__all__ = ["DetokenizeRequest", "DetokenizeResponse", "MAX_TOKENIZE_IDS", "TokenizeRequest", "TokenizeResponse"]

MAX_TOKENIZE_IDS = 1_000_000
"""Most token ids one ``/detokenize`` request may send."""


class TokenizeRequest(_OpenAIRequest):
    """``POST /tokenize``: a raw ``prompt``, or chat ``messages`` (with ``tools``) as the chat route
    renders them (chat template and generation prompt applied)."""

    model: ModelName | None = None
    """The chat model (see ``GET /v1/models``); None for the served one."""
    prompt: Text | None = None
    """A raw prompt, tokenised as ``/v1/completions`` reads it (special tokens added)."""
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    """A conversation, tokenised as ``/v1/chat/completions`` reads it."""
    tools: list[ToolDefinition] | None = Field(None, max_length=MAX_TOOLS)
    """Tool definitions rendered into the chat template, as a chat request with them would be."""
    add_generation_prompt: Literal[True] = True
    """Only true: the chat route always asks for a reply."""
    add_special_tokens: StrictBool | None = None
    """vLLM's meaning and defaults: a prompt's special tokens are added (true), a conversation's come
    from its chat template (false); the other value is refused (the generation routes never read it)."""
    continue_final_message: Literal[False] = False
    """Only false (the generation routes start a new assistant turn)."""
    chat_template: None = None
    """Refused when given: the served model's own template is what the chat route applies."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Keys the chat template does not read are accepted (they change nothing); a key it reads is
    refused, as on the chat route, which renders the template without them."""
    return_token_strs: StrictBool = False
    """Also return each token as the tokenizer's vocabulary spells it (``convert_ids_to_tokens``)."""

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send exactly one of 'prompt' (a raw prompt) and 'messages' (a conversation)")
        if self.tools and self.messages is None:
            raise ValueError("'tools' need 'messages' (a raw prompt has no chat template to render them into)")
        if self.add_special_tokens is not None and self.add_special_tokens != (self.messages is None):
            raise ValueError(
                "'add_special_tokens' must be true for a prompt and false for messages (their chat template "
                "holds the special tokens), as the generation routes read them"
            )
        return self

    def core(self) -> Any:
        """The engine's input: the prompt, or the core messages."""
        return self.prompt if self.messages is None else [message.core() for message in self.messages]


class TokenizeResponse(BaseModel):
    """The tokens of a ``/tokenize`` request, as vLLM answers it."""

    count: int
    """How many tokens."""
    max_model_len: int
    """The served model's context window."""
    tokens: list[int]
    """The token ids."""
    token_strs: list[str] | None = None
    """Each token as the vocabulary spells it (with ``return_token_strs``)."""


class DetokenizeRequest(_OpenAIRequest):
    """``POST /detokenize``: token ids back to text."""

    model: ModelName | None = None
    """The chat model; None for the served one."""
    tokens: list[StrictInt] = Field(max_length=MAX_TOKENIZE_IDS)
    """The token ids."""


class DetokenizeResponse(BaseModel):
    """The text of a ``/detokenize`` request, as vLLM answers it."""

    prompt: str
    """The decoded text."""
