"""Policy and value networks: fully connected, configurable depth, width, activation and batch norm."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from dl2.errors import Dl2Error
from dl2.learn.features import feature_size

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "leaky_relu": nn.LeakyReLU, "elu": nn.ELU}


@dataclass(frozen=True)
class NetConfig:
    """Architecture of both networks; `window` jobs in, `3*window + 1` actions out."""

    window: int = 20
    hidden: tuple[int, ...] = (256, 256)
    activation: str = "relu"
    batch_norm: bool = False
    one_hot: bool = True  # job type one-hot (paper) or one integer feature (authors' code)

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise Dl2Error(f"activation: expected one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")
        if self.window <= 0 or not self.hidden or min(self.hidden) <= 0:
            raise Dl2Error(f"network: window and hidden sizes must be positive, got {self.window}, {self.hidden}")

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
}


def net_config(preset: str = "paper", **overrides) -> NetConfig:
    """A preset architecture with some fields replaced (e.g. `window=40`)."""
    if preset not in NET_PRESETS:
        raise Dl2Error(f"unknown network preset {preset!r} (known: {', '.join(NET_PRESETS)})")
    base = asdict(NET_PRESETS[preset])
    base.update({k: (tuple(v) if k == "hidden" else v) for k, v in overrides.items() if v is not None})
    return NetConfig(**base)


class MLP(nn.Module):
    """Linear -> [BatchNorm] -> activation per hidden layer, then a linear head."""

    def __init__(self, config: NetConfig, outputs: int):
        super().__init__()
        layers: list[nn.Module] = []
        width = config.num_inputs
        for size in config.hidden:
            layers.append(nn.Linear(width, size))
            if config.batch_norm:
                layers.append(nn.BatchNorm1d(size))
            layers.append(ACTIVATIONS[config.activation]())
            width = size
        layers.append(nn.Linear(width, outputs))
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def policy_net(config: NetConfig) -> MLP:
    """Logits over the `3*window + 1` actions."""
    return MLP(config, config.num_actions)


def value_net(config: NetConfig) -> MLP:
    """A scalar estimate of the slot's return."""
    return MLP(config, 1)


def masked_log_probs(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the legal actions only (illegal ones get log-probability -inf)."""
    return torch.log_softmax(logits.masked_fill(~masks, float("-inf")), dim=-1)


__all__ = ["NetConfig", "NET_PRESETS", "net_config", "policy_net", "value_net", "masked_log_probs"]
