"""Memory plan: weight bytes, KV-cache bytes per token, KV capacity, and whether it fits. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.errors import ToolkitError
from toolkit.model.spec import ModelSpec
from toolkit.plan.gpus import GpuSpec

# Bytes per weight element of the quantized matmuls; embeddings, lm_head and norms stay 16-bit.
WEIGHT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
KV_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "int8": 1}
INT4_GROUP = 128  # AWQ group size; one fp16 scale per group
QFORMAT_TO_WEIGHTS = {"none": "bf16", "fp8": "fp8", "int8_sq": "int8", "int4_awq": "int4", "w4a8_awq": "int4"}


@dataclass(frozen=True)
class Deployment:
    """What is planned: parallelism, formats and the workload's shapes."""

    tp: int = 1
    pp: int = 1
    weights: str = "bf16"
    kv_dtype: str = "bf16"
    kv_free_mem_fraction: float = 0.9
    runtime_overhead_gb: float = 2.0  # activations, CUDA context, workspace: not available to weights or KV
    max_seq_len: int = 4096
    batch: int = 8
    isl: int = 1000
    osl: int = 200
    prefill_efficiency: float = 0.6  # fraction of peak a real prefill reaches (expected vs floor)
    allreduce_latency_us: float = 5.0  # fixed cost per all-reduce (launch + sync), NVLink-class
    kv_cache_tokens: int | None = None  # a fixed-size paged cache (the CPU engine's blocks × tokens_per_block)

    def validate(self, spec: ModelSpec) -> None:
        positive = {"tp": self.tp, "pp": self.pp, "max_seq_len": self.max_seq_len, "batch": self.batch,
                    "isl": self.isl, "osl": self.osl}
        for name, value in positive.items():
            if value <= 0:
                raise ToolkitError(f"{name} must be positive (got {value})", f"pass a positive --{name.replace('_', '-')}")
        if not 0 < self.kv_free_mem_fraction <= 1:
            raise ToolkitError(f"kv free memory fraction must be in (0, 1] (got {self.kv_free_mem_fraction})",
                               "pass e.g. --kv-fraction 0.9")
        if not 0 < self.prefill_efficiency <= 1:
            raise ToolkitError("prefill efficiency must be in (0, 1]", "pass e.g. --efficiency 0.6")
        if self.weights not in WEIGHT_BYTES:
            raise ToolkitError(f"unknown weight format {self.weights!r}", f"use one of {', '.join(WEIGHT_BYTES)}")
        if self.kv_dtype not in KV_BYTES:
            raise ToolkitError(f"unknown KV cache dtype {self.kv_dtype!r}", f"use one of {', '.join(KV_BYTES)}")
        if spec.num_heads % self.tp:
            divisors = [d for d in range(1, spec.num_heads + 1) if spec.num_heads % d == 0]
            raise ToolkitError(f"tp={self.tp} does not divide the {spec.num_heads} attention heads of {spec.name}",
                               f"choose tp from {divisors}")
        if spec.num_layers % self.pp:
            raise ToolkitError(f"pp={self.pp} does not divide the {spec.num_layers} layers of {spec.name}",
                               "choose a pp that divides the layer count")
        if self.isl + self.osl > self.max_seq_len:
            raise ToolkitError(f"isl + osl = {self.isl + self.osl} exceeds max_seq_len {self.max_seq_len}",
                               "raise --max-seq-len or shorten the request")


def weight_bytes(spec: ModelSpec, weights: str) -> float:
    """Total weight bytes: quantized matmuls (+ int4 group scales), 16-bit embeddings, lm_head, norms."""
    per = WEIGHT_BYTES[weights]
    linear = spec.linear_params * per
    if weights == "int4":
        linear += spec.linear_params / INT4_GROUP * 2
    other = spec.total_params - spec.linear_params  # embeddings, lm_head, norms
    return linear + other * (4.0 if weights == "fp32" else 2.0)


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str) -> int:
    """2 (K and V) × layers × kv_heads × head_dim × bytes."""
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * KV_BYTES[kv_dtype]


def kv_bytes_per_token_per_gpu(spec: ModelSpec, d: Deployment) -> float:
    # KV heads split across TP ranks; with more ranks than KV heads each rank keeps a replica of one.
    kv_heads = max(1, spec.num_kv_heads // d.tp)
    return 2 * (spec.num_layers / d.pp) * kv_heads * spec.head_dim * KV_BYTES[d.kv_dtype]


@dataclass(frozen=True)
class MemoryPlan:
    weight_bytes_total: float
    weight_bytes_per_gpu: float
    kv_bytes_per_token: int
    kv_bytes_per_sequence: int
    kv_bytes_per_token_per_gpu: float
    free_bytes_per_gpu: float
    kv_cache_bytes_per_gpu: float
    kv_capacity_tokens: int
    kv_capacity_sequences: int
    weights_fit: bool
    fits: bool
    batch_fits: bool

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def plan_memory(spec: ModelSpec, gpu: GpuSpec, d: Deployment) -> MemoryPlan:
    total = weight_bytes(spec, d.weights)
    per_gpu = total / (d.tp * d.pp)
    free = gpu.memory_bytes - per_gpu - d.runtime_overhead_gb * 1e9
    kv_cache = max(free, 0.0) * d.kv_free_mem_fraction  # TensorRT-LLM's kv_cache_free_gpu_mem_fraction
    per_token_gpu = kv_bytes_per_token_per_gpu(spec, d)
    capacity = int(kv_cache // per_token_gpu) if per_token_gpu else 0
    if d.kv_cache_tokens is not None:
        capacity = min(capacity, d.kv_cache_tokens)
    per_token = kv_bytes_per_token(spec, d.kv_dtype)
    return MemoryPlan(
        weight_bytes_total=total, weight_bytes_per_gpu=per_gpu, kv_bytes_per_token=per_token,
        kv_bytes_per_sequence=per_token * d.max_seq_len, kv_bytes_per_token_per_gpu=per_token_gpu,
        free_bytes_per_gpu=free, kv_cache_bytes_per_gpu=kv_cache, kv_capacity_tokens=capacity,
        kv_capacity_sequences=capacity // d.max_seq_len, weights_fit=free > 0,
        fits=free > 0 and capacity >= d.max_seq_len, batch_fits=capacity >= d.batch * (d.isl + d.osl))


def smallest_tp_that_fits(spec: ModelSpec, gpu: GpuSpec, d: Deployment, max_tp: int = 8) -> int | None:
    for tp in range(1, max_tp + 1):
        if spec.num_heads % tp:
            continue
        if plan_memory(spec, gpu, Deployment(**{**d.__dict__, "tp": tp})).fits:
            return tp
    return None
