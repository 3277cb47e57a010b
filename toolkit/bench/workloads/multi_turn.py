"""Multi-turn sessions: conversations of `turns` turns. Each turn sends the whole history (earlier
messages and the model's actual answers) plus a new message of `turn_tokens`, after `think_time_s`,
so the context grows turn by turn and so does the KV cache every decode step reads. The history is
cut from the front to fit the engine's window (and to `history_tokens`, the "shorter context" fix).

Load: in concurrency mode the level is the number of conversations in progress at once; in rate mode,
new conversations per second. A step ends after its request (turn) count and/or duration.
"""

from __future__ import annotations

import asyncio
import random

from toolkit.bench.load import Budget, LoadShape, arrival_gaps
from toolkit.bench.prompts import Prompt
from toolkit.bench.workloads.base import StepSpec, Workload, count_tokens, load_label, server_gone, token_window


def fit_history(tokenizer, history: str, keep_tokens: int) -> str:
    """The last `keep_tokens` tokens of the history (all of it when it is shorter)."""
    if keep_tokens <= 0:
        return ""
    ids = tokenizer(history, add_special_tokens=False).input_ids
    return history if len(ids) <= keep_tokens else tokenizer.decode(ids[-keep_tokens:], skip_special_tokens=True)


class MultiTurnWorkload(Workload):
    kind = "multi_turn"

    def steps(self) -> list[StepSpec]:
        w, s = self.settings.workload, self.settings
        return [StepSpec(load_label(s, level), level, w.turn_tokens, s.output_tokens) for level in s.load_levels]

    def history_budget(self, output_tokens: int) -> int:
        """Tokens of history a turn may carry: the engine's window less the new message and the answer."""
        w = self.settings.workload
        # Two tokens of slack: history and message can tokenize one or two tokens longer once joined.
        room = min(w.max_input_tokens or 10**9, (w.max_total_tokens or 10**9) - output_tokens) - w.turn_tokens - 2
        return min(room, w.history_tokens) if w.history_tokens else room

    async def conversation(self, number: int, step: StepSpec, budget: Budget, send, seed: int) -> None:
        w, tokenizer = self.settings.workload, self.factory.tokenizer
        history = ""
        for turn in range(w.turns):
            if turn and w.think_time_s:
                await asyncio.sleep(w.think_time_s)
            if not budget.take():
                return
            message = tokenizer.decode(token_window(self.factory, w.turn_tokens, random.Random(f"{seed}-{number}-{turn}")),
                                       skip_special_tokens=True)
            text = fit_history(tokenizer, history, self.history_budget(step.output_tokens)) + message
            record = await send(Prompt(text, count_tokens(tokenizer, text), step.output_tokens,
                                       session=f"s{number}", turn=turn))
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
