"""The planner's probe and its yardstick: one kernel's re-read passes, the sum read paired with each, and the step.

The CPU probe (toolkit/plan/cpu_probe.py) times each kernel's one-row pass re-reading working sets of 16 MiB to twice
the last-level cache, each pass followed by a torch sum over the 128 MiB stream. Up to probe v35 a set's figure was
the pass over that sum read; since v36 it is the pass's own read over the round's median sum read (reread_ratios),
because on a host with a large L3 the sum read right after a pass runs slower the more the pass read (the AMX Xeon,
480 MiB of L3, 2026-11-29: 18.7 GB/s after a bf16 pass over 16 MiB, 6.9 after 960). This prints, per set: the pass's
read, the sum read after it, the old figure (pass over paired sum, times the median sum; v35 took the median of
the pairs' ratios) and the new (the pass's own read); then the step's GEMMs as the C decode step times them in place
at one sequence, against which both are set.

    .venv/bin/python perf/probe_yardstick.py --kernel bf16 --qformat none
    .venv/bin/python perf/probe_yardstick.py --kernel int4 --qformat int4_awq

Run nothing else meanwhile (2 cores). On a host whose L3 holds none of the stream (the 32 MiB Zen 4) the two figures
should agree.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "perf"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", default="bf16", help="the probe's kernel name (cpu_probe.KERNELS)")
    parser.add_argument("--qformat", default="none",
                        help="the step's checkpoint: build/checkpoints/<model>-<qformat>")
    parser.add_argument("--model", default="small")
    parser.add_argument("--osl", type=int, default=64)
    args = parser.parse_args()

    from toolkit.plan import cpu_probe

    stream_mib = 128
    read = cpu_probe.stream_reader("sum", stream_mib)
    read()  # page faults
    sums: list[float] = []

    def plain() -> float:
        sums.append(read())
        return sums[-1]

    passes = cpu_probe._reread_passes(args.kernel, stream_mib, plain, 3)
    base = statistics.median(sums)
    print(f"{args.kernel}: the median sum read after every pass {base / 1e9:.1f} GB/s")
    print("set MiB | pass GB/s | sum after it GB/s | pass / paired sum x median sum (v35) | pass's own (v36)")
    for mib, by_rows in passes.items():
        _, own, paired = by_rows[1]
        print(f"{mib:7d} | {own / 1e9:9.1f} | {paired / 1e9:17.1f} | {own / paired * base / 1e9:36.1f} | "
              f"{own / 1e9:.1f}")
    _step_reads(args, cpu_probe._WEIGHT_BYTES[args.kernel])


def _step_reads(args, weight_bytes: float) -> None:
    """The C decode step's GEMMs at one sequence, timed in place: their weights' bytes over their time, three runs."""
    from engine_bench import median_step

    from toolkit.engine.runtime.model_runner import ModelRunner

    runner = ModelRunner(ROOT / "build" / "checkpoints" / f"{args.model}-{args.qformat}", num_blocks=64,
                         block_size=32, native=True)
    runner.warm_up(1, 128)
    if runner.decoder is None:
        print("the step does not run in one C call here: no in-place timing")
        return
    desc = runner.decoder.desc
    parts = ("qkv", "o", "gate_up", "down")
    linears = [getattr(desc.layers[i], part) for i in range(desc.num_layers) for part in parts]
    nbytes = sum(lin.n * lin.k for lin in linears) * weight_bytes
    for _ in range(3):
        runner.decoder.time_parts(True)
        try:
            median_step(runner, 1, 128, args.osl)
            seconds = runner.decoder.timing_parts()
        finally:
            runner.decoder.time_parts(False)
        gemms = sum(seconds[part] for part in parts) / args.osl
        print(f"the step's GEMMs at one sequence: {gemms * 1e3:.2f} ms, {nbytes / gemms / 1e9:.1f} GB/s over "
              f"{nbytes / 2**20:.0f} MiB of weights")


if __name__ == "__main__":
    main()
