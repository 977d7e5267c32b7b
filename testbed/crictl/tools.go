//go:build tools

// Package tools records sigs.k8s.io/cri-tools/cmd/crictl as a dependency of this module.
package tools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
