"""SIGTERM and SIGINT as an event, installed before anything slow is imported."""

from __future__ import annotations

import signal
import threading


def stop_on_signals() -> threading.Event:
    """An event that SIGTERM and SIGINT set. A container's process is its PID 1, which ignores a signal it has
    no handler for: `python -m dl2.testbed.training` installs this before its slow imports (torch), so that a pod
    deleted while it starts stops then, not at its grace period's SIGKILL."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop
