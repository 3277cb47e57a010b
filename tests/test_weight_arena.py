"""The engine's weights gathered into one buffer advised for 2 MiB pages (runtime/weight_arena.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from toolkit.engine.runtime.weight_arena import HUGE_PAGE, MIN_BYTES, gather_weights

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


class _Holder:
    def __init__(self, **tensors):
        vars(self).update(tensors)


def _in_arena(arena, tensor) -> bool:
    start = arena.buffer.data_ptr()
    return start <= tensor.data_ptr() < start + arena.buffer.numel()


def test_big_tensors_move_into_one_page_aligned_buffer_with_their_values():
    import torch

    gen = torch.Generator().manual_seed(0)
    shared = torch.randn(256, 256, generator=gen)  # 256 KiB, held by two linears
    a = _Holder(weight=torch.randint(-128, 127, (300, 333), dtype=torch.int8, generator=gen), scale=torch.rand(300),
                shared=shared)
    b = _Holder(weight=torch.randn(128, 1024, generator=gen).to(torch.bfloat16), shared=shared, name="b")
    expected = {id(h): {k: v.clone() for k, v in vars(h).items() if isinstance(v, torch.Tensor)} for h in (a, b)}
    arena = gather_weights([a, b])
    assert arena.tensors == 3 and arena.bytes == 102400 + 262144 + 262144  # 99 900 bytes padded to 25 pages
    for holder in (a, b):
        for name, before in expected[id(holder)].items():
            after = getattr(holder, name)
            assert after.dtype == before.dtype and after.shape == before.shape and torch.equal(after, before)
            big = before.numel() * before.element_size() >= MIN_BYTES
            assert _in_arena(arena, after) == big  # the 1.2 KiB scale stays where it was
            if big:
                assert (after.data_ptr() - arena.buffer.data_ptr()) % 4096 == (-arena.buffer.data_ptr()) % 4096
    assert a.shared.data_ptr() == b.shared.data_ptr()  # moved once, still one tensor
    first = min(getattr(h, n).data_ptr() for h, n in ((a, "weight"), (a, "shared"), (b, "weight")))
    assert first % HUGE_PAGE == 0
    if sys.platform.startswith("linux") and THP.exists():
        assert arena.advised
        assert 0 <= arena.huge_page_bytes <= arena.bytes  # how much the kernel found huge pages for varies


def test_a_tied_embedding_moves_once_with_the_lm_head():
    """The runner passes itself too: its embedding, when tied, is the lm_head's tensor and must stay one tensor."""
    import torch

    tied = torch.randn(512, 128)
    lm_head, runner = _Holder(weight=tied), _Holder(embed=tied, cos=torch.randn(64, 32))
    arena = gather_weights([lm_head, runner])
    assert runner.embed.data_ptr() == lm_head.weight.data_ptr() and _in_arena(arena, runner.embed)
    assert arena.tensors == 2 and torch.equal(runner.embed, tied)


def test_distinct_gives_each_holder_a_copy_of_a_shared_tensor():
    """The CPU probe's sets: shallow copies of one kernel, each to read bytes of its own."""
    import copy

    import torch

    first = _Holder(weight=torch.randn(64, 64), scale=torch.rand(8))
    twins = [first] + [copy.copy(first) for _ in range(2)]
    values = first.weight.clone()
    arena = gather_weights(twins, distinct=True)
    assert arena.tensors == 3 and len({twin.weight.data_ptr() for twin in twins}) == 3
    assert all(_in_arena(arena, twin.weight) and torch.equal(twin.weight, values) for twin in twins)
    assert len({twin.scale.data_ptr() for twin in twins}) == 1  # under a page: left shared, where it was


def test_nothing_to_move_is_none():
    import torch

    assert gather_weights([_Holder(scale=torch.rand(16))]) is None


def test_the_arena_says_where_huge_pages_are_off(monkeypatch):
    """Where THP is `never` the kernel takes the advice and still maps 4 KiB pages: the description says so,
    with the setting to change, and the runner does not claim 2 MiB pages."""
    from toolkit.engine.runtime import weight_arena

    monkeypatch.setattr(weight_arena, "thp_setting", lambda: "never")
    off = weight_arena.WeightArena(None, 65, 100 << 20, advised=True, huge_page_bytes=0)
    assert not off.on_huge_pages
    assert "4 KiB pages" in off.describe() and "never" in off.describe() and "madvise" in off.describe()
    on = weight_arena.WeightArena(None, 65, 100 << 20, advised=True, huge_page_bytes=98 << 20)
    assert on.on_huge_pages and "98 MiB of it on 2 MiB pages" in on.describe()


def test_huge_page_bytes_are_read_from_smaps_within_the_range():
    import torch

    from toolkit.engine.runtime.weight_arena import _huge_page_bytes

    buffer = torch.ones(8 << 20, dtype=torch.uint8)
    got = _huge_page_bytes(buffer.data_ptr(), buffer.data_ptr() + buffer.numel())
    if not sys.platform.startswith("linux"):
        assert got is None
    else:
        assert 0 <= got <= buffer.numel()
        assert _huge_page_bytes(0, 4096) == 0  # nothing is mapped at address 0


def test_the_kv_cache_lies_in_one_buffer_on_2mib_pages_zeroed_each_tensor_on_its_own_pages():
    """Every layer's K and V as views of one 2 MiB-aligned buffer (scattered blocks cost a TLB miss per jump on
    4 KiB pages), zeroed, each tensor starting on its own page; writes land where reads find them."""
    import torch

    from toolkit.engine.runtime.kv_cache import PagedKVCache

    cache = PagedKVCache(num_layers=3, num_blocks=5, block_size=4, num_kv_heads=2, head_dim=24,
                         compute_dtype=torch.bfloat16, kv_cache_dtype="fp8")
    tensors = cache.k + cache.v
    base = tensors[0].untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == base for t in tensors)  # one buffer
    assert tensors[0].data_ptr() % HUGE_PAGE == 0 and all(t.data_ptr() % 4096 == 0 for t in tensors)
    assert len({t.data_ptr() for t in tensors}) == 6 and all(t.dtype == torch.float8_e4m3fn for t in tensors)
    assert all(t.shape == (20, 2, 24) and not t.float().any() for t in tensors)
    k = torch.randn(2, 2, 24).to(torch.bfloat16)
    cache.write(1, torch.tensor([3, 17]), k, -k)
    got_k, got_v = cache.read(1, torch.tensor([3, 17]))
    assert torch.allclose(got_k.float(), k.float(), rtol=0.07, atol=0.05) and torch.equal(got_v, -got_k)
    assert not cache.k[0].float().any() and not cache.k[2].float().any()  # the other layers untouched
