"""Workload: the DL2 job-type catalog, speed models, and traces."""
