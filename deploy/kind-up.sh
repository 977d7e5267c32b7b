#!/usr/bin/env bash
# One command for users with Docker: create the kind cluster, build and load the dl2 image, install the
# DL2Job CRD, advertise fake GPUs on the workers and start the dl2 scheduler. Needs docker, kind, kubectl.
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTER="${CLUSTER:-dl2}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "kind-up: $tool is not on PATH" >&2; exit 2; }
done
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --config deploy/kind-cluster.yaml
kubectl config use-context "kind-$CLUSTER"
docker build -f deploy/Dockerfile -t dl2:latest .
kind load docker-image dl2:latest --name "$CLUSTER"
kubectl apply -f src/dl2/k8s/manifests/dl2job-crd.yaml
kubectl wait --for condition=established --timeout=60s crd/dl2jobs.dl2.io
for node in $(kubectl get nodes -l dl2.io/pool=dl2 -o name); do
  kubectl patch "$node" --subresource=status --type=json \
    -p "[{\"op\": \"add\", \"path\": \"/status/capacity/nvidia.com~1gpu\", \"value\": \"$GPUS_PER_NODE\"}]"
done
kubectl apply -f deploy/manifests/scheduler.yaml
kubectl -n dl2 rollout status deployment/dl2-scheduler --timeout=180s
echo "kind-up: ready. Submit a trace: uv run dl2 testbed submit --kubeconfig ~/.kube/config --namespace dl2 --trace TRACE.csv"
