"""This machine as a 'GPU' for the planner: measured once (memory bandwidth, fp32 matmul), cached."""

from __future__ import annotations

import json
import os
import time

from toolkit.cache import CACHE_ROOT
from toolkit.plan.gpus import GpuSpec

CACHE = CACHE_ROOT / "cpu_probe.json"


def measure_cpu(seconds: float = 0.5) -> dict:
    import numpy as np
    import torch

    # Bandwidth: a large copy reads and writes every byte once (2 × size moved).
    src = np.ones(64 * 1024 * 1024 // 8)  # 64 MiB, beyond the caches
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    bandwidth = 2 * src.nbytes / best
    # Matmul throughput in the dtype the CPU engine computes in (float32).
    a = torch.randn(1024, 1024)
    b = torch.randn(1024, 1024)
    torch.mm(a, b)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        count += 1
    flops = 2 * 1024 ** 3 * count / (time.perf_counter() - start)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"bandwidth_bytes_s": bandwidth, "fp32_flops": flops, "memory_bytes": memory,
            "threads": torch.get_num_threads(), "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}


def cpu_probe(refresh: bool = False) -> dict:
    if CACHE.is_file() and not refresh:
        return json.loads(CACHE.read_text())
    result = measure_cpu()
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    CACHE.write_text(json.dumps(result, indent=2) + "\n")
    return result


def cpu_spec(refresh: bool = False) -> GpuSpec:
    probe = cpu_probe(refresh)
    tflops = probe["fp32_flops"] / 1e12
    return GpuSpec("cpu", probe["memory_bytes"] / 1e9, probe["bandwidth_bytes_s"] / 1e12, tflops, None, 0,
                   f"measured on this machine {probe['measured']} ({probe['threads']} threads; {CACHE})")
