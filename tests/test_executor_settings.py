"""The `executor` section without a Ray cluster: bad settings are refused with the key to fix, and the
default (`local`) never loads Ray or Gymnasium."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import PAPER_LEARNER, learn_settings, rl_config
from test_bad_input import params_file, set_key, stage_error

from dl2.distributed.executor import Executor
from dl2.distributed.local_cluster import free_port
from dl2.distributed.ray_tasks import connect
from dl2.errors import Dl2Error
from dl2.learn import workflow
from dl2.learn.agent import DL2Policy
from dl2.learn.learners import make_trainer


@pytest.mark.parametrize("key, value, words", [
    ("kind", "spark", ["executor.kind", "spark", "local", "ray"]),
    ("cluster_actors", 4, ["cluster_actors", "kind: ray"]),
    ("retries", -1, ["executor.retries"]),
    ("cpus_per_job", 0, ["executor.cpus_per_job"]),
])
def test_a_bad_executor_setting_names_its_key(tmp_path, key, value, words):
    for stage in ("finetune", "evaluate", "ablate@model"):
        msg = stage_error(stage, params_file(tmp_path, set_key("executor", key, value)))
        assert all(word in msg for word in words), msg


def test_an_address_where_no_ray_cluster_answers_is_refused_at_once(monkeypatch):
    with pytest.raises(Dl2Error, match=r"executor.address: no Ray cluster answers at '127.0.0.1:\d+'.*ray start --head"):
        connect(Executor("ray", f"127.0.0.1:{free_port()}", 1.0, 0, 0))
    with pytest.raises(Dl2Error, match=r"no Ray cluster answers at 'ray://127.0.0.1:\d+'"):  # a Ray Client address
        connect(Executor("ray", f"ray://127.0.0.1:{free_port()}", 1.0, 0, 0))
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")
    with pytest.raises(Dl2Error, match=r"\$RAY_ADDRESS: no Ray cluster answers"):
        connect(Executor("ray", None, 1.0, 0, 0))


def test_the_papers_learner_refuses_cluster_actors_before_reaching_for_ray():
    settings = learn_settings(window=10, network="per-job", train_traces=1, validation_traces=1)
    measured = workflow.scenario(settings)
    train, validation = workflow.split_traces(settings, measured)
    torch.manual_seed(0)
    policy = DL2Policy(workflow.network(settings), measured.preset.max_tasks, settings.assign_bundle)
    trainer = make_trainer(policy, train, validation, measured, rl_config(**{**PAPER_LEARNER, "updates": 1, "num_envs": 2}), 0)
    with pytest.raises(Dl2Error, match="executor.cluster_actors: algorithm actor-critic .* finetune.algorithm: ppo"):
        trainer.use_cluster_actors(Executor("ray", "127.0.0.1:1", 1.0, 0, 2))


def test_the_local_executor_loads_neither_ray_nor_gymnasium():
    code = ("import sys\n"
            "from dl2.bench_ray import reduced_group\n"
            "from dl2.learn.ablations import cells\n"
            "import tempfile, pathlib\n"
            "plan = reduced_group()[0]\n"
            "plan = type(plan)(**{**plan.__dict__, 'cells': plan.cells[:1], 'seeds': (0,)})\n"
            "cells.run_plans([plan], pathlib.Path(tempfile.mkdtemp()), workers=1, progress=False)\n"
            "print(sorted(m for m in ('ray', 'gymnasium') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
