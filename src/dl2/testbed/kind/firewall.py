"""The host's iptables rules the kind testbed adds, and their removal.

Two kinds of rules:

- FORWARD accepts for the kind network's bridge. Bridged traffic between node containers passes the
  host's iptables (br_netfilter), and where the FORWARD policy is DROP, workers cannot reach the control
  plane (kubeadm join times out). Each rule carries a comment naming the testbed, so `down` removes
  exactly these, even if the state file was lost.
- What the private dockerd itself leaves behind when it stops (its DOCKER* chains, the jumps to them, the
  FORWARD policy it set to DROP, IP forwarding it switched on): `snapshot` before it starts and
  `restore` after it stops undo those, unless another Docker daemon still runs and may rely on them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from dl2.errors import Dl2Error

COMMENT_PREFIX = "dl2-kind:"


def _iptables() -> str:
    found = shutil.which("iptables")
    if found is None:
        raise Dl2Error("the kind testbed needs iptables on the host: apt-get install iptables")
    return found


def _run(*args: str, check: bool = True) -> str:
    done = subprocess.run([_iptables(), "-w", *args], capture_output=True, text=True, check=False, timeout=60)
    if check and done.returncode != 0:
        raise Dl2Error(f"`iptables {' '.join(args)}` failed: {done.stderr.strip()}")
    return done.stdout


def accept_bridge(bridge: str, tag: str) -> list[list[str]]:
    """Insert FORWARD accepts for traffic into and out of `bridge`; returns the rule specs added."""
    rules = [["-i", bridge], ["-o", bridge]]
    added = []
    for match in rules:
        spec = ["FORWARD", *match, "-m", "comment", "--comment", f"{COMMENT_PREFIX}{tag}", "-j", "ACCEPT"]
        if subprocess.run([_iptables(), "-w", "-C", *spec], capture_output=True, check=False).returncode != 0:
            _run("-I", *spec)
        added.append(spec)
    return added


def delete_rules(rules: list[list[str]]) -> int:
    """Delete the given rule specs (each `CHAIN MATCH...`) where present; returns how many were deleted."""
    deleted = 0
    for spec in rules:
        while subprocess.run([_iptables(), "-w", "-D", *spec], capture_output=True, check=False).returncode == 0:
            deleted += 1
    return deleted


def tagged_rules(tag: str) -> list[list[str]]:
    """The FORWARD rules that carry this testbed's comment (as specs for `delete_rules`)."""
    if shutil.which("iptables") is None:
        return []
    found = []
    for line in _run("-S", "FORWARD", check=False).splitlines():
        if f"{COMMENT_PREFIX}{tag}" in line and line.startswith("-A FORWARD"):
            found.append([part.strip('"') for part in line.split()[1:]])
    return found


def snapshot() -> dict:
    """What a Docker daemon may change: the chains of the filter and nat tables, FORWARD's policy, IP forwarding."""
    chains = {table: sorted(_chains(table)) for table in ("filter", "nat")}
    policy = next((line.split()[2] for line in _run("-S", "FORWARD").splitlines() if line.startswith("-P FORWARD")), "ACCEPT")
    return {"chains": chains, "forward_policy": policy, "ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()}


def _chains(table: str) -> set[str]:
    return {line.split()[1] for line in _run("-t", table, "-S").splitlines() if line.startswith("-N ")}


def restore(before: dict) -> list[str]:
    """Undo what a Docker daemon added since `before` (its chains and the jumps to them, FORWARD's policy,
    IP forwarding), unless a Docker daemon still runs. Returns what was undone."""
    if dockerd_running():
        return []
    undone = []
    for table in ("filter", "nat"):
        new = {c for c in _chains(table) - set(before["chains"].get(table, [])) if c.startswith("DOCKER")}
        if not new:
            continue
        for line in _run("-t", table, "-S").splitlines():  # jumps into the new chains from the built-in ones
            parts = line.split()
            if parts[0] == "-A" and parts[1] not in new and "-j" in parts and parts[parts.index("-j") + 1] in new:
                _run("-t", table, "-D", *parts[1:], check=False)
        for chain in new:
            _run("-t", table, "-F", chain, check=False)
        for chain in new:
            _run("-t", table, "-X", chain, check=False)
        undone += [f"{table}/{chain}" for chain in sorted(new)]
    policy = next((line.split()[2] for line in _run("-S", "FORWARD").splitlines() if line.startswith("-P FORWARD")), None)
    if policy and policy != before["forward_policy"]:
        _run("-P", "FORWARD", before["forward_policy"])
        undone.append(f"FORWARD policy {policy} -> {before['forward_policy']}")
    forward = Path("/proc/sys/net/ipv4/ip_forward")
    if forward.read_text().strip() != before["ip_forward"]:
        forward.write_text(before["ip_forward"])
        undone.append(f"ip_forward -> {before['ip_forward']}")
    return undone


def dockerd_running() -> bool:
    """Whether a Docker daemon runs on this host (a zombie, one that has exited, does not count)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            name, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:]
            if name == "dockerd" and not state.startswith("Z"):
                return True
    return False
