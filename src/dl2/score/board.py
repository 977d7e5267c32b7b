"""A score: per part of the suite, a policy's average JCT, its spread over traces and seeds, its ratio to each
bound and its rank among the built-ins of that world; as a table, JSON and Markdown."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from dl2.score import suite

BOUNDS = {"contention_free": "contention-free bound", "capacity": "capacity-aware bound"}  # bounds.csv column: label
SCORE_COLUMNS = ["part", "policy", "provenance", "avg_jct", "sd_traces", "sd_seeds", "runs", *BOUNDS,
                 *(f"ratio_{b}" for b in BOUNDS), "rank", "of"]
DISPLAY = {"ps-worker": {"fifo": "FIFO", "srtf": "SRTF", "drf": "DRF", "tetris": "Tetris", "optimus": "Optimus", "dl2": "DL2"},
           "pollux": {"optimus": "Optimus+Oracle", "tiresias": "Tiresias", "pollux": "Pollux"}}


def summarize(runs: pd.DataFrame, bounds: pd.DataFrame) -> pd.DataFrame:
    """Per (policy, part) of `runs` (columns policy, provenance, part, trace, seed, avg_jct): the mean average
    JCT over its runs, the sd over traces of the per-trace means and over seeds of the per-seed means (NaN with
    one seed), and each bound's mean over the part's traces (`bounds`: part, trace and one column per bound of
    `BOUNDS`; NaN where the part has none) with the ratio of the two means, as `evaluate` reports it."""
    rows = []
    for (policy, part), group in runs.groupby(["policy", "part"], sort=False):
        per_trace = group.groupby("trace", sort=False).avg_jct.mean()
        per_seed = group.groupby("seed").avg_jct.mean()
        row = {"part": part, "policy": policy, "provenance": group.provenance.iloc[0], "avg_jct": float(group.avg_jct.mean()),
               "sd_traces": float(per_trace.std()), "sd_seeds": float(per_seed.std()) if len(per_seed) > 1 else math.nan,
               "runs": len(group)}
        mine = bounds[(bounds.part == part) & bounds.trace.isin(per_trace.index)]
        for bound in BOUNDS:
            mean = float(mine[bound].mean()) if bound in mine and len(mine) == len(per_trace) else math.nan
            row[bound], row[f"ratio_{bound}"] = mean, row["avg_jct"] / mean
        rows.append(row)
    return pd.DataFrame(rows, columns=SCORE_COLUMNS[:-2])


def rank(table: pd.DataFrame, builtins: pd.DataFrame) -> pd.DataFrame:
    """`table` (from `summarize`) with each row's rank (1: lowest average JCT) among the built-ins of its part
    (`builtins`, from `summarize`; a built-in of the row's own name is the row itself) and how many it ranks among."""
    ranks, counts = [], []
    for row in table.itertuples():
        if not (builtins.part == row.part).any():  # no built-in ran this part (the kind trace)
            ranks.append(None)
            counts.append(None)
            continue
        others = builtins[(builtins.part == row.part) & (builtins.policy != row.policy)].avg_jct.to_numpy()
        ranks.append(1 + int(np.sum(others < row.avg_jct)))
        counts.append(len(others) + 1)
    return table.assign(rank=pd.array(ranks, dtype="Int64"), of=pd.array(counts, dtype="Int64"))


def world_of_part(part: str) -> str:
    return part.split("/")[0]


def display(part: str, policy: str) -> str:
    """A policy as the scoreboard names it in `part`'s world."""
    return DISPLAY[world_of_part(part)].get(policy, policy)


def best(builtins: pd.DataFrame, part: str) -> str:
    """The best built-in of `part` and its average JCT, as text."""
    mine = builtins[builtins.part == part]
    if mine.empty:
        return ""
    top = mine.loc[mine.avg_jct.idxmin()]
    return f"{display(part, top.policy)} {top.avg_jct:.3f}"


def _number(value: float, digits: int = 3) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _bound_cells(row: Mapping) -> list[str]:
    cells = []
    for bound in BOUNDS:
        if math.isnan(row[bound]):
            cells += ["no bound", ""]
        else:
            cells += [_number(row[bound]), _number(row[f"ratio_{bound}"])]
    return cells


HEADER = ["avg JCT", "sd traces", "sd seeds", "runs", "contention-free bound", "×", "capacity bound", "×"]


def candidate_markdown(name: str, table: pd.DataFrame, absent: Mapping[str, str], builtins: pd.DataFrame) -> str:
    """One scheduler's score: a row per part of the suite (scored, or absent and why)."""
    lines = [f"# Score of {name} (suite version {suite.SUITE_VERSION})", "",
             "PS/worker JCTs in slots, Pollux-world JCTs in seconds; × is the ratio of the mean JCT to the bound's mean.", "",
             "| part | " + " | ".join(HEADER) + " | rank among built-ins | best built-in |",
             "|---" * (len(HEADER) + 3) + "|"]
    rows = {row["part"]: row for row in table.to_dict("records")}
    for part in (*suite.PARTS, suite.KIND_PART):
        if part in rows:
            row = rows[part]
            cells = [_number(row["avg_jct"]), _number(row["sd_traces"]), _number(row["sd_seeds"]), str(row["runs"]),
                     *_bound_cells(row), _rank(row), best(builtins, part)]
        elif part in absent:
            cells = [f"absent: {absent[part]}", *[""] * (len(HEADER) - 1), "", best(builtins, part)]
        else:
            continue
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def board_markdown(builtins: pd.DataFrame) -> str:
    """The published scoreboard: per part, the built-ins by rank, with where each number comes from."""
    lines = [f"# Scoreboard (suite version {suite.SUITE_VERSION})", "",
             "PS/worker JCTs in slots, Pollux-world JCTs in seconds; × is the ratio of the mean JCT to the bound's mean.", ""]
    for part in suite.PARTS:
        mine = builtins[builtins.part == part].sort_values(["rank", "policy"])
        if mine.empty:
            continue
        lines += [f"## {part}", "", "| rank | policy | " + " | ".join(HEADER) + " | provenance |", "|---" * (len(HEADER) + 3) + "|"]
        for row in mine.to_dict("records"):
            cells = [str(row["rank"]), display(part, row["policy"]), _number(row["avg_jct"]), _number(row["sd_traces"]),
                     _number(row["sd_seeds"]), str(row["runs"]), *_bound_cells(row), row["provenance"]]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _rank(row: Mapping) -> str:
    return "no built-ins here" if pd.isna(row["rank"]) else f"{row['rank']} of {row['of']}"


def _clean(value):
    if value is pd.NA:
        return None
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 6)
    return value.item() if hasattr(value, "item") else value


def candidate_json(name: str, kind: str, table: pd.DataFrame, absent: Mapping[str, str], seconds: Mapping[str, float]) -> dict:
    """score.json of one scheduler: the suite, and per part its numbers or why it is absent."""
    parts: dict[str, dict] = {}
    rows = {row["part"]: row for row in table.to_dict("records")}
    for part in (*suite.PARTS, suite.KIND_PART):
        if part in rows:
            values = {k: _clean(v) for k, v in rows[part].items() if k not in ("part", "policy", "provenance")}
            parts[part] = {"status": "scored", **values, "seconds": round(seconds.get(part, math.nan), 3)}
        elif part in absent:
            parts[part] = {"status": "absent", "why": absent[part]}
    return {"suite": suite.describe(), "scheduler": name, "kind": kind, "parts": parts}


def board_json(builtins: pd.DataFrame) -> dict:
    """The published scoreboard's score.json: per part and built-in, its numbers and provenance."""
    parts: dict[str, dict] = {}
    for row in builtins.to_dict("records"):
        values = {k: _clean(v) for k, v in row.items() if k not in ("part", "policy")}
        parts.setdefault(row["part"], {})[row["policy"]] = values
    return {"suite_version": suite.SUITE_VERSION, "parts": parts}
