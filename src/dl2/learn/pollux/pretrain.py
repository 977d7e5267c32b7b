"""Supervised pretraining in the Pollux world: imitate a teacher's "+1 GPU" decisions (masked
cross-entropy), as DL2 pretrains on a heuristic's decisions before reinforcement learning.

A per-job network's cost grows with the window slots it runs, and most states fill few of them (the
window's jobs fill a prefix, `filled_slots`). So each minibatch runs only up to its fullest state's last
filled slot (`prefix_log_probs`: the same log-probabilities), and minibatches are drawn from decisions
whose windows fill alike: the decisions, in a random order, are grouped by their filled slots
(`SLOT_BUCKET` at a time), cut into minibatches within each group, and the minibatches shuffled."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from dl2.learn.pollux.demonstrations import learner_labelled
from dl2.learn.pollux.fast_greedy import FastGreedy
from dl2.learn.pollux.model import PolluxNets, filled_slots, prefix_log_probs
from dl2.learn.pollux.settings import PolluxTrainSettings
from dl2.pollux.workload import Workload
from dl2.workload.presets import PolluxPreset

SLOT_BUCKET = 8  # a minibatch's decisions fill the same 8 window slots at most (1-8, 9-16, ...)


def imitation_loss(nets: PolluxNets, inputs: torch.Tensor, masks: torch.Tensor, actions: torch.Tensor,
                   slots: int | None = None) -> torch.Tensor:
    """Mean negative log-likelihood of the teacher's actions under the masked policy (run on the first
    `slots` window slots, where every state is empty after them; all of them by default)."""
    log_probs = prefix_log_probs(nets.policy, inputs, masks, nets.config.window if slots is None else slots)
    return -log_probs.gather(1, actions[:, None]).mean()


def minibatches(slots: np.ndarray, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """One epoch's minibatches of decision indices: a random order, grouped by filled slots in buckets of
    `SLOT_BUCKET` (the order kept within a group), cut within groups, the minibatches then shuffled."""
    order = torch.randperm(len(slots), generator=generator)
    bucket = torch.from_numpy((np.asarray(slots, dtype=np.int64) + SLOT_BUCKET - 1) // SLOT_BUCKET)[order]
    grouped = order[torch.sort(bucket, stable=True).indices]
    batches = [batch for group in torch.split(grouped, torch.bincount(bucket).tolist()) if len(group)
               for batch in torch.split(group, batch_size)]
    return [batches[k] for k in torch.randperm(len(batches), generator=generator).tolist()]


@dataclass(frozen=True)
class Demonstrations:
    """Decisions to imitate as the networks read them: inputs, masks and actions as tensors, and each state's
    filled window slots (`filled_slots`)."""

    inputs: torch.Tensor
    masks: torch.Tensor
    actions: torch.Tensor
    slots: np.ndarray

    @classmethod
    def encode(cls, nets: PolluxNets, states: np.ndarray, masks: np.ndarray, actions: np.ndarray) -> Demonstrations:
        """Raw (state, mask, action) triples, encoded once."""
        return cls(nets.inputs(states), torch.from_numpy(masks), torch.from_numpy(actions.astype(np.int64)),
                   filled_slots(states))

    @classmethod
    def concatenate(cls, parts: Sequence[Demonstrations]) -> Demonstrations:
        """The parts' decisions one after another, in one copy."""
        return cls(torch.cat([p.inputs for p in parts]), torch.cat([p.masks for p in parts]),
                   torch.cat([p.actions for p in parts]), np.concatenate([p.slots for p in parts]))

    def __len__(self) -> int:
        return len(self.actions)


def pretrain(nets: PolluxNets, states: np.ndarray, masks: np.ndarray, actions: np.ndarray, settings: PolluxTrainSettings,
             generator: torch.Generator, progress: bool = False, desc: str = "SL pretraining") -> pd.DataFrame:
    """`settings.sl_epochs` epochs of minibatch Adam steps on the teacher's (state, mask, action) triples;
    one history row per epoch (epoch 0: before any step) with the loss and the greedy agreement."""
    return fit(nets, Demonstrations.encode(nets, states, masks, actions), settings, generator, progress, desc)


def fit(nets: PolluxNets, data: Demonstrations, settings: PolluxTrainSettings, generator: torch.Generator,
        progress: bool = False, desc: str = "SL pretraining", measure_start: bool = True) -> pd.DataFrame:
    """`settings.sl_epochs` epochs of SL on encoded `data`, a fresh Adam; one history row per epoch, and one
    before any step (epoch 0) if `measure_start`."""
    optimizer = torch.optim.Adam(nets.policy.parameters(), lr=settings.sl_lr)
    history = [{"epoch": 0, **agreement(nets, data.inputs, data.masks, data.actions, data.slots)}] if measure_start else []
    for epoch in tqdm(range(1, settings.sl_epochs + 1), desc=desc, unit="epoch", disable=not progress):
        nets.policy.train()
        for idx in minibatches(data.slots, settings.sl_batch_size, generator):
            loss = imitation_loss(nets, data.inputs[idx], data.masks[idx], data.actions[idx],
                                  int(data.slots[idx.numpy()].max()))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        history.append({"epoch": epoch, **agreement(nets, data.inputs, data.masks, data.actions, data.slots)})
    return pd.DataFrame(history)


def dagger(nets: PolluxNets, data: Demonstrations, workloads: Sequence[Workload], preset: PolluxPreset,
           settings: PolluxTrainSettings, generator: torch.Generator, progress: bool = False) -> pd.DataFrame:
    """`settings.dagger_rounds` rounds after SL on the teacher's own decisions `data`: the greedy learner runs
    each training workload, the teacher labels every state it reaches (`learner_labelled`), and
    `dagger_epochs` epochs of SL follow over `data` and every state labelled so far (each state encoded
    once). One history row per epoch, with its round."""
    history = []
    for round_ in range(1, settings.dagger_rounds + 1):
        decide = FastGreedy(nets)
        episodes = tqdm(workloads, desc=f"DAgger round {round_}: the learner's episodes", unit="workload",
                        disable=not progress)
        # each episode encoded as it ends, so only one episode's raw states are held at a time
        labelled = [Demonstrations.encode(nets, *learner_labelled(w, preset, settings.teacher, settings.variant,
                                                                  settings.window, decide, settings.assign_one)[:3])
                    for w in episodes]
        data = Demonstrations.concatenate([data, *labelled])
        del labelled
        rows = fit(nets, data, replace(settings, sl_epochs=settings.dagger_epochs), generator, progress,
                   desc=f"DAgger round {round_}: SL", measure_start=False)
        history.append(rows.assign(round=round_, decisions=len(data)))
    return pd.concat(history, ignore_index=True) if history else pd.DataFrame()


FORWARD_ROWS = 512  # decisions per forward pass: a pass over 8192 at once ran 2.7x slower a decision (memory)


@torch.no_grad()
def agreement(nets: PolluxNets, inputs: torch.Tensor, masks: torch.Tensor, actions: torch.Tensor,
              slots: np.ndarray | None = None) -> dict[str, float]:
    """The loss on every decision and the share where the greedy action is the teacher's (`FORWARD_ROWS`
    decisions a pass, each pass up to the fullest of its states' filled `slots`; all of them by default)."""
    nets.policy.eval()
    loss, same = 0.0, 0
    for start in range(0, len(actions), FORWARD_ROWS):
        end = start + FORWARD_ROWS
        used = nets.config.window if slots is None else int(slots[start:end].max())
        log_probs = prefix_log_probs(nets.policy, inputs[start:end], masks[start:end], used)
        taken = actions[start:end]
        loss -= float(log_probs.gather(1, taken[:, None]).sum())
        same += int((log_probs.argmax(-1) == taken).sum())
    count = max(len(actions), 1)
    return {"loss": loss / count, "agreement": same / count}
