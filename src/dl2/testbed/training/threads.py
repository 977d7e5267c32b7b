"""How many threads a training process computes with: as many whole cores as its pod's CPU limit allows.

Torch-free, so that the scheduler side can name the variable without importing torch. The pod's limit
reaches the process through the downward API (`DL2_CPU_MILLIS`: `limits.cpu` in millicores); a process
without one (no limit, or run by hand) computes on one thread, as every training process did before limits.
"""

from __future__ import annotations

import os

from dl2.errors import Dl2Error

CPU_LIMIT_ENV = "DL2_CPU_MILLIS"


def training_threads(environ: dict[str, str] | None = None) -> int:
    """The intra-op threads for this process: its CPU limit in whole cores, at least one."""
    value = (os.environ if environ is None else environ).get(CPU_LIMIT_ENV, "")
    if not value:
        return 1
    try:
        millis = int(value)
    except ValueError:
        raise Dl2Error(f"{CPU_LIMIT_ENV}={value!r}: expected the pod's CPU limit in millicores, an integer") from None
    if millis <= 0:
        raise Dl2Error(f"{CPU_LIMIT_ENV}={value!r}: the CPU limit must be positive")
    return max(1, millis // 1000)
