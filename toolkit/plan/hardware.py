"""`HardwareSpec`: what the planner knows of a device — a catalog GPU or this machine's CPU, probed.

Peaks are dense (no 2:4 sparsity), per compute type: for a GPU the tensor-core type a format's
matmuls run in (`QuantFormat.gpu_compute`), for the CPU the kernel the embedded engine runs
(`QuantFormat.cpu_kernel`). Units: GB = 1e9 bytes, TB/s = 1e12 bytes/s, TFLOP/s = 1e12 (TOPS for int8).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from toolkit.errors import ToolkitError
from toolkit.quantize.formats import QFORMATS, weight_format


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    memory_gb: float
    bandwidth_tbs: float  # device memory bandwidth (CPU: the probe's fastest streaming read)
    peak_tflops: dict[str, float]  # compute type → dense peak
    interconnect_gbs: float  # per-GPU bandwidth to peers (NVLink, else PCIe), one direction
    source: str
    kind: str = "gpu"  # gpu | cpu
    # Fixed cost of one decode step beyond its memory and compute time (kernel dispatch, sampling,
    # scheduling). GPU floors leave it out (0); the CPU engine's is a measured or stated constant.
    step_overhead_s: float = 0.0
    # The CPU engine's per sequence in a decode step on top (norms, RoPE, SwiGLU, KV writes scale with it).
    sequence_overhead_s: float = 0.0
    probe: dict = field(default_factory=dict)  # CPU: the probe's raw figures (date, spread, ...)

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    @property
    def bandwidth_bytes(self) -> float:
        return self.bandwidth_tbs * 1e12

    def compute_type(self, weights: str) -> str:
        """The peak a weight format's matmuls use here, or one line saying why it cannot run here."""
        fmt, dtype = weight_format(weights)
        if self.kind == "cpu":
            if fmt.name == "none":
                return "fp32" if dtype == "fp32" else "bf16"
            if fmt.cpu_kernel is None:
                raise ToolkitError(f"{fmt.name} cannot be planned on the CPU engine: {fmt.cpu_note}",
                                   "plan it on a GPU that supports it (--gpu b200), or pick another --weights")
            return fmt.cpu_kernel
        compute = fmt.gpu_compute or ("fp32" if dtype == "fp32" else "bf16")
        if compute not in self.peak_tflops:
            able = [n for n, f in QFORMATS.items() if (f.gpu_compute or "bf16") in self.peak_tflops and n != "none"]
            raise ToolkitError(f"{weights} needs {fmt.gpu_requirement}; {self.name} has no {compute} tensor cores",
                               f"plan it on a GPU that has them, or use one of: bf16, {', '.join(able)}")
        return compute

    def supports(self, weights: str) -> bool:
        try:
            self.compute_type(weights)
        except ToolkitError:
            return False
        return True

    def weight_formats(self) -> list[str]:
        """bf16 and every qformat this device has kernels for."""
        return ["bf16", *(n for n in QFORMATS if n != "none" and self.supports(n))]

    def peak_flops(self, weights: str) -> float:
        return self.peak_tflops[self.compute_type(weights)] * 1e12

    def decode_peak_flops(self, weights: str, batch: float, step_bytes: float | None = None) -> float:
        """The rate of a decode step's matmuls at `batch` rows: on the CPU the probed rate of the engine's
        few-row kernels at that many rows (linear between the probed batches, the nearest one outside them),
        below what its prefill kernels reach; elsewhere the device's peak. With `step_bytes` (what the step
        re-reads), between the rates the few-row passes kept re-reading working sets of about that size (in log size;
        cpu_probe.decode_set_sizes), each in the probe's memory state (kernel_few_row_rates); past the largest, its
        rates where the memory reads as much slower as the one-row re-read curve falls from there; without, the
        stream's."""
        kernel = self.compute_type(weights)
        rates = (self.probe.get("decode_flops") or {}).get(kernel) if self.kind == "cpu" else None
        if not rates:
            return self.peak_flops(weights)
        sets = (self.probe.get("decode_flops_by_set") or {}).get(kernel)
        if sets and step_bytes:
            from toolkit.plan.cpu_probe import kernel_few_row_rates  # imports this module

            read = self.probe["read_bytes_s_sum"]
            by_set = {mib: kernel_few_row_rates(self.probe, kernel, read, mib) for mib in sets}
            largest = max(sets, key=int)
            if step_bytes > int(largest) * 2**20:
                # past the largest set: its passes in the memory state the one-row re-read curve puts that many bytes in
                ratio = self._reread_ratio
                slower = read * ratio(kernel, step_bytes) / ratio(kernel, int(largest) * 2**20)
                by_set[largest] = kernel_few_row_rates(self.probe, kernel, slower, largest)
            rates = {rows: _curve_at({mib: set_rates[rows] for mib, set_rates in by_set.items()}, step_bytes)
                     for rows in rates}
        return _interpolate([(int(rows), rate) for rows, rate in rates.items()], batch)  # JSON keys are strings

    def weight_read_bytes(self, weights: str, step_bytes: float | None = None) -> float:
        """How fast a decode step reads this format's weights: on the CPU, the engine's own kernel for it at batch 1
        re-reading `step_bytes` (the probe's re-read curve, as a ratio to the sum read; the stream's without a size),
        or on an older probe its streaming rate (a kernel may read below the memory roof); elsewhere the bandwidth."""
        if self.kind != "cpu":
            return self.bandwidth_bytes
        kernel = self.compute_type(weights)
        ratio = self._reread_ratio(kernel, step_bytes or self._stream_bytes())
        if ratio is not None:
            return ratio * self.probe["read_bytes_s_sum"]
        return (self.probe.get("gemv_bytes_s") or {}).get(kernel) or self.bandwidth_bytes

    def _reread_ratio(self, kernel: str, nbytes: float) -> float | None:
        """The probe's one-row re-read curve for `kernel` at a working set of `nbytes`, as a ratio to the round's sum
        read, capped past the last-level cache (`_curve_at`); None on a probe without the curve."""
        curve = (self.probe.get("reread_over_read") or {}).get(kernel)
        if not curve:
            return None
        return _curve_at(curve, nbytes, self._cache_bytes())

    def _cache_bytes(self) -> float | None:
        return self.probe.get("last_level_cache_bytes")

    def _stream_bytes(self) -> float:
        return self.probe.get("stream_mib", 128) * 2**20

    def _read_rate_at(self, nbytes: float) -> float:
        """The probe's read rate re-reading a working set of `nbytes` (its curve, interpolated in log size); past the
        last-level cache's size (where the probe knows it), the stream's: a step re-reading more than the cache holds
        evicts what it would re-read, where a plain sum's re-reads still gained on a cache whose replacement is not
        LRU (cpu_probe: a 32 MiB L3, a sum over 64 MiB 1.6x the stream's rate, the step's weights 1x)."""
        cache = self._cache_bytes()
        if cache and nbytes > cache:
            nbytes = max(nbytes, self.probe.get("stream_mib", 128) * 2**20)
        curve = self.probe["read_curve_bytes_s"]
        return _interpolate([(math.log2(int(mib) * 2**20), rate) for mib, rate in curve.items()], math.log2(nbytes))

    def decode_attention_rate(self) -> float | None:
        """Head-tokens/s of the CPU engine's decode attention: one query row a sequence over its paged context, read
        from memory (a decode step's weights have evicted it). None off the CPU engine or where the probe has none."""
        return self.probe.get("attention_head_tokens_s") if self.kind == "cpu" else None

    def prefill_attention_rate(self, tokens: int) -> float | None:
        """Head-tokens/s of a prompt's causal attention on the CPU engine at `tokens` tokens: probed as a prompt calls
        the kernel (every row over the same cache, in L2 / L3) at a few lengths, linear between them; where the probe
        has none, the decode rate (from memory, slower). None off the CPU engine."""
        if self.kind != "cpu":
            return None
        rates = self.probe.get("attention_prefill_head_tokens_s")
        if rates:
            return _interpolate([(int(n), rate) for n, rate in rates.items()], tokens)
        return self.decode_attention_rate()

    def working_set_factor(self, step_bytes: float) -> float:
        """How much faster (or slower) than the probed streaming rates a step reads `step_bytes` that it re-reads
        every step: on the CPU the probed read rate at that working set over the rate at the probe's stream
        size (interpolated in log size; above 1 where the bytes fit in the last-level cache); elsewhere 1."""
        if self.kind != "cpu" or not self.probe.get("read_curve_bytes_s") or step_bytes <= 0:
            return 1.0
        return self._read_rate_at(step_bytes) / self._read_rate_at(self.probe.get("stream_mib", 128) * 2**20)

    def crossover(self, weights: str = "bf16") -> float:
        """FLOP per byte above which a kernel is compute-bound here (the roofline's ridge)."""
        return self.peak_flops(weights) / self.bandwidth_bytes

    def to_dict(self) -> dict:
        return asdict(self)


def _curve_at(curve: dict[str, float], nbytes: float, cache_bytes: float | None = None) -> float:
    """A curve over working sets ({MiB: a re-read ratio or rate}) at `nbytes`, interpolated in log size; the smallest
    set's value below it, the largest's above it (what sets larger than the probe's re-read is not measured). Each set
    reads at least as fast as any larger one (a point below a larger set's is noise: nothing re-reads more bytes
    faster). With `cache_bytes` (the last-level cache), a set past it reads no faster than the largest set within it,
    and lifts none: past the cache a set streams from memory. Up to probe v35 its ratio was to a sum's read right
    after its pass, which runs slower after a pass over more than the cache (a 128 MiB sum 15-17 GB/s after a bf16
    pass over 960 MiB, 22-23 after one over 256, the pass itself 24 against 28; the AMX Xeon, 2026-11-29): it came out
    above the 256 MiB set's and lifted every set below it (bf16's one-row steps of `small`, AMX off, 40 % faster in
    the planner than measured)."""
    sets = sorted(((int(m), v) for m, v in curve.items()), reverse=True)
    within = [value for mib, value in sets if cache_bytes and mib * 2**20 <= cache_bytes]
    if within and len(within) < len(sets):
        top = within[0]  # the largest set within the cache
        sets = [(mib, min(value, top) if mib * 2**20 > cache_bytes else value) for mib, value in sets]
    points, floor = [], 0.0
    for mib, value in sets:
        floor = max(floor, value)
        points.append((math.log2(mib * 2**20), floor))
    return _interpolate(points, math.log2(nbytes))


def _interpolate(points: list[tuple[float, float]], x: float) -> float:
    """y at x, linear between the (x, y) points, the nearest point's y outside them."""
    points = sorted(points)
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]
