// Module dl2/testbed/pause is the pod sandbox's process: it sleeps, reaps orphans and exits on a signal.
module dl2/testbed/pause

go 1.26.0
