"""The quantization quality gate: perplexity and next-token KL on held-out shipped text."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class QualityReport:
    tokens: int
    perplexity_original: float
    perplexity_quantized: float
    mean_kl: float

    @property
    def perplexity_ratio(self) -> float:
        return self.perplexity_quantized / self.perplexity_original

    def to_dict(self) -> dict:
        return asdict(self) | {"perplexity_ratio": self.perplexity_ratio}


def next_token_logits(model, batches) -> list:
    import torch

    with torch.no_grad():
        return [model(ids).logits.float() for ids in batches]


def compare_logits(reference: list, candidate: list, batches) -> QualityReport:
    """Perplexity of both models on the batches' own next tokens, and mean KL(reference ‖ candidate)."""
    import torch.nn.functional as F

    nll_ref = nll_cand = kl_sum = 0.0
    count = 0
    for ref, cand, ids in zip(reference, candidate, batches):
        targets = ids[:, 1:]
        ref_logp = F.log_softmax(ref[:, :-1], dim=-1)
        cand_logp = F.log_softmax(cand[:, :-1], dim=-1)
        nll_ref -= ref_logp.gather(-1, targets.unsqueeze(-1)).sum().item()
        nll_cand -= cand_logp.gather(-1, targets.unsqueeze(-1)).sum().item()
        kl_sum += (ref_logp.exp() * (ref_logp - cand_logp)).sum().item()
        count += targets.numel()
    return QualityReport(tokens=count, perplexity_original=math.exp(nll_ref / count),
                         perplexity_quantized=math.exp(nll_cand / count), mean_kl=kl_sum / count)
