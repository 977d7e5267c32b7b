"""The speed models: the RBF interpolant against scipy, the analytical model by hand."""

import numpy as np
import pytest
from scipy.interpolate import Rbf

from dl2.workload.catalog import load_catalog
from dl2.workload.speed import AnalyticalSpeedModel, MeasuredSpeedModel, _measurements, epochs_table


@pytest.mark.parametrize("table", ["public_release", "dev_snapshot"])
def test_linear_rbf_matches_scipy_on_the_measured_tables(table):
    catalog = load_catalog(table)
    model = MeasuredSpeedModel(catalog, table)
    grid_ps, grid_w = np.meshgrid(np.arange(0, 34), np.arange(0, 34), indexing="ij")
    for m, name in enumerate(catalog.names):
        rows = _measurements(table)[name]
        reference = Rbf(rows[:, 0], rows[:, 1], rows[:, 2], function="linear")
        expected = reference(grid_ps.astype(float), grid_w.astype(float))
        np.testing.assert_allclose(model.speed(m, grid_ps, grid_w), expected, rtol=0, atol=1e-9)


def test_interpolant_passes_through_the_measurements():
    catalog = load_catalog("public_release")
    model = MeasuredSpeedModel(catalog, "public_release")
    rows = _measurements("public_release")["resnet-50"]
    np.testing.assert_allclose(model.speed(0, rows[:, 0], rows[:, 1]), rows[:, 2], atol=1e-9)


def test_epochs_per_slot_converts_samples_per_second_with_the_epoch_size():
    catalog = load_catalog("public_release")
    model = MeasuredSpeedModel(catalog, "public_release", slot_seconds=1200)
    # resnet-50 with 1 PS and 1 worker measures 15.783 samples/s; epoch size 115
    assert model.epochs_per_slot(0, 1, 1) == pytest.approx(15.783 * 1200 / 115, abs=1e-9)
    assert model.epochs_per_slot(0, 0, 3) == 0.0


def test_epochs_table_is_zero_without_a_worker_or_a_ps_and_looks_one_task_ahead():
    catalog = load_catalog("public_release")
    table = epochs_table(MeasuredSpeedModel(catalog), catalog.num_models, max_tasks=8)
    assert table.shape == (8, 10, 10)
    assert (table[:, 0, :] == 0).all() and (table[:, :, 0] == 0).all()
    assert (table[:, 1:, 1:] != 0).any()


def test_analytical_model_by_hand():
    catalog = load_catalog("public_release")
    model = AnalyticalSpeedModel(catalog, slot_seconds=1200)
    m = 0  # resnet-50: c=0.449 s, M=102.2 MB, B_in=306.5, B_out=91.875, epoch 115
    # 1 PS and 1 worker on the same node: intra = B_in, out = B_out (all PS local)
    step = 0.449 + max(2 * 102.2 / 91.875, 2 * 102.2 / 306.5)
    assert model.epochs_per_slot_placed(m, [0], [0]) == pytest.approx(1200 / step / 115)
    # 2 PS on nodes 0 and 1, 2 workers on node 0: worker node has 1 PS of 2 -> out = min(B/1, B/(2-0))
    intra = 306.5 / 2
    out = min(91.875 / 1, 91.875 / (2 - 0))
    step = 0.449 + max(2 * 51.1 / out, 2 * 51.1 / intra)
    assert model.epochs_per_slot_placed(m, [0, 1], [0, 0]) == pytest.approx(2 * 1200 / step / 115)
    # without a placement: every task on a node of its own
    assert model.epochs_per_slot(m, 2, 2) == pytest.approx(model.epochs_per_slot_placed(m, [0, 1], [2, 3]))
