"""Testbeds to schedule on: provisioning the local control plane (`local`: etcd, kube-apiserver and KWOK on
loopback, no Docker) and a kind cluster (`kind`), the binaries and images they run (`build`, `pki`), and the
code the training pods run (`training`). A backend is handed what it needs of a running testbed: `running.connection`."""
