"""Decode attention alone (the C kernel the engine's step calls), over a paged KV cache laid out as a served engine's.

A served engine's sequences hold blocks scattered over the cache as requests come and go (and with KV reuse);
a benchmark that prefills a few sequences into a fresh cache gets them in order. This times one decode step's
attention (every layer) with the context's blocks in order and at random, with the cache as the engine allocates
it (`PagedKVCache`: one buffer on 2 MiB pages) and as plain torch tensors (4 KiB pages), the variants alternating,
best of --repeats each.

    .venv/bin/python perf/attention_bench.py --sequences 16 --context 160
    .venv/bin/python perf/attention_bench.py --base /tmp/base    # A/B: that worktree's kernel against this tree's

With --base, both builds' kernels (perf/ab_kernels.py's loading) run on the engine's cache, in turn, alternating.

Shapes: the `small` preset's attention (12 query heads, 4 kv heads, head_dim 64, 16 layers), bf16.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "perf"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--context", type=int, default=160, help="tokens per sequence")
    parser.add_argument("--block-size", type=int, default=32,
                        help="tokens per KV block: the configs' tokens_per_block (runs before 2026-11-27 05:00 used 16)")
    parser.add_argument("--cache-factor", type=int, default=3, help="cache blocks per block the batch holds")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--base", type=Path, help="a checkout (worktree) whose kernel to compare this tree's against")
    args = parser.parse_args()

    import torch

    if args.base is not None:
        from ab_kernels import load_native

        builds = {"base": load_native(args.base.resolve()), "new": load_native(ROOT)}
    from toolkit.engine.runtime import native_kernels
    from toolkit.engine.runtime.kv_cache import PagedKVCache

    if args.base is None:
        builds = {"": native_kernels.load()}
        if builds[""] is None:
            raise SystemExit("the engine's C kernels did not build here (see the log line above)")
    layers, heads, kv_heads, head_dim = 16, 12, 4, 64
    per_seq = -(-args.context // args.block_size)
    blocks = args.sequences * per_seq * args.cache_factor
    torch.manual_seed(0)
    engine = PagedKVCache(num_layers=layers, num_blocks=blocks, block_size=args.block_size, num_kv_heads=kv_heads,
                          head_dim=head_dim, compute_dtype=torch.bfloat16)
    for t in engine.k + engine.v:
        t.copy_(torch.randn(t.shape).to(torch.bfloat16))
    if args.base is not None:  # the builds, on the engine's cache
        variants = {name: (kernels, list(zip(engine.k, engine.v))) for name, kernels in builds.items()}
    else:  # the engine's cache against the same on 4 KiB pages
        plain = [t.clone() for t in engine.k + engine.v]
        variants = {"2 MiB pages (the engine's)": (builds[""], list(zip(engine.k, engine.v))),
                    "4 KiB pages": (builds[""], list(zip(plain[:layers], plain[layers:])))}
    tables = {"in order": torch.arange(args.sequences * per_seq),
              "scattered": torch.randperm(blocks)[: args.sequences * per_seq]}
    lens = torch.full((args.sequences,), args.context, dtype=torch.int64)
    q = torch.randn(args.sequences, heads, head_dim).to(torch.bfloat16)

    def step(variant, table) -> float:
        kernels, cache = variant
        start = time.perf_counter()
        for k, v in cache:
            kernels.decode_attention(q, k, v, table, lens, args.block_size, 1.0, 1.0)
        return time.perf_counter() - start

    kv_bytes = 2 * layers * args.sequences * args.context * kv_heads * head_dim * 2
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.sequences} sequences x {args.context} tokens, "
          f"{layers} layers, {kv_bytes / 1e6:.0f} MB of K/V a step, best of {args.repeats}, variants alternating")
    for order, table in tables.items():
        table = table.reshape(args.sequences, per_seq).contiguous()
        best = {name: float("inf") for name in variants}
        for repeat in range(args.repeats):
            names = list(variants) if repeat % 2 == 0 else list(reversed(variants))
            for name in names:
                best[name] = min(best[name], step(variants[name], table))
        print(f"blocks {order:9s}: " + "  ".join(f"{name} {s * 1e3:.2f} ms ({kv_bytes / s / 1e9:.1f} GB/s)"
                                                for name, s in best.items())
              + (f"  new/base {best['new'] / best['base']:.3f}" if args.base is not None else ""))


if __name__ == "__main__":
    main()
