"""GPU check: a random-weight model of a real architecture, quantized by ModelOpt on CUDA (FP8,
INT4-AWQ), timed in PyTorch (prefill, decode step) and held against `toolkit plan` for the GPU.

Needs a CUDA GPU, torch, transformers and nvidia-modelopt. Run from the repository root:
    PYTHONPATH=. python perf/gpu_vs_plan.py --model llama-3-8b --gpu h100-sxm --out /tmp/gpu
Prints a table and writes gpu_vs_plan.json. Figures and dates are recorded in docs/gpu-validation.md.

What is measured: bf16 PyTorch (eager, and a CUDA-graph decode step that removes Python launch
overhead); ModelOpt's quantized models run fake-quant kernels (quantize-dequantize in bf16), so their
times show the cost of simulation, not of FP8/INT4 kernels — the plan's FP8/INT4 floors are what
TensorRT-LLM's real kernels approach. Exported checkpoint sizes are held against the plan's weight bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def cuda_time(fn, repeats: int = 10, warmup: int = 3) -> float:
    """Median seconds of fn() measured with CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def build_model(model_name: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from toolkit.model.presets import KNOWN_MODELS

    shape = dict(KNOWN_MODELS[model_name])
    rope_theta = shape.pop("rope_theta")
    # `architectures` must be set (from_pretrained does it): ModelOpt's export reads it and fails on None.
    config = LlamaConfig(**shape, rope_theta=rope_theta)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    return model


def time_prefill(model, isl: int, batch: int = 1) -> float:
    import torch

    ids = torch.randint(0, model.config.vocab_size, (batch, isl), device="cuda")
    with torch.inference_mode():
        return cuda_time(lambda: model(ids, use_cache=False, logits_to_keep=1))


def time_decode(model, context: int, batch: int) -> float:
    """One eager decode step (HF, dynamic KV cache) after a `context`-token prompt. Includes Python
    launch overhead, which dominates small batches; the cache grows by one token per timed step."""
    import torch

    prompt = torch.randint(0, model.config.vocab_size, (batch, context), device="cuda")
    token = torch.randint(0, model.config.vocab_size, (batch, 1), device="cuda")
    with torch.inference_mode():
        cache = model(prompt, use_cache=True, logits_to_keep=1).past_key_values
        return cuda_time(lambda: model(token, past_key_values=cache, use_cache=True, logits_to_keep=1))


def time_weight_stream(model, batch: int) -> float:
    """Every Linear of the model applied to `batch` rows, replayed as one CUDA graph: the weight-reading
    part of a decode step without launch overhead (attention and KV reads excluded)."""
    import torch

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m.in_features: torch.randn(batch, m.in_features, device="cuda", dtype=torch.bfloat16) for m in linears}

    def step():
        for m in linears:
            torch.nn.functional.linear(inputs[m.in_features], m.weight)

    with torch.inference_mode():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return cuda_time(graph.replay)


def quantize(model, qformat: str, calib_batches: int = 4, seq_len: int = 256):
    import modelopt.torch.quantization as mtq
    import torch

    from toolkit.quantize.formats import modelopt_config

    data = [torch.randint(0, model.config.vocab_size, (1, seq_len), device="cuda") for _ in range(calib_batches)]

    def forward_loop(m):
        with torch.no_grad():
            for ids in data:
                m(ids)

    start = time.perf_counter()
    mtq.quantize(model, modelopt_config(qformat, "none", device="cuda"), forward_loop=forward_loop)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def export_size(model, out_dir: Path) -> int:
    import torch
    from modelopt.torch.export import export_hf_checkpoint

    with torch.inference_mode():
        export_hf_checkpoint(model, export_dir=out_dir)
    return sum(f.stat().st_size for f in out_dir.glob("*.safetensors"))


def plan_for(model_name: str, gpu: str, weights: str, isl: int, osl: int, batch: int) -> dict:
    from toolkit.model.presets import known_model_spec
    from toolkit.plan.gpus import gpu_spec
    from toolkit.plan.memory import Deployment
    from toolkit.plan.stage import make_plan

    return make_plan(known_model_spec(model_name), gpu_spec(gpu),
                     Deployment(weights=weights, isl=isl, osl=osl, batch=batch, max_seq_len=isl + osl))


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--gpu", default="h100-sxm")
    parser.add_argument("--isl", type=int, default=1024)
    parser.add_argument("--osl", type=int, default=128)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--formats", default="fp8,int4_awq")
    parser.add_argument("--skip-bf16", action="store_true", help="Only the quantized formats.")
    parser.add_argument("--out", type=Path, default=Path("/tmp/gpu_vs_plan"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]

    result = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(0),
              "torch": torch.__version__, "model": args.model, "isl": args.isl, "rows": []}

    def emit(row):
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        (args.out / "gpu_vs_plan.json").write_text(json.dumps(result, indent=2))

    model = build_model(args.model)
    if args.skip_bf16:
        batches = []
    plan = plan_for(args.model, args.gpu, "bf16", args.isl, args.osl, 1)["roofline"]
    if not args.skip_bf16:
        emit({"format": "bf16", "what": "prefill_s", "batch": 1, "measured": time_prefill(model, args.isl),
              "plan_floor": plan["prefill_floor_s"]})
    for batch in batches:
        p = plan_for(args.model, args.gpu, "bf16", args.isl, args.osl, batch)
        floor = next(x for x in p["roofline"]["decode_by_batch"] if x["batch"] >= batch)["step_seconds"]
        emit({"format": "bf16", "what": "decode_step_s_eager", "batch": batch,
              "measured": time_decode(model, args.isl, batch), "plan_floor": floor})
        weights_floor = p["memory"]["weight_bytes_per_gpu"] / (p["gpu"]["bandwidth_tbs"] * 1e12)
        emit({"format": "bf16", "what": "weight_stream_s_cuda_graph", "batch": batch,
              "measured": time_weight_stream(model, batch), "plan_floor": weights_floor})

    for qformat in filter(None, args.formats.split(",")):
        del model
        torch.cuda.empty_cache()
        model = build_model(args.model)  # same seed: the same weights for every format
        seconds = quantize(model, qformat)
        p = plan_for(args.model, args.gpu, qformat, args.isl, args.osl, 1)  # a qformat is a plan's weight format
        emit({"format": qformat, "what": "calibration_s", "measured": seconds})
        emit({"format": qformat, "what": "fake_quant_prefill_s", "batch": 1, "measured": time_prefill(model, args.isl),
              "plan_floor": p["roofline"]["prefill_floor_s"]})
        emit({"format": qformat, "what": "fake_quant_decode_step_s_eager", "batch": 1,
              "measured": time_decode(model, args.isl, 1), "plan_floor": p["roofline"]["decode_step_floor_s"]})
        export_dir = Path("/tmp") / f"gpu-vs-plan-ckpt-{qformat}"  # outside $OUT: only the JSON comes back
        try:
            emit({"format": qformat, "what": "checkpoint_bytes", "measured": export_size(model, export_dir),
                  "plan_weight_bytes": p["memory"]["weight_bytes_total"]})
        except Exception as exc:  # keep the timings measured so far
            import traceback

            traceback.print_exc()
            emit({"format": qformat, "what": "checkpoint_bytes", "error": repr(exc)})
    print(f"wrote {args.out / 'gpu_vs_plan.json'}")


if __name__ == "__main__":
    main()
