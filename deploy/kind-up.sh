#!/usr/bin/env bash
# One command for users with Docker: create the kind cluster, build and load the dl2 image, install the
# DL2Job CRD, advertise the dl2 CPU and GPU slots on the workers (extended resources dl2.io/cpu-slots and
# dl2.io/gpu-slots, which task pods request) and start the dl2 scheduler (two replicas, one elected by a
# Lease). Task pods hold their place and progress is emulated from the speed table; for pods that really
# train, use `dl2 testbed up --kind` (docs/testbed-kind.md). Needs docker, kind, kubectl.
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTER="${CLUSTER:-dl2}"
SLOTS_PER_NODE="${SLOTS_PER_NODE:-8}"  # the paper's servers: 8 CPU and 8 GPU slots each
for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "kind-up: $tool is not on PATH" >&2; exit 2; }
done
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --config deploy/kind-cluster.yaml
kubectl config use-context "kind-$CLUSTER"
docker build -f deploy/Dockerfile -t dl2:latest .
kind load docker-image dl2:latest --name "$CLUSTER"
kubectl apply -f src/dl2/kube/manifests/dl2job-crd.yaml
kubectl wait --for condition=established --timeout=60s crd/dl2jobs.dl2.io
for node in $(kubectl get nodes -l dl2.io/pool=dl2 -o name); do
  kubectl patch "$node" --subresource=status --type=json -p "[
    {\"op\": \"add\", \"path\": \"/status/capacity/dl2.io~1cpu-slots\", \"value\": \"$SLOTS_PER_NODE\"},
    {\"op\": \"add\", \"path\": \"/status/capacity/dl2.io~1gpu-slots\", \"value\": \"$SLOTS_PER_NODE\"}]"
done
kubectl apply -f deploy/manifests/scheduler.yaml
kubectl -n dl2 rollout status deployment/dl2-scheduler --timeout=180s
echo "kind-up: ready. Submit a trace: uv run dl2 testbed submit --kubeconfig ~/.kube/config --namespace dl2 --trace TRACE.csv"
