// Command etcd is the etcd server, built at the version k8s.io/kubernetes pins.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
