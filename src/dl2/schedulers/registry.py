"""Finding a scheduler by name: a built-in policy, or a user's class as `module:Class` or `file.py:Class`."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from dl2.errors import Dl2Error
from dl2.schedulers.base import Scheduler
from dl2.schedulers.builtin import BUILTIN_POLICIES, BuiltinScheduler
from dl2.schedulers.names import check_policy


def policy_names() -> tuple[str, ...]:
    return BUILTIN_POLICIES


def load_class(spec: str) -> type:
    """The class `spec` names: `module:Class` (imported) or `file.py:Class` (loaded from the file)."""
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise Dl2Error(f"scheduler file not found: {path}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except SyntaxError as exc:
            raise Dl2Error(f"{path}:{exc.lineno}: syntax error in scheduler file: {exc.msg}") from None
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise Dl2Error(f"cannot import scheduler module {target!r}: {exc}") from None
        except SyntaxError as exc:
            raise Dl2Error(f"{exc.filename}:{exc.lineno}: syntax error in scheduler module: {exc.msg}") from None
    if not hasattr(module, attr):
        raise Dl2Error(f"{target} has no scheduler class {attr!r}")
    return getattr(module, attr)


def get_scheduler(name: str) -> Scheduler:
    """A built-in policy (fifo, srtf, drf, tetris, optimus) or a user class `module:Class` (`file.py:Class`);
    saved DL2 models load through `dl2.backends.load_scheduler`."""
    name = check_policy(name, BUILTIN_POLICIES, classes=True)
    if name in BUILTIN_POLICIES:
        return BuiltinScheduler(name)
    scheduler = load_class(name)()
    if not callable(getattr(scheduler, "schedule", None)):
        raise Dl2Error(f"{name} has no schedule(obs) method")
    if not hasattr(scheduler, "name"):
        scheduler.name = name
    return scheduler
