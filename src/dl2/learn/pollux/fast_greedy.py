"""Greedy decisions without a torch call per decision, identical to `PolluxNets.greedy`'s.

A greedy evaluation asks for one decision at a time, and a per-job network's forward pass in torch costs
~25 small operator calls (~150-300 us on this host) for a window of 20 jobs. Here the same pass runs in
numpy, in float64 from the same float32 weights, so its logits lie within a small error of torch's float32
ones. Where the most likely legal action leads the runner-up by more than the margin (`MARGIN` times the
largest logit's size, at least 1) torch's float32 pass picks the same action, since torch's error is far
below the margin (at most 1e-6 of the largest logit, measured for a trained 2x128 network and the tests'
2x32 one), and the masked log-softmax subtracts one constant from every logit, keeping their order.
Otherwise, a near tie, the decision is asked of torch itself (`PolluxNets.greedy`), so every decision is
the one torch makes. Networks other than the per-job one with ReLU or tanh are asked of torch every time.
The pass runs up to the window's last filled slot (`filled_slots`): empty slots take no part in a filled
job's logits, and their own are always masked.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dl2.learn.nets import PerJobNet
from dl2.learn.pollux.features import encode
from dl2.learn.pollux.model import PolluxNets, filled_slots

MARGIN = 1e-3  # relative to the largest logit's size (at least 1)

_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"relu": lambda h: np.maximum(h, 0.0), "tanh": np.tanh}


def _float64(layer) -> tuple[np.ndarray, np.ndarray]:
    """A linear layer's (weight transposed, bias) in float64, copies (training on cannot change them)."""
    return layer.weight.detach().double().numpy().T.copy(), layer.bias.detach().double().numpy().copy()


class FastGreedy:
    """decide(state, mask) -> the action `nets.greedy()` decides; `asked_torch` counts the near ties."""

    def __init__(self, nets: PolluxNets):
        self.torch_decide = nets.greedy()
        self.asked_torch = 0
        self.decisions = 0
        policy = nets.policy
        activation = _ACTIVATIONS.get(nets.config.activation)
        self.supported = isinstance(policy, PerJobNet) and activation is not None
        if not self.supported:
            return
        self.activation = activation
        self.window, self.features, self.kinds = policy.window, policy.features, policy.kinds
        self.roles = policy.job_head.out_features
        self.layers = [_float64(layer) for layer in policy.layers]
        self.job_head, self.pool_head = _float64(policy.job_head), _float64(policy.pool_head)

    def logits(self, state: np.ndarray) -> np.ndarray:
        """The policy's logits of one raw window state, in float64 (PerJobNet.forward, one state), run up to
        the last filled slot only: the logits of the empty slots after it are left NaN (always masked)."""
        slots = int(filled_slots(state))
        jobs = encode(state[:slots]).astype(np.float64).reshape(slots, self.features)
        filled = (np.abs(jobs[:, : self.kinds]).sum(-1, keepdims=True) > 0).astype(np.float64)
        count = max(filled.sum(), 1.0)
        h = jobs
        for k, (weight, bias) in enumerate(self.layers):
            if k > 0:
                pooled = (h * filled).sum(0, keepdims=True) / count
                h = np.concatenate([h, np.broadcast_to(pooled, h.shape)], axis=-1)
            h = self.activation(h @ weight + bias)
        pooled = (h * filled).sum(0) / count
        job_logits = (h @ self.job_head[0] + self.job_head[1]).ravel()
        out = np.full(self.window * self.roles + 1, np.nan)
        out[: len(job_logits)], out[-1] = job_logits, (pooled @ self.pool_head[0] + self.pool_head[1])[0]
        return out

    def __call__(self, state: np.ndarray, mask: np.ndarray) -> int:
        self.decisions += 1
        if not self.supported:
            self.asked_torch += 1
            return self.torch_decide(state, mask)
        raw = self.logits(state)
        logits = np.where(mask, raw, -np.inf)
        best = int(np.argmax(logits))
        runner_up = np.max(np.delete(logits, best))
        if logits[best] - runner_up > MARGIN * max(1.0, np.nanmax(np.abs(raw))):
            return best
        self.asked_torch += 1
        return self.torch_decide(state, mask)
