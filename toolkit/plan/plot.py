"""Roofline plot (PNG): the device's bandwidth and compute roofs, the phases of a plan, measured points."""

from __future__ import annotations

from pathlib import Path


def plot_roofline(plan: dict, path: Path, measured: list[dict] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    gpu, r, d = plan["gpu"], plan["roofline"], plan["deployment"]
    bandwidth = gpu["bandwidth_tbs"] * 1e12
    peak = r.get("peak_flops", r["crossover"] * bandwidth)
    prefill_peak = r.get("prefill_peak_flops", peak)
    unit, scale = ("GFLOP/s", 1e9) if max(peak, prefill_peak) < 1e12 else ("TFLOP/s", 1e12)
    x = np.logspace(-1, 4, 200)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.loglog(x, np.minimum(x * bandwidth, peak) / scale, color="black", label=f"{gpu['name']} roofline ({d['weights']})")
    if prefill_peak > peak:  # CPU: prefill runs at prompt-length rows on a faster GEMM than decode's few rows
        ax.loglog(x, np.minimum(x * bandwidth, prefill_peak) / scale, color="gray", linestyle="--",
                  label="prefill roof (its GEMM at prompt length)")
    ridge = peak / bandwidth  # where the drawn decode roof bends (CPU: its few-row rate at the planned batch)
    ax.axvline(ridge, color="gray", linestyle=":", label=f"decode ridge {ridge:.0f} FLOP/B")
    for label, ai, roof, color in ((f"prefill (ISL {d['isl']})", r["prefill_intensity"], prefill_peak, "tab:red"),
                                   (f"decode (batch {d['batch']})", r["decode_intensity"], peak, "tab:blue")):
        ax.plot([ai], [min(ai * bandwidth, roof) / scale], "o", color=color, label=label)
    for point in measured or []:
        ax.plot([point["intensity"]], [point["achieved_flops"] / scale], point.get("marker", "x"),
                color=point.get("color", "tab:green"), label=point.get("label", "measured"))
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel(f"attainable {unit}")
    ax.set_title(f"{plan['model']['name']} on {gpu['name']} (weights {d['weights']}, KV {d['kv_dtype']})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
