"""A real multi-replica testbed on one machine: N Triton replicas of the CPU deployment behind haproxy,
a real Prometheus running the rule file `toolkit deploy k8s` emits, and a controller applying the HPA's
algorithm (toolkit/deploy/hpa.py) to the emitted HPA by starting and draining replicas."""
