"""The server tests' helpers: the shared live server and polling (:mod:`support.live`)."""

from __future__ import annotations

from support.live import STARTUP_TIMEOUT_S, LiveServer, metric_samples, start_server, wait_until

__all__ = ["STARTUP_TIMEOUT_S", "LiveServer", "metric_samples", "start_server", "wait_until"]
