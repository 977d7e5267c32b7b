"""`python -m dl2.k8s.training`: one PS or worker process of a job (see the package docstring)."""

import os
import sys

from dl2.k8s.training.main import main

code = main()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)  # without interpreter teardown: receiving threads may still sit in gloo, which would hang or abort it
