"""Online RL fine-tuning against the testbed: the generic environment over a `KubeCluster` steps as the
simulator's compiled one does, a learner updates the policy there and logs to MLflow, and its checkpoint
(environments included) loads and reconnects."""

from __future__ import annotations

import pickle
from dataclasses import replace

import mlflow
import numpy as np
import pytest
import torch
from conftest import PPO, rl_config
from mlflow.tracking import MlflowClient

from dl2 import tracking
from dl2.backends.environments import KubeEnvFactory, KubeEnvironments, KubeTraces, training_environments
from dl2.errors import Dl2Error
from dl2.kube.client import load_config
from dl2.learn.agent import DL2Policy
from dl2.learn.architecture import net_config
from dl2.learn.env import BackendEnv, DecisionEnv
from dl2.learn.learners import make_trainer
from dl2.learn.trainer import Trainer
from dl2.learn.workflow import simulator_environments

from .support import PRESET, scenario, space, trace


def test_the_kubernetes_env_matches_the_simulators_env_action_for_action(kube, testbed):
    sc = scenario(assign_bundle=True)
    tr = trace(12)
    ns = space(kube)
    kenv = BackendEnv([tr], sc, window=10, open_backend=KubeTraces(testbed.kubeconfig, sc, ns, ns))
    senv = DecisionEnv([tr], sc, window=10)
    rng = np.random.default_rng(0)
    (ks, ki), (ss, si) = kenv.reset(), senv.reset()
    steps = 0
    while True:
        np.testing.assert_array_equal(ks, ss)
        np.testing.assert_array_equal(ki["mask"], si["mask"])
        assert kenv.potential(sc.table) == senv.potential(sc.table)
        action = int(rng.choice(np.flatnonzero(si["mask"])))
        ks, kr, kt, ktr, ki = kenv.step(action)
        ss, sr, st, str_, si = senv.step(action)
        steps += 1
        assert (kt, ktr, ki["slot_end"]) == (st, str_, si["slot_end"]) and np.isclose(kr, sr, rtol=1e-12)
        if st:
            np.testing.assert_allclose(ki["jct"], si["jct"], rtol=1e-12)
            break
    assert steps > 10


def test_a_reloaded_environment_picks_up_the_cluster_where_it_went_on_without_it(kube, testbed):
    """A real cluster's slots go on while a killed trainer is away: its checkpoint's environment, loaded, decides
    at the cluster's next decision, not at the slot it was deciding (whose allocation never reached the cluster)."""
    sc = scenario(assign_bundle=True)
    ns = space(kube)
    env = BackendEnv([trace(12)], sc, window=10, open_backend=KubeTraces(testbed.kubeconfig, sc, ns, ns))
    env.reset()
    saved, saved_slot = pickle.dumps(env), env.slot
    while env.slot < saved_slot + 2:  # the original goes on: void ends each slot
        env.step(3 * env.window)
    same = pickle.loads(pickle.dumps(env))  # loaded where it stood: nothing to pick up
    assert same.slot == env.slot and np.array_equal(same.state, env.state)
    behind = pickle.loads(saved)
    assert behind.slot == env.slot == behind.backend.slot
    np.testing.assert_array_equal(behind.state, env.state)
    np.testing.assert_array_equal(behind.mask, env.mask)
    behind.close()  # a KWOK cluster's placeholders are gone at once
    assert behind.backend.census()["tasks"] == 0


@pytest.mark.parametrize("algorithm", ["actor-critic", "ppo"])
def test_online_rl_on_the_testbed_updates_the_policy_and_logs_to_mlflow(testbed, tmp_path, monkeypatch, algorithm):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    sc = scenario(assign_bundle=True)
    torch.manual_seed(0)
    policy = DL2Policy(net_config("paper", window=10), PRESET.max_tasks, sc.options.assign_bundle)
    before = [p.detach().clone() for p in policy.net.parameters()]
    learner = {"actor-critic": dict(algorithm="actor-critic", replay_size=512, learn_start=32),
               "ppo": dict(**PPO, shaping="env", rollout_length=16, ppo_epochs=2)}[algorithm]
    config = rl_config(updates=3, num_envs=2, batch_size=32, validate_every=3, checkpoint_every=3, **learner)
    trainer = make_trainer(policy, [trace(13), trace(14)], [trace(15)], sc, config, 0, tag="k8s-test",
                           make_env=KubeEnvFactory(testbed.kubeconfig, prefix=f"rl-{algorithm}"))
    assert all(isinstance(env, BackendEnv) for env in trainer.envs)
    tracking.experiment_id()
    with mlflow.start_run(run_name="finetune-k8s") as run:
        mlflow.log_param("backend", "k8s")
        history = trainer.train(checkpoint=tmp_path / "ckpt.pkl", on_row=lambda row: tracking.log_metrics(row, "rl_"))
    assert trainer.updates == 3 and len(history) == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.net.parameters()))
    logged = MlflowClient(tracking.tracking_uri()).get_run(run.info.run_id).data
    assert logged.params["backend"] == "k8s" and np.isfinite(logged.metrics["rl_val_jct_greedy"])
    token = load_config(testbed.kubeconfig).user.token
    assert token and token.encode() not in (tmp_path / "ckpt.pkl").read_bytes()  # the kubeconfig's path, not its credentials
    resumed = Trainer.load(tmp_path / "ckpt.pkl")
    assert resumed.updates == 3
    assert resumed.envs[0].backend.slot == trainer.envs[0].backend.slot  # reconnected to the same namespace
    resumed.config = replace(config, updates=4)
    resumed.train(stop_after=1)
    assert resumed.updates == 4


def test_the_finetune_backend_setting_picks_the_environments(testbed):
    assert training_environments("sim") is simulator_environments and simulator_environments("sl-rl") is DecisionEnv
    environments = training_environments("k8s", kubeconfig=testbed.kubeconfig)
    assert isinstance(environments, KubeEnvironments)
    factory = environments("sl-rl")
    assert isinstance(factory, KubeEnvFactory) and factory.prefix == "dl2-sl-rl"
    with pytest.raises(Dl2Error, match=r"finetune.backend: expected one of sim, k8s, kind, got 'nope'"):
        training_environments("nope")
