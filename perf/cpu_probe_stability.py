"""How stable is the planner's CPU probe? Runs it N times, independently, and prints every figure's
spread across the runs (the planner keeps one run's best-of-rounds figures: this is what a re-probe
could give instead).

    .venv/bin/python perf/cpu_probe_stability.py --probes 3

Figures depend on what else the machine runs: note `uptime`'s load beside them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    from toolkit.plan.cpu_probe import KERNELS, measure_cpu

    parser = argparse.ArgumentParser()
    parser.add_argument("--probes", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    runs, seconds = [], []
    for _ in range(args.probes):
        start = time.perf_counter()
        runs.append(measure_cpu())
        seconds.append(time.perf_counter() - start)
    rows = [("bandwidth GB/s (fastest read)", [r["bandwidth_bytes_s"] / 1e9 for r in runs]),
            ("sum GB/s", [r["read_bytes_s_sum"] / 1e9 for r in runs])]
    rows += [(f"{k} GEMV GB/s", [r["gemv_bytes_s"][k] / 1e9 for r in runs]) for k in KERNELS]
    rows += [(f"{k} GFLOP/s", [r["flops"][k] / 1e9 for r in runs]) for k in KERNELS]
    rows += [(f"{k} at {b} rows GFLOP/s", [r["decode_flops"][k][b] / 1e9 for r in runs])
             for k in KERNELS for b in runs[0]["decode_flops"][k]]
    rows += [("attention M head-tokens/s", [(r["attention_head_tokens_s"] or 0) / 1e6 for r in runs])]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {runs[0]['cpu']}, {runs[0]['threads']} threads, "
          f"load average {load:.1f} at start, {args.probes} probes of {runs[0]['rounds']} rounds, "
          f"{statistics.median(seconds):.1f} s each")
    print(f"| figure | {' | '.join(f'probe {i + 1}' for i in range(len(runs)))} | (max − min) / max |")
    print(f"|---|{'---:|' * len(runs)}---:|")
    for name, values in rows:
        cells = " | ".join(f"{v:,.1f}" for v in values)
        print(f"| {name} | {cells} | {(max(values) - min(values)) / max(values):.0%} |")


if __name__ == "__main__":
    main()
