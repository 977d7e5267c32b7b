"""`dl2 testbed check` without a cluster: the per-policy table (the testbed's average and spread, the simulator's
error on the average and per job, the ranks), its verdict, and the command's refusals of bad input. The check on
real pods is in tests/kind/test_check.py."""

from __future__ import annotations

import pandas as pd
import pytest

from dl2.cli import main
from dl2.sim_to_real import check, replay


def jobs(runs: dict[str, list[list[float]]], sim: dict[str, list[float]]) -> pd.DataFrame:
    """Job rows of one trace: per policy, per repeat, each job's JCT on kind; `sim`, each job's in the simulator."""
    return pd.DataFrame([{"policy": p, "seed": -1, "trace": 0, "repeat": r, "job_id": j + 1, "model": "wlm", "epochs": 10.0,
                          "jct_testbed": kind, "jct_sim": sim[p][j]}
                         for p, repeats in runs.items() for r, jcts in enumerate(repeats) for j, kind in enumerate(jcts)],
                        columns=replay.JOB_COLUMNS)


def test_a_simulator_close_to_kind_passes():
    table = check.check_table(jobs({"fifo": [[4.0, 6.0], [5.0, 7.0]], "drf": [[2.0, 4.0], [3.0, 3.0]]},
                                   {"fifo": [4.4, 6.6], "drf": [2.8, 3.2]}))
    fifo, drf = (table.set_index("policy").loc[p] for p in ("fifo", "drf"))
    assert fifo.kind == 5.5 and fifo.runs == 2 and fifo.sim == pytest.approx(5.5)
    assert fifo.kind_sd == pytest.approx(pd.Series([5.0, 6.0]).std()), "the sd of a run's average over repeats"
    assert drf.error == pytest.approx(0.0) and fifo.within and drf.within
    # fifo's jobs: kind means 4.5 and 6.5 against 4.4 and 6.6
    assert fifo.median_job_error == pytest.approx((0.1 / 4.5 + 0.1 / 6.5) / 2)
    assert (fifo.rank_kind, drf.rank_kind) == (2, 1) == (fifo.rank_sim, drf.rank_sim)
    assert check.verdict(table)["passed"]


def test_each_criterion_fails_on_its_own():
    off = check.check_table(jobs({"fifo": [[4.0, 6.0]], "drf": [[2.0, 4.0]]}, {"fifo": [6.0, 6.0], "drf": [3.0, 3.0]}))
    verdict = check.verdict(off)
    assert not verdict["every_policy_within"] and verdict["largest_error"] == pytest.approx(0.2) and not verdict["passed"]
    swapped = check.check_table(jobs({"fifo": [[4.0, 6.0]], "drf": [[5.0, 6.0]]}, {"fifo": [5.0, 5.5], "drf": [4.5, 5.5]}))
    verdict = check.verdict(swapped)
    assert verdict["every_policy_within"] and not verdict["same_ranking"] and not verdict["passed"]
    # averages right, every job wrong by 50%: the per-job criterion alone fails
    spread = check.check_table(jobs({"fifo": [[2.0, 6.0]]}, {"fifo": [3.0, 5.0]}))
    verdict = check.verdict(spread)
    assert verdict["every_policy_within"] and verdict["same_ranking"] and not verdict["median_job_error_below_limit"]
    assert "passed: False" in check.markdown(spread, verdict)
    assert "resizes on kind: whole restarts" in check.markdown(spread, verdict | {"elastic": False})
    assert "surviving pods rejoin" in check.markdown(spread, verdict | {"elastic": True})


def test_a_start_s_lost_seconds_are_its_started_slots_less_what_they_trained_at_the_table_s_speed():
    row = {"policy": "drf", "seed": -1, "trace": 0, "repeat": 0, "model": "wlm", "seconds": 20.0}
    slots = pd.DataFrame([  # job 1: (1, 1) trains nothing in slot 0 and half a slot in slot 1, then runs; resized in slot 4
        {**row, "slot": 0, "job_id": 1, "num_ps": 1, "num_workers": 1, "epochs_trained": 0.0, "epochs_predicted": 10.0, "started": True},
        {**row, "slot": 1, "job_id": 1, "num_ps": 1, "num_workers": 1, "epochs_trained": 5.0, "epochs_predicted": 10.0, "started": True},
        {**row, "slot": 2, "job_id": 1, "num_ps": 1, "num_workers": 1, "epochs_trained": 10.0, "epochs_predicted": 10.0, "started": False},
        {**row, "slot": 3, "job_id": 1, "num_ps": 2, "num_workers": 2, "epochs_trained": 15.0, "epochs_predicted": 20.0, "started": True},
        {**row, "slot": 4, "job_id": 1, "num_ps": 2, "num_workers": 2, "epochs_trained": 20.0, "epochs_predicted": 20.0, "started": False},
        # job 2 waits (no tasks), then starts in the slot it finishes in: left out
        {**row, "slot": 0, "job_id": 2, "num_ps": 0, "num_workers": 0, "epochs_trained": 0.0, "epochs_predicted": 0.0, "started": True},
        {**row, "slot": 1, "job_id": 2, "num_ps": 1, "num_workers": 1, "epochs_trained": 1.0, "epochs_predicted": 1.0, "started": True},
    ], columns=replay.SLOT_COLUMNS)
    starts = check.startup_seconds(slots)
    assert starts[["job_id", "num_ps", "num_workers", "slots"]].values.tolist() == [[1, 1, 1, 2], [1, 2, 2, 1]]
    assert starts.seconds.tolist() == pytest.approx([30.0, 5.0])


@pytest.mark.parametrize("argv, says", [
    (["--policies", "lottery"], "--policies"),
    (["--traces", "0"], "--traces"),
    (["--traces", "999"], "validation traces"),
    (["--model", "nolabel.pt"], "LABEL=PATH"),
    (["--preset", "pollux"], "pollux"),
    (["--restart-seconds", "-1"], "--restart-seconds"),
])
def test_bad_input_is_refused_before_any_replay(argv, says, capsys, tmp_path):
    assert main(["testbed", "check", "--folder", str(tmp_path / "no-testbed"), "--out", str(tmp_path / "out"), *argv]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "out").exists(), "nothing written"


@pytest.mark.parametrize("mode", [[], ["--whole-restarts"]])
def test_without_a_testbed_the_check_says_how_to_start_one(mode, capsys, tmp_path):
    argv = ["testbed", "check", "--folder", str(tmp_path / "no-testbed"), "--out", str(tmp_path / "out"), "--traces", "1", *mode]
    assert main(argv) == 2
    assert "testbed up --kind" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
