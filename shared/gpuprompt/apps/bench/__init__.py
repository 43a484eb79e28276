"""``gpuprompt bench``: scenarios that measure each stage against the stock classes, same run.

Scenario modules register themselves with :func:`scenario`; add a module to ``_MODULES`` to list it.
"""

from __future__ import annotations

import importlib
import logging

from gpuprompt.apps.bench._registry import (
    BenchContext,
    Chart,
    Scenario,
    ScenarioResult,
    registered,
    run_scenario,
    scenario,
    write_summary,
)

__all__ = ["BenchContext", "Chart", "Scenario", "ScenarioResult", "registered", "run_scenario", "scenario", "scenarios",
           "write_summary"]

logger = logging.getLogger(__name__)

# Each module registers scenarios on import. A module whose optional dependencies are missing is
# skipped with a warning (its scenarios are then not listed).
_MODULES = [
    "gpuprompt.apps.bench.embed",
    "gpuprompt.apps.bench.embed_quant",
    "gpuprompt.apps.bench.embed_peer",
    "gpuprompt.apps.bench.gpu",
    "gpuprompt.apps.bench.search",
    "gpuprompt.apps.bench.llm",
    "gpuprompt.apps.bench.rag",
    "gpuprompt.apps.bench.wrappers",
    "gpuprompt.apps.bench.agent_tools",
    "gpuprompt.apps.bench.milvus_concurrency",
    "gpuprompt.apps.bench.index_bulk",
    "gpuprompt.apps.bench.multiproc",
    "gpuprompt.apps.bench.rerank",
    "gpuprompt.apps.bench.hybrid",
]


def _load_all() -> None:
    for module in _MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                continue  # not written yet in this checkout
            logger.warning("bench scenarios in %s unavailable: %s", module, exc)


def scenarios() -> dict[str, Scenario]:
    """Every scenario, by name (imports the scenario modules, which register themselves)."""
    _load_all()
    return registered()
