"""What a DL2Job's pods run, and where its progress comes from (DESIGN §6).

- `Emulated`, for nodes that run no containers (the local testbed's KWOK nodes): one pod per task holds
  its place (`dl2 k8s-scheduler task`), and the progress emulator gives each job the speed table's epochs
  for the pods it has, exactly as the simulator would.
- `Trained`, for nodes that run containers (the kind testbed, or any cluster with a folder all nodes
  share): a job's PS and worker pods really train (`python -m dl2.testbed.training`, data-parallel PyTorch),
  and its progress is the epochs its pods trained and checkpointed. A job's pods form one configuration
  (P PS, W workers; its generation: the slot it was planned in). When the allocation changes, an elastic
  job (the default) keeps the pods whose (role, node) the new configuration still has, deletes the others
  (they checkpoint on SIGTERM) and adds new ones; the controller writes the job's plan
  (`dl2.testbed.training.plan`), and the surviving processes checkpoint, leave the old world and join the
  new one without restarting, so only added pods pay the start-up. Without `elastic`, every change stops
  all the job's pods and starts a whole new configuration, which resumes from the checkpoint.

A workload holds no connection: the backend passes its client, so a backend pickles with its workload.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from dl2.backends.emulator import ProgressEmulator, write_once
from dl2.kube.client import Kube
from dl2.kube.jobs import JobSpec
from dl2.kube.resources import GENERATION_LABEL, JOB_LABEL, ROLE_LABEL, TASK_IMAGE, PodRuntime, jct_status, pod_manifest
from dl2.testbed.training.plan import Plan, read_plan, write_plan
from dl2.testbed.training.progress import read_progress
from dl2.testbed.training.threads import CPU_LIMIT_ENV

TRAINING_FIELDS = {  # status.training <- progress.json
    "steps": "steps", "epochs": "epochs", "loss": "loss", "firstLoss": "first_loss", "stepsPerSecond": "steps_per_second",
    "generation": "generation", "numPS": "num_ps", "numWorkers": "num_workers", "startStep": "start_step",
    "trainSeconds": "train_seconds"}
Tasks = list[tuple[str, str]]  # a job's tasks this slot: (role, node)
Desired = dict[str, tuple[dict, str]]  # the pods a job should have: name -> (manifest, node)


class Workload(Protocol):
    grace_seconds: int  # how long a deleted pod may take to stop

    def pods(self, job: dict, spec: JobSpec, tasks: Tasks, slot: int, existing: list[dict]) -> Desired:
        """The pods `job` should have this slot for `tasks`; an existing pod named here is kept as it is."""

    def advance(self, kube: Kube, slot: int, jobs: list[dict], specs: list[JobSpec], nodes: set[str],
                slot_start: float) -> tuple[float, list[str]]:
        """Count the slot's training into the jobs' status; (the slot's reward, names of the jobs completed).
        `slot_start`: the wall-clock time (`time.time()`) the slot began, its pods' changes included."""

    def starting(self, jobs: list[dict], pods: list[dict]) -> list[dict]:
        """Those of the jobs' task `pods` that belong to a configuration that has not acknowledged a step yet."""


def placeholder_pod_name(job: str, role: str, node: str, k: int) -> str:
    """An emulated task's pod is named by job, role, node and ordinal, so its name says where it belongs."""
    return f"{job}-{role}-{hashlib.sha1(node.encode()).hexdigest()[:6]}-{k}"


@dataclass
class Emulated:
    """Pods that hold their place; progress from the speed table (`dl2.backends.emulator`)."""

    namespace: str
    table: np.ndarray
    fine_grained: bool
    lost: tuple[float, float] = (0.0, 0.0)  # the fractions of a slot a new configuration spends starting (`Scenario.lost`)
    grace_seconds: int = 0

    def pods(self, job: dict, spec: JobSpec, tasks: Tasks, slot: int, existing: list[dict]) -> Desired:
        name, desired = job["metadata"]["name"], {}
        seen: dict[tuple[str, str], int] = defaultdict(int)
        for role, node in sorted(tasks):
            pod = placeholder_pod_name(name, role, node, seen[role, node])
            seen[role, node] += 1
            container = {"image": TASK_IMAGE, "args": ["k8s-scheduler", "task", "--job", name, "--role", role]}
            desired[pod] = (pod_manifest(job, pod, role, _demand(spec, role), container), node)
        return desired

    def advance(self, kube: Kube, slot: int, jobs: list[dict], specs: list[JobSpec], nodes: set[str],
                slot_start: float) -> tuple[float, list[str]]:
        emulator = ProgressEmulator(kube, self.namespace, self.table, self.fine_grained, self.lost)
        return emulator.advance(slot, jobs, [s.model for s in specs], nodes)

    def starting(self, jobs: list[dict], pods: list[dict]) -> list[dict]:
        """None: the emulator counts a job's progress from the slot its pods are bound in."""
        return []


@dataclass
class Trained:
    """Real PS and worker pods; progress from the jobs' checkpoints in the shared folder."""

    namespace: str
    catalog_names: tuple[str, ...]
    runtime: PodRuntime
    slot_seconds: float  # the wall-clock time the pods train per slot
    fine_grained: bool
    checkpoint_seconds: float = 2.0
    grace_seconds: int = 60  # a stopped configuration checkpoints before it exits
    elastic: bool = True  # pods that keep their (role, node) survive a resize (module docstring)

    def state_folder(self, job: dict, in_pod: bool = False) -> Path:
        """Where the job's checkpoint and progress live, as the scheduler (or, `in_pod`, its pods) sees it:
        one folder per DL2Job object (name and uid), so a job submitted again under the same name starts over."""
        base = Path(self.runtime.shared_in_pod) if in_pod else self.runtime.shared_here
        meta = job["metadata"]
        return base / self.namespace / f"{meta['name']}-{meta['uid'][:8]}"

    def starting(self, jobs: list[dict], pods: list[dict]) -> list[dict]:
        """The pods of a configuration (generation) newer than the one that wrote the job's last progress record:
        they are starting (pulling, importing torch, meeting their peers) and have not acknowledged a step. An
        elastic job's configuration is its plan's, which its surviving pods join too."""
        trained, planned = {}, {}
        for job in jobs:
            folder, name = self.state_folder(job), job["metadata"]["name"]
            record = read_progress(folder)
            trained[name] = -1 if record is None else int(record["generation"])
            plan = read_plan(folder) if self.elastic else None
            if plan is not None:
                planned[name] = plan.generation
        def generation(pod: dict) -> int:
            labels = pod["metadata"]["labels"]
            return max(int(labels.get(GENERATION_LABEL, -1)), planned.get(labels.get(JOB_LABEL), -1))
        return [p for p in pods if generation(p) > trained.get(p["metadata"]["labels"].get(JOB_LABEL), 1 << 62)]

    def pods(self, job: dict, spec: JobSpec, tasks: Tasks, slot: int, existing: list[dict]) -> Desired:
        """Keep the job's running configuration if it is healthy and placed as `tasks`; else a new one,
        generation `slot`. A job needs a PS and a worker to train; with fewer it has no pods."""
        workers = sorted(node for role, node in tasks if role == "worker")
        ps = sorted(node for role, node in tasks if role == "ps")
        if not workers or not ps:
            return {}
        record = read_progress(self.state_folder(job))
        if record is not None and record["done"]:  # it finished since the last reading: no new pods to start
            return {}
        live = [p for p in existing if not p["metadata"].get("deletionTimestamp")]
        healthy = all(p.get("status", {}).get("phase", "Pending") in ("Pending", "Running") for p in live)
        if self.elastic:
            return self._elastic_pods(job, spec, tasks, slot, live if healthy else [])
        placed = sorted((p["metadata"]["labels"][ROLE_LABEL], p["spec"].get("nodeName")) for p in live)
        generations = {p["metadata"]["labels"].get(GENERATION_LABEL) for p in live}
        if live and healthy and len(generations) == 1 and placed == sorted(tasks):
            return {p["metadata"]["name"]: (p, p["spec"]["nodeName"]) for p in live}
        name, desired = job["metadata"]["name"], {}
        for role, nodes in (("ps", ps), ("worker", workers)):
            for index, node in enumerate(nodes):
                pod = f"{name}-g{slot}-{role}-{index}"
                desired[pod] = (self._manifest(job, spec, pod, role, slot, node, ["--role", role, "--index", str(index),
                                "--num-ps", str(len(ps)), "--num-workers", str(len(workers)), "--generation", str(slot)]), node)
        return desired

    def _elastic_pods(self, job: dict, spec: JobSpec, tasks: Tasks, slot: int, live: list[dict]) -> Desired:
        """Keep the pods of the job's plan whose (role, node) `tasks` still has, add pods for the rest (named
        `<job>-<role>-<generation>-<k>`: a name outlives configurations and is never reused), and write the new
        plan (generation `slot`, or one past the plan's if that is not older) if it differs: per role, the kept
        pods in their old order, then the added ones by node. `live`: the job's pods, none if any has failed
        (its peers fail too: a whole new configuration)."""
        folder, name = self.state_folder(job), job["metadata"]["name"]
        plan = read_plan(folder)
        members = plan.members if plan is not None else {}
        wanted = defaultdict(int)
        for task in tasks:
            wanted[task] += 1
        kept: dict[str, list[dict]] = {"ps": [], "worker": []}
        for pod in sorted(live, key=lambda p: members.get(p["metadata"]["name"], ("", 1 << 30))[1]):
            key = (pod["metadata"]["labels"][ROLE_LABEL], pod["spec"].get("nodeName"))
            if pod["metadata"]["name"] in members and wanted[key] > 0:
                wanted[key] -= 1
                kept[key[0]].append(pod)
        added = sorted(task for task, count in wanted.items() for _ in range(count))
        survivors = [p["metadata"]["name"] for role in kept for p in kept[role]]
        if not added and plan is not None and sorted(survivors) == sorted(members) == sorted(p["metadata"]["name"] for p in live):
            return {p["metadata"]["name"]: (p, p["spec"]["nodeName"]) for p in live}  # unchanged
        desired, new = {}, {}
        generation = slot if plan is None else max(slot, plan.generation + 1)
        for role in ("ps", "worker"):
            order = [p["metadata"]["name"] for p in kept[role]]
            desired.update((p["metadata"]["name"], (p, p["spec"]["nodeName"])) for p in kept[role])
            for k, (_, node) in enumerate(t for t in added if t[0] == role):
                pod = f"{name}-{role}-{generation}-{k}"
                order.append(pod)
                desired[pod] = (self._manifest(job, spec, pod, role, generation, node, ["--member", pod]), node)
            new.update((pod, (role, index)) for index, pod in enumerate(order))
        count = {role: sum(r == role for r, _ in new.values()) for role in ("ps", "worker")}
        shared_with_pods(folder, self.runtime.shared_here)
        write_plan(folder, Plan(generation, count["ps"], count["worker"], new))
        return desired

    def _manifest(self, job: dict, spec: JobSpec, pod: str, role: str, generation: int, node: str, configuration: list[str]) -> dict:
        """A training pod's manifest; `configuration`: its flags that say which process of which configuration it is."""
        name, rt = job["metadata"]["name"], self.runtime
        args = ["-m", "dl2.testbed.training", "--job", name, "--model", self.catalog_names[spec.model], *configuration,
                "--state", str(self.state_folder(job, in_pod=True)), "--epochs", repr(spec.epochs),
                "--mode", spec.mode, "--seed", str(job["status"]["jobId"]),
                "--checkpoint-seconds", repr(self.checkpoint_seconds), "--stop-timeout", str(max(1, self.grace_seconds - 5))]
        env = [{"name": "OMP_NUM_THREADS", "value": "1"}, {"name": "MKL_NUM_THREADS", "value": "1"},
               {"name": "HOME", "value": "/tmp"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
               {"name": "PYTHONUNBUFFERED", "value": "1"}]
        demand = _demand(spec, role)
        cpu_millis = demand[0] * rt.cpu_millis_per_slot
        if cpu_millis > 0:  # the training process sizes its threads by the pod's own limit (the downward API)
            env.append({"name": CPU_LIMIT_ENV, "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}})
        container = {"image": rt.image, "command": [rt.python], "args": args, "env": env,
                     "volumeMounts": [*rt.volume_mounts, {"name": "tmp", "mountPath": "/tmp"}]}
        volumes = [*rt.volumes, {"name": "tmp", "emptyDir": {}}]
        return pod_manifest(job, pod, role, demand, container, labels={GENERATION_LABEL: str(generation)},
                            volumes=volumes, grace_seconds=self.grace_seconds, cpu_millis=cpu_millis)

    def advance(self, kube: Kube, slot: int, jobs: list[dict], specs: list[JobSpec], nodes: set[str],
                slot_start: float) -> tuple[float, list[str]]:
        """Let the pods train until `slot_seconds` after `slot_start` (longer if the slot's pod changes took
        longer), then count what each job checkpointed. Each job's status records when it was read
        (`progressTime`) and the seconds since its last reading (`progressSeconds`): what its epochs were
        trained in."""
        time.sleep(max(0.0, slot_start + self.slot_seconds - time.time()))
        reading = time.time()
        reward, done = 0.0, []
        for job, spec in zip(jobs, specs):
            status = job["status"]
            if status.get("progressSlot", -1) >= slot:
                continue
            record = read_progress(self.state_folder(job))
            before = float(status.get("progress", 0.0))
            epochs = before if record is None else max(before, min(float(record["epochs"]), spec.epochs))
            reward += (epochs - before) / spec.epochs
            since = float(status.get("progressTime", slot_start))
            update = {"progress": epochs, "progressSlot": slot, "progressPercent": f"{100 * epochs / spec.epochs:.1f}%",
                      "progressTime": reading, "progressSeconds": reading - since}
            if record is not None:
                update["training"] = {k: record[v] for k, v in TRAINING_FIELDS.items() if record.get(v) is not None}
            if record is not None and record["done"]:
                elapsed = reading - slot_start
                fraction = min(1.0, max(0.0, (float(record["time"]) - slot_start) / elapsed)) if elapsed > 0 else 1.0
                end = slot - 1 + fraction if self.fine_grained else float(slot)
                update.update(phase="Succeeded", endSlot=end, **jct_status(end - float(status["admittedSlot"]) + 1.0))
                done.append(job["metadata"]["name"])
            write_once(kube, self.namespace, job, slot, update)
        return reward, done


def shared_with_pods(folder: Path, shared: Path) -> None:
    """Make `folder` and each missing folder between it and `shared` writable by the pods, which run as another
    user than the scheduler (the job's processes write their rendezvous, checkpoint and progress there): sticky
    and open to all, as `shared` itself is, so that none removes another's files."""
    missing = [f for f in [folder, *folder.parents] if f.is_relative_to(shared) and f != shared and not f.exists()]
    for path in reversed(missing):
        path.mkdir(exist_ok=True)
        path.chmod(0o1777)


def _demand(spec: JobSpec, role: str) -> tuple[int, int]:
    return spec.worker_demand if role == "worker" else spec.ps_demand
