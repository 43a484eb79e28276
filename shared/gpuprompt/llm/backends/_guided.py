"""Guided decoding and the extra sampling fields for the transformers backend, as per-row logits
processors inside its padded ``generate`` batches.

Why xgrammar: it is the grammar engine vLLM uses by default, so both backends constrain with the
same library, compile the same JSON schema / regex / EBNF the same way (the vLLM backend is set
to xgrammar and compact JSON too), and accept the same schemas. Its ``GrammarMatcher`` is a
per-sequence object over a compiled grammar shared across requests (compilation is cached by
the compiler), and it fills a token bitmask for one row of a batch at a time, which is exactly
what a padded batch with constrained and unconstrained rows needs. llguidance would also fit;
outlines-core builds a full token-level index per regex, which is slow for large JSON schemas.

Tool replies under ``tool_choice="auto"`` with a free-text answer are decoded under one EBNF grammar
on both backends (:func:`decoding_constraint`): the calls' JSON schema, or the prose form with at
least one non-blank character. JSON schema cannot say "non-blank" here: xgrammar 0.2's strings
under ``pattern`` or ``minLength`` admit no escapes (no ``\\n``, no ``\\"``) in the answer.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from gpuprompt.errors import DependencyError, InvalidInputError

__all__ = ["COMPACT", "GrammarCache", "GuidedProcessor", "MinTokensProcessor", "PenaltyProcessor",
           "answer_or_calls_grammar", "check_constraint", "choice_grammar", "constraints_to_check",
           "decoding_constraint"]

_FIELDS = {"json": "response_format", "json_object": "response_format", "regex": "guided_regex",
           "choice": "guided_choice", "grammar": "tools"}

COMPACT: tuple[str, str] = (",", ":")
"""The JSON separators (between items, after keys) the transformers backend decodes with; the vLLM
backend decodes with xgrammar's defaults, ``(", ", ": ")``."""

# The prose form's content after its opening quote: blanks (space, \n, \r, \t, \f escapes), one
# character that is not blank (nor a control, nor a Unicode space; an escaped quote, backslash or
# slash, or a \u escape above U+0020), then any JSON string characters up to the closing quote.
_ANSWER_RULES = "\n".join([
    r'answer_blank ::= " " | "\\" [nrtf]',
    r'answer_first ::= [^\0-\x20\"\\\x7f-\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]'
    r' | "\\" [\"\\/] | "\\u" answer_u',
    r'answer_u ::= [1-9a-fA-F] answer_hex answer_hex answer_hex | "0" [1-9a-fA-F] answer_hex answer_hex'
    r' | "00" [3-9a-fA-F] answer_hex | "002" [1-9a-fA-F]',
    r"answer_hex ::= [0-9a-fA-F]",
    r'answer_rest ::= ([^\0-\x1f\"\\] | "\\" ([\"\\/bfnrt] | "u" answer_hex answer_hex answer_hex answer_hex))*',
])


def _literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@functools.lru_cache(maxsize=256)
def _answer_or_calls(calls_schema: str, separators: tuple[str, str] | None) -> str:
    import xgrammar as xgr

    from gpuprompt.llm._tools import ANSWER_TOOL

    item, key = separators or (", ", ": ")
    head = f'{{"name"{key}"{ANSWER_TOOL}"{item}"arguments"{key}{{"content"{key}"'
    tail = _literal('"}}')  # the content's closing quote, then the arguments' and the call's braces
    answer = xgr.Grammar.from_ebnf(f"root ::= {_literal(head)} answer_blank* answer_first answer_rest {tail}"
                                   + "\n" + _ANSWER_RULES)
    calls = xgr.Grammar.from_json_schema(calls_schema, any_whitespace=False, separators=separators)
    return str(xgr.Grammar.union(answer, calls))


def answer_or_calls_grammar(calls_schema: Mapping[str, Any], separators: tuple[str, str] | None = None) -> str:
    """The EBNF grammar of a reply under ``tool_choice="auto"`` with a free-text answer: the calls
    of ``calls_schema``, or the prose form ``{"name": "__answer__", "arguments": {"content": ...}}``
    whose content holds at least one non-blank character (cached per schema).

    Args:
        calls_schema: the JSON schema of the calls (``ToolPlan.calls_schema``).
        separators: the JSON separators the backend decodes with (None: xgrammar's compact defaults).

    Raises:
        InvalidInputError: a tool's schema cannot be compiled (names ``tools``).
    """
    try:
        return _answer_or_calls(json.dumps(calls_schema), separators)
    except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError with its parser's message
        raise InvalidInputError(f"'tools' could not be compiled for guided decoding: {exc}") from None


def decoding_constraint(prepared: Any, separators: tuple[str, str] | None = None) -> Mapping[str, Any] | None:
    """The constraint an xgrammar backend decodes ``prepared`` under: its ``guided``, except for a
    reply whose plan has a free-text answer (``ToolPlan.calls_schema``), decoded under
    ``{"grammar": EBNF}`` from :func:`answer_or_calls_grammar` so that the answer is never blank."""
    plan = prepared.tool_plan
    if plan is None or plan.kind != "json" or plan.calls_schema is None:
        return prepared.guided
    return {"grammar": answer_or_calls_grammar(plan.calls_schema, separators)}


def _field(guided: Mapping[str, Any], field: str | None) -> str:
    return field if field is not None else _FIELDS.get(next(iter(guided)), "guided")


def constraints_to_check(
    prepared: Any, separators: tuple[str, str] | None = None
) -> list[tuple[Mapping[str, Any], str | None]]:
    """The constraints to compile to check a prepared request, each with the request field to name
    when it fails (None: the field of the constraint's kind).

    A reply with tools decoded under a schema is checked as the user's own constraint first (a
    ``response_format`` that fails is named so), then as what the backend decodes it under (see
    :func:`decoding_constraint`), which then can only fail for the tools' schemas (named ``tools``).

    Raises:
        InvalidInputError: the tools' schemas cannot be turned into the reply's grammar.
    """
    guided = prepared.guided
    if guided is None:
        return []
    plan = prepared.tool_plan
    if plan is None or plan.kind != "json":
        return [(guided, None)]
    own = prepared.request.guided
    decoded = decoding_constraint(prepared, separators)
    assert decoded is not None
    return [*([(own, None)] if own is not None else []), (decoded, "tools")]


def check_constraint(guided: Mapping[str, Any], field: str | None = None) -> None:
    """Parse a normalised constraint with xgrammar (no tokenizer needed), so a schema or regex it
    cannot take fails at the caller's line on any backend that decodes with xgrammar.

    Args:
        guided: the normalised constraint.
        field: the request field to name when it fails (default: the field of its kind).

    Raises:
        InvalidInputError: the constraint cannot be compiled (the message names the field).
    """
    try:
        import xgrammar as xgr
    except ImportError:  # the backend will report it
        return
    try:
        if "json" in guided:
            xgr.Grammar.from_json_schema(json.dumps(guided["json"]), any_whitespace=False)
        elif "grammar" in guided:
            xgr.Grammar.from_ebnf(guided["grammar"])
        elif "regex" in guided:
            xgr.Grammar.from_regex(guided["regex"])
        elif "choice" in guided:
            xgr.Grammar.from_ebnf(choice_grammar(guided["choice"]))
    except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError with its parser's message
        raise InvalidInputError(f"'{_field(guided, field)}' could not be compiled for guided decoding: {exc}") from None

logger = logging.getLogger(__name__)


def choice_grammar(choices: Sequence[str]) -> str:
    """An EBNF grammar admitting exactly one of ``choices`` (as vLLM builds it)."""
    escapes = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}

    def escape(text: str) -> str:
        return "".join(
            escapes.get(ch, f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch) for ch in text
        )

    return "root ::= " + " | ".join(f'"{escape(c)}"' for c in choices)


class GrammarCache:
    """Compiles guided-decoding constraints for one tokenizer (xgrammar; compiled grammars are
    cached by the compiler, so a schema used again costs nothing).

    Args:
        tokenizer: the model's Hugging Face tokenizer.
        vocab_size: the model's vocabulary size (its logits' width; may exceed the tokenizer's).
        stop_ids: the end-of-sequence token ids.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Sequence[int]) -> None:
        try:
            import xgrammar as xgr
        except ImportError as exc:
            raise DependencyError("guided decoding on transformers needs xgrammar: pip install xgrammar") from exc
        self._xgr = xgr
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_ids))
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=2, cache_enabled=True)
        self._lock = threading.Lock()

    def compile(self, guided: Mapping[str, Any], field: str | None = None) -> Any:
        """The compiled grammar of a normalised constraint.

        Args:
            guided: the normalised constraint.
            field: the request field to name when it fails (default: the field of its kind).

        Raises:
            InvalidInputError: xgrammar cannot compile it (an unsupported schema or regex).
        """
        compiler = self._compiler
        compact = {"any_whitespace": False, "separators": COMPACT}
        try:
            with self._lock:
                if "json" in guided:
                    return compiler.compile_json_schema(json.dumps(guided["json"]), **compact)
                if "json_object" in guided:
                    return compiler.compile_json_schema('{"type": "object"}', **compact)
                if "regex" in guided:
                    return compiler.compile_regex(guided["regex"])
                if "choice" in guided:
                    return compiler.compile_grammar(choice_grammar(guided["choice"]))
                if "grammar" in guided:
                    return compiler.compile_grammar(guided["grammar"])
        except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError with its parser's message
            raise InvalidInputError(
                f"'{_field(guided, field)}' could not be compiled for guided decoding: {exc}"
            ) from None
        raise InvalidInputError(f"unknown guided-decoding constraint {sorted(guided)}.")

    def matcher(self, compiled: Any) -> Any:
        """A fresh matcher (one per row)."""
        return self._xgr.GrammarMatcher(compiled)


class GuidedProcessor:
    """Masks each constrained row's logits to the tokens its grammar allows; unconstrained rows,
    and rows already stopped, are untouched.

    Args:
        rows: the batch's rows (each has ``done`` set once it stopped).
        matchers: one xgrammar matcher per row, or None for an unconstrained row.
        cache: the grammar cache (its tokenizer info sizes the bitmask).
    """

    def __init__(self, rows: Sequence[Any], matchers: Sequence[Any | None], cache: GrammarCache) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.rows = rows
        self.matchers = list(matchers)
        self.bitmask = xgr.allocate_token_bitmask(len(rows), cache.vocab_size)
        self.started = False

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        last = input_ids[:, -1].tolist() if self.started else None
        indices: list[int] = []
        for i, matcher in enumerate(self.matchers):
            if matcher is None or self.rows[i].done:
                continue
            if last is not None and not matcher.is_terminated() and not matcher.accept_token(int(last[i])):
                logger.warning("guided decoding: row %d produced a token its grammar refuses; unconstraining it", i)
                self.matchers[i] = None
                continue
            if matcher.is_terminated():
                continue
            matcher.fill_next_token_bitmask(self.bitmask, i)
            indices.append(i)
        self.started = True
        if indices:
            mask = self.bitmask if scores.device.type == "cpu" else self.bitmask.to(scores.device)
            self._xgr.apply_token_bitmask_inplace(scores, mask, indices=indices)
        return scores


class PenaltyProcessor:
    """Per-row ``repetition_penalty`` (over prompt and output, as vLLM), ``presence_penalty`` and
    ``frequency_penalty`` (over the output) and ``logit_bias``; rows without them are untouched.

    Args:
        rows: the batch's rows (``job.prepared`` holds the request and prompt ids; ``ids`` the
            tokens generated so far).
    """

    def __init__(self, rows: Sequence[Any]) -> None:
        self.rows = rows

    @staticmethod
    def wanted(request: Any) -> bool:
        """Whether a request needs this processor."""
        return bool(
            request.repetition_penalty != 1.0
            or request.presence_penalty
            or request.frequency_penalty
            or request.logit_bias
        )

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        width = scores.shape[-1]
        for i, row in enumerate(self.rows):
            request = row.job.prepared.request
            if row.done or not self.wanted(request):
                continue
            logits = scores[i]
            output = torch.tensor([t for t in row.ids if t < width], dtype=torch.long, device=scores.device)
            if request.repetition_penalty != 1.0:
                seen = torch.tensor(sorted({t for t in row.job.prepared.token_ids if t < width} | set(output.tolist())),
                                    dtype=torch.long, device=scores.device)
                if seen.numel():
                    values = logits[seen]
                    penalty = request.repetition_penalty
                    logits[seen] = torch.where(values > 0, values / penalty, values * penalty)
            if output.numel() and (request.presence_penalty or request.frequency_penalty):
                counts = torch.bincount(output, minlength=width).to(logits.dtype)
                logits -= request.frequency_penalty * counts + request.presence_penalty * (counts > 0).to(logits.dtype)
            if request.logit_bias:
                for token, bias in request.logit_bias.items():
                    if token < width:
                        logits[token] += bias
        return scores


class MinTokensProcessor:
    """vLLM's ``min_tokens``: a row with fewer than its ``min_tokens`` generated tokens cannot draw
    the end-of-sequence token (even with ``ignore_eos``, as vLLM) or a ``stop_token_ids`` token.

    It runs after the grammar mask: when a constrained row's grammar allows nothing but an end
    (the constrained output is complete), the end stays allowed rather than every token masked.

    Args:
        rows: the batch's rows (``min_tokens``, ``held``: the barred tokens, ``count``: tokens
            generated so far).
    """

    def __init__(self, rows: Sequence[Any]) -> None:
        self.rows = rows

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        width = scores.shape[-1]
        for i, row in enumerate(self.rows):
            if row.done or row.count >= row.min_tokens:
                continue
            held = torch.tensor([t for t in row.held if t < width], dtype=torch.long, device=scores.device)
            masked = scores[i].index_fill(0, held, -math.inf)
            scores[i] = torch.where(torch.isfinite(masked).any(), masked, scores[i])
        return scores


class RowSampler:
    """Samples each row with its own settings and its own seed, so greedy rows and rows with any
    temperature, ``top_k``, ``top_p``, ``min_p`` or seed share one ``generate`` batch (as they share
    one vLLM step).

    The last logits processor of a greedy ``generate``: a sampled row's logits are reduced to its
    drawn token (every other token -inf), which greedy decoding then picks; greedy rows are left
    as they are. Per row, in transformers' order: temperature, top-k, top-p, min-p (each keeps at
    least one token), softmax, one draw from the row's generator (seeded with the request's
    ``seed``; the global generator when it has none). A seeded request draws the same tokens
    whatever else shares its batch.

    Args:
        rows: the batch's rows (``job.prepared.request`` holds the sampling settings).
        device: where the logits are (the seeded generators live there).
    """

    def __init__(self, rows: Sequence[Any], device: str) -> None:
        import torch

        self.rows = rows
        self.generators: list[Any] = []
        for row in rows:
            request = row.job.prepared.request
            generator = None
            if request.temperature > 0 and request.seed is not None:
                generator = torch.Generator(device=device).manual_seed(request.seed)
            self.generators.append(generator)

    @staticmethod
    def wanted(request: Any) -> bool:
        """Whether a request samples (rather than decoding greedily)."""
        return bool(request.temperature > 0)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        for i, row in enumerate(self.rows):
            request = row.job.prepared.request
            if row.done or request.temperature <= 0:
                continue
            logits = scores[i].float() / request.temperature
            if request.top_k and request.top_k < logits.shape[-1]:
                kth = torch.topk(logits, request.top_k).values[-1]
                logits = logits.masked_fill(logits < kth, -math.inf)
            if request.top_p < 1.0:
                ordered, order = torch.sort(logits)  # ascending, as transformers' TopPLogitsWarper
                tail = ordered.softmax(-1).cumsum(-1) <= 1 - request.top_p
                tail[-1] = False  # the likeliest token always stays
                logits = logits.masked_fill(torch.zeros_like(tail).scatter(0, order, tail), -math.inf)
            if request.min_p > 0:
                probs = logits.softmax(-1)
                logits = logits.masked_fill(probs < request.min_p * probs.max(), -math.inf)
            # Device-side throughout (no host sync per row on CUDA). A row with every token masked
            # has nothing to sample from: it is left as it is, for greedy decoding to pick.
            alive = torch.isfinite(logits).any()
            probs = torch.where(alive, logits.softmax(-1), torch.ones_like(logits))
            token = torch.multinomial(probs, 1, generator=self.generators[i])
            drawn = torch.full_like(scores[i], -math.inf).scatter_(0, token, 0.0)
            scores[i] = torch.where(alive, drawn, scores[i])
        return scores
