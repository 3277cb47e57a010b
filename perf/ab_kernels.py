"""A/B two builds of the engine's C kernels in one process, in alternating order.

This VM's speed drifts within minutes (a 128 MiB sum read 24-30 GB/s and the probe 25-51 GB/s within one
hour, 2026-11-24), so two builds benchmarked one after the other compare minutes, not code. Here both
builds' kernels are loaded side by side (each compiled from its own csrc, cached by source) and timed in
turn, the order alternating every repeat, on one decode step's GEMMs of a model (q/k/v, o, gate/up and down
of every layer, weights distinct per layer so they stream from memory); best of --repeats each.

    git worktree add /tmp/base HEAD~1          # the build to compare against
    .venv/bin/python perf/ab_kernels.py --base /tmp/base --kinds int4,fp8 --rows 1,2,8

Prints, per kind and row count, both builds' step time and the ratio (new / base). A kind the base build
lacks (an older tree without the fp8 kernel) is skipped with a line saying so.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_native(root: Path):
    """The fused kernels of the tree at `root` (its toolkit package imported afresh)."""
    for name in [m for m in sys.modules if m == "toolkit" or m.startswith("toolkit.")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        from toolkit.engine.runtime import native_kernels

        kernels = native_kernels.load()
    finally:
        sys.path.remove(str(root))
    if kernels is None:
        raise SystemExit(f"the kernels of {root} did not build (see the log line above)")
    return kernels


def step_shapes(model_dir: Path) -> list[tuple[int, int]]:
    """(out, in) of every linear of one decode step, fused as the engine fuses them."""
    import json

    cfg = json.loads((model_dir / "config.json").read_text())
    hidden, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    qkv = (cfg["num_attention_heads"] + 2 * cfg.get("num_key_value_heads", cfg["num_attention_heads"])) * head_dim
    return [(qkv, hidden), (hidden, cfg["num_attention_heads"] * head_dim), (2 * inter, hidden), (hidden, inter)] * layers


def make_gemm(kernels, kind: str, n: int, k: int):
    """fn(x) running one linear of `kind` in `kernels`' build, or None where that build lacks it."""
    import torch

    if kind == "bf16":
        w = torch.randn(n, k).to(torch.bfloat16)
        return lambda x: kernels.gemm_bf16(x, w)
    if kind == "int4":
        packed, scales = kernels.pack_int4(torch.randint(-8, 8, (n, k))), torch.rand(n, k // 128) * 0.01
        return lambda x: kernels.gemm_int4(x, packed, scales, 128)
    if kind in ("int4_a8", "int4_a8_tiles"):  # INT4-AWQ's kernel where the CPU has VNNI: activations rounded to int8
        # per 128; int4_a8_tiles: its prompt chunks' kernel on AMX tiles (where has_int4_a8_amx)
        tiles = kind == "int4_a8_tiles"
        if not getattr(kernels, "has_int4_a8", False) or (tiles and not getattr(kernels, "has_int4_a8_amx", False)):
            return None
        values, scales = torch.randint(-8, 8, (n, k)), torch.rand(n, k // 128) * 0.01
        if hasattr(kernels, "pack_int4_lanes"):  # output rows in the vector lanes (2026-11-27 on)
            packed, lanes = kernels.pack_int4_lanes(values), kernels.lane_scales(scales)
            if tiles:
                return lambda x: kernels.gemm_int4_a8(x, packed, lanes, 128, n, tiles=True)
            return lambda x: kernels.gemm_int4_a8(x, packed, lanes, 128, n)
        packed = kernels.pack_int4(values)
        return lambda x: kernels.gemm_int4(x, packed, scales, 128, int8_activations=True)
    if kind == "fp8":
        if not hasattr(kernels, "gemm_fp8"):
            return None
        packed, scales = kernels.pack_fp8((torch.randn(n, k) * 40).to(torch.float8_e4m3fn)), torch.rand(n) * 0.01
        return lambda x: kernels.gemm_fp8(x, packed, scales, "fp8", 0.01)
    if kind == "int8_sq":
        if not kernels.has_int8_vnni:
            return None
        w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
        scales, sums = torch.rand(n) * 0.01, w.sum(dim=1, dtype=torch.int32)
        if hasattr(kernels, "pack_int8_lanes"):  # output rows in the vector lanes (2026-11-27 on)
            lanes = kernels.pack_int8_lanes(w, scales)
            return lambda x: kernels.gemm_int8_vnni(x, lanes, 0.02)
        return lambda x: kernels.gemm_int8_vnni(x, w, scales, sums, 0.02)
    raise SystemExit(f"unknown kind {kind!r}: bf16, int4, int4_a8, int4_a8_tiles, fp8 or int8_sq")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="a checkout (worktree) of the build to compare against")
    parser.add_argument("--new", type=Path, default=ROOT, help="the build under test (default: this tree)")
    parser.add_argument("--model", type=Path, default=ROOT / "build" / "models" / "small")
    parser.add_argument("--kinds", default="bf16,int4,int4_a8,fp8,int8_sq", help="also int4_a8_tiles (prompt rows)")
    parser.add_argument("--rows", default="1,2,4,8,16", help="activation rows (the decode batch)")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    import torch

    torch.manual_seed(0)
    builds = {"base": load_native(args.base.resolve()), "new": load_native(args.new.resolve())}
    shapes = step_shapes(args.model)
    rows = [int(r) for r in args.rows.split(",")]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; one decode step's GEMMs of {args.model.name} "
          f"({len(shapes)} linears), {torch.get_num_threads()} threads, best of {args.repeats}, order alternating")
    for kind in args.kinds.split(","):
        # interleaved allocations, so neither build's weights get the luckier pages
        pairs = [(make_gemm(builds["base"], kind, n, k), make_gemm(builds["new"], kind, n, k)) for n, k in shapes]
        if any(f is None for pair in pairs for f in pair):
            print(f"{kind}: not in both builds (or not on this CPU): skipped")
            continue
        inputs = {(m, k): torch.randn(m, k).to(torch.bfloat16) for m in rows for _, k in shapes}
        best = {(b, m): float("inf") for b in (0, 1) for m in rows}
        for repeat in range(args.repeats):
            for m in rows:
                for b in ((0, 1) if repeat % 2 == 0 else (1, 0)):
                    start = time.perf_counter()
                    for (n, k), pair in zip(shapes, pairs):
                        pair[b](inputs[(m, k)])
                    best[(b, m)] = min(best[(b, m)], time.perf_counter() - start)
        for m in rows:
            base, new = best[(0, m)] * 1e3, best[(1, m)] * 1e3
            print(f"{kind:8s} rows {m:2d}: base {base:7.3f} ms  new {new:7.3f} ms  new/base {new / base:.3f}")


if __name__ == "__main__":
    main()
