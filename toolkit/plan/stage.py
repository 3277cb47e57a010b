"""`toolkit plan`: memory + roofline for a model × device × deployment; table, plan.json, roofline PNG.

Which defaults a plan starts from depends on the device planned for, not on the config's engine
target: a GPU plan from the CPU demo's config gets GPU defaults (bf16 weights and KV, the model's own
context length, TensorRT-LLM's max_num_tokens, KV from the free-memory fraction, the smallest TP that
fits), and a config written for a GPU deployment gives its own values to a GPU plan. Flags win over both.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from toolkit.config import DeploymentConfig
from toolkit.errors import ToolkitError
from toolkit.model.spec import ModelSpec
from toolkit.plan.gpus import catalog_gpu, hardware_spec, is_cpu
from toolkit.plan.hardware import HardwareSpec
from toolkit.plan.memory import Deployment, plan_memory, smallest_tp_that_fits
from toolkit.plan.roofline import ceil_batch, cpu_hardware, format_comparison, plan_roofline, weights_for
from toolkit.quantize.formats import formats_of_checkpoint
from toolkit.targets import target_of

# A GPU plan's workload when neither the config nor a flag says (ISL/OSL of docs/gpu-validation.md).
GPU_DEFAULTS = dict(pp=1, weights="bf16", kv_dtype="bf16", max_num_tokens=8192, batch=8, isl=1024, osl=128)


def deployment_for_config(config: DeploymentConfig, spec: ModelSpec | None, device: str,
                          **flags) -> Deployment:
    """The planner's view of a deployment config on `device` (a catalog GPU or cpu); flags win."""
    flags = {k: v for k, v in flags.items() if v is not None}
    e, q, cpu = config.engine, config.quantize, is_cpu(device)
    common = dict(kv_free_mem_fraction=e.kv_cache_free_gpu_mem_fraction,
                  runtime_overhead_gb=config.plan.runtime_overhead_gb,
                  prefill_efficiency=1.0 if cpu else config.plan.prefill_efficiency)
    if target_of(config).on_gpu != cpu:  # the config describes a deployment on this kind of device
        values = dict(tp=config.parallel.tp, pp=config.parallel.pp, weights=weights_for(q.qformat),
                      kv_dtype="bf16" if q.kv_cache_dtype == "none" else q.kv_cache_dtype,
                      max_seq_len=e.max_seq_len, max_num_tokens=e.max_num_tokens, batch=e.max_batch_size,
                      isl=config.sweep.input_tokens_mean, osl=config.sweep.output_tokens,
                      kv_cache_tokens=e.kv_cache_blocks * e.tokens_per_block if cpu else None)
    elif cpu:  # a GPU config planned on this CPU: the CPU engine's and sweep's own defaults, the config's formats
        from toolkit.config import EngineSection, SweepSection

        d, w = EngineSection(), SweepSection()
        values = dict(tp=1, pp=1, weights=weights_for(q.qformat), kv_dtype="bf16", max_seq_len=d.max_seq_len,
                      max_num_tokens=d.max_num_tokens, batch=d.max_batch_size, isl=w.input_tokens_mean,
                      osl=w.output_tokens, kv_cache_tokens=d.kv_cache_blocks * d.tokens_per_block)
    else:  # the CPU demo's config planned on a GPU: nothing in its engine section is about a GPU
        max_seq_len = flags.get("max_seq_len") or (spec.max_position_embeddings if spec else 4096)
        values = dict(GPU_DEFAULTS, max_seq_len=max_seq_len)
        values["isl"] = min(values["isl"], max_seq_len // 2)  # a short-context model gets a shorter default
        values["osl"] = min(values["osl"], max_seq_len - values["isl"])
        if "tp" not in flags and spec is not None:
            d = Deployment(**{**common, **values, **flags})
            values["tp"] = smallest_tp_that_fits(spec, catalog_gpu(device), d) or 1
    deployment = Deployment(**{**common, **values, **flags})
    if cpu and deployment.tp * deployment.pp > 1:
        raise ToolkitError(f"the CPU engine runs one process: it has no TP {deployment.tp} × PP {deployment.pp}",
                           "drop --tp/--pp, or plan on a GPU (--gpu h100-sxm)")
    return deployment


def make_plan(spec: ModelSpec, hw: HardwareSpec, d: Deployment) -> dict:
    d.validate(spec)
    memory = plan_memory(spec, hw, d)
    roofline = plan_roofline(spec, hw, d, memory)
    return {"model": spec.to_dict(), "gpu": hw.to_dict(), "deployment": d.__dict__.copy(),
            "memory": memory.to_dict(), "smallest_tp_that_fits": smallest_tp_that_fits(spec, hw, d),
            "roofline": roofline.to_dict(), "formats": format_comparison(spec, hw, d)}


def default_plan_dir(build_dir: Path, spec: ModelSpec, device: str) -> Path:
    return Path(build_dir) / "plans" / f"{spec.name}-{device.lower()}"


def engine_binding_for(config: DeploymentConfig):
    """The CPUs and threads the CPU engine takes under `config` (engine.cpu_threads, engine.cpu_numa): what the planner
    probes this machine on, so that a plan for one thread predicts one thread's engine."""
    from toolkit.engine.runtime.cpu_binding import engine_binding

    return engine_binding(config.engine.cpu_numa, config.engine.cpu_threads)


def plan_for_config(config: DeploymentConfig, spec: ModelSpec, device: str | None = None, reprobe: bool = False,
                    step_overhead_ms: float | None = None, checkpoint_dir: str | Path | None = None,
                    **flags) -> dict:
    """The plan of `spec` deployed as `config` says on `device` (default: its plan.gpu); flags win.
    A quantized `checkpoint_dir` gives its own formats (what ModelOpt exported) unless flags say."""
    device = device or config.plan.gpu
    exported = formats_of_checkpoint(checkpoint_dir) if checkpoint_dir else None
    if exported:
        qformat, kv = exported
        flags["weights"] = flags.get("weights") or qformat
        if kv != "none":
            flags["kv_dtype"] = flags.get("kv_dtype") or kv
    binding = engine_binding_for(config) if is_cpu(device) else None
    hw = hardware_spec(device, reprobe=reprobe, binding=binding)
    if hw.kind == "cpu":
        from toolkit.plan.cpu_probe import with_layer_prefill_rates

        overhead = config.plan.cpu_step_overhead_ms if step_overhead_ms is None else step_overhead_ms
        hw = cpu_hardware(hw, None if overhead is None else overhead / 1e3, spec)
        hw = replace(hw, probe=with_layer_prefill_rates(hw.probe, spec, binding))  # its prompt GEMMs' shapes
    return make_plan(spec, hw, deployment_for_config(config, spec, device, **flags))


def plan_and_write(config: DeploymentConfig, spec: ModelSpec, device: str, out_dir: Path | None,
                   build_dir: Path, **options) -> tuple[dict, dict]:
    """`toolkit plan`: plan.json + roofline.png in out_dir (default: build/plans/<model>-<device>/)."""
    result = plan_for_config(config, spec, device, **options)
    return result, write_plan(result, out_dir or default_plan_dir(build_dir, spec, device))


def _gb(x: float) -> str:
    return f"{x / 1e9:,.2f} GB"


def _ms(x: float) -> str:
    return f"{x * 1e3:,.2f} ms"


def _rate(flops: float) -> str:
    return f"{flops / 1e9:,.0f} GFLOP/s" if flops < 1e12 else f"{flops / 1e12:,.4g} TFLOP/s"


def _device_row(g: dict, d: dict) -> str:
    if g.get("kind") == "cpu":
        peaks = ", ".join(f"{k} {v * 1e3:,.0f}" for k, v in g["peak_tflops"].items())
        return (f"this CPU: {g['memory_gb']:,.0f} GB, {g['bandwidth_tbs'] * 1e3:,.1f} GB/s ({g['probe'].get('bandwidth_kernel', 'read')} read), "
                f"kernels {peaks} GFLOP/s, fixed {g['step_overhead_s'] * 1e3:.2f} ms per step and "
                f"{g.get('sequence_overhead_s', 0) * 1e3:.3f} ms per sequence; {g['source']}")
    return (f"{g['name']} × {d['tp'] * d['pp']} (TP {d['tp']}, PP {d['pp']}); {g['memory_gb']:,.0f} GB, "
            f"{g['bandwidth_tbs'] * 1e3:,.0f} GB/s")


def _format_cell(f: dict, batch: int) -> str:
    cross = ceil_batch(f["crossover_batch"])
    return (f"{f['weights']} {_gb(f['weight_bytes'])}: decode {_ms(f['decode_step_batch1_s'])} at batch 1, "
            f"{_ms(f['decode_step_s'])} at {batch}, " + (f"compute-bound from batch {cross}, " if cross else "never compute-bound, ")
            + f"prefill {_ms(f['prefill_floor_s'])}")


def render_table(plan: dict) -> str:
    m, r, d, g = plan["memory"], plan["roofline"], plan["deployment"], plan["gpu"]
    peak = r["crossover"] * g["bandwidth_tbs"] * 1e12
    cross = ceil_batch(r["crossover_batch"])
    gpus = g.get("kind") != "cpu"  # the CPU engine is one process: per-GPU figures would repeat the totals
    per_gpu = " per GPU" if gpus else ""
    rows = [
        ("model", f"{plan['model']['name']} ({plan['model']['total_params'] / 1e9:.2f} B params)"),
        ("device", _device_row(g, d)),
        ("formats", f"weights {d['weights']} ({_rate(peak)} for its matmuls), KV {d['kv_dtype']}"),
        ("weights", f"{_gb(m['weight_bytes_total'])}"
                    + (f" total, {_gb(m['weight_bytes_per_gpu'])} per GPU" if gpus else "")),
        ("activations", f"{_gb(m['activation_bytes_per_gpu'])}{per_gpu} at max_num_tokens {d['max_num_tokens']:,}"),
        ("KV per token", f"{m['kv_bytes_per_token'] / 1e6:.3f} MB"
                         + (f" ({m['kv_bytes_per_token_per_gpu'] / 1e6:.3f} MB per GPU)" if gpus else "")),
        ("KV per sequence", f"{_gb(m['kv_bytes_per_sequence'])} at {d['max_seq_len']:,} tokens"),
        ("KV capacity", f"{m['kv_capacity_tokens']:,} tokens = {m['kv_capacity_sequences']:,} sequences of "
                        f"{d['max_seq_len']:,}" + (f" (fixed paged cache of {d['kv_cache_tokens']:,} tokens)"
                                                   if d.get("kv_cache_tokens") else
                                                   f" ({_gb(m['kv_cache_bytes_per_gpu'])}{per_gpu} at fraction "
                                                   f"{d['kv_free_mem_fraction']} of {_gb(max(m['free_bytes_per_gpu'], 0))} free)")),
        ("fits", ("yes" if m["fits"] else "NO") + f" (the weights and one sequence of {d['max_seq_len']:,}); "
                 + f"batch {d['batch']:,} × {d['isl'] + d['osl']:,} tokens "
                 + ("fits" if m["batch_fits"] else f"does NOT fit: the KV cache holds "
                    f"{m['kv_capacity_tokens'] // (d['isl'] + d['osl']):,} such sequences, the rest wait")
                 + (f"; smallest TP that fits: {plan['smallest_tp_that_fits'] or 'none ≤ 8'}" if gpus else "")),
        ("crossover", f"{r['crossover']:,.1f} FLOP/byte; " + (f"decode turns compute-bound at batch {cross:,}" if cross
                      else "decode never turns compute-bound at this context (each sequence's KV read takes longer "
                           "than its compute)")),
        ("prefill", f"intensity {r['prefill_intensity']:,.0f} FLOP/byte at ISL {d['isl']:,} → {r['prefill_bound']}-bound; "
                    f"floor {_ms(r['prefill_floor_s'])}, expected {_ms(r['prefill_expected_s'])} "
                    f"at {d['prefill_efficiency']:.0%} of peak"),
        ("decode", f"intensity {r['decode_intensity']:,.1f} FLOP/byte at batch {d['batch']} → {r['decode_bound']}-bound; "
                   f"step floor {_ms(r['decode_step_floor_s'])} at batch {d['batch']}"
                   + (f" ({_ms(r['decode_step_floor_batch1_s'])} at batch 1)" if d["batch"] != 1 else "")
                   + f"; reading the weights alone {_ms(m['weight_bytes_per_gpu'] / (g['bandwidth_tbs'] * 1e12))}"
                   + (f" ({_ms(m['weight_bytes_per_gpu'] / r['decode_weight_read_bytes_s'])} at the "
                      f"{r['decode_weight_read_bytes_s'] / 1e9:,.1f} GB/s its kernel re-reads them at, step after step)"
                      if not gpus and r.get("decode_weight_read_bytes_s") else "")
                   + (f", all-reduce {_ms(r['decode_allreduce_s'])}" if d["tp"] > 1 else "")
                   + (f", fixed {_ms(r['step_overhead_s'])}" if r["step_overhead_s"] else "")),
        ("request", f"ISL {d['isl']:,}, OSL {d['osl']:,} at batch {d['batch']}: TTFT {_ms(r['ttft_s'])}, "
                    f"TPOT {_ms(r['tpot_s'])}, end-to-end {_ms(r['e2e_s'])}"),
        ("decode by batch", ", ".join(f"{p['batch']}: {_ms(p['step_seconds'])} {p['tokens_per_second']:,.0f} tok/s "
                                      f"({p['bound']})" for p in r["decode_by_batch"])),
        ("by format", "; ".join(_format_cell(f, d["batch"]) for f in plan.get("formats", []))),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def write_plan(plan: dict, out_dir: Path) -> dict[str, Path]:
    from toolkit.plan.plot import plot_roofline

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "plan.json"
    json_path.write_text(json.dumps(plan, indent=2) + "\n")
    png = plot_roofline(plan, out_dir / "roofline.png")
    return {"plan": json_path, "roofline": png}
