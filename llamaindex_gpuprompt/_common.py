"""Helpers shared by the adapter classes (no LlamaIndex types here)."""

from __future__ import annotations

from typing import Any

from gpuprompt.errors import ConfigurationError, describe

__all__ = ["check_options"]


def check_options(name: str, options: Any, fields: tuple[str, ...], *, valid: tuple[str, ...] | None = None) -> None:
    """Reject an options dict that repeats one of the class's own fields, holds a key outside
    ``valid`` (when given), or is not a dict with str keys."""
    if options is None:
        return
    if not isinstance(options, dict) or not all(isinstance(key, str) for key in options):
        raise ConfigurationError(f"'{name}' must be a dict of options (got {describe(options)}).")
    clash = sorted(set(options) & set(fields))
    if clash:
        raise ConfigurationError(
            f"'{name}' must not hold {clash}: they are fields of the class itself, pass them as keyword "
            f"arguments (got {describe(options)})."
        )
    unknown = sorted(set(options) - set(valid)) if valid is not None else []
    if unknown:
        listed = ", ".join(option for option in valid or () if option not in fields)
        raise ConfigurationError(f"'{name}' holds unknown option(s) {unknown}; valid: {listed}.")
