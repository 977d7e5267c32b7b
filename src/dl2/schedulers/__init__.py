"""Schedulers: the scheduler and backend protocols, the built-in heuristics, and loading a user's scheduler by name."""

from dl2.schedulers.base import Allocation, Backend, Observation, Scheduler
from dl2.schedulers.builtin import BUILTIN_POLICIES, BuiltinScheduler, simulate_builtin
from dl2.schedulers.registry import get_scheduler, policy_names

__all__ = [
    "Allocation",
    "BUILTIN_POLICIES",
    "Backend",
    "BuiltinScheduler",
    "Observation",
    "Scheduler",
    "get_scheduler",
    "policy_names",
    "simulate_builtin",
]
