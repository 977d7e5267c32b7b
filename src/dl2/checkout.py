"""Which code produced a result: the git commit of the checkout dl2 runs from."""

from __future__ import annotations

import subprocess
from pathlib import Path

from dl2.paths import repo_root


def git_commit(root: Path | None = None) -> str:
    """The commit checked out at `root` (this checkout by default), with `-dirty` if tracked files have
    uncommitted changes; `unknown` outside a git checkout."""
    try:
        root = root or repo_root()
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                               text=True).stdout
        return sha + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
