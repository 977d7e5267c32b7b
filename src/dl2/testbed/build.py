"""Building both testbeds' binaries from the Go module proxy, once, into a cache keyed by the pins.

One build, with one set of flags (static: `CGO_ENABLED=0`; the Kubernetes version stamped in), serves
both testbeds: the local one runs etcd, kube-apiserver, kubectl and KWOK on the host, and the kind one
puts the same Kubernetes binaries into its node image (`dl2.testbed.kind`). The Go modules in `testbed/`
pin the versions:

- `testbed/apiserver`: k8s.io/kubernetes (kube-apiserver, kube-controller-manager, kube-scheduler,
  kube-proxy, kubelet, kubeadm, kubectl) and the etcd it uses;
- `testbed/kwok`: KWOK; `testbed/kind`: kind; `testbed/crictl`: cri-tools' crictl;
- `testbed/coredns`: the CoreDNS that kubeadm deploys; `testbed/pause`: the pod sandbox's process.

The cache folder is named after a hash of every module's go.mod, go.sum and Go files, the Go version and
the build flags, so changing a pin or a flag builds anew and an unchanged checkout reuses the binaries.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dl2.errors import Dl2Error
from dl2.paths import PACKAGE_DIR
from dl2.testbed.steps import timed_step

MODULES_DIR = PACKAGE_DIR.parents[1] / "testbed"
KUBERNETES_VERSION = "v1.37.2"  # k8s.io/kubernetes as testbed/apiserver pins it
CRICTL_VERSION = "v1.37.0"  # sigs.k8s.io/cri-tools as testbed/crictl pins it


def _kube_version_flags() -> str:
    """-X flags that stamp the Kubernetes version in (kubeadm and kubelet report v0.0.0 without them)."""
    major, minor, _ = KUBERNETES_VERSION.lstrip("v").split(".")
    values = {"gitVersion": KUBERNETES_VERSION, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean",
              "buildDate": "1970-01-01T00:00:00Z"}
    return " ".join(f"-X {pkg}.{key}={value}" for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
                    for key, value in values.items())


KUBE_LDFLAGS = f"-s -w {_kube_version_flags()}"
PLAIN_LDFLAGS = "-s -w"
# (binary, Go module folder under testbed/, package to build, -ldflags)
TARGETS = (
    ("etcd", "apiserver", "./etcd", PLAIN_LDFLAGS),
    ("kube-apiserver", "apiserver", "k8s.io/kubernetes/cmd/kube-apiserver", KUBE_LDFLAGS),
    ("kubectl", "apiserver", "k8s.io/kubernetes/cmd/kubectl", KUBE_LDFLAGS),
    ("kwok", "kwok", "sigs.k8s.io/kwok/cmd/kwok", PLAIN_LDFLAGS),
    ("kube-controller-manager", "apiserver", "k8s.io/kubernetes/cmd/kube-controller-manager", KUBE_LDFLAGS),
    ("kube-scheduler", "apiserver", "k8s.io/kubernetes/cmd/kube-scheduler", KUBE_LDFLAGS),
    ("kube-proxy", "apiserver", "k8s.io/kubernetes/cmd/kube-proxy", KUBE_LDFLAGS),
    ("kubelet", "apiserver", "k8s.io/kubernetes/cmd/kubelet", KUBE_LDFLAGS),
    ("kubeadm", "apiserver", "k8s.io/kubernetes/cmd/kubeadm", KUBE_LDFLAGS),
    ("kind", "kind", "sigs.k8s.io/kind", PLAIN_LDFLAGS),
    ("crictl", "crictl", "sigs.k8s.io/cri-tools/cmd/crictl",
     f"{PLAIN_LDFLAGS} -X sigs.k8s.io/cri-tools/pkg/version.Version={CRICTL_VERSION}"),
    ("coredns", "coredns", "github.com/coredns/coredns", PLAIN_LDFLAGS),
    ("pause", "pause", ".", PLAIN_LDFLAGS),
)
BUILD_ENV = {"CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly -buildvcs=false"}
BUILD_FLAGS = ("-trimpath",)


@dataclass(frozen=True)
class Binaries:
    folder: Path
    build_seconds: float  # 0 when taken from the cache
    step_seconds: dict[str, float] | None = None  # per binary, when built now

    def path(self, name: str) -> Path:
        return self.folder / name


def cache_root() -> Path:
    """`DL2_TESTBED_CACHE` if set, else `~/.cache/dl2/testbed`."""
    return Path(os.environ.get("DL2_TESTBED_CACHE") or Path.home() / ".cache" / "dl2" / "testbed")


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise Dl2Error("the testbeds build etcd, Kubernetes, KWOK and kind with Go: install Go >= 1.26 and put `go` on PATH")
    return go


def pins_digest(go: str) -> str:
    """A hash of every go.mod/go.sum/Go file of the modules built, the Go version and the build flags."""
    digest = hashlib.sha256()
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout.strip()
    digest.update(version.encode())
    digest.update(repr((sorted(BUILD_ENV.items()), BUILD_FLAGS, TARGETS)).encode())
    for module in sorted({m for _, m, _, _ in TARGETS}):
        folder = MODULES_DIR / module
        if not (folder / "go.mod").is_file():
            raise Dl2Error(f"{folder}: go.mod is missing (the testbed's Go modules come with the checkout)")
        if not (folder / "go.sum").is_file() and _requires_modules(folder / "go.mod"):
            raise Dl2Error(f"{folder}: go.sum is missing (the testbed's Go modules come with the checkout)")
        for f in sorted(p for p in folder.rglob("*") if p.name in ("go.mod", "go.sum") or p.suffix == ".go"):
            digest.update(str(f.relative_to(MODULES_DIR)).encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def _requires_modules(go_mod: Path) -> bool:
    return any(line.strip().startswith("require") for line in go_mod.read_text().splitlines())


def build_folder(go: str | None = None) -> Path:
    """The cache folder of the current pins (`bin/` holds the binaries; dl2.testbed.kind keeps its images beside)."""
    return cache_root() / pins_digest(go or _go())


def ensure_binaries(log: Callable[[str], object] = print) -> Binaries:
    """The binaries, built now if the cache does not hold them for these pins (a lock keeps builds single)."""
    go = _go()
    folder = build_folder(go) / "bin"
    if _complete(folder):
        return Binaries(folder, 0.0)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(folder):
            return Binaries(folder, 0.0)
        start = time.perf_counter()
        staging = folder.parent / "bin.partial"
        staging.mkdir(exist_ok=True)  # a killed build's finished binaries are kept (Go's cache makes the rest quick)
        build_log = folder.parent / "build.log"
        steps: dict[str, float] = {}
        with open(build_log, "a") as out:
            env = {**os.environ, **BUILD_ENV}
            for k, (name, module, package, ldflags) in enumerate(TARGETS, 1):
                if os.access(staging / name, os.X_OK):
                    continue
                out.write(f"== {name}: go build {package} ({time.strftime('%Y-%m-%d %H:%M:%S')})\n")
                out.flush()
                partial = staging / f".{name}.partial"
                with timed_step(log, f"[binaries {k}/{len(TARGETS)}] go build {name}", f"log: {build_log}") as took:
                    done = subprocess.run([go, "build", *BUILD_FLAGS, f"-ldflags={ldflags}", "-o", str(partial), package],
                                          cwd=MODULES_DIR / module, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
                    if done.returncode != 0:
                        raise Dl2Error(f"building {name} failed (exit {done.returncode}); see {build_log}")
                os.replace(partial, staging / name)
                steps[name] = took.seconds
                out.write(f"== {name}: {steps[name]:.1f} s\n")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(staging, folder)
        return Binaries(folder, time.perf_counter() - start, steps)


def _complete(folder: Path) -> bool:
    return all(os.access(folder / name, os.X_OK) for name, _, _, _ in TARGETS)
