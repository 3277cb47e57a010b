"""This machine as the planner's device: memory bandwidth as decode reads it and the compute rate of
each kernel the CPU engine runs, measured, cached with date and spread (`toolkit plan --reprobe`).

- Bandwidth: a batch-1 GEMV streaming a weight matrix far larger than the caches, in each kernel the
  CPU engine runs (fp32, bf16, INT8-SQ, fp8, int4 group-128: its own Linear classes), and a sum
  over the same bytes; the fastest read is the machine's memory roof as a decode step can read it,
  and each kernel's own read rate is what the roofline charges that format's weights. Neither alone is safe: elsewhere a sum
  understated the roof (llama.cpp read faster), here torch's stock GEMVs stop at ~60 % of a sum.
  Each kernel's rate is measured as its ratio to a sum read of the same size right after it, pair by pair
  (the median of GEMV_PAIRS pairs), times such a paired sum read (the best round's median): on a machine whose
  memory speed moves from second to second (a VM beside busy neighbours), rates taken minutes apart mixed memory
  states, and the planner charged one format's weights at 32 GB/s and the next one's at 55 from the same memory.
- Compute: each kernel on a matrix that stays in cache, at a batch where it is compute-bound; the
  best of two batches is that kernel's roof. Prefill's: the kernel on 128 rows of matrices streamed from
  memory as a prefill step calls them (each format's own kernel, or its weights widened per call), which sets
  the planner's prefill floor. Decode's: as many weights at 2, 4, 8 and 16 rows in matrices of a few MB one call
  after another as a decode step calls them, re-reading working sets from a quarter of the stream to twice it (a
  step re-reads its weights, and what a cache keeps of them moves a few-row pass more than its one-row pass): the
  rate the few-row kernels keep while they also read the weights. Each such pass is paired with a sum read like the
  GEMVs, and the same kernels are timed again at those rows with their weights in cache (few_row_rates_at): a
  pass that read its weights about as fast as the sum was memory-bound, and in a faster memory state it runs
  faster, up to its in-cache rate; one that read them much slower was compute-bound, and runs no faster.
- Attention: the engine's fused decode-attention kernel, query heads x context tokens per second, each
  layer's KV cache read from memory as in a step.
- Working set: each kernel at batch 1 as the C step runs it, re-reading working sets of REREAD_MIB below the stream,
  the stream, and REREAD_ABOVE_STREAM times it, each pass over a sum's stream read right after it: a decode step
  re-reads the same weights every step, and what a cache keeps of them between steps depends on the cache's size, on
  what else shares it (a VM's neighbours) and on how the kernel walks its weights, none of which a sum's re-reads or
  the cache's size from sysfs told (probe version 27 charged the stream's rate past a 32 MiB L3 where INT4-AWQ's
  55 MB steps read their weights 1.2-1.5x faster in this VM's slow memory state, 2026-11-27). The planner reads a
  step's weights at the curve's ratio at the step's bytes times the sum read, and its few-row rates between the
  few-row passes' working sets (in log size). A sum's read curve (16 MiB .. 1 GiB) and the cache's size still place
  the KV cache's reads.
- Stability: the whole probe runs `rounds` times; the best of each figure is kept and the spread
  (max − min) / max is recorded beside it. Everything on the torch thread count in use.

Imports nothing from the catalog (gpus.py imports this module lazily, not the other way round).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from toolkit.cache import CACHE_ROOT
from toolkit.engine.runtime.weight_arena import gather_weights
from toolkit.plan.hardware import HardwareSpec

CACHE = CACHE_ROOT / "cpu_probe.json"
# bump when the probe measures differently: older caches are measured again (21: weights on 2 MiB pages; 22: INT4-AWQ
# and W4A8 on the int4 x int8 kernel, W4A8 probed apart; 23: the few-row rates keep the activations' rounding; 24: attention
# between reads, as in a step; 25: fp8's weights one stream per block of 4 rows, faster at every row count; 26: the
# GEMV rates as ratios to a sum read paired with each, times the best sum read; 27: the last-level cache's size;
# 28: the few-row passes paired with a sum read and timed in cache, their rates moved to the best read's state;
# 29: each kernel's batch-1 re-read curve in the one-region step's way, in place of its rates over one cache-sized set;
# 30: causal attention probed as a prompt calls it, at 128 and 1024 tokens; 33: prompts' attention on chunk_attention;
# 34: prompt GEMMs over as many copies of the layer as the model has layers; 35: the few-row passes re-reading sets of
# DECODE_SET_TIMES the stream, in place of one streamed pass; the ratios scaled by the paired sum reads' median, and a
# re-read set past the last-level cache; 36: the re-read passes as their own reads over the round's sum read)
VERSION = 36
PREFILL_ATTENTION_TOKENS = (128, 1024)  # prompt lengths the prompt's attention is probed at (the planner interpolates)
# The engine's linear kernels, one per format as the engine serves it: int8a8 INT8-SQ's (int8 activations: VNNI
# where the CPU has it, else the widening int8 GEMM), fp8 FP8's (its own kernel, or int8 where that cannot run),
# int4 INT4-AWQ's (decode rows x int8 activations where the CPU has VNNI), w4a8 W4A8-AWQ's (the same after rounding
# the activations to fp8).
KERNELS = ("fp32", "bf16", "int8a8", "fp8", "int4", "w4a8")
_WEIGHT_BYTES = {"fp32": 4, "bf16": 2, "int8a8": 1, "fp8": 1, "int4": 0.5, "w4a8": 0.5}
# Working-set sizes at which a sum's read rate is probed: a decode step re-reads its KV cache every step, so where it
# fits in the last-level cache (a Xeon here had 260 MiB of L3: a 128 MiB sum read 30-48 GB/s, 64 MiB 54, 256 MiB and
# up 27-29, 2026-11-24) a step reads it faster than from DRAM.
READ_CURVE_MIB = (16, 32, 64, 128, 256, 512, 1024)
# Working sets each kernel re-reads at batch 1 (and the stream, stream_mib): where a step's weights fall between them
# sets the rate the planner reads them at. On the 2-core Zen 4 VM (32 MiB L3, 2026-11-27, slow memory state), over a
# sum's stream read: int4 2.5-3.3 at 16 MiB, 1.4-1.5 at 32, 1.15-1.3 at 56, 0.9-1.0 at 128; bf16 1.5 at 56, 1.1-1.2
# at 128.
REREAD_MIB = (16, 24, 32, 48, 64, 96)
# ... and sets larger than the stream, as multiples of it: on a Xeon with AMX (2 vCPUs of a socket whose L3 the VM
# reports as 480 MiB, 2026-11-29) bf16 re-read 128 MiB at 1.85-1.89x a sum's read, 192 at 1.6, 256 at 1.4-1.5, and
# `small`'s 194 MiB bf16 step 1.45x: the curve held at its 128 MiB point had put that step 17-38 % fast.
REREAD_ABOVE_STREAM = (1.5, 2)
REREAD_PAST_CACHE_TIMES = 8  # the most a set past the last-level cache may be, times the stream (past_cache_mib)
REREAD_CALLS = 2  # passes over the set in one timing, after as many untimed ones (the sum read before evicted it)
# GEMV reads each paired with a sum read of the same bytes (paired_read_ratio). Measured on the 2-core Zen 4 VM
# (2026-11-27), whose memory flips between ~30 and ~55 GB/s within seconds and stays in either for seconds to half
# an hour: one probe's fp8 GEMV read 32 GB/s and its int4 GEMV 55, against 57.7 for its best sum, and the planner
# put fp8's batch-1 step at 3.47 ms where it ran 2.22 in the same run.
GEMV_PAIRS = 7
DECODE_ROWS = (2, 4, 8, 16)  # batches at which the few-row kernels' rate is probed (the planner interpolates)
# Working sets, as multiples of the stream, the few-row passes are timed re-reading (a subset of reread_sizes): the
# planner interpolates a step's rate between them in log size (the int4 4-row pass on the AMX Xeon, 2026-11-29: 690-715
# GFLOP/s re-reading 48 MiB, 620-650 at 64, 440-460 at 96, 380-390 at 128 and 192).
DECODE_SET_TIMES = (0.25, 0.5, 1, 2)
# A few-row pass whose weights read at this share of a sum's rate (paired, as the GEMVs) or more was memory-bound:
# in a faster memory state it runs faster. In a slow-state probe of the 2-core Zen 4 (2026-11-27) the weights read at
# 1.07 / 0.99 / 1.01 / 0.66 of the sum at 2 / 4 / 8 / 16 rows in bf16, 0.81 / 0.73 / 0.61 / 0.31 in int4; the int4
# kernel at 2 rows ran 211 GFLOP/s there and 329 in a step in the fast state, and the planner put that step +72 % off.
MEMORY_BOUND_SHARE = 0.75
# The few-row kernels with their weights in cache: one [n, DECODE_IN_FEATURES] matrix of this size (each thread's
# half within a Zen 4 core's L2), called FEW_ROW_CACHED_CALLS times a timing. The cap on a memory-bound pass moved to
# a faster state: bf16 at 8 rows read at 1.01 of a slow sum would claim ~450 GFLOP/s at a fast one, where it ran
# 297-361 in cache and 286-290 in the fast state's steps (2026-11-27).
FEW_ROW_CACHED_MIB = 1
FEW_ROW_CACHED_CALLS = 16
DECODE_IN_FEATURES = 1024
DECODE_MATRIX_ROWS = 2048
PREFILL_ROWS = 128  # a prompt chunk (ISL 128, the benchmarks' default)
INT4_GROUP = 128
# The CPU engine's cost per decode step beyond its GEMMs and attention (the step's Python: batch plan,
# embedding, lm_head's input; in C: norms, RoPE, KV writes), measured by perf/engine_bench.py with GEMMs and
# attention stubbed out (2026-11-23, 2 threads, decode layers in one C call): small (16 layers) 0.13-0.14 ms
# at batch 1 (1.1-1.6 ms when a dozen Python calls per layer drove the kernels): mostly a constant. Without a
# C compiler (torch ops) it is ten times more. The planner uses it unless told (config
# plan.cpu_step_overhead_ms, `toolkit plan --step-overhead-ms`).
DEFAULT_STEP_OVERHEAD_S = 0.1e-3
DEFAULT_LAYER_OVERHEAD_S = 0.002e-3
# And per sequence in the step, per layer: norms, RoPE, SwiGLU's middle, KV writes, the attention plan. Measured
# the same way at 16 sequences (2026-11-24): 0.6-1.0 ms more than at 1 on small, ~3 us per sequence and layer.
DEFAULT_SEQUENCE_LAYER_OVERHEAD_S = 0.003e-3


def default_step_overhead_s(num_layers: int) -> float:
    return DEFAULT_STEP_OVERHEAD_S + DEFAULT_LAYER_OVERHEAD_S * num_layers


def default_sequence_overhead_s(num_layers: int) -> float:
    return DEFAULT_SEQUENCE_LAYER_OVERHEAD_S * num_layers


def _best_seconds(fn, repeats: int) -> float:
    fn()  # first call: page faults, kernel selection
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _kernel(name: str, out_features: int, in_features: int):
    """(weight bytes, input dtype, fn(x) → y) for one linear as the CPU engine runs it in `name`: its own
    Linear classes (toolkit/engine/runtime/kernels.py) with its fused C GEMMs where they build, so
    the rates are the engine's, not torch's stock kernels'. The weights are a random block of rows
    repeated (each output row is independent; values only need to be realistic)."""
    import torch

    from toolkit.engine.runtime import kernels, native_kernels

    native = native_kernels.load()
    block = min(out_features, 1024)
    repeats = -(-out_features // block)  # the rows repeated, cut to out_features (q/k/v's 1280: not 1024)
    if name in ("fp32", "bf16"):
        dtype = torch.float32 if name == "fp32" else torch.bfloat16
        linear = kernels.DenseLinear(torch.randn(block, in_features).repeat(repeats, 1)[:out_features], dtype, native)
        return linear.weight_bytes, dtype, linear
    if name == "int8a8":
        # ModelOpt's range (amax / 127: no -128, which the AVX2 int8 x int8 kernel refuses for the widening one)
        values = torch.randint(-127, 128, (block, in_features), dtype=torch.int8).repeat(repeats, 1)[:out_features]
        linear = kernels.Int8Linear(values, torch.rand(out_features) * 0.01, torch.bfloat16, "int8",
                                    torch.tensor(0.02), native=native)
        return linear.weight_bytes, torch.bfloat16, linear
    if name == "fp8":
        values = (torch.randn(block, in_features) * 40).to(torch.float8_e4m3fn).repeat(repeats, 1)[:out_features]
        linear = kernels.fp8_linear(values, torch.rand(out_features) * 0.01, torch.bfloat16, "fp8",
                                    torch.tensor(0.01), native=native)
        return linear.weight_bytes, torch.bfloat16, linear
    if name in ("int4", "w4a8"):
        values = torch.randint(-8, 8, (block, in_features), dtype=torch.int8).repeat(repeats, 1)[:out_features]
        scales = torch.rand(out_features, in_features // INT4_GROUP) * 0.01
        act_quant, input_scale = ("fp8", torch.tensor(0.01)) if name == "w4a8" else (None, None)
        linear = kernels.Int4Linear(values, scales, INT4_GROUP, torch.bfloat16, act_quant, input_scale, native=native)
        return linear.weight_bytes, torch.bfloat16, linear
    raise ValueError(name)


def _kernels(name: str, count: int, out_features: int, in_features: int) -> list:
    """`count` of _kernel(name, out_features, in_features): one built, the others shallow copies of it (building
    int4's packed weights anew for each matrix of a GiB's set took seconds a round). They share its tensors until
    gather_weights(..., distinct=True) copies each one's into the arena: every caller gathers them so, and a set
    re-read must not be one matrix read again."""
    import copy

    first = _kernel(name, out_features, in_features)
    return [first] + [(first[0], first[1], copy.copy(first[2])) for _ in range(count - 1)]


def _streamed_rates(name: str, rows_list, out_features: int, in_features: int, stream_bytes: float,
                    repeats: int, as_in_step: bool = False, calls: int = 1) -> dict[int, float]:
    """FLOP/s of kernel `name` at each of `rows_list` rows, over [out_features, in_features] matrices of about
    `stream_bytes` in all, called one after another as a step calls its GEMMs (so they come from memory; `calls`
    times over, where they stay in cache). as_in_step: as a decode step runs them (_pass_timer): in one OpenMP region
    where the step would be, else called from Python with each call's own cost taken out."""
    import torch

    count = max(1, int(stream_bytes // (out_features * in_features * _WEIGHT_BYTES[name])))
    linears = _kernels(name, count, out_features, in_features)
    gather_weights([fn for _, _, fn in linears], distinct=True)  # on 2 MiB pages, as the engine serves its weights
    rates = {}
    for rows in rows_list:
        x = torch.randn(rows, in_features, dtype=linears[0][1])
        one_pass = _pass_timer(name, linears, x, calls, repeats, as_in_step)
        one_pass()  # first call: page faults, kernel selection
        rates[rows] = 2 * rows * out_features * in_features * count * calls / min(one_pass() for _ in range(repeats))
    return rates


def _pass_timer(name: str, linears, x, calls: int, repeats: int, as_in_step: bool):
    """fn() → seconds of one pass: `calls` rounds of `linears` one after another on x. as_in_step: as a decode step
    runs them, from C (decode_step.c's step_linears_seconds): in one OpenMP region, each thread its share and a
    barrier after each, where the step runs its layers that way, else one kernel call after another (called one by one
    from Python instead, int4 at 2 rows read its weights at 0.54-0.81 of a sum's rate where the step's GEMMs read them
    at 0.98-1.1, 2026-11-27; INT8-SQ on AMX tiles at 1 row 1.5x a sum's rate where the step read them at 1.85x,
    2026-11-29); without the C kernels from Python less each call's own cost (the same call on one row of a 16-row
    matrix: ~14 us a call, a quarter of a 2 MB int8 GEMM's time, had made the 2-row INT8-SQ rate 90 GFLOP/s where the
    step ran 155, 2026-11-24)."""
    from toolkit.engine.runtime import native_kernels

    native = native_kernels.load() if as_in_step else None
    step_linears = [fn.native_linear() for _, _, fn in linears]
    if native is not None and None not in step_linears and native.step_linears_seconds(step_linears, x) is not None:
        return lambda: native.step_linears_seconds(step_linears, x, calls)
    call_cost = 0.0
    if as_in_step:
        # on one row: the call's own cost only. On `rows` rows it also took the activations' rounding (fp8 at 8 rows:
        # 22 us a call against 15 on one, 2026-11-26), which the kernel pays inside a step too.
        tiny, one_row = _kernel(name, 16, x.shape[1])[2], x[:1]
        call_cost = calls * len(linears) * _best_seconds(lambda: tiny(one_row), repeats)

    def one_pass() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            for _, _, fn in linears:
                fn(x)
        seconds = time.perf_counter() - start
        return max(seconds - call_cost, seconds / 2)  # never more than half: a noisy small timing

    return one_pass


def reread_sizes(stream_mib: int) -> list[int]:
    """The working sets (MiB) each kernel's re-read is probed at: REREAD_MIB below the stream, the stream,
    REREAD_ABOVE_STREAM times it, and past_cache_mib's set where there is one."""
    above = [round(stream_mib * times) for times in REREAD_ABOVE_STREAM]
    past = past_cache_mib(stream_mib)
    return [mib for mib in REREAD_MIB if mib < stream_mib] + [stream_mib] + above + ([past] if past else [])


def past_cache_mib(stream_mib: int) -> int | None:
    """A working set twice the last-level cache, where that is past REREAD_ABOVE_STREAM's sets and within
    REREAD_PAST_CACHE_TIMES the stream: what a model larger than the cache re-reads from memory. Without it the largest
    set's ratio stood for every larger step, and on this Xeon (480 MiB of L3) int4 and bf16 re-read 256 MiB at 1.5-1.6x
    a sum's stream read where a 1.45 GB bf16 step read 1.2x (2026-11-29)."""
    cache = last_level_cache_bytes()
    if not cache:
        return None
    mib = round(2 * cache / 2**20)
    return mib if stream_mib * max(REREAD_ABOVE_STREAM) < mib <= stream_mib * REREAD_PAST_CACHE_TIMES else None


def decode_set_sizes(stream_mib: int) -> list[int]:
    """The working sets (MiB) the few-row passes are timed re-reading: those of reread_sizes at DECODE_SET_TIMES the
    stream."""
    return [mib for mib in reread_sizes(stream_mib) if mib in {round(stream_mib * times) for times in DECODE_SET_TIMES}]


def _reread_passes(name: str, stream_mib: int, plain,
                   repeats: int) -> dict[int, dict[int, tuple[float, float, float]]]:
    """{MiB: {rows: (FLOP/s, bytes/s, the sum's bytes/s)}}: kernel `name` re-reading each working set of reread_sizes
    at one row, and those of decode_set_sizes at DECODE_ROWS rows too, as the one-region step runs it (_pass_timer):
    [DECODE_MATRIX_ROWS, DECODE_IN_FEATURES] matrices one after another, REREAD_CALLS passes over the set timed after
    as many untimed ones, each timing followed by a sum's stream read (plain: stream_reader("sum", stream_mib), whose
    reads make the probe's sum read); of GEMV_PAIRS such pairs, the best pass's rate, the median pass's read and the
    median of the sum reads after them (perf/probe_yardstick.py) (`repeats`: only for a call's own cost where the C
    step timer is missing, _pass_timer)."""
    import torch

    matrix_bytes = DECODE_MATRIX_ROWS * DECODE_IN_FEATURES * _WEIGHT_BYTES[name]
    sizes, few_row_sets = reread_sizes(stream_mib), decode_set_sizes(stream_mib)  # each reads the cache's size (sysfs)
    linears = _kernels(name, max(1, int(max(sizes) * 2**20 // matrix_bytes)), DECODE_MATRIX_ROWS,
                       DECODE_IN_FEATURES)
    gather_weights([fn for _, _, fn in linears], distinct=True)  # on 2 MiB pages, as the engine serves its weights
    figures = {}
    for mib in sizes:
        chosen = linears[: max(1, min(len(linears), round(mib * 2**20 / matrix_bytes)))]
        nbytes = REREAD_CALLS * sum(nbytes for nbytes, _, _ in chosen)
        figures[mib] = {}
        for rows in (1, *DECODE_ROWS) if mib in few_row_sets else (1,):
            x = torch.randn(rows, DECODE_IN_FEATURES, dtype=linears[0][1])
            one_pass = _pass_timer(name, chosen, x, REREAD_CALLS, repeats, as_in_step=True)

            def pair(one_pass=one_pass) -> tuple[float, float]:
                one_pass()  # the set into whatever cache keeps it
                seconds = one_pass()
                return seconds, plain()

            pairs = [pair() for _ in range(GEMV_PAIRS)]
            flop = 2 * rows * nbytes / _WEIGHT_BYTES[name]
            figures[mib][rows] = (flop / min(seconds for seconds, _ in pairs),
                                  nbytes / statistics.median(seconds for seconds, _ in pairs),
                                  statistics.median(read for _, read in pairs))
    return figures


def few_row_rates_at(probe: dict, read_bytes_s: float, mib: int | str | None = None) -> dict[str, dict[str, float]]:
    """{kernel: {rows: FLOP/s}}: each kernel's few-row passes re-reading the working set of `mib` MiB (one of
    decode_set_sizes; the stream's where None) in the memory state where a sum over the probe's stream reads
    `read_bytes_s` (kernel_few_row_rates)."""
    mib = str(mib or probe["stream_mib"])
    return {name: kernel_few_row_rates(probe, name, read_bytes_s, mib) for name in probe["decode_flops_by_set"]}


def kernel_few_row_rates(probe: dict, name: str, read_bytes_s: float, mib: str) -> dict[str, float]:
    """Kernel `name`'s few-row FLOP/s re-reading `mib` MiB ({rows: rate}) in the memory state where a sum over the
    probe's stream reads `read_bytes_s`. A pass whose weights read at MEMORY_BOUND_SHARE of its paired sum or more was
    memory-bound: in a faster state its share of that read, up to its rate in cache. One that read them slower was
    compute-bound: no faster than timed. In a slower state either is bound by the weights read at the one-row pass's
    share of that read over the same set (or the pass's own, where higher). And no row count faster than a larger one
    (each weight read then serves more rows): a pass at the ridge moved to a faster state stops at the larger passes'
    rate, below its rate in cache (int4 at 4 rows: 725 GFLOP/s in cache, 595 streamed in either state, 2026-11-27).
    So one probe serves every state, where the raw rates mixed states (a pass minutes after the best read may have
    run at half its speed)."""
    timed = probe["decode_flops_by_set"][name][mib]
    one_row = probe["reread_over_read"][name][mib]
    by_rows = {}
    for rows, observed in timed.items():
        flop_per_byte = 2 * int(rows) / _WEIGHT_BYTES[name]
        share = probe["decode_over_read_by_set"][name][mib][rows]
        # in a slower state the weights read at least at the one-row pass's share of the read (a pass at the ridge
        # read below it in the state it was probed in)
        reads = max(share, one_row) * read_bytes_s * flop_per_byte
        if share >= MEMORY_BOUND_SHARE:
            cached = max(probe["decode_flops_in_cache"][name][rows], observed)
            by_rows[rows] = min(cached, reads, max(observed, share * read_bytes_s * flop_per_byte))
        else:
            by_rows[rows] = min(observed, reads)
    ceiling = float("inf")
    for rows in sorted(by_rows, key=int, reverse=True):
        by_rows[rows] = ceiling = min(by_rows[rows], ceiling)
    return {rows: by_rows[rows] for rows in timed}


ATTENTION_GAP_MIB = 8  # read between two layers' attention calls: a layer of `small` streams 3-13 MB of weights


def _attention_seconds(native, caches, q, tables, lens, block: int, repeats: int) -> float:
    """Seconds of decode attention over every layer's (k, v) cache in `caches` (best of `repeats`), each call timed
    alone after an untimed read of ATTENTION_GAP_MIB of other memory, less each call's own cost (the same call at a
    context of one token)."""
    import torch

    gap = torch.ones(ATTENTION_GAP_MIB * 2**18)

    def layers() -> float:
        total = 0.0
        for k, v in caches:
            gap.sum()
            start = time.perf_counter()
            native.decode_attention(q, k, v, tables, lens, block, 1.0, 1.0)
            total += time.perf_counter() - start
        return total

    layers()  # first calls: page faults
    seconds = min(layers() for _ in range(repeats))
    first = torch.ones_like(lens)
    per_call = _best_seconds(lambda: native.decode_attention(q, *caches[0], tables, first, block, 1.0, 1.0), repeats)
    return max(seconds - len(caches) * per_call, seconds / 2)  # never more than half: a noisy small timing


def sum_bytes_s(tensor, repeats: int) -> float:
    """Bytes/s of a torch sum reading `tensor` again and again (best of `repeats`)."""
    return tensor.nbytes / _best_seconds(tensor.sum, repeats)


def read_bytes_s(kernel: str, mib: int, repeats: int) -> float:
    """The probe's bandwidth measured again as it was found (its `bandwidth_kernel`): a GEMV kernel's batch-1 read
    rate over `mib` MiB, or for `sum` a torch sum over that many MiB."""
    read = stream_reader(kernel, mib)
    read()  # first call: page faults, kernel selection
    return max(read() for _ in range(repeats))


def stream_reader(kernel: str, mib: int):
    """fn() → bytes/s of one read of `mib` MiB the way the probe's `kernel` reads (a GEMV kernel at batch 1 over one
    [out, 4096] weight, or `sum`), its buffer made once: for timing reads one at a time between other work."""
    import torch

    if kernel == "sum":
        buffer = torch.ones(mib * 2**18)
        nbytes, read = buffer.nbytes, buffer.sum
    else:
        nbytes, dtype, fn = _kernel(kernel, int(mib * 2**20 / (4096 * _WEIGHT_BYTES[kernel])) // 128 * 128, 4096)
        gather_weights([fn])  # on 2 MiB pages, as the engine serves its weights
        x = torch.randn(1, 4096, dtype=dtype)

        def read():
            return fn(x)

    def rate() -> float:
        start = time.perf_counter()
        read()
        return nbytes / (time.perf_counter() - start)

    return rate


def paired_read_ratio(name: str, mib: int, plain, pairs: int = GEMV_PAIRS) -> float:
    """Kernel `name`'s batch-1 read rate over one [out, 4096] weight of about `mib` MiB over a torch sum's over as
    many MiB read right after it (plain: stream_reader("sum", mib), made once for every kernel): the median over
    `pairs` pairs. Each pair's two reads see the same memory state, so the ratio holds across states where either
    rate alone moved 1.5x."""
    kernel = stream_reader(name, mib)
    kernel(), plain()  # first calls: page faults, kernel selection
    return statistics.median(kernel() / plain() for _ in range(pairs))


def _memory_state_figures(name: str, stream_mib: int, plain, repeats: int) -> dict:
    """Kernel `name`'s figures that move with the memory's state, each paired with a sum's stream read (plain:
    stream_reader("sum", stream_mib)): its batch-1 read over [out, 4096] weights of ~stream_mib MiB (gemv_over_read_),
    and re-reading working sets as a step re-reads its weights (_reread_passes): at one row over each of reread_sizes
    (reread_bytes_s_: its read, which reread_ratios turns into reread_over_read_), at DECODE_ROWS rows over each of
    decode_set_sizes (decode_flops_, and decode_reread_bytes_s_ for decode_reread_over_read_)."""
    figures = {f"gemv_over_read_{name}": paired_read_ratio(name, stream_mib, plain)}
    # A decode step's batch: at DECODE_ROWS rows the engine's few-row kernels turn compute-bound (their rate in cache
    # is higher, and not what a decode step gets). Timed as a step calls them: one matrix of DECODE_MATRIX_ROWS rows
    # after another (a step of `small` makes 64 GEMM calls of 0.3-6 MB; one call streaming the whole 128 MiB ran
    # 15-25 % more FLOP/s at 8 rows, 2026-11-24), on rows of DECODE_IN_FEATURES: each output costs a reduction beside
    # its dot product, so shorter rows run slower (bf16 at 8 rows: 216 GFLOP/s on rows of 4096, 136 on the small
    # preset's 768, 2026-11-23). Over several working sets, as the one-row re-read: what a cache keeps of a set moves a
    # few-row pass further than its one-row pass (int4 at 4 rows on the AMX Xeon, 2026-11-29: 750-805 GFLOP/s
    # re-reading 56 MiB, 474-486 re-reading 128, where one row gained 1.15x; the planner had moved the 128 MiB pass by
    # the one-row gain and put `small`'s INT4-AWQ step at 4 sequences +22..+35 % off).
    for mib, by_rows in _reread_passes(name, stream_mib, plain, repeats).items():
        figures[f"reread_bytes_s_{name}_{mib}"] = by_rows.pop(1)[1]
        figures.update({f"decode_flops_{name}_{mib}_{rows}": rate for rows, (rate, _, _) in by_rows.items()})
        figures.update({f"decode_reread_bytes_s_{name}_{mib}_{rows}": read for rows, (_, read, _) in by_rows.items()})
    return figures


def reread_ratios(figures: dict, read_bytes_s_sum: float) -> dict:
    """`figures` with each re-read pass's own read (reread_bytes_s_{kernel}_{MiB} at one row,
    decode_reread_bytes_s_{kernel}_{MiB}_{rows} at a few) as a ratio to the probe's sum read (reread_over_read_...,
    decode_reread_over_read_...), the read the planner scales them by. Not each pass over the sum read paired with
    it: a sum read right after a pass runs slower the more the pass read (on the AMX Xeon, 480 MiB of L3, 2026-11-29:
    18.7 GB/s after a bf16 pass over 16 MiB, 16.5 after 128, 12.6 after 256, 6.9 after 960, where the passes read
    49 / 43 / 32 / 25 GB/s), so those ratios rose with the set where the reads fell, and the planner put bf16's
    batch-1 step of `small` at 44 GB/s where the step read 31, as the pass over its size had."""
    out = dict(figures)
    for key in [k for k in figures if "reread_bytes_s_" in k]:
        out[key.replace("reread_bytes_s_", "reread_over_read_")] = out.pop(key) / read_bytes_s_sum
    return out


def _state_fields(figures: dict, name: str, stream_mib: int) -> dict:
    """Kernel `name`'s _memory_state_figures (flat keys, as a probe round names them) as the probe stores them, by
    field: {"gemv_over_read": ratio, "reread_over_read": {MiB: ratio}, "decode_flops_by_set": {MiB: {rows: FLOP/s}},
    "decode_over_read_by_set": {MiB: {rows: ratio}}} (JSON keys)."""
    sets = decode_set_sizes(stream_mib)
    return {"gemv_over_read": figures[f"gemv_over_read_{name}"],
            "reread_over_read": {str(mib): figures[f"reread_over_read_{name}_{mib}"] for mib in reread_sizes(stream_mib)},
            "decode_flops_by_set": {str(mib): {str(rows): figures[f"decode_flops_{name}_{mib}_{rows}"]
                                               for rows in DECODE_ROWS} for mib in sets},
            "decode_over_read_by_set": {str(mib): {str(rows): figures[f"decode_reread_over_read_{name}_{mib}_{rows}"]
                                                   for rows in DECODE_ROWS} for mib in sets}}


def reprobe_kernel(probe: dict, name: str, repeats: int = 3) -> dict:
    """`probe` as if it had been taken now, in this moment's memory state, for kernel `name`: that kernel's figures that
    move with the state measured again (_memory_state_figures, one round) and every read rate moved to the median sum
    read paired with them (probe_at_read). On a machine whose memory speed moves, a probe taken in one state says
    little of another: on the 2-core Zen 4 VM the kernels' re-reads over a sum's stream differ between its states
    (INT8-SQ's stream 0.75 of the sum in the fast one, 1.11 in the slow one; int4 re-reading 53 MiB 1.04 and 1.48,
    2026-11-27). perf/engine_bench.py sets the planner against each column with the probe taken so right after it.
    Each few-row rate the best of GEMV_PAIRS passes, as in the probe's rounds (with one, a compute-bound W4A8 pass at 8
    rows came out slow in two of three reprobes and put the planner +34..+39 % off those runs, run ff)."""
    sums = []

    def plain() -> float:
        sums.append(read())
        return sums[-1]

    read = stream_reader("sum", probe["stream_mib"])
    read()  # first call: page faults
    figures = _memory_state_figures(name, probe["stream_mib"], plain, repeats)
    figures = reread_ratios(figures, statistics.median(sums))
    now = probe_at_read(probe, statistics.median(sums))
    for field, value in _state_fields(figures, name, probe["stream_mib"]).items():
        now[field] = {**probe.get(field, {}), name: value}
    now["gemv_bytes_s"] = {**now["gemv_bytes_s"], name: now["gemv_over_read"][name] * now["read_bytes_s_sum"]}
    now["decode_flops"] = few_row_rates_at(now, now["read_bytes_s_sum"])
    return now


def _probe_round(stream_mib: int, repeats: int) -> dict:
    import torch

    figures = {}
    paired_reads = []
    read = stream_reader("sum", stream_mib)

    def plain() -> float:  # a sum's stream read right after a kernel's pass, as every ratio here is taken against
        paired_reads.append(read())
        return paired_reads[-1]

    for name in KERNELS:
        figures.update(_memory_state_figures(name, stream_mib, plain, repeats))
        # ... and the few-row passes with the weights in cache: what a memory-bound pass can reach in a faster state
        in_cache_rows = min(DECODE_MATRIX_ROWS, int(FEW_ROW_CACHED_MIB * 2**20 / DECODE_IN_FEATURES / _WEIGHT_BYTES[name]))
        rates = _streamed_rates(name, DECODE_ROWS, in_cache_rows, DECODE_IN_FEATURES, FEW_ROW_CACHED_MIB * 2**20,
                                repeats, as_in_step=True, calls=FEW_ROW_CACHED_CALLS)
        figures.update({f"decode_flops_in_cache_{name}_{rows}": rate for rows, rate in rates.items()})
    del plain
    read = None  # the stream's buffer freed before the read curve's
    # The same stream read by a reduction: torch's stock GEMVs stop short of the memory roof here
    # (one reading 2026-11-23: fp32 GEMV 21 GB/s, a sum of 128 MiB 34 GB/s), and an engine's own kernels need not.
    # Summed again and again over working sets of READ_CURVE_MIB (as steps re-read their weights) and stream_mib.
    sizes = sorted({*READ_CURVE_MIB, stream_mib})
    buffer = torch.ones(max(sizes) * 2**18)
    for mib in sizes:
        part = buffer[: mib * 2**18]
        figures[f"read_bytes_s_at_{mib}"] = sum_bytes_s(part, repeats)
    # The sum's read of the stream the kernels' ratios are taken against (and scaled by): one read right after a
    # kernel's pass, the median of this round's. Not the read curve's back-to-back reads of the stream: where the
    # last-level cache holds much of the stream (this Xeon's 480 MiB), those read it warm (33-45 GB/s) where a read
    # after other traffic took 25-31, and the planner put a 1.45 GB bf16 step at 28 ms where it ran 49 (2026-11-29).
    figures["read_bytes_s_sum"] = statistics.median(paired_reads)
    del buffer, part
    # Decode attention (the engine's fused kernel): query heads × context tokens per second, 8 sequences of
    # 256 tokens, Llama-like heads (12 query over 4 kv heads of 64) in a paged bf16 cache, one layer's cache
    # after another over half the stream, each call timed alone after an untimed read of ATTENTION_GAP_MIB, as a
    # step's GEMMs stream a layer's weights between two layers' attention, and less a call's own cost (the step
    # calls it from C). From memory the kernel ran ~4x below its in-cache rate (13-20 GB/s of KV, 2026-11-24).
    # Calls back to back over caches that fit the last-level cache ran ~40 % faster than with the reads between
    # (229M against 162M head-tokens/s at 8 sequences of 160, call cost included); this way the probe read
    # 188-216M where the same kernel inside a step of `small` at 8 sequences ran 68-71 us a layer (~220M, timed in
    # place, and the same on the step's own cache called from Python between reads; 2026-11-26).
    from toolkit.engine.runtime import native_kernels

    native = native_kernels.load()
    if native is not None:
        heads, kv_heads, head_dim, block, seqs, ctx = 12, 4, 64, 32, 8, 256
        blocks = seqs * ctx // block
        layer_bytes = 2 * blocks * block * kv_heads * head_dim * 2
        caches = [(torch.randn(blocks * block, kv_heads, head_dim, dtype=torch.bfloat16),
                   torch.randn(blocks * block, kv_heads, head_dim, dtype=torch.bfloat16))
                  for _ in range(max(1, int(stream_mib * 2**20 // 2 // layer_bytes)))]
        tables = torch.arange(blocks).reshape(seqs, -1)
        q = torch.randn(seqs, heads, head_dim, dtype=torch.bfloat16)
        figures["attention_head_tokens_s"] = len(caches) * seqs * ctx * heads / _attention_seconds(
            native, caches, q, tables, torch.full((seqs,), ctx), block, repeats)
        del caches
        # ... and as a prompt calls it (model_runner's _native_attention_plan): the whole prompt on chunk_attention
        # where it takes that many rows here (chunk_min_rows), else one row per prompt token over the prefix up to it;
        # the cache stays in L2 / L3.
        # The decode rate above, from memory, had put the planner's TTFT at 1024 tokens of `small` 24-29 % above the
        # measured (2026-11-28).
        from_rows = native.chunk_min_rows(torch.bfloat16, torch.bfloat16, head_dim, heads // kv_heads)
        for tokens in PREFILL_ATTENTION_TOKENS:
            chunked = tokens >= from_rows
            k, v = (torch.randn(tokens, kv_heads, head_dim, dtype=torch.bfloat16) for _ in range(2))
            rows = torch.randn(tokens, heads, head_dim, dtype=torch.bfloat16)
            if chunked:
                call = functools.partial(native.chunk_attention, rows, k, v, torch.arange(tokens // block)[None],
                                         torch.tensor([[0, tokens, tokens]]), block, 1.0, 1.0, torch.empty_like(rows))
            else:
                call = functools.partial(native.decode_attention, rows, k, v, torch.arange(tokens // block).repeat(
                    tokens, 1), torch.arange(1, tokens + 1), block, 1.0, 1.0)
            seconds = _best_seconds(call, repeats)
            figures[f"attention_prefill_head_tokens_s_{tokens}"] = tokens * (tokens + 1) / 2 * heads / seconds
    # Compute: a 2048 × 2048 weight stays in L2/L3; prefill-like batches (64, 256 rows).
    for name in KERNELS:
        _, dtype, fn = _kernel(name, 2048, 2048)
        rates = []
        for rows in (64, 256):
            x = torch.randn(rows, 2048, dtype=dtype)
            rates.append(2 * rows * 2048 * 2048 / _best_seconds(lambda: fn(x), repeats))
        figures[f"flops_{name}"] = max(rates)
    # Prefill as the engine runs it: each kernel's Linear (on its own kernel, or its weights widened to bf16 per
    # call, whichever the engine runs prompt chunks on) on
    # PREFILL_ROWS rows, over matrices of 2048 x 2048 streamed from memory one call after another (half the
    # decode stream: enough to leave the caches). Its rate sets the planner's prefill floor; the in-cache
    # figure above ran 20-30 % faster than the model's prefill GEMMs (bf16 ~440 vs ~330 GFLOP/s, 2026-11-24).
    for name in KERNELS:
        rates = _streamed_rates(name, (PREFILL_ROWS,), 2048, 2048, stream_mib * 2**20 // 2, repeats)
        figures[f"prefill_flops_{name}"] = rates[PREFILL_ROWS]
    return figures


# A model's own layer is probed for its prompt GEMMs where one fits in this much (bf16): larger layers' shapes run at
# least as fast as the 2048 x 2048 matrices of prefill_flops, smaller ones slower (`small`'s K = 768: INT8-SQ's
# 128-token GEMMs at 2.0 TFLOP/s where 2048 x 2048 ran 2.7, its TTFT 1.45x the planner's floor; AMX Xeon, 2026-11-29)
LAYER_PREFILL_MAX_MIB = 128
LAYER_SET_MAX_MIB = 512  # the most of a kernel's copies of a layer the prompt GEMM probe streams over


def layer_key(spec) -> str:
    """The key of a model's layer shapes in a probe's prefill_flops_by_layer ("1280x768,768x768,...": out x in)."""
    return ",".join(f"{n}x{k}" for n, k in spec.layer_gemm_shapes)


def _layer_probed(spec) -> bool:
    """Whether `spec`'s layer is small enough to probe on its own shapes (LAYER_PREFILL_MAX_MIB)."""
    return 2 * sum(n * k for n, k in spec.layer_gemm_shapes) <= LAYER_PREFILL_MAX_MIB * 2**20


def layer_prefill_rates(spec, repeats: int = 5, rounds: int = 2) -> dict[str, float] | None:
    """Each kernel's FLOP/s over `spec`'s layer GEMMs at PREFILL_ROWS rows, called from Python one after another as
    a prompt runs its layers (q/k/v, o, gate/up, down), over as many copies of the layer as the model has layers (its
    weights in that kernel's format, up to LAYER_SET_MAX_MIB): the rate falls with the set a prompt streams (bf16 on
    `small`'s layer 1.74 TFLOP/s over 64 MiB of copies, 1.41 over 200 MiB, its own 16 layers' size; INT8-SQ 2.75 and
    2.27; the AMX Xeon, 2026-11-29), and half the probe's stream had put bf16's TTFT at 1.2-1.4x the floor. The best
    pass of `repeats` in each of `rounds` rounds over every kernel (this VM's speed moves by a third within minutes:
    one pass set alone had INT8-SQ at 1.4 TFLOP/s where it ran 1.9-2.2 right after). None where a layer is over
    LAYER_PREFILL_MAX_MIB in bf16 (its shapes run at least at prefill_flops' rate, and copies of it would cost the probe
    that much memory per kernel); a kernel that refuses the shapes (int4 where a K is not a multiple of its group)
    left out, the planner keeping its 2048 x 2048 rate."""
    if not _layer_probed(spec):
        return None
    return time_layer_passes(layer_prefill_passes(spec), repeats, rounds)


def time_layer_passes(passes: dict, repeats: int = 5, rounds: int = 2) -> dict[str, float]:
    """FLOP/s of each of layer_prefill_passes' passes: the best of `repeats` in each of `rounds` rounds over them."""
    rates = {name: 0.0 for name in passes}
    for _ in range(rounds):
        for name, (one_pass, flop) in passes.items():
            rates[name] = max(rates[name], flop / _best_seconds(one_pass, repeats))
    return rates


def layer_prefill_passes(spec, kernels=KERNELS) -> dict:
    """{kernel: (fn() running one pass of its prompt GEMMs over the copies of `spec`'s layer, the pass's FLOP)} for
    layer_prefill_rates, built once (copies, their 2 MiB pages, the inputs) so that they can be timed again
    (perf/engine_bench.py times one format's kernel again right after its prompts). `kernels`: only these. Empty
    where the layer is too large to probe (_layer_probed)."""
    import torch

    if not _layer_probed(spec):
        return {}
    shapes = spec.layer_gemm_shapes
    layer_weights = sum(n * k for n, k in shapes)
    passes = {}
    for name in kernels:
        copies = max(1, min(spec.num_layers, int(LAYER_SET_MAX_MIB * 2**20 // (layer_weights * _WEIGHT_BYTES[name]))))
        try:
            by_shape = [_kernels(name, copies, n, k) for n, k in shapes]
            linears = [made[copy] for copy in range(copies) for made in by_shape]  # layer after layer
        except (RuntimeError, ValueError):  # a kernel that cannot take these shapes: the 2048 x 2048 rate stands
            continue
        gather_weights([fn for _, _, fn in linears], distinct=True)  # on 2 MiB pages, as the engine serves its weights
        inputs = {k: torch.randn(PREFILL_ROWS, k, dtype=linears[0][1]) for _, k in shapes}
        calls = [(fn, inputs[k]) for (_, _, fn), (_, k) in zip(linears, shapes * copies, strict=True)]

        def one_pass(calls=calls) -> None:
            for fn, x in calls:
                fn(x)

        try:
            one_pass()  # first call: page faults, kernel selection; and torch's int4 kernel refuses K % 128 != 0
        except (RuntimeError, ValueError):
            continue
        passes[name] = (one_pass, 2 * PREFILL_ROWS * layer_weights * copies)
    return passes


def with_layer_prefill_rates(probe: dict, spec, binding=None, save: bool = True) -> dict:
    """`probe` with its kernels' prompt GEMM rates on `spec`'s own layer (prefill_flops_by_layer[layer_key(spec)],
    which the planner's prefill floor takes over prefill_flops): as cached beside the probe, else measured now on
    `binding` (the engine's default where None) and, with `save`, written into the probe's cache. Unchanged where
    the layer is too large to probe (layer_prefill_rates)."""
    from toolkit.engine.runtime.cpu_binding import bound

    key = layer_key(spec)
    if key in (probe.get("prefill_flops_by_layer") or {}) or not _layer_probed(spec):
        return probe
    print(f"probing this CPU's prompt GEMMs on {spec.name}'s layer shapes ({key}) ...", file=sys.stderr, flush=True)
    binding, path = _probe_file(binding)
    with bound(binding):
        rates = layer_prefill_rates(spec)
    layers = {"prefill_flops_by_layer": {**(probe.get("prefill_flops_by_layer") or {}), key: rates}}
    cached = _read_cached(path) if save else {}
    if cached and cached.get("measured") == probe.get("measured"):  # the cached probe is this one: keep them with it
        _write_cached(path, {**cached, **layers})
    return {**probe, **layers}


def last_level_cache_bytes() -> int | None:
    """Bytes of last-level cache the CPUs this process may run on share: each distinct instance of the highest
    data cache level among them, summed (a multi-CCX EPYC's threads on two CCXs see two L3s). Linux sysfs; None
    where it cannot be read."""
    sizes = {}
    for cpu in os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ():
        found = []
        for index in Path(f"/sys/devices/system/cpu/cpu{cpu}/cache").glob("index*"):
            try:
                if (index / "type").read_text().strip() == "Instruction":
                    continue
                size = (index / "size").read_text().strip()
                found.append((int((index / "level").read_text()), (index / "shared_cpu_list").read_text().strip(),
                              int(size.rstrip("KMG")) * {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1], 1)))
            except (OSError, ValueError):
                continue
        if found:
            level, shared, size = max(found)
            sizes[(level, shared)] = size
    return sum(sizes.values()) or None


def measure_cpu(rounds: int = 3, stream_mib: int = 128, repeats: int = 3, binding=None) -> dict:
    """Measured on `binding` (a cpu_binding.CpuBinding; None: the CPUs and threads the engine takes by default, its
    NUMA node on a multi-node host), bound only for the measurement."""
    from toolkit.engine.runtime.cpu_binding import bound, engine_binding

    with bound(binding or engine_binding()) as binding:
        return _measure_bound(rounds, stream_mib, repeats) | {"cpu_binding": binding.describe()}


def _measure_bound(rounds: int, stream_mib: int, repeats: int) -> dict:
    import torch

    runs = [_probe_round(stream_mib, repeats) for _ in range(rounds)]
    # rates: the best round's; ratios (a kernel's read over a sum's in the same moment): the rounds' mean, but for the
    # re-read passes' (one row and few): how much of a working set a shared cache keeps moves with its neighbours' load,
    # and the best round's is what the best of a benchmark's runs meets
    best = {k: statistics.fmean(r[k] for r in runs) if "_over_read_" in k and "reread_" not in k
            else max(r[k] for r in runs) for k in runs[0]}

    spread = {k: (max(r[k] for r in runs) - min(r[k] for r in runs)) / max(r[k] for r in runs) for k in runs[0]}
    best = reread_ratios(best, best["read_bytes_s_sum"])  # each re-read's best round over the best round's sum read
    for name in KERNELS:  # each kernel's read rate in the memory state of the best round's paired sum reads
        best[f"gemv_bytes_s_{name}"] = best[f"gemv_over_read_{name}"] * best["read_bytes_s_sum"]
    reads = {k: v for k, v in best.items() if k.startswith(("gemv_bytes_s_", "read_bytes_s_sum"))}
    roof = max(reads, key=reads.get)
    by_kernel = {name: _state_fields(best, name, stream_mib) for name in KERNELS}
    paired = {field: {name: fields[field] for name, fields in by_kernel.items()} for field in by_kernel[KERNELS[0]]}
    paired["decode_flops_in_cache"] = {name: {str(rows): best[f"decode_flops_in_cache_{name}_{rows}"] for rows in DECODE_ROWS}
                                       for name in KERNELS}
    return {
        "version": VERSION,
        "bandwidth_bytes_s": best[roof], "bandwidth_kernel": roof.split("_bytes_s_")[1],
        "read_bytes_s_sum": best["read_bytes_s_sum"],
        # the sum's stream; a sum's read rate re-reading each working set (the KV cache's reads)
        "stream_mib": stream_mib,
        "read_curve_bytes_s": {str(mib): best[f"read_bytes_s_at_{mib}"] for mib in READ_CURVE_MIB},  # JSON keys
        "flops": {name: best[f"flops_{name}"] for name in KERNELS},
        "prefill_flops": {name: best[f"prefill_flops_{name}"] for name in KERNELS},
        # the few-row rates re-reading the stream in that memory state; the passes as measured beside
        # them (decode_flops_by_set: re-reading each of decode_set_sizes), and each kernel's batch-1 read re-reading a
        # working set of MiB over the sum's stream read (reread_over_read: the step's weights)
        "decode_flops": few_row_rates_at(paired, best["read_bytes_s_sum"], stream_mib), **paired,
        "last_level_cache_bytes": last_level_cache_bytes(),
        "attention_head_tokens_s": best.get("attention_head_tokens_s"),
        "attention_prefill_head_tokens_s": {str(tokens): best[f"attention_prefill_head_tokens_s_{tokens}"]
                                            for tokens in PREFILL_ATTENTION_TOKENS
                                            if f"attention_prefill_head_tokens_s_{tokens}" in best},
        "gemv_bytes_s": {name: best[f"gemv_bytes_s_{name}"] for name in KERNELS},
        "spread": spread, "rounds": rounds,
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "cpu": _cpu_name(), "cpus": os.cpu_count(),
        "kernels": kernels_digest(),
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def kernels_digest() -> str:
    """The engine's C kernels' sources, hashed: rates probed on other kernels (an upgraded toolkit) are stale."""
    csrc = Path(__file__).resolve().parents[1] / "engine" / "runtime" / "csrc"
    digest = hashlib.sha256()
    for path in sorted(csrc.glob("*.c")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    from toolkit.engine.runtime.native_kernels import march

    if march() != "native":  # compiled for another ISA level: other kernels (the default keeps older digests)
        digest.update(b"-march=" + march().encode())
    if os.environ.get("TOOLKIT_AMX", "1") == "0":  # AMX turned off (NativeKernels.has_amx): the AVX-512 kernels' rates
        digest.update(b"-amx=0")
    return digest.hexdigest()[:16]


def _still_this_machine(cached: dict, binding) -> bool:
    """A cache measured by another probe version, CPU model or core count (a home directory shared
    across machines, a resized VM), on other kernels, or on other CPUs or threads than `binding` (another taskset or
    cpuset, or a config's engine.cpu_threads / cpu_numa) is measured again."""
    return (cached.get("version") == VERSION and cached.get("cpu") == _cpu_name()
            and cached.get("cpus") == os.cpu_count() and cached.get("kernels") == kernels_digest()
            and cached.get("cpu_binding") == binding.describe())


def cache_path(binding, default) -> Path:
    """Where the probe on `binding` is cached: CACHE for the engine's `default` binding, beside it for others (a config
    with engine.cpu_threads: 1 gets its own, and planning it does not measure the default's again)."""
    if binding == default:
        return CACHE
    return CACHE.with_name(f"{CACHE.stem}-{hashlib.sha256(binding.describe().encode()).hexdigest()[:10]}.json")


def cpu_probe(refresh: bool = False, binding=None) -> dict:
    """The cached probe on `binding` (cpu_binding.CpuBinding; None: the engine's default), measured now if absent,
    outdated, from another machine, or asked for (`refresh`)."""
    binding, path = _probe_file(binding)
    if not refresh:
        cached = _read_cached(path)
        if _still_this_machine(cached, binding):
            return cached
    # The one line a user sees while waiting: measuring takes seconds, and only happens once.
    print(f"probing this CPU for the planner on {binding.describe()} (memory bandwidth, kernel rates; cached in "
          f"{path}) ...", file=sys.stderr, flush=True)
    result = measure_cpu(binding=binding)
    _write_cached(path, result)
    return result


def _probe_file(binding) -> tuple:
    """(binding, where its probe is cached): `binding`, or the engine's default where None (cache_path)."""
    from toolkit.engine.runtime.cpu_binding import engine_binding

    default = engine_binding()
    return binding or default, cache_path(binding or default, default)


def _read_cached(path: Path) -> dict:
    """The probe cached at `path`; {} where there is none or it is not JSON."""
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        return {}


def _write_cached(path: Path, probe: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(probe, indent=2) + "\n")


def probe_at_read(probe: dict, sum_read_bytes_s: float) -> dict:
    """The probe as if its memory had read `sum_read_bytes_s` (a sum over its stream, as read_bytes_s_sum): every
    read rate scaled by that over the probe's own sum read (the read curve), each kernel's batch-1 rates their paired
    ratios times that read (the stream's here; the re-read curve's ratios, kept, follow read_bytes_s_sum), the few-row
    rates as few_row_rates_at puts them at that read, the compute rates unchanged. For
    comparing the planner with steps timed in another memory state than the probe's, on a machine whose memory speed
    moves (perf/engine_bench.py pairs each slice of steps with a read)."""
    scale = sum_read_bytes_s / probe["read_bytes_s_sum"]
    gemv = {name: ratio * sum_read_bytes_s for name, ratio in probe["gemv_over_read"].items()}
    curve = {mib: rate * scale for mib, rate in probe["read_curve_bytes_s"].items()}
    return {**probe, "read_bytes_s_sum": sum_read_bytes_s, "read_curve_bytes_s": curve, "gemv_bytes_s": gemv,
            "bandwidth_bytes_s": max(sum_read_bytes_s, *gemv.values()),
            **({"decode_flops": few_row_rates_at(probe, sum_read_bytes_s)} if "decode_flops_by_set" in probe else {})}


def spec_from_probe(probe: dict, step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S) -> HardwareSpec:
    worst = max(probe["spread"].values())
    source = (f"probed on this machine {probe['measured']} ({probe['cpu']}, "
              f"{probe.get('cpu_binding') or str(probe['threads']) + ' threads'}, "
              f"best of {probe['rounds']} rounds, spread up to {worst:.0%}; `toolkit plan --reprobe` measures again)")
    return HardwareSpec("cpu", probe["memory_bytes"] / 1e9, probe["bandwidth_bytes_s"] / 1e12,
                        {k: v / 1e12 for k, v in probe["flops"].items()}, 0, source, kind="cpu",
                        step_overhead_s=step_overhead_s, probe=probe)


def cpu_spec(refresh: bool = False, binding=None) -> HardwareSpec:
    return spec_from_probe(cpu_probe(refresh, binding))
