"""The `executor` section: where the stages that fan out run their jobs (this machine, or a Ray cluster)."""

from __future__ import annotations

from dataclasses import dataclass

from dl2.config import Checked, bounded, choice
from dl2.errors import Dl2Error

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class Executor(Checked):
    """The `executor` section: where the stages that fan out (fine-tuning runs, ablation cells, evaluation)
    run their jobs. On `local`, each stage's own `workers` says how many at once."""

    kind: str = choice(*EXECUTORS)  # local (this machine's cores) | ray (a Ray cluster's)
    address: str | None  # ray: the cluster's address (None: $RAY_ADDRESS, else a Ray instance on this machine)
    cpus_per_job: float = bounded(above=0)  # ray: CPUs each job declares
    retries: int = bounded(at_least=0)  # ray: reruns of a job whose worker or node died
    cluster_actors: int = bounded(at_least=0)  # ray: PPO's parallel clusters split over this many actors (0: in the trainer)

    def __post_init__(self):
        super().__post_init__()
        if self.cluster_actors and self.kind != "ray":
            raise Dl2Error(f"cluster_actors: actors live on a Ray cluster, set kind: ray or cluster_actors: 0 (got {self.cluster_actors})")


LOCAL = Executor("local", None, 1.0, 0, 0)
