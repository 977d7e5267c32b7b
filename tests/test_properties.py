"""Properties of every policy on random small clusters and traces (hypothesis)."""

import numpy as np
from conftest import tiny_preset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dl2.backends.sim import SimulatedCluster
from dl2.metrics import lower_bound_jct
from dl2.schedulers import BuiltinScheduler, policy_names
from dl2.sim.scenario import Scenario, SimOptions
from dl2.workload.catalog import load_catalog
from dl2.workload.traces import Trace

MODELS = load_catalog("public_release").names


@st.composite
def cases(draw):
    num_nodes = draw(st.integers(1, 4))
    max_tasks = draw(st.integers(1, 4))
    n = draw(st.integers(1, 8))
    arrivals = sorted(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)))
    models = draw(st.lists(st.integers(0, len(MODELS) - 1), min_size=n, max_size=n))
    epochs = draw(st.lists(st.floats(1.0, 2000.0), min_size=n, max_size=n))
    ids = draw(st.permutations(range(1, n + 1)))
    trace = Trace(np.array(ids, dtype=np.int64), np.array(arrivals, dtype=np.int64), np.array(models, dtype=np.int64),
                  np.array(epochs), MODELS)
    fine = draw(st.booleans())
    return Scenario(tiny_preset(num_nodes, max_tasks), SimOptions(fine_grained_jct=fine)), trace


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from(policy_names()))
def test_capacity_progress_completion_and_the_lower_bound(case, policy):
    scenario, trace = case
    backend = SimulatedCluster(trace, scenario)
    scheduler = BuiltinScheduler(policy)
    while not backend.done:
        obs = backend.observe()
        alloc = scheduler.schedule(obs)
        assert (alloc.cluster.used <= obs.node_capacity).all()  # never over a node's capacity
        assert (alloc.workers <= scenario.preset.max_tasks).all() and (alloc.ps <= scenario.preset.max_tasks).all()
        backend.apply(alloc)  # re-checks capacity from the placed tasks
        assert (backend.jobs.progress <= backend.jobs.epochs).all()  # progress never exceeds epochs
    end = np.empty(len(trace))
    end[backend.order] = backend.jobs.end
    assert np.isfinite(end).all()  # every job completes
    jct = end - trace.arrival + 1
    assert (jct >= lower_bound_jct(trace, scenario) - 1e-9).all()  # nobody beats running alone at best speed
