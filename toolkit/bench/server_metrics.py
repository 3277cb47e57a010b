"""Scrape Triton's Prometheus /metrics during a step and keep it as a time series."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

from toolkit.deploy.names import ENGINE_MODEL, KV_BLOCKS, KV_BLOCK_LABEL, PENDING, QUEUE_US, REQUEST_SUCCESS

# The Python models around the engine in NVIDIA's inflight_batcher_llm ensemble (both targets' repositories).
PREPROCESSING, POSTPROCESSING = "preprocessing", "postprocessing"
ENSEMBLE = "ensemble"
# Triton's models on a request's way, each with its own queue: the tokenizer once per request, the ensemble, the
# engine, the detokenizer once per streamed response (so its "requests" are responses).
REQUEST_PATH = (PREPROCESSING, ENSEMBLE, ENGINE_MODEL, POSTPROCESSING)

# Triton core (queue/compute time, counts, pending), the TensorRT-LLM backend, and our CPU engine.
_KEEP_PREFIXES = ("nv_inference_", "nv_trt_llm_", "toolkit_", "nv_cpu_", "nv_gpu_memory")


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[str, float]:
    """Flatten Prometheus text into {'name{label="v",...}': value} for the families we keep.
    Names stay as exposed (no `_total` rewriting), so they match the PromQL in docs and dashboards."""
    out = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or not match.group(1).startswith(_KEEP_PREFIXES):
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        pairs = sorted(_LABEL.findall(labels or ""))
        key = name + ("{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}" if pairs else "")
        out[key] = number
    return out


def sum_metric(sample: dict[str, float], name: str, **labels: str) -> float:
    """Sum a metric over all label sets (optionally filtered by labels)."""
    total = 0.0
    for key, value in sample.items():
        base, _, rest = key.partition("{")
        if base == name and all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


class MetricsScraper:
    """Polls the metrics URL while a step runs, appending each sample to a JSONL file; the current
    step's samples are also kept in memory (`stop()` returns them) so nobody re-reads the file."""

    def __init__(self, url: str, path: Path, interval_s: float = 0.25):
        self.url = url
        self.path = path
        self.interval_s = interval_s
        self._task: asyncio.Task | None = None
        self.step_samples: list[dict] = []

    async def _scrape(self) -> None:
        import aiohttp

        try:
            async with self._session.get(self.url) as response:
                text = await response.text()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return  # the server may be gone; the sweep itself reports that
        sample = {"time": time.perf_counter(), "wall": time.time(), "step": self._step, "metrics": parse_metrics(text)}
        with self.path.open("a") as out:
            out.write(json.dumps(sample) + "\n")
        self.step_samples.append(sample)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self._scrape()

    async def start(self, step: str) -> None:
        """Takes the step's first sample before returning, so that it precedes the step's first request: taken
        later by the polling task, it had already counted a first request's tokenizer but not its engine (5 of
        6 requests through preprocessing against 6 through tensorrt_llm at 20 requests/s)."""
        import aiohttp

        self._step = step
        self.step_samples = []
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        await self._scrape()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self, settle_s: float = 0.05, most: int = 10) -> list[dict]:
        """Stop polling after the last samples, so every step has its end state; returns the step's samples. The
        server's request counters can trail the last response the client saw (Triton counts a decoupled request when
        it is released, after its final response), so sampling goes on every `settle_s` until two samples in a row
        count the same requests, at most `most` more."""
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            await self._scrape()
            for _ in range(most):
                before = _request_counts(self.step_samples[-1]["metrics"]) if self.step_samples else None
                await asyncio.sleep(settle_s)
                await self._scrape()
                if before is None or _request_counts(self.step_samples[-1]["metrics"]) == before:
                    break
            await self._session.close()
            self._task = None
        return self.step_samples


def _request_counts(sample: dict[str, float]) -> dict[str, float]:
    return {name: value for name, value in sample.items() if name.startswith(REQUEST_SUCCESS)}


def _delta(first: dict, last: dict, name: str, **labels) -> float:
    return sum_metric(last, name, **labels) - sum_metric(first, name, **labels)


def metric_series(samples: list[dict], name: str, **labels) -> list[float]:
    """One metric over the samples that expose it, summed over label sets (optionally filtered)."""
    return [sum_metric(s["metrics"], name, **labels) for s in samples if any(
        k.startswith(name) for k in s["metrics"])]


def summarize_server_metrics(samples: list[dict]) -> dict:
    """What the server saw during one step: per-request queue and compute time (Triton core), pending
    requests, KV-cache blocks, and the CPU engine's prefill/decode means. Pure: samples in, numbers out."""
    if len(samples) < 2:
        return {}
    first, last = samples[0]["metrics"], samples[-1]["metrics"]
    out: dict = {"samples": len(samples)}
    # No per-request compute from Triton's nv_inference_compute_infer_duration_us: the streaming engine
    # model is decoupled, so it times only the execute() call that hands the request to the engine and
    # returns (about a millisecond for a request that streams for seconds). The engine's own prefill /
    # decode histograms below are its compute view.
    for model in REQUEST_PATH:
        done = _delta(first, last, REQUEST_SUCCESS, model=model)
        if done > 0:
            out[model] = {"requests": done, "queue_ms_per_request": _delta(first, last, QUEUE_US, model=model) / done / 1e3}
    pending = metric_series(samples, PENDING)
    if pending:
        out["pending_requests_max"] = max(pending)
    for source, used_name, used_labels, max_name, max_labels in (
        ("cpu_engine", "toolkit_kv_cache_blocks_used", {}, "toolkit_kv_cache_blocks_max", {}),
        (ENGINE_MODEL, KV_BLOCKS, {KV_BLOCK_LABEL: "used"}, KV_BLOCKS, {KV_BLOCK_LABEL: "max"}),
    ):
        used = metric_series(samples, used_name, **used_labels)
        capacity = metric_series(samples, max_name, **max_labels)
        if used and capacity and max(capacity) > 0:
            out["kv_cache"] = {"source": source, "blocks_used_max": max(used),
                               "blocks_used_mean": sum(used) / len(used), "blocks_max": max(capacity),
                               "utilization_max": max(used) / max(capacity)}
            break
    for phase in ("prefill", "decode"):
        count = _delta(first, last, f"toolkit_{phase}_time_seconds_count")
        if count > 0:
            out[f"{phase}_ms_mean"] = _delta(first, last, f"toolkit_{phase}_time_seconds_sum") / count * 1e3
    return out
