"""Benchmark: how accurately, and up to what load, our sweep client measures TTFT and ITL.

A real Triton server serves the `synthetic` model (by default its C++ backend, toolkit/repo/cpp_backends/),
which streams tokens at a configured TTFT and ITL. The client's measured p50 TTFT and ITL should be
within 2 % of the configured values; the benchmark prints the error per concurrency (up to 256
streams) and the token-event rate the client sustained. Each step starts with one warm-up request
per stream (sweep.step_warmup_requests), so it is measured in steady state.

    .venv/bin/python perf/client_accuracy.py [--ttft-ms 200] [--itl-ms 40] [--concurrency 1,16,64,128,256]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from toolkit.bench.sweep import Target, run_sweep
from toolkit.config import validate_config
from toolkit.model.factory import create_offline_model
from toolkit.model.tokenizer import load_tokenizer
from toolkit.bench.rundir import RunDir
from toolkit.repo.writer import write_synthetic_repository
from toolkit.serve.server import running_server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ttft-ms", type=float, default=200.0)
    parser.add_argument("--itl-ms", type=float, default=40.0)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--concurrency", default="1,16,64,128,256")
    parser.add_argument("--requests-per-stream", type=int, default=4)
    parser.add_argument("--warmup-per-stream", type=int, default=1,
                        help="warm-up requests per stream at the start of each step (not measured)")
    parser.add_argument("--endpoint", default="triton-grpc", choices=["triton-grpc", "triton-http"])
    parser.add_argument("--server-backend", default="native", choices=["native", "python"],
                        help="the synthetic model's backend: C++ (native) or Triton's python backend")
    parser.add_argument("--server-instances", type=int, default=1,
                        help="instances of the synthetic model (parallel execute calls)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    work = Path(tempfile.mkdtemp(prefix="client-accuracy-"))
    tokenizer_dir = Path("build/models/tiny")
    if not (tokenizer_dir / "tokenizer.json").is_file():
        create_offline_model("tiny", tokenizer_dir)
    repo = write_synthetic_repository(work / "repo", args.ttft_ms, args.itl_ms, max_batch_size=max(levels),
                                      instances=args.server_instances, backend=args.server_backend)
    config = validate_config({"name": "synthetic", "sweep": {
        "endpoint": args.endpoint, "model": "synthetic", "concurrencies": [1], "warmup_requests": 4,
        "input_tokens_mean": 16, "output_tokens": args.output_tokens, "request_timeout_s": 300}})
    tokenizer = load_tokenizer(tokenizer_dir)
    rows = []
    with running_server(config, repo, work, work / "server.json") as handle:
        target = Target(handle.grpc_url, handle.http_url)
        for level in levels:
            # one warm-up request per stream: the step is measured in steady state, after the burst of
            # `level` simultaneous first sends (see perf/README.md for what that burst costs the server)
            settings = config.sweep.model_copy(update={"concurrencies": [level],
                                                       "requests_per_step": level * args.requests_per_stream,
                                                       "step_warmup_requests": level * args.warmup_per_stream})
            run_dir = work / f"c{level}"
            run_dir.mkdir()
            run_sweep(settings, target, tokenizer, run_dir, {"config_name": "synthetic"}, progress=lambda _: None)
            step = RunDir.open(run_dir).steps[0]
            m = step["metrics"]
            events = sum(len(r.chunk_times) for r in RunDir.open(run_dir).records() if not r.warmup)
            rows.append((level, m["time_to_first_token"]["p50"], m["inter_token_latency"]["p50"],
                         events / step["duration_s"], step["error_count"]))

    print(f"configured: TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms, {args.output_tokens} tokens, "
          f"endpoint {args.endpoint}, {args.server_backend} backend, {args.server_instances} server instance(s)")
    print(f"{'streams':>8} {'TTFT p50 ms':>12} {'err %':>7} {'ITL p50 ms':>11} {'err %':>7} {'events/s':>9} {'errors':>6}")
    for level, ttft, itl, rate, errors in rows:
        print(f"{level:>8} {ttft:>12.2f} {100 * (ttft / args.ttft_ms - 1):>+7.2f} {itl:>11.2f} "
              f"{100 * (itl / args.itl_ms - 1):>+7.2f} {rate:>9.0f} {errors:>6}")
    within = [(lvl, rate) for lvl, ttft, itl, rate, err in rows
              if abs(ttft / args.ttft_ms - 1) <= 0.02 and abs(itl / args.itl_ms - 1) <= 0.02 and not err]
    print(f"within 2 % (p50): {[lvl for lvl, _ in within]} streams")
    if within:
        level, rate = max(within, key=lambda item: item[1])
        print(f"highest token-event rate measured within 2 %: {rate:.0f} events/s ({level} streams)")
    print(f"highest token-event rate reached: {max(r[3] for r in rows):.0f} events/s")

if __name__ == "__main__":
    main()
