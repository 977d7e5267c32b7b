"""DL2 learning: the decision environment, features, networks, pretraining, RL fine-tuning, evaluation."""
