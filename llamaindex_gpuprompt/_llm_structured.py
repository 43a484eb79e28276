"""Structured output for GPUPromptLLM: ``structured_predict`` and its async and streaming forms as
the core's JSON-schema guided decoding (both backends), like LlamaIndex's OpenAI LLM with
``response_format``. Other ``pydantic_program_mode`` values go through LlamaIndex's programs
(``FUNCTION``: a forced tool call; ``LLM``: prompt and parse).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from gpuprompt.errors import InvalidInputError
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.llm import (
    LLMStructuredPredictEndEvent,
    LLMStructuredPredictStartEvent,
)
from llama_index.core.types import PydanticProgramMode

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Generator

    from llama_index.core.base.llms.types import ChatMessage
    from llama_index.core.prompts import PromptTemplate
    from pydantic import BaseModel

__all__ = ["StructuredOutputMixin"]

dispatcher = get_dispatcher("llamaindex_gpuprompt._llm")


class StructuredOutputMixin:
    """The structured-output methods of GPUPromptLLM (a mixin placed before ``FunctionCallingLLM``)."""

    def _response_format(self) -> bool:
        """Structured output as JSON-schema guided decoding (like LlamaIndex's OpenAI LLM with
        ``response_format``); other program modes go through LlamaIndex's programs (FUNCTION: a
        forced tool call; LLM: prompt and parse)."""
        return self.pydantic_program_mode == PydanticProgramMode.DEFAULT and bool(self.engine.supports_structured_output)

    def _structured_messages(self, prompt: PromptTemplate, prompt_args: dict[str, Any]) -> list[ChatMessage]:
        return self._extend_messages(prompt.format_messages(llm=self, **prompt_args))

    @staticmethod
    def _parse(output_cls: type[BaseModel], text: str) -> BaseModel:
        from pydantic import ValidationError

        try:
            return output_cls.model_validate_json(text)
        except ValidationError as exc:
            raise InvalidInputError(
                f"the model's guided JSON does not validate as {output_cls.__name__} ({exc.error_count()} error(s); "
                f"got {text[:200]!r}); raise max_tokens (the output may be cut off) or simplify the schema."
            ) from exc

    @dispatcher.span
    def structured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> BaseModel:
        """Predict an ``output_cls`` instance: the engine's JSON-schema decoding guarantees valid
        JSON of the schema (both backends). With ``pydantic_program_mode=FUNCTION`` the instance
        comes from a forced tool call instead; with ``LLM``, from prompt-and-parse.

        Raises:
            InvalidInputError: the output does not validate (for example cut off by max_tokens).
        """
        if not self._response_format():
            return super().structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        dispatcher.event(LLMStructuredPredictStartEvent(output_cls=output_cls, template=prompt, template_args=prompt_args))
        messages = self._structured_messages(prompt, prompt_args)
        response = self.chat(messages, response_format=output_cls.model_json_schema(), **(llm_kwargs or {}))
        result = self._parse(output_cls, response.message.content or "")
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    @dispatcher.span
    async def astructured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> BaseModel:
        """Async :meth:`structured_predict`."""
        await self.engine.aload()  # starting the engine loads a model: never on the event loop
        if not self._response_format():
            return await super().astructured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        dispatcher.event(LLMStructuredPredictStartEvent(output_cls=output_cls, template=prompt, template_args=prompt_args))
        messages = self._structured_messages(prompt, prompt_args)
        response = await self.achat(messages, response_format=output_cls.model_json_schema(), **(llm_kwargs or {}))
        result = self._parse(output_cls, response.message.content or "")
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    def _structured_stream_call(
        self,
        output_cls: type[BaseModel],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Generator[Any, None, None]:
        # Behind stream_structured_predict: partial objects of the guided JSON as it streams.
        if not self._response_format():
            return super()._structured_stream_call(output_cls, prompt, llm_kwargs, **prompt_args)
        from llama_index.core.program.streaming_utils import process_streaming_content_incremental

        messages = self._structured_messages(prompt, prompt_args)
        stream = self.stream_chat(messages, response_format=output_cls.model_json_schema(), **(llm_kwargs or {}))

        def gen() -> Generator[Any, None, None]:
            current = None
            with contextlib.closing(stream):
                for response in stream:
                    current = process_streaming_content_incremental(response, output_cls, current)
                    yield current

        return gen()

    async def _structured_astream_call(
        self,
        output_cls: type[BaseModel],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> AsyncGenerator[Any, None]:
        # Behind astream_structured_predict.
        await self.engine.aload()
        if not self._response_format():
            return await super()._structured_astream_call(output_cls, prompt, llm_kwargs, **prompt_args)
        from llama_index.core.program.streaming_utils import process_streaming_content_incremental

        messages = self._structured_messages(prompt, prompt_args)
        stream = await self.astream_chat(messages, response_format=output_cls.model_json_schema(), **(llm_kwargs or {}))

        async def gen() -> AsyncGenerator[Any, None]:
            current = None
            async with contextlib.aclosing(stream):
                async for response in stream:
                    current = process_streaming_content_incremental(response, output_cls, current)
                    yield current

        return gen()
