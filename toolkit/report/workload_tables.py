"""Report lines for workload steps: metrics per request class (a mixed workload's short / long, a
shared-prefix workload's prefixes) and ITL against context per turn (multi-turn)."""

from __future__ import annotations

_CLASS_COLUMNS = [("time_to_first_token", "p50", "TTFT p50"), ("time_to_first_token", "p99", "TTFT p99"),
                  ("inter_token_latency", "p50", "ITL p50"), ("inter_token_latency", "p99", "ITL p99"),
                  ("inter_chunk_gap", "max", "longest gap")]


def workload_lines(step: dict) -> list[str]:
    lines = []
    classes = step.get("classes") or {}
    if classes:
        lines += ["", "| Request class | OK / failed | ISL mean | " + " | ".join(f"{h} ms" for _, _, h in _CLASS_COLUMNS) + " |",
                  "|---|---:|---:|" + "---:|" * len(_CLASS_COLUMNS)]
        for name, c in classes.items():
            m = c["metrics"]
            isl = m.get("input_sequence_length", {}).get("avg")
            cells = [f"{m[tag][stat]:,.1f}" if tag in m else "-" for tag, stat, _ in _CLASS_COLUMNS]
            lines.append(f"| {name} | {c['request_count']} / {c['error_count']} | "
                         f"{f'{isl:,.0f}' if isl is not None else '-'} | " + " | ".join(cells) + " |")
        lines.append("")
    turns = step.get("turns") or []
    if turns:
        lines.append("- ITL against context, per turn: " + "; ".join(
            f"turn {t['turn']}: {t['context_tokens_mean']:,.0f} tokens → "
            + (f"{t['inter_token_latency_p50_ms']:,.2f} ms" if t["inter_token_latency_p50_ms"] is not None else "-")
            for t in turns))
    return lines
