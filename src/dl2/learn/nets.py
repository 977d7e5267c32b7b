"""Policy and value networks: fully connected, configurable depth, width, activation and batch norm, built from
their architecture (`dl2.learn.architecture`)."""

from __future__ import annotations

import torch
from torch import nn

from dl2.learn.architecture import ACTIVATIONS, NetConfig


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
            layers.append(_activation(config))
            width = size
        layers.append(nn.Linear(width, outputs))
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class PerJobNet(nn.Module):
    """The same layers applied to every window job, each seeing the mean over the window's jobs too.

    Per job: h1 = act(W1 x_j); h_k = act(W_k [h_{k-1}, mean of h_{k-1} over the filled jobs]); the policy
    reads `roles` logits per job (PS/worker: worker, PS, bundle) off the last layer and void off its mean; the value reads
    a scalar off that mean. Equivariant to the jobs' order, so what is learnt of a job type at one window
    position holds at every other.
    """

    def __init__(self, config: NetConfig, outputs: int):
        super().__init__()
        self.window, self.features = config.window, config.inputs_per_job
        self.kinds = config.kind_inputs
        self.value = outputs == 1
        sizes = [self.features, *config.hidden]
        self.layers = nn.ModuleList(nn.Linear(sizes[0] if k == 0 else 2 * sizes[k], sizes[k + 1])
                                    for k in range(len(config.hidden)))
        self.activation = _activation(config)
        self.job_head = nn.Linear(sizes[-1], config.roles)
        self.pool_head = nn.Linear(sizes[-1], 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_jobs(x.view(-1, self.window, self.features))

    def forward_jobs(self, jobs: torch.Tensor) -> torch.Tensor:
        """`forward` on (batch, slots, features) inputs: the first `slots` of the window, where every slot
        after them is empty. Empty slots take no part in a filled job's outputs (the mean is over filled
        jobs), so the outputs are `forward`'s with the empty slots' logits left out (void still last)."""
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


def _activation(config: NetConfig) -> nn.Module:
    return getattr(nn, ACTIVATIONS[config.activation])()


def policy_net(config: NetConfig) -> nn.Module:
    """Logits over the `roles*window + 1` actions."""
    return PerJobNet(config, config.num_actions) if config.per_job else MLP(config, config.num_actions)


def value_net(config: NetConfig) -> nn.Module:
    """A scalar estimate of the slot's return."""
    return PerJobNet(config, 1) if config.per_job else MLP(config, 1)


def masked_log_probs(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the legal actions only (illegal ones get log-probability -inf)."""
    return torch.log_softmax(logits.masked_fill(~masks, float("-inf")), dim=-1)


