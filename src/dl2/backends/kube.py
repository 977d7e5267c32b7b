"""A Kubernetes namespace as a dl2 backend (`dl2.schedulers.base.Backend`): `observe()`, `apply(alloc)`,
`done`, `slot`, `jct()`, and `stats` (as `dl2.backends.sim.SimulatedCluster`).

All state lives in the cluster: the slot clock and the slot's committed allocation in the `dl2-clock`
ConfigMap, each job's admission, allocation and progress in its DL2Job status, the tasks as pods. A
slot: admit arrived DL2Jobs (checking their specs), show the scheduler the uncompleted ones and the Ready
nodes of the pool; commit its allocation to the clock; create, bind and delete pods to match; let the
emulator count the bound pods into progress; move the clock. A scheduler restarted at any point finds
the committed allocation (`committed`) and finishes the slot with `resume()`.

A `KubeCluster` made with `connect(kubeconfig, ...)` pickles as its kubeconfig path (never the
credentials) and reconnects when loaded, so a training checkpoint holding it resumes on the cluster.
"""

from __future__ import annotations

import datetime
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from lightkube.resources.core_v1 import ConfigMap, Node, Pod

from dl2.backends.emulator import trained_tasks
from dl2.backends.observe import check_allocation, observation
from dl2.backends.workloads import Emulated, Workload
from dl2.errors import Dl2Error
from dl2.kube import jobs as dl2jobs
from dl2.kube.client import ApiError, Kube
from dl2.kube.resources import CLOCK, JOB_LABEL, NODE_INDEX_LABEL, POOL_LABEL, DL2Job, ensure_namespace, is_ready, slots
from dl2.schedulers.base import Allocation, Observation
from dl2.sim import engine
from dl2.sim.scenario import Scenario
from dl2.sim.state import make_cluster, make_jobs
from dl2.workload.traces import Trace

STOP_MARGIN_S = 30  # how long past its grace period a deleted pod may take to go before it is force-deleted

ROLE_NAMES = ("worker", "ps")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeCluster:
    """DL2Jobs of one namespace on the Ready nodes of one pool (nodes labelled `dl2.io/pool=<pool>`)."""

    def __init__(self, kube: Kube, scenario: Scenario, namespace: str, pool: str, kubeconfig: str | None = None,
                 workload: Workload | None = None):
        self.kube, self.scenario, self.namespace, self.pool = kube, scenario, namespace, pool
        self.kubeconfig = kubeconfig  # where `kube` connected from: what a pickled KubeCluster reconnects with
        self.table = scenario.table
        self.catalog = scenario.catalog
        # what the pods run and where progress comes from; by default the emulator's placeholders (KWOK)
        self.workload = workload or Emulated(namespace, scenario.true_table, scenario.options.fine_grained_jct,
                                             scenario.lost)
        self.stats: list[np.ndarray] = []
        self._view: dict | None = None

    @classmethod
    def connect(cls, kubeconfig: str | Path, scenario: Scenario, namespace: str, pool: str,
                workload: Workload | None = None) -> KubeCluster:
        """A backend on the cluster `kubeconfig` points at, which checkpoints can hold (see the module docstring)."""
        return cls(Kube.from_kubeconfig(kubeconfig), scenario, namespace, pool, str(kubeconfig), workload)

    def __getstate__(self) -> dict:
        if self.kubeconfig is None:
            raise TypeError("a KubeCluster checkpoints only when made with KubeCluster.connect(kubeconfig, ...)")
        state = {k: v for k, v in self.__dict__.items() if k not in ("kube", "_view")}
        return {**state, "slot_open": self._view is not None}

    def __setstate__(self, state: dict) -> None:
        slot_open = state.pop("slot_open")
        self.__init__(Kube.from_kubeconfig(state["kubeconfig"]), state["scenario"], state["namespace"], state["pool"],
                      state["kubeconfig"], state["workload"])
        self.stats = state["stats"]
        if slot_open:
            self.observe()  # the open slot was never applied: observe it again

    def restart(self, trace: Trace) -> None:
        """Start `trace` here: delete the namespace's DL2Jobs, their pods and the clock, then submit the
        trace as DL2Jobs."""
        ensure_namespace(self.kube, self.namespace)
        self.close()
        for job in self.jobs():
            self.kube.delete(DL2Job, job["metadata"]["name"], self.namespace)
        self.kube.delete(ConfigMap, CLOCK, self.namespace)
        dl2jobs.submit_trace(self.kube, trace, self.catalog, self.namespace)
        self.stats, self._view = [], None

    def close(self) -> None:
        """Delete the namespace's task pods; pods that take time to stop (real training checkpoints on its way
        out) are waited for, so that their nodes' slots are free for whatever runs next."""
        names = {p["metadata"]["name"] for p in self.kube.list(Pod, self.namespace, labels={JOB_LABEL: None})}
        self._delete_pods(None)
        if self.workload.grace_seconds:
            self._await_stopped(names, gone=True)

    # --- state read from the cluster -------------------------------------------------------------
    def clock(self) -> dict:
        """The clock ConfigMap, created at slot 0 if missing."""
        try:
            return self.kube.get(ConfigMap, CLOCK, self.namespace)
        except ApiError as exc:
            if exc.status != 404:
                raise
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CLOCK, "namespace": self.namespace}, "data": {"slot": "0"}}
        try:
            return self.kube.create(body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            return self.kube.get(ConfigMap, CLOCK, self.namespace)

    @property
    def slot(self) -> int:
        return int(self.clock()["data"]["slot"])

    @property
    def done(self) -> bool:
        """Every DL2Job of the namespace has succeeded or failed."""
        return all(j.get("status", {}).get("phase") in dl2jobs.TERMINAL for j in self.jobs())

    def jobs(self) -> list[dict]:
        return self.kube.list(DL2Job, self.namespace)

    def nodes(self) -> list[dict]:
        """Ready, schedulable nodes of the pool, by their index label, then name."""
        nodes = [n for n in self.kube.list(Node, labels={POOL_LABEL: self.pool}) if is_ready(n)]
        return sorted(nodes, key=lambda n: (int(n["metadata"]["labels"].get(NODE_INDEX_LABEL, 1 << 30)), n["metadata"]["name"]))

    def census(self) -> dict[str, int]:
        """DL2Jobs by phase (waiting: not arrived or not admitted yet; running; done: succeeded or failed), the
        task pods bound to nodes and not being deleted, and of those the pods still starting (`starting`: of
        a configuration that has not acknowledged a step, as the workload tells) and how many of these are
        Ready (`starting_ready`)."""
        jobs = self.jobs()
        phases = [j.get("status", {}).get("phase") for j in jobs]
        bound = [p for p in self.kube.list(Pod, self.namespace, labels={JOB_LABEL: None})
                 if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")]
        starting = self.workload.starting([j for j, phase in zip(jobs, phases) if phase == "Running"], bound)
        done = sum(phase in dl2jobs.TERMINAL for phase in phases)
        running = phases.count("Running")
        return {"waiting": len(phases) - done - running, "running": running, "done": done, "tasks": len(bound),
                "starting": len(starting), "starting_ready": sum(map(is_ready, starting))}

    def jct(self) -> dict[int, float]:
        """JCT in slots of every succeeded job, by job id."""
        return {int(j["status"]["jobId"]): float(j["status"]["jct"]) for j in self.jobs()
                if j.get("status", {}).get("phase") == "Succeeded"}

    @property
    def committed(self) -> list[list] | None:
        """The allocation committed for the observed slot before a restart, as [job, role, node] tasks."""
        clock = self._view["clock"] if self._view else self.clock()
        raw = clock["data"].get("allocation")
        if raw is None:
            return None
        plan = json.loads(raw)
        return plan["tasks"] if plan["slot"] == int(clock["data"]["slot"]) else None

    # --- the protocol --------------------------------------------------------------------------
    def observe(self) -> Observation:
        """Start the slot: admit arrived jobs, and show the uncompleted ones and an empty cluster."""
        clock = self.clock()
        slot = int(clock["data"]["slot"])
        if slot >= self.scenario.options.max_slots:
            raise Dl2Error(f"namespace {self.namespace}: jobs did not finish within max_slots={self.scenario.options.max_slots}")
        nodes = self.nodes()
        if not nodes:
            raise Dl2Error(f"no Ready node carries the label {POOL_LABEL}={self.pool} (create the testbed's nodes first)")
        capacity = tuple(min(column) for column in zip(*(slots(n) for n in nodes)))
        p = self.scenario.preset
        active, specs = self._admit(slot, capacity, p.max_tasks)
        n = len(active)
        jobs = make_jobs(np.array([s.model for s in specs], dtype=np.int64),
                         np.array([j["status"]["admittedSlot"] for j in active], dtype=np.int64),
                         np.array([j["status"]["jobId"] for j in active], dtype=np.int64),
                         np.array([s.epochs for s in specs]),
                         np.array([s.worker_demand for s in specs], dtype=np.int64).reshape(n, 2),
                         np.array([s.ps_demand for s in specs], dtype=np.int64).reshape(n, 2))
        jobs.progress[:] = [float(j["status"].get("progress", 0.0)) for j in active]
        jobs.active[:] = True
        cluster = make_cluster(len(nodes), *capacity)
        if self.scenario.options.assign_bundle:
            engine.assign_bundles(jobs, cluster)
        obs = observation(slot, np.array([j["status"]["jobId"] for j in active], dtype=np.int64), jobs, cluster,
                          p.max_tasks, self.table, trained_tasks(active, slot))
        self._view = {"clock": clock, "slot": slot, "jobs": active, "specs": specs, "nodes": nodes, "obs": obs}
        return obs

    def apply(self, alloc: Allocation) -> float:
        """Check the scheduler's allocation (`check_allocation`, as every backend does), cap each job at its
        DL2Job's own limits, commit it for the observed slot and run the slot; returns its reward."""
        view = self._need_view()
        check_allocation(view["obs"], alloc)
        job, role, node = alloc.tasks()
        tasks, given = [], defaultdict(int)
        for j, r, k in zip(job.tolist(), role.tolist(), node.tolist()):
            spec, name = view["specs"][j], view["jobs"][j]["metadata"]["name"]
            limit = spec.max_workers if r == 0 else spec.max_ps
            if given[name, r] < limit:  # spec.limits: a DL2Job may ask for fewer tasks than max_tasks
                given[name, r] += 1
                tasks.append([name, ROLE_NAMES[r], view["nodes"][k]["metadata"]["name"]])
        clock = view["clock"]
        data = {**clock["data"], "allocation": json.dumps({"slot": view["slot"], "tasks": tasks})}
        view["clock"] = self.kube.replace({**clock, "data": data})
        return self._run_committed()

    def resume(self) -> float | None:
        """After a restart: run the observed slot with the allocation committed for it before (its reward), or
        None if none was committed (the scheduler decides the slot)."""
        self._need_view()
        return None if self.committed is None else self._run_committed()

    def _run_committed(self) -> float:
        """Run the observed slot with its committed allocation: pods, progress, clock; returns the reward."""
        view, started = self._need_view(), time.time()
        tasks = self.committed
        if tasks is None:
            raise Dl2Error(f"slot {view['slot']}: no allocation committed")
        slot, active = view["slot"], view["jobs"]
        running = {j["metadata"]["name"] for j in active}
        node_names = {n["metadata"]["name"] for n in view["nodes"]}
        # after a restart, drop tasks of jobs that completed and of nodes that went away since the commit
        tasks = [t for t in tasks if t[0] in running and t[2] in node_names]
        per_job: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for name, role, node in tasks:
            per_job[name].append((role, node))
        self._show_allocation(slot, active, per_job)
        changes = self._reconcile_pods(slot, active, per_job, view["specs"])
        reward, completed = self.workload.advance(self.kube, slot, active, view["specs"], node_names, started)
        if completed:
            self._delete_pods(set(completed))
        self._record(view, tasks, changes, reward)
        clock = view["clock"]
        data = {k: v for k, v in clock["data"].items() if k != "allocation"}
        data["slot"] = str(slot + 1)
        self.kube.replace({**clock, "data": data})
        self._view = None
        return reward

    # --- steps ----------------------------------------------------------------------------------
    def _need_view(self) -> dict:
        if self._view is None:
            raise Dl2Error("observe() the slot before applying an allocation")
        return self._view

    def _admit(self, slot: int, capacity: tuple[int, int], max_tasks: int) -> tuple[list[dict], list]:
        """Admit DL2Jobs that have arrived (a bad spec fails with a condition); the running ones, in order."""
        jobs = self.jobs()
        next_id = 1 + max([0, *(j.get("status", {}).get("jobId", 0) for j in jobs),
                           *((j.get("spec") or {}).get("jobId") or 0 for j in jobs)])
        running = []
        for job in sorted(jobs, key=lambda j: (j["metadata"]["creationTimestamp"], j["metadata"]["name"])):
            status = job.setdefault("status", {})
            if status.get("phase") in dl2jobs.TERMINAL:
                continue
            spec = dl2jobs.check_spec(job, self.catalog, capacity, max_tasks)
            if isinstance(spec, str):
                self._fail(job, spec)
                continue
            if "admittedSlot" not in status:
                arrival = spec.arrival_slot if spec.arrival_slot is not None else slot
                if arrival > slot:
                    if status.get("phase") != "Pending":
                        job.update(self._patch_status(job, {"phase": "Pending"}))
                    continue
                job_id = spec.job_id
                if job_id is None:
                    job_id, next_id = next_id, next_id + 1
                condition = {"type": "Valid", "status": "True", "reason": "Admitted", "message": "spec checked",
                             "lastTransitionTime": _now()}
                job.update(self._patch_status(job, {
                    "phase": "Running", "jobId": job_id, "admittedSlot": min(arrival, slot), "progress": 0.0,
                    "progressPercent": "0.0%", "progressSlot": slot - 1, "conditions": [condition]}))
            running.append((job, spec))
        running.sort(key=lambda js: (js[0]["status"]["admittedSlot"], js[0]["status"]["jobId"]))
        return [j for j, _ in running], [s for _, s in running]

    def _fail(self, job: dict, message: str) -> None:
        condition = {"type": "Valid", "status": "False", "reason": "InvalidSpec", "message": message, "lastTransitionTime": _now()}
        self._patch_status(job, {"phase": "Failed", "conditions": [condition]})
        self._delete_pods({job["metadata"]["name"]})

    def _patch_status(self, job: dict, status: dict) -> dict:
        """Merge `status` into the job's status; returns the updated object."""
        return self.kube.patch(DL2Job.Status, job["metadata"]["name"], {"status": status}, self.namespace)

    def _show_allocation(self, slot: int, active: list[dict], per_job: dict) -> None:
        """Write each job's allocation into its status (what `kubectl get dl2jobs` shows)."""
        for job in active:
            name = job["metadata"]["name"]
            tasks = per_job.get(name, [])
            allocation = {"slot": slot, "workers": sum(r == "worker" for r, _ in tasks), "ps": sum(r == "ps" for r, _ in tasks),
                          "nodes": sorted({n for _, n in tasks})}
            if job["status"].get("allocation") != allocation:
                job.update(self._patch_status(job, {"allocation": allocation}))

    def _reconcile_pods(self, slot: int, active: list[dict], per_job: dict, specs) -> int:
        """Make the pods match the workload's wishes for the allocation: delete the others, create and bind the
        missing; returns the pods created and deleted."""
        existing: dict[str, list[dict]] = defaultdict(list)
        for pod in self.kube.list(Pod, self.namespace, labels={JOB_LABEL: None}):
            existing[pod["metadata"]["labels"][JOB_LABEL]].append(pod)
        desired: dict[str, tuple[dict, str]] = {}
        for job, spec in zip(active, specs):
            name = job["metadata"]["name"]
            desired.update(self.workload.pods(job, spec, per_job.get(name, []), slot, existing.get(name, [])))
        changes = 0
        kept, going = set(), set()
        for pod in (p for pods in existing.values() for p in pods):
            meta = pod["metadata"]
            if meta["name"] in desired and not meta.get("deletionTimestamp"):
                kept.add(meta["name"])
                if not pod["spec"].get("nodeName"):
                    self.kube.bind(meta["name"], desired[meta["name"]][1], self.namespace)
            else:
                going.add(meta["name"])
                if not meta.get("deletionTimestamp"):
                    self.kube.delete(Pod, meta["name"], self.namespace, grace_seconds=self.workload.grace_seconds)
                    changes += 1
        if self.workload.grace_seconds and any(name not in kept for name in desired):
            self._await_stopped(going)
        for name, (manifest, node) in desired.items():
            if name not in kept:
                self.kube.create(manifest)
                self.kube.bind(name, node, self.namespace)
                changes += 1
        return changes

    def _await_stopped(self, names: set[str], gone: bool = False) -> None:
        """Wait until the pods `names` have stopped: gone, or every container terminated (a pod that finished on
        its own, or whose containers exited after its checkpoint); with `gone`, until they are gone. A kubelet
        counts a pod's resources until its containers have stopped and refuses a new pod that does not fit
        beside it; the rest of a deleted pod's cleanup (its sandbox, volumes, the object's removal) may take far
        longer on a busy node and holds no resources. Pods still running `STOP_MARGIN_S` after their grace
        period (their node is lost) are removed without waiting for their kubelet."""
        deadline = time.monotonic() + self.workload.grace_seconds + STOP_MARGIN_S
        while names:
            running = {p["metadata"]["name"] for p in self.kube.list(Pod, self.namespace, labels={JOB_LABEL: None})
                       if gone or not _stopped(p)}
            names = names & running
            if names and time.monotonic() > deadline:
                for name in names:
                    self.kube.delete(Pod, name, self.namespace, grace_seconds=0)
                return
            if names:
                time.sleep(0.5)

    def _delete_pods(self, names: set[str] | None) -> None:
        """Delete the task pods of the jobs `names` (None: of every job)."""
        for pod in self.kube.list(Pod, self.namespace, labels={JOB_LABEL: None}):
            if names is None or pod["metadata"]["labels"][JOB_LABEL] in names:
                self.kube.delete(Pod, pod["metadata"]["name"], self.namespace)

    def _record(self, view: dict, tasks: list, changes: int, reward: float) -> None:
        specs = {j["metadata"]["name"]: s for j, s in zip(view["jobs"], view["specs"])}
        used = np.zeros(2)
        roles: dict[str, set] = defaultdict(set)
        for name, role, _ in tasks:
            used += specs[name].worker_demand if role == "worker" else specs[name].ps_demand
            roles[name].add(role)
        row = np.zeros(engine.NUM_STATS)
        row[engine.STAT_CPU_USED], row[engine.STAT_GPU_USED] = used
        row[engine.STAT_TASK_CHANGES] = changes
        row[engine.STAT_RUNNING] = sum(len(r) == 2 for r in roles.values())
        row[engine.STAT_REWARD] = reward
        self.stats.append(row)


def _stopped(pod: dict) -> bool:
    """The pod's containers have all terminated (its phase is final, or each container's state says so)."""
    status = pod.get("status", {})
    containers = status.get("containerStatuses") or []
    return status.get("phase") in ("Succeeded", "Failed") or (
        bool(containers) and all("terminated" in (c.get("state") or {}) for c in containers))
