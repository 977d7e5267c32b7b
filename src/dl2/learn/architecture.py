"""The networks' architecture as data (`NetConfig`) and the presets `params.yaml`'s `learn.network` names; no
torch here, so settings are read without it (`dl2.learn.nets` builds the networks)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dl2.errors import Dl2Error
from dl2.learn.features import feature_size

ACTIVATIONS = {"relu": "ReLU", "tanh": "Tanh", "leaky_relu": "LeakyReLU", "elu": "ELU"}  # name: its torch.nn layer


@dataclass(frozen=True)
class NetConfig:
    """Architecture of both networks; `window` jobs in, `3*window + 1` actions out."""

    window: int = 20
    hidden: tuple[int, ...] = (256, 256)
    activation: str = "relu"
    batch_norm: bool = False
    one_hot: bool = True  # job type one-hot (paper) or one integer feature (authors' code)
    per_job: bool = False  # one network shared by every window position (dl2's addition) instead of one MLP

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise Dl2Error(f"activation: expected one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")
        if self.window <= 0 or not self.hidden or min(self.hidden) <= 0:
            raise Dl2Error(f"network: window and hidden sizes must be positive, got {self.window}, {self.hidden}")
        if self.per_job and self.batch_norm:
            raise Dl2Error("network: a per-job network has no batch norm; set batch_norm off or per_job off")

    @property
    def num_inputs(self) -> int:
        return feature_size(self.window, self.one_hot)

    @property
    def num_actions(self) -> int:
        return 3 * self.window + 1

    def to_dict(self) -> dict:
        return {**asdict(self), "hidden": list(self.hidden)}


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
