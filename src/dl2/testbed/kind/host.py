"""The host's tools the kind testbed runs (Docker, containerd, runc, debootstrap, iptables), installed
from the machine's Debian packages where they are missing, so a fresh machine needs no manual step."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable

from dl2.errors import Dl2Error

PACKAGES = {"dockerd": "docker.io", "docker": "docker.io", "runc": "runc", "containerd": "containerd",
            "ctr": "containerd", "debootstrap": "debootstrap", "iptables": "iptables"}  # tool -> Debian package


def ensure_tools(log: Callable[[str], object] = print) -> None:
    """Install the Debian packages of the tools not on PATH (as root, with apt-get); elsewhere, say what to install."""
    missing = {tool: package for tool, package in PACKAGES.items() if shutil.which(tool) is None}
    if not missing:
        return
    packages = sorted(set(missing.values()))
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Dl2Error(f"the kind testbed needs {', '.join(missing)}: install the Debian packages {' '.join(packages)} "
                       "(or your distribution's equivalents)")
    log(f"installing {' '.join(packages)} with apt-get (missing: {', '.join(missing)})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with tempfile.NamedTemporaryFile("w+", prefix="dl2-apt-", suffix=".log") as out:
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]):
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode != 0:
                out.seek(0)
                tail = "".join(out.readlines()[-15:])
                raise Dl2Error(f"`{' '.join(cmd)}` failed; install {' '.join(packages)} yourself:\n{tail}")
    still = [tool for tool in missing if shutil.which(tool) is None]
    if still:
        raise Dl2Error(f"after installing {' '.join(packages)}, still not on PATH: {', '.join(still)}")
