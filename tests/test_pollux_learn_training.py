"""DL2's learning in the Pollux world (issue 35): networks that take the world's shape, SL pretraining on a
teacher's decisions, PPO fine-tuning on the vectorised environment, checkpoints."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dl2.learn.architecture import NET_PRESETS, NetConfig, net_config
from dl2.learn.features import feature_size
from dl2.learn.nets import policy_net, value_net


class _Reference(nn.Module):
    """The PS/worker networks as they were built before the world's shape was a setting: the layers, in
    the order they were created, written out here from the PS/worker features' size."""

    def __init__(self, config: NetConfig, outputs: int):
        super().__init__()
        per_job = feature_size(1, config.one_hot)
        if config.per_job:
            sizes = [per_job, *config.hidden]
            self.layers = nn.ModuleList(nn.Linear(sizes[0] if k == 0 else 2 * sizes[k], sizes[k + 1])
                                        for k in range(len(config.hidden)))
            self.job_head = nn.Linear(sizes[-1], 3)
            self.pool_head = nn.Linear(sizes[-1], 1)
            return
        layers: list[nn.Module] = []
        width = config.window * per_job
        for size in config.hidden:
            layers.append(nn.Linear(width, size))
            if config.batch_norm:
                layers.append(nn.BatchNorm1d(size))
            layers.append(nn.ReLU())
            width = size
        layers.append(nn.Linear(width, outputs))
        self.body = nn.Sequential(*layers)


@pytest.mark.parametrize("preset", sorted(NET_PRESETS))
@pytest.mark.parametrize("window", [20, 7])
def test_ps_worker_networks_keep_their_weights_bit_for_bit(preset, window):
    config = net_config(preset, window=window)
    assert (config.num_inputs, config.num_actions) == (feature_size(window, config.one_hot), 3 * window + 1)
    for build, outputs in ((policy_net, 3 * window + 1), (value_net, 1)):
        torch.manual_seed(11)
        ours = build(config).state_dict()
        after_ours = torch.rand(3)
        torch.manual_seed(11)
        reference = _Reference(config, outputs).state_dict()
        after_reference = torch.rand(3)
        assert list(ours) == list(reference)
        for name in ours:
            assert torch.equal(ours[name], reference[name]), name
        assert torch.equal(after_ours, after_reference)  # the same random draws, so what follows is the same too


def test_a_ps_worker_config_saves_the_fields_it_always_saved():
    assert set(net_config("per-job").to_dict()) == {"window", "hidden", "activation", "batch_norm", "one_hot", "per_job"}
    shaped = net_config("per-job", roles=1, job_inputs=14, kinds=8)
    assert NetConfig(**{**shaped.to_dict(), "hidden": tuple(shaped.hidden)}) == shaped


@pytest.mark.parametrize("preset", ["per-job", "paper"])
def test_a_world_with_one_role_gets_window_plus_one_actions(preset):
    config = net_config(preset, window=5, roles=1, job_inputs=9, kinds=4)
    assert (config.num_inputs, config.num_actions) == (45, 6)
    x = torch.zeros(2, 45)
    x[:, 0] = 1.0  # the first window job is of kind 0; the others are empty
    assert policy_net(config)(x).shape == (2, 6)
    assert value_net(config)(x).shape == (2, 1)
