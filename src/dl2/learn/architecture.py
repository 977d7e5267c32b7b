"""The networks' architecture as data (`NetConfig`) and the presets `params.yaml`'s `learn.network` names; no
torch here, so settings are read without it (`dl2.learn.nets` builds the networks)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dl2.errors import Dl2Error
from dl2.learn.features import feature_size

ACTIVATIONS = {"relu": "ReLU", "tanh": "Tanh", "leaky_relu": "LeakyReLU", "elu": "ELU"}  # name: its torch.nn layer


# The world's shape, as the PS/worker world has it: 3 roles a decision adds (worker, PS, bundle).
PS_WORKER_ROLES = 3


@dataclass(frozen=True)
class NetConfig:
    """Architecture of both networks; `window` jobs in, `roles*window + 1` actions out.

    The world's shape (`roles`, `job_inputs`, `kinds`) defaults to the PS/worker world's, so that its
    networks, checkpoints and results are those it always had; another world passes its own (the caller
    that knows the world reads it from `dl2.worlds`' `LearningShape` and its features' encoding).
    """

    window: int = 20
    hidden: tuple[int, ...] = (256, 256)
    activation: str = "relu"
    batch_norm: bool = False
    one_hot: bool = True  # job type one-hot (paper) or one integer feature (authors' code)
    per_job: bool = False  # one network shared by every window position (dl2's addition) instead of one MLP
    roles: int = PS_WORKER_ROLES  # what one decision can add to a window job (logits per job)
    job_inputs: int | None = None  # network inputs per window job; None: the PS/worker features' size
    kinds: int | None = None  # the leading inputs of a job that name its type (all zero: an empty slot); None: PS/worker's

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise Dl2Error(f"activation: expected one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")
        if self.window <= 0 or not self.hidden or min(self.hidden) <= 0:
            raise Dl2Error(f"network: window and hidden sizes must be positive, got {self.window}, {self.hidden}")
        if self.per_job and self.batch_norm:
            raise Dl2Error("network: a per-job network has no batch norm; set batch_norm off or per_job off")
        if self.roles <= 0 or (self.job_inputs is not None and self.job_inputs <= 0) or \
                (self.kinds is not None and not 0 < self.kinds <= self.inputs_per_job):
            raise Dl2Error(f"network: roles, job_inputs and kinds must be positive (kinds at most job_inputs), got "
                           f"{self.roles}, {self.job_inputs}, {self.kinds}")

    @property
    def inputs_per_job(self) -> int:
        return feature_size(1, self.one_hot) if self.job_inputs is None else self.job_inputs

    @property
    def kind_inputs(self) -> int:
        """How many leading inputs of a job name its type."""
        return feature_size(1, self.one_hot) - 5 if self.kinds is None else self.kinds

    @property
    def num_inputs(self) -> int:
        return self.window * self.inputs_per_job

    @property
    def num_actions(self) -> int:
        return self.roles * self.window + 1

    def to_dict(self) -> dict:
        """The fields as plain data; the world's shape only where it is not the PS/worker default, so a
        PS/worker model's file holds what it always held."""
        out = {**asdict(self), "hidden": list(self.hidden)}
        for name, default in (("roles", PS_WORKER_ROLES), ("job_inputs", None), ("kinds", None)):
            if out[name] == default:
                del out[name]
        return out


NET_PRESETS = {
    "paper": NetConfig(hidden=(256, 256)),
    "code": NetConfig(hidden=(160, 160), batch_norm=True, one_hot=False),
    "per-job": NetConfig(hidden=(128, 128), per_job=True),
}


def net_config(preset: str = "paper", **overrides) -> NetConfig:
    """A preset architecture with some fields replaced (e.g. `window=40`)."""
    if preset not in NET_PRESETS:
        raise Dl2Error(f"unknown network preset {preset!r} (known: {', '.join(NET_PRESETS)})")
    base = asdict(NET_PRESETS[preset])
    base.update({k: (tuple(v) if k == "hidden" else v) for k, v in overrides.items() if v is not None})
    return NetConfig(**base)
