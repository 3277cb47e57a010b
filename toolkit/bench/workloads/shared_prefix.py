"""Shared prefixes: `prefixes` system prompts of `prefix_tokens` tokens, each shared by
`users_per_prefix` users whose own question (`suffix_tokens`) follows it — genai-perf's
--num-prefix-prompts / --prefix-prompt-length workload. With KV-cache reuse (enable_kv_cache_reuse,
prefix caching) the server computes each system prompt once, and TTFT drops to the suffix's prefill.
"""

from __future__ import annotations

import random

from toolkit.bench.load import LoadShape
from toolkit.bench.prompts import Prompt, PromptFactory
from toolkit.bench.workloads.base import StepSpec, Workload, check_fits, drive_pool, load_label, prompt_from_ids, token_window


def shared_prefix_prompts(factory: PromptFactory, count: int, prefixes: int, prefix_tokens: int, users: int,
                          suffix_tokens: int, output_tokens: int, seed: int) -> list[Prompt]:
    """`count` requests in a seeded order; request i is a question of one user of one system prompt.
    The request class names the system prompt (`prefix0`, ...), so its reuse can be read per prefix."""
    heads = [token_window(factory, prefix_tokens, random.Random(f"{seed}-prefix-{p}")) for p in range(prefixes)]
    order = random.Random(seed)
    prompts = []
    for i in range(count):
        p, user = order.randrange(prefixes), order.randrange(users)
        question = token_window(factory, suffix_tokens, random.Random(f"{seed}-prefix-{p}-user-{user}-{i}"))
        prompts.append(prompt_from_ids(factory, heads[p] + question, output_tokens, request_class=f"prefix{p}",
                                       session=f"prefix{p}-user{user}"))
    return prompts


class SharedPrefixWorkload(Workload):
    kind = "shared_prefix"

    def __init__(self, settings, factory):
        super().__init__(settings, factory)
        w = settings.workload
        if not settings.lengths:
            check_fits(settings, w.prefix_tokens + w.suffix_tokens, settings.output_tokens, "the shared-prefix workload")

    def steps(self) -> list[StepSpec]:
        """One step per load level; with sweep.lengths, per length too: the prompt is `isl` tokens, the
        shared part all but the user's `suffix_tokens` (a long document everyone asks about)."""
        w, s = self.settings.workload, self.settings
        if not s.lengths:
            return [StepSpec(load_label(s, level), level, w.prefix_tokens + w.suffix_tokens, s.output_tokens)
                    for level in s.load_levels]
        return [StepSpec(f"{load_label(s, level)}_isl{isl}_osl{osl}", level, isl, osl)
                for isl, osl in s.lengths for level in s.load_levels]

    async def run(self, step: StepSpec, shape: LoadShape, send) -> None:
        w = self.settings.workload
        count = shape.max_requests or max(64, 4 * int(shape.level))
        suffix = min(w.suffix_tokens, step.input_tokens - 1)
        prefix = step.input_tokens - suffix if self.settings.lengths else w.prefix_tokens
        pool = shared_prefix_prompts(self.factory, count, w.prefixes, prefix, w.users_per_prefix,
                                     suffix, step.output_tokens, self.settings.seed + shape.seed)
        await drive_pool(pool, shape, send)
