"""Executing a stage notebook with papermill, on a kernel that talks over encrypted sockets and is shut
down without a SIGINT.

Two changes to jupyter_client's defaults, both things a user saw on every stage run:
- the kernel's sockets use CurveZMQ keys the manager provisions (ipykernel's kernelspec supports them), so
  the kernel no longer warns that it "is running over TCP without encryption";
- `shutdown_kernel` first interrupts the kernel (SIGINT to its process group) and then asks it to exit.
  nbclient's last request after the cells is `kernel_info`; when the SIGINT lands while the kernel is still
  inside that request's handler (after sending the reply, before restoring its handler), ipykernel logs
  "KeyboardInterrupt caught in kernel" in a run that succeeded. Every cell has finished by then, so the
  manager skips the interrupt at shutdown; the shutdown request, and a kill past its timeout, remain.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import papermill
from jupyter_client.manager import AsyncKernelManager
from traitlets import CaselessStrEnum


class StageKernelManager(AsyncKernelManager):
    transport_encryption = CaselessStrEnum(["disabled", "auto", "required"], default_value="required", config=True)

    async def _async_interrupt_kernel(self) -> None:
        if not self.shutting_down:
            await super()._async_interrupt_kernel()


def execute(notebook: Path, out: Path, parameters: Mapping[str, Any], cwd: Path, progress: bool = True) -> None:
    """Execute `notebook` with `parameters` into `out` (papermill's errors pass through)."""
    papermill.execute_notebook(str(notebook), str(out), parameters=dict(parameters), cwd=str(cwd), kernel_name="python3",
                               progress_bar=progress, log_output=False, kernel_manager_class=StageKernelManager)
