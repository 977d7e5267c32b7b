"""Teachers' decisions in DL2's action space of the Pollux world, for supervised pretraining: each
interval the teacher (Optimus+Oracle or Tiresias, `dl2.pollux.policies`) allocates on the environment's own
view, and its GPU count per window job becomes "+1" decisions, round robin over the window (one GPU to each
job still below its count, in window order, again and again), then void. A count above the job's cap is cut
to the cap; jobs outside the window get none. With `assign_one` the interval has already given each window
job one GPU: the decisions give only the GPUs beyond those (a job the teacher gave none keeps its one).

`learner_labelled` gives the teacher's labels on the states a learner's own greedy decisions reach
(DAgger, Ross et al., AISTATS 2011): each interval the teacher allocates on the learner's view, and each
state's label is the round robin's next "+1" toward those counts from the GPUs the learner has given so far
(void once every window job has its count). Imitation of the teacher's own states alone drifts: a learner
whose per-decision agreement was 0.94 gave 85% of its jobs (0.5x load; 48% at 1.0x) other counts than the
teacher would have on the same view (docs/pollux.md, "Learning from the learner's states").

A teacher-forced episode reproduces the teacher's own run where the window holds every active job and the
teacher places as the environment does: exactly for Optimus+Oracle (same placement rule; its first step is
`assign_one`'s). Tiresias places started jobs in its queue order, the environment fewest GPUs first, so its
runs may differ once both start jobs of different sizes in one interval; with `assign_one` they differ
wherever Tiresias leaves a job waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
from tqdm.auto import tqdm

from dl2.errors import Dl2Error
from dl2.learn.pollux.decisions import IntervalDecisions
from dl2.learn.pollux.env import PolluxDecisionEnv
from dl2.pollux.cluster import PolluxRun
from dl2.pollux.policies import make_policy
from dl2.pollux.workload import Workload
from dl2.workload.presets import PolluxPreset

TEACHERS = ("optimus", "tiresias")
LEARNER_MAX_SECONDS = 7 * 24 * 3600  # a learner's episode stops after a week of the world (its states are kept)


def round_robin(counts: np.ndarray, window: int) -> Iterator[int]:
    """"+1" actions that bring each window job to its count, round robin in window order, then void."""
    given = np.zeros_like(counts)
    while (given < counts).any():
        for k in np.flatnonzero(given < counts).tolist():
            given[k] += 1
            yield k
    yield window


def next_of_round_robin(given: np.ndarray, start: np.ndarray, target: np.ndarray, window: int) -> int:
    """The round robin's next action from `given` GPUs per window job, when the interval started at `start`
    and goes to `target`: the first job (window order) still below its target with the fewest given since
    the start; void (`window`) when none is."""
    below = np.flatnonzero(given < target)
    return int(below[np.argmin((given - start)[below])]) if len(below) else window


def window_counts(allocation: Mapping[int, Sequence], interval: IntervalDecisions) -> np.ndarray:
    """A teacher's GPUs per window job (`allocation`: nodes per job id), each cut to the job's cap."""
    counts = np.array([len(allocation.get(j, ())) for j in interval.jobs_in_window.tolist()], dtype=np.int64)
    return np.minimum(counts, interval.caps)


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
        extra = np.maximum(window_counts(policy.allocate(env.view), interval) - interval.given, 0)  # beyond what it gave
        for action in round_robin(extra, window):
            states.append(state.copy())
            masks.append(mask.copy())
            actions.append(action)
            state, mask, _, _ = env.step(action)
            if env.done or env.decisions is not interval:
                break
    return np.stack(states), np.stack(masks), np.asarray(actions, dtype=np.int64), env.result()


def teacher_decisions(workloads: Sequence[Workload], preset: PolluxPreset, teacher: str, variant: str,
                      window: int, assign_one: bool = False,
                      progress: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The teacher's (raw state, mask, action) triples over every workload, concatenated:
    states (N, window, F), masks (N, window + 1), actions (N,)."""
    if not workloads:
        raise Dl2Error("workloads: teacher_decisions needs at least one workload")
    episodes = tqdm(workloads, desc="the teacher's demonstrations", unit="workload", disable=not progress)
    parts = [teacher_forced(w, preset, teacher, variant, window, assign_one)[:3] for w in episodes]
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))


def learner_labelled(workload: Workload, preset: PolluxPreset, teacher: str, variant: str, window: int,
                     decide: Callable[[np.ndarray, np.ndarray], int],
                     assign_one: bool = False,
                     max_seconds: int = LEARNER_MAX_SECONDS) -> tuple[np.ndarray, np.ndarray, np.ndarray, PolluxRun | None]:
    """One episode of `decide`'s decisions with `teacher`'s label on every state it reaches: (states, masks,
    labels, the learner's run; None where it had not finished within `max_seconds`, its states kept)."""
    if teacher not in TEACHERS:
        raise Dl2Error(f"teacher: unknown teacher {teacher!r} (known: {', '.join(TEACHERS)})")
    env = PolluxDecisionEnv(workload, preset, variant, window, name="dl2-labelled", max_seconds=max_seconds,
                            assign_one=assign_one)
    policy = make_policy(teacher)
    states, masks, labels = [], [], []
    state, mask = env.reset()
    interval = None
    while not env.done:
        decisions = env.decisions
        if decisions is not interval:
            interval = decisions
            start = decisions.given.copy()
            target = np.maximum(window_counts(policy.allocate(env.view), decisions), start)
        states.append(state.copy())
        masks.append(mask.copy())
        labels.append(next_of_round_robin(decisions.given, start, target, window))
        state, mask, _, _ = env.step(decide(state, mask))
    return np.stack(states), np.stack(masks), np.asarray(labels, dtype=np.int64), None if env.truncated else env.result()
