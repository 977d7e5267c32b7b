"""The paper's loop on the kind testbed (DESIGN §6): speeds profiled on the testbed into a table the simulator
loads, and DL2 fine-tuned online on kind through the pipeline's `finetune` stage, killed and resumed. (A trace
replayed on kind beside the simulator on the profiled table: `test_trained.py`.)

Each test prints what it measured: run with `-s` to read it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pandas as pd
import torch
import yaml
from lightkube.resources.core_v1 import Pod
from mlflow.tracking import MlflowClient

from dl2 import tracking
from dl2.kube.resources import JOB_LABEL
from dl2.learn.agent import DL2Policy
from dl2.learn.trainer import Trainer
from dl2.paths import TESTBED_DIR, repo_root
from dl2.workload.speed import read_measurements

from .conftest import wait_for

MODEL = "cnn-text-classification"  # the quickest stand-in to start


def test_a_profile_of_one_job_type_updates_the_table_the_simulator_loads(cluster, tmp_path):
    out = tmp_path / "testbed"
    shutil.copytree(TESTBED_DIR, out)  # the committed profile; one job type is profiled again on a reduced grid
    before = pd.read_csv(out / "profile.csv")
    cmd = [sys.executable, "-m", "dl2.cli", "testbed", "profile", f"--folder={cluster.folder}", "--models", MODEL,
           "--configurations", "1,1", "1,2", "--repeats", "2", "--seconds", "4", f"--out={out}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["measurements"] == len(before[before.model != MODEL]) + 4

    profile = pd.read_csv(out / "profile.csv")
    mine = profile[profile.model == MODEL]
    assert sorted(zip(mine.num_ps, mine.num_workers, mine.repeat)) == [(1, 1, 0), (1, 1, 1), (1, 2, 0), (1, 2, 1)]
    assert (mine.steps_per_second > 0).all() and (mine.seconds >= 4).all()
    cpu = np.array([json.loads(v) for v in mine.worker_cpu], dtype=object)
    assert all(0 < c <= os.cpu_count() for cores in cpu for c in cores), "each worker's CPU use, in cores"
    assert (mine.startup_seconds > 0).all(), "each configuration's start-up, pods created to training"
    others = profile[profile.model != MODEL].reset_index(drop=True)
    kept = before[before.model != MODEL].reset_index(drop=True)  # kept as they were, start-up included
    pd.testing.assert_frame_equal(others[kept.columns], kept)

    table = read_measurements(out / "speed.txt")[MODEL]
    means = mine.groupby(["num_ps", "num_workers"]).steps_per_second.mean()
    assert [tuple(r) for r in table[:, :2]] == [(1.0, 1.0), (1.0, 2.0)]
    np.testing.assert_allclose(table[:, 2], [means[1, 1], means[1, 2]], rtol=1e-3)  # the table: the mean over repeats

    # the simulator loads the table: a job of MODEL alone trains its (1 PS, 1 worker) speed in epochs per slot
    trace = tmp_path / "one.csv"
    trace.write_text(f"job_id,arrival_slot,model,num_epochs\n1,0,{MODEL},1000\n")
    sim = subprocess.run([sys.executable, "-m", "dl2.cli", "simulate", f"--trace={trace}", "--policy=fifo", "--preset=testbed",
                          f"--jobs-out={tmp_path / 'jobs.csv'}"], capture_output=True, text=True,
                         env={**os.environ, "DL2_TESTBED_DATA": str(out)}, timeout=300)
    assert sim.returncode == 0, sim.stderr
    facts = json.loads((out / "testbed.json").read_text())
    assert facts["profiled"][MODEL]["configurations"] == [[1, 1], [1, 2]] and facts["profiled"][MODEL]["repeats"] == 2
    print(f"\n{MODEL}: {mine[['num_ps', 'num_workers', 'repeat', 'steps_per_second', 'worker_cpu']].to_dict(orient='records')}; "
          f"simulated alone: {pd.read_csv(tmp_path / 'jobs.csv').to_dict(orient='records')}")


def _params(tmp_path) -> dict:
    params = yaml.safe_load((repo_root() / "params.yaml").read_text())
    params["presets"]["testbed"].update(slot_seconds=12, num_jobs=4)  # few jobs: a few pods to start per slot
    params["learn"].update(preset="testbed", train_traces=2, validation_traces=1, window=10)
    params["finetune"].update(runs=["sl-rl"], seeds=[0], backend="kind", workers=1, algorithm="ppo", updates=2, num_envs=1,
                              rollout_length=4, batch_size=4, ppo_epochs=1, validate_every=1, checkpoint_every=1,
                              select_traces=1, lr=0.01)
    return params


def test_finetune_on_kind_updates_the_policy_logs_to_mlflow_and_a_killed_run_resumes(cluster, kube, tmp_path, mlflow_store):
    from dl2 import stages
    from dl2.learn import workflow
    from dl2.learn.pretrain import pretrain

    params_file, data = tmp_path / "params.yaml", tmp_path / "data"
    params_file.write_text(yaml.safe_dump(_params(tmp_path), sort_keys=False))
    config = stages.load_stage("finetune", params_file).config
    settings = config.learn
    sc = workflow.scenario(settings)
    train, validation = workflow.split_traces(settings, sc)
    pretrain_config = stages.load_stage("pretrain", params_file).config.pretrain
    threads = torch.get_num_threads()
    pretrained, _ = pretrain(train, validation, sc, workflow.network(settings), pretrain_config)
    torch.set_num_threads(threads)
    pretrained.save(data / "models" / "pretrained.pt")

    env = {**os.environ, "DL2_KIND_FOLDER": str(cluster.folder), "MLFLOW_TRACKING_URI": mlflow_store}
    cmd = [sys.executable, "-m", "dl2.cli", "stage", "finetune", f"--params={params_file}", f"--data-dir={data}"]
    checkpoint = data / "checkpoints" / "sl-rl-s0.ckpt"
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for("the first update's checkpoint", lambda: checkpoint.is_file() or first.poll() is not None, timeout=480, every=1)
        assert first.poll() is None, first.stderr.read().decode()[-3000:]
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the stage and its notebook's kernel, at once
        first.wait()

    killed = Trainer.load(checkpoint)  # the checkpoint reloads: it reconnects to the cluster
    assert killed.updates == 1 and len(killed.history) == 1
    assert any(not torch.equal(a, b) for a, b in zip(pretrained.net.parameters(), killed.policy.net.parameters()))
    killed_slot = killed.envs[0].backend.slot

    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    history = pd.read_csv(data / "learn" / "finetune_history.csv")
    assert history["update"].tolist() == [1, 2], "the resumed run went on from its checkpoint's update"
    assert history.val_jct_greedy.notna().all()
    model = DL2Policy.load(data / "models" / "finetune" / "sl-rl-s0.pt")
    assert any(not torch.equal(a, b) for a, b in zip(pretrained.net.parameters(), model.net.parameters())), "the weights changed"

    client = MlflowClient(tracking.tracking_uri())
    runs = client.search_runs([tracking.experiment_id()], "tags.`dl2.stage` = 'finetune'", order_by=["attributes.start_time ASC"])
    assert len(runs) == 2 and runs[-1].info.status == "FINISHED"
    logged = client.get_metric_history(runs[-1].info.run_id, "sl-rl-s0.val_jct_greedy")
    assert [m.step for m in logged] == [2], "the resumed run logs the updates it trained"
    assert runs[-1].data.params["finetune.backend"] == "kind"
    assert wait_for("the run's pods gone", lambda: not kube.list(Pod, "dl2-sl-rl", labels={JOB_LABEL: None}), timeout=120)
    print(f"\nkilled after update {killed.updates} (cluster at slot {killed_slot}); resumed and finished: "
          f"{history[['update', 'decisions', 'val_jct_greedy', 'select_jct', 'seconds']].to_dict(orient='records')}")
