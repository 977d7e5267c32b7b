"""The DL2-faithful time-slotted cluster simulator (DESIGN §3), compiled with numba."""
