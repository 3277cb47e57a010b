"""Synthetic prompts of a target token length, made with the model's tokenizer; seeded."""

from __future__ import annotations

import random
from dataclasses import dataclass

from toolkit.data import corpus_paragraphs


@dataclass(frozen=True)
class Prompt:
    text: str
    input_tokens: int


class PromptFactory:
    def __init__(self, tokenizer, seed: int = 0):
        self.tokenizer = tokenizer
        self.rng = random.Random(seed)
        self.stream = tokenizer(" ".join(corpus_paragraphs()), add_special_tokens=False).input_ids

    def sample_length(self, mean: int, stddev: float) -> int:
        return max(1, round(self.rng.gauss(mean, stddev))) if stddev > 0 else mean

    def make(self, tokens: int) -> Prompt:
        """A window of the shipped corpus about `tokens` long; its count is re-measured after decoding."""
        ids: list[int] = []
        while len(ids) < tokens:
            start = self.rng.randrange(0, max(1, len(self.stream) - tokens))
            ids.extend(self.stream[start:start + tokens - len(ids)])
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Prompt(text, len(self.tokenizer(text, add_special_tokens=False).input_ids))

    def batch(self, count: int, mean: int, stddev: float) -> list[Prompt]:
        return [self.make(self.sample_length(mean, stddev)) for _ in range(count)]
