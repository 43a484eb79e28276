"""Property-test plumbing: count generated cases per public class and report them.

Each test body calls ``prop_helpers.count("ClassName")`` once per generated case. At the end of
the session a table is printed (``pytest_terminal_summary``) and, when the environment variable
``GPUPROMPT_PROPERTY_REPORT`` names a file, written there as JSON::

    {"cases": {"VectorIndex": 1234, ...}, "total": 5678}
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import prop_helpers  # noqa: E402

REPORT_ENV = "GPUPROMPT_PROPERTY_REPORT"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    cases = dict(sorted(prop_helpers.CASES.items()))
    if not cases:
        return
    terminalreporter.section("property cases per public class")
    width = max(len(name) for name in cases)
    for name, n in cases.items():
        terminalreporter.write_line(f"{name:<{width}}  {n:>7}")
    terminalreporter.write_line(f"{'total':<{width}}  {sum(cases.values()):>7}")
    target = os.environ.get(REPORT_ENV)
    if target:
        Path(target).write_text(json.dumps({"cases": cases, "total": sum(cases.values())}, indent=2) + "\n")
        terminalreporter.write_line(f"written to {target}")
