"""Sampling as TensorRT-LLM's `tensorrt_llm` model takes it: `temperature`, `runtime_top_k`,
`runtime_top_p`, `seed` (named `random_seed` in older templates), `beam_width` (1 only).

Greedy when nothing asks otherwise: no sampling tensor, temperature 0, top_k 1, or top_k and top_p
both 0 (TensorRT-LLM's "both zero means greedy"). Each sequence draws from its own generator
seeded with `seed`, so a seeded request gives the same tokens alone or in any batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# TensorRT-LLM's default seed when a request sets none.
DEFAULT_SEED = 0


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    seed: int | None = None
    beam_width: int = 1

    def __post_init__(self):
        if self.beam_width != 1:
            raise ValueError(f"beam_width {self.beam_width} is not supported by the CPU engine: send beam_width 1")
        if self.temperature < 0:
            raise ValueError(f"temperature {self.temperature} must be >= 0")
        if self.top_k < 0:
            raise ValueError(f"runtime_top_k {self.top_k} must be >= 0")
        if not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"runtime_top_p {self.top_p} must be within [0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1 or (self.top_k == 0 and self.top_p == 0)

    def generator(self) -> torch.Generator | None:
        if self.greedy:
            return None
        generator = torch.Generator()
        generator.manual_seed(DEFAULT_SEED if self.seed is None else self.seed)
        return generator


GREEDY = SamplingParams(top_k=1)


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """float32 [..., vocab] → the distribution the sampler draws from (temperature, then top-k, then top-p)."""
    logits = logits.float() / max(params.temperature, 1e-6)
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if 0 < params.top_p < 1:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always at least the most likely token).
        drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from float32 [vocab] logits."""
    if params.greedy:
        return int(torch.argmax(logits))
    return int(torch.multinomial(probabilities(logits, params), 1, generator=generator))


def accept_greedy(draft: list[int], targets: list[int]) -> list[int]:
    """Greedy verification: `targets` are the target model's argmax after the last accepted token and
    after each draft token. Draft tokens are kept while they equal the target's; then the target's own."""
    for i, token in enumerate(draft):
        if targets[i] != token:
            return draft[:i] + [targets[i]]
    return draft + [targets[len(draft)]]


def verify_draft(logits: torch.Tensor, draft: list[int], params: SamplingParams,
                 generator: torch.Generator | None) -> list[int]:
    """Speculative verification when sampling: logits [len(draft) + 1, vocab] after the last accepted
    token and each draft token. The draft is a point mass, so the standard rejection rule accepts token d
    with probability p(d) and, on rejection, draws from p with d removed: the output follows the target
    distribution exactly. Returns the accepted draft prefix plus one token drawn from the target."""
    out: list[int] = []
    for i, token in enumerate(draft):
        probs = probabilities(logits[i], params)
        if float(torch.rand((), generator=generator)) >= float(probs[token]):
            residual = probs.clone()
            residual[token] = 0.0
            if float(residual.sum()) <= 0:  # p(d) was 1: cannot be rejected, guard rounding
                return out + [token]
            return out + [int(torch.multinomial(residual / residual.sum(), 1, generator=generator))]
        out.append(token)
    return out + [sample(logits[len(draft)], params, generator)]
