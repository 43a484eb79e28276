"""Guided decoding and the extra sampling fields for the transformers backend, as per-row logits
processors inside its padded ``generate`` batches.

Why xgrammar: it is the grammar engine vLLM uses by default, so both backends constrain with the
same library, compile the same JSON schema / regex / EBNF the same way (the vLLM backend is set
to xgrammar and compact JSON too), and accept the same schemas. Its ``GrammarMatcher`` is a
per-sequence object over a compiled grammar shared across requests (compilation is cached by
the compiler), and it fills a token bitmask for one row of a batch at a time, which is exactly
what a padded batch with constrained and unconstrained rows needs. llguidance would also fit;
outlines-core builds a full token-level index per regex, which is slow for large JSON schemas.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from gpuprompt.errors import DependencyError, InvalidInputError

__all__ = ["GrammarCache", "GuidedProcessor", "PenaltyProcessor", "check_constraint", "choice_grammar",
           "constraints_to_check"]

_FIELDS = {"json": "response_format", "json_object": "response_format", "regex": "guided_regex",
           "choice": "guided_choice"}


def _field(guided: Mapping[str, Any], field: str | None) -> str:
    return field if field is not None else _FIELDS.get(next(iter(guided)), "guided")


def constraints_to_check(prepared: Any) -> list[tuple[Mapping[str, Any], str | None]]:
    """The constraints to compile to check a prepared request, each with the request field to name
    when it fails (None: the field of the constraint's kind).

    A reply with tools decoded under a schema is checked as the user's own constraint first (a
    ``response_format`` that fails is named so), then as the combined schema, which then can only
    fail for the tools' schemas (named ``tools``).
    """
    guided = prepared.guided
    if guided is None:
        return []
    plan = prepared.tool_plan
    if plan is None or plan.kind != "json":
        return [(guided, None)]
    own = prepared.request.guided
    return [*([(own, None)] if own is not None else []), (guided, "tools")]


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
        compact = {"any_whitespace": False, "separators": (",", ":")}
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
