"""Where a prompt's time goes: each part of one prompt's forward timed where the prompt calls it, and its GEMMs
against the same calls replayed back to back.

    .venv/bin/python perf/prompt_in_place.py --qformats none,int4_awq

Per format: the prompt (a TTFT's forward: one sequence, --isl tokens), its GEMMs per kind (q/k/v, o, gate/up, down)
and its C kernels (norms, RoPE, KV writes, SwiGLU's middle, attention) timed in place; then the same GEMM calls,
their inputs copied from the prompt, replayed back to back (each output dropped at once, so the next call writes
where the last one did, in L2), and replayed keeping every output alive (each call writes lines not just written,
as in the prompt). A kind slower in place than replayed, and as slow when replayed keeping its outputs, is paying
for writing cold output lines (INT4's tile kernel before it fetched them ahead, perf/README "The AMX Xeon, final").
All rounds alternate in one process (this VM's speed drifts within minutes); the median round of each is shown.
"""

from __future__ import annotations

import argparse
import collections
import copy
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("qkv", "o", "gate_up", "down")
NATIVE_PARTS = ("rms_norm", "add_rms_norm_", "rope_", "write_kv_cache", "smooth_rows_", "silu_mul", "chunk_attention",
                "decode_attention")


def instrument(runner, spent: dict, calls: list) -> None:
    """Wraps the runner's linears and C kernels so that each call adds its seconds to spent[part] (and the linears'
    first prompt's calls, with a copy of their input, go to `calls`)."""
    import engine_bench  # perf/, on the path from main

    def timed(part, fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            spent[part] += time.perf_counter() - start
            return out
        return call

    class Linear:
        def __init__(self, inner, kind):
            self.inner, self.kind = inner, kind

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def __call__(self, x):
            start = time.perf_counter()
            out = self.inner(x)
            spent[self.kind] += time.perf_counter() - start
            if len(calls) < 4 * len(runner.layers):
                calls.append((self.inner, self.kind, x.clone()))
            return out

    runner.native = copy.copy(runner.native)
    for part in NATIVE_PARTS:
        if hasattr(runner.native, part):
            setattr(runner.native, part, timed(part, getattr(runner.native, part)))
    engine_bench.wrap_linears(runner, Linear)


def replay(calls: list, keep: bool) -> dict:
    spent, kept = collections.defaultdict(float), []
    for fn, kind, x in calls:
        start = time.perf_counter()
        out = fn(x)
        spent[kind] += time.perf_counter() - start
        if keep:
            kept.append(out)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--qformats", default="none,int4_awq", help="checkpoints build/checkpoints/<model>-<qformat>")
    parser.add_argument("--model", default="small")
    parser.add_argument("--isl", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "perf")]
    import engine_bench
    from toolkit.engine.runtime.model_runner import ModelRunner

    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; a {args.isl}-token prompt, median of {args.rounds} "
          "rounds, ms")
    for qformat in args.qformats.split(","):
        checkpoint = ROOT / "build" / "checkpoints" / f"{args.model}-{qformat}"
        if not checkpoint.is_dir():
            raise SystemExit(f"no checkpoint at {checkpoint} (toolkit quantize -c configs/cpu-{args.model}.yaml "
                             f"--qformat {qformat})")
        runner = ModelRunner(checkpoint, num_blocks=-(-(args.isl + 256) // engine_bench.BLOCK),
                             block_size=engine_bench.BLOCK, native=True)
        if runner.native is None:
            raise SystemExit("the engine's C kernels did not build here: nothing to time in place")
        runner.warm_up(1, args.isl)
        prompt = engine_bench._steps(1, args.isl)[0](0)
        spent, calls = collections.defaultdict(float), []
        instrument(runner, spent, calls)
        runner.forward(prompt)  # fills `calls`
        rounds = {"in place": [], "replayed": [], "replayed, outputs kept": []}
        totals = []
        for _ in range(args.rounds):
            spent.clear()
            start = time.perf_counter()
            runner.forward(prompt)
            totals.append(time.perf_counter() - start)
            rounds["in place"].append(dict(spent))
            rounds["replayed"].append(replay(calls, keep=False))
            rounds["replayed, outputs kept"].append(replay(calls, keep=True))

        def median(view: str, part: str, rounds=rounds) -> float:
            return statistics.median(r.get(part, 0.0) for r in rounds[view]) * 1e3

        print(f"{qformat} ({runner.weight_format}): the prompt {statistics.median(totals) * 1e3:.2f} "
              f"(min {min(totals) * 1e3:.2f}), timers included")
        for view in rounds:
            gemms = " ".join(f"{k} {median(view, k):.2f}" for k in KINDS)
            print(f"  GEMMs {view:23s} {gemms} = {sum(median(view, k) for k in KINDS):.2f}")
        parts = [(p, median("in place", p)) for p in NATIVE_PARTS if any(p in r for r in rounds["in place"])]
        print("  C kernels in place: " + ", ".join(f"{p} {ms:.2f}" for p, ms in sorted(parts, key=lambda x: -x[1])))


if __name__ == "__main__":
    main()
