"""Roofline: arithmetic intensity of the phases and the step times they imply, on a GPU or this CPU. Pure.

Prefill multiplies (S × K) activations by (K × N) weights: intensity grows with S (compute-bound).
Decode does the same with S = batch: intensity ≈ batch, memory-bound until the crossover batch.

One decode step for `batch` sequences of `context` tokens (per pipeline stage, × pp stages):
    max((weight bytes + batch · context · KV bytes per token) / bandwidth,
        2 · parameters · batch / (tp · pp · the format's compute rate))
    + all-reduce (TP) + the device's fixed per-step cost
FLOPs count 2 per parameter per token (attention's context-length term is left out: under 2 % at
1k tokens for an 8B model). Prefill on the CPU runs at the faster of the format's kernel and bf16's
(`prefill_flops_rate`). On a GPU the rate is the datasheet's dense tensor peak for the type the
format computes in, and the fixed cost is 0 (floors). On this CPU the rate is the probed rate of the
kernel the CPU engine runs for the format (toolkit/plan/cpu_probe.py), the bandwidth is a probed
fastest read (batch-1 GEMV or sum), both taken at the step's working set (a large last-level cache holds
a small model between steps), and the fixed cost is `HardwareSpec.step_overhead_s` plus
`sequence_overhead_s` per sequence (per prompt token in prefill, beside causal attention).

For the engine benchmark (perf/engine_bench.py):
    from toolkit.plan.roofline import cpu_decode_step_seconds, cpu_decode_step
    cpu_decode_step_seconds(spec, "int4_awq", batch=8, context_len=160, probe=None)  # seconds
    cpu_decode_step(spec, "int4_awq", 8, 160).bound                                 # memory | compute
    cpu_crossover_batch(spec, "int4_awq", context_len=160)   # batch where decode turns compute-bound
    cpu_prefill_seconds(spec, "int4_awq", tokens=128)         # TTFT floor at ISL 128
`spec` is a ModelSpec (toolkit.model.spec.load_model_spec(checkpoint_dir)); `qformat` a name from
toolkit/quantize/formats.py (`none` runs bf16). `probe` is a cpu_probe dict (e.g. measure_cpu() taken
in the benchmark's own run) or a HardwareSpec; None reads the cached probe. `step_overhead_s`
overrides the per-step cost beyond the GEMMs (default: cpu_probe.default_step_overhead_s for the
model's layer count, measured with the GEMMs stubbed out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from toolkit.model.spec import ModelSpec
from toolkit.plan.hardware import HardwareSpec
from toolkit.plan.memory import Deployment, MemoryPlan, kv_bytes_per_token_per_gpu, weight_bytes
from toolkit.quantize.formats import weight_bytes_per_element


def matmul_intensity(m: int, k: int, n: int, bytes_per_element: float = 2.0,
                     weight_bytes_per_element: float | None = None) -> float:
    """FLOP per byte of (m×k)·(k×n): 2mkn FLOPs over reading both operands and writing the result."""
    wb = bytes_per_element if weight_bytes_per_element is None else weight_bytes_per_element
    moved = bytes_per_element * (m * k + m * n) + wb * k * n
    return 2 * m * k * n / moved


def phase_intensity(spec: ModelSpec, tokens: int, weights: str) -> float:
    """Intensity of a hidden×hidden projection for `tokens` rows (prefill: prompt length; decode: batch)."""
    return matmul_intensity(tokens, spec.hidden_size, spec.hidden_size, 2.0, weight_bytes_per_element(weights))


def allreduce_seconds(message_bytes: float, tp: int, link_bytes_s: float, latency_s: float) -> float:
    """Ring all-reduce: each rank sends and receives 2(tp−1)/tp of the message, plus a fixed latency."""
    if tp <= 1:
        return 0.0
    return 2 * (tp - 1) / tp * message_bytes / link_bytes_s + latency_s


@dataclass(frozen=True)
class DecodeStep:
    batch: int
    memory_s: float  # reading weights and KV, all pipeline stages
    compute_s: float  # the matmuls at the format's rate, all pipeline stages
    allreduce_s: float
    overhead_s: float
    seconds: float
    bound: str  # memory | compute
    attention_s: float = 0.0  # CPU: the attention kernel's own time (probed rate), beside its KV read
    weight_read_bytes_s: float = 0.0  # the rate the step reads its weights at (CPU: its kernel re-reading them)


def decode_step(spec: ModelSpec, hw: HardwareSpec, d: Deployment, batch: int, context_tokens: float) -> DecodeStep:
    stages = d.tp * d.pp
    kv_read = batch * context_tokens * kv_bytes_per_token_per_gpu(spec, d)
    weights_read = weight_bytes(spec, d.weights) / stages
    # A step re-reads the same weights and KV: on a CPU whose last-level cache holds part of them it reads faster
    # than the probe's stream (as far as its kernels are memory-bound: their rates probed both ways); 1 elsewhere.
    step_bytes = weights_read + kv_read  # both per GPU / pipeline stage
    weight_rate = hw.weight_read_bytes(d.weights, step_bytes)
    weights_s = weights_read / weight_rate * d.pp
    kv_s = kv_read / (hw.bandwidth_bytes * hw.working_set_factor(step_bytes)) * d.pp
    memory_s = weights_s + kv_s
    rate = hw.decode_peak_flops(d.weights, max(batch, 1), step_bytes)
    compute_s = 2 * spec.total_params * batch / stages / rate * d.pp
    message = batch * spec.hidden_size * 2  # bf16 activations
    link = hw.interconnect_gbs * 1e9 if hw.interconnect_gbs else hw.bandwidth_bytes
    per_layer = 2 * allreduce_seconds(message, d.tp, link, d.allreduce_latency_us * 1e-6)  # attention + MLP
    allreduce_s = per_layer * spec.num_layers / d.pp
    overhead_s = hw.step_overhead_s + batch * hw.sequence_overhead_s
    attention_rate = hw.decode_attention_rate()
    if attention_rate:
        # The CPU engine runs attention as its own kernel after the GEMMs, bound by its arithmetic (probed
        # rate) or by reading the KV, whichever is slower; it does not overlap the weights' stream.
        attention_s = batch * context_tokens * spec.num_heads * spec.num_layers / stages / attention_rate * d.pp
        seconds = max(weights_s, compute_s) + max(kv_s, attention_s) + allreduce_s + overhead_s
    else:
        attention_s = 0.0
        seconds = max(memory_s, compute_s) + allreduce_s + overhead_s
    return DecodeStep(batch, memory_s, compute_s, allreduce_s, overhead_s, seconds,
                      "compute" if compute_s > memory_s else "memory", attention_s, weight_rate)


def crossover_batch(spec: ModelSpec, hw: HardwareSpec, d: Deployment, context_tokens: float) -> float | None:
    """The batch at which a decode step's compute time reaches its memory time (None: never, when each
    sequence's KV read grows as fast as its compute). Found by bisection: on the CPU the matmul rate itself
    grows with the batch (the probed few-row rates), so compute time is not linear in it."""
    def compute_minus_memory(batch: float) -> float:
        step = decode_step(spec, hw, d, batch, context_tokens)
        return step.compute_s - step.memory_s

    low, high = 0.0, 1.0
    while compute_minus_memory(high) < 0:
        low, high = high, high * 2
        if high > 2**20:
            return None
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if compute_minus_memory(mid) < 0 else (low, mid)
    return high


def prefill_flops_rate(hw: HardwareSpec, weights: str, spec: ModelSpec | None = None) -> float:
    """The rate prefill's matmuls can reach. On the CPU the probed rate of the format's kernel as prefill
    calls it (weights streamed from memory, a prompt chunk of rows, each format on the kernel the engine
    runs prompt chunks on): on `spec`'s own layer shapes where the probe has them (cpu_probe.with_layer_prefill_rates;
    a small model's short rows run slower), else on 2048 x 2048 matrices. Without either (older probes, hand-made
    specs): a weight-only kernel is built for small batches, and at prompt length an engine can widen a layer's
    weights to bf16 and use the bf16 GEMM, so the faster of the two peaks."""
    if hw.kind != "cpu":
        return hw.peak_flops(weights)
    kernel = hw.compute_type(weights)
    if spec is not None:
        from toolkit.plan.cpu_probe import layer_key  # imports torch lazily only in its functions

        by_layer = (hw.probe.get("prefill_flops_by_layer") or {}).get(layer_key(spec)) or {}
        if kernel in by_layer:
            return by_layer[kernel]
    measured = (hw.probe.get("prefill_flops") or {}).get(kernel)
    return measured or max(hw.peak_flops(weights), hw.peak_flops("bf16"))


def prefill_seconds(spec: ModelSpec, hw: HardwareSpec, d: Deployment, tokens: int) -> float:
    """Floor of one prompt's prefill: 2·P·S FLOPs over the TP group's rate (PP does not speed one
    request), or reading the weights once, whichever is longer, plus the fixed step cost. On the CPU engine
    also what its GEMMs do not cover (once the int8 GEMM made INT8-SQ's matmuls 4x faster, a third of its
    TTFT): causal attention at the attention kernel's rate probed as a prompt calls it (token i reads i + 1
    positions), and per prompt token what a decoded token costs beyond the GEMMs (norms, RoPE, SwiGLU, KV writes)."""
    compute = 2 * spec.total_params * tokens / (prefill_flops_rate(hw, d.weights, spec) * d.tp)
    memory = weight_bytes(spec, d.weights) / d.tp / hw.bandwidth_bytes
    attention_rate = hw.prefill_attention_rate(tokens)
    attention = (tokens * (tokens + 1) / 2 * spec.num_heads * spec.num_layers / attention_rate
                 if attention_rate else 0.0)
    return max(compute, memory) + attention + tokens * hw.sequence_overhead_s + hw.step_overhead_s


@dataclass(frozen=True)
class BatchPoint:
    batch: int
    step_seconds: float
    tokens_per_second: float
    bound: str  # memory | compute | capacity


@dataclass(frozen=True)
class Roofline:
    crossover: float  # FLOP/byte ridge of the format's rate
    peak_flops: float  # the format's matmul rate in decode at the planned batch
    prefill_peak_flops: float  # the rate prefill can reach (CPU: the faster of the format's and bf16's)
    crossover_batch: float | None  # decode batch at which the step turns compute-bound
    prefill_intensity: float
    decode_intensity: float  # at the planned batch
    prefill_bound: str
    decode_bound: str
    prefill_floor_s: float
    prefill_expected_s: float
    decode_step_floor_s: float  # at the planned batch
    decode_step_floor_batch1_s: float
    decode_weight_read_bytes_s: float  # at the planned batch (CPU: the kernel re-reading the step's bytes)
    decode_allreduce_s: float
    step_overhead_s: float
    ttft_s: float
    tpot_s: float
    e2e_s: float
    decode_by_batch: list[BatchPoint]

    def to_dict(self) -> dict:
        out = self.__dict__.copy()
        out["decode_by_batch"] = [p.__dict__ for p in self.decode_by_batch]
        return out


def plan_roofline(spec: ModelSpec, hw: HardwareSpec, d: Deployment, mem: MemoryPlan,
                  batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)) -> Roofline:
    context = d.isl + d.osl / 2  # mean context over the request's output
    crossover = hw.crossover(d.weights)
    prefill_ai = phase_intensity(spec, d.isl, d.weights)
    decode_ai = phase_intensity(spec, d.batch, d.weights)
    prefill_floor = prefill_seconds(spec, hw, d, d.isl)
    prefill_expected = prefill_floor / d.prefill_efficiency
    step = decode_step(spec, hw, d, d.batch, context)
    points = []
    for batch in sorted(set(batches) | {d.batch}):
        s = decode_step(spec, hw, d, batch, context)
        bound = "capacity" if batch * (d.isl + d.osl) > mem.kv_capacity_tokens else s.bound
        points.append(BatchPoint(batch, s.seconds, batch / s.seconds, bound))
        if bound == "capacity":
            break
    return Roofline(
        crossover=crossover, peak_flops=hw.decode_peak_flops(d.weights, d.batch),
        prefill_peak_flops=prefill_flops_rate(hw, d.weights, spec),
        crossover_batch=crossover_batch(spec, hw, d, context),
        prefill_intensity=prefill_ai, decode_intensity=decode_ai,
        prefill_bound="compute" if prefill_ai >= crossover else "memory",
        decode_bound=step.bound, prefill_floor_s=prefill_floor, prefill_expected_s=prefill_expected,
        decode_step_floor_s=step.seconds, decode_step_floor_batch1_s=decode_step(spec, hw, d, 1, context).seconds,
        decode_weight_read_bytes_s=step.weight_read_bytes_s,
        decode_allreduce_s=step.allreduce_s, step_overhead_s=hw.step_overhead_s, ttft_s=prefill_expected,
        tpot_s=step.seconds, e2e_s=prefill_expected + (d.osl - 1) * step.seconds, decode_by_batch=points)


def format_comparison(spec: ModelSpec, hw: HardwareSpec, d: Deployment) -> list[dict]:
    """Every weight format this device can run, at the plan's shapes: weight bytes, decode step at
    batch 1 and at the planned batch, the crossover batch, and the prefill floor."""
    context = d.isl + d.osl / 2
    rows = []
    for weights in hw.weight_formats():
        f = replace(d, weights=weights)
        rows.append({"weights": weights, "weight_bytes": weight_bytes(spec, weights),
                     "decode_step_batch1_s": decode_step(spec, hw, f, 1, context).seconds,
                     "decode_step_s": decode_step(spec, hw, f, d.batch, context).seconds,
                     "crossover_batch": crossover_batch(spec, hw, f, context),
                     "prefill_floor_s": prefill_seconds(spec, hw, f, d.isl)})
    return rows


# --- the CPU engine's roofline (toolkit plan's CPU costs, the engine benchmark) --------------------

def cpu_hardware(probe: HardwareSpec | dict | None, step_overhead_s: float | None,
                  spec: ModelSpec | None = None, sequence_overhead_s: float | None = None) -> HardwareSpec:
    """The probed CPU with a step cost and a cost per sequence: the ones given, else the engine's per-layer
    defaults for `spec`."""
    from toolkit.plan.cpu_probe import cpu_spec, default_sequence_overhead_s, default_step_overhead_s, spec_from_probe

    hw = probe if isinstance(probe, HardwareSpec) else spec_from_probe(probe) if probe else cpu_spec()
    if spec is not None:
        step_overhead_s = default_step_overhead_s(spec.num_layers) if step_overhead_s is None else step_overhead_s
        if sequence_overhead_s is None:
            sequence_overhead_s = default_sequence_overhead_s(spec.num_layers)
    if step_overhead_s is not None:
        hw = replace(hw, step_overhead_s=step_overhead_s)
    return hw if sequence_overhead_s is None else replace(hw, sequence_overhead_s=sequence_overhead_s)


def weights_for(qformat: str) -> str:
    """The weight format a checkpoint of `qformat` is served in: an unquantized one in bf16."""
    return "bf16" if qformat == "none" else qformat


def cpu_decode_step(spec: ModelSpec, qformat: str, batch: int, context_len: float,
                    probe: HardwareSpec | dict | None = None, kv_dtype: str = "bf16",
                    step_overhead_s: float | None = None, sequence_overhead_s: float | None = None) -> DecodeStep:
    hw = cpu_hardware(probe, step_overhead_s, spec, sequence_overhead_s)
    return decode_step(spec, hw, Deployment(weights=weights_for(qformat), kv_dtype=kv_dtype), batch, context_len)


def cpu_decode_step_seconds(spec: ModelSpec, qformat: str, batch: int, context_len: float,
                            probe: HardwareSpec | dict | None = None, kv_dtype: str = "bf16",
                            step_overhead_s: float | None = None, sequence_overhead_s: float | None = None) -> float:
    return cpu_decode_step(spec, qformat, batch, context_len, probe, kv_dtype, step_overhead_s,
                           sequence_overhead_s).seconds


def cpu_crossover_batch(spec: ModelSpec, qformat: str, context_len: float, probe: HardwareSpec | dict | None = None,
                        kv_dtype: str = "bf16") -> float | None:
    hw = cpu_hardware(probe, None)
    return crossover_batch(spec, hw, Deployment(weights=weights_for(qformat), kv_dtype=kv_dtype), context_len)


def cpu_prefill_seconds(spec: ModelSpec, qformat: str, tokens: int, probe: HardwareSpec | dict | None = None,
                        step_overhead_s: float | None = None, sequence_overhead_s: float | None = None) -> float:
    hw = cpu_hardware(probe, step_overhead_s, spec, sequence_overhead_s)
    return prefill_seconds(spec, hw, Deployment(weights=weights_for(qformat)), tokens)


def ceil_batch(batch: float | None) -> int | None:
    return None if batch is None else math.ceil(batch)
