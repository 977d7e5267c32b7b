"""Supervised pretraining: imitate a teacher scheduler's decisions in DL2's action space (DESIGN §5)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from dl2.learn.agent import DL2Policy, masks_from_states
from dl2.learn.architecture import NetConfig
from dl2.learn.nets import masked_log_probs
from dl2.learn.rollout import run_policy
from dl2.learn.settings import PretrainConfig
from dl2.schedulers.builtin import simulate_builtin
from dl2.sim.scenario import Scenario
from dl2.workload.traces import Trace

# torch threads of the pretrain stage, whatever the machine's cores. The per-job network's CPU kernels
# round by torch's thread count: its pretrained weights differ with 1, 2 and 4 threads, and the validation
# JCTs of paper-long's pretrained policy by up to 2.8% between 1 and 2. Left at torch's default, the stage
# took the machine's core count. 2 is the count the published models were pretrained with (the development
# machine's two cores; torch runs 2 threads on fewer cores too). The ablation cells, `dl2 bench` and the
# tests pretrain on 1 thread, as they always have.
STAGE_THREADS = 2


def teacher_decisions(traces: Sequence[Trace], scenario: Scenario, teacher: str, window: int) -> tuple[np.ndarray, np.ndarray]:
    """The teacher's (raw state, action) pairs on every trace, concatenated."""
    states, actions = [], []
    for trace in traces:
        d = simulate_builtin(trace, teacher, scenario, record_window=window).decisions
        states.append(d.states)
        actions.append(d.actions)
    return np.concatenate(states), np.concatenate(actions)


def pretrain(train: Sequence[Trace], validation: Sequence[Trace], scenario: Scenario, net: NetConfig,
             config: PretrainConfig,
             on_epoch: Callable[[dict], None] | None = None) -> tuple[DL2Policy, pd.DataFrame]:
    """Train a policy by cross-entropy on the teacher's decisions; one history row per epoch.

    Each row: train/validation loss and accuracy, and the validation average JCT of the network
    (greedy and sampled) beside the teacher's. The weights depend on torch's thread count, which the
    caller pins (`STAGE_THREADS`).
    """
    torch.manual_seed(config.seed)
    policy = DL2Policy(net, scenario.preset.max_tasks, scenario.options.assign_bundle)
    x_train, y_train, m_train = _dataset(policy, train, scenario, config.teacher)
    x_val, y_val, m_val = _dataset(policy, validation, scenario, config.teacher)
    teacher_jct = float(np.mean([simulate_builtin(t, config.teacher, scenario).jct.mean() for t in validation]))
    optimizer = torch.optim.Adam(policy.net.parameters(), lr=config.lr)
    loss_fn = nn.NLLLoss()
    generator = torch.Generator().manual_seed(config.seed)
    history = []
    start = time.perf_counter()
    for epoch in range(1, config.epochs + 1):
        policy.net.train()
        order = torch.randperm(len(y_train), generator=generator)
        total, correct, seen = 0.0, 0, 0
        for batch in order.split(config.batch_size):
            if len(batch) < 2 and net.batch_norm:
                continue
            log_probs = masked_log_probs(policy.net(x_train[batch]), m_train[batch])
            loss = loss_fn(log_probs, y_train[batch])
            if config.label_smoothing > 0:
                legal = m_train[batch]
                spread = -(log_probs.masked_fill(~legal, 0.0).sum(-1) / legal.sum(-1)).mean()
                loss = (1 - config.label_smoothing) * loss + config.label_smoothing * spread
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch)
            correct += int((log_probs.argmax(-1) == y_train[batch]).sum())
            seen += len(batch)
        row = {"epoch": epoch, "train_loss": total / seen, "train_accuracy": correct / seen}
        row.update(_validation_loss(policy, x_val, y_val, m_val))
        if epoch % config.eval_every == 0 or epoch == config.epochs:
            row["val_jct_greedy"] = float(np.mean(run_policy(policy, validation, scenario, greedy=True).avg_jct))
            row["val_jct_sampled"] = float(np.mean(run_policy(policy, validation, scenario, seed=config.seed).avg_jct))
            row["val_jct_teacher"] = teacher_jct
        row["seconds"] = time.perf_counter() - start
        history.append(row)
        if on_epoch is not None:
            on_epoch(row)
    return policy, pd.DataFrame(history)


def _dataset(policy: DL2Policy, traces: Sequence[Trace], scenario: Scenario, teacher: str):
    states, actions = teacher_decisions(traces, scenario, teacher, policy.config.window)
    masks = masks_from_states(states, policy.max_tasks)
    return policy.inputs(states), torch.from_numpy(actions), torch.from_numpy(masks)


@torch.no_grad()
def _validation_loss(policy: DL2Policy, x, y, masks, chunk: int = 8192) -> dict:
    """Mean loss and accuracy over the validation decisions, `chunk` at a time: one pass over all of them
    at once holds every hidden activation (tens of GB on `paper-large` with a wide window)."""
    policy.net.eval()
    loss, correct = 0.0, 0
    for start in range(0, len(y), chunk):
        part = slice(start, start + chunk)
        log_probs = masked_log_probs(policy.net(x[part]), masks[part])
        loss += float(nn.functional.nll_loss(log_probs, y[part], reduction="sum"))
        correct += int((log_probs.argmax(-1) == y[part]).sum())
    return {"val_loss": loss / len(y), "val_accuracy": correct / len(y)}
