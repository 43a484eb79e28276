"""Helpers shared by the adapter classes (no LlamaIndex types here)."""

from __future__ import annotations

from typing import Any

from gpuprompt.errors import ConfigurationError, describe

__all__ = ["check_options"]


def check_options(name: str, options: Any, fields: tuple[str, ...]) -> None:
    """Reject an options dict that repeats one of the class's own fields (or is not a dict)."""
    if options is None:
        return
    if not isinstance(options, dict):
        raise ConfigurationError(f"'{name}' must be a dict of options (got {describe(options)}).")
    clash = sorted(set(options) & set(fields))
    if clash:
        raise ConfigurationError(
            f"'{name}' must not repeat {clash}: pass them as fields of the class itself (got {describe(options)})."
        )
