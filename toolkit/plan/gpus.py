"""GPU catalog: memory, HBM bandwidth, dense peaks per compute type, interconnect — each cited.

`hardware_spec(name)` resolves a catalog name or `cpu` (this machine, probed by cpu_probe).
"""

from __future__ import annotations

from toolkit.errors import ToolkitError
from toolkit.plan.hardware import HardwareSpec

def _gpu(name, memory_gb, bandwidth_tbs, fp32, bf16, fp8, int8, interconnect_gbs, source, fp4=None) -> HardwareSpec:
    peaks = {"fp32": fp32, "bf16": bf16, "fp8": fp8, "int8": int8, "fp4": fp4}
    return HardwareSpec(name, memory_gb, bandwidth_tbs, {k: v for k, v in peaks.items() if v}, interconnect_gbs, source)


# Dense figures: the datasheets' "with sparsity" tensor figures halved. fp32 is the non-tensor-core
# rate (TF32 tensor cores are not what an fp32 engine is guaranteed to use).
GPUS: dict[str, HardwareSpec] = {g.name: g for g in [
    # NVIDIA H100 Tensor Core GPU datasheet, SXM5 / PCIe columns.
    _gpu("h100-sxm", 80, 3.35, 67, 989, 1979, 1979, 450,
         "NVIDIA H100 datasheet: SXM5, HBM3 3.35 TB/s, NVLink 900 GB/s bidirectional"),
    _gpu("h100-pcie", 80, 2.0, 51, 756, 1513, 1513, 64,
         "NVIDIA H100 datasheet: PCIe, HBM2e 2 TB/s, PCIe Gen5 128 GB/s bidirectional"),
    # NVIDIA H200 datasheet (SXM): 141 GB HBM3e at 4.8 TB/s, same Hopper compute as H100 SXM.
    _gpu("h200", 141, 4.8, 67, 989, 1979, 1979, 450,
         "NVIDIA H200 datasheet: SXM, HBM3e 4.8 TB/s, NVLink 900 GB/s bidirectional"),
    # NVIDIA DGX B200 datasheet: 8 GPUs, 1,440 GB HBM3e, 64 TB/s, 144 PF fp4 / 72 PF fp8 / 36 PF bf16
    # (sparse) in all; HGX B200: fp32 600 TFLOP/s for 8. Blackwell adds fp4 (NVFP4) tensor cores.
    _gpu("b200", 180, 8.0, 75, 2250, 4500, 4500, 900,
         "NVIDIA DGX B200 datasheet (per GPU), NVLink 5 1.8 TB/s bidirectional", fp4=9000),
    # NVIDIA A100 datasheet: 40 GB HBM2 1,555 GB/s; 80 GB HBM2e 2,039 GB/s; fp32 19.5, bf16 312,
    # int8 624 TOPS dense; no fp8.
    _gpu("a100-40gb", 40, 1.555, 19.5, 312, None, 624, 300,
         "NVIDIA A100 datasheet: SXM 40 GB, NVLink 600 GB/s bidirectional"),
    _gpu("a100-80gb", 80, 2.039, 19.5, 312, None, 624, 300,
         "NVIDIA A100 datasheet: SXM 80 GB, NVLink 600 GB/s bidirectional"),
    # NVIDIA L40S datasheet: 48 GB GDDR6 864 GB/s; fp32 91.6, bf16 362, fp8 733, int8 733 dense.
    _gpu("l40s", 48, 0.864, 91.6, 362, 733, 733, 32,
         "NVIDIA L40S datasheet, PCIe Gen4 x16 64 GB/s bidirectional"),
    # NVIDIA L4 datasheet: 24 GB GDDR6 300 GB/s; fp32 30.3, bf16 121, fp8 242.5, int8 242.5 dense.
    _gpu("l4", 24, 0.300, 30.3, 121, 242.5, 242.5, 32,
         "NVIDIA L4 datasheet, PCIe Gen4 x16 64 GB/s bidirectional"),
    # NVIDIA A10 datasheet: 24 GB GDDR6 600 GB/s, fp32 31.2, bf16 125, int8 250 dense. AWS's A10G runs
    # lower clocks: treat compute as an upper bound.
    _gpu("a10g", 24, 0.600, 31.2, 125, None, 250, 32,
         "NVIDIA A10 datasheet (A10G is AWS's A10 variant), PCIe Gen4 x16"),
    # NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090: 1,008 GB/s; fp32 82.6; fp16/bf16
    # with fp32 accumulate 165.2, fp8 (fp32 accumulate) 330.3, int8 660.6 dense; no NVLink.
    _gpu("rtx-4090", 24, 1.008, 82.6, 165.2, 330.3, 660.6, 32,
         "NVIDIA Ada Lovelace whitepaper (RTX 4090), PCIe Gen4 x16"),
]}


def is_cpu(name: str) -> bool:
    return name.lower() == "cpu"


def catalog_gpu(name: str) -> HardwareSpec:
    key = name.lower()
    if key not in GPUS:
        raise ToolkitError(f"unknown GPU {name!r}", f"use one of: {', '.join(GPUS)}, cpu")
    return GPUS[key]


def hardware_spec(name: str, reprobe: bool = False, binding=None) -> HardwareSpec:
    """A catalog GPU, or `cpu`: this machine as the probe measured it on `binding` (the CPU engine's CPUs and threads,
    cpu_binding.CpuBinding; None: its default) (cached; `reprobe` measures again)."""
    if is_cpu(name):
        from toolkit.plan.cpu_probe import cpu_spec  # the probe imports torch: only when asked for

        return cpu_spec(refresh=reprobe, binding=binding)
    return catalog_gpu(name)


gpu_spec = hardware_spec  # the name callers outside the planner use
