"""The entry point: parse the flags, run the role in a thread, turn SIGTERM into a checkpoint and a clean exit.

The role runs in a thread so that the main thread stays free to take signals while the role waits inside
gloo or the rendezvous (Python runs signal handlers only in the main thread, between bytecodes). On SIGTERM
(or SIGINT) the role checkpoints with the rest of the job and returns; a process still in its rendezvous
has nothing to save and exits at once; one whose peers do not finish the checkpoint within
`--stop-timeout` seconds exits anyway (its job resumes from the last checkpoint).

A fixed configuration comes from the flags (`--role`, `--index`, `--num-ps`, `--num-workers`, `--generation`);
an elastic job's process (`--member NAME`) takes its configuration from the job's plan
(`dl2.testbed.training.plan`) and, when the plan moves on, joins the new configuration without restarting,
or exits 0 if it is no longer a member; a configuration the plan moves past before its world forms (a member
that never came) is skipped by all its processes together, each following the plan.

Exit codes: 0 done, stopped, already done or no longer a member of the plan; 1 a peer was lost or a wait timed
out; 2 bad flags, a checkpoint that is not this job's, or a stale or reused generation.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import threading
import time
import traceback
from pathlib import Path

import torch

from dl2.errors import Dl2Error
from dl2.testbed.training import comm
from dl2.testbed.training.checkpoint import check_not_stale, claim_ownership, release_ownership
from dl2.testbed.training.job import JobConfig
from dl2.testbed.training.models import STANDINS, get_standin
from dl2.testbed.training.plan import PLAN, PlanWatch, read_plan
from dl2.testbed.training.ps import Coordinator, ParameterServer
from dl2.testbed.training.stopping import stop_on_signals
from dl2.testbed.training.threads import training_threads
from dl2.testbed.training.worker import Worker


class NotAMember(Dl2Error):
    """An elastic job's process that the plan no longer names: it started after the plan moved on (exit 0)."""


def build_parser() -> argparse.ArgumentParser:
    """The flags of `python -m dl2.testbed.training`."""
    p = argparse.ArgumentParser(prog="python -m dl2.testbed.training",
                                description="One PS or worker process of a DL2 job's data-parallel training (see the package docstring).")
    p.add_argument("--job", required=True, help="the job's name (recorded in its checkpoint)")
    p.add_argument("--model", required=True, help=f"the job type: {', '.join(STANDINS)}")
    p.add_argument("--member", default="", help="an elastic job's member name: the rest of the configuration (the next five flags) "
                                                "comes from <state>/plan.json, and follows it")
    p.add_argument("--role", choices=["ps", "worker"])
    p.add_argument("--index", type=int, help="this process's index among its role's processes, from 0")
    p.add_argument("--num-ps", type=int, help="P, the configuration's parameter servers")
    p.add_argument("--num-workers", type=int, help="W, the configuration's workers")
    p.add_argument("--state", required=True, type=Path, help="the job's state folder, shared by all its processes")
    p.add_argument("--epochs", required=True, type=float, help="epochs to train in all (the job is done there)")
    p.add_argument("--mode", default="sync", choices=["sync", "async"])
    p.add_argument("--generation", type=int, help="the configuration's number, larger for every new one (the slot)")
    p.add_argument("--seed", type=int, default=0, help="initial parameters and the synthetic task (default 0)")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="K", help="checkpoint every K steps (default 0: off)")
    p.add_argument("--checkpoint-seconds", type=float, default=5.0, metavar="T", help="checkpoint every T seconds (default 5; 0: off)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds to wait for the rendezvous, for the previous configuration to let go, or for any message (default 300)")
    p.add_argument("--log-seconds", type=float, default=10.0, metavar="L",
                   help="PS 0 logs a progress line every L seconds without a checkpoint (default 10; 0: off)")
    p.add_argument("--stop-timeout", type=float, default=20.0,
                   help="after SIGTERM, seconds to wait for the job's checkpoint before exiting anyway (default 20)")
    return p


def parse(argv: list[str] | None = None) -> tuple[JobConfig, float]:
    """The process's configuration and its stop timeout; bad values are a Dl2Error that says what to fix."""
    a = build_parser().parse_args(argv)
    get_standin(a.model)
    fixed = {"--role": a.role, "--index": a.index, "--num-ps": a.num_ps, "--num-workers": a.num_workers, "--generation": a.generation}
    if a.member:
        given = [flag for flag, value in fixed.items() if value is not None]
        if given:
            raise Dl2Error(f"--member takes the configuration from the plan: leave out {', '.join(given)}")
        plan = read_plan(a.state)
        if plan is None:
            raise Dl2Error(f"--member {a.member}: not a member of the plan in {a.state / PLAN} (there is none)")
        if a.member not in plan.members:
            raise NotAMember(f"--member {a.member}: not a member of generation {plan.generation} of the plan in "
                             f"{a.state / PLAN}: it moved on before this process started")
        (a.role, a.index), a.generation = plan.members[a.member], plan.generation
        a.num_ps, a.num_workers = plan.num_ps, plan.num_workers
    elif missing := [flag for flag, value in fixed.items() if value is None]:
        raise Dl2Error(f"give {', '.join(missing)} (a fixed configuration), or --member (an elastic job's plan)")
    if a.num_ps < 1 or a.num_workers < 1:
        raise Dl2Error(f"--num-ps and --num-workers must be at least 1 (got {a.num_ps} and {a.num_workers})")
    count = a.num_ps if a.role == "ps" else a.num_workers
    if not 0 <= a.index < count:
        raise Dl2Error(f"--index {a.index} is out of range for {count} {a.role} process(es): use 0..{count - 1}")
    if not a.epochs > 0:
        raise Dl2Error(f"--epochs must be positive (got {a.epochs})")
    if a.generation < 0:
        raise Dl2Error(f"--generation must be a non-negative integer (got {a.generation})")
    if a.checkpoint_every < 0 or a.checkpoint_seconds < 0 or a.log_seconds < 0 or a.timeout <= 0 or a.stop_timeout <= 0:
        raise Dl2Error("--checkpoint-every, --checkpoint-seconds and --log-seconds must be >= 0, --timeout and --stop-timeout > 0")
    if not a.job:
        raise Dl2Error("--job must not be empty")
    try:
        a.state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise Dl2Error(f"--state {a.state}: cannot create the state folder ({exc})") from None
    job = JobConfig(a.job, a.model, a.role, a.index, a.num_ps, a.num_workers, a.state, a.epochs, a.mode, a.generation, a.seed,
                    a.checkpoint_every, a.checkpoint_seconds, a.timeout, a.log_seconds, a.member)
    return job, a.stop_timeout


def train(job: JobConfig, stop: threading.Event, joined: threading.Event) -> tuple[int, str]:
    """Run this process's role to its end, through every configuration of its plan if it is an elastic job's;
    the exit code and why. `joined` is set while the process is in a configuration's world."""
    torch.set_num_threads(training_threads())
    try:
        while True:
            try:
                steps = train_once(job, stop, joined)
            except comm.Superseded as exc:  # no world to leave: follow the plan, which has moved past `job`
                job.log("abandon", str(exc))
                following, since = next_configuration(job), f"before generation {job.generation}'s world formed"
                resumes = f"skipping generation {job.generation}"
            else:
                if steps is None:
                    return 0, "stopped while waiting for the previous configuration"
                if steps >= job.target_steps:
                    return 0, f"done at step {steps} ({job.epochs:g} epochs)"
                following, since = next_configuration(job) if job.member and not stop.is_set() else None, f"at step {steps}"
                resumes = f"from step {steps}"
            if following is None:
                return 0, f"stopped {since} ({'SIGTERM' if stop.is_set() else 'another process of the job was stopped'})"
            if following.role != "ps" or following.index != 0:
                release_ownership(job.state)
            if not following.member:
                return 0, f"stopped {since}: not a member of generation {following.generation}"
            job = following
            job.log("rejoin", f"{job.num_ps} PS and {job.num_workers} workers, generation {job.generation}, {resumes}")
    except Dl2Error as exc:
        return 2, f"error: {exc}"
    except (comm.PeerLost, TimeoutError) as exc:
        return 1, f"failed: {exc}; the job resumes from its last checkpoint when restarted with a new --generation"
    except Exception:  # a bug: say where
        traceback.print_exc()
        return 1, "failed: unexpected error (traceback above)"


def train_once(job: JobConfig, stop: threading.Event, joined: threading.Event) -> int | None:
    """Run one configuration's role until PS 0 says stop; the job's acknowledged steps then (None: stopped while
    waiting for the previous configuration to let go). The process leaves the world before it returns. An elastic
    job's process raises comm.Superseded, together with the rest of the configuration, if the plan moves past it
    before its world forms."""
    watch = PlanWatch(job.state, job.generation) if job.member else None
    try:
        check_not_stale(job.state, job.generation)
    except Dl2Error:
        if watch is not None and watch.moved():  # a newer generation owns the folder: the plan had moved on
            raise comm.Superseded(f"the plan moved past generation {job.generation} before this process joined it") from None
        raise
    coordinator = job.role == "ps" and job.index == 0
    if coordinator:
        if not claim_ownership(job.state, job.generation, stop, job.timeout, lambda m: job.log("wait", m)):
            return None
        comm.remove_stores(job.state, below=job.generation)
    comm.rendezvous(job.state, job.generation, job.num_ps, job.num_workers, job.rank, job.timeout,
                    None if watch is None else watch.moved)
    joined.set()
    role = (Coordinator if coordinator else ParameterServer if job.role == "ps" else Worker)(job, stop)
    role.run()
    if coordinator:  # everyone has its decision: the world's rendezvous file is of no more use
        comm.store_path(job.state, job.generation, job.num_ps, job.num_workers).unlink(missing_ok=True)
    joined.clear()
    comm.leave()
    return role.steps


def next_configuration(job: JobConfig) -> JobConfig | None:
    """An elastic job's process's next configuration: the plan's, if it is newer than `job`'s (None if not: the
    job was stopped for another reason); `member` "" there if this process is not one of its members."""
    plan = read_plan(job.state)
    if plan is None or plan.generation <= job.generation:
        return None
    if job.member not in plan.members:
        return dataclasses.replace(job, member="", generation=plan.generation)
    role, index = plan.members[job.member]
    return dataclasses.replace(job, role=role, index=index, num_ps=plan.num_ps, num_workers=plan.num_workers, generation=plan.generation)


def main(argv: list[str] | None = None, stop: threading.Event | None = None) -> int:
    """`python -m dl2.testbed.training`: one process of a job; returns the exit code. `stop`: set on SIGTERM
    (`stop_on_signals`, made here when not given). Logs a `start` line first and an `exit` line last."""
    stop = stop or stop_on_signals()
    try:
        job, stop_timeout = parse(argv)
    except NotAMember as exc:
        print(f"exit: code 0, {exc}", flush=True)
        return 0
    except Dl2Error as exc:
        print(f"error: {exc}", flush=True)
        return 2
    job.log("start", f"model {job.model}, {job.num_ps} PS and {job.num_workers} workers ({job.mode}), generation {job.generation}, "
                     f"seed {job.seed}, state {job.state}, pid {os.getpid()}")
    code, why = run(job, stop, stop_timeout)
    job.log("exit", f"code {code}, {why}")
    return code


def run(job: JobConfig, stop: threading.Event, stop_timeout: float) -> tuple[int, str]:
    """Train in a thread while the main thread watches for a stop; the exit code and why."""
    if stop.is_set():  # a signal while this process imported torch
        return 0, "stopped (SIGTERM) before the rendezvous completed"
    joined = threading.Event()
    result: list[tuple[int, str]] = []
    thread = threading.Thread(target=lambda: result.append(train(job, stop, joined)), daemon=True)
    thread.start()
    deadline = None
    while thread.is_alive():
        thread.join(0.2)
        if stop.is_set() and thread.is_alive():
            if not joined.is_set():
                return 0, "stopped (SIGTERM) before the rendezvous completed"
            deadline = deadline or time.monotonic() + stop_timeout
            if time.monotonic() > deadline:
                return 0, (f"stopped (SIGTERM): the job's checkpoint did not complete within {stop_timeout:g} s; "
                           "it resumes from its last checkpoint")
    return result[0]
