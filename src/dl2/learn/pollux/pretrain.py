"""Supervised pretraining in the Pollux world: imitate a teacher's "+1 GPU" decisions (masked
cross-entropy), as DL2 pretrains on a heuristic's decisions before reinforcement learning."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from dl2.learn.nets import masked_log_probs
from dl2.learn.pollux.model import PolluxNets
from dl2.learn.pollux.settings import PolluxTrainSettings


def imitation_loss(nets: PolluxNets, inputs: torch.Tensor, masks: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the teacher's actions under the masked policy."""
    log_probs = masked_log_probs(nets.policy(inputs), masks)
    return -log_probs.gather(1, actions[:, None]).mean()


def pretrain(nets: PolluxNets, states: np.ndarray, masks: np.ndarray, actions: np.ndarray, settings: PolluxTrainSettings,
             generator: torch.Generator, progress: bool = False) -> pd.DataFrame:
    """`settings.sl_epochs` epochs of minibatch Adam steps on the teacher's (state, mask, action) triples;
    one history row per epoch (epoch 0: before any step) with the loss and the greedy agreement."""
    inputs, mask_t, action_t = nets.inputs(states), torch.from_numpy(masks), torch.from_numpy(actions.astype(np.int64))
    optimizer = torch.optim.Adam(nets.policy.parameters(), lr=settings.sl_lr)
    history = [{"epoch": 0, **agreement(nets, inputs, mask_t, action_t)}]
    for epoch in tqdm(range(1, settings.sl_epochs + 1), desc="SL pretraining", unit="epoch", disable=not progress):
        nets.policy.train()
        order = torch.randperm(len(action_t), generator=generator)
        for start in range(0, len(order), settings.sl_batch_size):
            idx = order[start:start + settings.sl_batch_size]
            loss = imitation_loss(nets, inputs[idx], mask_t[idx], action_t[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        history.append({"epoch": epoch, **agreement(nets, inputs, mask_t, action_t)})
    return pd.DataFrame(history)


FORWARD_ROWS = 512  # decisions per forward pass: a pass over 8192 at once ran 2.7x slower a decision (memory)


@torch.no_grad()
def agreement(nets: PolluxNets, inputs: torch.Tensor, masks: torch.Tensor, actions: torch.Tensor,
              chunk: int = 8192) -> dict[str, float]:
    """The loss on every decision and the share where the greedy action is the teacher's (summed `chunk`
    decisions at a time; the network passes `FORWARD_ROWS` at a time, row by row the same logits)."""
    nets.policy.eval()
    loss, same = 0.0, 0
    for start in range(0, len(actions), chunk):
        rows = inputs[start:start + chunk]
        logits = torch.cat([nets.policy(rows[k:k + FORWARD_ROWS]) for k in range(0, len(rows), FORWARD_ROWS)])
        log_probs = masked_log_probs(logits, masks[start:start + chunk])
        taken = actions[start:start + chunk]
        loss -= float(log_probs.gather(1, taken[:, None]).sum())
        same += int((log_probs.argmax(-1) == taken).sum())
    count = max(len(actions), 1)
    return {"loss": loss / count, "agreement": same / count}
