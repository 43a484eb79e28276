"""The building blocks of the HTTP API's pydantic models: bounded field types and the request bases.

The OpenAI-compatible requests ignore unknown fields (builders send vendor extras); every known
field that changes the output reaches the core or is refused (see ``_schemas_chat.py`` for the
generating routes). Our own collection requests forbid unknown fields.

Every request field is bounded here, at the boundary (rule 10): ints and floats have ranges the
core and every backend accept (no NaN or infinity), every string must be well-formed Unicode (a
JSON escape such as ``"\\ud800"`` decodes to a lone surrogate that no UTF-8 writer accepts), and
free-form JSON (metadata, filters, schemas) goes through :func:`gpuprompt.validation.check_json`,
which bounds its nesting and size. A request that passes these models cannot make the core fail
with anything but its own typed errors.

In the OpenAI-compatible requests (and their nested objects) an explicit JSON ``null`` in an
optional field means exactly what leaving the field out means: the field takes its default (OpenAI's
spec marks these fields nullable, and some SDKs and hand-written clients send ``null`` for "the
default"), so no code past these models sees None where the default is not None. A required field
(``messages``, ``prompt``, ``input``) still refuses ``null`` with a 400.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from gpuprompt.batching import PRIORITY_MAX, PRIORITY_MIN, check_priority
from gpuprompt.validation import (
    INT64_MAX,
    INT64_MIN,
    MAX_DEPTH,
    check_int,
    check_json,
    check_metadata,
    check_number,
    check_text,
)
from gpuprompt.wire import MAX_TOKENS_LIMIT

__all__ = [
    "MAX_MODEL_NAME_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_STOP",
    "ChatK",
    "Choices",
    "Dimensions",
    "FilterObject",
    "JSONObject",
    "Metadata",
    "ModelName",
    "Name",
    "Priority",
    "QueryK",
    "Seed",
    "Temperature",
    "Text",
    "TokenCount",
    "TopP",
    "UsageModel",
]

MAX_NAME_LENGTH = 256
"""Longest session id or record id."""
MAX_MODEL_NAME_LENGTH = 4096
"""Longest ``model`` (a served model may be named by its local path)."""
MAX_STOP = 16
"""Most stop strings (OpenAI allows 4; vLLM more)."""


def _run(check: Callable[..., Any], **options: Any) -> Callable[[Any], Any]:
    """Wrap one of the core's checks for pydantic (the rule lives once, in the core).

    The check's message names the argument ``'$'`` (``'$' must be ...``); the server's error
    renderer replaces that name with the request field's path.
    """

    def run(value: Any) -> Any:
        return check(value, "$", **options)

    run.__name__ = check.__name__
    return run


def _core(check: Callable[..., Any], **options: Any) -> AfterValidator:
    """A validator running a core check on the value pydantic parsed."""
    return AfterValidator(_run(check, **options))


def _int(low: int, high: int, check: Callable[..., Any] = check_int) -> Any:
    """An int field in ``[low, high]``, checked by the core before pydantic's lax parsing: bools,
    floats and numeric strings are refused (OpenAI refuses them too); the range shows in the
    OpenAPI schema."""
    options = {"min": low, "max": high} if check is check_int else {}
    return Annotated[int, Field(ge=low, le=high), BeforeValidator(_run(check, **options))]


def _number(low: float, high: float) -> Any:
    """A finite float field in ``[low, high]`` (ints accepted; NaN, infinity, bools and strings refused)."""
    return Annotated[float, Field(ge=low, le=high), BeforeValidator(_run(check_number, min=low, max=high))]


def _json_object(value: dict[str, Any] | None) -> dict[str, Any] | None:
    # A detached copy with bounded nesting and size, int64 ints, finite floats, clean strings.
    return None if value is None else check_json(value, "$", max_depth=MAX_DEPTH)


Text = Annotated[str, _core(check_text)]
"""A well-formed Unicode string (no lone surrogates)."""
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH), _core(check_text)]
"""A non-empty, bounded, well-formed name."""
ModelName = Annotated[str, Field(max_length=MAX_MODEL_NAME_LENGTH), _core(check_text)]
"""The ``model`` field: a served model's id, last path segment or (non-strict) any name."""
JSONObject = Annotated[dict[str, Any], AfterValidator(_json_object)]
"""A JSON object (str keys) nested at most ``MAX_DEPTH`` deep, with int64 ints and finite floats."""


def _filter_object(value: dict[str, Any] | None) -> dict[str, Any] | None:
    # As a JSON object, but ints of any size: the core compares filter operands exactly, so a
    # filter the index takes in process is taken here too (``{"n": {"$lt": 2**70}}``).
    return None if value is None else check_json(value, "$", max_depth=MAX_DEPTH, int64=False)


FilterObject = Annotated[dict[str, Any], AfterValidator(_filter_object)]
"""A metadata filter in the core's language: a JSON object as :data:`JSONObject`, any int size."""
Metadata = Annotated[dict[str, Any] | None, _core(check_metadata)]
"""A record's metadata: a JSON object (``None`` becomes ``{}``)."""
TokenCount = _int(1, MAX_TOKENS_LIMIT)
"""A number of tokens to generate."""
Seed = _int(INT64_MIN, INT64_MAX)
"""A sampling seed: any int64 (OpenAI's range; torch and vLLM take it)."""
Priority = _int(PRIORITY_MIN, PRIORITY_MAX, check_priority)
"""A scheduling priority, lower first: the core's :data:`~gpuprompt.batching.PRIORITY_MIN` to
:data:`~gpuprompt.batching.PRIORITY_MAX` (checked by :func:`~gpuprompt.batching.check_priority`)."""
Choices = _int(1, 16)
"""``n``: choices per completion."""
QueryK = _int(1, 1000)
"""Hits per collection query."""
ChatK = _int(1, 100)
"""Documents retrieved per collection chat turn."""
Dimensions = _int(1, 2**16)
"""An embedding dimension."""
Temperature = _number(0.0, 2.0)
"""OpenAI's sampling temperature range."""
TopP = _number(0.0, 1.0)
"""Nucleus sampling mass."""


class _Request(BaseModel):
    # NaN and infinity (JSON's NaN / Infinity / 1e999) are refused in every float field.
    model_config = ConfigDict(allow_inf_nan=False)


@cache
def _optional_keys(model: type[BaseModel]) -> frozenset[str]:
    """The JSON keys of ``model``'s optional fields (those with a default), by alias where one is set.

    Args:
        model: A request model class.

    Returns:
        The keys an explicit ``null`` may be dropped from.
    """
    keys: set[str] = set()
    for name, info in model.model_fields.items():
        if not info.is_required():
            alias = info.validation_alias if isinstance(info.validation_alias, str) else info.alias
            keys.add(alias or name)
    return frozenset(keys)


class _OpenAIRequest(_Request):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """Drop the optional fields sent as ``null``, so they take their defaults as if omitted.

        OpenAI's spec marks its optional request fields nullable and clients send ``null`` for "the
        default"; a field whose default is not None (``temperature``, ``n``, ``stream``, ...) must
        then get that default, never None, and its non-null values keep their checks. Required
        fields are left alone, so a ``null`` there is still refused.

        Args:
            data: The raw input of the model (a JSON object, or anything a client sent instead).

        Returns:
            ``data`` without its optional ``null`` entries (``data`` itself when it has none, or
            when it is not an object: the model's own checks refuse that).
        """
        if not isinstance(data, dict):
            return data
        optional = _optional_keys(cls)
        if not any(value is None and key in optional for key, value in data.items()):
            return data
        return {key: value for key, value in data.items() if not (value is None and key in optional)}


class _Strict(_Request):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# ---------------------------------------------------------------------- shared
class UsageModel(BaseModel):
    """Token counts of one request."""

    prompt_tokens: int
    """Tokens read (the rendered prompt, or the embedded texts)."""
    completion_tokens: int = 0
    """Tokens generated."""
    total_tokens: int
    """Their sum."""
