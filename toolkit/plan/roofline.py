"""Roofline: arithmetic intensity of the phases, and the time floors they imply. Pure.

Prefill multiplies (S × K) activations by (K × N) weights: intensity grows with S (compute-bound).
Decode does the same with S = batch: intensity ≈ batch (bandwidth-bound until the crossover).
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.model.spec import ModelSpec
from toolkit.plan.gpus import GpuSpec
from toolkit.plan.memory import WEIGHT_BYTES, Deployment, MemoryPlan


def matmul_intensity(m: int, k: int, n: int, bytes_per_element: float = 2.0,
                     weight_bytes_per_element: float | None = None) -> float:
    """FLOP per byte of (m×k)·(k×n): 2mkn FLOPs over reading both operands and writing the result."""
    wb = bytes_per_element if weight_bytes_per_element is None else weight_bytes_per_element
    moved = bytes_per_element * (m * k + m * n) + wb * k * n
    return 2 * m * k * n / moved


def phase_intensity(spec: ModelSpec, tokens: int, weights: str) -> float:
    """Intensity of a hidden×hidden projection for `tokens` rows (prefill: prompt length; decode: batch)."""
    return matmul_intensity(tokens, spec.hidden_size, spec.hidden_size, 2.0, WEIGHT_BYTES[weights])


def allreduce_seconds(message_bytes: float, tp: int, link_bytes_s: float, latency_s: float) -> float:
    """Ring all-reduce: each rank sends and receives 2(tp−1)/tp of the message, plus a fixed latency."""
    if tp <= 1:
        return 0.0
    return 2 * (tp - 1) / tp * message_bytes / link_bytes_s + latency_s


@dataclass(frozen=True)
class BatchPoint:
    batch: int
    step_seconds: float
    tokens_per_second: float
    bound: str  # memory | compute | capacity


@dataclass(frozen=True)
class Roofline:
    crossover: float
    prefill_intensity: float
    decode_intensity: float
    prefill_bound: str
    decode_bound: str
    prefill_floor_s: float
    prefill_expected_s: float
    decode_step_floor_s: float
    decode_allreduce_s: float
    ttft_s: float
    tpot_s: float
    e2e_s: float
    decode_by_batch: list[BatchPoint]

    def to_dict(self) -> dict:
        out = self.__dict__.copy()
        out["decode_by_batch"] = [p.__dict__ for p in self.decode_by_batch]
        return out


def _decode_step(spec: ModelSpec, gpu: GpuSpec, d: Deployment, mem: MemoryPlan, batch: int,
                 context_tokens: float) -> tuple[float, float, float]:
    """(memory seconds, compute seconds, all-reduce seconds) of one decode step for `batch` sequences."""
    kv_read = batch * context_tokens * mem.kv_bytes_per_token_per_gpu
    memory_s = (mem.weight_bytes_per_gpu + kv_read) / gpu.bandwidth_bytes
    compute_s = 2 * spec.total_params * batch / (d.tp * d.pp) / gpu.peak_flops(d.weights)
    message = batch * spec.hidden_size * 2  # bf16 activations
    link = gpu.interconnect_gbs * 1e9 if gpu.interconnect_gbs else gpu.bandwidth_bytes
    per_layer = 2 * allreduce_seconds(message, d.tp, link, d.allreduce_latency_us * 1e-6)  # attention + MLP
    return memory_s, compute_s, per_layer * spec.num_layers / d.pp


def plan_roofline(spec: ModelSpec, gpu: GpuSpec, d: Deployment, mem: MemoryPlan,
                  batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)) -> Roofline:
    crossover = gpu.crossover(d.weights)
    prefill_ai = phase_intensity(spec, d.isl, d.weights)
    decode_ai = phase_intensity(spec, d.batch, d.weights)
    # Prefill floor: 2·P·S FLOPs over the GPUs' peak (TP splits the work; PP does not speed one request).
    prefill_floor = 2 * spec.total_params * d.isl / (gpu.peak_flops(d.weights) * d.tp)
    prefill_expected = prefill_floor / d.prefill_efficiency
    # Decode for this request: weights plus its own KV (mean context over the output) each step.
    memory_s, compute_s, allreduce_s = _decode_step(spec, gpu, d, mem, 1, d.isl + d.osl / 2)
    step = max(memory_s, compute_s) * d.pp + allreduce_s
    points = []
    for batch in batches:
        m_s, c_s, a_s = _decode_step(spec, gpu, d, mem, batch, d.isl + d.osl / 2)
        seconds = max(m_s, c_s) * d.pp + a_s
        if batch * (d.isl + d.osl) > mem.kv_capacity_tokens:
            bound = "capacity"
        else:
            bound = "compute" if c_s > m_s else "memory"
        points.append(BatchPoint(batch, seconds, batch / seconds, bound))
        if bound == "capacity":
            break
    return Roofline(
        crossover=crossover, prefill_intensity=prefill_ai, decode_intensity=decode_ai,
        prefill_bound="compute" if prefill_ai >= crossover else "memory",
        decode_bound="compute" if decode_ai >= crossover else "memory",
        prefill_floor_s=prefill_floor, prefill_expected_s=prefill_expected, decode_step_floor_s=step,
        decode_allreduce_s=allreduce_s, ttft_s=prefill_expected, tpot_s=step,
        e2e_s=prefill_expected + (d.osl - 1) * step, decode_by_batch=points)
