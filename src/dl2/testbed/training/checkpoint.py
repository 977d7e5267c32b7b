"""A job's checkpoint, and the ownership of its state folder.

Every file is written atomically (a temporary file in the same folder, fsync, `os.replace`), so a reader,
or a restart after SIGKILL, sees either the previous version or the new one, never a torn one. Only the
owner writes: PS 0 of the configuration that holds the `owner.lock` flock (held from before the rendezvous
until the process exits; the kernel releases it when the process dies, also on SIGKILL). A new
configuration's PS 0 waits for the lock, so it loads the checkpoint the previous configuration wrote on
its way out, and it records its generation in `owner.json`; a process whose generation is older than the
recorded one refuses to start.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import itertools
import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from dl2.errors import Dl2Error
from dl2.testbed.training.progress import PROGRESS, atomic_write

CHECKPOINT, OWNER, OWNER_LOCK = "checkpoint.pt", "owner.json", "owner.lock"
FORMAT = "dl2-training-checkpoint/1"
_held: dict[Path, int] = {}  # state folder -> the descriptor holding its lock, in this process


@dataclass
class Checkpoint:
    """What a restart needs: whole parameter tensors and per-tensor optimizer state by name, and the counts."""

    job: str
    model: str
    params: dict[str, torch.Tensor]
    optimizer: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # per tensor, e.g. {"momentum_buffer": ...}
    steps: int = 0  # acknowledged worker batches (one gradient each)
    updates: int = 0  # optimizer updates the PS applied (sync: one per W steps; async: one per step)
    loss: float | None = None  # mean training loss of the batches of the last checkpoint that acknowledged any
    first_loss: float | None = None  # the same at the job's first such checkpoint
    train_seconds: float = 0.0  # seconds of training over every configuration so far
    done: bool = False
    generation: int = -1  # the configuration that wrote it
    num_ps: int = 0
    num_workers: int = 0
    mode: str = ""

    def save(self, state_dir: Path) -> None:
        """Write `<state_dir>/checkpoint.pt` atomically."""
        buf = io.BytesIO()
        torch.save({"format": FORMAT, **asdict(self)}, buf)
        atomic_write(state_dir / CHECKPOINT, buf.getvalue())


def progress_record(ckpt: Checkpoint, steps_per_epoch: int, target_epochs: float, steps_per_second: float,
                    start_step: int) -> dict[str, Any]:
    """The progress file's content once `ckpt` is written by the configuration that started at `start_step`."""
    def num(x: float | None) -> float | None:
        return None if x is None or not math.isfinite(x) else round(x, 6)
    return {"job": ckpt.job, "model": ckpt.model, "steps": ckpt.steps, "updates": ckpt.updates, "steps_per_epoch": steps_per_epoch,
            "epochs": round(ckpt.steps / steps_per_epoch, 6), "target_epochs": target_epochs, "done": ckpt.done,
            "loss": num(ckpt.loss), "first_loss": num(ckpt.first_loss), "generation": ckpt.generation, "num_ps": ckpt.num_ps,
            "num_workers": ckpt.num_workers, "mode": ckpt.mode, "start_step": start_step, "steps_per_second": num(steps_per_second),
            "train_seconds": round(ckpt.train_seconds, 3), "time": round(time.time(), 3)}


def load_checkpoint(state_dir: Path, job: str, model: str) -> Checkpoint | None:
    """The checkpoint in `state_dir` (None if there is none yet); one of another job or model is an error."""
    path = state_dir / CHECKPOINT
    if not path.exists():
        return None
    try:
        data = torch.load(path, weights_only=True)
    except Exception as exc:
        raise Dl2Error(f"{path}: not a readable training checkpoint ({exc}); move it away to start the job over") from None
    if not isinstance(data, dict) or data.pop("format", None) != FORMAT:
        raise Dl2Error(f"{path}: not a {FORMAT} file; move it away to start the job over")
    if (data["job"], data["model"]) != (job, model):
        raise Dl2Error(f"{path} belongs to job {data['job']!r} (model {data['model']}), not to job {job!r} (model {model}); "
                       "give each job its own --state folder")
    return Checkpoint(**data)


def params_digest(params: dict[str, torch.Tensor]) -> str:
    """A short SHA-256 of parameter tensors by name (order-free): equal digests, equal parameters."""
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def owner_generation(state_dir: Path) -> int | None:
    """The generation recorded by the last configuration that owned `state_dir` (None if none did)."""
    try:
        return int(json.loads((state_dir / OWNER).read_text())["generation"])
    except FileNotFoundError:
        return None


def check_not_stale(state_dir: Path, generation: int) -> None:
    """Refuse to start a process whose configuration is older than the folder's owner."""
    owner = owner_generation(state_dir)
    if owner is not None and owner > generation:
        raise Dl2Error(f"generation {generation} is stale: generation {owner} of this job has started since "
                       f"({state_dir / OWNER}); start processes with the current --generation")


def claim_ownership(state_dir: Path, generation: int, stop: threading.Event, timeout: float, log: Callable[[str], None]) -> bool:
    """Make this process the folder's only writer for `generation`: wait (polling, so `stop` is honoured) for the
    `owner.lock` flock, then record the generation in `owner.json`. The lock's descriptor stays open, so the lock
    is held until the process ends (or `release_ownership`); a process that holds it already (an elastic job's PS 0
    that stays PS 0 in the next configuration) keeps it. False if `stop` was set first; a generation not newer
    than the last owner's is an error. `log` hears once if it has to wait."""
    key = state_dir.resolve()
    if key in _held:
        return _record_owner(state_dir, generation)
    fd = os.open(state_dir / OWNER_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout
    for attempt in itertools.count():
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt == 0:
                log(f"waiting for generation {owner_generation(state_dir)} to let go of {state_dir}")
            if stop.is_set() or time.monotonic() > deadline:
                os.close(fd)
                if stop.is_set():
                    return False
                raise TimeoutError(f"another configuration of this job still owns {state_dir} after {timeout:.0f} s "
                                   f"(owner.json: generation {owner_generation(state_dir)})") from None
            time.sleep(0.1)
    _held[key] = fd
    return _record_owner(state_dir, generation)


def release_ownership(state_dir: Path) -> None:
    """Let go of the folder's lock if this process holds it (its next configuration's PS 0 is another process)."""
    fd = _held.pop(state_dir.resolve(), None)
    if fd is not None:
        os.close(fd)


def _record_owner(state_dir: Path, generation: int) -> bool:
    """Record `generation` as the owner's, holding the lock (released on an error)."""
    owner = owner_generation(state_dir)
    if owner is not None and owner >= generation:
        release_ownership(state_dir)
        raise Dl2Error(f"generation {generation} was already used or is stale: generation {owner} owned this job last "
                       f"({state_dir / OWNER}); give each new configuration a larger --generation")
    for name in (CHECKPOINT, PROGRESS, OWNER):  # a previous owner's write cut short by SIGKILL (not the controller's plan)
        for leftover in state_dir.glob(f".{name}.tmp-*"):
            leftover.unlink(missing_ok=True)
    atomic_write(state_dir / OWNER, json.dumps({"generation": generation, "pid": os.getpid(), "host": os.uname().nodename,
                                                "since": round(time.time(), 3)}).encode())
    return True
