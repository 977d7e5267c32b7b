//go:build tools

// Package tools records github.com/coredns/coredns as a dependency of this module.
package tools

import _ "github.com/coredns/coredns"
