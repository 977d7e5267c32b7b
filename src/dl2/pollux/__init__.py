"""The Pollux world (DESIGN §7): the GPU cluster of the Pollux artifact (Qiao et al., OSDI 2021), 16 nodes
of 4 GPUs scheduled every 60 s, where jobs train data-parallel with all-reduce and progress at their
goodput (throughput times statistical efficiency), and a job whose GPUs change restarts for 30 s.

`apps` holds the six applications' measurements, `kernels` the compiled job model, `cluster` the
interval loop, `policies` Optimus+Oracle, Tiresias and Pollux, `workload` the workload format and
`philly` the generator of new workloads from the Philly job log."""
