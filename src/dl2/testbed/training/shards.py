"""The deterministic partition of a model's parameter tensors across the parameter servers.

Tensors are taken largest first (ties: model order) and each goes to the PS holding the fewest elements so
far (ties: the lower index); within a shard they keep model order. The partition depends only on the
model and the number of PS, so every process of a configuration computes the same one, and a checkpoint
(whole tensors by name) re-shards to any other number of PS. Tensors are never split: with more PS than
tensors some PS hold an empty shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Shard:
    """The parameter tensors one PS owns, and how they lie in the flat vector that travels between processes."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]

    @property
    def sizes(self) -> list[int]:
        return [s.numel() for s in self.shapes]

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    def flatten(self, tensors: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        """Write `tensors` (this shard's, in order) one after another into the 1-D `out`."""
        if tensors:
            torch.cat([t.detach().reshape(-1) for t in tensors], out=out)

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of the 1-D `flat`, one per tensor of this shard, shaped like them."""
        return [part.view(shape) for part, shape in zip(flat.split(self.sizes), self.shapes)] if self.names else []


def partition(sizes: Sequence[int], num_shards: int) -> list[list[int]]:
    """Indices of `sizes` per shard: largest first onto the least-filled shard; each list ascending."""
    load = [0] * num_shards
    owned: list[list[int]] = [[] for _ in range(num_shards)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        target = min(range(num_shards), key=lambda s: (load[s], s))
        load[target] += sizes[i]
        owned[target].append(i)
    return [sorted(ids) for ids in owned]


def make_shards(model: nn.Module, num_ps: int) -> list[Shard]:
    """The shard of each of `num_ps` parameter servers for `model`."""
    named = list(model.named_parameters())
    return [Shard(tuple(named[i][0] for i in ids), tuple(named[i][1].shape for i in ids))
            for ids in partition([p.numel() for _, p in named], num_ps)]
