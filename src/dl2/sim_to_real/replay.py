"""Sim-to-real: the same traces and policies on the kind testbed and in the simulator on the testbed's profiled
speed table, per job and per slot (DESIGN §6).

`replay` runs one trace to completion on a `KubeCluster` whose pods really train and records, after every
slot, each running job's allocation and the epochs its pods trained in it. `compare` does that for every
(policy, trace), as many times as asked (the testbed is not deterministic), and sets the simulator's prediction
beside it: per job, the testbed's JCT and the simulator's; per slot, the epochs trained and the epochs the speed
table predicts for the same #PS and #workers over the same wall-clock seconds (a slot whose configuration
started in it, or whose pods were still starting, pays their start-up, which the table does not hold).
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from dl2.backends import load_scheduler
from dl2.backends.environments import require_cluster_preset
from dl2.backends.kube import KubeCluster
from dl2.backends.loop import run
from dl2.backends.sim import simulate
from dl2.backends.workloads import Trained
from dl2.errors import Dl2Error
from dl2.kube.client import Kube
from dl2.learn.agent import DL2Policy, DL2Scheduler, weights_digest
from dl2.paths import write_csv_atomic
from dl2.schedulers.base import Scheduler
from dl2.sim.scenario import Scenario
from dl2.sim_to_real.store import ReplayStore
from dl2.workload.traces import Trace

RUN_COLUMNS = ["policy", "seed", "trace", "repeat"]  # one replay of a trace: the key of its rows in both tables
JOB_COLUMNS = [*RUN_COLUMNS, "job_id", "model", "epochs", "jct_testbed", "jct_sim"]
SLOT_COLUMNS = [*RUN_COLUMNS, "slot", "job_id", "model", "num_ps", "num_workers", "seconds", "epochs_trained",
                "epochs_predicted", "started"]


class StartTracker:
    """Which slots of a job hold its configuration's start-up: those before its pods under that configuration
    acknowledged any training, and those whose pods were (re)created in the slot."""

    def __init__(self) -> None:
        self.trained_under: dict[str, tuple[int, int]] = {}  # per job: the configuration whose pods trained it last

    def started(self, job: str, configuration: tuple[int, int], created_in_slot: bool, trained: float) -> bool:
        """Whether `job`'s slot under `configuration` (#PS, #workers), in which it trained `trained` epochs, started it."""
        started = created_in_slot or self.trained_under.get(job) != configuration
        if trained > 0:
            self.trained_under[job] = configuration
        return started


def replay(backend: KubeCluster, trace: Trace, scheduler: Scheduler, progress: Callable[[str], None] | None = None,
           ) -> tuple[dict[int, float], list[dict]]:
    """Run `trace` on `backend` under `scheduler` to completion: (JCT by job id, one row per slot and running job:
    slot, job_id, model, num_ps, num_workers, seconds, epochs_trained, epochs_predicted, started). `seconds`: the
    wall-clock time between the job's last reading and this slot's, in which its `epochs_trained` were trained
    (a slot whose pod changes outlast `slot_seconds` runs longer); `epochs_predicted`: the profiled table's
    epochs for as long, at most what the job had left. `started`: the
    slot's configuration had not trained the job in an earlier slot (its pods started in this slot, or were
    still starting), so the slot holds start-up as well as training."""
    backend.restart(trace)
    table, names, slot_seconds = backend.scenario.table, backend.catalog.names, backend.scenario.preset.slot_seconds
    before: dict[str, float] = {}
    starts = StartTracker()
    rows = []

    def record(slot: int, reward: float, seconds: float) -> None:
        for job in backend.jobs():
            status, name = job.get("status", {}), job["metadata"]["name"]
            allocation = status.get("allocation") or {}
            if allocation.get("slot") != slot or status.get("progressSlot") != slot:
                continue
            progress_now = float(status.get("progress", 0.0))
            trained, before[name] = progress_now - before.get(name, 0.0), progress_now
            ps, workers = int(allocation["ps"]), int(allocation["workers"])
            model = names.index(job["spec"]["model"])
            remaining = float(job["spec"]["epochs"]) - (progress_now - trained)
            seconds = float(status.get("progressSeconds", slot_seconds))  # since the job's last reading
            per_slot = float(table[model, ps, workers]) if ps and workers else 0.0
            predicted = min(per_slot * seconds / slot_seconds, remaining)
            generation = (status.get("training") or {}).get("generation")
            started = starts.started(name, (ps, workers), generation == slot, trained)
            rows.append({"slot": slot, "job_id": int(status["jobId"]), "model": names[model], "num_ps": ps,
                         "num_workers": workers, "seconds": seconds, "epochs_trained": trained, "epochs_predicted": predicted,
                         "started": started})

    run(backend, scheduler, progress=progress, on_slot=record)
    backend.close()
    return backend.jct(), rows


def compare(backend: KubeCluster | None, policies: Mapping[tuple[str, int], Callable[[], Scheduler]], traces: Sequence[Trace],
            scenario: Scenario, log: Callable[[str], None] = print, repeats: int = 1, store: ReplayStore | None = None,
            predict: Scenario | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every (policy label, seed) of `policies` (each a fresh scheduler per run) on every trace, `repeats` times on
    the testbed and once in the simulator on `predict` (default `scenario`: the profiled table; deterministic, so
    its prediction serves every repeat); returns (per-job rows `JOB_COLUMNS`, per-slot rows `SLOT_COLUMNS`). With a
    `store`, each finished replay is kept there and a replay it already holds is not run again (`backend` may then
    be None)."""
    jobs, slots, predictions = [], [], {}
    runs = [(label, seed, k, r) for (label, seed) in policies for k in range(len(traces)) for r in range(repeats)]
    for n, (label, seed, k, r) in enumerate(runs, start=1):
        trace, run = traces[k], dict(zip(RUN_COLUMNS, (label, seed, k, r)))
        stored = store.load(label, seed, k, trace, r) if store is not None else None
        if stored is not None:
            log(f"testbed {n}/{len(runs)}: {label} (seed {seed}) on trace {k}, repeat {r + 1} of {repeats}: kept from an "
                f"earlier run in {store.folder}")
            jct, rows = stored
        else:
            if backend is None:
                raise Dl2Error(f"testbed replay {label} (seed {seed}) on trace {k}, repeat {r + 1}: not kept, and no testbed "
                               "to run it on")
            log(f"testbed {n}/{len(runs)}: {label} (seed {seed}) on trace {k} ({len(trace)} jobs), repeat {r + 1} of {repeats}")
            jct, rows = replay(backend, trace, policies[label, seed](), progress=lambda line: log(f"  {line}"))
            if store is not None:
                store.save(label, seed, k, trace, r, jct, rows)
        if (label, seed, k) not in predictions:
            predictions[label, seed, k] = simulate(trace, policies[label, seed](), predict or scenario).jct
        predicted = predictions[label, seed, k]
        for i, job_id in enumerate(trace.job_id.tolist()):
            jobs.append({**run, "job_id": job_id, "model": trace.model_names[trace.model[i]],
                         "epochs": float(trace.num_epochs[i]), "jct_testbed": jct.get(job_id, np.nan),
                         "jct_sim": float(predicted[i])})
        slots += [{**run, **row} for row in rows]
        log(f"testbed {n}/{len(runs)}: average JCT {np.nanmean([jct.get(j, np.nan) for j in trace.job_id.tolist()]):.3f} slots "
            f"on the testbed, {float(np.mean(predicted)):.3f} in the simulator")
    return pd.DataFrame(jobs, columns=JOB_COLUMNS), pd.DataFrame(slots, columns=SLOT_COLUMNS)


def speed_error(slots: pd.DataFrame) -> pd.DataFrame:
    """Per job type: the epochs the pods trained over those the profiled table predicts, in slots whose
    configuration had trained before and ran the whole slot (`steady`) and in slots where it started
    (`started`, start-up included); `error` is
    steady's ratio minus 1. The last slot of a job (it finished within it) is left out: the table does not know
    when within the slot it ended."""
    full = slots[slots.epochs_predicted > 0]
    last = full.groupby([*RUN_COLUMNS, "job_id"]).slot.transform("max")
    full = full[full.slot < last]
    out = []
    for model, group in full.groupby("model", sort=False):
        steady, started = group[~group.started], group[group.started]
        ratio = lambda g: float(g.epochs_trained.sum() / g.epochs_predicted.sum()) if len(g) else np.nan  # noqa: E731
        out.append({"model": model, "steady_slots": len(steady), "steady_ratio": ratio(steady),
                    "started_slots": len(started), "started_ratio": ratio(started), "error": ratio(steady) - 1.0})
    return pd.DataFrame(out, columns=["model", "steady_slots", "steady_ratio", "started_slots", "started_ratio", "error"])


def evaluate_on_kind(learned: Mapping[str, Mapping[int, DL2Policy]], heuristics: Sequence[str], traces: Sequence[Trace],
                     scenario: Scenario, folder: str | Path | None = None, namespace: str = "dl2-evaluate",
                     log: Callable[[str], None] = print, repeats: int = 1, keep: bool = False,
                     predict: Scenario | None = None, elastic: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`compare` on the kind testbed (`dl2 testbed up --kind`, in `folder` or the default): the heuristics, and
    every learned policy greedily (as `evaluate` reports it), in real training pods, `repeats` times each, beside
    the simulator (on `predict`, default `scenario`). With `keep`, every finished replay is kept (`ReplayStore`) in
    the testbed's folder's `replays/`, so a rerun after an interruption replays only what had not finished.
    `elastic`: surviving pods rejoin a resized job (False: every resize restarts its configuration whole); a kept
    replay serves only the same mode."""
    from dl2.kube.resources import ensure_namespace
    from dl2.testbed import kind

    pods = kind.pod_cluster(folder)
    require_cluster_preset(scenario.preset, pods, key="preset")
    workload = Trained(namespace, scenario.catalog.names, pods.runtime, scenario.preset.slot_seconds,
                       scenario.options.fine_grained_jct, elastic=elastic)
    kube = Kube.from_kubeconfig(pods.kubeconfig)
    try:
        ensure_namespace(kube, namespace)
        backend = KubeCluster(kube, scenario, namespace, pods.pool, workload=workload)
        policies: dict[tuple[str, int], Callable[[], Scheduler]] = {(name, -1): functools.partial(load_scheduler, name)
                                                                     for name in heuristics}
        identities = {key: key[0] for key in policies}
        for label, by_seed in learned.items():
            for seed, policy in by_seed.items():
                policies[label, seed] = functools.partial(DL2Scheduler, policy, greedy=True, name=label)
                identities[label, seed] = weights_digest(policy)
        context = repr((scenario, pods.workers, pods.slots_per_node, pods.runtime.cpu_millis_per_slot, elastic))
        store = ReplayStore(kind.load(folder).folder / "replays", identities, context) if keep else None
        return compare(backend, policies, traces, scenario, log, repeats, store, predict)
    finally:
        kube.close()
        shutil.rmtree(workload.runtime.shared_here / namespace, ignore_errors=True)


def write_outputs(folder: Path, jobs: pd.DataFrame, slots: pd.DataFrame) -> None:
    """`jobs.csv`, `slots.csv` and `speed_error.csv` (`speed_error`) into `folder`, each atomically."""
    write_csv_atomic(folder / "jobs.csv", jobs)
    write_csv_atomic(folder / "slots.csv", slots)
    write_csv_atomic(folder / "speed_error.csv", speed_error(slots))


def testbed_evaluation(backend: str, learned: Mapping[str, Mapping[int, DL2Policy]], heuristics: Sequence[str],
                       traces: Sequence[Trace], scenario: Scenario, log: Callable[[str], None] = print,
                       repeats: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The `evaluate` stage's testbed part: `evaluate_on_kind` where fine-tuning ran on kind (`backend`), keeping
    its replays for a rerun to resume from, else empty tables (no testbed to run on)."""
    if backend != "kind":
        return pd.DataFrame(columns=JOB_COLUMNS), pd.DataFrame(columns=SLOT_COLUMNS)
    return evaluate_on_kind(learned, heuristics, traces, scenario, log=log, repeats=repeats, keep=True)


def summary(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per policy: the average JCT on the testbed and in the simulator (mean over seeds, traces and repeats), their
    ratio (testbed over simulator: the sim-to-real gap in JCT), the runs, and `repeat_sd`: how much the testbed's
    average JCT varies when the same policy replays the same trace (the sd over repeats, averaged over the
    (seed, trace) pairs; 0 with one repeat)."""
    per_run = jobs.groupby(RUN_COLUMNS, sort=False)[["jct_testbed", "jct_sim"]].mean().reset_index()
    repeat_sd = per_run.groupby(["policy", "seed", "trace"], sort=False).jct_testbed.std(ddof=0).groupby("policy", sort=False).mean()
    table = per_run.groupby("policy", sort=False).agg(testbed=("jct_testbed", "mean"), sim=("jct_sim", "mean"),
                                                      runs=("jct_sim", "size")).reset_index()
    table["ratio"] = table.testbed / table.sim
    table["repeat_sd"] = table.policy.map(repeat_sd)
    return table


def metrics(jobs: pd.DataFrame) -> dict[str, float]:
    """`summary` as flat metrics: `testbed.<policy>.avg_jct`, `.sim_avg_jct`, `.repeat_sd`."""
    out = {}
    for row in summary(jobs).itertuples():
        out[f"testbed.{row.policy}.avg_jct"] = float(row.testbed)
        out[f"testbed.{row.policy}.sim_avg_jct"] = float(row.sim)
        out[f"testbed.{row.policy}.repeat_sd"] = float(row.repeat_sd)
    return out
