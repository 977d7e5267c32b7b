"""The kind testbed's data, without a cluster: the profile's tables (speed rows, spread, the configurations a
testbed allows), the `testbed` speed table and catalog the simulator reads from `data/testbed`, and the
sim-to-real tables the report shows (per-policy gap, per-job-type speed error)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from dl2.errors import Dl2Error
from dl2.paths import TESTBED_DIR
from dl2.sim.scenario import Scenario
from dl2.sim_to_real import profile, replay
from dl2.sim_to_real.report import relative_speeds
from dl2.testbed.training.models import STANDINS
from dl2.workload.catalog import load_catalog
from dl2.workload.presets import get_preset
from dl2.workload.speed import SPEED_FILES, MeasuredSpeedModel, read_measurements


def measurements(model: str = "wlm") -> pd.DataFrame:
    rows = []
    for repeat, scale in enumerate([1.0, 1.1, 0.9]):
        for (p, w), speed in {(1, 1): 10.0, (1, 2): 16.0, (2, 1): 11.0, (2, 2): 18.0}.items():
            rows.append({"model": model, "num_ps": p, "num_workers": w, "repeat": repeat, "steps_per_second": speed * scale,
                         "seconds": 8.0, "steps": int(8 * speed * scale), "ps_cpu": json.dumps([0.1] * p),
                         "worker_cpu": json.dumps([0.8 + 0.1 * repeat] * w)})
    return pd.DataFrame(rows, columns=profile.COLUMNS)


def test_speed_rows_are_the_mean_over_repeats_in_the_authors_format(tmp_path):
    lines = profile.speed_rows(measurements())
    (tmp_path / "speed.txt").write_text("\n".join(lines) + "\n")
    table = read_measurements(tmp_path / "speed.txt")["wlm"]
    np.testing.assert_allclose(table, [[1, 1, 10.0], [1, 2, 16.0], [2, 1, 11.0], [2, 2, 18.0]])
    row = eval(lines[1])  # noqa: S307 (our own literal)
    assert row[:5] == ("wlm", "sync", 2 * STANDINS["wlm"].batch_size, 1, 2)
    assert row[5] == [8.0, 8.0] and row[6] == [0.1] and row[7] == [0.9, 0.9], "per worker: equal shares; CPU: mean cores"


def test_spread_is_over_repeats():
    spread = profile.spread(measurements()).set_index(["num_ps", "num_workers"])
    assert (spread.repeats == 3).all()
    assert spread.loc[(1, 2), "steps_per_second"] == pytest.approx(16.0)
    assert spread.loc[(1, 2), "cv"] == pytest.approx(np.std([1.0, 1.1, 0.9], ddof=1))


def test_the_configurations_a_testbed_allows_fit_its_nodes():
    # a PS takes 2 CPU slots, a worker 2 CPU and 4 GPU slots: one node (8, 8) holds 2 workers
    assert profile.allowed_configurations(2, 3, ["resnet-50"]) == ((1, 1), (1, 2), (2, 1), (2, 2))
    assert profile.allowed_configurations(3, 1, ["resnet-50"]) == ((1, 1), (1, 2), (2, 1), (2, 2), (3, 1))
    with pytest.raises(Dl2Error, match="at least one PS and one worker"):
        profile.ProfileGrid(("wlm",), ((0, 1),))
    with pytest.raises(Dl2Error, match="--repeats must be >= 1"):
        profile.ProfileGrid(("wlm",), ((1, 1),), repeats=0)


def test_facts_keep_how_the_other_job_types_were_profiled():
    first = profile.facts(profile.ProfileGrid(("wlm",), ((1, 1), (1, 2)), 3, 8.0), ["w1"])
    second = profile.facts(profile.ProfileGrid(("dssm",), ((1, 1),), 1, 4.0), ["w1", "w2"], first, cpu_millis_per_slot=62)
    assert second["profiled"]["wlm"] == first["profiled"]["wlm"] and first["profiled"]["wlm"]["cpu_millis_per_slot"] == 0
    assert second["profiled"]["dssm"]["cpu_millis_per_slot"] == 62, "the limits a profile was measured under are recorded"
    assert second["profiled"]["dssm"]["configurations"] == [[1, 1]] and second["profiled"]["dssm"]["kind_workers"] == ["w1", "w2"]
    assert second["steps_per_epoch"] == {m: s.steps_per_epoch for m, s in STANDINS.items()}


def test_the_committed_profile_is_the_testbed_preset_s_speed_table():
    facts = json.loads((TESTBED_DIR / "testbed.json").read_text())
    catalog = load_catalog("testbed")
    assert catalog.names == load_catalog().names and set(facts["profiled"]) == set(catalog.names)
    assert list(catalog.epoch_size) == [STANDINS[m].steps_per_epoch for m in catalog.names], "epochs: the stand-ins'"
    np.testing.assert_array_equal(catalog.worker_demand, load_catalog(facts["demands"]).worker_demand)
    measured = pd.read_csv(TESTBED_DIR / "profile.csv")
    assert (profile.spread(measured).repeats >= 2).all(), "every configuration measured at least twice"
    assert read_measurements(SPEED_FILES["testbed"]).keys() == set(catalog.names)
    sc = Scenario(get_preset("testbed"))
    for model, how in facts["profiled"].items():  # measured on the preset's cluster, its pods held to their CPU share
        assert len(how["kind_workers"]) == sc.preset.num_nodes and how["cpu_millis_per_slot"] > 0, model
    startup = profile.startup(measured)  # a configuration's start-up per job type: what restart_seconds models
    assert min(startup.values()) <= sc.preset.restart_seconds <= max(startup.values())
    speed = MeasuredSpeedModel(catalog, "testbed", sc.preset.slot_seconds)
    for model, group in measured.groupby("model"):
        m = catalog.index(model)
        for (p, w), mean in group.groupby(["num_ps", "num_workers"]).steps_per_second.mean().items():
            # the interpolant passes through the profile's means: epochs per slot = batches/s * slot / batches per epoch
            assert sc.table[m, p, w] == pytest.approx(mean * sc.preset.slot_seconds / STANDINS[model].steps_per_epoch, rel=1e-3)
            assert speed.epochs_per_slot(m, p, w) == pytest.approx(sc.table[m, p, w])


def test_a_missing_profile_says_how_to_make_one(tmp_path):
    code = "from dl2.workload.catalog import load_catalog; load_catalog('testbed')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "DL2_TESTBED_DATA": str(tmp_path / "none")})
    assert done.returncode != 0 and "dl2 testbed profile --kind" in done.stderr and "testbed.json" in done.stderr


def test_relative_speeds_set_the_profile_beside_the_authors_table():
    rel = relative_speeds(measurements())
    ours = rel[rel.source == "kind testbed"]
    assert len(ours) == 12 and ours[ours.config == "(1, 1)"].relative_speed.tolist() == [1.0, 1.0, 1.0]
    theirs = rel[rel.source == "authors"].set_index("config").relative_speed
    table = Scenario(get_preset("paper")).table  # the authors' table as the simulator interpolates it
    wlm = load_catalog().index("wlm")
    assert theirs["(1, 2)"] == pytest.approx(table[wlm, 1, 2] / table[wlm, 1, 1])
    assert theirs["(2, 2)"] == pytest.approx(table[wlm, 2, 2] / table[wlm, 1, 1])


def slots_frame() -> pd.DataFrame:
    rows = []
    for slot, (trained, predicted, started) in enumerate([(2.0, 4.0, True), (3.0, 4.0, False), (3.0, 4.0, False), (1.0, 1.0, False)]):
        rows.append({"policy": "drf", "seed": -1, "trace": 0, "repeat": 0, "slot": slot, "job_id": 1, "model": "wlm", "num_ps": 1,
                     "num_workers": 1, "seconds": 20.0, "epochs_trained": trained, "epochs_predicted": predicted, "started": started})
    return pd.DataFrame(rows, columns=replay.SLOT_COLUMNS)


def test_the_speed_error_splits_steady_slots_from_starts_and_leaves_the_last_slot_out():
    error = replay.speed_error(slots_frame()).set_index("model").loc["wlm"]
    assert error.steady_slots == 2 and error.steady_ratio == pytest.approx(6.0 / 8.0)
    assert error.started_slots == 1 and error.started_ratio == pytest.approx(0.5)
    assert error.error == pytest.approx(-0.25)


def test_a_configuration_counts_as_starting_until_its_pods_have_trained():
    starts = replay.StartTracker()
    # pods created in slot 0 still starting in slot 1, then training; a resize in slot 4; pods recreated in slot 6
    seen = [starts.started("job-1", config, created, trained) for config, created, trained in
            [((1, 1), True, 0.0), ((1, 1), False, 0.0), ((1, 1), False, 2.0), ((1, 1), False, 3.0),
             ((2, 2), True, 1.0), ((2, 2), False, 4.0), ((2, 2), True, 1.0)]]
    assert seen == [True, True, True, False, True, False, True]
    assert starts.started("job-2", (1, 1), False, 1.0), "another job's first slot starts it"


def test_the_summary_sets_the_testbed_beside_the_simulator_per_policy():
    jobs = pd.DataFrame([{"policy": p, "seed": -1, "trace": t, "repeat": 0, "job_id": j, "model": "wlm", "epochs": 10.0,
                          "jct_testbed": kind, "jct_sim": sim}
                         for p, kind, sim in (("drf", 4.0, 2.0), ("optimus", 3.0, 2.0)) for t in (0, 1) for j in (1, 2)],
                        columns=replay.JOB_COLUMNS)
    table = replay.summary(jobs).set_index("policy")
    assert table.loc["drf", "ratio"] == 2.0 and table.loc["optimus", "testbed"] == 3.0 and table.loc["drf", "runs"] == 2
    assert table.loc["drf", "repeat_sd"] == 0.0, "one repeat: no spread"
    assert replay.metrics(jobs)["testbed.optimus.sim_avg_jct"] == 2.0


def test_the_summary_gives_the_spread_of_a_policy_replaying_the_same_trace():
    # trace 0 replayed three times (average JCTs 3, 4, 5: sd 0.816), trace 1 twice (6, 6: sd 0)
    runs = [(0, 0, 3.0), (0, 1, 4.0), (0, 2, 5.0), (1, 0, 6.0), (1, 1, 6.0)]
    jobs = pd.DataFrame([{"policy": "drf", "seed": -1, "trace": t, "repeat": r, "job_id": j, "model": "wlm",
                          "epochs": 10.0, "jct_testbed": kind + (j - 1.5), "jct_sim": 2.0}
                         for t, r, kind in runs for j in (1, 2)], columns=replay.JOB_COLUMNS)
    row = replay.summary(jobs).set_index("policy").loc["drf"]
    assert row.runs == 5 and row.testbed == pytest.approx(24.0 / 5)
    assert row.repeat_sd == pytest.approx((2.0 / 3.0) ** 0.5 / 2)
    assert replay.metrics(jobs)["testbed.drf.repeat_sd"] == pytest.approx(row.repeat_sd)
    error = replay.speed_error(pd.concat([slots_frame(), slots_frame().assign(repeat=1, slot=lambda f: f.slot + 10)]))
    assert error.set_index("model").loc["wlm"].steady_slots == 4, "each repeat's own last slot is left out"


def test_startup_is_each_job_types_median_and_leaves_out_rows_measured_before_it_was_recorded():
    table = measurements("wlm")
    table["startup_seconds"] = [20.0, 30.0, 25.0, 21.0, 40.0, 26.0, 22.0, 27.0, 23.0, 24.0, 28.0, 29.0]
    older = measurements("dssm")  # a profile made before startup_seconds was a column: NaN there
    assert profile.startup(pd.concat([table, older], ignore_index=True)) == {"wlm": 25.5}
