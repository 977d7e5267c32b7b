"""Tests against the local Kubernetes control plane."""
