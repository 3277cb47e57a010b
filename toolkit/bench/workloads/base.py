"""The workload interface and the kinds' factory."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Awaitable, Callable

from toolkit.bench.load import LoadShape, drive
from toolkit.bench.prompts import Prompt, PromptFactory
from toolkit.bench.records import RequestRecord
from toolkit.config import SweepSection
from toolkit.errors import ToolkitError

# Sends one request and returns its record once it has finished (or failed).
Send = Callable[[Prompt], Awaitable[RequestRecord]]


@dataclass(frozen=True)
class StepSpec:
    name: str
    level: float  # the load level (concurrency or rate); a trace step ignores it
    input_tokens: int  # the step's nominal lengths, for summaries (a dataset's vary per request)
    output_tokens: int
    mode: str | None = None  # the step's load mode when it differs from the sweep's (a trace is a rate)


def server_gone(record: RequestRecord) -> bool:
    """A connection failure means the server is likely gone: the step stops, keeping what was measured."""
    return record.error_kind == "connection"


def load_label(settings: SweepSection, level: float) -> str:
    return f"concurrency_{int(level)}" if settings.mode == "concurrency" else f"rate_{level:g}"


def token_window(factory: PromptFactory, count: int, rng: random.Random) -> list[int]:
    """`count` consecutive token ids from the shipped corpus, starting where `rng` says."""
    stream = factory.stream
    ids: list[int] = []
    while len(ids) < count:
        start = rng.randrange(0, max(1, len(stream) - count))
        ids.extend(stream[start:start + count - len(ids)])
    return ids


def prompt_from_ids(factory: PromptFactory, ids: list[int], output_tokens: int, **tags) -> Prompt:
    """Decode token ids to text; the input count is re-measured, since decoding can merge tokens."""
    text = factory.tokenizer.decode(ids, skip_special_tokens=True)
    return Prompt(text, count_tokens(factory.tokenizer, text), output_tokens, **tags)


def check_fits(settings: SweepSection, input_tokens: int, output_tokens: int, what: str) -> None:
    """Refuse, before any load, requests the engine would refuse one by one."""
    w = settings.workload
    if (w.max_input_tokens and input_tokens > w.max_input_tokens) or \
            (w.max_total_tokens and input_tokens + output_tokens > w.max_total_tokens):
        raise ToolkitError(f"{what} asks for {input_tokens} input + {output_tokens} output tokens, more than the "
                           f"engine takes ({w.max_input_tokens} input, {w.max_total_tokens} in all)",
                           "shorten it in sweep.workload, or raise engine.max_input_len / max_seq_len")


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False).input_ids)


class Workload:
    """Base: a fixed pool of prompts sent per the sweep's load shape (concurrency or rate)."""

    kind = "synthetic"

    def __init__(self, settings: SweepSection, factory: PromptFactory):
        self.settings = settings
        self.factory = factory

    def steps(self) -> list[StepSpec]:
        s = self.settings
        many = len(s.shapes) > 1
        return [StepSpec(f"{load_label(s, level)}_isl{isl}_osl{osl}" if many else load_label(s, level), level, isl, osl)
                for isl, osl in s.shapes for level in s.load_levels]

    def prompts(self, step: StepSpec, shape: LoadShape) -> list[Prompt]:
        """Made before the load starts: tokenizing while requests are in flight would delay the event
        loop that timestamps their responses. A duration-bounded step cycles through the pool."""
        s = self.settings
        count = shape.max_requests or max(64, 4 * int(shape.level))
        return [self.factory.sample(step.input_tokens, s.input_tokens_stddev, step.output_tokens, s.output_tokens_stddev)
                for _ in range(count)]

    async def run(self, step: StepSpec, shape: LoadShape, send: Send) -> None:
        await drive_pool(self.prompts(step, shape), shape, send)


async def drive_pool(pool: list[Prompt], shape: LoadShape, send: Send, budget=None) -> None:
    """Send the pool's prompts in order (cycling) per the load shape."""
    position = 0

    def next_request() -> Prompt:
        nonlocal position
        position += 1
        return pool[(position - 1) % len(pool)]

    async def send_ok(prompt: Prompt) -> bool:
        return not server_gone(await send(prompt))

    await drive(shape, next_request, send_ok, budget)


def make_workload(settings: SweepSection, tokenizer, factory: PromptFactory | None = None) -> Workload:
    """The workload the settings name (sweep.workload.kind)."""
    from toolkit.bench.workloads.datasets import DatasetWorkload
    from toolkit.bench.workloads.mixed import MixedWorkload
    from toolkit.bench.workloads.multi_turn import MultiTurnWorkload
    from toolkit.bench.workloads.shared_prefix import SharedPrefixWorkload
    from toolkit.bench.workloads.trace import TraceWorkload

    factory = factory or PromptFactory(tokenizer, settings.seed)
    kinds = {cls.kind: cls for cls in (Workload, DatasetWorkload, TraceWorkload, SharedPrefixWorkload,
                                       MultiTurnWorkload, MixedWorkload)}
    return kinds[settings.workload.kind](settings, factory)
