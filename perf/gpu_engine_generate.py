"""The embedded engine end to end on a CUDA device (scheduler, chunked prefill, sampling, n-gram speculation, decode
steps from CUDA graphs, stream_interval) against the same engine on the CPU, on one built engine directory.

    python3 perf/gpu_engine_generate.py build/engines/cpu-tiny-cpu       # after toolkit init-model/quantize/build

Prints, per device: the time to generate, and how far each request's tokens agree with the CPU's; and on the GPU,
speculation on against off. In float32 (the default here, as tests/test_engine_runtime.py runs) these should agree:
in 16 bits a random-weight model's near-tied logits flip when the summation order changes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def common_prefix(a: list[int], b: list[int]) -> float:
    """The fraction of b's tokens that a repeats before they first differ."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n / max(1, len(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine_dir", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--dtype", default="float32",
                        help="activations (float32: no near-tie flips between devices or with speculation)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from toolkit.engine.runtime.engine import open_engine
    from toolkit.engine.runtime.sampling import GREEDY, SamplingParams

    limits = json.loads((args.engine_dir / "engine_config.json").read_text())
    longest = min(limits["max_input_len"], limits["max_seq_len"] - args.new_tokens)
    # prompts of several lengths (the longest prefilled in chunks beside the others' decodes), repetitive enough
    # for n-gram lookup to find drafts
    prompts = [[(7 * i + 3 * j) % 97 + 4 for j in range(n)] for i, n in enumerate((12, 40, 90, longest, 25, 60))]
    sampling = [GREEDY] * 4 + [SamplingParams(temperature=0.8, top_k=20, seed=11), SamplingParams(top_p=0.9, seed=5)]
    runs = {}
    for name, device, options in (("cpu", "cpu", {}), (args.device, args.device, {}),
                                  (f"{args.device}+ngram", args.device, {"max_draft_len": 4}),
                                  (f"{args.device}+interval4", args.device, {"stream_interval": 4})):
        engine = open_engine(args.engine_dir, device=device, dtype=args.dtype, **options)
        engine.generate(prompts[:1], 4)  # first steps (graph captures) out of the timing
        start = time.perf_counter()
        tokens = engine.generate(prompts, args.new_tokens, sampling=sampling)
        runs[name] = {"seconds": time.perf_counter() - start, "tokens": tokens,
                      "kernels": engine.runner.step_kernels, "weights": engine.runner.weight_format}
        print(f"{name}: {runs[name]['seconds']:.2f} s for {len(prompts)} requests x {args.new_tokens} tokens "
              f"({runs[name]['weights']}; {runs[name]['kernels']})", flush=True)
    cpu = runs["cpu"]["tokens"]
    for name in list(runs)[1:]:
        agree = [common_prefix(t, c) for t, c in zip(runs[name]["tokens"], cpu)]
        runs[name]["agreement_with_cpu"] = agree
        print(f"{name}: tokens agreeing with the CPU's before the first difference, per request: "
              + ", ".join(f"{a:.0%}" for a in agree), flush=True)
    plain, spec = runs[args.device]["tokens"], runs[f"{args.device}+ngram"]["tokens"]
    # (the two sampled requests are not comparable token for token with speculation: verifying a draft draws its
    # own random numbers, so the output follows the same distribution through other draws)
    print(f"{args.device}: greedy requests identical with and without n-gram speculation: "
          f"{sum(a == b for a, b in zip(plain[:4], spec[:4]))} of 4", flush=True)
    # stream_interval changes when tokens are handed over, never which: every request (the sampled ones' seeds too)
    interval = runs[f"{args.device}+interval4"]["tokens"]
    print(f"{args.device}: requests identical with stream_interval 4: {sum(a == b for a, b in zip(plain, interval))} "
          f"of {len(plain)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
