"""The progress emulator: where pods do not train (KWOK), count each job's bound PS and worker pods and
write the epochs the speed model gives them for one slot into the DL2Job status (DESIGN §3 step 5).

It uses the simulator's own `engine.advance`, so a job with the same tasks trains exactly as in the
simulator. Each job's status records the last slot counted (`progressSlot`), and every write carries the
object's resourceVersion, so a slot is counted once even if the scheduler dies and runs it again. It also
records the configuration the job trained with (`trainedTasks`), so a new configuration pays the preset's
restart cost in the next slot as in the simulator.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from lightkube.resources.core_v1 import Pod

from dl2.kube.client import ApiError, Kube
from dl2.kube.resources import JOB_LABEL, ROLE_LABEL, DL2Job, jct_status
from dl2.sim import engine
from dl2.sim.state import PS, WORKER, make_jobs


def bound_tasks(kube: Kube, namespace: str, nodes: set[str]) -> Counter:
    """(job, role) -> pods bound to one of `nodes`, not being deleted and not failed (a kubelet may refuse one)."""
    counts: Counter = Counter()
    for pod in kube.list(Pod, namespace, labels={JOB_LABEL: None}):
        meta, node = pod["metadata"], pod["spec"].get("nodeName")
        if node in nodes and not meta.get("deletionTimestamp") and pod.get("status", {}).get("phase") != "Failed":
            counts[meta["labels"][JOB_LABEL], meta["labels"][ROLE_LABEL]] += 1
    return counts


def trained_tasks(jobs: list[dict], slot: int) -> np.ndarray:
    """(jobs, 2) [workers, PS] each job trained with in the slot before `slot` (its status's `trainedTasks`),
    0 if it did not train there: `dl2.sim.engine.advance`'s `trained`."""
    trained = engine.no_training(len(jobs))
    for i, job in enumerate(jobs):
        last = job["status"].get("trainedTasks") or {}
        if last.get("slot") == slot - 1:
            trained[i] = last["workers"], last["ps"]
    return trained


class ProgressEmulator:
    def __init__(self, kube: Kube, namespace: str, table: np.ndarray, fine_grained: bool,
                 lost: tuple[float, float] = (0.0, 0.0)):
        """`lost`: the fractions of a slot a new configuration spends starting (`dl2.sim.engine.advance`)."""
        self.kube, self.namespace, self.table, self.fine_grained, self.lost = kube, namespace, table, fine_grained, lost

    def advance(self, slot: int, jobs: list[dict], models: list[int], nodes: set[str]) -> tuple[float, list[str]]:
        """Train `jobs` (DL2Job objects, with their catalog model ids) for `slot`; (reward, names completed)."""
        todo = [k for k, job in enumerate(jobs) if job["status"].get("progressSlot", -1) < slot]
        if not todo:
            return 0.0, []
        counts = bound_tasks(self.kube, self.namespace, nodes)
        names = [jobs[k]["metadata"]["name"] for k in todo]
        top = self.table.shape[1] - 1
        arr = make_jobs(np.array([models[k] for k in todo]), np.array([jobs[k]["status"]["admittedSlot"] for k in todo]),
                        np.arange(1, len(todo) + 1), np.array([float(jobs[k]["spec"]["epochs"]) for k in todo]),
                        np.zeros((len(todo), 2)), np.zeros((len(todo), 2)))
        arr.progress[:] = [float(jobs[k]["status"].get("progress", 0.0)) for k in todo]
        arr.workers[:] = [min(counts[n, "worker"], top) for n in names]
        arr.ps[:] = [min(counts[n, "ps"], top) for n in names]
        arr.active[:] = True
        trained = trained_tasks([jobs[k] for k in todo], slot)
        _, reward = engine.advance(arr, self.table, slot, self.fine_grained, self.lost, trained)
        done = []
        for i, k in enumerate(todo):
            status = {"progress": float(arr.progress[i]), "progressSlot": slot,
                      "progressPercent": f"{100 * arr.progress[i] / arr.epochs[i]:.1f}%"}
            if trained[i, WORKER] > 0:
                status["trainedTasks"] = {"slot": slot, "workers": int(trained[i, WORKER]), "ps": int(trained[i, PS])}
            if not arr.active[i]:
                end = float(arr.end[i])
                status.update(phase="Succeeded", endSlot=end, **jct_status(end - float(arr.arrival[i]) + 1.0))
                done.append(names[i])
            write_once(self.kube, self.namespace, jobs[k], slot, status)
        return float(reward), done


def write_once(kube: Kube, namespace: str, job: dict, slot: int, status: dict) -> None:
    """Patch `status` into the job's if `slot` is not counted yet (`progressSlot`); the write carries the
    resourceVersion read, and on a conflict the job is read again and checked again."""
    name = job["metadata"]["name"]
    current = {"job": job}

    def attempt() -> None:
        if current["job"]["status"].get("progressSlot", -1) >= slot:
            return
        body = {"metadata": {"resourceVersion": current["job"]["metadata"]["resourceVersion"]}, "status": status}
        try:
            kube.patch(DL2Job.Status, name, body, namespace)
        except ApiError as exc:
            if exc.status == 409:
                current["job"] = kube.get(DL2Job, name, namespace)
            raise

    kube.on_conflict(attempt)
