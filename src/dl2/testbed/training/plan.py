"""A job's plan `<state>/plan.json`: the configuration its processes are to form now, written by the controller.

An elastic job's processes (`--member NAME`) take their role and index from the plan, not from flags: they
join the plan's generation, train, and when PS 0 sees a newer plan, the job checkpoints and stops that
world; each process still a member of the newer plan joins it with its new role and index (it keeps running:
no restart, no import of torch, no new pod), and one that is not exits. A configuration the plan moves past
before its world formed is skipped by all its processes together (`comm.agree`), as is one whose process
starts only once the plan no longer names it (it exits 0). Content:
`{"generation": G, "num_ps": P, "num_workers": W, "members": {"<name>": {"role": "ps"|"worker", "index": I}}}`.

Torch-free, so that a controller can write plans without importing torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from dl2.errors import Dl2Error
from dl2.testbed.training.progress import atomic_write

PLAN = "plan.json"


@dataclass(frozen=True)
class Plan:
    """One configuration of a job: generation, P, W and each member's (role, index)."""

    generation: int
    num_ps: int
    num_workers: int
    members: dict[str, tuple[str, int]]

    def __post_init__(self):
        roles = sorted(self.members.values())
        wanted = [("ps", i) for i in range(self.num_ps)] + [("worker", i) for i in range(self.num_workers)]
        if self.num_ps < 1 or self.num_workers < 1 or roles != sorted(wanted):
            raise Dl2Error(f"a plan's members must be PS 0..P-1 and workers 0..W-1 once each (P {self.num_ps}, "
                           f"W {self.num_workers}), got {roles}")


def write_plan(state_dir: Path, plan: Plan) -> None:
    """Write `<state_dir>/plan.json` atomically."""
    members = {name: {"role": role, "index": index} for name, (role, index) in sorted(plan.members.items())}
    record = {"generation": plan.generation, "num_ps": plan.num_ps, "num_workers": plan.num_workers, "members": members}
    state_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(state_dir / PLAN, (json.dumps(record, indent=1) + "\n").encode())


def read_plan(state_dir: Path) -> Plan | None:
    """The job's plan, or None if it has none; an unreadable one is a Dl2Error naming the file."""
    path = state_dir / PLAN
    try:
        data = json.loads(path.read_text())
        return Plan(int(data["generation"]), int(data["num_ps"]), int(data["num_workers"]),
                    {name: (m["role"], int(m["index"])) for name, m in data["members"].items()})
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise Dl2Error(f"{path}: not a plan ({exc!r})") from None


class PlanWatch:
    """Whether the job's plan has moved past a generation, re-reading the file only when it changed."""

    def __init__(self, state_dir: Path, generation: int):
        self.path, self.generation, self.seen, self.newer = state_dir / PLAN, generation, None, False

    def moved(self) -> bool:
        """True once the plan's generation is newer than the watched one (cheap: one stat per call)."""
        if self.newer:
            return True
        try:
            stamp = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            return False
        if stamp != self.seen:
            self.seen = stamp
            plan = read_plan(self.path.parent)
            self.newer = plan is not None and plan.generation > self.generation
        return self.newer
