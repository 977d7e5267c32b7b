"""Elastic resizes of a trained job: the controller keeps the pods whose (role, node) survive and writes the job's
plan; the training processes that survive a resize join the new configuration without restarting."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dl2.backends.workloads import Trained
from dl2.errors import Dl2Error
from dl2.kube.jobs import JobSpec
from dl2.kube.resources import GENERATION_LABEL, JOB_LABEL, ROLE_LABEL, PodRuntime
from dl2.sim_to_real.profile import training_processes
from dl2.sim_to_real.reconfigure import members
from dl2.testbed.training import read_progress
from dl2.testbed.training.checkpoint import load_checkpoint
from dl2.testbed.training.main import main
from dl2.testbed.training.plan import Plan, PlanWatch, read_plan, write_plan

REPO = Path(__file__).resolve().parents[1]
PATIENCE_S = 240  # importing torch on 2 busy cores can take a minute
JOB = {"metadata": {"name": "job-00001", "namespace": "ns", "uid": "0123456789abcdef"}, "status": {"jobId": 1}}
SPEC = JobSpec(model=0, epochs=2.0, worker_demand=(2, 4), ps_demand=(3, 0), max_workers=3, max_ps=2, arrival_slot=0, job_id=1)


def _workload(tmp_path: Path) -> Trained:
    return Trained("ns", ("resnet-50",), PodRuntime("image", "python", [], [], "/shared", tmp_path), slot_seconds=20.0, fine_grained=True)


def _running(desired: dict, phase: str = "Running") -> list[dict]:
    """The pods `desired` made, as the API server would list them once bound and running."""
    pods = []
    for manifest, node in desired.values():
        pod = {**manifest, "spec": {**manifest["spec"], "nodeName": node}, "status": {"phase": phase}}
        pods.append(pod)
    return pods


def _args(pod: dict) -> list[str]:
    return pod["spec"]["containers"][0]["args"]


def test_the_controller_keeps_surviving_pods_adds_the_rest_and_plans_their_roles(tmp_path):
    w = _workload(tmp_path)
    folder = w.state_folder(JOB)
    first = w.pods(JOB, SPEC, [("ps", "a"), ("worker", "b")], 3, [])
    assert sorted(first) == ["job-00001-ps-3-0", "job-00001-worker-3-0"]
    assert all("--member" in _args(m) and "--role" not in _args(m) and "--generation" not in _args(m) for m, _ in first.values())
    assert all(m["metadata"]["labels"][GENERATION_LABEL] == "3" for m, _ in first.values())
    assert read_plan(folder) == Plan(3, 1, 1, {"job-00001-ps-3-0": ("ps", 0), "job-00001-worker-3-0": ("worker", 0)})
    assert [oct(f.stat().st_mode & 0o7777) for f in (folder, folder.parent)] == ["0o1777"] * 2, "the pods' user writes there"
    pods = _running(first)
    assert w.pods(JOB, SPEC, [("worker", "b"), ("ps", "a")], 4, pods) == {p["metadata"]["name"]: (p, p["spec"]["nodeName"]) for p in pods}
    assert read_plan(folder).generation == 3, "an unchanged configuration is not planned again"

    grown = w.pods(JOB, SPEC, [("ps", "a"), ("worker", "b"), ("worker", "a")], 5, pods)
    assert grown["job-00001-ps-3-0"][0] is pods[0] and grown["job-00001-worker-3-0"][0] is pods[1], "survivors kept as they are"
    assert sorted(grown) == ["job-00001-ps-3-0", "job-00001-worker-3-0", "job-00001-worker-5-0"]
    assert grown["job-00001-worker-5-0"][1] == "a"
    assert read_plan(folder) == Plan(5, 1, 2, {"job-00001-ps-3-0": ("ps", 0), "job-00001-worker-3-0": ("worker", 0),
                                               "job-00001-worker-5-0": ("worker", 1)})

    pods = pods + _running({"job-00001-worker-5-0": grown["job-00001-worker-5-0"]})
    shrunk = w.pods(JOB, SPEC, [("ps", "a"), ("worker", "a")], 6, pods)
    assert sorted(shrunk) == ["job-00001-ps-3-0", "job-00001-worker-5-0"], "the worker on b goes (the backend deletes it)"
    assert read_plan(folder) == Plan(6, 1, 1, {"job-00001-ps-3-0": ("ps", 0), "job-00001-worker-5-0": ("worker", 0)})

    # a survivor keeps its role: the worker on a cannot become the PS there; a second PS on b is added
    pods = [p for p in pods if p["metadata"]["name"] in shrunk]
    moved = w.pods(JOB, SPEC, [("ps", "a"), ("ps", "b"), ("worker", "a")], 7, pods)
    assert sorted(moved) == ["job-00001-ps-3-0", "job-00001-ps-7-0", "job-00001-worker-5-0"]
    assert read_plan(folder).members["job-00001-ps-3-0"] == ("ps", 0), "PS 0 stays PS 0 (it keeps the folder's lock)"


def test_a_failed_pod_makes_a_whole_new_configuration_and_a_done_job_none(tmp_path):
    w = _workload(tmp_path)
    first = w.pods(JOB, SPEC, [("ps", "a"), ("worker", "b")], 1, [])
    pods = _running(first)
    pods[1]["status"]["phase"] = "Failed"
    again = w.pods(JOB, SPEC, [("ps", "a"), ("worker", "b")], 2, pods)
    assert sorted(again) == ["job-00001-ps-2-0", "job-00001-worker-2-0"]
    assert set(read_plan(w.state_folder(JOB)).members) == set(again)
    assert w.pods(JOB, SPEC, [("ps", "a")], 3, []) == {}, "no worker: no pods"


def test_pods_of_a_planned_configuration_start_until_it_acknowledges_a_step(tmp_path):
    from dl2.testbed.training.progress import write_progress

    w = _workload(tmp_path)
    pods = _running(w.pods(JOB, SPEC, [("ps", "a"), ("worker", "b")], 1, []))
    for p in pods:
        p["metadata"]["labels"][JOB_LABEL] = "job-00001"
    write_progress(w.state_folder(JOB), {"generation": 1, "steps": 5, "done": False})
    assert w.starting([JOB], pods) == []
    w.pods(JOB, SPEC, [("ps", "a"), ("worker", "b"), ("worker", "c")], 2, pods)
    assert w.starting([JOB], pods) == pods, "survivors rejoin: they start too until generation 2 acknowledges a step"


def test_the_fixed_workload_still_restarts_whole_configurations(tmp_path):
    w = _workload(tmp_path)
    w.elastic = False
    first = w.pods(JOB, SPEC, [("ps", "a"), ("worker", "b")], 3, [])
    assert sorted(first) == ["job-00001-g3-ps-0", "job-00001-g3-worker-0"]
    assert all(_args(m)[_args(m).index("--generation") + 1] == "3" for m, _ in first.values())
    assert read_plan(w.state_folder(JOB)) is None
    assert all(m["metadata"]["labels"][ROLE_LABEL] in ("ps", "worker") for m, _ in first.values())


def test_a_plan_names_each_role_index_once_and_a_watch_sees_newer_plans(tmp_path):
    with pytest.raises(Dl2Error, match="PS 0..P-1 and workers 0..W-1 once each"):
        Plan(1, 1, 2, {"a": ("ps", 0), "b": ("worker", 0), "c": ("worker", 0)})
    watch = PlanWatch(tmp_path, 4)
    assert not watch.moved()
    write_plan(tmp_path, Plan(4, 1, 1, {"a": ("ps", 0), "b": ("worker", 0)}))
    assert not watch.moved()
    write_plan(tmp_path, Plan(5, 1, 1, {"a": ("ps", 0), "b": ("worker", 0)}))
    assert watch.moved() and watch.moved()
    (tmp_path / "plan.json").write_text("{}")
    with pytest.raises(Dl2Error, match="plan.json: not a plan"):
        read_plan(tmp_path)


def test_the_local_measurement_keeps_members_by_role_and_adds_new_ones():
    before = members(1, 1, 2, {})
    assert before == {"ps-1-0": ("ps", 0), "worker-1-0": ("worker", 0), "worker-1-1": ("worker", 1)}
    assert members(2, 1, 1, before) == {"ps-1-0": ("ps", 0), "worker-1-0": ("worker", 0)}
    assert members(2, 2, 3, before) == {"ps-1-0": ("ps", 0), "ps-2-0": ("ps", 1), "worker-1-0": ("worker", 0),
                                        "worker-1-1": ("worker", 1), "worker-2-0": ("worker", 2)}


def test_member_flags_say_what_to_fix(tmp_path, capsys):
    base = ["--job", "j", "--model", "wlm", "--state", str(tmp_path), "--epochs", "1"]
    assert main([*base, "--member", "x", "--role", "ps"]) == 2
    assert "--member takes the configuration from the plan: leave out --role" in capsys.readouterr().out
    assert main([*base, "--member", "x"]) == 2
    assert f"--member x: not a member of the plan in {tmp_path / 'plan.json'}" in capsys.readouterr().out
    assert main([*base, "--role", "ps"]) == 2
    assert "give --index, --num-ps, --num-workers, --generation (a fixed configuration), or --member" in capsys.readouterr().out


class Members:
    """An elastic job's member processes, started locally as the controller's pods would be."""

    def __init__(self, folder: Path, model: str, epochs: float, every: int = 20, timeout: float = 180):
        self.state, self.logs, self.procs = folder / "state", folder / "logs", {}
        self.logs.mkdir(parents=True, exist_ok=True)
        self.common = ["--job", "job", "--model", model, "--state", str(self.state), "--epochs", str(epochs), "--checkpoint-every",
                       str(every), "--checkpoint-seconds", "0", "--log-seconds", "0", "--timeout", str(timeout), "--stop-timeout", "15"]

    def plan(self, generation: int, members: dict[str, tuple[str, int]]) -> None:
        count = {r: sum(role == r for role, _ in members.values()) for r in ("ps", "worker")}
        write_plan(self.state, Plan(generation, count["ps"], count["worker"], members))

    def start(self, *names: str) -> None:
        for name in names:
            with open(self.logs / f"{name}.log", "w") as out:
                self.procs[name] = subprocess.Popen([sys.executable, "-m", "dl2.testbed.training", "--member", name, *self.common],
                                                    cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    def text(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text()

    def dump(self) -> str:
        return "\n".join(f"--- {n} (exit {p.poll()})\n{self.text(n)}" for n, p in self.procs.items())

    def until(self, ready, timeout: float = PATIENCE_S) -> dict:
        """The progress record once `ready(record)`; the test fails (all killed) if it takes longer or a process dies."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = read_progress(self.state)
            if record is not None and ready(record):
                return record
            time.sleep(0.05)
        self.kill()
        pytest.fail(f"no such progress within {timeout} s\n{self.dump()}")

    def logged(self, line: str, *names: str, timeout: float = PATIENCE_S) -> None:
        """Return once each of `names` has logged `line`; the test fails (all killed) if that takes longer."""
        deadline = time.monotonic() + timeout
        while not all(line in self.text(n) for n in names):
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"{names} did not log {line!r} within {timeout} s\n{self.dump()}")
            time.sleep(0.05)

    def wait(self, name: str, timeout: float = 60) -> int:
        try:
            return self.procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{name} still running after {timeout} s\n{self.dump()}")

    def kill(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.slow
def test_survivors_of_a_grow_and_a_shrink_keep_running_and_the_job_finishes(tmp_path):
    job = Members(tmp_path, "cnn-text-classification", epochs=100_000)
    job.plan(1, {"ps": ("ps", 0), "w1": ("worker", 0)})
    job.start("ps", "w1")
    pids = {n: p.pid for n, p in job.procs.items()}
    first = job.until(lambda r: r["generation"] == 1 and r["steps"] >= 40)

    job.plan(2, {"ps": ("ps", 0), "w1": ("worker", 0), "w2": ("worker", 1)})  # grow: only w2 starts
    job.start("w2")
    grown = job.until(lambda r: r["generation"] == 2 and r["steps"] > r["start_step"])
    assert (grown["num_ps"], grown["num_workers"]) == (1, 2) and grown["start_step"] >= first["steps"]
    assert all(job.procs[n].poll() is None and job.procs[n].pid == pids[n] for n in pids), job.dump()
    assert "rejoin: 1 PS and 2 workers, generation 2" in job.text("ps") and "rejoin: 1 PS and 2 workers" in job.text("w1")

    job.plan(3, {"ps": ("ps", 0), "w2": ("worker", 0)})  # shrink: w1 is no longer a member
    assert job.wait("w1") == 0, job.dump()
    assert "exit: code 0, stopped at step" in job.text("w1") and "not a member of generation 3" in job.text("w1")
    shrunk = job.until(lambda r: r["generation"] == 3 and r["steps"] > r["start_step"])
    assert (shrunk["num_ps"], shrunk["num_workers"]) == (1, 1) and shrunk["start_step"] >= grown["steps"]
    assert job.procs["ps"].poll() is None and job.procs["w2"].poll() is None, job.dump()
    plan = read_plan(job.state)
    assert training_processes(str(job.state), "worker", 0, plan) == [job.procs["w2"].pid]  # w2 was worker 1 when it started
    assert training_processes(str(job.state), "ps", 0, plan) == [pids["ps"]]

    # the chain: every configuration resumed where the one before checkpointed last, with the parameters it saved
    for name in ("w1", "w2"):
        starts = [int(s) for s in re.findall(r"train: from step (\d+), pulled", job.text(name))]
        assert starts == sorted(starts), job.dump()
    ps_steps = [int(s) for s in re.findall(r"\] checkpoint: step (\d+) ", job.text("ps"))]
    assert ps_steps == sorted(ps_steps) and len(set(ps_steps)) == len(ps_steps), job.dump()
    resumed = [int(s) for s in re.findall(r"train: resumed from step (\d+)", job.text("ps"))]
    assert resumed == [grown["start_step"], shrunk["start_step"]] and set(resumed) <= set(ps_steps), job.dump()

    # SIGTERM still checkpoints and stops every survivor, which exits 0 (as a deleted pod does)
    for name in ("ps", "w2"):
        job.procs[name].send_signal(signal.SIGTERM)
    assert job.wait("ps") == 0 and job.wait("w2") == 0, job.dump()
    saved = load_checkpoint(job.state, "job", "cnn-text-classification")
    assert (saved.generation, saved.num_ps, saved.num_workers) == (3, 1, 1) and not saved.done

    # a last configuration of new members resumes from it and finishes the job at its epochs
    done = Members(tmp_path, "cnn-text-classification", epochs=(saved.steps + 50) / 50)  # 50 steps an epoch: one more
    done.plan(4, {"ps-4": ("ps", 0), "w-4": ("worker", 0)})
    done.start("ps-4", "w-4")
    assert done.wait("ps-4", PATIENCE_S) == 0 and done.wait("w-4", 30) == 0, done.dump()
    final = read_progress(job.state)
    assert final["done"] and final["generation"] == 4 and final["steps"] == saved.steps + 50 and final["start_step"] == saved.steps


def _agree_all(path: Path, world: int, arriving: list[int], moved, timeout: float = 30.0) -> list[str]:
    """Each rank of `arriving` runs the agreement in its own thread, with its own FileStore on `path`."""
    from concurrent.futures import ThreadPoolExecutor

    import torch.distributed as dist

    from dl2.testbed.training.comm import agree

    def one(rank: int) -> str:
        return agree(dist.FileStore(str(path), world), rank, world, lambda: moved(rank), timeout, poll=0.01)

    with ThreadPoolExecutor(len(arriving)) as pool:
        return list(pool.map(one, arriving))


def test_an_elastic_world_forms_when_all_arrive_and_not_when_the_plan_moves_first(tmp_path):
    from dl2.testbed.training.comm import GO, MOVED, TIMED_OUT

    assert _agree_all(tmp_path / "all", 3, [0, 1, 2], lambda rank: False) == [GO] * 3
    assert _agree_all(tmp_path / "moved", 3, [0, 1], lambda rank: rank == 1) == [MOVED] * 2, "rank 2 never came"
    assert _agree_all(tmp_path / "moved", 3, [2], lambda rank: False) == [MOVED], "a late rank takes the decision made"
    assert _agree_all(tmp_path / "late", 2, [0], lambda rank: False, timeout=0.1) == [TIMED_OUT]
    for k in range(20):  # all arrive while one sees the plan move: whichever proposal is first, all take it
        decisions = _agree_all(tmp_path / f"race{k}", 4, [0, 1, 2, 3], lambda rank, k=k: rank == k % 4)
        assert len(set(decisions)) == 1 and decisions[0] in (GO, MOVED), decisions


def test_a_rank_polling_a_store_that_a_newer_generation_removed_takes_it_as_moved(tmp_path):
    import threading

    import torch.distributed as dist

    from dl2.testbed.training.comm import MOVED, agree

    path, removed = tmp_path / "g2-p1-w2", threading.Event()
    store = dist.FileStore(str(path), 3)

    def remove_later() -> None:  # as the next generation's PS 0 does, once the plan has moved on
        time.sleep(0.2)
        path.unlink()
        removed.set()

    threading.Thread(target=remove_later).start()
    started = time.monotonic()
    assert agree(store, 1, 3, removed.is_set, timeout=60, poll=0.01, io_timeout=0.5) == MOVED
    assert time.monotonic() - started < 10, "the rank waited out the store's timeout"
    assert store.timeout.total_seconds() == 300, "the store's own timeout is restored"


@pytest.mark.slow
def test_survivors_skip_a_configuration_whose_added_member_never_came(tmp_path):
    job = Members(tmp_path, "cnn-text-classification", epochs=100_000, timeout=60)
    job.plan(1, {"ps": ("ps", 0), "w1": ("worker", 0)})
    job.start("ps", "w1")
    job.until(lambda r: r["generation"] == 1 and r["steps"] >= 20)

    job.plan(2, {"ps": ("ps", 0), "w1": ("worker", 0), "ghost": ("worker", 1)})  # ghost's process does not start (yet)
    job.logged("rejoin: 1 PS and 2 workers, generation 2", "ps", "w1")
    time.sleep(1.0)  # both wait for ghost in generation 2's rendezvous
    job.plan(3, {"ps": ("ps", 0), "w3": ("worker", 0)})  # the plan moves on: w1 and ghost are not members
    job.start("w3", "ghost")
    assert job.wait("w1") == 0, job.dump()
    assert "abandon: the plan moved past generation 2" in job.text("w1")
    assert "not a member of generation 3" in job.text("w1").splitlines()[-1], job.dump()
    assert job.wait("ghost", PATIENCE_S) == 0 and "not a member of generation 3" in job.text("ghost"), job.dump()
    third = job.until(lambda r: r["generation"] == 3 and r["steps"] > r["start_step"])
    assert (third["num_ps"], third["num_workers"]) == (1, 1)
    assert "rejoin: 1 PS and 1 workers, generation 3, skipping generation 2" in job.text("ps"), job.dump()
    for name in ("ps", "w3"):
        job.procs[name].send_signal(signal.SIGTERM)
    assert job.wait("ps") == 0 and job.wait("w3") == 0, job.dump()
    assert not any("failed" in job.text(n) for n in job.procs), job.dump()


def test_a_member_that_comes_after_the_plan_moved_on_follows_it(tmp_path, capsys):
    import threading

    from dl2.testbed.training.checkpoint import claim_ownership, release_ownership
    from dl2.testbed.training.main import parse, train

    base = ["--job", "j", "--model", "wlm", "--state", str(tmp_path), "--epochs", "1", "--timeout", "30"]
    write_plan(tmp_path, Plan(2, 1, 2, {"ps": ("ps", 0), "w1": ("worker", 0), "late": ("worker", 1)}))
    job, _ = parse([*base, "--member", "late"])
    write_plan(tmp_path, Plan(3, 1, 1, {"ps": ("ps", 0), "w3": ("worker", 0)}))
    gone = (0, "stopped before generation 2's world formed: not a member of generation 3")
    assert train(job, threading.Event(), threading.Event()) == gone, "in its rendezvous"
    assert "abandon: the plan moved past generation 2 before its 3 processes met" in capsys.readouterr().out
    assert claim_ownership(tmp_path, 3, threading.Event(), 5.0, print)
    try:
        assert train(job, threading.Event(), threading.Event()) == gone, "generation 3 owns the folder already"
        assert "abandon: the plan moved past generation 2 before this process joined it" in capsys.readouterr().out
    finally:
        release_ownership(tmp_path)
    assert main([*base, "--member", "late"]) == 0, "it started after the plan moved on"
    assert "exit: code 0, --member late: not a member of generation 3 of the plan" in capsys.readouterr().out
