"""The unit tier: no model, no socket, no subprocess, each enforced for every test in this folder
(:mod:`support.unit_guard`); run it alone with ``pytest tests/unit`` or ``-m unit``."""

from __future__ import annotations

from support.unit_guard import unit_tier_guard  # noqa: F401 - an autouse fixture, active for this folder
