"""`toolkit sweep`: streaming load over a list of concurrencies; records, server metrics, summary.

Run directory (perf/runs/<timestamp>-<name>/): config.json, environment.json, records.jsonl
(appended as requests finish), server_metrics.jsonl, summary.json (rewritten after every step).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from toolkit.bench.clients import classify_error, make_client
from toolkit.bench.metrics import Slo, calculate_metrics, phase_split
from toolkit.bench.prompts import Prompt, PromptFactory
from toolkit.bench.records import RecordWriter, RequestRecord
from toolkit.bench.server_metrics import MetricsScraper
from toolkit.config import SweepSection
from toolkit.errors import ToolkitError
from toolkit.manifest import package_versions


@dataclass
class Target:
    """Where to send load: the endpoint URLs of a running server."""

    grpc_url: str
    http_url: str
    metrics_url: str | None = None

    def url_for(self, endpoint: str) -> str:
        return self.grpc_url if endpoint == "triton-grpc" else self.http_url

    def is_ready(self) -> bool:
        try:
            return requests.get(f"{self.http_url}/v2/health/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False


class SweepAborted(ToolkitError):
    pass


def new_run_dir(runs_dir: Path, name: str) -> Path:
    run_dir = runs_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"
    suffix = 1
    while run_dir.exists():
        run_dir = runs_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}-{suffix}"
        suffix += 1
    run_dir.mkdir(parents=True)
    return run_dir


async def _run_requests(client, prompts: list[Prompt], concurrency: int, settings: SweepSection, step: str,
                        tokenizer, writer: RecordWriter, warmup: bool, first_index: int) -> list[RequestRecord]:
    """Keep `concurrency` requests in flight until the prompts run out (concurrency mode)."""
    pending = list(enumerate(prompts, first_index))
    pending.reverse()
    records: list[RequestRecord] = []
    abort = asyncio.Event()

    async def worker():
        while pending and not abort.is_set():
            index, prompt = pending.pop()
            record = RequestRecord(index, step, time.perf_counter(), prompt.input_tokens, settings.output_tokens,
                                   warmup=warmup)
            try:
                await asyncio.wait_for(client.generate(prompt.text, settings.output_tokens, record),
                                       settings.request_timeout_s)
                if record.error is None and record.end_time is None:
                    record.error, record.error_kind = "stream ended before the final response", "connection"
            except asyncio.TimeoutError:
                record.error = f"no final response within {settings.request_timeout_s}s"
                record.error_kind = "timeout"
            except Exception as exc:  # noqa: BLE001 — every failure is recorded, named and counted
                record.error, record.error_kind = str(exc).splitlines()[0] if str(exc) else repr(exc), classify_error(exc)
            if record.server_output_tokens is not None:
                record.output_tokens = record.server_output_tokens
            elif record.output_text:
                record.output_tokens = len(tokenizer(record.output_text, add_special_tokens=False).input_ids)
            writer.write(record)
            records.append(record)
            if record.error_kind == "connection":
                abort.set()  # the server is likely gone: stop sending, keep what was measured

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records


def run_sweep(settings: SweepSection, target: Target, tokenizer, run_dir: Path, run_info: dict,
              slo: Slo | None = None, progress=print) -> dict:
    """Run every concurrency step; returns the summary (also in run_dir/summary.json).

    Raises SweepAborted (after writing the partial summary) if the server stops answering.
    """
    (run_dir / "config.json").write_text(json.dumps(run_info, indent=2, default=str) + "\n")
    (run_dir / "environment.json").write_text(json.dumps(package_versions(), indent=2) + "\n")
    factory = PromptFactory(tokenizer, settings.seed)
    summary = {"run": run_info | {"run_dir": str(run_dir)}, "steps": [], "complete": False}
    writer = RecordWriter(run_dir / "records.jsonl")
    try:
        asyncio.run(_sweep(settings, target, tokenizer, factory, run_dir, writer, summary, slo, progress))
        summary["complete"] = True
    except KeyboardInterrupt:
        summary["aborted"] = "interrupted (Ctrl-C)"
        raise
    finally:
        writer.close()
        _write_summary(run_dir, summary)
    return summary


def _write_summary(run_dir: Path, summary: dict) -> None:
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


async def _sweep(settings, target, tokenizer, factory, run_dir, writer, summary, slo, progress) -> None:
    client = make_client(settings.endpoint, target.url_for(settings.endpoint), settings.model)
    scraper = MetricsScraper(target.metrics_url, run_dir / "server_metrics.jsonl") if target.metrics_url else None
    index = 0
    try:
        if settings.warmup_requests:
            prompts = factory.batch(settings.warmup_requests, settings.input_tokens_mean, settings.input_tokens_stddev)
            warm = await _run_requests(client, prompts, max(settings.concurrencies[0], 1), settings, "warmup",
                                       tokenizer, writer, True, index)
            index += len(warm)
            _raise_if_server_gone(warm, target, summary, "warm-up")
        for concurrency in settings.concurrencies:
            step = f"concurrency_{concurrency}"
            prompts = factory.batch(settings.requests_per_concurrency, settings.input_tokens_mean,
                                    settings.input_tokens_stddev)
            if scraper:
                scraper.start(step)
            started = time.perf_counter()
            try:
                records = await _run_requests(client, prompts, concurrency, settings, step, tokenizer, writer,
                                              False, index)
            finally:
                if scraper:
                    await scraper.stop()
            index += len(records)
            result = {"step": step, "concurrency": concurrency, **calculate_metrics(records, slo)}
            result["phases"] = phase_split(result)
            summary["steps"].append(result)
            _write_summary(run_dir, summary)
            progress(_progress_line(result, time.perf_counter() - started))
            _raise_if_server_gone(records, target, summary, step)
    finally:
        await client.close()


def _raise_if_server_gone(records, target: Target, summary: dict, step: str) -> None:
    failed = [r for r in records if r.error_kind in ("connection", "timeout")]
    if failed and not target.is_ready():
        summary["aborted"] = f"server stopped answering during {step}: {failed[0].error}"
        raise SweepAborted(f"the server stopped answering during {step} ({len(failed)} request(s) failed: "
                           f"{failed[0].error})", "records so far are saved; check the server log, restart it, "
                                                  "and rerun the sweep")


def _progress_line(result: dict, seconds: float) -> str:
    m = result["metrics"]

    def p50(tag):
        return f"{m[tag]['p50']:.1f}" if tag in m else "-"

    errors = f", {result['error_count']} errors" if result["error_count"] else ""
    return (f"  concurrency {result['concurrency']:>3}: {result['request_count']} requests in {seconds:.1f}s{errors} | "
            f"TTFT p50 {p50('time_to_first_token')} ms | ITL p50 {p50('inter_token_latency')} ms | "
            f"{result['output_token_throughput']['avg']:.1f} tok/s")
