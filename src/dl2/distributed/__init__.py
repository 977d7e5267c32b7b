"""Beyond one machine: the `executor` setting, dl2's jobs as Ray tasks, and a Ray cluster of several nodes on
this machine (for the tests and `dl2 bench --ray`). Ray is imported only when a Ray executor is used."""
