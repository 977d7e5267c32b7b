"""DL2's networks in the Pollux world: the shape comes from the world's features (one role, "+1 GPU", per
window job; the application one-hot names a job's kind), the policy acts greedily or by sampling."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from dl2.learn.architecture import NetConfig, net_config
from dl2.learn.nets import PerJobNet, masked_log_probs, policy_net, value_net
from dl2.learn.pollux.features import APP, encode, encoded_size
from dl2.learn.pollux.settings import PolluxTrainSettings
from dl2.pollux.apps import APP_NAMES

ROLES = 1  # a decision gives one more GPU to a window job


def pollux_net_config(settings: PolluxTrainSettings) -> NetConfig:
    """The network preset of `settings` in the Pollux world's shape: `window + 1` actions, the encoded
    features of each window job in, its application one-hot first."""
    return net_config(settings.network, window=settings.window, hidden=settings.hidden, roles=ROLES,
                      job_inputs=encoded_size(1), kinds=len(APP_NAMES))


def filled_slots(states: np.ndarray) -> np.ndarray:
    """Per raw window state (..., window, features), the slots up to its last filled one: the window's jobs
    fill a prefix (the first active jobs in arrival order), so the slots after these are empty."""
    filled = np.asarray(states)[..., APP] > 0
    return np.where(filled.any(-1), filled.shape[-1] - np.argmax(filled[..., ::-1], axis=-1), 0)


def prefix_log_probs(policy: nn.Module, inputs: torch.Tensor, masks: torch.Tensor, slots: int) -> torch.Tensor:
    """The masked log-probabilities of `masked_log_probs(policy(inputs), masks)`, computed on the first
    `slots` window slots only, where every state of the batch is empty after them (a per-job network's cost
    grows with the slots it runs; other networks run whole). Illegal actions' are -inf either way."""
    if not isinstance(policy, PerJobNet) or slots >= policy.window:
        return masked_log_probs(policy(inputs), masks)
    jobs = inputs.view(len(inputs), policy.window, policy.features)[:, :slots]
    kept = masked_log_probs(policy.forward_jobs(jobs), torch.cat([masks[:, :slots], masks[:, -1:]], dim=1))
    empty = torch.full((len(inputs), policy.window - slots), float("-inf"), dtype=kept.dtype)
    return torch.cat([kept[:, :slots], empty, kept[:, slots:]], dim=1)


class PolluxNets:
    """The policy and value networks of one run."""

    def __init__(self, config: NetConfig):
        self.config = config
        self.policy = policy_net(config)
        self.value = value_net(config)

    @staticmethod
    def inputs(states: np.ndarray) -> torch.Tensor:
        """Raw window states (..., window, features) as the networks' float32 inputs."""
        return torch.from_numpy(np.ascontiguousarray(encode(states), dtype=np.float32))

    @torch.no_grad()
    def log_probs(self, inputs: torch.Tensor, masks: np.ndarray) -> np.ndarray:
        """Masked log-probabilities of a batch of network inputs."""
        self.policy.eval()
        return masked_log_probs(self.policy(inputs), torch.from_numpy(masks)).numpy()

    @torch.no_grad()
    def values(self, inputs: torch.Tensor) -> np.ndarray:
        """Value estimates of a batch of network inputs."""
        self.value.eval()
        return self.value(inputs).squeeze(-1).numpy()

    def greedy(self) -> Callable[[np.ndarray, np.ndarray], int]:
        """decide(state, mask) -> the most likely legal action, for `DL2PolluxPolicy`: `log_probs`'s
        computation on one state, under inference mode and without its per-call set-up (a decision is one
        small forward pass, so the set-up cost as much as the pass)."""
        policy = self.policy

        def decide(state: np.ndarray, mask: np.ndarray) -> int:
            if policy.training:
                policy.eval()
            with torch.inference_mode():
                log_probs = masked_log_probs(policy(self.inputs(state[None])), torch.from_numpy(np.asarray(mask, dtype=bool)[None]))
            return int(np.argmax(log_probs.numpy()[0]))
        return decide

    def state_dicts(self) -> dict[str, dict]:
        return {"policy": self.policy.state_dict(), "value": self.value.state_dict()}

    def load_state_dicts(self, states: dict[str, dict]) -> None:
        self.policy.load_state_dict(states["policy"])
        self.value.load_state_dict(states["value"])

    def parameters(self) -> list[nn.Parameter]:
        return [*self.policy.parameters(), *self.value.parameters()]
