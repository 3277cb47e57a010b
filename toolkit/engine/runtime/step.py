"""`StepInput`: the contract between the scheduler and the model runner.

One forward pass runs a mixed batch: some sequences prefill a chunk of their prompt, others decode
one token, others verify speculative draft tokens. The scheduler owns the logical KV blocks (which
physical block holds which tokens of which sequence, prefix sharing, eviction); the runner owns the
physical KV tensors and only ever writes K/V at `slot_mapping` and reads through `block_tables`.
Shared (reused-prefix) blocks are full and read-only: the scheduler never maps a new token's slot
into a block that another live sequence also references.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import torch


def int64_tensor(values) -> torch.Tensor:
    """An int64 tensor of `values` (ints) over an array's buffer. Why not torch.tensor(list): a step's few small
    tensors are built between two decode steps, after the weights streamed through the caches, and torch.tensor's
    per-element conversion took ~0.06 ms of a batch-1 step of `small` against ~0.03 through an array, 2-3 % of an
    int4 step (2026-11-27, Zen 4)."""
    values = array("q", values)
    return torch.frombuffer(values, dtype=torch.int64) if values else torch.empty(0, dtype=torch.int64)


@dataclass
class StepInput:
    # int64 [T]: the new tokens of every sequence in this step, concatenated in sequence order.
    token_ids: torch.Tensor
    # int64 [T]: each new token's position in its own sequence (0-based).
    positions: torch.Tensor
    # [S]: new tokens per sequence (sum = T). Decode: 1; a prefill chunk: its length; verification of
    # k draft tokens: k + 1.
    query_lens: list[int]
    # [S]: tokens in the KV cache for each sequence once this step has written its new tokens.
    context_lens: list[int]
    # [S][ceil(context_len / block_size)]: physical block ids holding each sequence's tokens, in order.
    block_tables: list[list[int]]
    # int64 [T]: block_id * block_size + offset, where each new token's K and V are written.
    slot_mapping: torch.Tensor
    # int64 [L]: indices into the T new tokens whose logits the runner returns (the last token of each
    # sequence that samples this step; every verified position for speculative decoding).
    logits_indices: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_sequences(self) -> int:
        return len(self.query_lens)


# The runner's side of the contract (implemented in model_runner.py):
#
#   class ModelRunner:
#       def __init__(self, checkpoint_dir, *, num_blocks: int, block_size: int,
#                    kv_cache_dtype: str = "auto", dtype: str = "auto", threads: int | None = None,
#                    device: str = "cpu"): ...
#       spec            -> vocab_size, num_layers, num_kv_heads, head_dim, max_position_embeddings
#       weight_format   -> str: what the kernels actually run ("bf16", "int8", "int4-g128", ...)
#       kv_bytes_per_token -> int
#       def forward(self, step: StepInput) -> torch.Tensor   # float32 [L, vocab] logits
#       def warm_up(self, max_batch_size: int, max_num_tokens: int) -> None   # compile / first-call costs
