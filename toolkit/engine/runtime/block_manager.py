"""Paged KV-cache accounting: which physical block holds which sequence's tokens, and prefix reuse.

A sequence's block table lists its blocks in order. With reuse on (enable_kv_cache_reuse), every
full block whose tokens are all in the cache is registered under a chain hash of (the previous
block's hash, its tokens), so the hash names the whole prefix up to that block. A later request
whose prompt starts with the same full blocks takes them instead of recomputing them. A block whose
last user finished stays registered and counts as free until a new allocation needs it (least
recently used first): reuse never holds memory a new request could use.

Shared blocks are full and read-only: a new token is never written into a block another sequence
references (the scheduler always recomputes at least the prompt's last token, in a block of its own).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def chain_hash(parent: int | None, tokens: list[int]) -> int:
    return hash((parent, tuple(tokens)))


@dataclass
class BlockCounters:
    """Cumulative, as TensorRT-LLM's KV cache stats count them."""
    alloc_total: int = 0  # blocks handed to sequences, new or reused
    alloc_new: int = 0  # blocks handed out empty (to be computed)
    reused: int = 0  # blocks taken from the reuse cache (prefix hits)
    missed: int = 0  # full prompt blocks looked up and not found (prefix misses)

    @property
    def hit_rate(self) -> float:
        looked_up = self.reused + self.missed
        return self.reused / looked_up if looked_up else 0.0


class OutOfBlocks(Exception):
    pass


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_reuse: bool = False):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token (got {num_blocks} x {block_size})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_reuse = enable_reuse
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, int] = {}  # block → chain hash (registered blocks only)
        self._block_of: dict[int, int] = {}  # chain hash → block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # registered, unreferenced, LRU first
        self.counters = BlockCounters()

    # ---- capacity ------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def free_after_taking(self, cached: list[int]) -> int:
        """Free blocks left once `cached` (from `lookup`) are referenced: those unreferenced count as free now."""
        return self.num_free - sum(1 for b in cached if b in self._evictable)

    # ---- prefix reuse --------------------------------------------------------------------------
    def lookup(self, tokens: list[int], max_tokens: int) -> list[int]:
        """Registered blocks holding the longest run of full blocks that prefixes tokens[:max_tokens]."""
        if not self.enable_reuse:
            return []
        found, parent = [], None
        for start in range(0, max_tokens - self.block_size + 1, self.block_size):
            parent = chain_hash(parent, tokens[start:start + self.block_size])
            block = self._block_of.get(parent)
            if block is None:
                break
            found.append(block)
        return found

    def take_cached(self, blocks: list[int], full_blocks_looked_up: int) -> None:
        """Reference blocks found by `lookup` for a new sequence; counts hits and misses."""
        for block in blocks:
            self._evictable.pop(block, None)
            self._refs[block] += 1
        self.counters.reused += len(blocks)
        self.counters.alloc_total += len(blocks)
        self.counters.missed += max(0, full_blocks_looked_up - len(blocks))

    def register(self, block: int, block_hash: int) -> None:
        if not self.enable_reuse or block in self._hash_of:
            return
        if block_hash in self._block_of:  # the same prefix computed twice concurrently: keep the first
            return
        self._hash_of[block] = block_hash
        self._block_of[block_hash] = block

    # ---- allocation ----------------------------------------------------------------------------
    def allocate(self, count: int) -> list[int]:
        if count > self.num_free:
            raise OutOfBlocks(f"{count} KV blocks asked, {self.num_free} free")
        out = []
        for _ in range(count):
            if self._free:
                block = self._free.popleft()
            else:  # evict the least recently used registered block
                block, _ = self._evictable.popitem(last=False)
                del self._block_of[self._hash_of.pop(block)]
            self._refs[block] = 1
            out.append(block)
        self.counters.alloc_new += count
        self.counters.alloc_total += count
        return out

    def grow(self, table: list[int], num_tokens: int) -> bool:
        """Extend `table` in place to hold `num_tokens` tokens; False (and no change) if blocks are short."""
        missing = blocks_for(num_tokens, self.block_size) - len(table)
        if missing <= 0:
            return True
        if missing > self.num_free:
            return False
        table.extend(self.allocate(missing))
        return True

    def shrink(self, table: list[int], num_tokens: int) -> None:
        """Release the blocks of `table` beyond what `num_tokens` tokens need (rejected draft tokens)."""
        keep = blocks_for(num_tokens, self.block_size)
        self.release(table[keep:])
        del table[keep:]

    def release(self, blocks: list[int]) -> None:
        # Tail first, so eviction (least recently released first) takes a prefix's last blocks before
        # its first ones: a prefix whose head is evicted cannot be matched at all.
        for block in reversed(blocks):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._hash_of:
                    self._evictable[block] = None
                else:
                    self._free.append(block)
