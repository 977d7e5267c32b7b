#!/bin/sh
# cgroup v2: enable every controller for the kubelet's cgroup roots (/kubelet and /kubelet.slice).
set -eu
enable() { sed -e 's/ / +/g' -e 's/^/+/' "/sys/fs/cgroup/$1/cgroup.controllers" > "/sys/fs/cgroup/$1/cgroup.subtree_control"; }
enable /
for root in kubelet kubelet.slice; do
  mkdir -p "/sys/fs/cgroup/${root}"
  enable "/${root}"
done
