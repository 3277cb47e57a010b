"""Multi-turn sessions: conversations of `turns` turns. Each turn sends the whole history (earlier
messages and the model's actual answers) plus a new message of `turn_tokens`, after `think_time_s`,
so the context grows turn by turn and so does the KV cache every decode step reads. The history is
cut from the front to fit the engine's window (and to `history_tokens`, the "shorter context" fix).

With sweep.workload.path the conversations are a file's (AIPerf multi_turn JSONL, ShareGPT: each user
turn in order), their lengths the file's; the model's own answers still make the history.

Load: in concurrency mode the level is the number of conversations in progress at once; in rate mode,
new conversations per second. A step ends after its request (turn) count and/or duration.
"""

from __future__ import annotations

import asyncio
import random

from toolkit.bench.load import Budget, LoadShape, arrival_gaps
from toolkit.bench.prompts import Prompt
from toolkit.bench.workloads.base import StepSpec, Workload, count_tokens, load_label, server_gone, token_window
from toolkit.bench.workloads.datasets import output_tokens_of, read_conversations


def fit_history(tokenizer, history: str, keep_tokens: int) -> str:
    """The last `keep_tokens` tokens of the history (all of it when it is shorter)."""
    if keep_tokens <= 0:
        return ""
    ids = tokenizer(history, add_special_tokens=False).input_ids
    return history if len(ids) <= keep_tokens else tokenizer.decode(ids[-keep_tokens:], skip_special_tokens=True)


class MultiTurnWorkload(Workload):
    kind = "multi_turn"

    def __init__(self, settings, factory):
        super().__init__(settings, factory)
        # With a path, conversations come from the file (every user turn in order; its output length from
        # the file or the recorded reply), conversation k of the step playing the file's k-th (cycling).
        path = settings.workload.path
        self.scripts = read_conversations(path) if path else []

    def steps(self) -> list[StepSpec]:
        w, s = self.settings.workload, self.settings
        return [StepSpec(load_label(s, level), level, w.turn_tokens, s.output_tokens) for level in s.load_levels]

    def history_budget(self, output_tokens: int, message_tokens: int) -> int:
        """Tokens of history a turn may carry: the engine's window less the new message and the answer."""
        w = self.settings.workload
        # Two tokens of slack: history and message can tokenize one or two tokens longer once joined.
        room = min(w.max_input_tokens or 10**9, (w.max_total_tokens or 10**9) - output_tokens) - message_tokens - 2
        return min(room, w.history_tokens) if w.history_tokens else room

    async def conversation(self, number: int, step: StepSpec, budget: Budget, send, seed: int) -> None:
        w, tokenizer = self.settings.workload, self.factory.tokenizer
        script = self.scripts[number % len(self.scripts)] if self.scripts else None
        history = ""
        for turn in range(len(script) if script else w.turns):
            if turn and w.think_time_s:
                await asyncio.sleep(w.think_time_s)
            if not budget.take():
                return
            if script:
                message = script[turn].text
                output_tokens = output_tokens_of(script[turn], tokenizer, step.output_tokens)
            else:
                message = tokenizer.decode(token_window(self.factory, w.turn_tokens,
                                                        random.Random(f"{seed}-{number}-{turn}")), skip_special_tokens=True)
                output_tokens = step.output_tokens
            text = fit_history(tokenizer, history, self.history_budget(output_tokens, count_tokens(tokenizer, message))) \
                + message
            record = await send(Prompt(text, count_tokens(tokenizer, text), output_tokens, session=f"s{number}", turn=turn))
            if server_gone(record):
                budget.stop.set()
                return
            history = text + record.output_text

    async def run(self, step: StepSpec, shape: LoadShape, send) -> None:
        budget = Budget(shape.max_requests, shape.duration_s)
        started = 0
        seed = self.settings.seed + shape.seed

        def next_number() -> int:
            nonlocal started
            started += 1
            return started - 1

        if shape.mode == "concurrency":
            async def worker():
                while budget.more():
                    await self.conversation(next_number(), step, budget, send, seed)

            await asyncio.gather(*(worker() for _ in range(int(shape.level))))
            return
        tasks = []
        for gap in arrival_gaps(shape.level, shape.arrival, seed):
            if not budget.more():
                break
            tasks.append(asyncio.create_task(self.conversation(next_number(), step, budget, send, seed)))
            await asyncio.sleep(gap)
        await asyncio.gather(*tasks)
