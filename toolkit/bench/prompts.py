"""Synthetic requests: prompts of a target token length made with the model's tokenizer, and an
output length per request; seeded, so the same config sends the same requests in the same order."""

from __future__ import annotations

import random
from dataclasses import dataclass

from toolkit.data import corpus_paragraphs


@dataclass(frozen=True)
class Prompt:
    text: str
    input_tokens: int
    output_tokens: int
    # Carried into the request's record (see RequestRecord): class, conversation and turn, where the
    # workload has them.
    request_class: str | None = None
    session: str | None = None
    turn: int | None = None


class PromptFactory:
    def __init__(self, tokenizer, seed: int = 0):
        self.tokenizer = tokenizer
        self.rng = random.Random(seed)
        self.stream = tokenizer(" ".join(corpus_paragraphs()), add_special_tokens=False).input_ids

    def sample_length(self, mean: int, stddev: float) -> int:
        return max(1, round(self.rng.gauss(mean, stddev))) if stddev > 0 else mean

    def make(self, input_tokens: int, output_tokens: int) -> Prompt:
        """A window of the shipped corpus about `input_tokens` long; its count is re-measured after decoding."""
        ids: list[int] = []
        while len(ids) < input_tokens:
            start = self.rng.randrange(0, max(1, len(self.stream) - input_tokens))
            ids.extend(self.stream[start:start + input_tokens - len(ids)])
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Prompt(text, len(self.tokenizer(text, add_special_tokens=False).input_ids), output_tokens)

    def sample(self, isl_mean: int, isl_stddev: float, osl_mean: int, osl_stddev: float) -> Prompt:
        return self.make(self.sample_length(isl_mean, isl_stddev), self.sample_length(osl_mean, osl_stddev))
