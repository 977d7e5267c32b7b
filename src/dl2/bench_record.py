"""What every `dl2 bench` JSON records beside its numbers: when it ran, at which commit, and on what
machine, with the machine's 1-minute load average before and after the run (on a shared 2-core machine
the load explains much of the spread between two runs of the same benchmark)."""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dl2.checkout import git_commit
from dl2.paths import write_json_atomic


def load_average() -> float:
    """The machine's 1-minute load average, to 2 decimals."""
    return round(os.getloadavg()[0], 2)


def stamp(**machine: Any) -> dict:
    """A benchmark's opening fields: the date, the commit, and the machine (cores, processor, Python, the load
    before; `machine` adds fields of the benchmark's own)."""
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "commit": git_commit(),
            "machine": {"cores": os.cpu_count(), "processor": platform.machine(), "python": platform.python_version(),
                        "load_average_1min_before": load_average(), **machine}}


def finish(results: dict, out: str | Path | None) -> dict:
    """Record the load after the run in `results` (opened by `stamp`), write them as JSON to `out` when given
    (atomically), and return them."""
    results["machine"]["load_average_1min_after"] = load_average()
    if out is not None:
        write_json_atomic(out, results)
    return results
