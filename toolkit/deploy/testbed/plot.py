"""One figure over time: replicas, KV occupancy, waiting requests, TTFT p95 and ITL p95."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.deploy import names as n
from toolkit.deploy.testbed.analysis import windowed_p95


def plot_timeline(timeline: list[dict], records: list[dict], target: float, out: Path, window_s: float = 10.0,
                  steps: list[tuple[float, float, float]] | None = None) -> Path:
    """`steps`: (start, end, offered requests/s) on the same clock, shaded behind the curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = timeline[0]["t"]
    t = [row["t"] - t0 for row in timeline]
    ok = [r for r in records if not r.get("warmup") and not r.get("error") and r.get("chunk_times")]
    done = [r["end_time"] - t0 for r in ok]
    ttft = [(r["chunk_times"][0] - r["send_time"]) * 1000 for r in ok]
    itl = [((r["end_time"] - r["chunk_times"][0]) / max(1, r["output_tokens"] - 1)) * 1000 for r in ok]
    edges = np.arange(0, max(t + done + [window_s]) + window_s, window_s)
    mids = (edges[:-1] + edges[1:]) / 2

    fig, axes = plt.subplots(5, 1, figsize=(10, 13), sharex=True)
    ax = axes[0]
    ax.step(t, [row["replicas"] for row in timeline], where="post", label="ready replicas", lw=2)
    ax.step(t, [row["replicas"] + row.get("starting", 0) for row in timeline], where="post",
            label="ready + starting", lw=1)
    ax.step(t, [row["desired"] for row in timeline], where="post", label="HPA decision", ls="--")
    ax.step(t, [row["raw_desired"] for row in timeline], where="post", label="raw (before stabilization)", ls=":")
    ax.set_ylabel("replicas")
    if steps:
        twin = ax.twinx()
        for start, end, rate in steps:
            twin.hlines(rate, start - t0, end - t0, color="grey", alpha=0.5)
        twin.set_ylabel("offered requests/s (grey)")
    ax.legend(loc="upper left", fontsize=8)

    ax = axes[1]
    ax.plot(t, [row["metrics"].get(n.KV_OCCUPANCY) for row in timeline], label="mean over ready replicas", lw=2)
    replicas = sorted({p for row in timeline for p in row.get("kv_occupancy_by_replica", {})})
    for name in replicas:
        ax.plot(t, [row.get("kv_occupancy_by_replica", {}).get(name) for row in timeline], lw=0.8, alpha=0.7,
                label=name)
    ax.axhline(target, color="red", ls="--", label=f"target {target:g}")
    ax.set_ylabel("KV occupancy")
    ax.legend(loc="upper left", fontsize=7)

    axes[2].plot(t, [row.get("waiting_total") for row in timeline])
    axes[2].set_ylabel("waiting requests\n(sum)")
    axes[3].plot(mids, windowed_p95(done, ttft, edges), marker=".", label=f"client, {window_s:g} s windows")
    axes[3].plot(t, [None if row.get("ttft_p95_s") is None else row["ttft_p95_s"] * 1000 for row in timeline],
                 label="server histogram (recorded rule, 2 min)", alpha=0.7)
    axes[3].set_ylabel("TTFT p95 (ms)")
    axes[3].legend(loc="upper left", fontsize=8)
    axes[4].plot(mids, windowed_p95(done, itl, edges), marker=".")
    axes[4].set_ylabel("ITL p95 (ms)\nclient")
    axes[4].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
