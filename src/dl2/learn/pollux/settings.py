"""The settings of one DL2 training run in the Pollux world (issue 35): the teacher and variant, the
network, the training workloads, SL pretraining, PPO fine-tuning and the greedy evaluation."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dl2.errors import Dl2Error
from dl2.learn.architecture import NET_PRESETS
from dl2.learn.pollux.decisions import VARIANTS

TEACHERS = ("optimus", "tiresias")
JOBS_AT_UNIT_LOAD = 160  # the artifact's workloads hold round(160 * load) jobs
SHIPPED_SEEDS = tuple(range(1, 9))  # the artifact's workloads: held out for evaluation


@dataclass(frozen=True)
class PolluxTrainSettings:
    """One run: SL on the teacher's decisions over generated workloads, PPO, greedy evaluation."""

    teacher: str = "optimus"
    variant: str = "tuned"
    window: int = 64  # the cluster's GPUs: as many jobs as could run at once (docs/pollux.md, "The window")
    assign_one: bool = True  # each interval first gives every window job one GPU (dl2.learn.pollux.decisions)
    network: str = "per-job"
    hidden: tuple[int, ...] = (128, 128)
    train_load: float = 1.0
    train_seeds: tuple[int, ...] = (101, 102, 103, 104)  # the Philly generator's seeds; never the shipped 1..8
    sl_epochs: int = 10
    sl_lr: float = 1e-3
    sl_batch_size: int = 512
    dagger_rounds: int = 0  # rounds of SL on the teacher's labels of the learner's own states (DAgger) after SL
    dagger_epochs: int = 2  # SL epochs per round, over every state labelled so far
    ppo_updates: int = 20
    num_envs: int = 8
    rollout_length: int = 256  # decisions per environment per update
    ppo_epochs: int = 4
    ppo_batch_size: int = 512
    lr: float = 3e-4
    clip: float = 0.2
    entropy: float = 0.01
    gamma: float = 0.99  # discount between intervals; decisions inside an interval are not discounted
    gae_lambda: float = 0.95
    eval_loads: tuple[str, ...] = ("1.0",)
    eval_workloads: tuple[int, ...] = (1, 2)
    threads: int = 1  # torch's threads: the weights depend on it, so a run pins it

    def __post_init__(self):
        if self.teacher not in TEACHERS:
            raise Dl2Error(f"teacher: expected one of {', '.join(TEACHERS)}, got {self.teacher!r}")
        if self.variant not in VARIANTS:
            raise Dl2Error(f"variant: expected one of {', '.join(VARIANTS)}, got {self.variant!r}")
        bad = sorted(set(self.eval_workloads) - set(SHIPPED_SEEDS))
        if bad:
            raise Dl2Error(f"eval_workloads: the artifact ships workloads 1..8, got {bad}")
        if self.network not in NET_PRESETS:
            raise Dl2Error(f"network: expected one of {', '.join(NET_PRESETS)}, got {self.network!r}")
        shipped = sorted(set(self.train_seeds) & set(SHIPPED_SEEDS))
        if shipped:
            raise Dl2Error(f"train_seeds: {shipped} generate the artifact's own workloads, which are held out for evaluation")
        if not self.train_seeds:
            raise Dl2Error("train_seeds: at least one training workload is needed")
        counts = {"window": self.window, "sl_batch_size": self.sl_batch_size, "num_envs": self.num_envs,
                  "rollout_length": self.rollout_length, "ppo_epochs": self.ppo_epochs,
                  "ppo_batch_size": self.ppo_batch_size, "threads": self.threads}
        for key, value in counts.items():
            if value <= 0:
                raise Dl2Error(f"{key}: must be positive, got {value}")
        for key in ("sl_epochs", "ppo_updates", "dagger_rounds", "dagger_epochs"):
            if getattr(self, key) < 0:
                raise Dl2Error(f"{key}: must be at least 0, got {getattr(self, key)}")
        if self.train_load <= 0:
            raise Dl2Error(f"train_load: must be positive, got {self.train_load}")

    @property
    def train_jobs(self) -> int:
        """Jobs per training workload, as many as the artifact's workloads hold at `train_load`."""
        return round(JOBS_AT_UNIT_LOAD * self.train_load)

    def to_dict(self) -> dict:
        """Plain data (lists for tuples), as a checkpoint stores it."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> PolluxTrainSettings:
        """`to_dict`'s data back (a checkpoint written before `assign_one` existed ran without it)."""
        data = {"assign_one": False, **data}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})
