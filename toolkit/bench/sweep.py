"""`toolkit sweep`: streaming load over shapes × load levels; records, server metrics, summary.

Run directory (perf/runs/<timestamp>-<name>/): config.json, environment.json, records.jsonl
(appended as requests finish), server_metrics.jsonl, summary.json (rewritten after every step),
and the genai-perf / AIPerf exports (toolkit/bench/exports.py).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import requests

from toolkit.bench.clients import classify_error, make_client
from toolkit.bench.exports import InputsLog
from toolkit.bench.load import LoadShape
from toolkit.bench.metrics import Slo, calculate_metrics, phase_split
from toolkit.bench.prompts import Prompt, PromptFactory
from toolkit.bench.records import RecordWriter, RequestRecord
from toolkit.bench.server_metrics import MetricsScraper, summarize_server_metrics
from toolkit.bench.workloads import StepSpec, Workload, make_workload
from toolkit.config import SweepSection
from toolkit.errors import ToolkitError
from toolkit.manifest import package_versions


@dataclass
class Target:
    """Where to send load: a server's endpoints (metrics and readiness are optional)."""

    grpc_url: str | None
    http_url: str | None
    metrics_url: str | None = None
    ready_url: str | None = None
    server_pid: int | None = None  # a server on this host that `toolkit serve` started: its scheduling is checked

    def url_for(self, endpoint: str) -> str:
        url = self.grpc_url if endpoint == "triton-grpc" else self.http_url
        if not url:
            raise ToolkitError(f"no URL for endpoint {endpoint}", "set sweep.url or start the server with `toolkit serve`")
        return url

    def is_ready(self) -> bool:
        url = self.ready_url or (f"{self.http_url}/v2/health/ready" if self.http_url else None)
        if url is None:
            return True
        try:
            return requests.get(url, timeout=2).status_code == 200
        except requests.RequestException:
            return False


class SweepAborted(ToolkitError):
    pass


def _raise_if_nothing_succeeded(records: list[RequestRecord], summary: dict, step: str) -> None:
    """A run with no successful request measured nothing: stop at the first step where every request
    failed unless an earlier step succeeded (a failure under higher load is itself a finding)."""
    if any(r.ok for r in records) or not records or any(s["request_count"] for s in summary["steps"]):
        return
    first = next(r for r in records if not r.ok)
    summary["aborted"] = f"every request of {step} failed: {first.error}"
    raise SweepAborted(f"every request of {step} failed ({len(records)} of {len(records)}: {first.error_kind}: "
                       f"{first.error})", "check the URL, endpoint and model name (--url, --endpoint, --model) "
                                          "and the server log; the records are saved in the run directory")


def new_run_dir(runs_dir: Path, name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir, suffix = runs_dir / f"{stamp}-{name}", 1
    while run_dir.exists():
        run_dir, suffix = runs_dir / f"{stamp}-{name}-{suffix}", suffix + 1
    run_dir.mkdir(parents=True)
    return run_dir


def slo_of(settings: SweepSection) -> Slo | None:
    if settings.slo_ttft_ms is None and settings.slo_itl_ms is None and settings.slo_latency_ms is None:
        return None
    return Slo(settings.slo_ttft_ms, settings.slo_itl_ms, settings.slo_latency_ms)


class _Progress:
    """A progress bar per step with running TTFT / ITL medians (only on a terminal)."""

    def __init__(self, step: str, total: int | None):
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=step, unit="req", leave=False, file=sys.stderr,
                        disable=not sys.stderr.isatty())
        self.ttft: list[float] = []
        self.itl: list[float] = []

    def update(self, record: RequestRecord) -> None:
        if self.bar.disable:  # not a terminal: keep the event loop that timestamps responses free
            return
        if record.ok:
            self.ttft.append(record.ttft * 1e3)
            if record.inter_token_latency:
                self.itl.append(record.inter_token_latency * 1e3)
        median = lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan")  # noqa: E731
        self.bar.set_postfix_str(f"TTFT p50 {median(self.ttft):.1f} ms, ITL p50 {median(self.itl):.1f} ms")
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


async def run_step(client, workload: Workload, step: StepSpec, settings: SweepSection, shape: LoadShape,
                   tokenizer, writer: RecordWriter, warmup: bool, first_index: int,
                   warmup_count: int = 0) -> list[RequestRecord]:
    """Send one step's requests as the workload says; every request becomes a record, written at once.
    The first `warmup_count` (or all, with `warmup`) are marked warm-up: sent and recorded, not measured."""
    records: list[RequestRecord] = []
    progress = _Progress(step.name, shape.max_requests)
    inputs = InputsLog(writer.path.parent)
    index = first_index

    async def send(prompt: Prompt) -> RequestRecord:
        nonlocal index
        number, index = index, index + 1
        record = RequestRecord(number, step.name, time.perf_counter(), prompt.input_tokens, prompt.output_tokens,
                               warmup=warmup or number - first_index < warmup_count,
                               request_class=prompt.request_class, session=prompt.session, turn=prompt.turn)
        try:
            await asyncio.wait_for(client.generate(prompt.text, prompt.output_tokens, record),
                                   settings.request_timeout_s)
            if record.error is None and record.end_time is None:
                record.error, record.error_kind = "stream ended before the final response", "connection"
            elif record.error is None and not record.chunk_times:
                record.error, record.error_kind = "the server finished the request without sending output", \
                    "no_output"
        except asyncio.TimeoutError:
            record.error, record.error_kind = f"no final response within {settings.request_timeout_s}s", "timeout"
        except Exception as exc:  # noqa: BLE001 — every failure is recorded, named and counted
            record.error, record.error_kind = (str(exc).splitlines() or [repr(exc)])[0], classify_error(exc)
        if record.server_output_tokens is not None:
            record.output_tokens = record.server_output_tokens
        elif record.output_text:
            record.output_tokens = len(tokenizer(record.output_text, add_special_tokens=False).input_ids)
        writer.write(record)
        inputs.write(record, client, prompt.text)  # for AIPerf's inputs.json (exports.py)
        records.append(record)
        progress.update(record)
        return record  # a connection failure stops the step (workloads.base.server_gone)

    try:
        await workload.run(step, shape, send)
    finally:
        progress.close()
        inputs.close()
    return records


def class_metrics(records: list[RequestRecord], slo: Slo | None) -> dict | None:
    """Per request class (a mixed workload's short / long), when a step has more than one."""
    classes: dict[str, list[RequestRecord]] = {}
    for record in records:
        if record.request_class is not None:
            classes.setdefault(record.request_class, []).append(record)
    if len(classes) < 2:
        return None
    return {name: calculate_metrics(members, slo) for name, members in sorted(classes.items())}


def turn_metrics(records: list[RequestRecord]) -> list[dict] | None:
    """Multi-turn workloads: per turn, the context it sent and its ITL — ITL against context length."""
    turns: dict[int, list[RequestRecord]] = {}
    for record in records:
        if record.turn is not None and record.ok:
            turns.setdefault(record.turn, []).append(record)
    if len(turns) < 2:
        return None
    out = []
    for turn, members in sorted(turns.items()):
        itl = [r.inter_token_latency * 1e3 for r in members if r.inter_token_latency]
        out.append({"turn": turn, "requests": len(members),
                    "context_tokens_mean": sum(r.input_tokens for r in members) / len(members),
                    "inter_token_latency_p50_ms": float(np.median(itl)) if itl else None})
    return out


def run_sweep(settings: SweepSection, target: Target, tokenizer, run_dir: Path, run_info: dict,
              progress=print) -> dict:
    """Run every step; returns the summary (also in run_dir/summary.json, rewritten after each step).

    Raises SweepAborted (after writing the partial summary and exports) if the server stops answering.
    """
    from toolkit.bench.exports import write_exports

    (run_dir / "config.json").write_text(json.dumps(run_info, indent=2, default=str) + "\n")
    (run_dir / "environment.json").write_text(json.dumps(package_versions(), indent=2) + "\n")
    summary = {"run": run_info | {"run_dir": str(run_dir)}, "steps": [], "complete": False}
    writer = RecordWriter(run_dir / "records.jsonl")
    try:
        asyncio.run(_sweep(settings, target, tokenizer, run_dir, writer, summary, progress))
        summary["complete"] = True
    except KeyboardInterrupt:
        summary["aborted"] = "interrupted (Ctrl-C)"
        raise
    finally:
        writer.close()
        _write_summary(run_dir, summary)
        write_exports(run_dir)
    return summary


def _write_summary(run_dir: Path, summary: dict) -> None:
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


async def _sweep(settings: SweepSection, target: Target, tokenizer, run_dir: Path, writer: RecordWriter,
                 summary: dict, progress) -> None:
    client = make_client(settings.endpoint, target.url_for(settings.endpoint), settings.model)
    metrics_path = run_dir / "server_metrics.jsonl"
    scraper = MetricsScraper(target.metrics_url, metrics_path) if target.metrics_url else None
    factory = PromptFactory(tokenizer, settings.seed)
    workload = make_workload(settings, tokenizer, factory)
    slo = slo_of(settings)
    index = 0
    try:
        await client.prepare(min(settings.warmup_requests, 4) or 1)
        if settings.warmup_requests:
            isl, osl = settings.shapes[0]
            shape = LoadShape("concurrency", min(settings.warmup_requests, 4), max_requests=settings.warmup_requests)
            warm = await run_step(client, Workload(settings, factory), StepSpec("warmup", shape.level, isl, osl),
                                  settings, shape, tokenizer, writer, True, index)
            index += len(warm)
            _raise_if_server_gone(warm, target, summary, "warm-up")
            _raise_if_nothing_succeeded(warm, summary, "the warm-up")
        for step in workload.steps():
            mode = step.mode or settings.mode
            extra = settings.step_warmup_requests
            total = settings.requests_per_step + extra if settings.requests_per_step else None
            shape = LoadShape(mode, step.level, settings.arrival, settings.max_concurrency,
                              total, settings.duration_s, settings.seed + index)
            if shape.max_in_flight:
                await client.prepare(shape.max_in_flight)
            if scraper:
                await scraper.start(step.name)
            samples: list[dict] = []
            try:
                records = await run_step(client, workload, step, settings, shape, tokenizer, writer,
                                         False, index, warmup_count=extra)
            finally:
                if scraper:
                    samples = await scraper.stop()
            index += len(records)
            result = {"step": step.name, "mode": mode, mode: step.level, "workload": workload.kind,
                      "input_tokens": step.input_tokens, "output_tokens": step.output_tokens,
                      **calculate_metrics(records, slo)}
            if mode == "concurrency":
                result["concurrency"] = int(step.level)
            classes = class_metrics([r for r in records if not r.warmup], slo)
            if classes:
                result["classes"] = classes
            turns = turn_metrics([r for r in records if not r.warmup])
            if turns:
                result["turns"] = turns
            result["phases"] = phase_split(result)
            result["server"] = summarize_server_metrics(samples)
            summary["steps"].append(result)
            _write_summary(run_dir, summary)
            progress(_progress_line(result))
            _raise_if_server_gone(records, target, summary, step.name)
            _raise_if_nothing_succeeded(records, summary, step.name)
    finally:
        await client.close()


def _raise_if_server_gone(records, target: Target, summary: dict, step: str) -> None:
    failed = [r for r in records if r.error_kind in ("connection", "timeout")]
    if failed and not target.is_ready():
        summary["aborted"] = f"server stopped answering during {step}: {failed[0].error}"
        raise SweepAborted(f"the server stopped answering during {step} ({len(failed)} request(s) failed: "
                           f"{failed[0].error})", "records so far are saved in the run directory; check the "
                                                  "server log, restart it, and rerun the sweep")


def _progress_line(result: dict) -> str:
    """One line per step; its duration is the measured window (first send → last completion, warm-up
    excluded), the same number the report shows."""
    m = result["metrics"]

    def p50(tag):
        return f"{m[tag]['p50']:.1f}" if tag in m else "-"

    errors = ""
    if result["error_count"]:
        kinds = ", ".join(f"{count} {kind}" for kind, count in result["errors_by_kind"].items())
        errors = f", {result['error_count']} failed ({kinds})"
    few = f" [only {result['request_count']} requests: percentiles are rough]" if result.get("small_sample") else ""
    return (f"  {result['step']:>16}: {result['request_count']} requests in {result['duration_s']:.1f}s{errors} | "
            f"TTFT p50 {p50('time_to_first_token')} ms | ITL p50 {p50('inter_token_latency')} ms | "
            f"{result['output_token_throughput']['avg']:.1f} tok/s{few}")
