"""The same numbers on any machine (issue 33): the speed tables, a simulation and a short training, each
computed in a fresh process as on a one-core machine with one BLAS and torch thread and as on a larger one
with four, equal bit for bit."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from dl2.workload.speed import LinearRbf, _measurements

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
    import hashlib, json, sys

    threads = int(sys.argv[1])
    import numpy as np
    import scipy.linalg  # the BLAS numba's np.dot calls (the compiled policy), so that the limit reaches it too
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    # OpenBLAS caps its variables at the machine's cores: reach `threads` on a smaller machine anyway
    threadpool_limits(threads, user_api="blas")
    torch.set_num_threads(threads)

    from dl2.learn.learners import make_trainer
    from dl2.learn.architecture import net_config
    from dl2.learn.pretrain import STAGE_THREADS, pretrain
    from dl2.learn.rollout import run_policy
    from dl2.learn.settings import PPOSettings, PretrainConfig
    from dl2.schedulers.builtin import simulate_builtin
    from dl2.sim.scenario import Scenario, SimOptions
    from dl2.workload.presets import get_preset
    from dl2.workload.traces import generate_trace

    digests = {"threads": {"blas": sorted({lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}),
                           "torch": torch.get_num_threads()}}

    def digest(name, *arrays):
        digests[name] = hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()

    for preset in ("paper", "dev", "paper-large", "testbed"):
        for model in ("measured", "analytical"):
            digest(f"table/{preset}/{model}", Scenario(get_preset(preset), SimOptions(speed_model=model)).table)

    dev = Scenario(get_preset("dev"), SimOptions(assign_bundle=True))
    traces = [generate_trace(dev.preset, dev.catalog, s) for s in np.random.SeedSequence(7).spawn(3)]
    digest("simulation/dev/optimus", simulate_builtin(traces[0], "optimus", dev).jct)

    torch.set_num_threads(STAGE_THREADS)  # as the pretrain stage
    net = net_config("per-job", window=10, hidden=None, one_hot=None, batch_norm=None)
    policy, _ = pretrain(traces[:2], traces[2:], dev, net, PretrainConfig(teacher="drf", epochs=1, batch_size=256, lr=0.005,
                                                                          seed=0, eval_every=1, label_smoothing=0.2))
    digest("pretrain/weights", *(p.detach().numpy() for p in policy.net.state_dict().values()))
    torch.set_num_threads(threads)
    rl = PPOSettings(updates=2, num_envs=2, lr=0.003, lr_schedule="linear", entropy=0.005, batch_size=64, critic="slot",
                     gamma=0.9, validate_every=2, checkpoint_every=2, select_traces=0, shaping="env", gae_lambda=0.95,
                     clip=0.2, ppo_epochs=2, rollout_length=32)
    trainer = make_trainer(policy, traces[:2], traces[2:], dev, rl, seed=0)
    history = trainer.train()
    digest("ppo/weights", *(p.detach().numpy() for p in trainer.policy.net.state_dict().values()))
    digest("ppo/validation", history.val_jct_greedy.to_numpy(float))
    digest("rollout", run_policy(trainer.policy, traces, dev, greedy=True).avg_jct,
           run_policy(trainer.policy, traces, dev, greedy=False, seed=1).avg_jct)
    print(json.dumps(digests))
"""


def _digests(threads: int, one_core: bool) -> dict:
    """The child's digests, run with `threads` BLAS, OpenMP and MKL threads (set before numpy and torch
    load), on the first CPU alone when `one_core`."""
    env = os.environ | {name: str(threads) for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    first_cpu = min(os.sched_getaffinity(0))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), str(threads)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=(lambda: os.sched_setaffinity(0, {first_cpu})) if one_core else None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tables_simulation_and_training_are_the_same_on_one_thread_and_on_four():
    small, large = _digests(1, one_core=True), _digests(4, one_core=False)
    assert small.pop("threads") == {"blas": [1], "torch": 1}
    assert large.pop("threads") == {"blas": [4], "torch": 4}
    assert small.keys() == large.keys() and len(small) == 13
    assert small == large, [name for name in small if small[name] != large[name]]


def test_the_speed_fit_gives_the_same_weights_under_any_blas_thread_count():
    rows = _measurements("dev_snapshot")["wlm"]  # 345 points: a system OpenBLAS splits by its thread count
    weights = []
    for threads in (1, 3, 4):
        with threadpool_limits(threads, user_api="blas"):
            weights.append(LinearRbf(rows[:, :2], rows[:, 2]).weights)
    assert all(np.array_equal(weights[0], w) for w in weights[1:])
