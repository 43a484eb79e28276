"""The one prompt format, decoding constraint and parser of tool calls.

* **Prompt.** A chat template that takes ``tools=`` (detected from its source: it reads a
  ``tools`` variable) renders the tools, assistant tool calls and tool results itself. Otherwise
  (the bundled SmolLM2 template) a fallback in the Hermes/Qwen style: the tools as a ``<tools>``
  JSON list in the system turn with an instruction, past calls as ``<tool_call>{"name": ...,
  "arguments": {...}}</tool_call>`` in the assistant turn, results as ``tool`` turns (or
  ``<tool_response>`` user turns when the template refuses that role).
* **Constraint.** ``tool_choice="required"`` or a named tool: the reply is decoded under a JSON
  schema that admits only calls of the bound tools (arguments under each tool's schema), a list
  when ``parallel_tool_calls`` and one object otherwise. ``"auto"`` on a template without tools
  (or with a ``response_format``): the same schema plus the pseudo-tool :data:`ANSWER_TOOL`
  (``{"name": "__answer__", "arguments": {"content": <prose>}}``), so the reply is prose or
  well-formed calls, never a broken call. ``"auto"`` on a template with tools: unconstrained; the
  model writes its own ``<tool_call>`` blocks. ``"none"``: tools described, nothing constrained
  or parsed.
* **Parser.** :class:`ToolOutputParser` reads the reply incrementally (streaming) or at once and
  yields prose plus :class:`ToolCall` objects; both paths run the same code, so a stream's deltas
  concatenate to the non-streamed result. A call the token limit cut short comes back as OpenAI
  and vLLM's server return it: its id, its name and the argument text generated so far, marked
  :attr:`ToolCall.incomplete` (the calls before it in a list are whole).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpuprompt.llm._tools import ANSWER_TOOL, ToolCall, ToolCallDelta, ToolSpec, new_call_id

__all__ = [
    "ToolOutputParser",
    "ToolPlan",
    "build_chat",
    "plan_tools",
    "template_supports_tools",
]

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"\s*(\{.*\})\s*", re.DOTALL)
_ANSWER_PREFIX = re.compile(
    r'^\s*\{\s*"name"\s*:\s*"' + ANSWER_TOOL + r'"\s*,\s*"arguments"\s*:\s*\{\s*"content"\s*:\s*', re.DOTALL
)
# The head of a call cut short: its whole name, then (once written) the start of its arguments.
_CUT_CALL = re.compile(r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_.-]{1,64})"(\s*,\s*"arguments"\s*:\s*)?', re.DOTALL)


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders ``tools=`` (its source reads ``tools``)."""
    template = getattr(tokenizer, "chat_template", None)
    sources = template.values() if isinstance(template, Mapping) else [template]
    return any(isinstance(s, str) and re.search(r"\btools\b", s) is not None for s in sources)


@dataclass(frozen=True)
class ToolPlan:
    """How one request's tools are rendered, constrained and parsed.

    Attributes:
        kind: ``"json"`` (the reply is decoded under :attr:`schema`), ``"tagged"`` (unconstrained;
            ``<tool_call>`` blocks are parsed) or ``"off"`` (tools described, nothing parsed).
        native: the chat template renders the tools itself.
        tools: the request's tools.
        choice: the normalised ``tool_choice``.
        parallel: several calls allowed.
        schema: the JSON schema of the reply when ``kind == "json"``.
        answer: how the pseudo-tool's content maps to text: ``"text"`` (a string) or ``"json"``
            (a JSON value, dumped: the answer follows a ``response_format``); None when the
            reply must be calls.
        calls_schema: the JSON schema of the calls alone (definitions included) when the prose
            form is free text (``"auto"`` without a constraint on the answer). The backends that
            decode with xgrammar then decode the union of these calls and a prose form whose
            content holds at least one non-blank character (JSON schema's ``pattern`` and
            ``minLength`` would forbid escapes such as ``\\n`` in xgrammar), so the reply is never
            an empty answer; :attr:`schema` (the prose form as any string) stays the portable
            constraint sent to other servers.
    """

    kind: Literal["json", "tagged", "off"]
    native: bool
    tools: tuple[ToolSpec, ...]
    choice: str
    parallel: bool
    schema: Mapping[str, Any] | None = None
    answer: Literal["text", "json"] | None = None
    calls_schema: Mapping[str, Any] | None = None

    @property
    def guided(self) -> dict[str, Any] | None:
        """The backend constraint, ``{"json": schema}``, or None when the reply is unconstrained."""
        if self.kind != "json":
            return None
        return {"json": self.schema}


_DEF_KEYS = ("$defs", "definitions")


def _pointer_token(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _pointer_escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _embed(schema: Mapping[str, Any], label: str, defs: dict[str, Any]) -> dict[str, Any]:
    """``schema`` made ready to sit anywhere inside a combined schema.

    Its root-relative definitions (``$defs`` / ``definitions``) move into ``defs`` (the combined
    schema's root ``$defs``), renamed when a name is already taken (by another tool), and every
    ``$ref`` into it is rewritten to match. A ``$ref`` to its root or to another place inside it
    (``"#"``, ``"#/properties/..."``) makes the whole schema a definition of its own, named after
    ``label``, so that the reference still resolves.

    Args:
        schema: a tool's parameters or a response format's JSON schema.
        label: a name for this schema (the tool's name), used when it becomes a definition.
        defs: the combined schema's definitions, filled in place.

    Returns:
        The schema to embed (a ``$ref`` to its definition when it refers to itself).
    """
    root = {k: v for k, v in schema.items() if k not in _DEF_KEYS}
    own: dict[tuple[str, str], Any] = {}
    for key in _DEF_KEYS:
        block = schema.get(key)
        if isinstance(block, Mapping):
            own.update({(key, name): body for name, body in block.items()})

    def fresh(name: str) -> str:
        candidate, i = name, 1
        while candidate in defs or candidate in taken:
            i += 1
            candidate = f"{name}_{i}"
        taken.add(candidate)
        return candidate

    taken: set[str] = set()
    renamed = {ref: fresh(ref[1]) for ref in own}
    root_name: list[str] = []  # filled once a reference to the root is met

    def target(ref: str) -> str:
        if ref != "#" and not ref.startswith("#/"):
            return ref  # an absolute or relative URI: not ours to move
        parts = ref[2:].split("/") if ref != "#" else []
        if len(parts) >= 2 and parts[0] in _DEF_KEYS and (parts[0], _pointer_token(parts[1])) in renamed:
            name = renamed[(parts[0], _pointer_token(parts[1]))]
            return "/".join(["#", "$defs", _pointer_escape(name), *parts[2:]])
        if not root_name:
            root_name.append(fresh(label))
        return "/".join(["#", "$defs", _pointer_escape(root_name[0]), *parts])

    def rewrite(node: Any) -> Any:
        if isinstance(node, Mapping):
            return {k: (target(v) if k == "$ref" and isinstance(v, str) else rewrite(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    body = rewrite(root)
    for ref, definition in own.items():
        defs[renamed[ref]] = rewrite(definition)
    if root_name:
        defs[root_name[0]] = body
        return {"$ref": f"#/$defs/{_pointer_escape(root_name[0])}"}
    return body


def _call_schema(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The schema of one call: ``arguments`` is already embedded (see :func:`_embed`)."""
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "enum": [name]}, "arguments": dict(arguments)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _answer_schema(
    guided: Mapping[str, Any] | None, defs: dict[str, Any]
) -> tuple[dict[str, Any], Literal["text", "json"]]:
    content: dict[str, Any]
    kind: Literal["text", "json"] = "text"
    if guided is None:
        content = {"type": "string"}
    elif "json" in guided:
        content, kind = _embed(guided["json"], "response_format", defs), "json"
    elif "json_object" in guided:
        content, kind = {"type": "object"}, "json"
    elif "regex" in guided:
        content = {"type": "string", "pattern": guided["regex"]}
    else:
        content = {"type": "string", "enum": list(guided["choice"])}
    arguments = {"type": "object", "properties": {"content": content}, "required": ["content"],
                 "additionalProperties": False}
    return _call_schema(ANSWER_TOOL, arguments), kind


def plan_tools(request: Any, native: bool) -> ToolPlan | None:
    """The plan for a :class:`~gpuprompt.llm.GenerationRequest`, or None when it has no tools.

    A named ``tool_choice`` means exactly one call of that tool (a single object, whatever
    ``parallel_tool_calls`` says). The schemas of the tools (and of a ``response_format``) are
    embedded with their definitions hoisted to the root of the combined schema, so that nested
    models (``$defs`` and ``#/$defs/...`` references) keep resolving.
    """
    tools: tuple[ToolSpec, ...] = tuple(request.tools)
    if not tools:
        return None
    choice, parallel = request.tool_choice, request.parallel_tool_calls
    if choice == "none":
        return ToolPlan("off", native, tools, choice, parallel)
    if choice == "auto" and native and request.guided is None:
        return ToolPlan("tagged", native, tools, choice, parallel)
    named = choice not in ("auto", "required")
    if named:
        parallel = False
    bound = tuple(t for t in tools if t.name == choice) if named else tools
    defs: dict[str, Any] = {}
    answer = None
    answer_schema: dict[str, Any] | None = None
    if choice == "auto":
        answer_schema, answer = _answer_schema(request.guided, defs)
    options = [_call_schema(tool.name, _embed(tool.parameters, tool.name, defs)) for tool in bound]
    call = options[0] if len(options) == 1 else {"anyOf": options}
    reply: dict[str, Any] = {"type": "array", "items": call, "minItems": 1} if parallel else call
    calls_schema = None
    if answer_schema is not None:
        if request.guided is None:  # free prose: xgrammar backends require a non-blank answer
            calls_schema = {**reply, "$defs": defs} if defs else reply
        reply = {"anyOf": [answer_schema, *reply.get("anyOf", [reply])]}
    if defs:
        reply = {**reply, "$defs": defs}
    return ToolPlan("json", native, tools, choice, parallel, reply, answer, calls_schema)


# ---------------------------------------------------------------------- prompt
def _listing(tools: Sequence[ToolSpec]) -> str:
    lines = [json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters},
                        ensure_ascii=False) for t in tools]
    return "<tools>\n" + "\n".join(lines) + "\n</tools>"


def instruction(plan: ToolPlan) -> str:
    """What the system turn tells the model about replying (fallback format, or a constraint the
    model's own template does not describe)."""
    call = '{"name": <tool name>, "arguments": {<argument>: <value>}}'
    several = " (a JSON list of such objects calls several tools at once)" if plan.parallel else ""
    if plan.kind == "off":
        return "Do not call any tool in this reply; answer in prose."
    if plan.kind == "tagged":
        return f"To call a tool, reply with {_OPEN}{call}{_CLOSE}."
    if plan.choice == "auto":
        return (f"To call a tool, reply with one JSON object {call}{several}. To answer the user directly "
                f'instead, reply {{"name": "{ANSWER_TOOL}", "arguments": {{"content": <your answer>}}}}.')
    if plan.choice == "required":
        return f"Call a tool now: reply with one JSON object {call}{several}."
    return f'Call the tool {plan.choice!r} now: reply with {{"name": "{plan.choice}", "arguments": {{...}}}}{several}.'


def _call_text(call: ToolCall) -> str:
    body = json.dumps({"name": call.name, "arguments": call.args}, ensure_ascii=False)
    return f"{_OPEN}\n{body}\n{_CLOSE}"


def build_chat(
    messages: Sequence[Mapping[str, Any]], plan: ToolPlan | None, *, native: bool = False, tool_role: bool = True
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages (and the ``tools=`` argument) to hand the chat template.

    Args:
        messages: validated request messages.
        plan: the request's tool plan (None: no tools bound; tool turns in the history still render).
        native: the template renders tools, tool calls and tool turns itself.
        tool_role: the template accepts ``tool`` turns (else results become ``<tool_response>``
            user turns).

    Returns:
        ``(messages, tools)``: ``tools`` is None unless the template renders tools itself.
    """
    native = native or (plan is not None and plan.native)
    out: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message["content"]
        calls: Sequence[ToolCall] = message.get("tool_calls", ())
        if role == "assistant" and calls:
            if native:
                out.append({"role": "assistant", "content": content or None, "tool_calls": [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.args}}
                    for c in calls]})
            else:
                text = "\n".join(_call_text(c) for c in calls)
                out.append({"role": "assistant", "content": f"{content}\n{text}" if content else text})
        elif role == "tool":
            if native:
                out.append({k: v for k, v in message.items() if k in ("role", "content", "tool_call_id", "name")})
            elif tool_role:
                out.append({"role": "tool", "content": content})
            else:
                out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": role, "content": content})
    if plan is None:
        return out, None
    note = instruction(plan) if (not native or plan.kind == "json" or plan.kind == "off") else ""
    if native:
        tools = [t.to_openai() for t in plan.tools]
        if note:
            _add_system(out, note)
        return out, tools
    _add_system(out, "You can call these tools:\n" + _listing(plan.tools) + "\n" + note)
    return out, None


def _add_system(messages: list[dict[str, Any]], text: str) -> None:
    if messages and messages[0]["role"] == "system":
        messages[0] = {**messages[0], "content": messages[0]["content"] + "\n\n" + text}
    else:
        messages.insert(0, {"role": "system", "content": text})


# ---------------------------------------------------------------------- parser
def _to_call(payload: Any, tools: Sequence[ToolSpec]) -> ToolCall | None:
    """A ``{"name", "arguments"}`` object as a ToolCall (None when it is not a call of a bound tool)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict) or payload["name"] not in {t.name for t in tools}:
        return None
    try:
        return ToolCall(new_call_id(), payload["name"], json.dumps(arguments, ensure_ascii=False))
    except ValueError:
        return None


def _partial_json_string(body: str) -> tuple[str, bool]:
    """Decode the longest safe prefix of a JSON string's body (after its opening quote).

    Returns the decoded text and whether the closing quote was reached.
    """
    i, n = 0, len(body)
    while i < n:
        ch = body[i]
        if ch == '"':
            return json.loads('"' + body[:i] + '"'), True
        if ch == "\\":
            if i + 1 >= n:
                break
            if body[i + 1] == "u":
                if i + 6 > n:
                    break
                code = int(body[i + 2 : i + 6], 16) if re.fullmatch(r"[0-9a-fA-F]{4}", body[i + 2 : i + 6]) else 0
                if 0xD800 <= code < 0xDC00 and i + 12 > n:  # the low half of a surrogate pair is still to come
                    break
                i += 12 if 0xD800 <= code < 0xDC00 else 6
                continue
            i += 2
            continue
        i += 1
    try:
        return json.loads('"' + body[:i] + '"'), False
    except ValueError:
        return "", False


class ToolOutputParser:
    """Turns a reply under a :class:`ToolPlan` into prose and tool calls, piece by piece.

    ``feed`` returns the prose and call deltas that are certain so far; ``finish`` returns the
    rest plus the complete calls. Streaming and non-streaming replies run the same code. Whole calls
    are handed out once complete; a call the token limit cut short is handed out by ``finish(cut=True)``
    with the argument text generated so far (:attr:`ToolCall.incomplete`).
    """

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.buffer = ""
        self.emitted = ""  # prose already handed out
        self.calls: list[ToolCall] = []
        self._pos = 0  # tagged: how far the buffer is consumed
        self._seen = 0  # json list: items already turned into calls
        self._list_end = 0  # json list: where the first item not yet complete begins
        self._cut = False  # finish(cut=True): the token limit ended the reply

    def feed(self, text: str) -> tuple[str, tuple[ToolCallDelta, ...]]:
        """Add generated text; return new prose and new call deltas."""
        self.buffer += text
        if self.plan.kind == "json":
            if self.buffer.lstrip().startswith("["):
                return "", self._list_calls()
            return self._emit(self._answer_so_far(final=False)), ()
        if self.plan.kind == "tagged":
            return self._scan(final=False)
        return self._emit(self.buffer), ()

    def finish(self, *, cut: bool = False) -> tuple[str, tuple[ToolCallDelta, ...]]:
        """End of the reply: the remaining prose and call deltas (:attr:`calls` is then complete).

        Args:
            cut: the token limit ended the reply (``finish_reason == "length"``): a call it cut
                short is handed out with the argument text written so far, marked incomplete.
                Otherwise a broken call is never a call (a tagged block stays prose).
        """
        self._cut = cut
        if self.plan.kind == "tagged":
            return self._scan(final=True)
        if self.plan.kind != "json":
            return self._emit(self.buffer), ()
        stripped = self.buffer.lstrip()
        if stripped.startswith("["):
            # A list of calls: the complete ones were handed out as they closed; one cut short
            # (max_tokens) follows them, incomplete.
            deltas = self._list_calls()
            rest = self.buffer[self._list_end :].lstrip(" \t\r\n,")
            call = self._cut_call(rest) if cut and rest.startswith("{") else None
            return "", deltas + (self._add_calls([call]) if call is not None else ())
        try:
            payload = json.loads(self.buffer)
        except ValueError:
            payload = None
        if self.plan.answer is not None and _ANSWER_PREFIX.match(self.buffer) is not None:
            # The pseudo-tool's answer, whole or cut short: its prose (decoded), never its wrapper.
            return self._emit(self._answer_so_far(final=True)), ()
        call = _to_call(payload, self.plan.tools)
        if call is not None:
            return "", self._add_calls([call])
        if stripped and not stripped.startswith("{"):
            # Not the constrained JSON at all (the backend lifted a constraint its tokens broke):
            # what the model wrote is its reply.
            return self._emit(self.buffer), ()
        call = self._cut_call(stripped) if cut else None
        if call is not None:
            return "", self._add_calls([call])
        # The answer's wrapper cut before its content, or a call cut before its name is known:
        # nothing of it is handed out.
        return "", ()

    @property
    def text(self) -> str:
        """All prose handed out so far."""
        return self.emitted

    # -------------------------------------------------------------- internals
    def _emit(self, prose: str) -> str:
        if not prose.startswith(self.emitted):
            return ""
        new = prose[len(self.emitted) :]
        self.emitted = prose
        return new

    def _add_calls(self, calls: list[ToolCall]) -> tuple[ToolCallDelta, ...]:
        if not self.plan.parallel:
            calls = calls[: max(0, 1 - len(self.calls))]
        start = len(self.calls)
        self.calls.extend(calls)
        return tuple(ToolCallDelta(start + i, c.id, c.name, c.arguments) for i, c in enumerate(calls))

    def _cut_call(self, text: str) -> ToolCall | None:
        """The call ``text`` (one call's JSON, cut short) was writing, or None when its tool is not
        known yet. Its arguments are the text after ``"arguments":`` as generated; a call whose
        arguments object is already whole (only its wrapper was cut) is a complete call."""
        names = {t.name for t in self.plan.tools}
        match = _CUT_CALL.match(text)
        if match is not None:
            name, arguments = match.group(1), text[match.end() :] if match.group(2) else ""
        elif self.plan.choice in names and text.lstrip().startswith("{"):
            name, arguments = self.plan.choice, ""  # a named choice: the tool is known before its name is written
        else:
            return None
        if name not in names:
            return None
        try:
            value = json.loads(arguments)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return ToolCall(new_call_id(), name, json.dumps(value, ensure_ascii=False))
        return ToolCall(new_call_id(), name, arguments, incomplete=True)

    def _list_calls(self) -> tuple[ToolCallDelta, ...]:
        """New calls completed in a JSON list of calls (each is handed out once it is complete)."""
        decoder = json.JSONDecoder()
        text = self.buffer
        pos = text.index("[") + 1
        items: list[Any] = []
        while True:
            while pos < len(text) and text[pos] in " \t\r\n,":
                pos += 1
            if pos >= len(text) or text[pos] == "]":
                break
            try:
                item, pos = decoder.raw_decode(text, pos)
            except ValueError:
                break
            items.append(item)
        self._list_end = pos
        fresh = items[self._seen :]
        self._seen = len(items)
        calls = [_to_call(item, self.plan.tools) for item in fresh]
        return self._add_calls([c for c in calls if c is not None])

    def _answer_so_far(self, *, final: bool) -> str:
        """The pseudo-tool's prose decoded so far ("" until the reply is known to be an answer)."""
        match = _ANSWER_PREFIX.match(self.buffer)
        if match is None or self.plan.answer is None:
            return self.emitted
        rest = self.buffer[match.end() :]
        if self.plan.answer == "json":
            if not final:
                return self.emitted
            try:
                value, _ = json.JSONDecoder().raw_decode(rest.lstrip())
            except ValueError:
                return rest.strip()
            return json.dumps(value, ensure_ascii=False)
        if not rest.startswith('"'):
            return self.emitted
        return _partial_json_string(rest[1:])[0]

    def _scan(self, *, final: bool) -> tuple[str, tuple[ToolCallDelta, ...]]:
        prose, deltas = "", []
        while True:
            rest = self.buffer[self._pos :]
            start = rest.find(_OPEN)
            if start < 0:
                hold = 0 if final else _partial_suffix(rest, _OPEN)
                prose += rest[: len(rest) - hold]
                self._pos += len(rest) - hold
                break
            prose += rest[:start]
            end = rest.find(_CLOSE, start)
            if end < 0 and not final:
                self._pos += start
                break
            inner = rest[start + len(_OPEN) : end if end >= 0 else len(rest)]
            block = rest[start : end + len(_CLOSE) if end >= 0 else len(rest)]
            call = None
            match = _BLOCK.fullmatch(inner)
            if match is not None:
                try:
                    call = _to_call(json.loads(match.group(1)), self.plan.tools)
                except ValueError:
                    call = None
            if call is None and end < 0 and self._cut:
                call = self._cut_call(inner)  # the token limit cut this block: an incomplete call
            if call is not None:
                deltas.extend(self._add_calls([call]))
            else:
                prose += block
            self._pos += start + len(block)
        self.emitted += prose
        return prose, tuple(deltas)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
