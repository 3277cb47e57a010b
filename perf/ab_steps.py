"""A/B whole decode steps of two builds of the engine in one process, in alternating order.

perf/ab_kernels.py times a step's GEMMs called one by one from Python (~6 us a call), which hides one-row
differences that whole steps show, and misses everything between the GEMMs. Here each build's own ModelRunner
(its toolkit package imported afresh from its tree, its C kernels built from its csrc) loads the same checkpoint,
and their decode steps (perf/engine_bench.py's median step) are timed in turn, the order alternating every
repeat; best of --repeats each. Sequential runs of two builds compare this VM's minutes, not the code: one
unchanged path moved -10 % and +17 % in two such runs (2026-11-26).

    git worktree add /tmp/base HEAD~1
    .venv/bin/python perf/ab_steps.py --base /tmp/base --qformat int4_awq --batches 1,8,16
    .venv/bin/python perf/ab_steps.py --base /tmp/base --qformat int4_awq --prompt --repeats 24  # a TTFT's forward

Prints, per batch (or for the prompt, its min and median), both builds' step and the ratio (new / base). The tool has a bias of its own between the two
builds it loads: the same code, in two trees, read new / base 1.035 in one run (2026-11-27, INT4-AWQ at one sequence,
--slices 40). Under ~4 %, run it again with --base and --new swapped before believing a difference.

This VM's memory also flips within seconds between ~30 and ~50 GB/s (perf/README.md), and a change can help in one
state only (the bf16 GEMM without software prefetch: -20 % in the fast one). --slices N times N slices of 8 steps per
build instead, each followed by one 128 MiB read, and reports the two builds per state (read above --fast-above GB/s
or not), each slice's first step (after the read evicted the caches) left out.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_runner(tree: Path, checkpoint: Path, max_batch: int):
    """(runner, that tree's engine_bench module): a ModelRunner of the tree at `tree`, warmed up."""
    for name in [m for m in sys.modules if m in ("toolkit", "engine_bench") or m.startswith("toolkit.")]:
        del sys.modules[name]
    paths = [str(tree), str(tree / "perf")]
    sys.path[:0] = paths
    try:
        import engine_bench
        from toolkit.engine.runtime.model_runner import ModelRunner

        runner = ModelRunner(checkpoint, num_blocks=64 * max_batch, block_size=engine_bench.BLOCK, native=True)
        runner.warm_up(max_batch, 128)
    finally:
        del sys.path[:len(paths)]
    return runner, engine_bench


def main() -> None:
    from engine_bench import FAST_ABOVE  # this tree's (load_runner imports each tree's afresh)

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="a checkout (worktree) of the build to compare against")
    parser.add_argument("--new", type=Path, default=ROOT, help="the build under test (default: this tree)")
    parser.add_argument("--qformat", default="none", help="the checkpoint build/checkpoints/<model>-<qformat>")
    parser.add_argument("--model", default="small")
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--isl", type=int, default=128)
    parser.add_argument("--osl", type=int, default=32, help="decode steps per timed run (their median counts)")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--slices", type=int, default=0, help="time slices paired with memory reads instead (above)")
    parser.add_argument("--fast-above", type=float, default=FAST_ABOVE / 1e9,
                        help="GB/s: a slice's read above this is the fast state (engine_bench's cut)")
    parser.add_argument("--prompt", action="store_true",
                        help="time one --isl-token prompt (a TTFT's forward) instead of decode steps: min and median")
    args = parser.parse_args()
    checkpoint = ROOT / "build" / "checkpoints" / f"{args.model}-{args.qformat}"
    if not checkpoint.is_dir():
        raise SystemExit(f"no checkpoint at {checkpoint} (toolkit quantize -c configs/cpu-{args.model}.yaml "
                         f"--qformat {args.qformat})")
    batches = [int(b) for b in args.batches.split(",")]
    builds = [load_runner(tree.resolve(), checkpoint, max(batches)) for tree in (args.base, args.new)]
    if args.prompt:
        paired_prompts(builds, args.isl, args.repeats)
        return
    if args.slices:
        for batch in batches:
            paired_slices(builds, batch, args.isl, args.slices, args.fast_above * 1e9)
        return
    best = {(i, b): float("inf") for i in (0, 1) for b in batches}
    for repeat in range(args.repeats):
        for batch in batches:
            for i in ((0, 1) if repeat % 2 == 0 else (1, 0)):
                runner, bench = builds[i]
                best[(i, batch)] = min(best[(i, batch)], bench.median_step(runner, batch, args.isl, args.osl))
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.model}-{args.qformat} "
          f"({builds[1][0].weight_format}), decode step median of {args.osl}, best of {args.repeats}, order alternating")
    for batch in batches:
        base, new = best[(0, batch)] * 1e3, best[(1, batch)] * 1e3
        print(f"B={batch:2d}: base {base:7.3f} ms  new {new:7.3f} ms  new/base {new / base:.3f}")


def paired_prompts(builds, isl: int, repeats: int, per_turn: int = 3) -> None:
    """Both builds' `isl`-token prompts (one sequence's prefill, as engine_bench times TTFT), `per_turn` at a time in
    alternating order for `repeats` turns each: the min and the median per build."""
    import statistics

    times: list[list[float]] = [[], []]
    prompts = [bench._steps(1, isl)[0](0) for _, bench in builds]
    for repeat in range(repeats):
        for b in ((0, 1) if repeat % 2 == 0 else (1, 0)):
            for _ in range(per_turn):
                start = time.perf_counter()
                builds[b][0].forward(prompts[b])
                times[b].append(time.perf_counter() - start)
    (base_min, base_med), (new_min, new_med) = ((min(t) * 1e3, statistics.median(t) * 1e3) for t in times)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {builds[1][0].weight_format}, a {isl}-token prompt, "
          f"{per_turn * repeats} per build, order alternating")
    print(f"min: base {base_min:.2f} ms  new {new_min:.2f} ms  new/base {new_min / base_min:.3f}; median: base "
          f"{base_med:.2f} ms  new {new_med:.2f} ms  new/base {new_med / base_med:.3f}")


def paired_slices(builds, batch: int, isl: int, slices: int, fast_above: float, steps: int = 8) -> None:
    """Both builds' decode steps at `batch` in alternating slices, each slice followed by one memory read; the
    median step per build in each memory state."""
    import statistics

    from toolkit.plan.cpu_probe import stream_reader

    read = stream_reader("sum", 128)  # one 128 MiB sum, as the probe reads

    plans = []
    for runner, bench in builds:
        prefill, decode, _ = bench._steps(batch, isl)
        for seq in range(batch):
            runner.forward(prefill(seq))
        plans.append([decode(pos) for pos in range(isl, isl + steps)])
    times: dict[tuple[int, bool], list[float]] = {}
    rates: dict[bool, list[float]] = {True: [], False: []}
    for i in range(slices):
        for b in ((0, 1) if i % 2 == 0 else (1, 0)):
            step_times = []
            for step in plans[b]:
                start = time.perf_counter()
                builds[b][0].forward(step)
                step_times.append(time.perf_counter() - start)
            rate = read()
            fast = rate > fast_above
            rates[fast].append(rate)
            times.setdefault((b, fast), []).append(statistics.median(step_times[1:]))
    for fast in (True, False):
        if (0, fast) in times and (1, fast) in times:
            base, new = (statistics.median(times[(b, fast)]) * 1e3 for b in (0, 1))
            print(f"B={batch:2d} {'fast' if fast else 'slow'} state ({len(rates[fast])} reads, median "
                  f"{statistics.median(rates[fast]) / 1e9:.1f} GB/s): base {base:7.3f} ms  new {new:7.3f} ms  "
                  f"new/base {new / base:.3f}")
        else:
            print(f"B={batch:2d} {'fast' if fast else 'slow'} state: not seen for both builds in this run")


if __name__ == "__main__":
    main()
