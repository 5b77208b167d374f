"""trainhook: distributed training on plain Kubernetes workloads."""
