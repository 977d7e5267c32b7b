//go:build tools

// Package tools records the kube-apiserver and kubectl commands as dependencies of this module.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
