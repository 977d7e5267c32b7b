"""The Pollux world's policies by name: Optimus+Oracle, Tiresias and Pollux as the artifact runs them, or
a user's class (`module:Class`, `file.py:Class`) with the interface of `dl2.pollux.cluster.PolluxPolicy`."""

from __future__ import annotations

from dl2.errors import Dl2Error
from dl2.pollux.cluster import PolluxPolicy
from dl2.pollux.policies.optimus import Optimus
from dl2.pollux.policies.pollux import Pollux
from dl2.pollux.policies.tiresias import Tiresias
from dl2.schedulers.names import check_policy
from dl2.schedulers.registry import load_class
from dl2.workload.presets import POLLUX

POLICIES = ("optimus", "tiresias", "pollux")
RANDOMIZED = ("pollux",)  # results vary with the seed


def make_policy(name: str, seed: int = 0) -> PolluxPolicy:
    """A fresh policy (policies keep state between intervals); `seed` seeds a randomized one."""
    name = check_policy(name, POLICIES, classes=True, world=POLLUX)
    if name == "optimus":
        return Optimus()
    if name == "tiresias":
        return Tiresias()
    if name == "pollux":
        return Pollux(seed)
    policy = load_class(name)()
    missing = [a for a in ("allocate", "batch_sizes", "fits_models") if not hasattr(policy, a)]
    if missing:
        raise Dl2Error(f"{name} is no Pollux-world policy: it has no {missing[0]} (see dl2.pollux.cluster.PolluxPolicy)")
    if not hasattr(policy, "name"):
        policy.name = name
    return policy
