"""Roofline plot (PNG): the GPU's bandwidth and compute roofs, the phases of a plan, measured points."""

from __future__ import annotations

from pathlib import Path


def plot_roofline(plan: dict, path: Path, measured: list[dict] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    gpu, r, d = plan["gpu"], plan["roofline"], plan["deployment"]
    bandwidth = gpu["bandwidth_tbs"] * 1e12
    peak = r["crossover"] * bandwidth
    x = np.logspace(-1, 4, 200)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.loglog(x, np.minimum(x * bandwidth, peak) / 1e12, color="black", label=f"{gpu['name']} roofline")
    ax.axvline(r["crossover"], color="gray", linestyle=":", label=f"crossover {r['crossover']:.0f} FLOP/B")
    for label, ai, color in ((f"prefill (ISL {d['isl']})", r["prefill_intensity"], "tab:red"),
                             (f"decode (batch {d['batch']})", r["decode_intensity"], "tab:blue")):
        ax.plot([ai], [min(ai * bandwidth, peak) / 1e12], "o", color=color, label=label)
    for point in measured or []:
        ax.plot([point["intensity"]], [point["achieved_flops"] / 1e12], "x", color="tab:green",
                label=point.get("label", "measured"))
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(f"{plan['model']['name']} on {gpu['name']} (weights {d['weights']})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
