"""`dl2 bench --clusters`' arithmetic: the updates the published clusters axis needed, and the wall time to
its target projected from seconds per update (the timing itself runs on Ray actors: tests/ray_cluster)."""

from __future__ import annotations

import pandas as pd
import pytest

from dl2.bench_clusters import PUBLISHED_CURVES, projection, updates_to_target
from dl2.learn.ablations import tables


def test_updates_to_target_are_the_published_axis_convergence_means():
    updates = updates_to_target()
    expected = tables.convergence(pd.read_csv(PUBLISHED_CURVES, dtype={"cell": str})).groupby("cell")["update"].mean()
    assert sorted(updates) == [1, 2, 4, 8]
    assert all(updates[int(cell)] == value for cell, value in expected.items())


def test_updates_to_target_without_the_published_curves_is_empty(tmp_path):
    assert updates_to_target(tmp_path / "absent.csv") == {}


def test_projection_is_updates_times_seconds_against_one_cluster():
    result = projection({1: 0.5, 2: 0.4, 4: 1.0}, {1: 50.0, 2: 80.0, 8: 40.0})
    assert sorted(result) == ["1", "2"]  # 4 has no published updates, 8 no timing
    assert result["2"]["seconds_to_target"] == pytest.approx(32.0)
    assert result["2"]["speedup_vs_1"] == pytest.approx(25.0 / 32.0)
    assert result["2"]["speedup_in_updates"] == pytest.approx(50 / 80)
    assert result["2"]["paper_speedup"] == 2.0
    assert result["1"]["speedup_vs_1"] == 1.0


def test_projection_needs_one_cluster_to_compare_with():
    assert projection({2: 0.4}, {2: 80.0}) == {}
