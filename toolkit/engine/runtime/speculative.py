"""Speculative decoding by n-gram (prompt-lookup) drafting, as TensorRT-LLM's NGram mode does it.

The draft for a sequence is what followed the most recent earlier occurrence of its last n tokens
(n from `max_matching_ngram_size` down to 1), up to `max_draft_len` tokens; when that occurrence is
closer than the draft is long, the repeating stretch is continued periodically. The target model then
scores the last token and the draft in one forward pass (sampling.verify_draft): each accepted draft
token is a decode step saved. It costs nothing when text does not repeat (no draft, a plain decode
step) and pays off on repetitive output: code, extraction, summaries quoting their input.

Each sequence keeps an index from n-gram to the position after its latest occurrence, updated as
tokens are appended, so proposing is a few dictionary look-ups, not a scan of the history.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpecCounters:
    steps: int = 0  # verification steps that carried a draft
    draft_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verification step (accepted drafts + the target's own token)."""
        return (self.accepted_tokens + self.steps) / self.steps if self.steps else 0.0


class NgramIndex:
    def __init__(self, max_ngram: int = 3):
        self.max_ngram = max_ngram
        self._after: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # tokens[:_indexed] have their n-grams recorded

    def update(self, tokens: list[int]) -> None:
        # Position p gets a follower once tokens[p] exists: record every n-gram that ends just before p.
        for p in range(max(self._indexed, 1), len(tokens)):
            for n in range(1, min(self.max_ngram, p) + 1):
                self._after[tuple(tokens[p - n:p])] = p
        self._indexed = len(tokens)

    def propose(self, tokens: list[int], max_draft: int) -> list[int]:
        if max_draft <= 0:
            return []
        self.update(tokens)
        for n in range(min(self.max_ngram, len(tokens)), 0, -1):
            start = self._after.get(tuple(tokens[-n:]))
            if start is not None and start < len(tokens):
                # The text repeats with period p from `start` on; continue that period past the end of what
                # is known, so a short loop (the latest match is close) still yields a full draft.
                period = len(tokens) - start
                return [tokens[start + i % period] for i in range(max_draft)]
        return []
