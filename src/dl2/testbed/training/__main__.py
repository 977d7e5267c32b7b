"""`python -m dl2.testbed.training`: one PS or worker process of a job (see the package docstring)."""

import os
import sys

from dl2.testbed.training.stopping import stop_on_signals

stop = stop_on_signals()  # first: a pod deleted while this process imports torch must stop, not wait for SIGKILL

from dl2.testbed.training.main import main  # noqa: E402

code = main(stop=stop)
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)  # without interpreter teardown: receiving threads may still sit in gloo, which would hang or abort it
