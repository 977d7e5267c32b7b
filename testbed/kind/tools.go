//go:build tools

// Package tools records sigs.k8s.io/kind as a dependency of this module.
package tools

import _ "sigs.k8s.io/kind"
