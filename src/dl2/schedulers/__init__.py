"""Schedulers: one small protocol, the built-in heuristics, and loading a user's scheduler by name."""

from dl2.schedulers.base import Allocation, Observation, Scheduler
from dl2.schedulers.builtin import BUILTIN_POLICIES, BuiltinScheduler
from dl2.schedulers.registry import get_scheduler, policy_names

__all__ = [
    "Allocation",
    "BUILTIN_POLICIES",
    "BuiltinScheduler",
    "Observation",
    "Scheduler",
    "get_scheduler",
    "policy_names",
]
