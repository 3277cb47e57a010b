"""Scrape Triton's Prometheus /metrics during a step and keep it as a time series."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

# Triton core (queue/compute time, counts, pending), the TensorRT-LLM backend, and our CPU engine.
_KEEP_PREFIXES = ("nv_inference_", "nv_trt_llm_", "toolkit_", "nv_cpu_", "nv_gpu_memory")


def parse_metrics(text: str) -> dict[str, float]:
    """Flatten Prometheus text into {'name{label="v",...}': value} for the families we keep."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(_KEEP_PREFIXES):
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
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
    """Polls the metrics URL while a step runs, appending each sample to a JSONL file."""

    def __init__(self, url: str, path: Path, interval_s: float = 0.5):
        self.url = url
        self.path = path
        self.interval_s = interval_s
        self._task: asyncio.Task | None = None
        self.samples = 0

    async def _loop(self, step: str) -> None:
        import aiohttp

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            with self.path.open("a") as out:
                while True:
                    try:
                        async with session.get(self.url) as response:
                            text = await response.text()
                        out.write(json.dumps({"time": time.perf_counter(), "wall": time.time(), "step": step,
                                              "metrics": parse_metrics(text)}) + "\n")
                        out.flush()
                        self.samples += 1
                    except (aiohttp.ClientError, asyncio.TimeoutError):
                        pass  # the server may be gone; the sweep itself reports that
                    await asyncio.sleep(self.interval_s)

    def start(self, step: str) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(step))

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


def read_server_metrics(path: Path) -> list[dict]:
    if not Path(path).is_file():
        return []
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
