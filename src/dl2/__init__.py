"""dl2: a reference implementation of DL2, the deep-learning-driven scheduler for DL clusters."""

__version__ = "0.1.0"
