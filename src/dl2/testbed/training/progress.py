"""The progress file `<state>/progress.json` (format in the package docstring) and atomic file writes.

Torch-free, so that a scheduler can read progress without importing torch.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

PROGRESS = "progress.json"


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` by `data` in one step: write a temporary file beside it, fsync, rename it over `path`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def write_progress(state_dir: Path, record: dict[str, Any]) -> None:
    """Write `<state_dir>/progress.json` atomically."""
    atomic_write(state_dir / PROGRESS, (json.dumps(record, indent=1) + "\n").encode())


def read_progress(state_dir: str | Path) -> dict[str, Any] | None:
    """The job's last progress record, or None before its first checkpoint."""
    try:
        return json.loads((Path(state_dir) / PROGRESS).read_text())
    except FileNotFoundError:
        return None
