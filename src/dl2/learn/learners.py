"""The learners by name (`finetune.algorithm`, `settings.ALGORITHMS`): each a `Trainer` subclass of its own module,
reading its own settings (`settings.LEARNER_SETTINGS`)."""

from __future__ import annotations

from collections.abc import Sequence

from dl2.learn.actor_critic import ActorCriticTrainer
from dl2.learn.agent import DL2Policy
from dl2.learn.ppo import PPOTrainer
from dl2.learn.settings import LearnerSettings
from dl2.learn.trainer import Trainer
from dl2.sim.scenario import Scenario
from dl2.workload.traces import Trace

LEARNERS: dict[str, type[Trainer]] = {"actor-critic": ActorCriticTrainer, "ppo": PPOTrainer}


def make_trainer(policy: DL2Policy, train: Sequence[Trace], validation: Sequence[Trace], scenario: Scenario,
                 config: LearnerSettings, seed: int, **kwargs) -> Trainer:
    """The learner whose settings `config` holds, for the run seeded `seed` (`Trainer`'s keyword arguments pass
    through)."""
    return LEARNERS[config.algorithm](policy, train, validation, scenario, config, seed, **kwargs)
