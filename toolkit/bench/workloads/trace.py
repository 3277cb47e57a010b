"""Trace replay: a Mooncake-format JSONL trace (the format AIPerf and Dynamo replay), one request per
line: {"timestamp": ms, "input_length": N, "output_length": M, "hash_ids": [...]}, sent on the
recorded schedule, `speedup` times faster.

`hash_ids` name blocks of `trace_block_tokens` tokens (512 in Mooncake's traces): requests that share
a hash id share that block's text, so a trace's prefix sharing reaches the server's prefix cache.
Prompt text is synthesized from the shipped corpus (a block's text is seeded by its hash id); a line
with `text_input` sends that text instead. A trace step replays the whole trace (sweep.duration_s
still bounds it); the sweep's load levels do not apply.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.bench.load import Budget, LoadShape
from toolkit.bench.prompts import Prompt, PromptFactory
from toolkit.bench.workloads.base import StepSpec, Workload, count_tokens, prompt_from_ids, server_gone, token_window
from toolkit.errors import ToolkitError

_FIX = 'each line needs {"timestamp": ms, "input_length": N, "output_length": M} (optional "hash_ids": [...])'


@dataclass(frozen=True)
class TraceEntry:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = field(default_factory=tuple)
    text: str | None = None


def read_trace(path: str | Path) -> list[TraceEntry]:
    """The trace's entries in time order."""
    path = Path(path)
    if not path.is_file():
        raise ToolkitError(f"trace file {path} does not exist", "set sweep.workload.path to a Mooncake-format JSONL trace")
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            text = obj.get("text_input")
            entries.append(TraceEntry(float(obj["timestamp"]), int(obj.get("input_length") or 0),
                                      int(obj["output_length"]), tuple(int(h) for h in obj.get("hash_ids") or ()),
                                      text if isinstance(text, str) else None))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            raise ToolkitError(f"{path}:{number} is not a trace line", _FIX) from None
        if entries[-1].output_length < 1 or (entries[-1].input_length < 1 and entries[-1].text is None):
            raise ToolkitError(f"{path}:{number}: input_length and output_length must be ≥ 1", _FIX)
    if not entries:
        raise ToolkitError(f"{path} has no trace lines", _FIX)
    return sorted(entries, key=lambda e: e.timestamp_ms)


def schedule(entries: list[TraceEntry], speedup: float) -> list[float]:
    """Send offsets in seconds from the first request."""
    start = entries[0].timestamp_ms
    return [(e.timestamp_ms - start) / 1e3 / speedup for e in entries]


def trace_prompt(entry: TraceEntry, index: int, factory: PromptFactory, block_tokens: int, seed: int) -> Prompt:
    if entry.text is not None:
        return Prompt(entry.text, count_tokens(factory.tokenizer, entry.text), entry.output_length)
    ids: list[int] = []
    for h in entry.hash_ids:  # the same hash id is the same text in every request that names it
        ids.extend(token_window(factory, block_tokens, random.Random(f"{seed}-block-{h}")))
    if len(ids) < entry.input_length:  # beyond the hashed blocks: this request's own text
        ids.extend(token_window(factory, entry.input_length - len(ids), random.Random(f"{seed}-request-{index}")))
    return prompt_from_ids(factory, ids[:entry.input_length], entry.output_length)


def shared_block_fraction(entries: list[TraceEntry]) -> float:
    """Share of hashed blocks that an earlier request already named: the most a prefix cache can hit."""
    seen: set[int] = set()
    hits = total = 0
    for entry in entries:
        for h in entry.hash_ids:
            hits += h in seen
            total += 1
            seen.add(h)
    return hits / total if total else 0.0


class TraceWorkload(Workload):
    kind = "trace"

    def __init__(self, settings, factory):
        super().__init__(settings, factory)
        w = settings.workload
        if not w.path:
            raise ToolkitError("sweep.workload.kind is trace but no path is set",
                               "set sweep.workload.path to a Mooncake-format JSONL trace")
        self.entries = read_trace(w.path)
        self.offsets = schedule(self.entries, w.speedup)
        self.prompts_ = [trace_prompt(e, i, factory, w.trace_block_tokens, settings.seed)
                         for i, e in enumerate(self.entries)]

    def steps(self) -> list[StepSpec]:
        span = self.offsets[-1]
        rate = (len(self.entries) - 1) / span if span > 0 else float(len(self.entries))
        speed = self.settings.workload.speedup
        name = "trace" if speed == 1 else f"trace_x{speed:g}"
        isl = round(sum(p.input_tokens for p in self.prompts_) / len(self.prompts_))
        osl = round(sum(p.output_tokens for p in self.prompts_) / len(self.prompts_))
        return [StepSpec(name, rate, isl, osl, mode="rate")]

    async def run(self, step: StepSpec, shape: LoadShape, send) -> None:
        budget = Budget(None, shape.duration_s)
        start = time.perf_counter()
        tasks = []

        async def one(prompt: Prompt) -> None:
            if server_gone(await send(prompt)):
                budget.stop.set()

        for offset, prompt in zip(self.offsets, self.prompts_):
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if not budget.take():
                break
            tasks.append(asyncio.create_task(one(prompt)))
        await asyncio.gather(*tasks)
