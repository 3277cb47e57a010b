"""GPU catalog: memory, HBM bandwidth, dense tensor-core throughput, interconnect — each cited.

Dense numbers (no 2:4 sparsity). Units: GB = 1e9 bytes, TB/s = 1e12 bytes/s, TFLOP/s = 1e12.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from toolkit.errors import ToolkitError


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gb: float
    bandwidth_tbs: float  # device memory bandwidth
    bf16_tflops: float  # dense bf16/fp16 tensor throughput
    fp8_tflops: float | None  # dense fp8 (None: no fp8 tensor cores)
    interconnect_gbs: float  # per-GPU bandwidth to peers (NVLink, else PCIe), one direction
    source: str

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    @property
    def bandwidth_bytes(self) -> float:
        return self.bandwidth_tbs * 1e12

    def peak_flops(self, weight_format: str) -> float:
        """Tensor throughput the matmuls of this weight format can use (fp8 only where supported)."""
        if weight_format == "fp8" and self.fp8_tflops:
            return self.fp8_tflops * 1e12
        return self.bf16_tflops * 1e12

    def crossover(self, weight_format: str = "bf16") -> float:
        """FLOP per byte above which a kernel is compute-bound on this GPU (the roofline's ridge)."""
        return self.peak_flops(weight_format) / self.bandwidth_bytes

    def to_dict(self) -> dict:
        return asdict(self)


GPUS: dict[str, GpuSpec] = {g.name: g for g in [
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5 / PCIe columns; dense = half the "with sparsity" figures).
    GpuSpec("h100-sxm", 80, 3.35, 989, 1979, 450, "NVIDIA H100 datasheet: SXM5, HBM3 3.35 TB/s, NVLink 900 GB/s bidirectional"),
    GpuSpec("h100-pcie", 80, 2.0, 756, 1513, 64, "NVIDIA H100 datasheet: PCIe, HBM2e 2 TB/s, PCIe Gen5 128 GB/s bidirectional"),
    # NVIDIA H200 datasheet (SXM): 141 GB HBM3e at 4.8 TB/s, same Hopper compute as H100 SXM.
    GpuSpec("h200", 141, 4.8, 989, 1979, 450, "NVIDIA H200 datasheet: SXM, HBM3e 4.8 TB/s, NVLink 900 GB/s bidirectional"),
    # NVIDIA DGX B200 datasheet: 8 GPUs, 1,440 GB HBM3e, 64 TB/s, 72 PF fp8 / 36 PF bf16 (sparse) in all.
    GpuSpec("b200", 180, 8.0, 2250, 4500, 900, "NVIDIA DGX B200 datasheet (per GPU), NVLink 5 1.8 TB/s bidirectional"),
    # NVIDIA A100 datasheet: 40 GB HBM2 1,555 GB/s; 80 GB HBM2e 2,039 GB/s; bf16 312 TFLOP/s dense; no fp8.
    GpuSpec("a100-40gb", 40, 1.555, 312, None, 300, "NVIDIA A100 datasheet: SXM 40 GB, NVLink 600 GB/s bidirectional"),
    GpuSpec("a100-80gb", 80, 2.039, 312, None, 300, "NVIDIA A100 datasheet: SXM 80 GB, NVLink 600 GB/s bidirectional"),
    # NVIDIA L40S datasheet: 48 GB GDDR6 864 GB/s; bf16 362 / fp8 733 TFLOP/s dense; PCIe Gen4 x16.
    GpuSpec("l40s", 48, 0.864, 362, 733, 32, "NVIDIA L40S datasheet, PCIe Gen4 x16 64 GB/s bidirectional"),
    # NVIDIA L4 datasheet: 24 GB GDDR6 300 GB/s; bf16 121 / fp8 242.5 TFLOP/s dense; PCIe Gen4 x16.
    GpuSpec("l4", 24, 0.300, 121, 242.5, 32, "NVIDIA L4 datasheet, PCIe Gen4 x16 64 GB/s bidirectional"),
    # NVIDIA A10 datasheet: 24 GB GDDR6 600 GB/s, bf16 125 TFLOP/s dense. AWS's A10G runs lower clocks:
    # treat compute as an upper bound.
    GpuSpec("a10g", 24, 0.600, 125, None, 32, "NVIDIA A10 datasheet (A10G is AWS's A10 variant), PCIe Gen4 x16"),
    # NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090: 1,008 GB/s; fp16/bf16 tensor with fp32
    # accumulate 165.2 TFLOP/s dense, fp8 330.3 dense (fp32 accumulate); no NVLink.
    GpuSpec("rtx-4090", 24, 1.008, 165.2, 330.3, 32, "NVIDIA Ada Lovelace whitepaper (RTX 4090), PCIe Gen4 x16"),
]}


def gpu_spec(name: str) -> GpuSpec:
    key = name.lower()
    if key == "cpu":
        from toolkit.plan.cpu_probe import cpu_spec

        return cpu_spec()
    if key not in GPUS:
        raise ToolkitError(f"unknown GPU {name!r}", f"use one of: {', '.join(GPUS)}, cpu")
    return GPUS[key]
