"""Exports beside our own run files, in the formats genai-perf's and AIPerf's users already read.

    exports/<step>/profile_export_genai_perf.{json,csv}      genai-perf: one folder per load level
    exports/<aiperf folder>/profile_export_aiperf.{json,csv}  AIPerf's summary (schema 1.4 shape)
    exports/<aiperf folder>/profile_export.jsonl              AIPerf's per-request records
    exports/<aiperf folder>/inputs.json                       the request payloads (when the sweep logged them)

The AIPerf folder is named as AIPerf names its artifact folders: <model>-<endpoint>-concurrency<N>
or <model>-<endpoint>-request_rate<R> (e.g. tiny-openai-chat-concurrency4). Names, units and
directions come from the metric classes in toolkit/bench/metrics.py. Shapes follow aiperf 0.13.0's
pydantic models (JsonExportData, MetricRecordInfo, InputsFile); tests/data/aiperf/ holds their
JSON schemas, and tests validate our files against them.
"""

from __future__ import annotations

import csv
import json
from datetime import datetime
from pathlib import Path
from typing import Callable

from toolkit.bench.metrics import METRICS, RECORD_METRICS, STEP_METRICS, Metric
from toolkit.bench.records import RequestRecord, read_jsonl, read_records

AIPERF_SCHEMA_VERSION = "1.4"  # the JsonExportData schema our summary follows (aiperf 0.13.0)
AIPERF_STAT_KEYS = ["avg", "min", "max", "sum", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "std"]
_GENAI_PERF_STAT_COLUMNS = ["avg", "min", "max", "p99", "p95", "p90", "p75", "p50", "p25"]
_STAT_KEYS = ["avg", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "min", "max", "std", "count", "sum"]
# Our endpoint → how AIPerf names it in folder names and input_config (AIPerf has no Triton endpoint).
_AIPERF_ENDPOINTS = {"openai-chat": ("openai-chat", "chat"), "openai-completions": ("openai-completions", "completions"),
                     "triton-grpc": ("triton-grpc", "template"), "triton-http": ("triton-http", "template")}
_TRITON_BODY_TEMPLATE = ('{"text_input": {{ text|tojson }}, "max_tokens": {{ max_tokens }}, "stream": true, '
                         '"ignore_eos": true}')
INPUTS_LOG = "inputs.jsonl"  # written by the sweep: one payload per request, turned into inputs.json


# ---------------------------------------------------------------- shared pieces


def _stats(stats: dict, keys: list[str]) -> dict:
    return {k: stats[k] for k in keys if k in stats}


def _metric_json(metric: Metric, stats: dict) -> dict:
    return {"unit": metric.exported_unit, **_stats(stats, _STAT_KEYS)}


def _step_values(step: dict) -> list[tuple[Metric, float]]:
    """The step metrics a summary holds (goodput only where an SLO was given)."""
    out = []
    for metric in STEP_METRICS:
        value = metric.of(step)
        if value is not None:
            out.append((metric, value))
    return out


def _entries(step: dict, named: Callable[[Metric], str | None]) -> list[tuple[Metric, dict]]:
    """The step's metrics that a format has a name for, as {unit, avg, p.., ...} in export units."""
    out = [(metric, _metric_json(metric, step["metrics"][metric.tag]))
           for metric in RECORD_METRICS if metric.tag in step["metrics"] and named(metric)]
    return out + [(metric, {"unit": metric.exported_unit, "avg": value})
                  for metric, value in _step_values(step) if named(metric)]


def clock_offset(run_dir: Path, summary: dict) -> float | None:
    """Seconds to add to a record's perf_counter times to get the epoch (None for a run with no records).

    Records hold monotonic times; the sweep's server-metric samples hold both clocks."""
    clock = summary.get("run", {}).get("clock")
    if clock:
        return clock["epoch_s"] - clock["perf_counter_s"]
    for sample in read_jsonl(run_dir / "server_metrics.jsonl"):
        if "wall" in sample and "time" in sample:
            return sample["wall"] - sample["time"]
    # No sample (no metrics URL): the records file was last written when the last request ended,
    # which places the run on the epoch to within the write's latency.
    records_path = run_dir / "records.jsonl"
    records = read_records(records_path)
    if records:
        return records_path.stat().st_mtime - max(_end(r) for r in records)
    return None


# ---------------------------------------------------------------- genai-perf


def genai_perf_json(step: dict, run: dict) -> dict:
    out = {}
    for metric, entry in _entries(step, lambda m: m.genai_perf_header):
        # genai-perf's own spellings where they differ from AIPerf's
        key = "request_goodput" if metric.tag == "goodput" else metric.tag
        out[key] = entry | ({"unit": "count"} if metric.tag == "request_count" else {})
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
        writer.writerow(["Metric"] + _GENAI_PERF_STAT_COLUMNS)
        for metric in RECORD_METRICS:
            stats = step["metrics"].get(metric.tag)
            if stats and metric.genai_perf_header:
                writer.writerow([f"{metric.genai_perf_header} ({metric.exported_unit})"]
                                + [f"{stats[c]:.2f}" for c in _GENAI_PERF_STAT_COLUMNS])
        writer.writerow([])
        writer.writerow(["Metric", "Value"])
        for metric, value in _step_values(step):
            if metric.genai_perf_header:
                unit = "count" if metric.tag == "request_count" else metric.exported_unit.replace("requests/sec", "per sec")
                writer.writerow([f"{metric.genai_perf_header} ({unit})", f"{value:.2f}"])


# ---------------------------------------------------------------- AIPerf


def aiperf_folder(run: dict, step: dict) -> str:
    """AIPerf's artifact folder name for one step (its _compute_artifact_name, aiperf 0.13.0)."""
    model = str(run.get("model") or "model").replace("/", "_")
    endpoint = _AIPERF_ENDPOINTS.get(run.get("endpoint"), (run.get("endpoint") or "endpoint", None))[0]
    if step.get("mode") == "rate":
        load = f"request_rate{float(step['rate'])}"
        if run.get("sweep", {}).get("max_concurrency"):
            load = f"concurrency{run['sweep']['max_concurrency']}-{load}"
    else:
        load = f"concurrency{step.get('concurrency')}"
    shape = "" if step["step"].startswith(("concurrency_", "rate_")) and "_isl" not in step["step"] else \
        f"-isl{step.get('input_tokens')}-osl{step.get('output_tokens')}"
    return f"{model}-{endpoint}-{load}{shape}"


def _iso(epoch: float | None) -> str | None:
    return datetime.fromtimestamp(epoch).isoformat() if epoch is not None else None


def aiperf_input_config(run: dict, step: dict) -> dict:
    """What was run, in AIPerf's BenchmarkConfig shape (a subset of its fields, all valid there)."""
    sweep = run.get("sweep", {})
    endpoint_type = _AIPERF_ENDPOINTS.get(run.get("endpoint"), (None, "template"))[1]
    endpoint: dict = {"type": endpoint_type, "streaming": True, "extra": {"ignore_eos": True}}
    if endpoint_type == "template":
        # Triton's ensemble inputs as AIPerf's template endpoint would send them over HTTP
        # (generate_stream); the gRPC client sends the same tensors.
        endpoint["template"] = {"body": _TRITON_BODY_TEMPLATE, "responseField": "text_output"}
    # A server the toolkit started has no URL in the config: it listened on 127.0.0.1 (port not recorded).
    endpoint["urls"] = [run.get("url") or sweep.get("url") or "http://127.0.0.1"]
    requests = sweep.get("requests_per_step")
    if step.get("mode") == "rate":
        phase = {"name": "profiling", "kind": "profiling",
                 "type": "constant" if sweep.get("arrival") == "constant" else "poisson", "rate": step["rate"]}
        if sweep.get("max_concurrency"):
            phase["concurrency"] = sweep["max_concurrency"]
    else:
        phase = {"name": "profiling", "kind": "profiling", "type": "concurrency", "concurrency": step["concurrency"]}
    if sweep.get("duration_s"):
        phase["duration"] = sweep["duration_s"]
    if requests or "duration" not in phase:  # AIPerf's phase needs a bound: else what was sent
        phase["requests"] = requests or (step.get("request_count", 0) + step.get("error_count", 0))
    prompts = {"isl": {"mean": float(step.get("input_tokens") or 0),
                       "stddev": float(sweep.get("input_tokens_stddev") or 0)},
               "osl": {"mean": float(step.get("output_tokens") or 0),
                       "stddev": float(sweep.get("output_tokens_stddev") or 0)}}
    dataset = {"name": "main", "type": "synthetic", "prompts": prompts}  # the seed is in run_info
    return {"models": {"items": [{"name": str(run.get("model") or "model")}]}, "endpoint": endpoint,
            "datasets": [dataset], "phases": [phase]}


def aiperf_summary(step: dict, run: dict, records: list[RequestRecord], offset: float | None,
                   complete: bool) -> dict:
    """profile_export_aiperf.json for one step."""
    out: dict = {"schema_version": AIPERF_SCHEMA_VERSION, "exported_by": "llm-deployment-toolkit",
                 "benchmark_id": f"{Path(run.get('run_dir', 'run')).name}/{step['step']}"}
    out |= {metric.export_tag: entry for metric, entry in _entries(step, lambda m: m.aiperf_header)}
    measured = [r for r in records if not r.warmup]
    errors: dict[tuple, int] = {}
    for r in measured:
        if not r.ok:
            key = (r.error_kind, r.error or "no output")
            errors[key] = errors.get(key, 0) + 1
    out["error_summary"] = [{"error_details": {"type": kind, "message": message}, "count": count}
                            for (kind, message), count in errors.items()]
    if offset is not None and measured:
        out["start_time"] = _iso(min(r.send_time for r in measured) + offset)
        out["end_time"] = _iso(max(_end(r) for r in measured) + offset)
    out["input_config"] = aiperf_input_config(run, step)
    out["run_info"] = {"run_label": step["step"], "random_seed": run.get("sweep", {}).get("seed"),
                       "trial": run.get("repetition")}
    out["was_cancelled"] = False
    out["is_complete"] = complete
    return out


def _end(r: RequestRecord) -> float:
    """When a request ended: its final response, else its last token, else (failed at once) its send."""
    return r.end_time or (r.chunk_times[-1] if r.chunk_times else r.send_time)


def _ns(seconds: float, offset: float) -> int:
    # Each term rounded apart: their float sum (~1.8e9 s) would lose the sub-microsecond part.
    return round(offset * 1e9) + round(seconds * 1e9)


def aiperf_record(record: RequestRecord, offset: float) -> dict:
    """One line of profile_export.jsonl (AIPerf's MetricRecordInfo)."""
    metrics = {}
    if record.ok:
        for metric in RECORD_METRICS:
            values = metric.values(record)
            if values and metric.aiperf_header:
                value = values if metric.tag == "inter_chunk_gap" else values[0]
                metrics[metric.export_tag] = {"value": value, "unit": metric.exported_unit}
    else:
        metrics["error_isl"] = {"value": record.input_tokens, "unit": "tokens"}
    session = record.session or f"session_{record.request_index:06d}"
    metadata = {"session_num": record.request_index, "x_request_id": str(record.request_index),
                "conversation_id": session, "turn_index": record.turn or 0,
                "request_start_ns": _ns(record.send_time, offset), "request_end_ns": _ns(_end(record), offset),
                "worker_id": "toolkit-sweep", "record_processor_id": "toolkit-sweep",
                "benchmark_phase": "warmup" if record.warmup else "profiling",
                "phase_name": "warmup" if record.warmup else "profiling",
                "phase_kind": "warmup" if record.warmup else "profiling", "was_cancelled": False}
    if record.chunk_times:
        metadata["request_ack_ns"] = _ns(record.chunk_times[0], offset)
    error = {"code": None, "type": record.error_kind or "no_output", "message": record.error or "no output"} \
        if not record.ok else None
    return {"metadata": metadata, "metrics": metrics, "error": error}


def aiperf_csv(summary: dict, path: Path) -> None:
    """profile_export_aiperf.csv: a distribution section, a blank line, then single values (AIPerf's layout)."""
    by_tag = {m.export_tag: m for m in METRICS.values()}
    rows, singles = [], []
    for tag, value in sorted(summary.items()):
        metric = by_tag.get(tag)
        if metric is None or not isinstance(value, dict):
            continue
        name = metric.aiperf_header if value["unit"] in ("count", "requests") else \
            f"{metric.aiperf_header} ({value['unit']})"
        if "p50" in value:
            rows.append([name] + [_csv_number(value.get(k)) for k in AIPERF_STAT_KEYS])
        else:
            singles.append([name, _csv_number(value["avg"])])
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["Metric"] + AIPERF_STAT_KEYS)
        writer.writerows(rows)
        writer.writerow([])
        writer.writerow(["Metric", "Value"])
        writer.writerows(singles)


def _csv_number(value) -> str:
    if value is None:
        return ""
    return str(value) if isinstance(value, int) else f"{float(value):.2f}"


def aiperf_inputs(rows: list[dict]) -> dict:
    """inputs.json (AIPerf's InputsFile): one session per request with its payload as sent."""
    sessions: dict[str, list[dict]] = {}
    for row in rows:
        sessions.setdefault(row.get("session") or f"session_{row['request_index']:06d}", []).append(row["payload"])
    return {"data": [{"session_id": sid, "payloads": payloads} for sid, payloads in sessions.items()]}


def write_aiperf_step(out_dir: Path, step: dict, run: dict, records: list[RequestRecord], offset: float | None,
                      complete: bool, inputs: list[dict]) -> list[Path]:
    folder = out_dir / aiperf_folder(run, step)
    folder.mkdir(parents=True, exist_ok=True)
    summary = aiperf_summary(step, run, records, offset, complete)
    written = [folder / "profile_export_aiperf.json", folder / "profile_export_aiperf.csv"]
    written[0].write_text(json.dumps(summary, indent=2) + "\n")
    aiperf_csv(summary, written[1])
    if offset is not None:
        with (folder / "profile_export.jsonl").open("w") as f:
            for record in records:
                f.write(json.dumps(aiperf_record(record, offset)) + "\n")
        written.append(folder / "profile_export.jsonl")
    if inputs:
        (folder / "inputs.json").write_text(json.dumps(aiperf_inputs(inputs), indent=2) + "\n")
        written.append(folder / "inputs.json")
    return written


class InputsLog:
    """The payload of every request as the sweep sent it, one JSON line each (run_dir/inputs.jsonl),
    from which each step's inputs.json is made. Written after the request ends, with its record."""

    def __init__(self, run_dir: Path):
        self._file = (Path(run_dir) / INPUTS_LOG).open("a")

    def write(self, record: RequestRecord, client, text: str) -> None:
        body = getattr(client, "body", None)  # the HTTP clients' own request body
        # The gRPC client sends the ensemble's tensors; written as the same fields over HTTP would be.
        payload = body(text, record.requested_output_tokens) if body else {
            "text_input": text, "max_tokens": record.requested_output_tokens, "stream": True, "ignore_eos": True}
        self._file.write(json.dumps({"step": record.step, "request_index": record.request_index,
                                     "session": record.session, "payload": payload}) + "\n")

    def close(self) -> None:
        self._file.close()


# ---------------------------------------------------------------- entry point


def write_exports(run_dir: Path) -> list[Path]:
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        return []
    summary = json.loads(summary_path.read_text())
    run = summary.get("run", {})
    out_dir = run_dir / "exports"
    out_dir.mkdir(exist_ok=True)
    records = read_records(run_dir / "records.jsonl")
    by_step: dict[str, list[RequestRecord]] = {}
    for record in records:
        by_step.setdefault(record.step, []).append(record)
    inputs_by_step: dict[str, list[dict]] = {}
    for row in read_jsonl(run_dir / INPUTS_LOG):
        inputs_by_step.setdefault(row.get("step"), []).append(row)
    offset = clock_offset(run_dir, summary)
    written = []
    for i, step in enumerate(summary.get("steps", [])):
        step_dir = out_dir / step["step"]
        step_dir.mkdir(exist_ok=True)
        path = step_dir / "profile_export_genai_perf.json"
        path.write_text(json.dumps(genai_perf_json(step, run), indent=2) + "\n")
        genai_perf_csv(step, step_dir / "profile_export_genai_perf.csv")
        written += [path, step_dir / "profile_export_genai_perf.csv"]
        # The sweep's opening warm-up belongs to the first step's folder, as AIPerf's warm-up phase
        # precedes its profiling phase in one artifact folder.
        step_records = (by_step.get("warmup", []) if i == 0 else []) + by_step.get(step["step"], [])
        step_inputs = (inputs_by_step.get("warmup", []) if i == 0 else []) + inputs_by_step.get(step["step"], [])
        written += write_aiperf_step(out_dir, step, run, step_records, offset, bool(summary.get("complete")),
                                     step_inputs)
    return written
