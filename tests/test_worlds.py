"""Worlds behind one interface: every preset runs in its own world, a world refuses another's preset, and
each world's learning shape is what its environment uses."""

from __future__ import annotations

import pytest

from dl2.errors import Dl2Error
from dl2.learn.features import NUM_MODELS, feature_size
from dl2.paths import repo_root
from dl2.pollux.apps import APP_NAMES
from dl2.sim.state import NUM_FEATURES
from dl2.workload.presets import load_presets
from dl2.worlds import WORLDS, world_of


def test_every_preset_of_the_project_belongs_to_a_world_of_its_type():
    presets = load_presets()
    assert {p.world for p in presets.values()} == set(WORLDS)
    for preset in presets.values():
        assert isinstance(preset, world_of(preset).preset_type)


def test_a_world_refuses_a_preset_of_another():
    presets = load_presets()
    workload = repo_root() / "data" / "reference" / "pollux" / "workloads" / "workload-1.csv"
    with pytest.raises(Dl2Error, match="preset 'paper' is of the ps-worker world, not the pollux world"):
        WORLDS["pollux"].compare([workload], ["optimus"], presets["paper"], progress=False)
    with pytest.raises(Dl2Error, match="preset 'pollux' is of the pollux world, not the ps-worker world"):
        WORLDS["ps-worker"].compare([workload], ["drf"], presets["pollux"], progress=False)


def test_the_ps_worker_learning_shape_is_the_decision_environments():
    shape = WORLDS["ps-worker"].learning
    assert len(shape.job_types) == NUM_MODELS and len(shape.job_features) == NUM_FEATURES
    for window in (4, 20):
        assert feature_size(window, one_hot=True) == window * (len(shape.job_types) + len(shape.job_features) - 1)
        assert shape.num_actions(window) == 3 * window + 1  # +1 worker, +1 PS, +1 bundle per window job, or void


def test_the_pollux_learning_shape_names_its_applications_and_one_role():
    shape = WORLDS["pollux"].learning
    assert shape.job_types == APP_NAMES and shape.roles == ("gpu",) and shape.num_actions(10) == 11
