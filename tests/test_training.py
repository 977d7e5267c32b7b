"""The testbed's real trainer (`python -m dl2.testbed.training`): stand-in models, sharding, checkpoints, and jobs
of PS and worker subprocesses that train, resize, survive SIGTERM and SIGKILL, and report progress."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from dl2.errors import Dl2Error
from dl2.testbed.training import checkpoint, read_progress
from dl2.testbed.training.checkpoint import Checkpoint, claim_ownership, load_checkpoint, owner_generation, params_digest, release_ownership
from dl2.testbed.training.job import JobConfig
from dl2.testbed.training.main import main
from dl2.testbed.training.models import STANDINS
from dl2.testbed.training.ps import ParameterServer
from dl2.testbed.training.shards import make_shards, partition
from dl2.workload.catalog import load_catalog

REPO = Path(__file__).resolve().parents[1]
# how long a job's processes may take: on 2 cores beside the cold Go build, importing torch alone took over a minute
PATIENCE_S = 240
CHECKPOINT_LINE = re.compile(r"\] checkpoint: step (\d+) \([\d.]+ of [\d.]+ epochs\), loss ([\d.]+)")


class Job:
    """The processes of one configuration of a job, started as local subprocesses, each logging to a file."""

    def __init__(self, folder: Path, model: str, num_ps: int, num_workers: int, epochs: float, generation: int,
                 mode: str = "sync", every: int = 0, job: str = "job", extra: tuple[str, ...] = ()):
        self.state, self.logs, self.procs = folder / "state", folder / "logs", []
        self.logs.mkdir(parents=True, exist_ok=True)
        common = ["--job", job, "--model", model, "--num-ps", str(num_ps), "--num-workers", str(num_workers), "--state", str(self.state),
                  "--epochs", str(epochs), "--mode", mode, "--generation", str(generation), "--checkpoint-every", str(every),
                  "--checkpoint-seconds", "0", "--timeout", "180", "--stop-timeout", "15", *extra]
        for role, count in (("ps", num_ps), ("worker", num_workers)):
            for i in range(count):
                log = self.logs / f"g{generation}-{role}{i}.log"
                with open(log, "w") as out:
                    proc = subprocess.Popen([sys.executable, "-m", "dl2.testbed.training", "--role", role, "--index", str(i), *common],
                                            cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
                self.procs.append((f"{role} {i}", proc, log))

    def text(self, name: str) -> str:
        return next(log for n, _, log in self.procs if n == name).read_text()

    def dump(self) -> str:
        return "\n".join(f"--- {name} (exit {proc.poll()})\n{log.read_text()}" for name, proc, log in self.procs)

    def wait(self, timeout: float) -> dict[str, int]:
        """Exit code of every process; all are killed (and the test fails) if they take longer than `timeout` s."""
        deadline = time.monotonic() + timeout
        for _, proc, _ in self.procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"processes still running after {timeout} s\n{self.dump()}")
        return {name: proc.returncode for name, proc, _ in self.procs}

    def signal(self, sig: int, name: str | None = None) -> None:
        for n, proc, _ in self.procs:
            if name in (None, n) and proc.poll() is None:
                proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        for _, proc, _ in self.procs:
            proc.wait()

    def wait_for_steps(self, steps: int, timeout: float) -> dict:
        """The progress record once it shows at least `steps` acknowledged steps."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            progress = read_progress(self.state)
            if progress and progress["steps"] >= steps:
                return progress
            if any(proc.poll() is not None for _, proc, _ in self.procs):
                break
            time.sleep(0.05)
        self.kill()
        pytest.fail(f"no progress to step {steps} within {timeout} s\n{self.dump()}")

    def checkpoint_losses(self) -> list[tuple[int, float]]:
        """(step, loss) of every checkpoint PS 0 logged."""
        return [(int(s), float(v)) for s, v in CHECKPOINT_LINE.findall(self.text("ps 0"))]


def resumed_steps(job: Job) -> set[tuple[int, str]]:
    """(step, parameter digest) each worker logged when it pulled the parameters at the start."""
    found = set()
    for name, _, log in job.procs:
        if name.startswith("worker"):
            pulled = re.findall(r"train: from step (\d+), pulled the parameters \(sha256 (\w+)\)", log.read_text())
            found.update((int(s), d) for s, d in pulled)
    return found


def test_stand_ins_cover_the_catalog_and_learn_in_process():
    assert tuple(STANDINS) == load_catalog().names
    for name, s in STANDINS.items():
        model, task = s.model(3), s.make_task(3)
        assert len(model.state_dict()) == len(list(model.parameters())), f"{name}: buffers outside the parameters"
        assert params_digest(dict(model.named_parameters())) == params_digest(dict(s.model(3).named_parameters()))
        opt, gen, losses = s.make_optimizer(list(model.parameters())), torch.Generator().manual_seed(0), []
        torch.set_num_threads(1)
        for _ in range(30):
            loss = task.loss(model, task.batch(gen, s.batch_size))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert sum(losses[-8:]) < 0.9 * sum(losses[:8]), f"{name}: {losses}"


def test_partition_is_deterministic_balanced_and_complete():
    sizes = [5, 100, 3, 100, 40, 7, 60]
    for parts in (1, 2, 3, 9):
        shards = partition(sizes, parts)
        assert shards == partition(sizes, parts)
        assert sorted(i for s in shards for i in s) == list(range(len(sizes)))
        loads = [sum(sizes[i] for i in s) for s in shards]
        assert max(loads) - min(loads) <= max(sizes)
    model = STANDINS["resnet-50"].model(0)
    names = [n for s in make_shards(model, 3) for n in s.names]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())


def test_a_checkpoint_reshards_to_any_number_of_ps(tmp_path):
    s = STANDINS["seq2seq"]  # Adam: per-tensor state with a step count
    model, task = s.model(0), s.make_task(0)
    opt = s.make_optimizer(list(model.parameters()))
    for _ in range(3):
        opt.zero_grad()
        task.loss(model, task.batch(torch.Generator().manual_seed(1), 8)).backward()
        opt.step()
    named = dict(model.named_parameters())
    params = {n: p.detach().clone() for n, p in named.items()}
    optimizer = {n: {k: v.clone() for k, v in opt.state[p].items()} for n, p in named.items()}
    Checkpoint("job", "seq2seq", params, optimizer, steps=6, updates=3, loss=1.5, generation=4).save(tmp_path)
    ckpt = load_checkpoint(tmp_path, "job", "seq2seq")
    assert (ckpt.steps, ckpt.updates, ckpt.loss, ckpt.generation) == (6, 3, 1.5, 4)
    for num_ps in (1, 2, 3):
        merged_params, merged_opt = {}, {}
        for index in range(num_ps):
            job = JobConfig("job", "seq2seq", "ps", index, num_ps, 1, tmp_path, 1.0, "sync", 5)
            ps = ParameterServer(job, threading.Event())
            ps.load(ckpt.params, ckpt.optimizer, ckpt.steps, ckpt.updates)
            state = ps.state()
            assert (state["steps"], state["updates"]) == (6, 3)
            assert not set(state["params"]) & set(merged_params)
            merged_params.update(state["params"])
            merged_opt.update(state["optimizer"])
        assert params_digest(merged_params) == params_digest(params)
        assert merged_opt.keys() == optimizer.keys()
        for n, st in optimizer.items():
            assert all(torch.equal(merged_opt[n][k], v) for k, v in st.items())
    with pytest.raises(Dl2Error, match="belongs to job 'job'"):
        load_checkpoint(tmp_path, "other", "seq2seq")


def test_a_new_owner_waits_for_the_previous_one_and_refuses_old_generations(tmp_path):
    stop = threading.Event()
    assert claim_ownership(tmp_path, 3, stop, 5, print)  # this test's process now holds the lock through one descriptor
    held = checkpoint._held.pop(tmp_path.resolve())  # which it forgets, as if another process held it
    started = time.monotonic()
    heard: list[str] = []
    with pytest.raises(TimeoutError, match="still owns"):
        claim_ownership(tmp_path, 4, stop, 0.3, heard.append)  # another descriptor: as another process would
    assert time.monotonic() - started >= 0.3 and heard == [f"waiting for generation 3 to let go of {tmp_path}"]
    stop.set()
    assert not claim_ownership(tmp_path, 4, stop, 5, print)
    os.close(held)
    (tmp_path / "reused").mkdir()
    (tmp_path / "reused" / "owner.json").write_text('{"generation": 3}')
    with pytest.raises(Dl2Error, match="generation 3 was already used or is stale"):
        claim_ownership(tmp_path / "reused", 3, threading.Event(), 5, print)


def test_an_owner_that_stays_ps_0_keeps_the_lock_and_one_that_does_not_lets_go(tmp_path):
    stop = threading.Event()
    assert claim_ownership(tmp_path, 3, stop, 5, print)
    assert claim_ownership(tmp_path, 4, stop, 0.1, print) and owner_generation(tmp_path) == 4  # its next configuration
    fd = os.open(tmp_path / "owner.lock", os.O_RDWR)
    with pytest.raises(BlockingIOError):  # still locked against any other descriptor
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    release_ownership(tmp_path)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)


def test_bad_flags_say_what_to_fix(tmp_path, capsys):
    base = ["--job", "j", "--role", "ps", "--index", "0", "--num-ps", "1", "--num-workers", "1", "--state", str(tmp_path),
            "--epochs", "1", "--generation", "0"]
    assert main([*base, "--model", "resnet"]) == 2
    assert "unknown model 'resnet' (known: resnet-50, vgg-16" in capsys.readouterr().out
    base[5] = "3"
    assert main([*base, "--model", "wlm"]) == 2
    assert "--index 3 is out of range for 1 ps process(es)" in capsys.readouterr().out
    assert read_progress(tmp_path) is None


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_job_trains_to_its_epochs(tmp_path, mode):
    started = time.monotonic()
    job = Job(tmp_path, "cnn-text-classification", 1, 2, epochs=5, generation=0, mode=mode, every=50,
              extra=("--log-seconds", str(LOG_SECONDS)))
    codes = job.wait(timeout=PATIENCE_S)
    elapsed = time.monotonic() - started
    assert set(codes.values()) == {0}, job.dump()
    progress = read_progress(job.state)
    assert progress["done"] and progress["steps"] >= 250 and progress["epochs"] >= 5, progress
    assert (progress["num_ps"], progress["num_workers"], progress["mode"]) == (1, 2, mode)
    assert progress["updates"] == (progress["steps"] // 2 if mode == "sync" else progress["steps"])
    assert progress["loss"] < 0.8 * progress["first_loss"], progress
    for name, _, _ in job.procs:
        assert "acknowledged, stopping" in job.text(name) or f"written to {job.state / 'checkpoint.pt'}, done" in job.text(name), job.dump()
    assert_logs_progress(job, progress["steps"], elapsed)


LOG_SECONDS = 0.02  # shorter than 50 steps take on any machine these tests run on (~0.15 s here, alone)
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \[job g0 (ps|worker) \d/\d\] (start|wait|train|progress|checkpoint|exit): .+$")


def assert_logs_progress(job: Job, steps: int, elapsed: float) -> None:
    """What `kubectl logs` of each pod would show: lines of the one format, from `start` to `exit`, PS 0's progress
    (at most one line per LOG_SECONDS of the job's `elapsed` seconds) and checkpoints with step, loss and speed;
    the workers log no line per step."""
    for name, _, _ in job.procs:
        lines = job.text(name).splitlines()
        assert all(LOG_LINE.match(line) for line in lines), job.text(name)
        assert " start: model cnn-text-classification, 1 PS and 2 workers" in lines[0], lines[0]
        assert lines[-1].endswith(f"exit: code 0, done at step {steps} (5 epochs)"), lines[-1]
        if name != "ps 0":
            assert len(lines) < steps / 5, f"{len(lines)} lines for {steps} steps: the log is not per step"
    ps0 = job.text("ps 0")
    assert "train: a new job, from step 0 (0.000 of 5 epochs)" in ps0
    progress = re.findall(r"progress: step (\d+) \([\d.]+ of 5 epochs\), loss ([\d.]+), ([\d.]+) steps/s$", ps0, re.M)
    assert progress and all(int(s) > 0 and float(loss) > 0 and float(rate) > 0 for s, loss, rate in progress), ps0
    assert len(progress) <= elapsed / LOG_SECONDS + 1, f"{len(progress)} progress lines in {elapsed:.2f} s"
    assert len(job.checkpoint_losses()) == steps // 50, ps0


@pytest.mark.slow
def test_a_resize_keeps_parameters_optimizer_state_and_step_count(tmp_path):
    model, every = "cnn-text-classification", 20
    small = Job(tmp_path, model, 1, 1, epochs=100, generation=1, every=every)
    small.wait_for_steps(100, timeout=PATIENCE_S)
    # as on Kubernetes, the next configuration starts before the old one has stopped: it waits for its checkpoint
    big = Job(tmp_path, model, 2, 3, epochs=100, generation=2, every=every)
    deadline = time.monotonic() + 60
    while "waiting for generation 1 to let go" not in big.text("ps 0") and time.monotonic() < deadline:
        time.sleep(0.05)
    small.signal(signal.SIGTERM)
    assert set(small.wait(timeout=30).values()) == {0}, small.dump()
    before = load_checkpoint(small.state, "job", model)
    assert not before.done and before.steps >= 100 and before.generation == 1, small.dump()

    big.wait_for_steps(before.steps + 90, timeout=PATIENCE_S)
    big.signal(signal.SIGTERM)
    assert set(big.wait(timeout=30).values()) == {0}, big.dump()
    assert "waiting for generation 1 to let go" in big.text("ps 0")
    assert resumed_steps(big) == {(before.steps, params_digest(before.params))}, big.dump()
    assert f"train: resumed from step {before.steps} " in big.text("ps 0")
    after = load_checkpoint(big.state, "job", model)
    assert (after.num_ps, after.num_workers, after.generation) == (2, 3, 2)
    assert after.updates == before.updates + (after.steps - before.steps) // 3
    assert after.first_loss == before.first_loss

    last_before = sum(loss for _, loss in small.checkpoint_losses()[-2:]) / 2
    first_after = big.checkpoint_losses()[0][1]
    assert first_after < 0.6 * before.first_loss  # not a fresh start
    assert abs(first_after - last_before) < 0.3 * last_before + 0.05, (small.checkpoint_losses(), big.checkpoint_losses())


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["ps 0", "worker 1"])
def test_sigkill_loses_no_acknowledged_step(tmp_path, victim):
    model = "dssm"
    job = Job(tmp_path, model, 1, 2, epochs=3, generation=0, every=10)
    acknowledged = job.wait_for_steps(100, timeout=PATIENCE_S)["steps"]
    job.signal(signal.SIGKILL, victim)
    codes = job.wait(timeout=30)
    assert codes[victim] == -signal.SIGKILL
    assert all(code == 1 for name, code in codes.items() if name != victim), job.dump()
    saved = load_checkpoint(job.state, "job", model)
    assert not saved.done and saved.steps >= acknowledged

    again = Job(tmp_path, model, 1, 2, epochs=3, generation=1, every=10)
    assert set(again.wait(timeout=PATIENCE_S).values()) == {0}, again.dump()
    assert resumed_steps(again) == {(saved.steps, params_digest(saved.params))}
    progress = read_progress(again.state)
    assert progress["done"] and progress["steps"] >= 300 and progress["generation"] == 1


def _catches_sigterm(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def test_sigterm_while_torch_imports_stops_the_process_at_once(tmp_path):
    """A container's process is PID 1, which ignores a signal it has no handler for: the handler must be in
    place before the slow imports, or a pod deleted while it starts runs on until its grace period's SIGKILL."""
    job = Job(tmp_path, "wlm", 1, 1, epochs=1, generation=0)
    for _, proc, _ in job.procs:
        deadline = time.monotonic() + 30
        while not _catches_sigterm(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, job.dump()
            time.sleep(0.005)
        assert "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text(), "SIGTERM is caught before torch loads"
        proc.send_signal(signal.SIGTERM)
    assert job.wait(timeout=PATIENCE_S) == {"ps 0": 0, "worker 0": 0}, job.dump()
    assert all("exit: code 0, stopped (SIGTERM) before the rendezvous completed" in job.text(n) for n in ("ps 0", "worker 0")), job.dump()


def test_processes_of_a_stale_generation_refuse_to_start(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "owner.json").write_text('{"generation": 8}')
    job = Job(tmp_path, "wlm", 1, 1, epochs=1, generation=7)
    assert job.wait(timeout=PATIENCE_S) == {"ps 0": 2, "worker 0": 2}, job.dump()
    assert all("error: generation 7 is stale: generation 8 of this job has started since" in job.text(n) for n in ("ps 0", "worker 0"))


@pytest.mark.slow
def test_every_model_trains_a_few_steps_as_a_job(tmp_path):
    names = list(STANDINS)
    for pair in (names[i:i + 2] for i in range(0, len(names), 2)):
        jobs = [Job(tmp_path / name, name, 1, 1, epochs=24 / STANDINS[name].steps_per_epoch, generation=0, every=8, job=name)
                for name in pair]
        for job in jobs:
            assert set(job.wait(timeout=PATIENCE_S).values()) == {0}, job.dump()
            progress = read_progress(job.state)
            assert progress["done"] and progress["steps"] == 24 and len(job.checkpoint_losses()) == 3, progress
