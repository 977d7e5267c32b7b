"""Checkpoints of a Pollux-world training run: the networks' state dicts, the optimizer-free training
stage reached and the run's settings, as plain data (`torch.load(weights_only=True)` reads them back)."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from dl2.errors import Dl2Error
from dl2.learn.pollux.model import PolluxNets, pollux_net_config
from dl2.learn.pollux.settings import PolluxTrainSettings
from dl2.paths import atomic_path


def save_checkpoint(path: str | Path, nets: PolluxNets, settings: PolluxTrainSettings, stage: str, seed: int) -> Path:
    """Write the networks after `stage` ("pretrained" or "finetuned") atomically; the path."""
    path = Path(path)
    payload = {"stage": stage, "seed": seed, "settings": settings.to_dict(), "config": nets.config.to_dict(),
               **nets.state_dicts()}
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    return path


def load_checkpoint(path: str | Path) -> tuple[PolluxNets, PolluxTrainSettings, str, int]:
    """(networks, settings, stage, seed) of a checkpoint `save_checkpoint` wrote."""
    path = Path(path)
    if not path.is_file():
        raise Dl2Error(f"{path}: checkpoint not found")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        settings = PolluxTrainSettings.from_dict(payload["settings"])
        nets = PolluxNets(pollux_net_config(settings))
        nets.load_state_dicts(payload)
        return nets, settings, str(payload["stage"]), int(payload["seed"])
    except (KeyError, TypeError, RuntimeError, ValueError, pickle.UnpicklingError) as exc:
        raise Dl2Error(f"{path}: not a Pollux-world DL2 checkpoint ({exc})") from None
