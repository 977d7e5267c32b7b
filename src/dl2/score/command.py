"""The work behind `dl2 score`: resolve, run, rank, write score.json and score.md, and return the table."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from dl2.paths import write_json_atomic, write_text_atomic
from dl2.score import board, builtins, suite
from dl2.score.candidate import resolve
from dl2.score.runs import run_suite
from dl2.workload.presets import PS_WORKER


def default_out(name: str) -> Path:
    return Path(f"score-{re.sub(r'[^A-Za-z0-9_.-]+', '-', name).strip('-')}")


def score(spec: str, out: Path | None = None, seeds: Sequence[int] | None = None, kind: bool = False,
          kind_folder: Path | None = None, progress: bool = True, scoreboard: Path = builtins.SCOREBOARD) -> str:
    """Score `spec` on the suite (and, with `kind`, the kind trace), rank it among the published built-ins
    (`scoreboard`), write `out`/score.json and `out`/score.md; returns the Markdown table."""
    builtin_runs, bounds = builtins.load(scoreboard)
    candidate = resolve(spec)
    if kind:
        from dl2.testbed import kind as testbed

        testbed.load(kind_folder)  # no testbed up: say so before the suite runs
    done = run_suite(candidate, tuple(seeds or suite.SEEDS), progress=progress)
    runs, absent, seconds, extra = done.runs, dict(done.absent), dict(done.seconds), {}
    if kind:
        from dl2.score.kind import score_on_kind

        if candidate.plays(PS_WORKER):
            start = time.perf_counter()
            replayed = score_on_kind(spec, candidate, kind_folder)
            seconds[suite.KIND_PART] = time.perf_counter() - start
            extra[suite.KIND_PART] = {"avg_jct_sim": float(replayed.avg_jct_sim.iloc[0])}
            runs = pd.concat([runs, replayed[runs.columns]], ignore_index=True)
        else:
            absent[suite.KIND_PART] = "the kind testbed runs PS/worker schedulers"
    reference = builtins.builtin_scores(builtin_runs, bounds)
    table = board.rank(board.summarize(runs.assign(policy=candidate.name, provenance="scored"), bounds), reference)
    out = out or default_out(candidate.name)
    markdown = board.candidate_markdown(candidate.name, table, absent, reference)
    result = board.candidate_json(candidate.name, candidate.kind, table, absent, seconds)
    for part, values in extra.items():
        result["parts"][part] |= values
    write_json_atomic(out / "score.json", result)
    write_text_atomic(out / "score.md", markdown)
    return markdown


def score_builtins(out: Path | None = None, progress: bool = True) -> str:
    """Publish the built-ins' scoreboard into `out` (default `data/published/scoreboard`); returns its Markdown."""
    files = builtins.publish(out or builtins.SCOREBOARD, progress)
    return files[-1].read_text()
