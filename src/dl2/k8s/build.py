"""Building the control plane's binaries from the Go module proxy, once, into a cache keyed by the pins.

`testbed/apiserver` pins k8s.io/kubernetes (kube-apiserver, kubectl) and the etcd it uses;
`testbed/kwok` pins KWOK. The cache folder is named after a hash of both modules' go.mod and go.sum and
the Go version, so changing a pin builds anew and an unchanged checkout reuses the binaries.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from dl2.errors import Dl2Error
from dl2.paths import PACKAGE_DIR

MODULES_DIR = PACKAGE_DIR.parents[1] / "testbed"
# (binary, Go module folder under testbed/, package to build)
TARGETS = (
    ("etcd", "apiserver", "./etcd"),
    ("kube-apiserver", "apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
    ("kubectl", "apiserver", "k8s.io/kubernetes/cmd/kubectl"),
    ("kwok", "kwok", "sigs.k8s.io/kwok/cmd/kwok"),
)


@dataclass(frozen=True)
class Binaries:
    folder: Path
    build_seconds: float  # 0 when taken from the cache

    def path(self, name: str) -> Path:
        return self.folder / name


def cache_root() -> Path:
    """`DL2_TESTBED_CACHE` if set, else `~/.cache/dl2/testbed`."""
    return Path(os.environ.get("DL2_TESTBED_CACHE") or Path.home() / ".cache" / "dl2" / "testbed")


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise Dl2Error("the local testbed builds etcd, kube-apiserver and KWOK with Go: install Go >= 1.26 and put `go` on PATH")
    return go


def pins_digest(go: str) -> str:
    """A hash of every go.mod/go.sum under testbed/ and of the Go version."""
    digest = hashlib.sha256()
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout.strip()
    digest.update(version.encode())
    for module in sorted({m for _, m, _ in TARGETS}):
        folder = MODULES_DIR / module
        if not (folder / "go.mod").is_file() or not (folder / "go.sum").is_file():
            raise Dl2Error(f"{folder}: go.mod or go.sum is missing (the testbed's Go modules come with the checkout)")
        for f in sorted(p for p in folder.rglob("*") if p.name in ("go.mod", "go.sum") or p.suffix == ".go"):
            digest.update(str(f.relative_to(MODULES_DIR)).encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def ensure_binaries(log=print) -> Binaries:
    """The binaries, built now if the cache does not hold them for these pins (a lock keeps builds single)."""
    go = _go()
    folder = cache_root() / pins_digest(go) / "bin"
    if _complete(folder):
        return Binaries(folder, 0.0)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(folder):
            return Binaries(folder, 0.0)
        start = time.perf_counter()
        staging = folder.parent / "bin.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        build_log = folder.parent / "build.log"
        with open(build_log, "w") as out:
            for name, module, package in TARGETS:
                log(f"building {name} (log: {build_log})")
                out.write(f"== {name}: go build {package}\n")
                out.flush()
                env = {**os.environ, "GOFLAGS": "-mod=readonly -buildvcs=false"}
                done = subprocess.run([go, "build", "-trimpath", "-o", str(staging / name), package],
                                      cwd=MODULES_DIR / module, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
                if done.returncode != 0:
                    raise Dl2Error(f"building {name} failed (exit {done.returncode}); see {build_log}")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(staging, folder)
        return Binaries(folder, time.perf_counter() - start)


def _complete(folder: Path) -> bool:
    return all(os.access(folder / name, os.X_OK) for name, _, _ in TARGETS)
