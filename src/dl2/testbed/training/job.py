"""One process's view of its job and configuration, as the command line gives it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from dl2.testbed.training.models import get_standin


@dataclass(frozen=True)
class JobConfig:
    """A process of job `job` in configuration `generation` (P PS, W workers); the fields are the flags."""

    job: str
    model: str
    role: str  # "ps" or "worker"
    index: int
    num_ps: int
    num_workers: int
    state: Path
    epochs: float
    mode: str  # "sync" or "async"
    generation: int
    seed: int = 0
    checkpoint_every: int = 0  # steps; 0: off
    checkpoint_seconds: float = 5.0  # 0: off
    timeout: float = 300.0  # rendezvous, waiting for the folder's previous owner, and any one message
    log_seconds: float = 10.0  # PS 0's progress line between checkpoints; 0: off
    member: str = ""  # an elastic job's member name in its plan (`dl2.testbed.training.plan`); "": a fixed configuration

    @property
    def rank(self) -> int:
        return self.index if self.role == "ps" else self.num_ps + self.index

    @property
    def world(self) -> int:
        return self.num_ps + self.num_workers

    @property
    def target_steps(self) -> int:
        """Worker batches that make `epochs` epochs of the stand-in."""
        return math.ceil(self.epochs * get_standin(self.model).steps_per_epoch - 1e-9)

    def log(self, event: str, message: str) -> None:
        """One line on stdout, flushed: `<UTC time> [<job> g<generation> <role> <index>/<count>] <event>: <message>`
        (the events: the package docstring)."""
        count = self.num_ps if self.role == "ps" else self.num_workers
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        print(f"{stamp} [{self.job} g{self.generation} {self.role} {self.index}/{count}] {event}: {message}", flush=True)
