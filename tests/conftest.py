"""Shared fixtures: presets from the project's params.yaml, small hand-made cases, and the learning
settings the learning tests train with (stated here in full: the package's only defaults live in
params.yaml). The testbeds' tests run last, and while the others run, what they need (the Go binaries,
and for kind the node and runtime images) builds in the background, so a cold machine's build overlaps
the rest of the suite; their fixtures wait for it through the build's own locks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from dl2.learn.settings import LearnerSettings, LearnSettings, PretrainConfig, learner_settings
from dl2.schedulers.heuristics import POLICY_IDS, run_to_completion
from dl2.sim import engine
from dl2.sim.scenario import Scenario, SimOptions
from dl2.sim.state import make_cluster, make_jobs, make_recorder
from dl2.workload.presets import Preset, get_preset

TESTBEDS = ("tests/k8s/", "tests/kind/")
_background: dict[str, subprocess.Popen] = {}


def _testbed(item: pytest.Item) -> int:
    """0 for the suite's own tests, 1 for the local testbed's, 2 for kind's: the order they run in."""
    path = str(item.fspath)
    return next((k + 1 for k, folder in enumerate(TESTBEDS) if folder in path), 0)


def pytest_collection_modifyitems(items):
    items[:] = sorted(items, key=_testbed)  # stable: each group keeps its order


def pytest_collection_finish(session):
    """Start building what the selected testbed tests need, unless they run first (nothing else selected)."""
    wanted = {_testbed(item) for item in session.items}
    if not wanted - {0} or 0 not in wanted:
        return
    from dl2.testbed.build import cache_root

    log = cache_root() / "background-build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "dl2.cli", "testbed", "build", *(["--kind"] if 2 in wanted else [])]
    with open(log, "a") as out:
        _background["build"] = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    print(f"\nbuilding the testbeds in the background: {' '.join(command[2:])} (log: {log})", file=sys.stderr)


def pytest_sessionfinish(session):
    build = _background.pop("build", None)
    if build is not None and build.poll() is None:  # the run ended early: leave nothing running
        os.killpg(build.pid, signal.SIGTERM)
        build.wait()


@pytest.fixture
def one_torch_thread():
    """Torch on one thread for the test, restored after: a training run pins its thread count, on which the
    weights depend (a module opts in with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def paper() -> Scenario:
    return Scenario(get_preset("paper"))


def tiny_preset(num_nodes: int = 2, max_tasks: int = 2, num_jobs: int = 6) -> Preset:
    return Preset("tiny", num_nodes=num_nodes, num_jobs=num_jobs, max_arrivals=2, max_epochs=30000,
                  max_tasks=max_tasks, speed_table="public_release", bucket_to_model=False)


# The paper's learner as the authors' code sets it, as a `finetune` section holds it (with PPO's keys too): what the
# RL tests train with, unless they say otherwise.
PAPER_LEARNER = dict(algorithm="actor-critic", updates=1000, num_envs=8, lr=1e-4, lr_schedule="constant", entropy=0.1,
                     batch_size=256, critic="slot", gamma=0.9, reward="slot", replay="prioritized", replay_size=8192,
                     learn_start=1024, exploration="code", learn_rule_actions=True, epsilon=0.4, shaping="off", gae_lambda=0.95,
                     clip=0.2, ppo_epochs=4, rollout_length=128, validate_every=100, checkpoint_every=100, select_traces=0)
PPO = dict(algorithm="ppo", exploration="off", replay="off")


def rl_config(**changes) -> LearnerSettings:
    """The settings of the learner `PAPER_LEARNER` with `changes` names, read as a `finetune` section's (`**PPO` for
    the PPO learner)."""
    return learner_settings({**PAPER_LEARNER, **changes}, "tests")


def pretrain_config(**changes) -> PretrainConfig:
    """Pretraining on DRF's decisions, 10 epochs, with `changes`."""
    return PretrainConfig(**{**dict(teacher="drf", epochs=10, batch_size=256, lr=0.005, seed=0, eval_every=1, label_smoothing=0.0),
                             **changes})


def learn_settings(**changes) -> LearnSettings:
    """Learning on `paper` with the paper's network and 40 + 10 traces, with `changes` (`preset` by name)."""
    values = {**dict(preset="paper", window=20, network="paper", hidden=None, one_hot=None, batch_norm=None, assign_bundle=True,
                     train_traces=40, validation_traces=10, seed=7, arrivals="ali", speed_noise=0.0, epoch_error=0.0), **changes}
    return LearnSettings(**{**values, "preset": get_preset(values["preset"])})


def run_by_hand(policy: str, arrivals, epochs, table_fn, num_nodes: int = 2, max_tasks: int = 2,
                fine_grained: bool = True, worker=(2, 4), ps=(2, 0), lost: float = 0.0) -> np.ndarray:
    """Run the compiled loop on jobs of one model with a hand-made speed table, each new configuration
    losing the fraction `lost` of its slot; returns JCT per job."""
    n = len(arrivals)
    size = max_tasks + 2
    table = np.zeros((1, size, size))
    for p in range(1, size):
        for w in range(1, size):
            table[0, p, w] = table_fn(p, w)
    jobs = make_jobs(np.zeros(n, np.int64), np.asarray(arrivals), np.arange(1, n + 1), np.asarray(epochs, float),
                     np.tile(worker, (n, 1)), np.tile(ps, (n, 1)))
    cluster = make_cluster(num_nodes, 8, 8)
    stats = np.empty((1000, engine.NUM_STATS))
    slots = run_to_completion(POLICY_IDS[policy], jobs, cluster, make_recorder(0, 1), table, table, max_tasks,
                               fine_grained, False, stats, (lost, lost))
    assert slots > 0
    return jobs.end - jobs.arrival + 1


__all__ = ["run_by_hand", "tiny_preset", "SimOptions", "rl_config", "pretrain_config", "learn_settings", "PPO"]
