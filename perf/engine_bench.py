"""The embedded CPU engine's ModelRunner, per weight format, against this machine's floors, the
planner's roofline, llama.cpp and OpenVINO GenAI — every figure measured in this one run.

    .venv/bin/python perf/engine_bench.py                 # small preset, all formats, peers if set up
    .venv/bin/python perf/engine_bench.py --formats none,int4_awq --batches 1,8 --no-peers

Needs the checkpoints (`toolkit init-model -c configs/cpu-small.yaml`, then `toolkit quantize -c
configs/cpu-small.yaml --qformat Q` for Q in none fp8 int8_sq int4_awq w4a8_awq) and, for the peers,
`bash perf/setup_peers.sh` (llama.cpp through llama-cpp-python, compiled once, ~15 min on 2 cores with its
batched benchmark; OpenVINO GenAI with optimum-intel, whose export of each format is cached).

What is timed (the runner alone: no scheduler, no server, no sampling):
- TTFT: one prefill step of ISL tokens, best of 3 back to back and one after each batch's decode run in each of --repeats.
- ITL at batch B: B sequences prefilled with ISL tokens, then OSL decode steps; the median step,
  best of --repeats runs, the batches in turn within each (this VM's speed drifts between minutes).
  tok/s = B / that step. llama.cpp the same
  at batch 1 (llama-cpp-python); at B > 1 its own llama-batched-bench (B sequences decoding in one batch,
  as llama-server's parallel slots), where `bash perf/setup_peers.sh` built it. OpenVINO GenAI's
  LLMPipeline at bf16 / int8 / int4 weights: TTFT and the median step at batch 1, and at B > 1 B prompts
  in one call (its continuous batching), the decode phase's mean step.
- floor: (weight bytes + KV bytes read) / bandwidth, the bandwidth measured right after each of the
  format's batch-1 runs (the highest of those): the probe's bandwidth kernel again (toolkit.plan.cpu_probe:
  the fastest batch-1 GEMV streaming 128 MiB, or a sum), as a decode step streams its weights. Beside it the
  re-read floor: a sum re-reading a buffer of the step's own size, faster where the last-level cache holds
  part of it between steps. Not the rates of the probe at the start: this VM's memory runs 27-52 GB/s from
  one minute to the next (its cache effects with it), and a floor from another minute made the ratio track
  the VM, not the engine. And paired (since 2026-11-26 afternoon): 24 slices of 8 batch-1 steps, each followed
  by one read by the probe's bandwidth kernel, the median of each slice's step (its first, after the read evicted
  the caches, left out) against the floor at that read's rate: the VM flips within seconds, and the best of a few
  short reads against the best of a few 64-step medians measured the odds of catching a fast moment. Given per
  memory state (since 2026-11-26 night): the slices whose read ran above 42 GB/s (the fast state) apart from the
  rest, where either holds 3 or more, as a step can be memory-bound in one state and compute-bound in the other.
- step w/o GEMMs: the batch-1 decode step of the same model and format with its GEMMs and attention
  stubbed out (dispatch, norms, RoPE, activation rounding, KV writes): the step's fixed cost; the same at
  the largest batch gives a cost per sequence; and the ISL-token prompt's with the same stubs (the table's
  "prompt" figure, the TTFT floor's share beyond GEMMs and attention).
- roofline: the planner's `cpu_decode_step_seconds` on the same probe (each format's weights at its
  kernel's probed read rate, few-row GEMMs at their probed rate, attention at the attention kernel's
  probed rate), plus those measured costs; "planner" is the same with the planner's own default
  costs (toolkit plan without this benchmark), its error against the measured ITL at each batch. (From 2026-11-27
  afternoon to 2026-11-29 also in each of the paired floor's slices, its probe moved by the read after that slice:
  dropped, see _paired_floor.) The probe and the columns can fall in different states (the bf16 column 1.53x the
  planner in one run, 15:44, the probe fast and the steps slow), where no planner with one bandwidth can be within
  20 % of both. And at every batch (since
  2026-11-27 evening): one read after each batch's run, the planner moved to the state of the read after that
  batch's best run, its error beside the plain one (the GB/s read in brackets). Since 2026-11-27 night the format's
  kernel is probed again after each batch's run instead (cpu_probe.reprobe_kernel: its batch-1 stream and re-read
  curve and its few-row passes, each paired with a sum read, ~2-6 s; `--no-reprobe` for the move by the read alone),
  and the planner set against each batch with the probe taken after its best run (the sum's GB/s there in brackets):
  the kernels' reads over a sum's differ between this VM's states, so moving a probe by the sum read alone does not
  carry it from one state to the other.
- in the step: one more decode run per batch with the C decode step timing each part of its steps in place
  (native_kernels.STEP_PARTS): the GEMMs' rate there beside the rate the planner charges them (the probe's, which
  times each kernel on its own), and attention's ms per step.
- TTFT's planner figure: the prefill floor (compute at the rate the probe measured for the format's
  kernel as prefill calls it: 128 rows, weights streamed, quantized formats widening per call), plus
  causal attention at the attention kernel's rate probed as a prompt calls it (every row over the same cache,
  in L2 / L3; since probe version 30) and what the prompt's step costs beyond its GEMMs and attention, measured
  as the step's: the prefill timed with the same stubs (since 2026-11-28: a prompt's layers run from Python, op by
  op, where a decode step is one C call, so a decoded sequence's cost per token, charged before, left a Xeon's
  prefill 9 ms of 35 unaccounted for).
- batch-1 step over bf16's, paired: every format's runner loaded side by side, ROUNDS rounds of one SLICE of
  batch-1 steps per format (order rotating), each round's ratio to bf16's slice tens of milliseconds before or
  after; the median and quartiles over rounds, and per memory state (a read after each round). The table's
  columns are minutes apart and can fall in different memory states (INT4-AWQ 0.44x bf16 across columns, 0.26x
  paired, 2026-11-27): the "INT4 <= 0.4x, 8-bit <= 0.6x" targets are read from this line. Beside each format's
  step there, its ratio to its floor at the read after its round (since 2026-11-27 noon): the formats take turns
  within each round, so a slow-compute minute weighs on all of them, where the paired floor above runs one format's
  slices in a row.
- bf16's step at 8 sequences over its step at 1, paired (since 2026-11-28): 24 pairs of slices at both batches on
  one runner, the order alternating, a read after each pair; the median ratio per memory state, with what bounds the
  step at 8 by the planner in that state. The "flat to 8 streams" target is read from it: the table's best runs at 1
  and 8 come seconds to minutes apart (run jj: batch 1's in a fast moment, x1.62 as measured).
- against the targets: engine_targets.py's verdicts on this run's figures, after the table.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine_targets import FLAT_UP_TO, OV_FOR, PEER_FOR, growth_cell, verdicts  # noqa: E402  (perf/ is not a package)
from toolkit.engine.runtime.step_timing import device_sync, median_decode_step, synthetic_steps  # noqa: E402
PEERS = ROOT / "perf" / ".peers"
FORMATS = ("none", "fp8", "int8_sq", "int4_awq", "w4a8_awq")
BLOCK = 32


def _steps(batch: int, isl: int, start_token: int = 5):
    """Prefill StepInputs (one per sequence) and a decode-step factory over disjoint block ranges."""
    return synthetic_steps(batch, isl, BLOCK, start_token=start_token)


def median_step(runner, batch: int, isl: int, osl: int) -> float:
    """`batch` sequences prefilled with `isl` tokens, then `osl` decode steps: the median step (the first two
    left out), in seconds."""
    return median_decode_step(runner, batch, isl, osl, BLOCK)


PAIRS = 24  # slices of batch-1 decode steps, each followed by one memory read, for the paired floor (_paired_floor)
SLICE = 8  # decode steps per slice: the first, after the read evicted the caches, left out
FAST_ABOVE = 42e9  # bytes/s: a slice whose read ran faster caught this VM's fast memory state (~50 GB/s, else ~30)


def _paired_floor(runner, isl: int, read_once, step_bytes: float, pairs: int = PAIRS) -> dict:
    """Slices of SLICE batch-1 decode steps and single reads of memory (read_once() -> bytes/s) in turn, tens of
    milliseconds apart: each slice's median step (its first left out: the read before it evicted the caches)
    against the floor at the rate read right after. This VM's memory flips within seconds between ~30 and ~50 GB/s
    (neighbours' load), so a floor from the fastest of a few short reads against a step from the best of a few
    64-step medians measured the odds of catching a fast moment, not the engine (2026-11-26: the same step read 1.1x
    one floor and 1.7x the next). Medians over `pairs` slices: the step, the rate, and the step / floor ratio; and the
    same per memory state (["states"]["slow" / "fast"], by FAST_ABOVE), where a state held at least 3 slices: a step
    that is memory-bound in the slow state can be bound by its kernel's arithmetic in the fast one. (It had set the
    planner against each slice too, its probe moved by the read after it: on the AMX Xeon a read right after a slice
    runs slower the more the slice read, through the VM's 480 MiB L3, and that figure read +7..+40 % where the planner
    probed around each run was within 20 %, 2026-11-29.)"""
    slice_median = _step_slices(runner, isl)
    steps, rates, ratios = [], [], []
    for _ in range(pairs):
        steps.append(slice_median())
        rates.append(read_once())
        ratios.append(_over_floor(steps[-1], step_bytes, rates[-1]))

    def summary(picked: list[int]) -> dict:
        return {"step_ms": statistics.median(steps[i] for i in picked) * 1e3,
                "bandwidth": statistics.median(rates[i] for i in picked),
                "ratio": statistics.median(ratios[i] for i in picked)}

    return {"pairs": pairs, **_over_states(rates, summary)}


def _over_floor(step_s: float, step_bytes: float, rate: float) -> float:
    """A step's time over its floor: the bytes it reads at `rate` (bytes/s)."""
    return step_s / (step_bytes / rate)


def _memory_states(rates: list[float]) -> dict[str, list[int]]:
    """The indices of `rates` (bytes/s, one read after each slice or round) in each memory state, "slow" and "fast"
    (by FAST_ABOVE), for the states that hold at least 3 of them."""
    states = {"slow": [i for i, rate in enumerate(rates) if rate <= FAST_ABOVE],
              "fast": [i for i, rate in enumerate(rates) if rate > FAST_ABOVE]}
    return {state: picked for state, picked in states.items() if len(picked) >= 3}


def _over_states(rates: list[float], summary) -> dict:
    """summary(indices) -> dict over every slice (one read after each, `rates`), and the same per memory state
    (_memory_states) with its count of slices: ["states"][state] = {"pairs": n, **summary(its indices)}."""
    states = {state: {"pairs": len(picked), **summary(picked)} for state, picked in _memory_states(rates).items()}
    return {**summary(list(range(len(rates)))), "states": states}


def _step_slices(runner, isl: int, batch: int = 1):
    """`batch` sequences prefilled with `isl` tokens on `runner`; returns fn() -> the median of SLICE decode steps of
    them at the same positions (the step's bytes do not change from slice to slice), the first left out: whatever ran
    between slices (a memory read, another format's or batch's steps) evicted the caches. The sequences are _steps'
    (sequence s on the same blocks at every batch, with the same tokens): slices of two batches on one runner write
    the same values at the same slots."""
    prefill, decode, _ = _steps(batch, isl)
    for seq in range(batch):
        runner.forward(prefill(seq))
    plan = [decode(pos) for pos in range(isl, isl + SLICE)]

    def slice_median() -> float:
        times = []
        for step in plan:
            start = time.perf_counter()
            runner.forward(step)
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:])

    return slice_median


def _paired_growth(runner, isl: int, read_once, batch: int, pairs: int = PAIRS, plan_at=None,
                   reprobe=None) -> dict:
    """A step of `batch` sequences over a step of one, paired: `pairs` pairs of slices (SLICE steps at each batch, the
    order alternating), each pair followed by one memory read, on one runner. The table's columns come from the best
    of a few 64-step runs each, seconds to minutes apart, and on this VM batch 1's best run can fall in a 55 GB/s
    moment and batch 8's in a 33 GB/s one (bf16 x1.62 from 1 to 8 as measured, x1.30 scaled by the reads after
    them, 2026-11-27 run jj): growth between batches in one memory state is a ratio of slices seconds apart.
    Medians over the pairs, and per memory state (FAST_ABOVE, at least 3 pairs): the ratio, both steps, the read;
    with plan_at (fn(read, batch, taken=None) -> the planner's DecodeStep in that memory state, from the probe `taken`
    or the start's), what bounds the step at `batch` at the state's median read ("bound"). With reprobe too (fn() ->
    the probe of this format's kernel taken again now, cpu_probe.reprobe_kernel), taken right after the pairs: the
    same from that probe ("bound_reprobed", its sum read "reprobe_read"). bf16 at 8 sits at this machine's ridge, so
    the bound turns on the 8-row kernel's probed rate, which moves with the VM's state: the start's probe ran it at
    365 GFLOP/s where the pairs' steps ran their GEMMs at 256 (the planner memory-bound at 8; probed again after the
    column's best run, compute-bound; run mm, 2026-11-28)."""
    many, one = _step_slices(runner, isl, batch), _step_slices(runner, isl, 1)
    ones, manys, rates = [], [], []
    for i in range(pairs):
        if i % 2:  # the order alternating, so that neither batch always follows the read
            manys.append(many())
            ones.append(one())
        else:
            ones.append(one())
            manys.append(many())
        rates.append(read_once())
    ratios = [m / o for o, m in zip(ones, manys, strict=True)]
    now = reprobe() if reprobe is not None and plan_at is not None else None

    def summary(picked: list[int]) -> dict:
        read = statistics.median(rates[i] for i in picked)
        out = {"ratio": statistics.median(ratios[i] for i in picked), "bandwidth": read,
               "one_ms": statistics.median(ones[i] for i in picked) * 1e3,
               "many_ms": statistics.median(manys[i] for i in picked) * 1e3}
        if plan_at is not None:
            out["bound"] = plan_at(read, batch).bound
        if now is not None:
            out["bound_reprobed"] = plan_at(read, batch, now).bound
        return out

    reprobed = {"reprobe_read": now["read_bytes_s_sum"]} if now is not None else {}
    return {"batch": batch, "pairs": pairs, **reprobed, **_over_states(rates, summary)}


ROUNDS = 32  # rounds of the paired comparison across formats (_paired_formats)


def _paired_formats(checkpoints: dict[str, Path], isl: int, native: bool, threads: int | None, read_once=None,
                    rounds: int = ROUNDS, step_bytes: dict[str, float] | None = None) -> dict:
    """Every format's batch-1 step against bf16's ("none"), paired: one runner per format loaded side by side, and
    `rounds` rounds of one slice per format (SLICE steps, the order rotating every round), each format's slice median
    over bf16's in the same round, tens of milliseconds apart. The table's columns come from one format after
    another, minutes apart, and this VM's memory flips between ~30 and ~50 GB/s within seconds: INT4-AWQ read
    0.44x bf16 across columns on 2026-11-27 (bf16 in the fast state, int4 in the slow one), 0.26x in one state.
    {"all": {qformat: {"ratio": median ratio, "low" / "high": its quartiles, "step_ms": median slice}}}, bf16's
    ratio 1; with read_once (fn() -> bytes/s, one read after each round), the same per memory state ("slow" /
    "fast", by FAST_ABOVE) where a state held at least 3 rounds: a format can be memory-bound in one and bound by
    its kernel's arithmetic in the other. With step_bytes too (each format's bytes a step reads), each format's slice
    against its floor at the rate read after its round ("floor": the median ratio): the formats take turns within
    each round, so a minute in which this VM computes slowly (its neighbours' load) weighs on every format alike,
    where _paired_floor's slices run one format's in a row (INT4-AWQ 2.00x its floor there, 2.52 ms a step, and
    1.48 ms in these rounds of the same run, 2026-11-27 11:46)."""
    from toolkit.engine.runtime.model_runner import ModelRunner

    blocks = -(-(isl + 256) // BLOCK)
    slices = {}
    for qformat, checkpoint in checkpoints.items():
        runner = ModelRunner(checkpoint, num_blocks=blocks, block_size=BLOCK, native=native, threads=threads)
        runner.warm_up(1, isl)
        slices[qformat] = _step_slices(runner, isl)
    names = list(slices)
    steps: dict[str, list[float]] = {q: [] for q in names}
    rates = []
    for r in range(rounds):
        for q in names[r % len(names):] + names[:r % len(names)]:
            steps[q].append(slices[q]())
        if read_once is not None:
            rates.append(read_once())

    def summary(picked: list[int]) -> dict:
        out = {}
        for q in names:
            ratios = [steps[q][i] / steps["none"][i] for i in picked]
            quartiles = statistics.quantiles(ratios, n=4, method="inclusive")
            out[q] = {"ratio": statistics.median(ratios), "low": quartiles[0], "high": quartiles[2],
                      "step_ms": statistics.median(steps[q][i] for i in picked) * 1e3}
            if rates and step_bytes and q in step_bytes:
                out[q]["floor"] = statistics.median(_over_floor(steps[q][i], step_bytes[q], rates[i]) for i in picked)
        return out

    result = {"all": summary(list(range(rounds)))}
    for state, picked in _memory_states(rates).items():
        result[state] = {"rounds": len(picked), **summary(picked)}
    return result


def _paired_formats_line(paired: dict) -> str:
    """"fp8 0.56 [0.52, 0.61] (3.44 ms, 1.05x its floor), ...; bf16 6.15 ms, 0.98x its floor", each format's median
    ratio to bf16 with its quartiles, median step and (where measured) median ratio to its floor, over all rounds and
    per memory state."""
    def step(p: dict) -> str:
        return f"{p['step_ms']:.2f} ms" + (f", {p['floor']:.2f}x its floor" if "floor" in p else "")

    def line(figures: dict) -> str:
        return (", ".join(f"{q} {p['ratio']:.2f} [{p['low']:.2f}, {p['high']:.2f}] ({step(p)})"
                          for q, p in figures.items() if q not in ("none", "rounds"))
                + f"; bf16 {step(figures['none'])}")

    def label(state: str, figures: dict) -> str:
        return f"{state} ({figures['rounds']} rounds)" if "rounds" in figures else state

    return "; ".join(f"{label(state, figures)}: {line(figures)}" for state, figures in paired.items())


def _paired_cell(paired: dict) -> str:
    """The paired ratio per memory state ("slow 1.02 (6.41 at 33.3); fast 1.37 (2.78 at 52.6)"), or over all slices
    where a run holds no per-state figures."""
    states = paired.get("states") or {"all": paired}
    return "; ".join(f"{state} {p['ratio']:.2f} ({p['step_ms']:.2f} at {p['bandwidth'] / 1e9:.1f})"
                     for state, p in states.items())


def bench_format(checkpoint: Path, batches: list[int], isl: int, osl: int, native: bool,
                 threads: int | None = None, repeats: int = 1, device: str = "cpu", read_rate=None, read_once=None,
                 plan_at=None, reprobe=None, probes_after: dict | None = None, growth_batch: int | None = None,
                 reprobe_prompt=None, **runner_options) -> dict:
    """read_rate: fn(step bytes) -> bytes/s, measured right after each batch-1 run (result["read_rates"]): the
    memory's speed while this format's steps ran, which on a VM that drifts by 1.5x within minutes is not the
    start's. read_once: fn() -> bytes/s of one read as a decode step streams memory, for result["paired"]
    (_paired_floor); and taken after each batch's run, so that with plan_at (fn(read, batch) -> the planner's
    DecodeStep in that memory state) the planner is also set against each batch's best run in the memory state that
    run saw (result["planner_at_read_ms"]). reprobe: fn() -> the probe taken again for this
    format's kernel in the memory state of now (cpu_probe.reprobe_kernel), taken after each batch's run, into
    probes_after (a dict the caller passes: {batch: [(that run's median step in seconds, the probe after it)]}), for
    the planner and the roofline against each run (_against_probes_after): the kernels' reads over a sum's differ
    between this VM's states, so a probe moved from one state to the other by the sum read was 25-36 % off where one
    taken in the state was within 20 %. growth_batch (one of `batches`), with read_once: that batch's step over batch
    1's, paired (result["paired_growth"], _paired_growth). reprobe_prompt: fn() -> FLOP/s of this format's prompt GEMMs
    on the model's layer (cpu_probe.layer_prefill_rates) taken again now, right after each prompt timed after a batch's
    run: result["ttft_reprobed"], [(the best of three prompts' seconds, the rate after them)]."""
    from toolkit.engine.runtime.model_runner import ModelRunner

    blocks = -(-(isl + 256) // BLOCK) * max(batches)
    start = time.perf_counter()
    runner = ModelRunner(checkpoint, num_blocks=blocks, block_size=BLOCK, native=native, threads=threads,
                         device=device, **runner_options)
    sync = device_sync(runner)
    load_s = time.perf_counter() - start
    runner.warm_up(max(batches), isl)
    stolen_from = cpu_jiffies()
    result = {"weight_format": runner.weight_format, "weight_bytes": runner.weight_bytes, "load_s": load_s,
              "warm_up_s": runner.warm_up_seconds, "step_kernels": runner.step_kernels, "kv_bytes_per_token": runner.kv_bytes_per_token, "itl_ms": {}}
    prefill, _, _ = _steps(1, isl)
    ttft = []

    def time_prefill(into: list) -> None:
        sync()
        t = time.perf_counter()
        runner.forward(prefill(0))
        sync()
        into.append(time.perf_counter() - t)

    for _ in range(3):
        time_prefill(ttft)
    # This VM's speed drifts by up to 1.5x over minutes: best of `repeats`, the batches taken in turn within
    # each repeat so that every batch samples the whole run (not batch 1 in a fast minute, 16 in a slow one).
    medians: dict[int, list[float]] = {batch: [] for batch in batches}
    reads_after: dict[int, list[float]] = {batch: [] for batch in batches}
    if reprobe is not None:
        probes_after.update({batch: [] for batch in batches})
    result["read_rates"] = []
    # What a batch-1 step reads: the weights and the KV cache at the decode's mean context.
    result["step_bytes"] = runner.weight_bytes + (isl + osl / 2) * runner.kv_bytes_per_token
    for _ in range(repeats):
        for batch in batches:
            medians[batch].append(median_step(runner, batch, isl, osl))
            if read_once is not None:  # three reads, the median: one read alone once ran 17 GB/s in a 33-55 minute
                reads_after[batch].append(statistics.median(read_once() for _ in range(3)))
            if reprobe is not None:
                probes_after[batch].append((medians[batch][-1], reprobe()))
            if batch == 1 and read_rate is not None:
                result["read_rates"].append(read_rate(result["step_bytes"]))
            # TTFT too over the format's minutes, as ITL, not only its first second: three prefills back to back had
            # caught a slow few seconds of one format in each of three runs (1.34-1.47x the planner, 2026-11-27), and
            # one after each repeat, a slow stretch over all six of INT8-SQ's (21.9 ms where the same code ran 15.7-19.8
            # in three processes right after, amx17 2026-11-29): one after each batch's run
            time_prefill(ttft)
            if reprobe_prompt is not None:
                # two more back to back, the best of the three against the probe right after them: the first prompt
                # after the probes above ran 1.6-1.9x the best (52-60 ms where bf16's best was 32; the memory they
                # freed is faulted in again), a cost no served prompt pays
                for _ in range(2):
                    time_prefill(ttft)
                result.setdefault("ttft_reprobed", []).append((min(ttft[-3:]), reprobe_prompt()))
    result["ttft_ms"] = min(ttft) * 1e3
    result["itl_ms"] = {batch: min(m) * 1e3 for batch, m in medians.items()}
    if read_once is not None and plan_at is not None:
        # The memory's speed right after each batch's best run, and the planner in that state: a step that is
        # memory-bound runs 1.6x faster in this VM's fast state than in its slow one, and the probe caught one of them
        best = {batch: reads_after[batch][m.index(min(m))] for batch, m in medians.items()}
        result["itl_read_bytes_s"] = best
        steps = {batch: plan_at(read, batch) for batch, read in best.items()}
        result["planner_at_read_ms"] = {batch: step.seconds * 1e3 for batch, step in steps.items()}
        result["planner_bound_at_read"] = {batch: step.bound for batch, step in steps.items()}
    result["in_step"] = _in_step_parts(runner, batches, isl, osl)
    if read_once is not None:
        result["paired"] = _paired_floor(runner, isl, read_once, result["step_bytes"])
        if growth_batch in batches:
            result["paired_growth"] = _paired_growth(runner, isl, read_once, growth_batch, plan_at=plan_at,
                                                     reprobe=reprobe)
    # The step without its GEMMs and attention at batch 1 and at the largest batch: a fixed cost and one per
    # sequence (norms, RoPE, SwiGLU, KV writes grow with the batch).
    costs = _step_cost_without_gemms(runner, isl, osl, repeats, sorted({1, max(batches)}))
    result["step_cost_ms"] = costs[1] * 1e3
    result["sequence_cost_ms"] = (max(0.0, (costs[max(batches)] - costs[1]) / (max(batches) - 1)) * 1e3
                                  if max(batches) > 1 else 0.0)
    # ... and a prompt's, with the same stubs: the TTFT floor's cost beyond the GEMMs and attention
    stubbed = []
    for _ in range(max(3, repeats)):
        time_prefill(stubbed)
    result["prefill_cost_ms"] = min(stubbed) * 1e3
    stolen_to = cpu_jiffies()
    if stolen_from and stolen_to and stolen_to[1] > stolen_from[1]:
        result["steal_pct"] = 100 * (stolen_to[0] - stolen_from[0]) / (stolen_to[1] - stolen_from[1])
    del runner
    return result


def _in_step_parts(runner, batches: list[int], isl: int, osl: int) -> dict[int, dict]:
    """Per batch, where a decode step's time goes as the C step (decode_step) times it in place: ms per step of each part
    (native_kernels.STEP_PARTS, the mean over `osl` steps) and the rate the step's GEMMs ran at there
    ("gemm_gflops"). The probe times each kernel on its own, one call after another, and in a minute of its own:
    the two can part (fp8 at 8 rows of `small`: 190 GFLOP/s in the step against the probe's 286 in one run, 205
    against 206 in another, 2026-11-26/27), and this is the figure that says by how much. {} where the step does not
    run in one C call."""
    from toolkit.engine.runtime.native_kernels import STEP_PARTS

    if runner.decoder is None:
        return {}
    desc = runner.decoder.desc
    layers = [desc.layers[i] for i in range(desc.num_layers)]
    flops_per_row = 2 * sum(lin.n * lin.k for layer in layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down))
    parts = {}
    for batch in batches:
        runner.decoder.time_parts(True)
        try:
            median_step(runner, batch, isl, osl)
            seconds = runner.decoder.timing_parts()
        finally:
            runner.decoder.time_parts(False)
        per_step = {part: seconds[part] / osl * 1e3 for part in STEP_PARTS}
        gemm_ms = sum(per_step[part] for part in ("qkv", "o", "gate_up", "down"))
        if gemm_ms == 0:  # more rows than the one-call step takes: Python drove this batch's steps
            continue
        parts[batch] = {**per_step, "gemm_ms": gemm_ms, "gemm_gflops": flops_per_row * batch / gemm_ms / 1e6}
    return parts


def cpu_jiffies() -> tuple[int, int] | None:
    """(steal, all) CPU time so far from Linux's /proc/stat, in jiffies: the share a hypervisor gave this VM's vCPUs
    to others while they had work (None where there is no such file). A format's minutes with steal ran on less than
    the machine this benchmark measures, so its figures say so."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7], sum(fields[:8])) if len(fields) >= 8 else None


def _read_rate_now(probe: dict, step_bytes: float) -> tuple[float, float]:
    """How fast this machine reads memory right now: (the probe's bandwidth kernel over its stream, as a decode
    step streams weights from DRAM; a sum re-reading a buffer of the step's own size, with whatever the
    last-level cache holds of it between reads)."""
    import torch

    from toolkit.plan.cpu_probe import read_bytes_s, sum_bytes_s

    return (read_bytes_s(probe["bandwidth_kernel"], probe["stream_mib"], 3),
            sum_bytes_s(torch.ones(int(step_bytes) // 4), 5))


class _NoGemm:
    """A linear that returns zeros of its output shape: the step keeps all its other work."""

    def __init__(self, out_features: int):
        self.out_features = out_features

    def __call__(self, x):
        return x.new_zeros(*x.shape[:-1], self.out_features)


def _no_decode_attention(q, *args, out=None):
    """NativeKernels.decode_attention, stubbed: zeros."""
    return q.new_zeros(q.shape) if out is None else out.zero_()


def _no_chunk_attention(q, k, v, tables, chunks, block_size, k_scale, v_scale, out, amx=None) -> None:
    """NativeKernels.chunk_attention, stubbed: zeros."""
    out.zero_()


def wrap_linears(runner, wrap) -> None:
    """Every decoder layer's linears of `runner` (its Python path's) replaced by wrap(linear, kind), kind one of qkv, o,
    gate_up, down (lm_head left as it is)."""
    for layer in runner.layers:
        layer.qkv = [wrap(m, "qkv") for m in layer.qkv]
        layer.gate_up = [wrap(m, "gate_up") for m in layer.gate_up]
        layer.o, layer.down = wrap(layer.o, "o"), wrap(layer.down, "down")


def _step_cost_without_gemms(runner, isl: int, osl: int, repeats: int, batches: list[int]) -> dict[int, float]:
    """The decode step at each of `batches` of this very model and format with every GEMM and attention (the decode
    kernel and chunk_attention) stubbed out: its dispatch, norms, RoPE, activation rounding, KV writes, i.e. what the roofline
    adds to the GEMMs' and attention's own times as its per-step cost."""
    def out_features(linear) -> int:
        inner = getattr(linear, "linear", linear)
        return getattr(inner, "out_features", None) or inner.weight.shape[0]

    wrap_linears(runner, lambda linear, kind: _NoGemm(out_features(linear)))
    runner.lm_head = _NoGemm(runner.spec.vocab_size)
    if runner.native is not None:  # attention too, both kernels: the planner charges it at the probed attention rate
        runner.native = copy.copy(runner.native)
        runner.native.decode_attention = _no_decode_attention
        runner.native.chunk_attention = _no_chunk_attention
    if runner.decoder is not None:  # the one-call C decode step: its own switch, the same stubs
        runner.decoder.desc.stub_gemms = 1
    if runner.graphs is not None:  # CUDA graphs replay the kernels they captured: capture the stubbed step anew
        runner.graphs.reset()
    return {batch: min(median_step(runner, batch, isl, osl) for _ in range(repeats)) for batch in batches}


# --- peers ----------------------------------------------------------------------------------------

def _gguf(model_dir: Path, kind: str) -> Path | None:
    """The small preset converted with llama.cpp's own converter (and quantizer for q4_0), cached."""
    out = PEERS / "gguf" / f"{model_dir.name}-{kind}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    llama_cpp_dir = PEERS / "llama.cpp"
    if kind == "q4_0":
        f16 = _gguf(model_dir, "f16")
        code = ("import llama_cpp,sys; p=llama_cpp.llama_model_quantize_default_params(); p.ftype=2; p.nthread=2; "
                "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))")
        subprocess.run([str(PEERS / "venv/bin/python"), "-c", code, str(f16), str(out)], check=True,
                       capture_output=True)
        return out
    # The converter looks for a sentencepiece or Llama-HF vocabulary first and refuses BPE tokenizers
    # it has no hash for (ours is trained offline): it is gpt-2-style byte-level BPE, so say so.
    shim = ("import sys; sys.argv = sys.argv[1:]; sys.path.insert(0, sys.argv[0].rsplit('/', 1)[0])\n"
            "from conversion.base import TextModel\n"
            "def no_such_vocab(self, *a, **k): raise FileNotFoundError('not this vocabulary kind')\n"
            "TextModel._set_vocab_sentencepiece = TextModel._set_vocab_llama_hf = no_such_vocab\n"
            "TextModel.get_vocab_base_pre = lambda self, tok: 'gpt-2'\n"
            "import convert_hf_to_gguf as c; c.main()\n")
    env = dict(os.environ, PYTHONPATH=str(llama_cpp_dir / "gguf-py"))
    subprocess.run([sys.executable, "-c", shim, str(llama_cpp_dir / "convert_hf_to_gguf.py"), str(model_dir),
                    "--outtype", kind, "--outfile", str(out)], check=True, env=env, capture_output=True)
    return out


_PEER_SCRIPT = r"""
import json, sys, time, statistics
import llama_cpp
path, isl, osl, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = llama_cpp.Llama(model_path=path, n_ctx=isl + osl + 8, n_threads=threads, n_threads_batch=threads,
                      n_batch=isl, verbose=False)
prompt = [(5 + i * 7) % 1000 + 4 for i in range(isl)]
ttft = []
for _ in range(3):
    llm.reset(); t = time.perf_counter(); llm.eval(prompt); ttft.append(time.perf_counter() - t)
medians = []
for _ in range(3):  # best of 3, as the toolkit's own rows
    llm.reset(); llm.eval(prompt); steps = []
    for _ in range(osl):
        t = time.perf_counter(); llm.eval([11]); steps.append(time.perf_counter() - t)
    medians.append(statistics.median(steps[2:]))
print(json.dumps({"ttft_ms": min(ttft) * 1e3, "itl_ms": min(medians) * 1e3}))
"""


def _failure(error: Exception) -> str:
    """Why a peer's run failed, in a line: the end of its stderr (where the error is), or the exception; and the
    signal when it died of one (llama.cpp's builds have crashed on a CPU their -march=native did not fit)."""
    stderr = getattr(error, "stderr", "") or ""
    stderr = (stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr).strip()
    code = getattr(error, "returncode", 0) or 0
    died = f"killed by signal {-code}; " if code < 0 else ""
    return died + (stderr.splitlines()[-1][-240:] if stderr else str(error)[-240:])


def bench_llamacpp(model_dir: Path, kind: str, isl: int, osl: int, threads: int) -> dict | None:
    try:
        gguf = _gguf(model_dir, kind)
        out = subprocess.run([str(PEERS / "venv/bin/python"), "-c", _PEER_SCRIPT, str(gguf), str(isl), str(osl),
                              str(threads)], check=True, capture_output=True, text=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.CalledProcessError, OSError, json.JSONDecodeError) as e:
        print(f"llama.cpp {kind}: not measured ({_failure(e)})", file=sys.stderr)
        return None


BATCHED_BENCH = PEERS / "llama.cpp" / "build-bench" / "bin" / "llama-batched-bench"


def bench_llamacpp_batched(model_dir: Path, kind: str, isl: int, osl: int, threads: int, batches: list[int],
                           repeats: int) -> dict | None:
    """llama.cpp's llama-batched-bench: B sequences of ISL prompt tokens each, then OSL decode steps of all
    B in one batch (what llama-server does with B parallel slots). Per B: the decode step (ITL) and output
    tokens/s of that phase, best of `repeats` runs."""
    if not BATCHED_BENCH.is_file():
        return None
    best: dict[int, dict] = {}
    try:
        gguf = _gguf(model_dir, kind)
        ctx = max(batches) * (isl + osl) + 64
        for _ in range(repeats):
            out = subprocess.run([str(BATCHED_BENCH), "-m", str(gguf), "-c", str(ctx), "-b", "2048", "-ub", "512",
                                  "-npp", str(isl), "-ntg", str(osl), "-npl", ",".join(map(str, batches)),
                                  "-t", str(threads), "-tb", str(threads), "--output-format", "jsonl"],
                                 check=True, capture_output=True, text=True)
            for line in out.stdout.splitlines():
                if line.startswith("{"):
                    r = json.loads(line)
                    itl_ms = r["t_tg"] / r["tg"] * 1e3
                    if r["pl"] not in best or itl_ms < best[r["pl"]]["itl_ms"]:
                        best[r["pl"]] = {"itl_ms": itl_ms, "tok_s": r["speed_tg"]}
    except (subprocess.CalledProcessError, OSError, json.JSONDecodeError, KeyError) as e:
        print(f"llama-batched-bench {kind}: not measured ({_failure(e)})", file=sys.stderr)
        return None
    return best


OPENVINO = PEERS / "openvino"
# OpenVINO GenAI at the same bits, the checkpoint exported by optimum-intel (weights compressed by NNCF,
# symmetric; int4 in groups of 128 on every linear, as our INT4-AWQ). "bf16": fp16 weights in the IR, run in
# bf16 (INFERENCE_PRECISION_HINT; OpenVINO's default on a CPU with AVX512-BF16 anyway). OV_FOR: engine_targets.py.
_OV_EXPORT = {"bf16": ["--weight-format", "fp16"], "int8": ["--weight-format", "int8", "--sym"],
              "int4": ["--weight-format", "int4", "--sym", "--group-size", "128", "--ratio", "1.0"]}


def _openvino_ir(model_dir: Path, kind: str) -> Path:
    out = PEERS / "openvino-ir" / f"{model_dir.name}-{kind}"
    if not (out / "openvino_model.xml").is_file():
        subprocess.run([str(OPENVINO / "bin/optimum-cli"), "export", "openvino", "--model", str(model_dir),
                        "--task", "text-generation-with-past", *_OV_EXPORT[kind], str(out)],
                       check=True, capture_output=True, text=True)
    return out


# Each run's prompts differ (LLMPipeline caches prefixes: a repeated prompt's TTFT would be a cache hit).
_OV_SCRIPT = r"""
import json, sys, statistics
import numpy as np, openvino as ov, openvino_genai as og
path, isl, osl, threads, repeats, hint = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
batches = [int(b) for b in sys.argv[7].split(",")]
pipe = og.LLMPipeline(path, "CPU", INFERENCE_NUM_THREADS=threads, INFERENCE_PRECISION_HINT=hint)
cfg = og.GenerationConfig(max_new_tokens=osl, min_new_tokens=osl, ignore_eos=True, do_sample=False)
run = 0
def generate(batch):
    global run
    run += 1
    ids = np.array([[(5 + run * 31 + b * 13 + i * 7) % 1000 + 4 for i in range(isl)] for b in range(batch)],
                   dtype=np.int64)
    return pipe.generate(og.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), cfg).perf_metrics
generate(1)  # compile, first-touch
best = {}
for _ in range(repeats):
    for batch in batches:
        m = generate(batch)
        ttft = m.get_ttft().mean
        if batch == 1:  # the median decode step, as the other rows
            step = statistics.median(d / 1e3 for d in list(m.raw_metrics.m_durations)[2:])
        else:  # the decode phase's mean step: B tokens each
            step = (m.get_generate_duration().mean - ttft) / (osl - 1)
        prev = best.get(batch)
        best[batch] = {"ttft_ms": min(ttft, prev["ttft_ms"]) if prev else ttft,
                       "itl_ms": min(step, prev["itl_ms"]) if prev else step}
print(json.dumps({"ttft_ms": best[1]["ttft_ms"], "itl_ms": best[1]["itl_ms"],
                  "batched": {b: {"itl_ms": v["itl_ms"], "tok_s": b / v["itl_ms"] * 1e3}
                              for b, v in best.items() if b > 1}}))
"""


def bench_openvino(model_dir: Path, kind: str, isl: int, osl: int, threads: int, batches: list[int],
                   repeats: int) -> dict | None:
    """OpenVINO GenAI's LLMPipeline on the same checkpoint: TTFT and batch-1 ITL (median step, best of
    `repeats`), and at each B > 1 B prompts in one generate call (its continuous batching), decode steps of
    all B together."""
    try:
        ir = _openvino_ir(model_dir, kind)
        hint = "bf16"  # activations in bf16 at every weight format, as ours (compressed weights widen to it)
        out = subprocess.run([str(OPENVINO / "bin/python"), "-c", _OV_SCRIPT, str(ir), str(isl), str(osl),
                              str(threads), str(repeats), hint, ",".join(map(str, sorted({1, *batches})))],
                             check=True, capture_output=True, text=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["batched"] = {int(b): v for b, v in result["batched"].items()}
        return result
    except (subprocess.CalledProcessError, OSError, json.JSONDecodeError) as e:
        print(f"OpenVINO GenAI {kind}: not measured ({getattr(e, 'stderr', '') or e})"[-300:], file=sys.stderr)
        return None


# --- the table -------------------------------------------------------------------------------------

def _ttft_against_probes_after(reprobed: list, probe: dict, spec, kernel: str, floor) -> float | None:
    """The median over prompts of each prompt's seconds over the prefill floor (floor: fn(probe) -> seconds) with the
    prompt GEMM rate probed right after it: TTFT's floor probed once at the start had this VM's minutes in it (bf16
    1.19x in a run whose prompts ran in a slower minute than the probe, amx25, where 1.02x in the run before)."""
    from toolkit.plan.cpu_probe import layer_key

    key = layer_key(spec)
    ratios = []
    for seconds, rate in reprobed:
        if rate:
            layers = {**(probe.get("prefill_flops_by_layer") or {})}
            layers[key] = {**layers.get(key, {}), kernel: rate}
            ratios.append(seconds / floor({**probe, "prefill_flops_by_layer": layers}))
    return statistics.median(ratios) if ratios else None


def _against_probes_after(probes_after: dict, plan, roofline) -> dict:
    """The planner and the roofline set against each run with the probe taken right after it (probes_after: {batch:
    [(run seconds, probe)]}; plan(probe, batch) -> DecodeStep with the planner's default costs; roofline(probe, batch)
    -> seconds with the costs measured here). For the best run: its planner step and bound and the probe's sum read
    (planner_at_read_ms, replacing the move by the read alone). For every run, the median over a batch's runs: the
    planner's error and the step over its roofline (the best run picks the luckiest of this VM's moments, W4A8 at 2
    sequences as fast as at 1 in run ee, and the memory can flip between a run and the probe after it; a roofline in
    the probe's memory state does not bound a step run in the other one, run hh)."""
    best = {batch: min(pairs, key=lambda pair: pair[0]) for batch, pairs in probes_after.items()}
    steps = {batch: plan(probe, batch) for batch, (_, probe) in best.items()}
    errors = {batch: [plan(probe, batch).seconds / run - 1 for run, probe in pairs] for batch, pairs in probes_after.items()}
    return {"reprobe_read_bytes_s": {batch: probe["read_bytes_s_sum"] for batch, (_, probe) in best.items()},
            "planner_at_read_ms": {batch: step.seconds * 1e3 for batch, step in steps.items()},
            "planner_bound_at_read": {batch: step.bound for batch, step in steps.items()},
            "planner_paired_errors": errors,
            "planner_paired_error": {batch: statistics.median(e) for batch, e in errors.items()},
            "roofline_paired_ratio": {batch: statistics.median(run / roofline(probe, batch) for run, probe in pairs)
                                      for batch, pairs in probes_after.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--isl", type=int, default=128)
    parser.add_argument("--osl", type=int, default=64)
    parser.add_argument("--torch-ops", action="store_true",
                        help="norms, RoPE and attention as torch ops (the fallback without a C compiler) instead of the fused C kernels")
    parser.add_argument("--repeats", type=int, default=3, help="decode runs per batch size; the best median counts")
    parser.add_argument("--threads", type=int, help="torch threads (default: the engine's, cpu_binding.py)")
    parser.add_argument("--step-cost-ms", type=float, help="the per-step cost beyond GEMMs and attention, instead of measuring it (then none per sequence)")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--no-reprobe", action="store_true",
                        help="set the planner against each column with the start's probe moved by the read after it, "
                             "not with its kernel probed again there (faster: ~1 minute less per format)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    import torch

    from toolkit.engine.runtime.cpu_binding import apply_binding, engine_binding
    from toolkit.model.spec import load_model_spec
    from toolkit.plan.cpu_probe import (layer_prefill_passes, measure_cpu, probe_at_read, reprobe_kernel, spec_from_probe,
                                         stream_reader, time_layer_passes, with_layer_prefill_rates)
    from toolkit.plan.roofline import (cpu_crossover_batch, cpu_decode_step, cpu_decode_step_seconds,
                                       cpu_prefill_seconds, weights_for)

    binding = engine_binding(threads=args.threads)  # the engine's NUMA node on a multi-node host, as it binds
    apply_binding(binding)
    threads = binding.threads
    build = ROOT / "build"
    batches = [int(b) for b in args.batches.split(",")]
    native = not args.torch_ops
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__}, "
          f"{binding.describe()}; load average {os.getloadavg()[0]:.1f} (others' work makes figures noisy)")
    spec = load_model_spec(build / "models" / args.model)
    # the prompt GEMMs' rate on this model's own layer shapes (the planner's prefill floor), as `toolkit plan` takes it
    probe = with_layer_prefill_rates(measure_cpu(rounds=2, binding=binding), spec, binding, save=False)
    bandwidth = probe["bandwidth_bytes_s"]
    print(f"bandwidth as a decode step reads it: {bandwidth / 1e9:.1f} GB/s ({probe['bandwidth_kernel']} GEMV over "
          f"{probe['stream_mib']} MiB); a sum re-reading a working set of "
          + ", ".join(f"{mib} MiB {rate / 1e9:.0f}" for mib, rate in probe["read_curve_bytes_s"].items()) + " GB/s")
    hardware = spec_from_probe(probe)
    read_once = stream_reader(probe["bandwidth_kernel"], probe["stream_mib"])
    # read_once's rate as the sum read the probe scales its kernels' rates by (probe_at_read)
    as_sum = 1.0 if probe["bandwidth_kernel"] == "sum" else 1 / probe["gemv_over_read"][probe["bandwidth_kernel"]]
    given_step_cost = args.step_cost_ms / 1e3 if args.step_cost_ms is not None else None
    rows = {}
    for qformat in args.formats.split(","):
        ckpt = build / "checkpoints" / f"{args.model}-{qformat}"
        if not ckpt.is_dir():
            print(f"{qformat}: no checkpoint at {ckpt} (toolkit quantize -c configs/cpu-{args.model}.yaml "
                  f"--qformat {qformat})")
            continue
        context = args.isl + args.osl / 2

        def plan_at(read: float, batch: int, taken=None, qformat=qformat):  # the planner's step in the memory
            # state read, from the probe `taken` (default: the start's) moved there
            return cpu_decode_step(spec, qformat, batch, context, probe=probe_at_read(taken or probe, read * as_sum))

        def reprobe(qformat=qformat):  # the probe of this format's kernel taken again now
            return reprobe_kernel(probe, hardware.compute_type(weights_for(qformat)))

        prompt_passes = {}  # this format's prompt GEMMs on the model's layer, built at its first reprobe_prompt

        def reprobe_prompt(qformat=qformat, passes=prompt_passes):  # ... and of those, timed again now
            kernel = hardware.compute_type(weights_for(qformat))
            if not passes:
                passes.update(layer_prefill_passes(spec, kernels=(kernel,)))
            return time_layer_passes(passes).get(kernel)

        probes_after = {}
        r = bench_format(ckpt, batches, args.isl, args.osl, native, threads, args.repeats,
                         read_rate=lambda step_bytes: _read_rate_now(probe, step_bytes), read_once=read_once,
                         plan_at=plan_at, reprobe=None if args.no_reprobe else reprobe, probes_after=probes_after,
                         growth_batch=FLAT_UP_TO if qformat == "none" else None,
                         reprobe_prompt=None if args.no_reprobe else reprobe_prompt)
        # A step re-reads the same bytes: where they fit in the last-level cache, faster than the probe's stream.
        step_bytes = r["step_bytes"]
        r["working_set_factor"] = hardware.working_set_factor(step_bytes)  # the planner's, from the probe
        # ... and the rate it reads this format's weights at, re-reading them step after step (the kernel's curve)
        r["planner_weight_read_bytes_s"] = hardware.weight_read_bytes(weights_for(qformat), step_bytes)
        # The floors at the fastest the memory read right after this format's batch-1 runs (_read_rate_now):
        # streaming, and re-reading the step's bytes; the start's probe only where there were none.
        streams = [stream for stream, _ in r["read_rates"]] or [bandwidth]
        rereads = [reread for _, reread in r["read_rates"]] or [bandwidth * r["working_set_factor"]]
        r["floor_bandwidth"], r["reread_bandwidth"] = max(streams), max(rereads)
        r["floor_ms"] = step_bytes / r["floor_bandwidth"] * 1e3
        r["reread_floor_ms"] = step_bytes / max(r["reread_bandwidth"], r["floor_bandwidth"]) * 1e3
        # The planner's prediction with this format's step costs beyond the GEMMs as measured here: at batch B
        # the batch-1 cost plus (B - 1) times the cost per sequence.
        per_sequence = r["sequence_cost_ms"] / 1e3 if given_step_cost is None else 0.0
        step_cost = r["step_cost_ms"] / 1e3 - per_sequence if given_step_cost is None else given_step_cost
        r["roofline_ms"] = {b: cpu_decode_step_seconds(spec, qformat, b, context, probe=probe, step_overhead_s=step_cost,
                                                        sequence_overhead_s=per_sequence) * 1e3 for b in batches}
        if probes_after:  # the planner and the roofline against each run, from the probe taken right after it
            r.update(_against_probes_after(
                probes_after,
                lambda now, b, qformat=qformat: cpu_decode_step(spec, qformat, b, context, probe=now),
                lambda now, b, qformat=qformat, step_cost=step_cost, per_sequence=per_sequence: cpu_decode_step_seconds(
                    spec, qformat, b, context, probe=now, step_overhead_s=step_cost, sequence_overhead_s=per_sequence)))
        # ... and with its default (per-layer) step cost, as `toolkit plan` predicts without this benchmark
        planned = {b: cpu_decode_step(spec, qformat, b, context, probe=probe) for b in batches}
        r["planner_ms"] = {b: step.seconds * 1e3 for b, step in planned.items()}
        # what bounds its step at each batch, and the batch where the step turns compute-bound (engine_targets)
        r["planner_bound"] = {b: step.bound for b, step in planned.items()}
        r["crossover_batch"] = cpu_crossover_batch(spec, qformat, context, probe=probe)
        # (the prompt's own cost beyond GEMMs and attention as measured, else the step's per token)
        prefill_cost = (r["prefill_cost_ms"] / 1e3, 0.0) if given_step_cost is None else (step_cost, per_sequence)
        r["prefill_floor_ms"] = cpu_prefill_seconds(spec, qformat, args.isl, probe=probe, step_overhead_s=prefill_cost[0],
                                                    sequence_overhead_s=prefill_cost[1]) * 1e3
        if r.get("ttft_reprobed"):  # each prompt against the floor with its GEMMs probed right after it
            r["ttft_paired_ratio"] = _ttft_against_probes_after(
                r["ttft_reprobed"], probe, spec, hardware.compute_type(weights_for(qformat)),
                lambda now, qformat=qformat, cost=prefill_cost: cpu_prefill_seconds(spec, qformat, args.isl, probe=now,
                                                                 step_overhead_s=cost[0],
                                                                 sequence_overhead_s=cost[1]))
        # The rate the planner charges the step's GEMMs at each batch, beside the rate they ran at in the step
        r["probe_gemm_gflops"] = {b: hardware.decode_peak_flops(weights_for(qformat), b, step_bytes) / 1e9
                                  for b in batches}
        rows[qformat] = r
        itl = r["itl_ms"]
        print(f"{qformat:9s} {r['weight_format']:13s} load {r['load_s']:.1f}s warm-up {r['warm_up_s']:.1f}s  "
              f"TTFT {r['ttft_ms']:.1f} ms (planner {r['prefill_floor_ms']:.1f})  "
              + "  ".join(f"B{b} {itl[b]:.2f}ms/{b / itl[b] * 1e3:.0f}tok/s (roof x{itl[b] / r['roofline_ms'][b]:.2f})"
                          for b in batches)
              + f"  floor {r['floor_ms']:.2f} ms streaming at {r['floor_bandwidth'] / 1e9:.1f} GB/s: "
              + f"x{itl[batches[0]] / r['floor_ms']:.2f}; {r['reread_floor_ms']:.2f} ms re-reading the step's bytes at "
              + f"{r['reread_bandwidth'] / 1e9:.1f}: x{itl[batches[0]] / r['reread_floor_ms']:.2f}"
              + (f"; paired, x (step ms at GB/s): {_paired_cell(r['paired'])}" if "paired" in r else "")
              + (f"; B={r['paired_growth']['batch']} over B=1, paired: {growth_cell(r['paired_growth'])}"
                 if "paired_growth" in r else "")
              + f"  step cost without GEMMs {r['step_cost_ms']:.2f} ms + {r['sequence_cost_ms']:.3f} per sequence"
              + f", the prompt's {r['prefill_cost_ms']:.1f} ms"
              + (f"; CPU stolen by the hypervisor {r['steal_pct']:.1f} %" if "steal_pct" in r else "")
              + (f"; in the step, GEMM GFLOP/s (probe's) and attention ms: {_in_step_cell(r)}" if r["in_step"] else ""),
              flush=True)
    paired_formats = {}
    if "none" in rows and len(rows) > 1:
        paired_formats = _paired_formats({q: build / "checkpoints" / f"{args.model}-{q}" for q in rows}, args.isl,
                                         native, threads, read_once,
                                         step_bytes={q: r["step_bytes"] for q, r in rows.items()})
        print(f"batch-1 step over bf16's, paired round by round ({ROUNDS} rounds, median [quartiles] (median step, "
              "against its floor at the read after its round)): "
              + _paired_formats_line(paired_formats), flush=True)
    peers = {}
    if not args.no_peers and (PEERS / "venv/bin/python").is_file():
        for kind in [k for k in ("f16", "bf16", "q8_0", "q4_0") if any(k in PEER_FOR[q] for q in rows)]:  # same bits
            p = bench_llamacpp(build / "models" / args.model, kind, args.isl, args.osl, threads)
            if p:
                p["batched"] = bench_llamacpp_batched(build / "models" / args.model, kind, args.isl, args.osl, threads,
                                                      batches, args.repeats)
                peers[kind] = p
                batched = "  ".join(f"B{b} {v['itl_ms']:.2f}ms/{v['tok_s']:.0f}tok/s"
                                    for b, v in sorted((p["batched"] or {}).items()))
                print(f"llama.cpp {kind:5s} TTFT {p['ttft_ms']:.1f} ms  ITL {p['itl_ms']:.2f} ms  batched: "
                      f"{batched or 'not measured (bash perf/setup_peers.sh builds llama-batched-bench)'}", flush=True)
    elif not args.no_peers:
        print("peers: not set up (bash perf/setup_peers.sh)")
    openvino = {}
    if not args.no_peers and (OPENVINO / "bin/python").is_file():
        for kind in sorted({OV_FOR[q] for q in rows}):
            p = bench_openvino(build / "models" / args.model, kind, args.isl, args.osl, threads, batches, args.repeats)
            if p:
                openvino[kind] = p
                print(f"OpenVINO GenAI {kind:4s} TTFT {p['ttft_ms']:.1f} ms  ITL {p['itl_ms']:.2f} ms  batched: "
                      + "  ".join(f"B{b} {v['itl_ms']:.2f}ms/{v['tok_s']:.0f}tok/s" for b, v in sorted(p["batched"].items())),
                      flush=True)
    print()
    print(markdown_table(rows, peers, openvino, batches))
    if paired_formats:
        print(f"\nBatch-1 step over bf16's, paired round by round: {_paired_formats_line(paired_formats)}")
    report = {"probe": probe, "rows": rows, "peers": peers, "openvino": openvino, "paired_formats": paired_formats}
    print("\nAgainst the targets (perf/engine_targets.py):")
    as_saved = json.loads(json.dumps(report, default=str))  # as a saved run reads back: batch keys as strings
    print("\n".join(v.line() for v in verdicts(as_saved)))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))


def markdown_table(rows: dict, peers: dict, openvino: dict, batches: list[int]) -> str:
    head = ("| format | kernel | TTFT ms (planner) | " + " | ".join(f"ITL B={b} ms" for b in batches)
            + f" | tok/s B={batches[-1]} | step w/o GEMMs ms | B=1 floor ms (streaming at GB/s) | B=1 / floor"
            + " | B=1 / floor, paired per memory state (step ms at GB/s) | B=1 / re-read floor (GB/s) | "
            + " | ".join(f"B={b} / roofline" for b in batches)
            + " | planner B=1 ms (error at each B; in each B's own memory state: GB/s read after it; each run against the planner probed after it) | in the step: GEMM GFLOP/s (probe's), attention ms | llama.cpp ITL ms (B=1 ratio) | llama.cpp batched tok/s at B (ours / theirs)"
            + " | OpenVINO GenAI TTFT ms, ITL ms (B=1 ratio), tok/s at B (ours / theirs) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for q, r in rows.items():
        itl, roof = r["itl_ms"], r["roofline_ms"]
        planner = r["planner_ms"][batches[0]]
        errors = " / ".join(f"{(r['planner_ms'][b] / itl[b] - 1) * 100:+.0f}" for b in batches)
        if "planner_at_read_ms" in r:
            reads = r.get("reprobe_read_bytes_s") or r["itl_read_bytes_s"]
            errors += "; " + " / ".join(f"{(r['planner_at_read_ms'][b] / itl[b] - 1) * 100:+.0f} ({reads[b] / 1e9:.0f})"
                                        for b in batches)
        if "planner_paired_error" in r:
            errors += "; each run against its probe, median: " + " / ".join(
                f"{r['planner_paired_error'][b] * 100:+.0f}" for b in batches)
        peer = [f"{k} {peers[k]['itl_ms']:.2f} (x{itl[batches[0]] / peers[k]['itl_ms']:.2f})"
                for k in PEER_FOR[q] if k in peers]
        batched = [f"{k} {_tok_s_ratios(peers[k]['batched'], itl)}" for k in PEER_FOR[q] if k in peers and peers[k].get("batched")]
        lines.append(f"| {q} | {r['weight_format']} | {r['ttft_ms']:.1f} ({r['prefill_floor_ms']:.1f}) | "
                     + " | ".join(f"{itl[b]:.2f}" for b in batches)
                     + f" | {batches[-1] / itl[batches[-1]] * 1e3:.0f} | {r['step_cost_ms']:.2f} + {r['sequence_cost_ms']:.3f}/seq; prompt {r['prefill_cost_ms']:.1f}"
                     + f" | {r['floor_ms']:.2f} ({r['floor_bandwidth'] / 1e9:.1f}) | "
                     + f"{itl[batches[0]] / r['floor_ms']:.2f} | "
                     + (f"{_paired_cell(r['paired'])} | " if "paired" in r else "- | ")
                     + f"{itl[batches[0]] / r['reread_floor_ms']:.2f} ({r['reread_bandwidth'] / 1e9:.1f}) | "
                     + " | ".join(f"{itl[b] / roof[b]:.2f}" + (f" ({r['roofline_paired_ratio'][b]:.2f} paired)"
                                                               if "roofline_paired_ratio" in r else "") for b in batches)
                     + f" | {planner:.2f} ({errors} %) | {_in_step_cell(r) or '-'} | {'; '.join(peer) or '-'}"
                     + f" | {'; '.join(batched) or '-'} | {_openvino_cell(openvino.get(OV_FOR[q]), OV_FOR[q], itl, batches)} |")
    return "\n".join(lines)


def _in_step_cell(r: dict) -> str:
    """Per batch the GEMMs' rate inside the step against the rate the planner charges, and attention's ms per step:
    "B=8 175 (254), 1.29 ms"."""
    return "; ".join(f"B={b} {p['gemm_gflops']:.0f} ({r['probe_gemm_gflops'][b]:.0f}), {p['attention']:.2f} ms"
                     for b, p in sorted(r["in_step"].items()))


def _tok_s_ratios(batched: dict, itl: dict) -> str:
    """A peer's tokens/s at each B > 1 we measured too, with ours over theirs."""
    return ", ".join(f"B={b} {v['tok_s']:.0f} (x{b / itl[b] * 1e3 / v['tok_s']:.2f})"
                     for b, v in sorted(batched.items()) if b in itl and b > 1)


def _openvino_cell(ov: dict | None, kind: str, itl: dict, batches: list[int]) -> str:
    if not ov:
        return "-"
    batched = _tok_s_ratios(ov["batched"], itl)
    return (f"{kind}: {ov['ttft_ms']:.1f}, {ov['itl_ms']:.2f} (x{itl[batches[0]] / ov['itl_ms']:.2f})"
            + (f", {batched}" if batched else ""))


if __name__ == "__main__":
    main()
