"""Teachers' decisions in DL2's action space of the Pollux world, for supervised pretraining: each
interval the teacher (Optimus+Oracle or Tiresias, `dl2.pollux.policies`) allocates on the environment's own
view, and its GPU count per window job becomes "+1" decisions, round robin over the window (one GPU to each
job still below its count, in window order, again and again), then void. A count above the job's cap is cut
to the cap; jobs outside the window get none. With `assign_one` the interval has already given each window
job one GPU: the decisions give only the GPUs beyond those (a job the teacher gave none keeps its one).

A teacher-forced episode reproduces the teacher's own run where the window holds every active job and the
teacher places as the environment does: exactly for Optimus+Oracle (same placement rule; its first step is
`assign_one`'s). Tiresias places started jobs in its queue order, the environment fewest GPUs first, so its
runs may differ once both start jobs of different sizes in one interval; with `assign_one` they differ
wherever Tiresias leaves a job waiting.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from dl2.errors import Dl2Error
from dl2.learn.pollux.env import PolluxDecisionEnv
from dl2.pollux.cluster import PolluxRun
from dl2.pollux.policies import make_policy
from dl2.pollux.workload import Workload
from dl2.workload.presets import PolluxPreset

TEACHERS = ("optimus", "tiresias")


def round_robin(counts: np.ndarray, window: int) -> Iterator[int]:
    """"+1" actions that bring each window job to its count, round robin in window order, then void."""
    given = np.zeros_like(counts)
    while (given < counts).any():
        for k in np.flatnonzero(given < counts).tolist():
            given[k] += 1
            yield k
    yield window


def teacher_forced(workload: Workload, preset: PolluxPreset, teacher: str, variant: str, window: int,
                   assign_one: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, PolluxRun]:
    """One episode of `teacher`'s decisions through the environment: (states, masks, actions, run)."""
    if teacher not in TEACHERS:
        raise Dl2Error(f"teacher: unknown teacher {teacher!r} (known: {', '.join(TEACHERS)})")
    env = PolluxDecisionEnv(workload, preset, variant, window, name=f"{teacher}-forced", assign_one=assign_one)
    policy = make_policy(teacher)
    states, masks, actions = [], [], []
    state, mask = env.reset()
    while not env.done:
        interval = env.decisions
        allocation = policy.allocate(env.view)
        counts = np.array([len(allocation.get(j, ())) for j in interval.jobs_in_window.tolist()], dtype=np.int64)
        extra = np.maximum(np.minimum(counts, interval.caps) - interval.given, 0)  # beyond what the interval gave
        for action in round_robin(extra, window):
            states.append(state.copy())
            masks.append(mask.copy())
            actions.append(action)
            state, mask, _, _ = env.step(action)
            if env.done or env.decisions is not interval:
                break
    return np.stack(states), np.stack(masks), np.asarray(actions, dtype=np.int64), env.result()


def teacher_decisions(workloads: Sequence[Workload], preset: PolluxPreset, teacher: str, variant: str,
                      window: int, assign_one: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The teacher's (raw state, mask, action) triples over every workload, concatenated:
    states (N, window, F), masks (N, window + 1), actions (N,)."""
    if not workloads:
        raise Dl2Error("workloads: teacher_decisions needs at least one workload")
    parts = [teacher_forced(w, preset, teacher, variant, window, assign_one)[:3] for w in workloads]
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))
