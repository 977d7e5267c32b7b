"""Small cases worked out by hand for every policy (2 nodes of 8 CPU + 8 GPU slots, bundles of [4, 4])."""

import numpy as np
import pytest
from conftest import run_by_hand

from dl2.schedulers.heuristics import optimus as optimus_kernel
from dl2.sim.state import make_cluster, make_jobs, make_recorder

TEN_PER_WORKER = lambda p, w: 10.0 * w  # noqa: E731  epochs per slot


def test_fifo_serves_in_arrival_order_and_uses_fractional_last_slot():
    # slot 0: jobs 1 and 2 take both nodes (2 bundles each); slot 1 again; job 3 waits until slot 2.
    jct = run_by_hand("fifo", [0, 0, 0], [25, 40, 10], TEN_PER_WORKER)
    np.testing.assert_allclose(jct, [1.25, 2.0, 2.5])


def test_integer_jct_counts_the_last_slot_whole():
    jct = run_by_hand("fifo", [0, 0, 0], [25, 40, 10], TEN_PER_WORKER, fine_grained=False)
    np.testing.assert_allclose(jct, [2.0, 2.0, 3.0])


def test_drf_spreads_bundles_by_dominant_share():
    # slot 0: bundles go job1, job2, job3, job1 (then job2 fails: cluster full); job3 finishes in slot 0.
    jct = run_by_hand("drf", [0, 0, 0], [25, 40, 10], TEN_PER_WORKER)
    np.testing.assert_allclose(jct, [1.25, 2.5, 1.0])


def test_srtf_prefers_the_smallest_remaining_fraction():
    # 3 tasks max: slot 0 gives job1 3 bundles and job2 1; from slot 1 on job2 has the smaller remaining
    # fraction, takes 3 bundles, and finishes at slot 3. FIFO keeps job1 first: job2 needs 10 slots.
    srtf = run_by_hand("srtf", [0, 0], [1000, 100], TEN_PER_WORKER, max_tasks=3)
    fifo = run_by_hand("fifo", [0, 0], [1000, 100], TEN_PER_WORKER, max_tasks=3)
    assert srtf[1] == pytest.approx(4.0)
    assert fifo[1] == pytest.approx(10.0)


def test_tetris_as_coded_rewards_more_remaining_work():
    # slot 1: job3 (most remaining work) gets node 0, job2 node 1; job1 waits and finishes in slot 2.
    jct = run_by_hand("tetris", [0, 0, 0], [25, 40, 10], TEN_PER_WORKER)
    np.testing.assert_allclose(jct, [2.25, 2.0, 1.5])


def test_optimus_adds_the_more_useful_task_and_drops_a_job_at_the_maximum():
    # A worker always helps more than a PS here: 1 worker, 1 PS, then a 2nd worker; the 3rd worker is
    # over the maximum, so the job is dropped for the slot and never gets a 2nd PS.
    table = np.zeros((1, 4, 4))
    for p in range(1, 4):
        for w in range(1, 4):
            table[0, p, w] = 10.0 * w + 5.0 * p
    jobs = make_jobs(np.zeros(1, np.int64), np.zeros(1, np.int64), np.array([1]), np.array([100.0]),
                     np.array([[2, 4]]), np.array([[2, 0]]))
    jobs.active[0] = True
    cluster = make_cluster(2, 8, 8)
    optimus_kernel(jobs, cluster, make_recorder(0, 1), 0, 2, table)
    assert (jobs.workers[0], jobs.ps[0]) == (2, 1)
    k = cluster.num_tasks[0]
    # worker on node 0, PS on the less loaded node 1, 2nd worker on node 1 (total 2 < 6)
    assert list(zip(cluster.task_role[:k], cluster.task_node[:k])) == [(0, 0), (1, 1), (0, 1)]
    jct = run_by_hand("optimus", [0], [100], lambda p, w: 10.0 * w + 5.0 * p)
    assert jct[0] == pytest.approx(4.0)  # 25 epochs per slot, exactly 4 slots
