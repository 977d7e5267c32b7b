"""What `dl2 score` scores: a built-in name of either world, a saved DL2 model (`*.pt`), or a user's class
(`module:Class`, `file.py:Class`), and which worlds it can play.

A class's worlds follow from its methods: a `schedule` method makes it a PS/worker scheduler
(`dl2.schedulers.base`), `allocate` and `batch_sizes` methods make it a Pollux-world policy
(`dl2.pollux.cluster.PolluxPolicy`, which also needs `fits_models`); one class may be both. A class whose
constructor takes a `seed` argument is randomized: it is built once per suite seed, `cls(seed=s)`; any other is
built with `cls()`. Either way each run gets a fresh instance.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dl2.errors import Dl2Error
from dl2.learn.agent import DL2Policy
from dl2.pollux.policies import POLICIES as POLLUX_POLICIES
from dl2.pollux.policies import RANDOMIZED, make_policy
from dl2.schedulers.builtin import BUILTIN_POLICIES, BuiltinScheduler
from dl2.schedulers.names import MODEL_SUFFIX
from dl2.schedulers.registry import load_class
from dl2.workload.presets import POLLUX, PS_WORKER

Factory = Callable[[int], Any]  # seed -> a fresh scheduler (or Pollux-world policy)


@dataclass(frozen=True)
class Candidate:
    """A scheduler to score: its name, and per world it plays a factory of fresh instances by seed (or, for a
    DL2 model, the model itself, which plays the PS/worker world greedily as `evaluate` runs it)."""

    name: str
    kind: str  # "built-in", "model" or "class"
    factories: dict[str, Factory] = field(default_factory=dict)  # world -> factory
    model: DL2Policy | None = None
    randomized: frozenset[str] = frozenset()  # worlds where it runs once per seed

    def plays(self, world: str) -> bool:
        return world in self.factories or (world == PS_WORKER and self.model is not None)

    def why_absent(self, world: str) -> str:
        """Why the candidate does not play `world`."""
        if self.kind == "built-in":
            return f"a built-in of the {next(iter(self.factories))} world only"
        if self.kind == "model":
            return "a DL2 model plays the ps-worker world"
        if world == PS_WORKER:
            return "no schedule(obs) method: not a PS/worker scheduler"
        return "no allocate(view) and batch_sizes(workload) methods: not a Pollux-world policy"


def resolve(spec: str) -> Candidate:
    """The candidate `spec` names; a Dl2Error for an unknown name, a model that does not load, or a class that
    implements neither world's protocol."""
    lowered = spec.lower()
    if lowered in BUILTIN_POLICIES or lowered in POLLUX_POLICIES:
        factories: dict[str, Factory] = {}
        if lowered in BUILTIN_POLICIES:
            factories[PS_WORKER] = lambda seed: BuiltinScheduler(lowered)
        if lowered in POLLUX_POLICIES:
            factories[POLLUX] = lambda seed: make_policy(lowered, seed)
        return Candidate(lowered, "built-in", factories, randomized=frozenset({POLLUX} if lowered in RANDOMIZED else ()))
    if lowered.endswith(MODEL_SUFFIX):
        return Candidate(Path(spec).stem, "model", model=DL2Policy.load(spec))
    if ":" in spec:
        return _class_candidate(spec)
    known = ", ".join(sorted(set(BUILTIN_POLICIES) | set(POLLUX_POLICIES)))
    raise Dl2Error(f"unknown scheduler {spec!r} (known: {known}; a saved DL2 model *{MODEL_SUFFIX}; or module:Class, "
                   "file.py:Class)")


def _class_candidate(spec: str) -> Candidate:
    cls = load_class(spec)
    if not isinstance(cls, type):
        raise Dl2Error(f"{spec} is no class")
    ps_worker = callable(getattr(cls, "schedule", None))
    pollux = callable(getattr(cls, "allocate", None)) and callable(getattr(cls, "batch_sizes", None))
    if not (ps_worker or pollux):
        raise Dl2Error(f"{spec} implements neither world's protocol: a PS/worker scheduler has a schedule(obs) method "
                       "(dl2.schedulers.base), a Pollux-world policy batch_sizes(workload) and allocate(view) methods "
                       "(dl2.pollux.cluster.PolluxPolicy)")
    try:
        seeded = "seed" in inspect.signature(cls).parameters
    except (TypeError, ValueError):  # no signature to read: built with cls()
        seeded = False
    name = getattr(cls, "name", None) if isinstance(getattr(cls, "name", None), str) else spec

    def build(seed: int) -> Any:
        try:
            instance = cls(seed=seed) if seeded else cls()
        except TypeError as exc:
            raise Dl2Error(f"{spec}: cannot build it as {'cls(seed=...)' if seeded else 'cls()'}: {exc}") from None
        if not isinstance(getattr(instance, "name", None), str):
            instance.name = name
        return instance

    def build_pollux(seed: int) -> Any:
        instance = build(seed)
        if not hasattr(instance, "fits_models"):
            raise Dl2Error(f"{spec} is no Pollux-world policy: it has no fits_models (see dl2.pollux.cluster.PolluxPolicy)")
        return instance

    factories = {**({PS_WORKER: build} if ps_worker else {}), **({POLLUX: build_pollux} if pollux else {})}
    return Candidate(name, "class", factories, randomized=frozenset(factories) if seeded else frozenset())
