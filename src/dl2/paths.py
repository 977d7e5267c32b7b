"""Where things live: the repository root, shipped data, pipeline outputs."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent
DATA_DIR = PACKAGE_DIR.parents[1] / "data"
REFERENCE_DIR = DATA_DIR / "reference"
# the kind testbed's profiled speeds (`dl2 testbed profile`); DL2_TESTBED_DATA reads another profile (DVC tracks this one)
TESTBED_DIR = Path(os.environ["DL2_TESTBED_DATA"]) if os.environ.get("DL2_TESTBED_DATA") else DATA_DIR / "testbed"


def repo_root() -> Path:
    """The project root: `DL2_ROOT` if set, else the folder holding this checkout's `params.yaml`."""
    if "DL2_ROOT" in os.environ:
        return Path(os.environ["DL2_ROOT"]).resolve()
    return PACKAGE_DIR.parents[1]


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; move it into place only if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=target.suffix or ".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` so that readers see the old file or the whole new one."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """Write `data` as indented JSON, atomically."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_csv_atomic(path: str | os.PathLike, frame: Any) -> None:
    """Write a pandas DataFrame as CSV (no index), atomically."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)
