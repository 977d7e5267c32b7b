"""The stages' jobs and PPO's training clusters on a real two-node Ray cluster: the same results as a local
run, bit for bit, through a node that dies and a driver that is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import PPO, learn_settings, rl_config

from dl2.bench_ray import comparable, reduced_group
from dl2.distributed.executor import Executor
from dl2.learn import workflow
from dl2.learn.ablations import cells
from dl2.learn.agent import DL2Policy
from dl2.learn.evaluate import evaluate
from dl2.learn.learners import make_trainer
from dl2.learn.settings import FinetunePlan
from dl2.learn.trainer import Trainer


def on(cluster, cluster_actors: int = 0) -> Executor:
    return Executor("ray", cluster.address, 1.0, 3, cluster_actors)


@pytest.fixture(scope="module")
def local_results(tmp_path_factory) -> str:
    """The reduced group, run locally in this process."""
    return comparable(cells.run_plans(reduced_group(), tmp_path_factory.mktemp("local"), workers=1, progress=False))


def stored_files(folder: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*/*.json"))}


def test_an_ablation_group_on_ray_gives_the_local_results_in_the_same_files(two_nodes, local_results, tmp_path):
    results = cells.run_plans(reduced_group(), tmp_path, workers=1, progress=False, executor=on(two_nodes))
    assert comparable(results) == local_results
    stored = stored_files(tmp_path)  # written by the driver, one per cell and seed
    assert len(stored) == 8 and {(r["cell"], r["seed"]) for r in stored.values()} == \
        {(c["cell"], c["seed"]) for c in json.loads(local_results)["pretraining"]}
    assert not list(tmp_path.glob("*/*.ckpt"))  # checkpoints removed once each result was stored


def test_fine_tuning_runs_as_ray_tasks_end_as_in_one_process(two_nodes, tmp_path):
    settings = learn_settings(window=10, network="per-job", train_traces=2, validation_traces=1)
    plan = FinetunePlan(runs=("sl-rl", "rl-only"), seeds=(0, 1), backend="sim", workers=1,
                        learner=rl_config(**PPO, updates=2, num_envs=2, batch_size=32, rollout_length=16, validate_every=1))
    torch.manual_seed(0)
    pretrained = DL2Policy(workflow.network(settings), 8, settings.assign_bundle)
    local = list(workflow.finetune_all(plan, settings, pretrained, tmp_path / "local"))
    rows = []
    remote = list(workflow.finetune_all(plan, settings, pretrained, tmp_path / "ray", on_row=lambda m, r: rows.append((m, r["update"])),
                                        executor=on(two_nodes)))
    assert [(name, seed) for name, seed, _, _ in remote] == [("sl-rl", 0), ("sl-rl", 1), ("rl-only", 0), ("rl-only", 1)]
    assert rows == [(m, u) for m in ("sl-rl-s0", "sl-rl-s1", "rl-only-s0", "rl-only-s1") for u in (1, 2)]  # the driver logs every row
    for (_, _, one, history_one), (_, _, two, history_two) in zip(local, remote):
        pd.testing.assert_frame_equal(history_one.drop(columns="seconds"), history_two.drop(columns="seconds"))
        for a, b in zip(one.net.state_dict().values(), two.net.state_dict().values()):
            assert torch.equal(a, b)


def _ppo_trainer(tmp_path, **changes) -> Trainer:
    settings = learn_settings(window=10, network="per-job", train_traces=3, validation_traces=1)
    measured = workflow.scenario(settings)
    train, validation = workflow.split_traces(settings, measured)
    torch.manual_seed(0)
    policy = DL2Policy(workflow.network(settings), measured.preset.max_tasks, settings.assign_bundle)
    config = rl_config(**{**PPO, "updates": 4, "num_envs": 5, "batch_size": 64, "rollout_length": 24, "validate_every": 1,
                          "select_traces": 0, "shaping": "env", **changes})
    return make_trainer(policy, train, validation, measured, config, 0)


def _assert_same_run(one: Trainer, history_one: pd.DataFrame, two: Trainer, history_two: pd.DataFrame, exact: bool) -> None:
    pd.testing.assert_frame_equal(history_one.drop(columns="seconds"), history_two.drop(columns="seconds"),
                                  check_exact=exact, rtol=1e-5)
    for a, b in zip(one.policy.net.state_dict().values(), two.policy.net.state_dict().values()):
        assert torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert (one.decisions, one.slots_done, one.episode_jcts) == (two.decisions, two.slots_done, two.episode_jcts)


@pytest.mark.parametrize("critic", ["slot", "off"])
def test_training_clusters_on_ray_actors_train_as_in_the_learners_process(two_nodes, tmp_path, critic):
    alone = _ppo_trainer(tmp_path, critic=critic)
    history_alone = alone.train()
    spread = _ppo_trainer(tmp_path, critic=critic)
    spread.use_cluster_actors(on(two_nodes, cluster_actors=2))  # five clusters: three on one actor, two on the other
    history_spread = spread.train()
    spread.close()
    _assert_same_run(alone, history_alone, spread, history_spread, exact=False)  # each actor scores its own batch

    interrupted = _ppo_trainer(tmp_path, critic=critic)
    interrupted.use_cluster_actors(on(two_nodes, cluster_actors=2))
    interrupted.train(checkpoint=tmp_path / "run.ckpt", stop_after=2)
    interrupted.close()
    resumed = Trainer.load(tmp_path / "run.ckpt")  # its environments, fetched from the actors
    resumed.use_cluster_actors(on(two_nodes, cluster_actors=2))
    history_resumed = resumed.train()
    resumed.close()
    _assert_same_run(spread, history_spread, resumed, history_resumed, exact=True)


def test_a_node_that_dies_under_the_training_clusters_costs_the_run_nothing(two_nodes, tmp_path):
    settings = learn_settings(window=10, network="per-job", train_traces=3, validation_traces=1)
    config = rl_config(**{**PPO, "updates": 8, "num_envs": 4, "batch_size": 64, "rollout_length": 24, "validate_every": 1,
                          "checkpoint_every": 1, "select_traces": 0})
    torch.manual_seed(0)
    pretrained = DL2Policy(workflow.network(settings), 8, settings.assign_bundle)
    executor = Executor("ray", two_nodes.address, 0.5, 3, 2)  # an actor a node (spread), and both fit on one
    calm, history_calm = workflow.finetune_run("sl-rl", 0, settings, config, pretrained, tmp_path / "calm.ckpt", executor=executor)
    checkpoint = tmp_path / "storm.ckpt"
    killed = []

    def kill_once_checkpointed():
        deadline = time.monotonic() + 300
        while not checkpoint.is_file() and time.monotonic() < deadline:
            time.sleep(0.02)
        killed.append(two_nodes.kill_node(two_nodes.workers[0]))

    watcher = threading.Thread(target=kill_once_checkpointed, daemon=True)
    watcher.start()
    with pytest.warns(UserWarning, match="actor holding training clusters died.*resuming from"):
        stormy, history_stormy = workflow.finetune_run("sl-rl", 0, settings, config, pretrained, checkpoint, executor=executor)
    watcher.join(timeout=60)
    assert killed
    pd.testing.assert_frame_equal(history_calm.drop(columns="seconds"), history_stormy.drop(columns="seconds"))
    for a, b in zip(calm.net.state_dict().values(), stormy.net.state_dict().values()):
        assert torch.equal(a, b)


def test_evaluation_on_ray_gives_the_local_table(two_nodes):
    settings = learn_settings(window=10, network="per-job", train_traces=1, validation_traces=2)
    measured = workflow.scenario(settings)
    _, validation = workflow.split_traces(settings, measured)
    torch.manual_seed(0)
    learned = {"dl2": {s: DL2Policy(workflow.network(settings), 8, True) for s in (0, 1)}}
    local = evaluate(learned, ["drf", "optimus"], validation, measured, seed=3)
    pd.testing.assert_frame_equal(evaluate(learned, ["drf", "optimus"], validation, measured, seed=3, executor=on(two_nodes)), local)


def _when_stored(folder: Path, count: int, then, timeout: float = 300) -> threading.Thread:
    """A thread that calls `then()` once `count` results are stored under `folder`."""
    def watch():
        deadline = time.monotonic() + timeout
        while len(list(folder.glob("*/*.json"))) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        then()
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_node_that_dies_mid_stage_loses_no_work_and_changes_no_number(two_nodes, local_results, tmp_path):
    import ray

    killed = []
    watcher = _when_stored(tmp_path, 1, lambda: killed.append(two_nodes.kill_node(two_nodes.workers[0])))
    results = cells.run_plans(reduced_group(), tmp_path, workers=1, progress=False, executor=on(two_nodes))
    watcher.join(timeout=60)
    assert killed, "the second node was not killed mid-run"  # after the first of eight cells: it was running one
    deadline = time.monotonic() + 120
    while sum(node["Alive"] for node in ray.nodes()) > 1 and time.monotonic() < deadline:  # Ray notices in seconds
        time.sleep(1)
    assert sum(node["Alive"] for node in ray.nodes()) == 1
    assert comparable(results) == local_results


def test_a_driver_killed_mid_stage_resumes_from_what_was_stored(two_nodes, local_results, tmp_path, monkeypatch):
    driver = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path\n"
         "from dl2.bench_ray import reduced_group; from dl2.learn.ablations import cells; from dl2.distributed.executor import Executor\n"
         "cells.run_plans(reduced_group(), Path(sys.argv[1]), 1, False, Executor('ray', sys.argv[2], 1.0, 3, 0))",
         str(tmp_path), two_nodes.address], start_new_session=True)
    try:
        _when_stored(tmp_path, 2, lambda: None).join(timeout=300)
        os.killpg(driver.pid, signal.SIGKILL)
    finally:
        driver.wait(timeout=60)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/*.json")}
    assert 2 <= len(before) < 8
    submitted = []
    run_jobs = cells.run_jobs
    monkeypatch.setattr(cells, "run_jobs", lambda fn, args, *a, **k: submitted.extend(args) or run_jobs(fn, args, *a, **k))
    results = cells.run_plans(reduced_group(), tmp_path, workers=1, progress=False, executor=on(two_nodes))
    assert comparable(results) == local_results
    assert len(submitted) == 8 - len(before)  # what was stored is not trained again
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_bench_clusters_times_a_rollout_on_each_actor_and_the_learners_update(two_nodes):
    from dl2.bench_clusters import finetune_stage, seconds_per_update

    timing = seconds_per_update(finetune_stage(), 2, on(two_nodes, cluster_actors=2), steps=2, warmup=1)
    assert timing["rollout"] > 0 and timing["update"] > 0
    assert timing["total"] == pytest.approx(timing["rollout"] + timing["update"])
