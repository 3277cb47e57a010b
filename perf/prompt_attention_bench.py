"""A prompt's causal attention alone (one layer of the `small` preset's shapes), on each kernel the engine has for it.

The engine sends a prompt chunk of enough rows to chunk_attention (csrc/chunk_attention.c: a work item holds up to 48
query heads, rows x a kv head's group, over one read of K and V; on AMX tiles where the CPU has them, else AVX512-BF16
dot products) and shorter ones to the decode kernel row by row. This times all three on one whole prompt and on a
short chunk at the end of a long context, best of --repeats rounds each, and prints the largest difference between
their outputs.

    .venv/bin/python perf/prompt_attention_bench.py                      # prompts of 128, 256, 1024 tokens
    .venv/bin/python perf/prompt_attention_bench.py --tokens 512 --chunk 8

Shapes: 12 query heads over 4 kv heads of 64 (bf16 cache, blocks of 32 tokens in order).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _best(call, calls: int, repeats: int) -> float:
    for _ in range(3):
        call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="128,256,1024", help="context lengths")
    parser.add_argument("--chunk", type=int, default=0,
                        help="rows of the chunk at the context's end (default 0: the whole prompt)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch

    from toolkit.engine.runtime import native_kernels

    native = native_kernels.load()
    if native is None:
        raise SystemExit("the engine's C kernels did not build here (see the log line above)")
    heads, kv_heads, head_dim, block = 12, 4, 64, 32
    if not native.chunk_attention_rows(torch.bfloat16, torch.bfloat16, head_dim, heads // kv_heads):
        print("no AVX512-BF16 here: prompts take the row kernel only")
    print(f"{native.isa}; AMX tiles {'granted' if native.has_amx else 'absent'}; one layer, 2 threads")
    print(f"{'tokens':>6} {'rows':>5} {'row kernel us':>14} {'AVX512-BF16 us':>15} {'AMX us':>8}  max |diff|")
    for tokens in (int(t) for t in args.tokens.split(",")):
        rows = args.chunk or tokens
        blocks = -(-tokens // block)
        k, v = (torch.randn(blocks * block, kv_heads, head_dim).to(torch.bfloat16) for _ in range(2))
        q = torch.randn(rows, heads, head_dim).to(torch.bfloat16)
        table = torch.arange(blocks)[None]
        lens = torch.arange(tokens - rows + 1, tokens + 1)
        calls = max(2, 20000 // tokens)
        outputs, figures = [], []
        row_out = native.decode_attention(q, k, v, table.repeat(rows, 1), lens, block, 1.0, 1.0)
        figures.append(_best(functools.partial(native.decode_attention, q, k, v, table.repeat(rows, 1), lens, block,
                                               1.0, 1.0), calls, args.repeats))
        for amx in (False, True):
            if not native.chunk_attention_rows(q.dtype, k.dtype, head_dim, heads // kv_heads) or (amx and not native.has_amx):
                figures.append(None)
                continue
            out = torch.empty_like(q)
            chunks = torch.tensor([[0, rows, tokens]])
            figures.append(_best(functools.partial(native.chunk_attention, q, k, v, table, chunks, block, 1.0, 1.0, out,
                                                   amx=amx), calls, args.repeats))
            outputs.append((out.float() - row_out.float()).abs().max().item())
        cells = " ".join(f"{f * 1e6:>{w}.0f}" if f else f"{'-':>{w}}" for f, w in zip(figures, (14, 15, 8)))
        print(f"{tokens:>6} {rows:>5} {cells}  {max(outputs, default=0):.3g}")


if __name__ == "__main__":
    main()
