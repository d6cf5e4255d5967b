"""Benchmarking: workloads (prompt sets), and the bench / compare / score tools built on them."""
