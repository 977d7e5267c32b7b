"""Kept testbed replays (`dl2.sim_to_real.store`): an interrupted evaluation on kind resumes per (policy, seed,
trace, repeat), and a replay kept under other weights, jobs, repeat or testbed is never taken for this one."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from dl2.backends import load_scheduler
from dl2.errors import Dl2Error
from dl2.sim.scenario import Scenario
from dl2.sim_to_real import replay
from dl2.sim_to_real.store import ReplayStore
from dl2.workload.presets import get_preset
from dl2.workload.traces import generate_trace

SCENARIO = Scenario(get_preset("testbed"))
TRACES = [generate_trace(SCENARIO.preset, SCENARIO.catalog, seed) for seed in (0, 1)]
ROWS = [{"slot": 0, "job_id": 1, "model": "wlm", "num_ps": 1, "num_workers": 1, "seconds": 20.0, "epochs_trained": 3.0,
         "epochs_predicted": 2.5, "started": True}]


def kept_jct(trace, offset: float) -> dict[int, float]:
    return {int(job): float(k) + offset for k, job in enumerate(trace.job_id)}


def test_a_kept_replay_reads_back_as_it_was_written(tmp_path):
    store = ReplayStore(tmp_path, {("drf", -1): "drf"}, "testbed")
    store.save("drf", -1, 0, TRACES[0], 1, kept_jct(TRACES[0], 0.5), ROWS)
    assert store.load("drf", -1, 0, TRACES[0], 1) == (kept_jct(TRACES[0], 0.5), ROWS)
    assert store.load("drf", -1, 0, TRACES[0], 0) is None, "another repeat is another replay"


@pytest.mark.parametrize("change", ["weights", "trace", "testbed"])
def test_a_replay_kept_under_anything_else_is_stale(tmp_path, change):
    ReplayStore(tmp_path, {("dl2", 0): "weights-a"}, "testbed").save("dl2", 0, 0, TRACES[0], 0, kept_jct(TRACES[0], 0), ROWS)
    identity = "weights-b" if change == "weights" else "weights-a"
    context = "testbed, 4 CPU slots" if change == "testbed" else "testbed"
    trace = TRACES[1] if change == "trace" else TRACES[0]
    assert ReplayStore(tmp_path, {("dl2", 0): identity}, context).load("dl2", 0, 0, trace, 0) is None


def test_a_rerun_with_every_replay_kept_replays_nothing_and_predicts_as_before(tmp_path):
    store = ReplayStore(tmp_path, {("drf", -1): "drf", ("fifo", -1): "fifo"}, "testbed")
    policies = {key: functools.partial(load_scheduler, key[0]) for key in store.identities}
    for label, seed in policies:
        for k, trace in enumerate(TRACES):
            for r in range(2):
                store.save(label, seed, k, trace, r, kept_jct(trace, 10 * k + r), ROWS)
    lines = []
    jobs, slots = replay.compare(None, policies, TRACES, SCENARIO, log=lines.append, repeats=2, store=store)
    assert len(jobs) == 2 * 2 * sum(len(t) for t in TRACES) and len(slots) == 2 * 2 * 2 * len(ROWS)
    assert sum("kept from an earlier run" in line for line in lines) == 8
    run = jobs[(jobs.policy == "fifo") & (jobs.trace == 1) & (jobs["repeat"] == 1)]
    assert run.jct_testbed.tolist() == [10 + 1 + k for k in range(len(TRACES[1]))]
    predicted = load_scheduler("fifo")
    from dl2.backends.sim import simulate

    np.testing.assert_array_equal(run.jct_sim.to_numpy(), simulate(TRACES[1], predicted, SCENARIO).jct)


def test_a_replay_neither_kept_nor_runnable_is_refused_naming_it(tmp_path):
    store = ReplayStore(tmp_path, {("drf", -1): "drf"}, "testbed")
    store.save("drf", -1, 0, TRACES[0], 0, kept_jct(TRACES[0], 0), ROWS)
    with pytest.raises(Dl2Error, match=r"drf \(seed -1\) on trace 1, repeat 1: not kept"):
        replay.compare(None, {("drf", -1): functools.partial(load_scheduler, "drf")}, TRACES, SCENARIO, log=lambda _: None,
                       store=store)
