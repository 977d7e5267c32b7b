"""`dl2 bench --pollux-sl`: how fast SL pretraining of the Pollux world runs, with each minibatch cut to its
windows' filled slots (`dl2.learn.pollux.pretrain`) and run over the whole window as before, in one run.

Optimus+Oracle's decisions on the artifact's 1x-load workloads 1 and 2 (with `assign_one`), the 2x128
per-job network, one torch thread, minibatches of 512; per window (20 and 64): one epoch each way from the
same weights, seconds and decisions per second, and their ratio. The date, commit and the machine's load are
recorded beside: on the shared 2-core machine the numbers move with the load."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from dl2.bench_record import finish, stamp
from dl2.learn.pollux.demonstrations import teacher_decisions
from dl2.learn.pollux.model import PolluxNets, filled_slots, pollux_net_config
from dl2.learn.pollux.pretrain import imitation_loss, minibatches
from dl2.learn.pollux.settings import PolluxTrainSettings
from dl2.pollux.grid import POLLUX_DATA
from dl2.pollux.workload import read_workload
from dl2.workload.presets import POLLUX, get_preset

WINDOWS = (20, 64)
WORKLOADS = (1, 2)


def _epoch(nets: PolluxNets, inputs: torch.Tensor, masks: torch.Tensor, actions: torch.Tensor,
           batches: list[torch.Tensor], slots: np.ndarray | None) -> float:
    """Seconds of one epoch of Adam steps over `batches` (each cut to its filled slots, or the whole window)."""
    optimizer = torch.optim.Adam(nets.policy.parameters(), lr=1e-3)
    nets.policy.train()
    start = time.perf_counter()
    for idx in batches:
        used = None if slots is None else int(slots[idx.numpy()].max())
        loss = imitation_loss(nets, inputs[idx], masks[idx], actions[idx], used)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


def measure(window: int, seed: int = 0) -> dict:
    """One SL epoch at `window`, cut to the filled slots and over the whole window, from the same weights."""
    settings = PolluxTrainSettings(window=window)
    workloads = [read_workload(POLLUX_DATA / "workloads" / f"workload-{k}.csv") for k in WORKLOADS]
    states, masks, actions = teacher_decisions(workloads, get_preset(POLLUX), "optimus", "tuned", window, True)
    slots = filled_slots(states)
    torch.manual_seed(seed)
    nets = PolluxNets(pollux_net_config(settings))
    weights = {k: v.clone() for k, v in nets.policy.state_dict().items()}
    inputs, mask_t, action_t = nets.inputs(states), torch.from_numpy(masks), torch.from_numpy(actions)
    generator = torch.Generator().manual_seed(seed)
    cut = _epoch(nets, inputs, mask_t, action_t, minibatches(slots, settings.sl_batch_size, generator), slots)
    nets.policy.load_state_dict(weights)
    whole_batches = list(torch.split(torch.randperm(len(actions), generator=generator), settings.sl_batch_size))
    whole = _epoch(nets, inputs, mask_t, action_t, whole_batches, None)
    return {"decisions": int(len(actions)), "mean_filled_slots": float(slots.mean()),
            "cut_seconds": cut, "whole_window_seconds": whole, "cut_decisions_per_second": len(actions) / cut,
            "whole_window_decisions_per_second": len(actions) / whole, "speedup": whole / cut}


def pollux_sl_benchmark(out: str | Path | None = None) -> dict:
    """Every window of `WINDOWS`; written as JSON to `out` (published: data/published/bench/pollux_sl.json)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    results: dict = {**stamp(), "teacher": "optimus", "workloads": f"artifact's 1x-load workloads {list(WORKLOADS)}",
                     "hidden": list(PolluxTrainSettings().hidden), "batch_size": PolluxTrainSettings().sl_batch_size,
                     "torch_threads": 1, "windows": {}}
    try:
        for window in WINDOWS:
            results["windows"][str(window)] = measure(window)
    finally:
        torch.set_num_threads(previous)
    return finish(results, out)
