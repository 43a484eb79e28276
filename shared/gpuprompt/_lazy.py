"""Lazy package exports: a package names where each public name lives and imports it on first use.

A package ``__init__`` that imports its modules eagerly runs them whenever any one submodule is
imported (Python runs the parent package first), which drags heavy modules in and can close an
import cycle at run time. The packages of gpuprompt therefore export lazily::

    __getattr__, __dir__ = lazy_exports(__name__, {"LLMEngine": "gpuprompt.llm._engine", ...})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str], *, extra: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package whose names are imported on first use.

    Args:
        package: the package's ``__name__``.
        exports: public name -> the module that defines it.
        extra: further names listed by ``__dir__`` (defined in the package itself).
    """
    names = sorted({*exports, *extra})

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__
