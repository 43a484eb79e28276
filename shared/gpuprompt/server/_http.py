"""Small HTTP helpers shared by the route modules: JSON and SSE bodies, disconnect-aware awaiting."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

__all__ = ["SSE_HEADERS", "all_or_none", "json_response", "sse", "until_disconnect"]

T = TypeVar("T")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def json_response(model: BaseModel, status: int = 200, *, exclude_none: bool = False) -> Response:
    """A JSON response of ``model`` (pydantic-core serialises in Rust; no second validation);
    ``exclude_none`` leaves out the fields that are None."""
    return Response(model.model_dump_json(exclude_none=exclude_none), status_code=status, media_type="application/json")


def sse(payload: Mapping[str, Any]) -> str:
    """One server-sent event carrying ``payload`` as compact JSON."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def until_disconnect(request: Request, work: Awaitable[T]) -> T | Response:
    """Run ``work``; if the client disconnects first, cancel it (the engine aborts the request).

    Returns:
        The result, or a 499 response (nobody will read it) when the client went away.
    """
    task = asyncio.ensure_future(work)
    gone = False

    async def watch() -> None:
        nonlocal gone
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone = True
                task.cancel()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if gone:
            return Response(status_code=499)
        raise
    finally:
        watcher.cancel()
        task.cancel()


async def all_or_none(works: list[Awaitable[T]]) -> list[T]:
    """Await every choice; if one fails (or the caller is cancelled), cancel the others in the engine."""
    tasks = [asyncio.ensure_future(work) for work in works]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
