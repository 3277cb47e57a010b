"""`toolkit plan`: memory + roofline for a model × GPU × deployment; table, plan.json, roofline PNG."""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.model.spec import ModelSpec
from toolkit.plan.gpus import GpuSpec
from toolkit.plan.memory import Deployment, plan_memory, smallest_tp_that_fits
from toolkit.plan.roofline import plan_roofline


def make_plan(spec: ModelSpec, gpu: GpuSpec, d: Deployment) -> dict:
    d.validate(spec)
    memory = plan_memory(spec, gpu, d)
    roofline = plan_roofline(spec, gpu, d, memory)
    return {"model": spec.to_dict(), "gpu": gpu.to_dict(), "deployment": d.__dict__.copy(),
            "memory": memory.to_dict(), "smallest_tp_that_fits": smallest_tp_that_fits(spec, gpu, d),
            "roofline": roofline.to_dict()}


def _gb(x: float) -> str:
    return f"{x / 1e9:,.2f} GB"


def _ms(x: float) -> str:
    return f"{x * 1e3:,.2f} ms"


def render_table(plan: dict) -> str:
    m, r, d, g = plan["memory"], plan["roofline"], plan["deployment"], plan["gpu"]
    rows = [
        ("model", f"{plan['model']['name']} ({plan['model']['total_params'] / 1e9:.2f} B params)"),
        ("gpu", f"{g['name']} × {d['tp'] * d['pp']} (TP {d['tp']}, PP {d['pp']}); {g['memory_gb']:,.0f} GB, "
                f"{g['bandwidth_tbs'] * 1e3:,.0f} GB/s"),
        ("formats", f"weights {d['weights']}, KV {d['kv_dtype']}"),
        ("weights", f"{_gb(m['weight_bytes_total'])} total, {_gb(m['weight_bytes_per_gpu'])} per GPU"),
        ("KV per token", f"{m['kv_bytes_per_token'] / 1e6:.3f} MB ({m['kv_bytes_per_token_per_gpu'] / 1e6:.3f} MB per GPU)"),
        ("KV per sequence", f"{_gb(m['kv_bytes_per_sequence'])} at {d['max_seq_len']} tokens"),
        ("KV capacity", f"{m['kv_capacity_tokens']:,} tokens = {m['kv_capacity_sequences']} sequences of "
                        f"{d['max_seq_len']}" + (f" (fixed paged cache of {d['kv_cache_tokens']:,} tokens)"
                                                  if d.get("kv_cache_tokens") else
                                                  f" ({_gb(m['kv_cache_bytes_per_gpu'])} per GPU at fraction "
                                                  f"{d['kv_free_mem_fraction']})")),
        ("fits", ("yes" if m["fits"] else "NO") + f"; batch {d['batch']} × {d['isl'] + d['osl']} tokens "
                 + ("fits" if m["batch_fits"] else "does NOT fit")
                 + f"; smallest TP that fits: {plan['smallest_tp_that_fits'] or 'none ≤ 8'}"),
        ("crossover", f"{r['crossover']:.0f} FLOP/byte"),
        ("prefill", f"intensity {r['prefill_intensity']:.0f} FLOP/byte → {r['prefill_bound']}-bound; "
                    f"floor {_ms(r['prefill_floor_s'])}, expected {_ms(r['prefill_expected_s'])} "
                    f"at {d['prefill_efficiency']:.0%} of peak"),
        ("decode", f"intensity {r['decode_intensity']:.1f} FLOP/byte at batch {d['batch']} → {r['decode_bound']}-bound; "
                   f"step floor {_ms(r['decode_step_floor_s'])}"
                   + (f" (all-reduce {_ms(r['decode_allreduce_s'])})" if d["tp"] > 1 else "")),
        ("request", f"ISL {d['isl']}, OSL {d['osl']}: TTFT {_ms(r['ttft_s'])}, TPOT {_ms(r['tpot_s'])}, "
                    f"end-to-end {_ms(r['e2e_s'])}"),
        ("decode by batch", ", ".join(f"{p['batch']}: {p['tokens_per_second']:,.0f} tok/s ({p['bound']})"
                                      for p in r["decode_by_batch"])),
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
