"""Memory plan: weight bytes, activations, KV-cache bytes per token, KV capacity, and whether it fits. Pure.

Weight formats and element sizes come from toolkit/quantize/formats.py (one table for the toolkit).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from toolkit.errors import ToolkitError
from toolkit.model.spec import ModelSpec
from toolkit.plan.hardware import HardwareSpec
from toolkit.quantize.formats import DTYPES, KV_ELEMENT_DTYPES, weight_bytes_per_element, weight_format
ACTIVATION_BYTES = 2  # bf16/fp16 activations between the matmuls


@dataclass(frozen=True)
class Deployment:
    """What is planned: parallelism, formats, engine limits and the workload's shapes."""

    tp: int = 1
    pp: int = 1
    weights: str = "bf16"  # an unquantized dtype (fp32, bf16, fp16) or a qformat (fp8, int4_awq, nvfp4, ...)
    kv_dtype: str = "bf16"
    kv_free_mem_fraction: float = 0.9  # TensorRT-LLM's kv_cache_free_gpu_mem_fraction
    runtime_overhead_gb: float = 2.0  # CUDA context, library workspaces: not available to weights or KV
    max_seq_len: int = 4096
    max_num_tokens: int = 8192  # tokens one engine step holds activations for (TensorRT-LLM's default)
    batch: int = 8
    isl: int = 1000
    osl: int = 200
    prefill_efficiency: float = 0.6  # fraction of peak a real prefill reaches (expected vs floor)
    allreduce_latency_us: float = 5.0  # fixed cost per all-reduce (launch + sync), NVLink-class
    kv_cache_tokens: int | None = None  # a fixed-size paged cache (the CPU engine's blocks × tokens_per_block)

    def validate(self, spec: ModelSpec) -> None:
        positive = {"tp": self.tp, "pp": self.pp, "max_seq_len": self.max_seq_len, "batch": self.batch,
                    "isl": self.isl, "osl": self.osl, "max_num_tokens": self.max_num_tokens}
        for name, value in positive.items():
            if value <= 0:
                raise ToolkitError(f"{name} must be positive (got {value})", f"pass a positive --{name.replace('_', '-')}")
        if not 0 < self.kv_free_mem_fraction <= 1:
            raise ToolkitError(f"kv free memory fraction must be in (0, 1] (got {self.kv_free_mem_fraction})",
                               "pass e.g. --kv-fraction 0.9")
        if not 0 < self.prefill_efficiency <= 1:
            raise ToolkitError(f"prefill efficiency must be in (0, 1] (got {self.prefill_efficiency})",
                               "pass e.g. --efficiency 0.6")
        weight_format(self.weights)
        if self.kv_dtype not in KV_ELEMENT_DTYPES:
            raise ToolkitError(f"unknown KV cache dtype {self.kv_dtype!r}", f"use one of {', '.join(KV_ELEMENT_DTYPES)}")
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
    """Total weight bytes: quantized matmuls (+ block scales), embeddings, lm_head and norms in the
    model dtype (16-bit unless the whole model is fp32)."""
    _, dtype = weight_format(weights)
    other = spec.total_params - spec.linear_params
    return spec.linear_params * weight_bytes_per_element(weights) + other * DTYPES[dtype].bytes


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str) -> float:
    """2 (K and V) × layers × kv_heads × head_dim × bytes."""
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * DTYPES[kv_dtype].bytes


def kv_bytes_per_token_per_gpu(spec: ModelSpec, d: Deployment) -> float:
    # KV heads split across TP ranks; with more ranks than KV heads each rank keeps a replica of one.
    kv_heads = max(1, spec.num_kv_heads // d.tp)
    return 2 * (spec.num_layers / d.pp) * kv_heads * spec.head_dim * DTYPES[d.kv_dtype].bytes


def activation_bytes_per_gpu(spec: ModelSpec, d: Deployment) -> float:
    """One layer's live activations for max_num_tokens tokens (the engine reuses them layer after layer):
    residual, normed input and attention output (3 × hidden), this rank's q/k/v and gate/up outputs;
    plus fp32 logits of the last token of `batch` sequences over this rank's share of the vocabulary."""
    qkv = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim / d.tp
    per_token = (3 * spec.hidden_size + qkv + 2 * spec.intermediate_size / d.tp) * ACTIVATION_BYTES
    return d.max_num_tokens * per_token + d.batch * spec.vocab_size / d.tp * 4


@dataclass(frozen=True)
class MemoryPlan:
    weight_bytes_total: float
    weight_bytes_per_gpu: float
    activation_bytes_per_gpu: float
    kv_bytes_per_token: float
    kv_bytes_per_sequence: float
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


def plan_memory(spec: ModelSpec, hw: HardwareSpec, d: Deployment) -> MemoryPlan:
    total = weight_bytes(spec, d.weights)
    per_gpu = total / (d.tp * d.pp)
    activations = activation_bytes_per_gpu(spec, d)
    # What TensorRT-LLM's kv_cache_free_gpu_mem_fraction takes a share of: memory left once the weights,
    # activations and runtime are in.
    free = hw.memory_bytes - per_gpu - activations - d.runtime_overhead_gb * 1e9
    kv_cache = max(free, 0.0) * d.kv_free_mem_fraction
    per_token_gpu = kv_bytes_per_token_per_gpu(spec, d)
    capacity = int(kv_cache // per_token_gpu)
    if d.kv_cache_tokens is not None:
        capacity = min(capacity, d.kv_cache_tokens)
    per_token = kv_bytes_per_token(spec, d.kv_dtype)
    return MemoryPlan(
        weight_bytes_total=total, weight_bytes_per_gpu=per_gpu, activation_bytes_per_gpu=activations,
        kv_bytes_per_token=per_token, kv_bytes_per_sequence=per_token * d.max_seq_len,
        kv_bytes_per_token_per_gpu=per_token_gpu, free_bytes_per_gpu=free, kv_cache_bytes_per_gpu=kv_cache,
        kv_capacity_tokens=capacity, kv_capacity_sequences=capacity // d.max_seq_len, weights_fit=free > 0,
        fits=free > 0 and capacity >= d.max_seq_len, batch_fits=capacity >= d.batch * (d.isl + d.osl))


def smallest_tp_that_fits(spec: ModelSpec, hw: HardwareSpec, d: Deployment, max_tp: int = 8) -> int | None:
    for tp in range(1, max_tp + 1):
        if spec.num_heads % tp:
            continue
        if plan_memory(spec, hw, replace(d, tp=tp)).fits:
            return tp
    return None

