"""What the embedded engine's scheduling levers do, measured on the engine itself (no Triton, no client).

    .venv/bin/python perf/scheduler_bench.py [--checkpoint build/checkpoints/small-none] [--threads N]

Four experiments, each run with the lever off and on, same checkpoint, same run:
  chunked prefill   4 streams decode; a 256-token prompt arrives. Worst gap between two tokens of the
                    decoding streams while it is prefilled, and the newcomer's TTFT.
  prefix reuse      8 requests, one after another, sharing a 192-token system prompt: mean TTFT, hits.
  n-gram drafts     greedy output of a repetitive and a non-repetitive prompt: ms per output token,
                    tokens per step, acceptance rate, and how many leading tokens equal plain greedy
                    decoding (all of them in float32; in bf16 a near-tie may flip).
  full cache        6 requests on a cache that holds 3 at full length: guaranteed_no_evict vs
                    max_utilization (time to finish all, waits, pauses).
Figures go to stdout as a table; record them in perf/README.md with the date and machine load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from toolkit.engine.runtime.engine import Engine
from toolkit.engine.runtime.model_runner import ModelRunner
from toolkit.engine.runtime.scheduler import SchedulerConfig

BLOCK = 32


def engine(runner, **overrides) -> Engine:
    settings = dict(max_batch_size=16, max_num_tokens=512, max_seq_len=512, block_size=BLOCK,
                    num_blocks=runner.cache.num_blocks)
    return Engine(runner, SchedulerConfig(**(settings | overrides)))


VOCAB = [512]  # set from the checkpoint in main()


def prompt(n: int, seed: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % (VOCAB[0] - 8) + 4 for i in range(n)]


def chunked_prefill(runner, chunked: bool) -> dict:
    e = engine(runner, max_num_tokens=64 if chunked else 512, enable_chunked_context=chunked)
    arrivals: dict[str, list[float]] = {}

    def record(out):
        arrivals.setdefault(out.request_id, []).extend([out.at] * len(out.new_tokens))

    for i in range(4):
        e.add_request(f"d{i}", prompt(32, i), 64, callback=record)
    for _ in range(8):
        e.step()
    sent = time.perf_counter()
    e.add_request("long", prompt(256, 99), 4, callback=record)
    e.run_until_idle()
    long_first = arrivals["long"][0]
    gaps = [b - a for i in range(4) for a, b in zip(arrivals[f"d{i}"], arrivals[f"d{i}"][1:])
            if a >= sent - 0.5 and a <= long_first]
    return {"worst decode gap ms": max(gaps) * 1e3, "newcomer TTFT ms": (long_first - sent) * 1e3}


def prefix_reuse(runner, reuse: bool) -> dict:
    e = engine(runner, enable_kv_cache_reuse=reuse)
    system = prompt(192, 1)
    ttfts = []
    for i in range(8):
        first: list[float] = []
        sent = time.perf_counter()
        e.add_request(f"r{i}", system + prompt(16, 100 + i), 2,
                      callback=lambda out: first.append(out.at) if out.new_tokens and not first else None)
        e.run_until_idle()
        ttfts.append(first[0] - sent)
    return {"mean TTFT ms (2nd-8th)": statistics.mean(ttfts[1:]) * 1e3,
            "reuse hit rate": e.scheduler.blocks.counters.hit_rate}


def ngram(runner, drafts: int, repetitive: bool) -> tuple[dict, list[int]]:
    e = engine(runner, max_draft_len=drafts)
    text = (prompt(24, 5) * 6) if repetitive else prompt(144, 6)
    start = time.perf_counter()
    out = e.generate([text], 96)[0]
    elapsed = time.perf_counter() - start
    steps = len(e.timeline.records)
    return {"ms per token": elapsed / len(out) * 1e3, "tokens per step": len(out) / max(steps - 1, 1),
            "acceptance": e.scheduler.spec.acceptance_rate}, out


def full_cache(runner, policy: str) -> dict:
    # 3 full-length requests' worth of blocks: 160 + 96 tokens = 8 blocks each.
    e = engine(runner, num_blocks=24, batch_scheduler_policy=policy)
    start = time.perf_counter()
    e.generate([prompt(160, 30 + i) for i in range(6)], 96)
    c = e.scheduler.counters
    return {"all done s": time.perf_counter() - start, "admission waits": c.admission_waits,
            "pauses": c.preemptions}


def row(name: str, off: dict, on: dict) -> None:
    for key in off:
        print(f"| {name} | {key} | {off[key]:.3g} | {on[key]:.3g} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="build/checkpoints/small-none")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    runner = ModelRunner(args.checkpoint, num_blocks=96, block_size=BLOCK, threads=args.threads)
    runner.warm_up(16, 512)
    VOCAB[0] = runner.spec.vocab_size
    print(f"{args.checkpoint}: weights {runner.weight_format}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| experiment | figure | off | on |\n|---|---|---|---|")
    row("chunked prefill (64-token chunks)", chunked_prefill(runner, False), chunked_prefill(runner, True))
    row("prefix reuse (192 shared tokens)", prefix_reuse(runner, False), prefix_reuse(runner, True))
    for repetitive in (True, False):
        (plain, a), (spec, b) = ngram(runner, 0, repetitive), ngram(runner, 4, repetitive)
        # Verifying k+1 tokens in one pass is a different GEMM shape than k+1 single-token steps: in bf16
        # a near-tie between two logits can flip (exact in float32, tests/test_engine_runtime.py).
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        plain["tokens equal to plain greedy"], spec["tokens equal to plain greedy"] = len(a), same
        row(f"n-gram drafts, {'repetitive' if repetitive else 'plain'} text", plain, spec)
    row("full cache: guaranteed_no_evict (off) vs max_utilization (on)",
        full_cache(runner, "guaranteed_no_evict"), full_cache(runner, "max_utilization"))


if __name__ == "__main__":
    main()
