"""vLLM's tokenizer routes: ``POST /tokenize`` (a prompt or a conversation to the served chat model's
token ids, as the generation routes read a request with that prompt, or those messages and tools
under ``tool_choice="auto"``) and ``POST /detokenize``.

Beside the ``/v1`` root, as vLLM serves them; counted against ``--max-in-flight`` as every POST is
(the API key and the body limit apply too).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import Response

from gpuprompt.server._http import json_response
from gpuprompt.server.errors import ApiError
from gpuprompt.server.routes.generation import check_template_kwargs
from gpuprompt.server.schemas.tokens import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from gpuprompt.server.state import State
from gpuprompt.wire import DETOKENIZE, TOKENIZE

__all__ = ["router"]

router = APIRouter()


@router.post(TOKENIZE, response_model=TokenizeResponse, tags=["tokens"])
async def tokenize(server: State, body: TokenizeRequest) -> Response:
    """The served chat model's token ids of a raw ``prompt``, or of ``messages`` (and ``tools``)
    with its chat template applied, as ``/v1/completions`` and ``/v1/chat/completions`` read them."""
    llm = server.require_llm()  # 404 naming --chat-model on a server with none
    server.check_model(body.model, "chat")
    if body.messages is not None:
        check_template_kwargs(body.chat_template_kwargs, llm)
    elif body.chat_template_kwargs:
        raise ApiError(400, "'chat_template_kwargs' need 'messages' (a raw prompt has no chat template).",
                       param="chat_template_kwargs", code="invalid_value")
    tools = [tool.core() for tool in body.tools] if body.tools else None
    ids = await asyncio.to_thread(llm.tokenize, body.core(), tools=tools)
    strs = await asyncio.to_thread(llm.token_strs, ids) if body.return_token_strs else None
    return json_response(TokenizeResponse(count=len(ids), max_model_len=llm.context_window, tokens=ids,
                                          token_strs=strs), exclude_none=True)


@router.post(DETOKENIZE, response_model=DetokenizeResponse, tags=["tokens"])
async def detokenize(server: State, body: DetokenizeRequest) -> Response:
    """The text of the served chat model's token ids."""
    llm = server.require_llm()
    server.check_model(body.model, "chat")
    return json_response(DetokenizeResponse(prompt=await asyncio.to_thread(llm.detokenize, body.tokens)))
