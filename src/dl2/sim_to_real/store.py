"""Finished testbed replays kept on disk, one file per (policy, seed, trace, repeat), so that an interrupted
evaluation on the kind testbed resumes where it stopped instead of replaying hours of traces again.

A replay is kept under its run's name and a fingerprint of everything that decides it: the policy's identity
(a heuristic's name, a learned policy's weights), the trace's jobs, the repeat, and the testbed's context (its
preset and the pods' CPU share). A stored replay whose fingerprint differs is stale and is replayed again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from dl2.paths import write_json_atomic
from dl2.workload.traces import Trace

FORMAT = "dl2-testbed-replay/1"


def trace_digest(trace: Trace) -> str:
    """Identifies a trace's jobs: ids, arrivals, job types and epochs."""
    digest = hashlib.sha256()
    for column in (trace.job_id, trace.arrival, trace.model, trace.num_epochs):
        digest.update(column.tobytes())
    digest.update(repr(trace.model_names).encode())
    return digest.hexdigest()


class ReplayStore:
    """Replays in `folder`; `identities` names each (policy label, seed) by what decides its actions, and
    `context` the testbed they ran on (anything that changes a replay's outcome but not its run's name)."""

    def __init__(self, folder: str | Path, identities: Mapping[tuple[str, int], str], context: str):
        self.folder, self.identities, self.context = Path(folder), dict(identities), context

    def _path(self, label: str, seed: int, trace: int, repeat: int) -> Path:
        return self.folder / f"{label}-s{seed}-t{trace}-r{repeat}.json"

    def fingerprint(self, label: str, seed: int, trace: Trace, repeat: int) -> str:
        """What a replay of `trace` by (label, seed) as repeat `repeat` on this testbed is stored under."""
        text = repr((FORMAT, self.context, label, seed, self.identities[label, seed], trace_digest(trace), repeat))
        return hashlib.sha256(text.encode()).hexdigest()

    def load(self, label: str, seed: int, k: int, trace: Trace, repeat: int) -> tuple[dict[int, float], list[dict]] | None:
        """The stored replay (JCT by job id, per-slot rows) of this run, or None if there is none or it is stale."""
        path = self._path(label, seed, k, repeat)
        if not path.is_file():
            return None
        stored = json.loads(path.read_text())
        if stored.get("format") != FORMAT or stored.get("fingerprint") != self.fingerprint(label, seed, trace, repeat):
            return None
        return {int(job): float(jct) for job, jct in stored["jct"].items()}, stored["rows"]

    def save(self, label: str, seed: int, k: int, trace: Trace, repeat: int, jct: Mapping[int, float], rows: list[dict]) -> None:
        """Keep a finished replay (atomically: an interrupted write leaves the previous file or none)."""
        write_json_atomic(self._path(label, seed, k, repeat),
                          {"format": FORMAT, "fingerprint": self.fingerprint(label, seed, trace, repeat),
                           "jct": {str(job): float(value) for job, value in jct.items()}, "rows": rows})
