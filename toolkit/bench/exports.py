"""Exports beside our own run files, so existing scripts keep working:

- genai-perf: exports/<step>/profile_export_genai_perf.json and .csv (its metric names and units;
  one folder per step, as genai-perf writes one artifact folder per concurrency);
- AIPerf: exports/profile_export.jsonl, one line per request with per-request metrics.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from toolkit.bench.metrics import RECORD_METRICS
from toolkit.bench.records import read_records

# Our tag → (genai-perf JSON key, genai-perf CSV label)
_GENAI_PERF_NAMES = {
    "time_to_first_token": ("time_to_first_token", "Time To First Token (ms)"),
    "time_to_second_token": ("time_to_second_token", "Time To Second Token (ms)"),
    "request_latency": ("request_latency", "Request Latency (ms)"),
    "inter_token_latency": ("inter_token_latency", "Inter Token Latency (ms)"),
    "output_token_throughput_per_user": ("output_token_throughput_per_user", "Output Token Throughput Per User (tokens/sec/user)"),
    "output_sequence_length": ("output_sequence_length", "Output Sequence Length (tokens)"),
    "input_sequence_length": ("input_sequence_length", "Input Sequence Length (tokens)"),
}
_STAT_COLUMNS = ["avg", "min", "max", "p99", "p95", "p90", "p75", "p50", "p25"]
_UNITS = {"ms": "ms", "tokens": "tokens", "tokens/s": "tokens/sec/user"}


def genai_perf_json(step: dict, run: dict) -> dict:
    out = {}
    for tag, (key, _) in _GENAI_PERF_NAMES.items():
        stats = step["metrics"].get(tag)
        if stats:
            out[key] = {"unit": _UNITS.get(stats["unit"], stats["unit"]),
                        **{k: stats[k] for k in ("avg", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99",
                                                 "min", "max", "std")}}
    out["output_token_throughput"] = {"unit": "tokens/sec", "avg": step["output_token_throughput"]["avg"]}
    out["request_throughput"] = {"unit": "requests/sec", "avg": step["request_throughput"]["avg"]}
    out["request_count"] = {"unit": "count", "avg": step["request_count"]}
    if "goodput" in step:
        out["request_goodput"] = {"unit": "requests/sec", "avg": step["goodput"]["avg"]}
    sweep = run.get("sweep", {})
    out["input_config"] = {"model": [run.get("model")], "endpoint_type": run.get("endpoint"),
                           "concurrency": step.get("concurrency"), "request_rate": step.get("rate"),
                           "synthetic_input_tokens_mean": step.get("input_tokens"),
                           "synthetic_input_tokens_stddev": sweep.get("input_tokens_stddev"),
                           "output_tokens_mean": step.get("output_tokens"),
                           "output_tokens_stddev": sweep.get("output_tokens_stddev"), "ignore_eos": True}
    return out


def genai_perf_csv(step: dict, path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["Metric"] + _STAT_COLUMNS)
        for tag, (_, label) in _GENAI_PERF_NAMES.items():
            stats = step["metrics"].get(tag)
            if stats:
                writer.writerow([label] + [f"{stats[c]:.2f}" for c in _STAT_COLUMNS])
        writer.writerow([])
        writer.writerow(["Metric", "Value"])
        writer.writerow(["Output Token Throughput (tokens/sec)", f"{step['output_token_throughput']['avg']:.2f}"])
        writer.writerow(["Request Throughput (per sec)", f"{step['request_throughput']['avg']:.2f}"])
        writer.writerow(["Request Count (count)", f"{step['request_count']:.2f}"])
        if "goodput" in step:
            writer.writerow(["Request Goodput (per sec)", f"{step['goodput']['avg']:.2f}"])


def aiperf_record(record) -> dict:
    metrics = {}
    if record.ok:
        for metric in RECORD_METRICS:
            values = metric.values(record)
            if values:
                metrics[metric.tag] = {"value": values if len(values) > 1 else values[0], "unit": metric.unit}
    return {"metadata": {"request_index": record.request_index, "step": record.step, "warmup": record.warmup,
                         "send_time_s": record.send_time,
                         "error": {"type": record.error_kind, "message": record.error} if record.error else None},
            "metrics": metrics}


def write_exports(run_dir: Path) -> list[Path]:
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        return []
    summary = json.loads(summary_path.read_text())
    out_dir = run_dir / "exports"
    out_dir.mkdir(exist_ok=True)
    written = []
    for step in summary.get("steps", []):
        step_dir = out_dir / step["step"]
        step_dir.mkdir(exist_ok=True)
        path = step_dir / "profile_export_genai_perf.json"
        path.write_text(json.dumps(genai_perf_json(step, summary.get("run", {})), indent=2) + "\n")
        genai_perf_csv(step, step_dir / "profile_export_genai_perf.csv")
        written += [path, step_dir / "profile_export_genai_perf.csv"]
    records_path = run_dir / "records.jsonl"
    if records_path.is_file():
        jsonl = out_dir / "profile_export.jsonl"
        with jsonl.open("w") as f:
            for record in read_records(records_path):
                f.write(json.dumps(aiperf_record(record)) + "\n")
        written.append(jsonl)
    return written
