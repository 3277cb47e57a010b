"""In-flight batching: which sequences run in the next step, and how many tokens each.

Every step is one forward pass over a mixed batch under two budgets, `max_batch_size` sequences
and `max_num_tokens` tokens. Decoding sequences go first: each takes 1 token (plus its draft tokens
under speculative decoding); then those still prefilling take the next chunk of their prompt, in
admission order. Waiting requests are then admitted first come, first served while both budgets and
the KV cache allow.

A sequence is its tokens (prompt + generated) and how many of them have K/V in the cache
(`num_computed`): the step processes tokens[num_computed:num_computed + n], and the sequence samples
when that reaches its last token. Prefill, a prefill chunk, decode and recompute after preemption
are all the same operation.

Chunked prefill (enable_chunked_context): a prompt longer than the step's remaining token budget is
split into chunks that end on block boundaries (as TensorRT-LLM requires), so it shares steps with
running decodes instead of stalling them. Off: a prompt is admitted only when it fits a step whole.

A full KV cache follows `batch_scheduler_policy`, TensorRT-LLM's two policies:
  guaranteed_no_evict  admit a request only if blocks for its prompt and all of its output are free
                       after what running requests may still need: a running request never stalls;
                       requests wait in the queue instead (counted: `admission_waits`).
  max_utilization      admit on the blocks the next step needs; when a running request needs a block
                       and none is free, pause the most recently admitted one (free its blocks, requeue
                       it at the front, recompute its tokens when resumed; counted: `preemptions`).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

import torch

from toolkit.engine.runtime.block_manager import BlockManager, blocks_for, chain_hash
from toolkit.engine.runtime.sampling import GREEDY, SamplingParams
from toolkit.engine.runtime.speculative import NgramIndex, SpecCounters
from toolkit.engine.runtime.step import StepInput, int64_tensor

POLICIES = ("guaranteed_no_evict", "max_utilization")


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SchedulerConfig:
    max_batch_size: int
    max_num_tokens: int
    max_seq_len: int
    block_size: int
    num_blocks: int
    enable_chunked_context: bool = True
    enable_kv_cache_reuse: bool = False
    batch_scheduler_policy: str = "guaranteed_no_evict"
    max_draft_len: int = 0  # > 0: n-gram speculative decoding with drafts of up to this many tokens
    max_matching_ngram_size: int = 3

    def __post_init__(self):
        if self.batch_scheduler_policy not in POLICIES:
            raise ValueError(f"batch_scheduler_policy {self.batch_scheduler_policy!r}: use one of {', '.join(POLICIES)}")


@dataclass(eq=False)
class Sequence:
    request_id: str
    tokens: list[int]
    prompt_len: int
    max_new_tokens: int
    end_id: int | None = None
    sampling: SamplingParams = GREEDY
    generator: torch.Generator | None = None
    status: Status = Status.WAITING
    num_computed: int = 0  # tokens whose K/V are in the cache
    block_table: list[int] = field(default_factory=list)
    num_registered: int = 0  # full blocks registered for reuse
    last_hash: int | None = None  # chain hash of the last registered block
    admitted: int = -1  # admission order (preemption takes the latest)
    waited_for_cache: bool = False
    finish_reason: str | None = None  # "length" | "stop" | "abort" | "error"
    ngrams: NgramIndex | None = None

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - self.num_generated

    @property
    def max_total_tokens(self) -> int:
        return self.prompt_len + self.max_new_tokens


@dataclass
class Scheduled:
    seq: Sequence
    num_new: int  # tokens of seq.tokens processed this step, from seq.num_computed
    draft: list[int] = field(default_factory=list)
    is_decode: bool = False

    @property
    def samples(self) -> bool:
        return self.seq.num_computed + self.num_new == len(self.seq.tokens)

    @property
    def query_len(self) -> int:
        return self.num_new + len(self.draft)


@dataclass
class SchedulerCounters:
    admission_waits: int = 0  # requests that waited in the queue for KV blocks (guaranteed_no_evict)
    preemptions: int = 0  # running requests paused for KV blocks (max_utilization)


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager | None = None):
        self.config = config
        self.blocks = blocks or BlockManager(config.num_blocks, config.block_size, config.enable_kv_cache_reuse)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.counters = SchedulerCounters()
        self.spec = SpecCounters()
        self._admissions = itertools.count()
        self.paused_last_step = 0

    # ---- requests ------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if self.config.max_draft_len > 0:
            seq.ngrams = NgramIndex(self.config.max_matching_ngram_size)
        self.waiting.append(seq)

    def abort(self, request_id: str) -> Sequence | None:
        for seq in list(self.waiting) + self.running:
            if seq.request_id == request_id:
                self.finish(seq, "abort")
                return seq
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self.blocks.release(seq.block_table)
            seq.block_table = []
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- scheduling ----------------------------------------------------------------------------
    def schedule(self) -> list[Scheduled]:
        batch: list[Scheduled] = []
        budget = self.config.max_num_tokens
        self.paused_last_step = 0
        # Decodes before prefill chunks (as TensorRT-LLM schedules generation before context): a long
        # prompt's chunks take what budget is left and never stall a stream that is already generating.
        decoding = [s for s in self.running if len(s.tokens) - s.num_computed == 1]
        for seq in decoding + [s for s in self.running if len(s.tokens) - s.num_computed > 1]:
            if seq.status is not Status.RUNNING or budget <= 0:
                continue  # paused earlier in this loop, or no tokens left in this step
            item = self._plan_running(seq, budget)
            if item is None:
                continue
            if not self._reserve(seq, seq.num_computed + item.query_len, batch):
                continue  # seq itself was paused
            batch.append(item)
            budget -= item.query_len
        self._admit(batch, budget)
        return batch

    def _plan_running(self, seq: Sequence, budget: int) -> Scheduled | None:
        pending = len(seq.tokens) - seq.num_computed
        if pending == 1:
            return Scheduled(seq, 1, self._draft(seq, budget - 1), is_decode=True)
        chunk = self._chunk(seq.num_computed, pending, budget)
        return Scheduled(seq, chunk) if chunk else None

    def _draft(self, seq: Sequence, room: int) -> list[int]:
        if seq.ngrams is None:
            return []
        # Never draft past the request's output length or the engine's max_seq_len.
        limit = min(self.config.max_draft_len, room, seq.remaining - 1, self.config.max_seq_len - len(seq.tokens) - 1)
        return seq.ngrams.propose(seq.tokens, limit) if limit > 0 else []

    def _chunk(self, start: int, pending: int, budget: int) -> int:
        """Tokens of a prefill to run now: all that is pending if it fits, else a block-aligned chunk."""
        if pending <= budget:
            return pending
        # Unchunked, a prompt runs whole; only one longer than any step (a paused request's prompt plus
        # its output, recomputed) must still be split.
        if not self.config.enable_chunked_context and pending <= self.config.max_num_tokens:
            return 0
        size = self.config.block_size
        aligned = (start + budget) // size * size - start
        if aligned <= 0 and budget == self.config.max_num_tokens:
            return budget  # a step budget smaller than a block: progress beats alignment
        return max(0, aligned)

    def _reserve(self, seq: Sequence, num_tokens: int, batch: list[Scheduled]) -> bool:
        """Blocks for `num_tokens` of seq; under max_utilization, pause later requests to free them."""
        while not self.blocks.grow(seq.block_table, num_tokens):
            scheduled = {id(item.seq) for item in batch}
            victims = [s for s in self.running if s is not seq and id(s) not in scheduled]
            victim = victims[-1] if victims else seq
            self._pause(victim)
            if victim is seq:
                return False
        return True

    def _pause(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.release(seq.block_table)
        seq.block_table, seq.num_computed, seq.num_registered, seq.last_hash = [], 0, 0, None
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.counters.preemptions += 1
        self.paused_last_step += 1

    def _future_blocks(self) -> int:
        """Blocks running requests may still take (guaranteed_no_evict keeps them free)."""
        return sum(max(0, blocks_for(min(s.max_total_tokens, self.config.max_seq_len), self.config.block_size)
                       - len(s.block_table)) for s in self.running)

    def _admit(self, batch: list[Scheduled], budget: int) -> None:
        config, size = self.config, self.config.block_size
        while self.waiting and budget > 0 and len(self.running) < config.max_batch_size:
            seq = self.waiting[0]
            # Reuse whole cached blocks, but always compute the last token (its logits start the output).
            cached = self.blocks.lookup(seq.tokens, len(seq.tokens) - 1)
            start = len(cached) * size
            chunk = self._chunk(start, len(seq.tokens) - start, budget)
            if chunk == 0:
                return  # first come, first served: the head of the queue waits for a later step
            if config.batch_scheduler_policy == "guaranteed_no_evict":
                needed = blocks_for(min(seq.max_total_tokens, config.max_seq_len), size) - len(cached)
                available = self.blocks.free_after_taking(cached) - self._future_blocks()
            else:
                needed = blocks_for(start + chunk, size) - len(cached)
                available = self.blocks.free_after_taking(cached)
            if needed > available:
                if not seq.waited_for_cache:
                    seq.waited_for_cache = True
                    self.counters.admission_waits += 1
                return
            self.waiting.popleft()
            self.blocks.take_cached(cached, full_blocks_looked_up=(len(seq.tokens) - 1) // size
                                    if self.blocks.enable_reuse else 0)
            seq.block_table = list(cached)
            seq.num_computed = start
            seq.num_registered, seq.last_hash = len(cached), self._hash_upto(seq.tokens, len(cached))
            self.blocks.grow(seq.block_table, start + chunk)
            seq.status, seq.admitted = Status.RUNNING, next(self._admissions)
            self.running.append(seq)
            batch.append(Scheduled(seq, chunk))
            budget -= chunk

    def _hash_upto(self, tokens: list[int], num_blocks: int) -> int | None:
        parent, size = None, self.config.block_size
        for i in range(num_blocks):
            parent = chain_hash(parent, tokens[i * size:(i + 1) * size])
        return parent

    # ---- after the forward pass ----------------------------------------------------------------
    def commit(self, item: Scheduled, new_tokens: list[int]) -> list[int]:
        """Record a step's result for one sequence: `new_tokens` is what it sampled (empty for a prefill
        chunk that does not reach the last token; accepted drafts + one token when verifying a draft).
        Returns the tokens to emit, cut at end_id (not emitted, as TensorRT-LLM) or the output length."""
        seq = item.seq
        if item.draft:
            accepted = len(new_tokens) - 1
            self.spec.steps += 1
            self.spec.draft_tokens += len(item.draft)
            self.spec.accepted_tokens += accepted
            seq.num_computed += item.num_new + accepted
            self.blocks.shrink(seq.block_table, seq.num_computed + 1)
        else:
            seq.num_computed += item.num_new
        emitted = []
        for token in new_tokens[:seq.remaining]:
            if seq.end_id is not None and token == seq.end_id:
                seq.finish_reason = "stop"
                break
            emitted.append(token)
        seq.tokens.extend(emitted)
        seq.num_computed = min(seq.num_computed, len(seq.tokens))
        self._register_full_blocks(seq)
        if seq.finish_reason == "stop" or (new_tokens and seq.remaining <= 0):
            self.finish(seq, seq.finish_reason or "length")
        return emitted

    def _register_full_blocks(self, seq: Sequence) -> None:
        if not self.blocks.enable_reuse:
            return
        size = self.config.block_size
        while (seq.num_registered + 1) * size <= seq.num_computed:
            i = seq.num_registered
            seq.last_hash = chain_hash(seq.last_hash, seq.tokens[i * size:(i + 1) * size])
            self.blocks.register(seq.block_table[i], seq.last_hash)
            seq.num_registered += 1


def build_step_input(batch: list[Scheduled], block_size: int) -> StepInput:
    """The runner's view of a scheduled batch (see step.py)."""
    token_ids, positions, slots, logits_indices = [], [], [], []
    query_lens, context_lens, tables = [], [], []
    for item in batch:
        seq, start = item.seq, item.seq.num_computed
        new = seq.tokens[start:start + item.num_new] + item.draft
        first = len(token_ids)
        token_ids.extend(new)
        positions.extend(range(start, start + len(new)))
        slots.extend(seq.block_table[p // block_size] * block_size + p % block_size
                     for p in range(start, start + len(new)))
        if item.draft:
            logits_indices.extend(range(first + item.num_new - 1, first + len(new)))
        elif item.samples:
            logits_indices.append(first + len(new) - 1)
        query_lens.append(len(new))
        context_lens.append(start + len(new))
        tables.append(seq.block_table[:blocks_for(start + len(new), block_size)])
    return StepInput(token_ids=int64_tensor(token_ids), positions=int64_tensor(positions), query_lens=query_lens,
                     context_lens=context_lens, block_tables=tables, slot_mapping=int64_tensor(slots),
                     logits_indices=int64_tensor(logits_indices))
