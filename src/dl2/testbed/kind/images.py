"""Building the kind testbed's images offline: the node image and the training pods' runtime image.

No image registry is needed. Both images start from a Debian rootfs made by `debootstrap --variant=minbase`
against the host's apt mirror:

- the runtime image is that rootfs with the shared libraries a CPython and torch need (the pods run the
  host's interpreter and virtual environment through hostPath mounts, so the image holds no Python);
- the node image follows kind's node-image conventions (kind's `images/base` and `pkg/build/nodeimage`):
  systemd, containerd, runc and the CNI plugins from Debian, the Kubernetes binaries from
  `dl2.testbed.build`, kind's entrypoint and units (`node/`), and the control-plane images kubeadm asks for
  (`kubeadm config images list`), made here from the same binaries and imported, unpacked later, into
  the node's containerd as kind does.

Images are written as Docker archives (`docker load`, `ctr images import`) by this module, so their layers
and digests need no daemon. The result is cached beside the binaries, in a folder named after a hash of
the recipe (package lists, mirror, node files); a lock keeps builds single, a staging folder keeps the
finished steps of an interrupted build, and the finished folder is moved into place at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dl2.errors import Dl2Error
from dl2.testbed.build import KUBERNETES_VERSION, Binaries
from dl2.testbed.steps import timed_step

from .daemon import run

NODE_FILES = Path(__file__).with_name("node")
SUITE = "bookworm"
FORMAT = 2  # bump when the assembly below changes what it produces for the same recipe
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What a CPython (pyenv or Debian) and torch's wheels load from the system, and what kube-proxy runs.
RUNTIME_PACKAGES = (
    "ca-certificates", "libbz2-1.0", "libcom-err2", "libexpat1", "libffi8", "libgomp1", "libgssapi-krb5-2",
    "libkeyutils1", "liblzma5", "libncursesw6", "libnsl2", "libreadline8", "libsqlite3-0", "libssl3",
    "libstdc++6", "libtirpc3", "libuuid1", "zlib1g", "iproute2", "iptables", "nftables", "conntrack", "procps",
)
NODE_PACKAGES = (
    "systemd", "containerd", "runc", "containernetworking-plugins", "iptables", "nftables", "conntrack",
    "iproute2", "ethtool", "socat", "kmod", "libseccomp2", "ca-certificates", "procps", "iputils-ping", "e2fsprogs",
    "util-linux", "mount", "bash",
)
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
RUNTIME_REPOSITORY = "dl2.local/runtime"
NODE_REPOSITORY = "dl2.local/kind-node"
PINNED = "io.cri-containerd.pinned=pinned"


@dataclass(frozen=True)
class Images:
    """The built images: Docker archives and the references they load as."""

    folder: Path
    node: str
    runtime: str
    build_seconds: float  # 0 when taken from the cache
    steps: dict[str, float]

    @property
    def node_archive(self) -> Path:
        return self.folder / "node-image.tar"

    @property
    def runtime_archive(self) -> Path:
        return self.folder / "runtime-image.tar"


def apt_mirror() -> str:
    """`DL2_DEBIAN_MIRROR`, else the host's first apt source for Debian's main archive, else deb.debian.org."""
    if os.environ.get("DL2_DEBIAN_MIRROR"):
        return os.environ["DL2_DEBIAN_MIRROR"]
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.sources")),
               *sorted(Path("/etc/apt/sources.list.d").glob("*.list"))]
    for source in sources:
        try:
            text = source.read_text()
        except OSError:
            continue
        for uri in re.findall(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+" + SUITE + r"\s", text, re.M):
            return uri
        for stanza in text.split("\n\n"):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:(.*)$", stanza, re.M)
            if uris and suites and SUITE in suites.group(1).split() and "security" not in uris.group(1):
                return uris.group(1)
    return "http://deb.debian.org/debian"


def recipe_digest(mirror: str) -> str:
    """A hash of what the images are made of besides the binaries: packages, mirror, node files, format."""
    digest = hashlib.sha256(repr((FORMAT, SUITE, mirror, RUNTIME_PACKAGES, NODE_PACKAGES, KUBERNETES_VERSION)).encode())
    for f in sorted(NODE_FILES.iterdir()):
        digest.update(f.name.encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def images_folder(binaries: Binaries) -> Path:
    """Where the images of these binaries and this recipe are (or will be) cached."""
    return binaries.folder.parent / "kind" / recipe_digest(apt_mirror())


def cached(binaries: Binaries) -> Images | None:
    """The images already built for these binaries and this recipe, if any."""
    folder = images_folder(binaries)
    manifest = folder / "images.json"
    if not manifest.is_file():
        return None
    raw = json.loads(manifest.read_text())
    return Images(folder, raw["node"], raw["runtime"], 0.0, raw["steps"])


def ensure_images(binaries: Binaries, log: Callable[[str], object] = print) -> Images:
    """The node and runtime images for these binaries, built now if the cache does not hold them."""
    found = cached(binaries)
    if found is not None:
        return found
    if os.geteuid() != 0:
        raise Dl2Error("building the kind images offline needs root (debootstrap, chroot, containerd): run as root, "
                       "or on a machine that can pull kindest/node")
    for tool, package in (("debootstrap", "debootstrap"), ("containerd", "containerd"), ("ctr", "containerd"),
                          ("tar", "tar")):
        if shutil.which(tool) is None:
            raise Dl2Error(f"building the kind images offline needs `{tool}`: apt-get install {package}")
    folder = images_folder(binaries)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = cached(binaries)
        if found is not None:
            return found
        staging = folder.parent / f"{folder.name}.partial"
        staging.mkdir(exist_ok=True)
        builder = _Builder(staging, binaries, apt_mirror(), log)
        images = builder.build()
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(staging, folder)
        return Images(folder, images.node, images.runtime, images.build_seconds, images.steps)


class _Builder:
    """The build's steps, each done once per staging folder (a marker file records it done)."""

    def __init__(self, staging: Path, binaries: Binaries, mirror: str, log: Callable[[str], object]):
        self.staging, self.binaries, self.mirror, self.log = staging, binaries, mirror, log
        self.build_log = staging / "build.log"
        self.steps: dict[str, float] = json.loads((staging / "steps.json").read_text()) if (staging / "steps.json").is_file() else {}

    def step(self, key: str, text: str, action: Callable[[], None], index: int, total: int) -> None:
        marker = self.staging / f"{key}.done"
        if marker.exists():
            return
        with open(self.build_log, "a") as out:
            out.write(f"== {key}: {text} ({time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        with timed_step(self.log, f"[images {index}/{total}] {text}", f"log: {self.build_log}") as took:
            action()
        self.steps[key] = round(took.seconds, 1)
        (self.staging / "steps.json").write_text(json.dumps(self.steps, indent=2))
        marker.touch()

    def sh(self, cmd: list[str], **kwargs) -> None:
        """Run a build command with its output appended to the build log."""
        with open(self.build_log, "a") as out:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False, **kwargs)
        if done.returncode != 0:
            raise Dl2Error(f"`{' '.join(cmd[:3])} …` failed (exit {done.returncode}); see {self.build_log}")

    def build(self) -> Images:
        start = time.perf_counter()
        runtime_root, node_root = self.staging / "runtime-rootfs", self.staging / "node-rootfs"
        debs = self.staging.parent / "debs"  # downloaded packages, shared by both rootfs and later builds
        debs.mkdir(exist_ok=True)
        steps = [
            ("runtime-rootfs", f"debootstrap the runtime rootfs ({SUITE} minbase and the libraries Python loads)",
             lambda: self.debootstrap(runtime_root, RUNTIME_PACKAGES, debs)),
            ("node-rootfs", f"debootstrap the node rootfs ({SUITE} minbase, systemd, containerd, runc, CNI plugins)",
             lambda: self.debootstrap(node_root, NODE_PACKAGES, debs)),
            ("runtime-image", "write the runtime image", lambda: self.runtime_image(runtime_root)),
            ("control-plane-images", "write the control-plane images kubeadm asks for",
             lambda: self.control_plane_images(runtime_root)),
            ("node-files", "put the Kubernetes binaries and kind's node files into the node rootfs",
             lambda: self.node_files(node_root)),
            ("node-import", "import the control-plane images into the node's containerd", lambda: self.node_import(node_root)),
            ("node-image", "write the node image", lambda: self.node_image(node_root)),
        ]
        for k, (key, text, action) in enumerate(steps, 1):
            self.step(key, text, action, k, len(steps))
        refs = json.loads((self.staging / "refs.json").read_text())
        shutil.rmtree(runtime_root, ignore_errors=True)
        shutil.rmtree(node_root, ignore_errors=True)
        shutil.rmtree(self.staging / "control-plane", ignore_errors=True)
        for marker in self.staging.glob("*.done"):
            marker.unlink()
        seconds = time.perf_counter() - start
        (self.staging / "images.json").write_text(json.dumps({**refs, "steps": self.steps, "mirror": self.mirror}, indent=2))
        return Images(self.staging, refs["node"], refs["runtime"], seconds, self.steps)

    # -- the steps

    def debootstrap(self, root: Path, packages: Iterable[str], debs: Path) -> None:
        """`root` as debootstrap makes it; the result is kept as a tar named after the packages and mirror, so a
        change elsewhere in the recipe (node files, format) does not run debootstrap again."""
        packages = sorted(packages)
        key = hashlib.sha256(repr((SUITE, self.mirror, packages)).encode()).hexdigest()[:16]
        kept = self.staging.parent / "rootfs" / f"{root.name}-{key}.tar"
        shutil.rmtree(root, ignore_errors=True)
        if kept.is_file():
            root.mkdir(parents=True)
            self.sh(["tar", "--numeric-owner", "-C", str(root), "-xf", str(kept)])
            return
        self.sh(["debootstrap", "--variant=minbase", f"--cache-dir={debs}", f"--include={','.join(packages)}", SUITE,
                 str(root), self.mirror])
        for junk in ("var/lib/apt/lists", "var/cache/apt", "usr/share/doc", "usr/share/man", "usr/share/info", "var/log"):
            target = root / junk
            if target.is_dir():
                for child in target.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
        (root / "etc" / "machine-id").unlink(missing_ok=True)
        (root / "etc" / "hostname").unlink(missing_ok=True)
        kept.parent.mkdir(exist_ok=True)
        self.sh(["tar", "--numeric-owner", "--one-file-system", "-C", str(root), "-cf", f"{kept}.partial", "."])
        os.replace(f"{kept}.partial", kept)

    def runtime_image(self, runtime_root: Path) -> None:
        # pods run as a non-root user the interpreter mounted from the host, which may live under /root
        (runtime_root / "root").chmod(0o755)
        layer = self.staging / "runtime-layer.tar"
        self.sh(["tar", "--numeric-owner", "--one-file-system", "-C", str(runtime_root), "-cf", str(layer), "."])
        digest = _sha256(layer)
        ref = f"{RUNTIME_REPOSITORY}:{digest[:12]}"  # the content hash of its one layer
        write_archive(self.staging / "runtime-image.tar", ref, [layer], {"Env": [f"PATH={PATH}"], "Cmd": ["/bin/bash"]})
        layer.unlink()
        self._refs(runtime=ref)

    def control_plane_images(self, runtime_root: Path) -> None:
        """registry.k8s.io images made from our binaries, tagged as kubeadm (this version) names them."""
        wanted = run([str(self.binaries.path("kubeadm")), "config", "images", "list",
                      f"--kubernetes-version={KUBERNETES_VERSION}"], timeout=60).stdout.decode().split()
        out = self.staging / "control-plane"
        out.mkdir(exist_ok=True)
        base_layer = out / "base-layer.tar"  # kube-proxy runs iptables: it gets the runtime rootfs beneath it
        self.sh(["tar", "--numeric-owner", "--one-file-system", "-C", str(runtime_root), "-cf", str(base_layer), "."])
        env = {"Env": [f"PATH={PATH}"]}
        for ref in wanted:
            name = ref.rsplit("/", 1)[1].split(":")[0]
            if name in (*CONTROL_PLANE, "kube-proxy", "etcd"):
                layer = _files_layer(out, {f"usr/local/bin/{name}": self.binaries.path(name)})
                layers = [base_layer, layer] if name == "kube-proxy" else [layer]
                write_archive(out / f"{name}.tar", ref, layers, {**env, "Entrypoint": [f"/usr/local/bin/{name}"]})
            elif name == "coredns":
                layer = _files_layer(out, {"coredns": self.binaries.path("coredns")})
                write_archive(out / f"{name}.tar", ref, [layer], {**env, "Entrypoint": ["/coredns"], "ExposedPorts": {"53/udp": {}}})
            elif name == "pause":
                layer = _files_layer(out, {"pause": self.binaries.path("pause")})
                write_archive(out / f"{name}.tar", ref, [layer], {**env, "Entrypoint": ["/pause"]})
                self._refs(pause=ref)
            else:
                raise Dl2Error(f"kubeadm {KUBERNETES_VERSION} asks for {ref}, which dl2 cannot build offline")
        for layer in out.glob("*layer*.tar"):
            layer.unlink()
        self._refs(control_plane=wanted)

    def node_files(self, root: Path) -> None:
        """kind's node layout: binaries in /usr/bin, /kind/version, the units and configs, only our services on."""
        for name in ("kubelet", "kubeadm", "kubectl"):
            _install(self.binaries.path(name), root / "usr/bin" / name, 0o755)
        _install(self.binaries.path("crictl"), root / "usr/local/bin/crictl", 0o755)
        node = NODE_FILES
        pause = json.loads((self.staging / "refs.json").read_text())["pause"]
        _install(node / "entrypoint", root / "usr/local/bin/entrypoint", 0o755)
        _install(node / "kubelet-cgroup-v2.sh", root / "kind/bin/kubelet-cgroup-v2.sh", 0o755)
        (root / "etc/containerd").mkdir(parents=True, exist_ok=True)
        (root / "etc/containerd/config.toml").write_text((node / "containerd.toml").read_text().replace("@PAUSE_IMAGE@", pause))
        spec = json.loads(run(["ctr", "oci", "spec"], timeout=60).stdout)
        spec["process"].pop("rlimits", None)
        (root / "etc/containerd/cri-base.json").write_text(json.dumps(spec, indent=2))
        _install(node / "crictl.yaml", root / "etc/crictl.yaml", 0o644)
        _install(node / "kubelet.env", root / "etc/default/kubelet", 0o644)
        _install(node / "sysctl.conf", root / "etc/sysctl.d/10-dl2-kind.conf", 0o644)
        system = root / "etc/systemd/system"
        for unit in ("containerd.service", "kubelet.service", "kubelet.slice", "undo-mount-hacks.service"):
            _install(node / unit, system / unit, 0o644)
        for dropin in ("10-kubeadm.conf", "11-kind.conf"):
            _install(node / dropin, system / "kubelet.service.d" / dropin, 0o644)
        # only our services start (as in kind's base image): drop what the packages enabled
        lib = root / "lib/systemd/system"
        for pattern in ("sysinit.target.wants/systemd-tmpfiles-setup.service", "multi-user.target.wants/*",
                        "local-fs.target.wants/*", "sockets.target.wants/*udev*", "sockets.target.wants/*initctl*",
                        "basic.target.wants/*"):
            for link in lib.glob(pattern):
                link.unlink()
        for link in system.glob("*.wants/*"):
            link.unlink()
        enabled = system / "multi-user.target.wants"
        enabled.mkdir(exist_ok=True)
        for unit in ("containerd.service", "kubelet.service", "undo-mount-hacks.service"):
            _symlink(enabled / unit, f"/etc/systemd/system/{unit}")
        _symlink(system / "systemd-binfmt.service", "/dev/null")
        journald = root / "etc/systemd/journald.conf"
        journald.write_text(journald.read_text() + "\nReadKMsg=no\n")
        _symlink(root / "sbin/init", "/lib/systemd/systemd")
        for folder in ("etc/kubernetes/manifests", "etc/cni/net.d", "var/lib/kubelet", "kind/manifests"):
            (root / folder).mkdir(parents=True, exist_ok=True)
        (root / "kind/version").write_text(KUBERNETES_VERSION)

    def node_import(self, root: Path) -> None:
        """Import the control-plane archives into <root>/var/lib/containerd with a containerd of our own."""
        refs = json.loads((self.staging / "refs.json").read_text())["control_plane"]
        with tempfile.TemporaryDirectory(prefix="dl2-ctrd-", dir="/tmp") as scratch:
            socket = Path(scratch) / "c.sock"
            config = Path(scratch) / "config.toml"
            config.write_text(
                f'version = 2\nroot = "{root / "var/lib/containerd"}"\nstate = "{Path(scratch) / "state"}"\n'
                'disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.opt", '
                '"io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", '
                '"io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]\n'
                f'[grpc]\n  address = "{socket}"\n[ttrpc]\n  address = "{socket}.ttrpc"\n')
            with open(self.build_log, "a") as out:
                daemon = subprocess.Popen(["containerd", f"--config={config}"], stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True)
            try:
                deadline = time.monotonic() + 30
                while not socket.exists():
                    if daemon.poll() is not None or time.monotonic() > deadline:
                        raise Dl2Error(f"containerd (for the node image's imports) did not start; see {self.build_log}")
                    time.sleep(0.1)
                ctr = ["ctr", f"--address={socket}", "--namespace=k8s.io"]
                archives = sorted((self.staging / "control-plane").glob("*.tar"), key=lambda a: -a.stat().st_size)
                with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # gzip of the layers: one core each
                    list(pool.map(lambda a: self.sh([*ctr, "images", "import", "--no-unpack", "--all-platforms",
                                                     "--compress-blobs", str(a)]), archives))
                for ref in refs:
                    self.sh([*ctr, "images", "label", ref, PINNED])
                listed = run([*ctr, "images", "list", "-q"], timeout=60).stdout.decode().split()
                missing = sorted(set(refs) - set(listed))
                if missing:
                    raise Dl2Error(f"the node's containerd lacks {missing} after the import; see {self.build_log}")
            finally:
                daemon.terminate()
                daemon.wait(timeout=30)

    def node_image(self, root: Path) -> None:
        layer = self.staging / "node-layer.tar"
        self.sh(["tar", "--numeric-owner", "--one-file-system", "--xattrs", "-C", str(root), "-cf", str(layer), "."])
        digest = _sha256(layer)
        ref = f"{NODE_REPOSITORY}:{KUBERNETES_VERSION}-{digest[:12]}"
        write_archive(self.staging / "node-image.tar", ref, [layer], {
            "Env": ["container=docker", f"PATH={PATH}"], "Entrypoint": ["/usr/local/bin/entrypoint", "/sbin/init"],
            "StopSignal": "SIGRTMIN+3"})
        layer.unlink()
        self._refs(node=ref)

    def _refs(self, **refs) -> None:
        path = self.staging / "refs.json"
        known = json.loads(path.read_text()) if path.is_file() else {}
        path.write_text(json.dumps({**known, **refs}, indent=2))


# -- Docker archives


def write_archive(path: Path, ref: str, layers: list[Path], config: dict) -> str:
    """Write a Docker image archive (`docker save` format) of uncompressed `layers`; returns the image id."""
    diff_ids = [f"sha256:{_sha256(layer)}" for layer in layers]
    image_config = {"architecture": "amd64", "os": "linux", "config": config,
                    "rootfs": {"type": "layers", "diff_ids": diff_ids},
                    "history": [{"created_by": "dl2.testbed.kind.images"} for _ in layers]}
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    image_id = hashlib.sha256(config_bytes).hexdigest()
    members = [f"{d.split(':')[1]}/layer.tar" for d in diff_ids]
    manifest = [{"Config": f"{image_id}.json", "RepoTags": [ref], "Layers": members}]
    partial = path.with_suffix(".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as archive:
        _add_bytes(archive, f"{image_id}.json", config_bytes)
        for layer, member in zip(layers, members):
            info = archive.gettarinfo(str(layer), arcname=member)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(layer, "rb") as f:
                archive.addfile(info, f)
        _add_bytes(archive, "manifest.json", json.dumps(manifest).encode())
    os.replace(partial, path)
    return image_id


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    archive.addfile(info, io.BytesIO(data))


def _files_layer(folder: Path, files: dict[str, Path]) -> Path:
    """A reproducible layer tar holding `files` (path in the image -> file here) and /tmp."""
    data = hashlib.sha256(repr(sorted((k, str(v)) for k, v in files.items())).encode()).hexdigest()[:12]
    path = folder / f"layer-{data}.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        dirs = sorted({str(Path(p).parent) for p in files if str(Path(p).parent) != "."} | {"tmp"})
        for d in dirs:
            parts = Path(d).parts
            for k in range(1, len(parts) + 1):
                name = "/".join(parts[:k])
                if name in archive.getnames():
                    continue
                info = tarfile.TarInfo(name)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
                archive.addfile(info)
        for name, source in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = source.stat().st_size, 0o755
            with open(source, "rb") as f:
                archive.addfile(info, f)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _install(source: Path, target: Path, mode: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    shutil.copyfile(source, target)
    target.chmod(mode)


def _symlink(link: Path, target: str) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)
