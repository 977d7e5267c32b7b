"""Trace generation (DESIGN §4) and the CSV round trip."""

import numpy as np
import pytest
from conftest import tiny_preset

from dl2.workload.catalog import load_catalog, workload_constants
from dl2.workload.presets import get_preset
from dl2.workload.traces import ARRIVAL_PATTERNS, LENGTH_PATTERNS, generate_trace, read_trace, write_trace


def test_same_seed_same_trace_other_seed_other_trace():
    preset, catalog = get_preset("paper"), load_catalog()
    a, b, c = (generate_trace(preset, catalog, s) for s in (1, 1, 2))
    for field in ("job_id", "arrival", "model", "num_epochs"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert not (np.array_equal(a.model, c.model) and np.array_equal(a.arrival, c.arrival))


@pytest.mark.parametrize("arrivals", ARRIVAL_PATTERNS)
@pytest.mark.parametrize("lengths", LENGTH_PATTERNS)
def test_every_pattern_gives_the_preset_job_count_within_the_arrival_cap(arrivals, lengths):
    preset = get_preset("paper")
    trace = generate_trace(preset, load_catalog(), 3, arrivals=arrivals, lengths=lengths)
    assert len(trace) == preset.num_jobs
    assert np.bincount(trace.arrival).max() <= preset.max_arrivals
    assert (np.diff(trace.arrival) >= 0).all() and (trace.num_epochs > 0).all()
    assert list(trace.job_id) == list(range(1, preset.num_jobs + 1))


def test_ali_lengths_follow_the_buckets():
    preset = get_preset("paper")
    ali = workload_constants()["ali_trace"]
    allowed = {int(m / 1155 * preset.max_epochs) for m in ali["length_bin_minutes"]}
    trace = generate_trace(preset, load_catalog(), 0)
    assert set(trace.num_epochs.astype(int)) <= allowed
    # model = bucket in the paper preset
    for model, epochs in zip(trace.model, trace.num_epochs):
        assert int(ali["length_bin_minutes"][model] / 1155 * preset.max_epochs) == int(epochs)


def test_dev_preset_maps_buckets_to_models():
    preset = get_preset("dev")
    ali = workload_constants()["ali_trace"]
    trace = generate_trace(preset, load_catalog("dev_snapshot"), 0)
    bucket_of_model = {m: b for b, m in enumerate(ali["bin_to_model_index_dev_snapshot_unused"])}
    for model, epochs in zip(trace.model, trace.num_epochs):
        assert int(ali["length_bin_minutes"][bucket_of_model[model]] / 1155 * preset.max_epochs) == int(epochs)


def test_ali_arrivals_are_the_scaled_pattern():
    preset = tiny_preset(num_jobs=400)
    preset = preset.__class__(**{**preset.__dict__, "max_arrivals": 3})
    trace = generate_trace(preset, load_catalog(), 5, arrivals="ali")
    per_slot = np.bincount(trace.arrival)
    pattern = workload_constants()["ali_trace"]["arrivals_per_slot"]
    scaled = [min(3, int(np.ceil(a / (max(pattern) / 3)))) for a in pattern]
    offsets = [o for o in range(5) if all(per_slot[t] == scaled[(t + o) % len(scaled)] for t in range(len(per_slot) - 1))]
    assert offsets, "arrivals per slot are the scaled pattern read from an offset 0..4"


def test_csv_round_trip_is_exact(tmp_path):
    trace = generate_trace(get_preset("paper"), load_catalog(), 9, lengths="normal")
    write_trace(trace, tmp_path / "t.csv")
    back = read_trace(tmp_path / "t.csv", load_catalog())
    for field in ("job_id", "arrival", "model", "num_epochs"):
        np.testing.assert_array_equal(getattr(trace, field), getattr(back, field))


def test_extra_columns_are_ignored(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("note,job_id,arrival_slot,model,num_epochs\nx,7,2,vgg-16,12.5\n")
    trace = read_trace(path, load_catalog())
    assert (trace.job_id[0], trace.arrival[0], trace.model_names[trace.model[0]], trace.num_epochs[0]) == (7, 2, "vgg-16", 12.5)
