"""The commit a result records: the checkout's, marked `-dirty` when tracked files changed."""

from __future__ import annotations

import subprocess

from dl2.checkout import git_commit


def _git(*args: str, cwd) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def test_a_clean_checkout_gives_its_commit_and_an_edited_one_is_dirty(tmp_path):
    _git("init", "-q", cwd=tmp_path)
    (tmp_path / "a.txt").write_text("one\n")
    _git("add", "a.txt", cwd=tmp_path)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one", cwd=tmp_path)
    head = _git("rev-parse", "HEAD", cwd=tmp_path)
    assert git_commit(tmp_path) == head
    (tmp_path / "untracked.txt").write_text("ignored\n")
    assert git_commit(tmp_path) == head, "untracked files do not make a checkout dirty"
    (tmp_path / "a.txt").write_text("two\n")
    assert git_commit(tmp_path) == f"{head}-dirty"


def test_a_folder_outside_git_is_unknown(tmp_path):
    assert git_commit(tmp_path) == "unknown"
