"""Ablations: what each part of DL2 is worth, one axis at a time (the `ablate` stages, one per group of
axes): `plan` (an axis's cells from `params.yaml`), `cells` (training and storing them), `tables` (their
results, summaries, metrics and files)."""
