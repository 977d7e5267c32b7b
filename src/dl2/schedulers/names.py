"""Policy names: the one check of a name that a setting or a command gives for a policy, with one error text,
wherever it is read (`params.yaml`, the command line, a world's comparison, the scheduler registry)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dl2.errors import Dl2Error

MODEL_SUFFIX = ".pt"  # a saved DL2 model


def check_policy(name: Any, builtin: Sequence[str], *, classes: bool = False, models: bool = False, world: str = "",
                 key: str = "") -> str:
    """`name` as it is to be run: one of `builtin` (in any case; returned as `builtin` spells it), or, where
    allowed, a user's class (`classes`: `module:Class`, `file.py:Class`) or a saved DL2 model (`models`: a
    `*.pt` file). Anything else raises a Dl2Error naming `key` (a setting) and `world` (a world's own
    policies) and listing what is known."""
    if isinstance(name, str):
        spelled = {b.lower(): b for b in builtin}.get(name.lower())
        if spelled is not None:
            return spelled
        if classes and ":" in name:
            return name
        if models and name.lower().endswith(MODEL_SUFFIX):
            return name
    known = [", ".join(builtin), *(["module:Class"] if classes else []), *([f"a saved DL2 model *{MODEL_SUFFIX}"] if models else [])]
    listed = known[0] if len(known) == 1 else f"{', '.join(known[:-1])}, or {known[-1]}"
    where = f"{key}: " if key else ""
    of_world = f" of the {world} world" if world else ""
    raise Dl2Error(f"{where}unknown policy {name!r}{of_world} (known: {listed})")
