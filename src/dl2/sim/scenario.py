"""A scenario: a preset plus simulation options, resolved into the arrays the simulator needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from dl2.errors import Dl2Error
from dl2.sim.state import Jobs, make_jobs
from dl2.workload.catalog import Catalog, load_catalog
from dl2.workload.presets import Preset
from dl2.workload.speed import AnalyticalSpeedModel, MeasuredSpeedModel, epochs_table
from dl2.workload.traces import Trace

SPEED_MODELS = ("measured", "analytical")


@dataclass(frozen=True)
class SimOptions:
    """How to simulate: DL2-faithful by default (DESIGN §3)."""

    fine_grained_jct: bool = True  # JCT from the fraction of the last slot used; False: whole slots
    assign_bundle: bool = False  # give every job one bundle before the policy acts (the authors' RL env)
    speed_model: str = "measured"  # measured table (RBF) or the analytical PS/worker model
    max_slots: int = 100_000  # give up (an error) if the trace has not finished by then
    speed_noise: float = 0.0  # jobs truly train at the model's speed times a fixed factor per (model, #PS,
    #                           #workers), uniform in 1 ± speed_noise; schedulers know the model's
    epoch_error: float = 0.0  # schedulers are told each job's epochs times a factor uniform in 1 ± epoch_error
    noise_seed: int = 0  # draws both

    def __post_init__(self):
        for key in ("speed_noise", "epoch_error"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise Dl2Error(f"{key}: expected a number in [0, 1), got {getattr(self, key)!r}")


@dataclass(frozen=True)
class Scenario:
    preset: Preset
    options: SimOptions = field(default_factory=SimOptions)

    @property
    def catalog(self) -> Catalog:
        return load_catalog(self.preset.speed_table)

    @property
    def table(self) -> np.ndarray:
        """Epochs per slot, [model, #PS, #workers], for 0..max_tasks+1 of each: the speed model schedulers know."""
        return _table(self.preset.speed_table, self.options.speed_model, self.preset.max_tasks, self.preset.slot_seconds)

    @property
    def true_table(self) -> np.ndarray:
        """The epochs per slot jobs actually train at: `table`, unless `speed_noise` perturbs it."""
        o, p = self.options, self.preset
        if o.speed_noise == 0.0:
            return self.table
        return _noisy_table(p.speed_table, o.speed_model, p.max_tasks, p.slot_seconds, o.speed_noise, o.noise_seed)

    @property
    def restart_fraction(self) -> float:
        """The fraction of a slot a job's new configuration spends starting (the preset's restart_seconds over
        its slot_seconds, at most 1): `dl2.sim.engine.advance`'s `lost`."""
        return min(self.preset.restart_seconds / self.preset.slot_seconds, 1.0)

    @property
    def lost(self) -> tuple[float, float]:
        """(restart, rejoin): the fractions of a slot a job's new configuration spends starting if it adds a task
        (`restart_fraction`) or only removes some (the preset's rejoin_seconds, restart_seconds where it has
        none, over its slot_seconds, at most 1): `dl2.sim.engine.advance`'s `lost`."""
        p = self.preset
        rejoin = p.restart_seconds if p.rejoin_seconds is None else p.rejoin_seconds
        return self.restart_fraction, min(rejoin / p.slot_seconds, 1.0)

    def jobs(self, trace: Trace) -> tuple[Jobs, np.ndarray]:
        """Fresh job arrays for `trace`, and the order (trace row per job index) they are in."""
        if trace.model_names != self.catalog.names:
            raise Dl2Error("trace was read with a different model catalog than the scenario's")
        order = np.lexsort((trace.job_id, trace.arrival))
        c = self.catalog
        worker = c.worker_demand[trace.model[order]]
        ps = c.ps_demand[trace.model[order]]
        bundle = worker + ps
        too_big = (bundle[:, 0] > self.preset.node_cpu) | (bundle[:, 1] > self.preset.node_gpu)
        if too_big.any():
            name = c.names[trace.model[order][too_big.argmax()]]
            raise Dl2Error(f"a {name} bundle needs more than one node of preset {self.preset.name!r} holds")
        epochs = trace.num_epochs[order]
        known = None
        if self.options.epoch_error > 0.0:
            rng = np.random.default_rng([self.options.noise_seed, len(trace), int(trace.job_id.sum())])
            known = epochs * rng.uniform(1.0 - self.options.epoch_error, 1.0 + self.options.epoch_error, len(epochs))
        jobs = make_jobs(trace.model[order], trace.arrival[order], trace.job_id[order], epochs, worker, ps, known)
        return jobs, order


@lru_cache(maxsize=16)
def _noisy_table(speed_table: str, speed_model: str, max_tasks: int, slot_seconds: float, noise: float, seed: int) -> np.ndarray:
    table = _table(speed_table, speed_model, max_tasks, slot_seconds)
    noisy = table * np.random.default_rng(seed).uniform(1.0 - noise, 1.0 + noise, table.shape)
    noisy.setflags(write=False)  # shared by every caller, as `_table`'s is; one array type for numba to compile for
    return noisy


@lru_cache(maxsize=16)
def _table(speed_table: str, speed_model: str, max_tasks: int, slot_seconds: float) -> np.ndarray:
    catalog = load_catalog(speed_table)
    if speed_model == "measured":
        model = MeasuredSpeedModel(catalog, speed_table, slot_seconds)
    elif speed_model == "analytical":
        model = AnalyticalSpeedModel(catalog, slot_seconds)
    else:
        raise Dl2Error(f"unknown speed model {speed_model!r} (known: {', '.join(SPEED_MODELS)})")
    return epochs_table(model, catalog.num_models, max_tasks)
