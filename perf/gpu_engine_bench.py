"""The embedded engine's ModelRunner on a CUDA device, per weight format, against the planner's GPU floors.

    python3 perf/gpu_engine_bench.py --json out.json          # on a GPU machine, checkpoints as engine_bench's
    bash perf/gpu_engine_check.sh                              # the same from a bare GPU machine (builds them)

The same runner and timing as perf/engine_bench.py (TTFT: one prefill of ISL tokens, best of 3; ITL at batch B:
the median decode step, best of --repeats; CUDA synchronized around every timed step), on the torch-ops path
(the fused C kernels are CPU code). Beside each figure:
- the planner's floors for the GPU it detects (`toolkit plan -g h100-sxm` / `h200`: datasheet bandwidth and
  tensor-core peaks, no per-step cost): the decode step max(weights + KV over HBM bandwidth, FLOPs over the
  format's peak), and the prefill floor;
- decode steps replayed from CUDA graphs (the runner's default on a GPU, cuda_graphs.py), and at
  --eager-batches without them, a kernel launch at a time;
- the GPU's busy time in one eager decode step (the profiler's kernel time) and its kernel count: a step much
  longer than its kernels is launch-bound (Python and per-op dispatch), not memory- or compute-bound;
- the step with its GEMMs and attention stubbed (engine_bench's step cost): what is left without them;
- a device-to-device copy's bandwidth, what HBM gives a streaming kernel on this GPU;
- the same checkpoint's prompt logits on the GPU against the CPU's (torch ops): greedy agreement, largest
  difference: the engine computes the same model on both.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "perf"))

from engine_bench import _steps, bench_format  # noqa: E402  (perf/ is not a package)

GPU_NAMES = (("H200", "h200"), ("H100 PCIe", "h100-pcie"), ("H100", "h100-sxm"), ("A100-SXM4-40GB", "a100-40gb"),
             ("A100", "a100-80gb"), ("L40S", "l40s"), ("L4", "l4"), ("A10G", "a10g"), ("B200", "b200"))


def catalog_name(device_name: str) -> str | None:
    """The planner's catalog entry for torch's device name ("NVIDIA H100 80GB HBM3" -> h100-sxm)."""
    return next((key for marker, key in GPU_NAMES if marker in device_name), None)


def copy_bandwidth(device: str, mib: int = 1024) -> float:
    """Bytes read + written per second by a device-to-device copy of `mib` MiB (best of 10)."""
    import torch

    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(12):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() / best


def kernel_time(runner, batch: int, isl: int) -> dict:
    """One decode step at `batch` under the profiler: the GPU's kernel time and kernel count, beside the step's
    wall time in the same run."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    prefill, decode, _ = _steps(batch, isl)
    for s in range(batch):
        runner.forward(prefill(s))
    runner.forward(decode(isl))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        runner.forward(decode(isl + 1))
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    busy_us = sum(e.time_range.elapsed_us() for e in kernels)
    return {"kernels": len(kernels), "kernel_ms": busy_us / 1e3, "profiled_step_ms": wall * 1e3}


def agreement_with_cpu(ckpt: Path, device: str, isl: int) -> dict:
    """The same checkpoint's logits for one prompt (all ISL positions) and 8 decode steps after it, on `device`
    and on the CPU (torch ops): how often the greedy token agrees, the largest logit difference over the
    logits' spread."""
    import torch

    from toolkit.engine.runtime.model_runner import ModelRunner

    prefill, decode, _ = _steps(1, isl)
    step = dataclasses.replace(prefill(0), logits_indices=torch.arange(isl))  # logits at every position
    logits = {}
    for where in (device, "cpu"):  # then 8 decode steps (on the GPU: replayed from CUDA graphs)
        runner = ModelRunner(ckpt, num_blocks=-(-(isl + 8) // 32) + 1, block_size=32, native=False, device=where)
        logits[where] = torch.cat([runner.forward(step).float().cpu()]
                                  + [runner.forward(decode(pos)).float().cpu() for pos in range(isl, isl + 8)])
        del runner
    a, b = logits[device], logits["cpu"]
    return {"top1_agreement": (a.argmax(-1) == b.argmax(-1)).float().mean().item(),
            "max_abs_diff_over_range": ((a - b).abs().max() / (b.max() - b.min())).item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--formats", default="none,fp8,int8_sq,int4_awq")
    parser.add_argument("--batches", default="1,2,4,8,16,32,64")
    parser.add_argument("--isl", type=int, default=128)
    parser.add_argument("--osl", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="torch device (cpu: a dry run of this script without a GPU)")
    parser.add_argument("--gpu", help="the planner's GPU (toolkit plan -g); default: from the device's name")
    parser.add_argument("--eager-batches", default="1,8,64",
                        help="batches also timed without CUDA graphs (one kernel launch at a time); empty: none")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    import torch

    from toolkit.model.spec import load_model_spec
    from toolkit.plan.gpus import catalog_gpu
    from toolkit.plan.memory import Deployment
    from toolkit.plan.roofline import decode_step, prefill_seconds, weights_for

    on_gpu = args.device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        sys.exit(f"torch {torch.__version__} sees no CUDA device: run this on a GPU machine (or --device cpu "
                 "for a dry run)")
    device_name = torch.cuda.get_device_name(0) if on_gpu else "cpu (dry run)"
    gpu = args.gpu or catalog_name(device_name)
    if gpu is None:
        sys.exit(f"{device_name} is not in the planner's catalog: pass --gpu with the nearest entry")
    hw = catalog_gpu(gpu)
    batches = [int(b) for b in args.batches.split(",")]
    build = ROOT / "build"
    spec = load_model_spec(build / "models" / args.model)
    context = args.isl + args.osl / 2
    header = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": device_name, "planner_gpu": gpu,
              "torch": torch.__version__, "cuda": torch.version.cuda, "model": args.model,
              "params": spec.total_params, "isl": args.isl, "osl": args.osl}
    if on_gpu:
        header["copy_bandwidth_bytes_s"] = copy_bandwidth(args.device)
    print(json.dumps(header), flush=True)
    rows = {}
    for qformat in args.formats.split(","):
        ckpt = build / "checkpoints" / f"{args.model}-{qformat}"
        if not ckpt.is_dir():
            print(f"{qformat}: no checkpoint at {ckpt}", flush=True)
            continue
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        try:
            r = bench_format(ckpt, batches, args.isl, args.osl, native=False, repeats=args.repeats, device=args.device)
        except Exception as exc:  # noqa: BLE001 — one format's failure is a finding, the others still run
            print(f"{qformat}: failed: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
            rows[qformat] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
            continue
        eager = [int(b) for b in args.eager_batches.split(",") if b]
        if eager:
            e = bench_format(ckpt, eager, args.isl, args.osl, native=False, repeats=1, device=args.device,
                             decode_graphs="off")
            r["eager"] = {"itl_ms": e["itl_ms"], "step_cost_ms": e["step_cost_ms"], "ttft_ms": e["ttft_ms"]}
        weights = weights_for(qformat)
        r["floor_ms"] = {b: decode_step(spec, hw, Deployment(weights=weights), b, context).seconds * 1e3
                         for b in batches}
        r["prefill_floor_ms"] = prefill_seconds(spec, hw, Deployment(weights=weights), args.isl) * 1e3
        if on_gpu:
            r["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
            from toolkit.engine.runtime.model_runner import ModelRunner

            runner = ModelRunner(ckpt, num_blocks=-(-(args.isl + 256) // 32) * max(batches), block_size=32,
                                 native=False, device=args.device, decode_graphs="off")  # the kernels one by one
            r["profile"] = {b: kernel_time(runner, b, args.isl) for b in sorted({1, max(batches)})}
            del runner
            r["vs_cpu"] = agreement_with_cpu(ckpt, args.device, args.isl)
        rows[qformat] = r
        itl = r["itl_ms"]
        print(f"{qformat:9s} {r['weight_format']:13s} TTFT {r['ttft_ms']:.2f} ms (floor {r['prefill_floor_ms']:.3f})  "
              + "  ".join(f"B{b} {itl[b]:.2f}ms (floor {r['floor_ms'][b]:.3f})" for b in batches)
              + f"  step w/o GEMMs {r['step_cost_ms']:.2f} ms" + (f"  profile {r['profile']}" if "profile" in r else "")
              + (f"  vs CPU {r['vs_cpu']}" if "vs_cpu" in r else "")
              + (f"  without graphs: {r['eager']}" if "eager" in r else ""),
              flush=True)
    print()
    print(markdown_table(rows, batches))
    if args.json:
        args.json.write_text(json.dumps({"header": header, "rows": rows}, indent=2, default=str))


def markdown_table(rows: dict, batches: list[int]) -> str:
    head = ("| format | kernel | TTFT ms (floor) | " + " | ".join(f"ITL B={b} ms (floor)" for b in batches)
            + f" | tok/s B={batches[-1]} | step w/o GEMMs ms | B=1 / floor | ITL without graphs ms (at B)"
            + " | GPU busy in an eager B=1 step ms (kernels) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for q, r in rows.items():
        if "error" in r:
            lines.append(f"| {q} | failed: {r['error'][:120]} |")
            continue
        itl, floor = r["itl_ms"], r["floor_ms"]
        prof = r.get("profile", {}).get(1)
        lines.append(f"| {q} | {r['weight_format']} | {r['ttft_ms']:.2f} ({r['prefill_floor_ms']:.3f}) | "
                     + " | ".join(f"{itl[b]:.2f} ({floor[b]:.3f})" for b in batches)
                     + f" | {batches[-1] / itl[batches[-1]] * 1e3:.0f} | {r['step_cost_ms']:.2f}"
                     + f" | {itl[batches[0]] / floor[batches[0]]:.0f}"
                     + " | " + (", ".join(f"{v:.2f} ({b})" for b, v in r["eager"]["itl_ms"].items()) if "eager" in r else "-")
                     + (f" | {prof['kernel_ms']:.3f} ({prof['kernels']})" if prof else " | -") + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
