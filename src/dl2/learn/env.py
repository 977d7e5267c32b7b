"""The DL2 decision environment: one policy decision at a time (DESIGN §3, §5).

Each slot: admit arrivals, free the cluster, optionally give every job one bundle ("assign bundle"),
then ask the policy repeatedly for one of `3*window + 1` actions. A placed action asks again; void, an
allocation failure, or nothing left to decide ends the slot, which then trains and pays its reward
(sum over jobs of epochs trained / epochs). Slots with nothing to decide run without asking.

`BackendEnv` is the environment over any backend (`dl2.schedulers.base.Backend`): the simulator, or a
Kubernetes cluster whose slots really run. `DecisionEnv` is its compiled fast path on the simulator,
tested equal to `BackendEnv` over `dl2.backends.sim.SimulatedCluster`. Both follow Gymnasium's
`reset`/`step` (masks in `info`); `VecEnv` steps several at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numba import njit

from dl2.schedulers.base import Backend
from dl2.sim import engine
from dl2.sim.placement import place_least_loaded
from dl2.sim.scenario import Scenario
from dl2.sim.state import NUM_FEATURES, Cluster, Jobs, make_cluster
from dl2.sim.window import action_mask, observe_window
from dl2.workload.traces import Trace

CONTINUE, SLOT_END, DONE, TRUNCATED = 0, 1, 2, 3
SLOT, NEXT_JOB, COMPLETED = 0, 1, 2  # fields of the control array


@njit(cache=True)
def _start_slot(jobs: Jobs, cl: Cluster, ctl: np.ndarray, max_tasks: int, assign_bundle: bool,
                state: np.ndarray, window_jobs: np.ndarray, mask: np.ndarray) -> int:
    ctl[NEXT_JOB] = engine.admit_and_reset(jobs, cl, ctl[SLOT], ctl[NEXT_JOB])
    if assign_bundle:
        engine.assign_bundles(jobs, cl)
    observe_window(jobs, cl, ctl[SLOT], max_tasks, state, window_jobs)
    return action_mask(jobs, window_jobs, max_tasks, mask)


@njit(cache=True)
def _finish_slots(jobs: Jobs, cl: Cluster, table: np.ndarray, ctl: np.ndarray, max_tasks: int, fine_grained: bool,
                  lost: tuple[float, float], trained: np.ndarray, assign_bundle: bool, max_slots: int, state: np.ndarray,
                  window_jobs: np.ndarray, mask: np.ndarray) -> tuple[int, float]:
    """Train the current slot, then run slots until one needs a decision; (status, the slot's reward)."""
    n = jobs.model.shape[0]
    completed, reward = engine.advance(jobs, table, ctl[SLOT], fine_grained, lost, trained)
    ctl[COMPLETED] += completed
    ctl[SLOT] += 1
    while ctl[COMPLETED] < n:
        if ctl[SLOT] >= max_slots:
            return TRUNCATED, reward
        if _start_slot(jobs, cl, ctl, max_tasks, assign_bundle, state, window_jobs, mask) > 0:
            return SLOT_END, reward
        completed, _ = engine.advance(jobs, table, ctl[SLOT], fine_grained, lost, trained)
        ctl[COMPLETED] += completed
        ctl[SLOT] += 1
    return DONE, reward


@njit(cache=True)
def env_reset(jobs: Jobs, cl: Cluster, table: np.ndarray, ctl: np.ndarray, max_tasks: int, fine_grained: bool,
              lost: tuple[float, float], trained: np.ndarray, assign_bundle: bool, max_slots: int, state: np.ndarray,
              window_jobs: np.ndarray, mask: np.ndarray) -> int:
    """Start an episode at slot 0 and run to the first decision; returns a status. `lost` and `trained`:
    the restart cost, as `dl2.sim.engine.advance` takes it."""
    ctl[:] = 0
    trained[:] = 0
    while ctl[COMPLETED] < jobs.model.shape[0]:
        if ctl[SLOT] >= max_slots:
            return TRUNCATED
        if _start_slot(jobs, cl, ctl, max_tasks, assign_bundle, state, window_jobs, mask) > 0:
            return CONTINUE
        completed, _ = engine.advance(jobs, table, ctl[SLOT], fine_grained, lost, trained)
        ctl[COMPLETED] += completed
        ctl[SLOT] += 1
    return DONE


@njit(cache=True)
def env_step(jobs: Jobs, cl: Cluster, table: np.ndarray, ctl: np.ndarray, action: int, max_tasks: int,
             fine_grained: bool, lost: tuple[float, float], trained: np.ndarray, assign_bundle: bool, max_slots: int,
             state: np.ndarray, window_jobs: np.ndarray, mask: np.ndarray, job_reward: np.ndarray) -> tuple[int, float]:
    """Apply one action; returns (status, reward): reward is the slot's when the action ended it, else 0.
    A slot that ends leaves each job's share of its reward in `job_reward` (by job index). `lost` and
    `trained`: the restart cost, as `dl2.sim.engine.advance` takes it."""
    window = window_jobs.shape[0]
    if action < 3 * window and mask[action]:
        job = window_jobs[action // 3]
        if place_least_loaded(jobs, cl, job, action % 3):
            observe_window(jobs, cl, ctl[SLOT], max_tasks, state, window_jobs)
            if action_mask(jobs, window_jobs, max_tasks, mask) > 0:
                return CONTINUE, 0.0
    for i in range(jobs.model.shape[0]):
        job_reward[i] = _reward_share(jobs, table, i, lost, trained)
    return _finish_slots(jobs, cl, table, ctl, max_tasks, fine_grained, lost, trained, assign_bundle, max_slots, state,
                         window_jobs, mask)


@njit(cache=True, inline="always")
def _reward_share(jobs: Jobs, table: np.ndarray, i: int, lost: tuple[float, float], trained: np.ndarray) -> float:
    """Job i's part of the slot reward if the slot ended now: epochs it would train / its epochs."""
    if not jobs.active[i] or jobs.workers[i] == 0 or jobs.ps[i] == 0:
        return 0.0
    epochs = engine.slot_epochs(jobs, table, i, engine.starting_fraction(jobs, trained, i, lost))
    return min(epochs, jobs.epochs[i] - jobs.progress[i]) / jobs.known_epochs[i]


@njit(cache=True)
def slot_potential(jobs: Jobs, table: np.ndarray, lost: tuple[float, float], trained: np.ndarray) -> float:
    """The reward the slot would pay if it ended now, with epochs per slot from `table` and the restart cost
    (`lost`, `trained`: as `dl2.sim.engine.advance` takes it), changing nothing."""
    total = 0.0
    for i in range(jobs.model.shape[0]):
        total += _reward_share(jobs, table, i, lost, trained)
    return total


class Episodes:
    """What both environments share: traces run one after another (a random one each time, or in turn
    without `shuffle`), the window's raw state and the legal actions."""

    def __init__(self, traces: Sequence[Trace], scenario: Scenario, window: int, seed: int, shuffle: bool):
        if not traces:
            raise ValueError(f"{type(self).__name__} needs at least one trace")
        self.traces, self.scenario, self.window, self.shuffle = list(traces), scenario, window, shuffle
        self.rng = np.random.default_rng(seed)
        self.max_tasks = scenario.preset.max_tasks
        self.state = np.zeros((window, NUM_FEATURES), dtype=np.float32)
        self.window_jobs = np.full(window, -1, dtype=np.int64)
        self.mask = np.zeros(3 * window + 1, dtype=np.bool_)
        self._next_trace = 0
        self.trace: Trace | None = None

    @property
    def num_actions(self) -> int:
        return 3 * self.window + 1

    def _choose_trace(self, seed: int | None, trace: Trace | None) -> Trace:
        """The trace `reset` runs next: `trace` if given, else the next of `traces`; a `seed` first reseeds `rng`."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        if trace is not None:
            return trace
        index = int(self.rng.integers(len(self.traces))) if self.shuffle else self._next_trace % len(self.traces)
        self._next_trace += 1
        return self.traces[index]

    def close(self) -> None:
        """Free what the environment holds outside this process (nothing, here; a cluster's pods for a backend's)."""


class DecisionEnv(Episodes):
    """One simulated cluster running traces one after another (Gymnasium-style API).

    `reset()` -> (state, info); `step(action)` -> (state, reward, terminated, truncated, info).
    The state is the raw window (window, 6); `info["mask"]` lists the legal actions, `info["slot_end"]`
    whether the action ended a slot (its reward is the slot's, and `job_reward` holds each job's share of
    it, by job index), `info["jct"]` per-job JCTs at the end.
    """

    def __init__(self, traces: Sequence[Trace], scenario: Scenario, window: int = 20, seed: int = 0,
                 shuffle: bool = True):
        super().__init__(traces, scenario, window, seed, shuffle)
        self.table = scenario.true_table  # what jobs train at (the policy needs no speed model)
        p, o = scenario.preset, scenario.options
        self.fine_grained, self.assign_bundle, self.max_slots = o.fine_grained_jct, o.assign_bundle, o.max_slots
        self.lost = scenario.lost
        self.cluster = make_cluster(p.num_nodes, p.node_cpu, p.node_gpu)
        self.ctl = np.zeros(3, dtype=np.int64)

    @property
    def slot(self) -> int:
        return int(self.ctl[SLOT])

    def load(self, trace: Trace) -> None:
        """Fresh job arrays for `trace`; `reset` then starts the episode (compiled runs start it themselves)."""
        self.trace = trace
        self.jobs, self.order = self.scenario.jobs(trace)
        self.trained = engine.no_training(len(trace))
        self.job_reward = np.zeros(len(trace))

    def reset(self, seed: int | None = None, trace: Trace | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        self.load(self._choose_trace(seed, trace))
        status = env_reset(self.jobs, self.cluster, self.table, self.ctl, self.max_tasks, self.fine_grained, self.lost,
                           self.trained, self.assign_bundle, self.max_slots, self.state, self.window_jobs, self.mask)
        if status != CONTINUE:
            raise RuntimeError("trace has no decision to make")
        return self.state, {"mask": self.mask, "slot": self.slot}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        status, reward = env_step(self.jobs, self.cluster, self.table, self.ctl, int(action), self.max_tasks,
                                  self.fine_grained, self.lost, self.trained, self.assign_bundle, self.max_slots, self.state,
                                  self.window_jobs, self.mask, self.job_reward)
        info: dict[str, Any] = {"mask": self.mask, "slot": self.slot, "slot_end": status != CONTINUE}
        if status == DONE:
            info["jct"] = self.jct()
        return self.state, reward, status == DONE, status == TRUNCATED, info

    def potential(self, table: np.ndarray) -> float:
        """What the current slot would pay if it ended now, by `table` (a speed model's epochs per slot)."""
        return slot_potential(self.jobs, table, self.lost, self.trained)

    def jct(self) -> np.ndarray:
        """Per-job JCT of the current trace, in trace order (nan for unfinished jobs)."""
        end = np.empty(len(self.order))
        end[self.order] = self.jobs.end
        return end - self.trace.arrival + 1.0


class BackendEnv(Episodes):
    """One backend running traces one after another (Gymnasium-style API, as `DecisionEnv`).

    `open_backend(trace)` starts a trace and returns its backend. Within a slot the policy's decisions are
    placed on the observation's own allocation, exactly as the compiled environment places them; the
    slot's allocation then goes to the backend in one `apply`, which returns the slot's reward.
    """

    def __init__(self, traces: Sequence[Trace], scenario: Scenario, window: int = 20, seed: int = 0,
                 shuffle: bool = True, *, open_backend: Callable[[Trace], Backend]):
        super().__init__(traces, scenario, window, seed, shuffle)
        self.open_backend = open_backend

    def __setstate__(self, state: dict) -> None:
        """Unpickled (a training checkpoint resumed): a backend that ran on without this environment (a real
        cluster's slots go on while a killed trainer is away) is picked up where it is now, at its next
        decision; the slot the checkpoint was deciding is gone with the trainer."""
        self.__dict__.update(state)
        backend = getattr(self, "backend", None)
        if backend is None or not hasattr(self, "obs") or (not backend.done and backend.slot == self.obs.slot):
            return
        if backend.done:
            self.reset()
            return
        status = self._next_decision()
        if status != CONTINUE:
            self.reset()

    def close(self) -> None:
        """Let the backend free what it holds (a cluster's pods), if it holds anything."""
        close = getattr(getattr(self, "backend", None), "close", None)
        if close is not None:
            close()

    @property
    def slot(self) -> int:
        return self.obs.slot

    def reset(self, seed: int | None = None, trace: Trace | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Start the next trace on its backend and run to the first decision."""
        self.trace = self._choose_trace(seed, trace)
        self.backend = self.open_backend(self.trace)
        if self._next_decision() != CONTINUE:
            raise RuntimeError("trace has no decision to make")
        return self.state, {"mask": self.mask, "slot": self.slot}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        action = int(action)
        if action < 3 * self.window and self.mask[action]:
            job = int(self.window_jobs[action // 3])
            if place_least_loaded(self.alloc.jobs, self.alloc.cluster, job, action % 3) and self._refresh() > 0:
                return self.state, 0.0, False, False, {"mask": self.mask, "slot": self.slot, "slot_end": False}
        reward = self.backend.apply(self.alloc)
        status = self._next_decision()
        info: dict[str, Any] = {"mask": self.mask, "slot": self.slot, "slot_end": True}
        if status == DONE:
            info["jct"] = self.jct()
        return self.state, reward, status == DONE, status == TRUNCATED, info

    def potential(self, table: np.ndarray) -> float:
        """What the open slot would pay if it ended now, by `table` (a speed model's epochs per slot)."""
        return slot_potential(self.alloc.jobs, table, self.scenario.lost, self.obs._trained)

    def jct(self) -> np.ndarray:
        """Per-job JCT of the current trace, in trace order (nan for unfinished jobs)."""
        done = self.backend.jct()
        return np.array([done.get(int(i), np.nan) for i in self.trace.job_id])

    def _refresh(self) -> int:
        observe_window(self.alloc.jobs, self.alloc.cluster, self.obs.slot, self.max_tasks, self.state, self.window_jobs)
        return action_mask(self.alloc.jobs, self.window_jobs, self.max_tasks, self.mask)

    def _next_decision(self) -> int:
        """Run slots with nothing to decide; CONTINUE at the next decision, or DONE / TRUNCATED."""
        while True:
            if self.backend.done:
                return DONE
            if self.backend.slot >= self.scenario.options.max_slots:
                return TRUNCATED
            self.obs = self.backend.observe()
            if self.backend.resume() is not None:  # an allocation committed before a restart: carried out as is
                continue
            self.alloc = self.obs.allocation()
            if self._refresh() > 0:
                return CONTINUE
            self.backend.apply(self.alloc)


class VecEnv:
    """Several `DecisionEnv`s stepped together: states (n, window, 6), masks (n, actions).

    An environment whose episode ends starts the next trace at once; `finished` collects
    (env index, average JCT) of every episode completed.
    """

    def __init__(self, envs: Sequence[DecisionEnv]):
        self.envs = list(envs)
        self.finished: list[tuple[int, float]] = []

    def reset(self) -> tuple[np.ndarray, np.ndarray]:
        for env in self.envs:
            env.reset()
        return self.observe()

    def observe(self) -> tuple[np.ndarray, np.ndarray]:
        return np.stack([e.state for e in self.envs]), np.stack([e.mask for e in self.envs])

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Apply one action per env; returns (rewards, slot_ended, states, masks)."""
        rewards = np.zeros(len(self.envs))
        ended = np.zeros(len(self.envs), dtype=np.bool_)
        for k, (env, action) in enumerate(zip(self.envs, actions)):
            _, reward, terminated, truncated, info = env.step(int(action))
            rewards[k], ended[k] = reward, info["slot_end"]
            if terminated or truncated:
                if terminated:
                    self.finished.append((k, float(np.mean(info["jct"]))))
                env.reset()
        states, masks = self.observe()
        return rewards, ended, states, masks
