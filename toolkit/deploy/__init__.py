"""Cluster output for a deployment: Kubernetes manifests, monitoring rules, autoscaling, and a local
testbed that runs the same rules and the HPA's algorithm against real Triton replicas."""
