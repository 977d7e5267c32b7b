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


class PerJobNet(nn.Module):
    """The same layers applied to every window job, each seeing the mean over the window's jobs too.

    Per job: h1 = act(W1 x_j); h_k = act(W_k [h_{k-1}, mean of h_{k-1} over the filled jobs]); the policy
    reads 3 logits (worker, PS, bundle) per job off the last layer and void off its mean; the value reads
    a scalar off that mean. Equivariant to the jobs' order, so what is learnt of a job type at one window
    position holds at every other.
    """

    def __init__(self, config: NetConfig, outputs: int):
        super().__init__()
        self.window, self.features = config.window, config.num_inputs // config.window
        self.kinds = feature_size(1, config.one_hot) - 5
        self.value = outputs == 1
        sizes = [self.features, *config.hidden]
        self.layers = nn.ModuleList(nn.Linear(sizes[0] if k == 0 else 2 * sizes[k], sizes[k + 1])
                                    for k in range(len(config.hidden)))
        self.activation = ACTIVATIONS[config.activation]()
        self.job_head = nn.Linear(sizes[-1], 3)
        self.pool_head = nn.Linear(sizes[-1], 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        jobs = x.view(-1, self.window, self.features)
        filled = (jobs[..., : self.kinds].abs().sum(-1, keepdim=True) > 0).float()
        count = filled.sum(1, keepdim=True).clamp(min=1.0)
        h = jobs
        for k, layer in enumerate(self.layers):
            if k > 0:
                pooled = (h * filled).sum(1, keepdim=True) / count
                h = torch.cat([h, pooled.expand_as(h)], dim=-1)
            h = self.activation(layer(h))
        pooled = ((h * filled).sum(1) / count.squeeze(1))
        if self.value:
            return self.pool_head(pooled)
        return torch.cat([self.job_head(h).flatten(1), self.pool_head(pooled)], dim=-1)


def policy_net(config: NetConfig) -> nn.Module:
    """Logits over the `3*window + 1` actions."""
    return PerJobNet(config, config.num_actions) if config.per_job else MLP(config, config.num_actions)


def value_net(config: NetConfig) -> nn.Module:
    """A scalar estimate of the slot's return."""
    return PerJobNet(config, 1) if config.per_job else MLP(config, 1)


def masked_log_probs(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the legal actions only (illegal ones get log-probability -inf)."""
    return torch.log_softmax(logits.masked_fill(~masks, float("-inf")), dim=-1)


__all__ = ["NetConfig", "NET_PRESETS", "net_config", "policy_net", "value_net", "masked_log_probs"]
