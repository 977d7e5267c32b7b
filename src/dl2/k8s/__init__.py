"""DL2 on Kubernetes: a local control plane (etcd, kube-apiserver, KWOK), the DL2Job resource, the dl2
scheduler and progress emulator, and a Kubernetes backend for the simulator's protocol (DESIGN §6)."""
