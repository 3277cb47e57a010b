"""The engine's fused C kernels against the torch ops they replace (model_runner.py's reference path)."""

import pytest

from toolkit.compile_native import find_compiler
from toolkit.engine.runtime import native_kernels

pytestmark = pytest.mark.skipif(find_compiler("c") is None, reason="no C compiler here to build the fused kernels")

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 12, 4, 64, 8


# The kernels as -march=native builds them, and, on a CPU with AVX-512 that also runs AVX2, as a CPU without AVX-512
# gets them (x86-64-v3: the AVX2 kernels, the rest on its portable paths): every test below holds both builds to torch.
BUILDS = ["native"] + (["x86-64-v3"] if native_kernels.BOTH_BUILDS_FLAGS <= native_kernels.cpu_flags() else [])


@pytest.fixture(scope="module", params=BUILDS)
def kernels(request):
    from toolkit.engine.runtime import native_kernels

    loaded = native_kernels.load(None if request.param == "native" else request.param)
    assert loaded is not None
    return loaded


def _dtype(name):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_rms_norm_matches_hf_llama_rounding(kernels, dtype):
    import torch

    dt = _dtype(dtype)
    x, w = torch.randn(5, 768, dtype=dt), torch.randn(768, dtype=dt)
    xf = x.float()
    expected = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dt)
    tolerance = 1e-5 if dtype == "fp32" else 1e-2  # bf16: the same roundings, summation order aside
    assert (kernels.rms_norm(x, w, 1e-5).float() - expected.float()).abs().max().item() < tolerance


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_rope_rotates_the_q_and_k_columns_of_a_fused_row_in_place(kernels, dtype):
    import torch

    dt = _dtype(dtype)
    positions = torch.tensor([0, 3, 77])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM))
    angles = torch.outer(torch.arange(128, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().to(dt), angles.sin().to(dt)
    qkv = torch.randn(3, (HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=dt)

    def reference(x):
        half = HEAD_DIM // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos[positions][:, None] + rotated * sin[positions][:, None]

    q_cols = HEADS * HEAD_DIM
    expected_q = reference(qkv[:, :q_cols].reshape(3, HEADS, HEAD_DIM))
    expected_k = reference(qkv[:, q_cols:q_cols + KV_HEADS * HEAD_DIM].reshape(3, KV_HEADS, HEAD_DIM))
    v_before = qkv[:, q_cols + KV_HEADS * HEAD_DIM:].clone()
    kernels.rope_(qkv, HEADS, HEAD_DIM, positions, cos, sin)
    kernels.rope_(qkv[:, q_cols:], KV_HEADS, HEAD_DIM, positions, cos, sin)
    tolerance = 1e-6 if dtype == "fp32" else 0.05  # bf16: one rounding here, three in the torch ops
    assert (qkv[:, :q_cols].reshape(3, HEADS, HEAD_DIM) - expected_q).abs().max().item() < tolerance
    k = qkv[:, q_cols:q_cols + KV_HEADS * HEAD_DIM].reshape(3, KV_HEADS, HEAD_DIM)
    assert (k - expected_k).abs().max().item() < tolerance
    assert torch.equal(qkv[:, q_cols + KV_HEADS * HEAD_DIM:], v_before)  # v untouched


def _paged(cache_dtype, head_dim=HEAD_DIM, kv_heads=KV_HEADS, seed=0):
    """A cache of 40 blocks in `cache_dtype`, five sequences over scattered blocks: lengths 1 and 5 (less
    than the vector path's tile of 16 tokens), 17 and 37 (a short last tile) and 80 (whole tiles)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(40 * BLOCK, kv_heads, head_dim, generator=gen)
    v = torch.randn(40 * BLOCK, kv_heads, head_dim, generator=gen)
    tables = torch.tensor([[5, 9, 2, 30, 17, 0, 0, 0, 0, 0], [7, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                           [11, 12, 13, 14, 15, 16, 18, 19, 20, 21], [33, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                           [39, 1, 25, 0, 0, 0, 0, 0, 0, 0]])
    lens = torch.tensor([37, 1, 80, 5, 17])
    return k, v, tables, lens


# head_dim 64 and 128 take the AVX-512 path where the CPU has it; without AVX-512 (the x86-64-v3 build) every multiple
# of 32 takes the AVX2 path; 32 on AVX-512 and 48 everywhere the element-wise one.
# Query heads per kv head: 3, 1, and 9 (above the vector path's 8 at once: two sub-groups). The five
# sequences once (a work item takes some of a row's kv heads, to keep both threads busy) and twice (it takes
# them all).
@pytest.mark.parametrize("copies", [1, 2])
@pytest.mark.parametrize("heads,kv_heads", [(HEADS, KV_HEADS), (4, 4), (18, 2)])
@pytest.mark.parametrize("head_dim", [HEAD_DIM, 128, 32, 48])
@pytest.mark.parametrize("act,cache", [("fp32", "fp32"), ("bf16", "bf16"), ("bf16", "fp8"), ("bf16", "int8"),
                                       ("fp32", "int8"), ("fp32", "bf16")])
def test_paged_decode_attention_equals_attention_over_the_gathered_context(kernels, act, cache, head_dim, heads,
                                                                           kv_heads, copies):
    import torch

    torch.manual_seed(head_dim * heads + kv_heads)
    k, v, tables, lens = _paged(cache, head_dim, kv_heads)
    tables, lens = tables.repeat(copies, 1), lens.repeat(copies)
    act_dt = _dtype(act)
    batch = len(lens)
    q = torch.randn(batch, heads, head_dim).to(act_dt)
    scale = 0.05
    if cache == "fp8":
        k_store, v_store = (k / scale).to(torch.float8_e4m3fn), (v / scale).to(torch.float8_e4m3fn)
    elif cache == "int8":
        k_store, v_store = (k / scale).round().clamp(-127, 127).to(torch.int8), \
                           (v / scale).round().clamp(-127, 127).to(torch.int8)
    else:
        k_store, v_store, scale = k.to(_dtype(cache)), v.to(_dtype(cache)), 1.0
    out = kernels.decode_attention(q, k_store, v_store, tables, lens, BLOCK, scale, scale)
    assert out.dtype == act_dt and out.shape == q.shape
    for b in range(batch):
        n = int(lens[b])
        slots = (tables[b][:, None] * BLOCK + torch.arange(BLOCK)).reshape(-1)[:n]
        keys = (k_store[slots].float() * scale).repeat_interleave(heads // kv_heads, dim=1)
        values = (v_store[slots].float() * scale).repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("hd,thd->ht", q[b].float(), keys) / head_dim ** 0.5
        expected = torch.einsum("ht,thd->hd", scores.softmax(-1), values)
        tolerance = 1e-5 if act == "fp32" else 1e-2  # bf16 output: relative, the rounding is (it failed on a 4.3)
        assert ((out[b].float() - expected).abs() <= tolerance * expected.abs().clamp(min=1.0)).all(), b


@pytest.mark.parametrize("act", ["fp32", "bf16"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "int8"])
def test_kv_cache_write_stores_the_bytes_the_torch_write_stores(kernels, act, kv_cache_dtype):
    """A prompt step's K and V from the fused qkv rows into the cache at scattered slots: the same bytes as
    PagedKVCache.write (a copy, or value / scale rounded to fp8 or int8 after clamping), other slots untouched."""
    import torch

    from toolkit.engine.runtime.kv_cache import PagedKVCache

    caches = [PagedKVCache(num_layers=1, num_blocks=8, block_size=BLOCK, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                           compute_dtype=_dtype(act), kv_cache_dtype=kv_cache_dtype,
                           scales=[{"k": 0.02, "v": 0.05}]) for _ in range(2)]
    qkv = (torch.randn(21, (HEADS + 2 * KV_HEADS) * HEAD_DIM) * 8).to(_dtype(act))  # some past fp8's and int8's range
    slots = torch.randperm(8 * BLOCK)[:21]
    q_cols, kv_cols = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    caches[0].write(0, slots, qkv[:, q_cols:q_cols + kv_cols].reshape(21, KV_HEADS, HEAD_DIM),
                    qkv[:, q_cols + kv_cols:].reshape(21, KV_HEADS, HEAD_DIM))
    c = caches[1]
    kernels.write_kv_cache(qkv, HEADS, KV_HEADS, HEAD_DIM, slots, c.k[0], c.v[0], c.k_scale[0], c.v_scale[0])
    for torch_written, c_written in ((caches[0].k[0], c.k[0]), (caches[0].v[0], c.v[0])):
        assert torch.equal(torch_written.view(torch.uint8), c_written.view(torch.uint8))
    assert caches[0].k[0].view(torch.uint8)[slots].any()  # something was written


def _stored(k, v, cache):
    """k, v as a cache of `cache` dtype stores them, and the scale that gives them back."""
    import torch

    scale = 0.05
    if cache == "fp8":
        return (k / scale).to(torch.float8_e4m3fn), (v / scale).to(torch.float8_e4m3fn), scale
    if cache == "int8":
        return ((k / scale).round().clamp(-127, 127).to(torch.int8),
                (v / scale).round().clamp(-127, 127).to(torch.int8), scale)
    return k.to(torch.bfloat16), v.to(torch.bfloat16), 1.0


def _causal_reference(q_rows, k_store, v_store, scale, table, ctx, heads, kv_heads, head_dim):
    """fp32 attention of q_rows [n, heads, head_dim] at the context's last n positions, each over the tokens up to it."""
    import torch

    slots = (table[:, None] * BLOCK + torch.arange(BLOCK)).reshape(-1)[:ctx]
    keys = (k_store[slots].float() * scale).repeat_interleave(heads // kv_heads, dim=1)
    values = (v_store[slots].float() * scale).repeat_interleave(heads // kv_heads, dim=1)
    out = []
    for i, q in enumerate(q_rows):
        seen = ctx - len(q_rows) + i + 1
        scores = torch.einsum("hd,thd->ht", q.float(), keys[:seen]) / head_dim ** 0.5
        out.append(torch.einsum("ht,thd->hd", scores.softmax(-1), values[:seen]))
    return torch.stack(out)


# A whole prompt (37 rows over 37 tokens: items of 16 rows, the last short), a later chunk (21 rows after 59 tokens),
# one of 3 rows after 14 (fewer rows than a vector's lanes), over scattered blocks. Query heads per kv head 3, 1
# (48 rows an item), 9 (5 rows, 45 lanes); head_dim 64 and 128.
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(HEADS, KV_HEADS, HEAD_DIM), (4, 4, 64), (18, 2, 128)])
@pytest.mark.parametrize("cache", ["bf16", "fp8", "int8"])
@pytest.mark.parametrize("amx", [False, True])
def test_chunk_attention_equals_causal_attention_over_the_gathered_context(kernels, heads, kv_heads, head_dim,
                                                                           cache, amx):
    import torch

    if not kernels.chunk_attention_rows(torch.bfloat16, torch.bfloat16, head_dim, heads // kv_heads):
        pytest.skip("no AVX512-BF16 here: prompt chunks stay on the decode kernel row by row")
    if amx and not kernels.has_amx:
        pytest.skip("no AMX tiles here")
    torch.manual_seed(heads + head_dim)
    k, v, _, _ = _paged(cache, head_dim, kv_heads)
    k_store, v_store, scale = _stored(k, v, cache)
    tables = torch.tensor([[5, 9, 2, 30, 17, 0, 0, 0, 0, 0], [11, 12, 13, 14, 15, 16, 18, 19, 20, 21],
                           [39, 1, 0, 0, 0, 0, 0, 0, 0, 0]])
    chunks = torch.tensor([[0, 37, 37], [37, 21, 80], [58, 3, 14]])
    q = torch.randn(61, heads, head_dim).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    kernels.chunk_attention(q, k_store, v_store, tables, chunks, BLOCK, scale, scale, out, amx=amx)
    for s, (first, rows, ctx) in enumerate(chunks.tolist()):
        expected = _causal_reference(q[first:first + rows], k_store, v_store, scale, tables[s], ctx, heads, kv_heads,
                                     head_dim)
        got = out[first:first + rows].float()
        # bf16 q, K and numerators as the decode kernel's bf16 path, its output rounded to bf16
        assert ((got - expected).abs() <= 1e-2 * expected.abs().clamp(min=1.0)).all(), s


def test_decode_attention_skips_rows_of_context_zero_that_chunk_attention_fills(kernels):
    """A step with a prompt chunk and decode rows: the decode kernel leaves the chunk's rows (context 0) as they were,
    chunk_attention writes only them; together, every row equals the decode kernel's row by row."""
    import torch

    if not kernels.chunk_attention_rows(torch.bfloat16, torch.bfloat16, HEAD_DIM, HEADS // KV_HEADS):
        assert kernels.chunk_min_rows(torch.bfloat16, torch.bfloat16, HEAD_DIM, HEADS // KV_HEADS) == float("inf")
        pytest.skip("no AVX512-BF16 here: prompt chunks stay on the decode kernel row by row")
    # the engine's and the planner's rule: chunks from CHUNK_MIN_LANES lanes of rows x query heads per kv head
    from toolkit.engine.runtime.native_kernels import CHUNK_MIN_LANES

    assert kernels.chunk_min_rows(torch.bfloat16, torch.bfloat16, 64, 3) == -(-CHUNK_MIN_LANES // 3) == 8
    assert kernels.chunk_min_rows(torch.bfloat16, torch.bfloat16, 64, 5) == 5
    k, v, tables, lens = _paged("bf16")
    k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
    # row 0: a decode of sequence 0 (37 tokens); rows 1-20: sequence 2's chunk of 20 rows ending at 80; row 21: sequence 4
    rows_table = torch.cat([tables[0:1], tables[2:3].repeat(20, 1), tables[4:5]])
    row_lens = torch.tensor([37] + list(range(61, 81)) + [17])
    q = torch.randn(22, HEADS, HEAD_DIM).to(torch.bfloat16)
    row_by_row = kernels.decode_attention(q, k, v, rows_table, row_lens, BLOCK, 1.0, 1.0)
    out = torch.full_like(q, float("nan"))
    skipped = torch.tensor([37] + [0] * 20 + [17])
    kernels.decode_attention(q, k, v, rows_table, skipped, BLOCK, 1.0, 1.0, out=out)
    assert torch.isnan(out[1:21].float()).all() and torch.equal(out[0], row_by_row[0]) and torch.equal(out[21], row_by_row[21])
    kernels.chunk_attention(q, k, v, tables[2:3], torch.tensor([[1, 20, 80]]), BLOCK, 1.0, 1.0, out)
    assert torch.equal(out[0], row_by_row[0]) and torch.equal(out[21], row_by_row[21])
    assert (out[1:21].float() - row_by_row[1:21].float()).abs().max().item() < 2e-2


def test_runner_with_fused_kernels_equals_its_torch_path_in_fp32(tiny_model_dir):
    """Mixed prefill/decode steps over shuffled blocks: the fused path and the torch-op path agree."""
    import random

    import torch

    from toolkit.engine.runtime.model_runner import ModelRunner

    runners = [ModelRunner(tiny_model_dir, num_blocks=32, block_size=BLOCK, dtype="fp32", native=native)
               for native in (True, False)]
    assert runners[0].native is not None and runners[1].native is None
    blocks = list(range(32))
    random.Random(1).shuffle(blocks)
    tables = {0: blocks[:6], 1: blocks[6:12]}
    prompts = {0: list(range(5, 30)), 1: [7, 3, 9, 11, 200, 13]}

    schedule = [{0: (0, prompts[0])}, {0: (25, [40]), 1: (0, prompts[1])}, {0: (26, [41]), 1: (6, [42])},
                {0: (27, [43]), 1: (7, [44])}]
    for chunks in schedule:
        fused, reference = (r.forward(_step(tables, chunks)) for r in runners)
        assert (fused - reference).abs().max().item() < 1e-4


def _step(tables, chunks):
    """A runner step: chunks {seq: (start position, tokens)} over the sequences' block tables {seq: blocks}."""
    import torch

    from toolkit.engine.runtime.step import StepInput

    ids, pos, slots, qlens, ctxs, tabs, rows = [], [], [], [], [], [], []
    for seq, (start, toks) in chunks.items():
        for i, t in enumerate(toks):
            p = start + i
            ids.append(t), pos.append(p), slots.append(tables[seq][p // BLOCK] * BLOCK + p % BLOCK)
        qlens.append(len(toks)), ctxs.append(start + len(toks)), tabs.append(tables[seq])
        rows.append(len(ids) - 1)
    return StepInput(torch.tensor(ids), torch.tensor(pos), qlens, ctxs, tabs, torch.tensor(slots), torch.tensor(rows))


def test_runner_prompt_chunks_on_chunk_attention_equal_the_row_kernel_in_bf16(tiny_model_dir):
    """Steps mixing whole prompts, a later chunk and decodes in bf16: the runner's plan sends chunks of enough rows to
    chunk_attention and the rest row by row; the logits stay within bf16 noise of every row on the row kernel."""
    import random

    import torch

    from toolkit.engine.runtime.model_runner import ModelRunner

    runners = [ModelRunner(tiny_model_dir, num_blocks=32, block_size=BLOCK, dtype="bf16") for _ in range(2)]
    if runners[0]._chunk_rows == float("inf"):
        pytest.skip("no AVX512-BF16 here: prompt chunks stay on the decode kernel row by row")
    runners[1]._chunk_rows = float("inf")  # the reference: every row on the decode kernel
    blocks = list(range(32))
    random.Random(2).shuffle(blocks)
    tables = {0: blocks[:10], 1: blocks[10:20], 2: blocks[20:30]}
    prompts = {0: list(range(5, 45)), 1: [7, 3, 9, 11, 200, 13, 17, 19, 23, 29, 31, 37, 41, 43], 2: [8, 9, 10]}

    # a whole prompt; a decode beside a prompt and a 3-row chunk (row by row); a decode beside a later chunk of 20
    schedule = [{0: (0, prompts[0][:20])}, {0: (20, prompts[0][20:]), 1: (0, prompts[1]), 2: (0, prompts[2])},
                {0: (40, [50]), 1: (14, list(range(60, 80))), 2: (3, [11])}]
    plan = runners[0]._native_attention_plan(_step(tables, schedule[2]))
    assert plan[3].tolist() == [[1, 20, 34]] and plan[1].tolist()[0] == 41 and plan[1].tolist()[1:21] == [0] * 20
    for chunks in schedule:
        chunked, row_by_row = (r.forward(_step(tables, chunks)) for r in runners)
        assert (chunked - row_by_row).abs().max().item() < 0.05 * row_by_row.abs().max().item()


def test_bf16_gemm_rows_do_not_depend_on_the_batch(kernels):
    """From BF16_BLOCK_MIN rows the bf16 GEMM runs 4 outputs per block, below it one: both sum each output in
    one order, so a row's result is the same bits at every batch size (and where N % 4 leaves the tile path)."""
    import torch

    if not kernels.has_bf16_gemm:
        pytest.skip("this CPU has neither AVX512-BF16 nor AVX2 + FMA")
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(31, 768, generator=gen).to(torch.bfloat16)
    for n in (300, 302):
        w = torch.randn(n, 768, generator=gen).to(torch.bfloat16)
        alone = torch.cat([kernels.gemm_bf16(x[i:i + 1], w) for i in range(31)])
        for rows in (2, 7, 8, 13, 16, 31):
            assert torch.equal(kernels.gemm_bf16(x[:rows], w), alone[:rows])
        expected = x.float() @ w.float().t()
        assert (alone.float() - expected).abs().max().item() <= 0.01 * expected.abs().max().item()


@pytest.mark.parametrize("rows", [1, 3, 8, 13, 16])
def test_few_row_gemms_equal_torch(kernels, rows):
    """bf16 (AVX512-BF16 dot products or AVX2 FMAs, fp32 accumulation) and int8 (widened in registers) against torch."""
    import torch

    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 768, generator=gen).to(torch.bfloat16)
    if kernels.has_bf16_gemm:
        w = torch.randn(300, 768, generator=gen).to(torch.bfloat16)
        expected = x.float() @ w.float().t()
        assert (kernels.gemm_bf16(x, w).float() - expected).abs().max().item() <= 0.01 * expected.abs().max().item()
    q = torch.randint(-127, 128, (300, 768), generator=gen, dtype=torch.int8)
    scale = torch.rand(300, generator=gen) * 0.01
    expected = x.float() @ (q.float() * scale[:, None]).t()
    for act in (torch.float32, torch.bfloat16):
        got = kernels.gemm_int8(x.to(act), q, scale)
        assert got.dtype == act
        assert (got.float() - expected).abs().max().item() <= 0.01 * expected.abs().max().item()


@pytest.mark.parametrize("name", ["bf16", "int8a8", "fp8", "int4", "w4a8"])
def test_the_probes_step_pass_runs_the_kernels_the_step_runs_bit_for_bit(kernels, name):
    """step_linears_seconds (the planner's probe times few-row GEMMs with it, as the C decode step runs them: each
    thread's share in one region, or each kernel in turn): the same kernel, so its output equals the linear called from
    Python bit for bit, at a row count of every kernel's branch."""
    import torch

    from toolkit.engine.runtime import native_kernels
    from toolkit.plan.cpu_probe import _kernel

    if kernels is not native_kernels.load():
        pytest.skip("the probe's linears run on this CPU's own build (march native)")
    _, _, linear = _kernel(name, 512, 768)
    native = linear.native_linear()
    x = torch.randn(17, 768).to(torch.bfloat16)
    if native is None or kernels.step_linears_seconds([native], x[:1]) is None:
        pytest.skip(f"the C step does not run {name} here (kernel {getattr(native, 'kind', None)})")
    for rows in (1, 2, 5, 17):
        out = torch.full((rows, 512), float("nan"), dtype=torch.bfloat16)
        seconds = kernels.step_linears_seconds([native, native], x[:rows], calls=3, out=out)
        assert seconds > 0
        assert torch.equal(out, linear(x[:rows]))


@pytest.mark.parametrize("rows", [1, 2, 5, 8, 11])
def test_int4_gemm_and_its_bf16_widening_equal_the_dequantized_weights(kernels, rows):
    import torch

    if not kernels.has_bf16_gemm:
        pytest.skip("this CPU has neither AVX512-BF16 nor AVX2 + FMA: int4 stays on torch's kernel")
    gen = torch.Generator().manual_seed(rows)
    values = torch.randint(-8, 8, (96, 512), generator=gen)
    scales = torch.rand(96, 512 // 128, generator=gen) * 0.1
    packed = kernels.pack_int4(values)
    assert packed.shape == (96, 256) and packed.dtype == torch.uint8
    dequantized = (values.float().reshape(96, -1, 128) * scales[:, :, None]).reshape(96, 512)
    widened = kernels.unpack_int4(packed, scales, 128)
    assert torch.equal(widened, dequantized.to(torch.bfloat16))  # q * scale, rounded once
    x = torch.randn(rows, 512, generator=gen).to(torch.bfloat16)
    expected = x.float() @ dequantized.t()
    got = kernels.gemm_int4(x, packed, scales, 128).float()
    assert (got - expected).abs().max().item() <= 0.01 * expected.abs().max().item()



@pytest.mark.parametrize("rows, group", [(1, 128), (2, 128), (3, 128), (5, 128), (8, 128), (16, 128), (31, 128),
                                         (1, 256), (2, 256), (5, 256)])
def test_int4_gemm_on_int8_activations_equals_the_rounded_product_at_every_batch(kernels, rows, group):
    """gemm_int4_a8: x rounded to int8 per 128 inputs (scale max |x| / 127, to nearest even), times the int4 weights
    exactly in integers, then the two scales in fp32: equal to that product in float up to fp32 summation and the
    output's bf16 rounding; and each row's result is the same bits alone as inside a batch (prompt chunks run on
    it too). Groups of 256: each scale serves two of the kernel's 128s."""
    import torch

    if not kernels.has_int4_a8:
        pytest.skip("this CPU has no AVX512-VNNI + AVX512-BF16: INT4-AWQ keeps bf16 activations")
    gen = torch.Generator().manual_seed(rows)
    n, k = 90, 768  # not a multiple of the kernel's 16 rows per block: the last block padded
    values = torch.randint(-8, 8, (n, k), generator=gen)
    scales = torch.rand(n, k // group, generator=gen) * 0.1
    packed, lanes = kernels.pack_int4_lanes(values), kernels.lane_scales(scales)
    x = (torch.randn(rows, k, generator=gen) * 3).to(torch.bfloat16)
    x[0, :128] = 0  # an all-zero group (scale 1, all zeros)
    groups = x.float().reshape(rows, -1, 128)
    step = (groups.abs().amax(-1, keepdim=True) / 127).where(groups.abs().amax(-1, keepdim=True) > 0, torch.ones(1))
    rounded = (torch.round(groups / step) * step).reshape(rows, k)
    dequantized = (values.float().reshape(n, -1, group) * scales[:, :, None]).reshape(n, k)
    expected = rounded @ dequantized.t()
    got = kernels.gemm_int4_a8(x, packed, lanes, group, n)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    assert (got.float() - expected).abs().max().item() <= 0.01 * expected.abs().max().item()
    for row in {0, rows - 1}:
        assert torch.equal(kernels.gemm_int4_a8(x[row:row + 1], packed, lanes, group, n), got[row:row + 1])
    # W4A8: the fp8 rounding in the kernel's pass equals rounding first (as prefill's rows are rounded)
    assert torch.equal(kernels.gemm_int4_a8(x, packed, lanes, group, n, fp8_scale=0.02),
                       kernels.gemm_int4_a8(kernels.round_activations(x, "fp8", 0.02), packed, lanes, group, n))

def test_linears_take_the_fused_gemm_for_few_rows_only(kernels, monkeypatch):
    """Decode-sized inputs go to the C GEMMs; prefill-sized ones to whichever kernel runs that format's prompt chunks
    (the same C kernel for INT8-SQ, int4 x int8 and fp8 where prompt GEMMs run in bf16; else the weights widened for
    torch's GEMM: faster there, measured)."""
    import torch

    from toolkit.engine.runtime import kernels as linear_kernels

    calls = []
    has_amx = kernels.has_amx
    monkeypatch.setattr(kernels, "has_amx", False)  # the AVX-512 paths first (what a CPU without AMX runs)
    for name in ("gemm_bf16", "gemm_int8", "gemm_int8_vnni", "quantize_int8", "gemm_int4", "unpack_int4", "gemm_int4_a8",
                 "gemm_fp8", "widen_fp8", "gemm_bf16_amx", "gemm_int8_amx"):
        if not hasattr(kernels, name):
            continue
        original = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _f=original, _n=name, **kw: calls.append(_n) or _f(*a, **kw))
    dense = linear_kernels.DenseLinear(torch.randn(64, 768), torch.bfloat16, kernels)
    int8 = linear_kernels.Int8Linear(torch.randint(-127, 128, (64, 768), dtype=torch.int8), torch.rand(64),
                                     torch.bfloat16, native=kernels)
    int4 = linear_kernels.Int4Linear(torch.randint(-8, 8, (64, 768)), torch.rand(64, 6), 128, torch.bfloat16,
                                     native=kernels, int4_activations="bf16")
    int4_a8 = linear_kernels.Int4Linear(torch.randint(-8, 8, (64, 768)), torch.rand(64, 6), 128, torch.bfloat16,
                                        native=kernels)  # int8 activations where the CPU has VNNI (the default)
    cases = [(int8, "gemm_int8", linear_kernels.NATIVE_INT8_ROWS, [])]
    if kernels.has_int8_vnni:  # INT8-SQ (int8 activations) on the integer kernel
        int8_sq = linear_kernels.Int8Linear(torch.randint(-127, 128, (64, 768), dtype=torch.int8), torch.rand(64),
                                            torch.bfloat16, "int8", torch.tensor(0.02), native=kernels)
        # prompt chunks on the same kernel (its layout is the only copy of the weights)
        cases.append((int8_sq, "gemm_int8_vnni", linear_kernels.NATIVE_INT8_VNNI_ROWS, ["gemm_int8_vnni"]))
    if kernels.has_bf16_gemm:  # int4 in the fused layout, prefill widened to bf16 for the dense GEMM
        cases += [(dense, "gemm_bf16", linear_kernels.NATIVE_BF16_ROWS, []),
                  (int4, "gemm_int4", linear_kernels.WIDEN_ROWS - 1, ["unpack_int4"])]
    if kernels.has_fp8_gemm:
        fp8 = linear_kernels.Fp8Linear(torch.randn(64, 768).to(torch.float8_e4m3fn), torch.rand(64), torch.bfloat16,
                                       "fp8", torch.tensor(0.01), native=kernels)
        cases.append((fp8, "gemm_fp8", linear_kernels.NATIVE_FP8_ROWS,
                      ["widen_fp8"] if linear_kernels.prefill_in_fp32() else ["gemm_fp8"]))
    if kernels.has_int4_a8:  # its own layout (output rows in the lanes), prompt chunks on the same kernel
        cases.append((int4_a8, "gemm_int4_a8", linear_kernels.WIDEN_ROWS - 1, ["gemm_int4_a8"]))
    if has_amx:  # with AMX, bf16 and INT8-SQ on its tiles at every row count, decode and prefill alike
        monkeypatch.setattr(kernels, "has_amx", True)
        amx_dense = linear_kernels.DenseLinear(torch.randn(64, 768), torch.bfloat16, kernels)
        amx_int8 = linear_kernels.Int8Linear(torch.randint(-127, 128, (64, 768), dtype=torch.int8), torch.rand(64),
                                             torch.bfloat16, "int8", torch.tensor(0.02), native=kernels)
        assert amx_dense.weight is None and amx_int8.weight is None  # the weights live in tiles only
        cases += [(amx_dense, "gemm_bf16_amx", 1, ["gemm_bf16_amx"]), (amx_dense, "gemm_bf16_amx", 200, ["gemm_bf16_amx"]),
                  (amx_int8, "gemm_int8_amx", 1, ["gemm_int8_amx"]), (amx_int8, "gemm_int8_amx", 200, ["gemm_int8_amx"])]
    for linear, name, small, above in cases:
        calls.clear()
        linear(torch.randn(small, 768).to(torch.bfloat16))
        assert calls == [name]
        calls.clear()
        linear(torch.randn(small + 1, 768).to(torch.bfloat16))
        assert calls == above


def _need_amx(kernels):
    if not kernels.has_amx:
        pytest.skip("this CPU (or its OS) has no AMX tiles: bf16 and INT8-SQ stay on the AVX-512 kernels")


@pytest.mark.parametrize("shape", [(48, 64), (1280, 768), (96, 2048)])
def test_amx_tiles_round_trip_and_the_bf16_gemm_equals_an_fp32_reference(kernels, shape):
    """Weights packed into AMX tiles unpack to themselves; the tile GEMM at decode and prompt row counts (a partial
    16-row chunk included) equals x @ w.T in fp32, rounded once to bf16 (up to the summation order)."""
    import torch

    _need_amx(kernels)
    n, k = shape
    gen = torch.Generator().manual_seed(n + k)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16)
    packed = kernels.pack_amx(w, "bf16")
    assert torch.equal(kernels.unpack_amx(packed, n, k, torch.bfloat16), w)
    for rows in (1, 5, 16, 17, 40):
        x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
        exact = x.float() @ w.float().t()
        got = kernels.gemm_bf16_amx(x, packed, n)
        assert got.shape == (rows, n) and got.dtype == torch.bfloat16
        assert ((got.float() - exact).abs() <= 2 ** -8 * exact.abs() + 1e-4 * exact.abs().max()).all()


@pytest.mark.parametrize("act_quant", [None, "fp8"])
def test_fp8_on_amx_equals_the_avx512_fp8_gemm(kernels, act_quant):
    """FP8 on AMX: the fp8 tiles widened by the AVX-512 kernel's shift, the activations rounded and shifted as there:
    the same products, so the outputs agree up to the summation order, at decode and prompt row counts."""
    import torch

    _need_amx(kernels)
    if not kernels.has_fp8_gemm:
        pytest.skip("this CPU has no AVX512-BF16 for the reference fp8 kernel")
    gen = torch.Generator().manual_seed(17)
    w = (torch.randn(96, 768, generator=gen) * 0.05).to(torch.float8_e4m3fn)
    scale = torch.rand(96, generator=gen) * 0.1 + 0.01
    packed = kernels.pack_amx(w, "fp8")
    assert torch.equal(kernels.unpack_amx(packed, 96, 768, torch.float8_e4m3fn).view(torch.uint8), w.view(torch.uint8))
    for rows in (1, 3, 16, 17, 40):
        x = (torch.randn(rows, 768, generator=gen) * 2).to(torch.bfloat16)
        reference = kernels.gemm_fp8(x, kernels.pack_fp8(w), scale, act_quant, 0.01).float()
        got = kernels.gemm_fp8_amx(x, packed, scale, 96, act_quant, 0.01).float()
        assert ((got - reference).abs() <= 2 ** -7 * reference.abs() + 1e-3 * reference.abs().max()).all()


def test_int4_on_amx_equals_the_avx512_int4_gemm(kernels):
    """INT4 on AMX: nibbles widened to exact bf16 integers, each group's sums times its scale in fp32, as the AVX-512
    kernel does: equal up to the summation order, at decode and prompt row counts (K of several groups)."""
    import torch

    _need_amx(kernels)
    gen = torch.Generator().manual_seed(23)
    values = torch.randint(-8, 8, (96, 768), generator=gen)
    scales = torch.rand(96, 768 // 128, generator=gen) * 0.01 + 0.001
    packed = kernels.pack_amx_int4(values)
    for rows in (1, 2, 16, 17, 40):
        x = torch.randn(rows, 768, generator=gen).to(torch.bfloat16)
        reference = kernels.gemm_int4(x, kernels.pack_int4(values), scales, 128).float()
        got = kernels.gemm_int4_amx(x, packed, scales.t().contiguous(), 128, 96).float()
        assert ((got - reference).abs() <= 2 ** -7 * reference.abs() + 1e-3 * reference.abs().max()).all()


def test_int4_x_int8_on_amx_tiles_equals_the_vnni_kernel_bit_for_bit(kernels, monkeypatch):
    """The int4 x int8 kernel's prompt chunks on AMX tiles (the same lanes layout, nibbles split into int8 tiles) sum
    the same integers per 128 and scale them in its order: the same bits at decode and prompt row counts, partial
    blocks of 16 outputs and of 16 rows, groups of 128 and 256, W4A8's fp8 rounding. And an INT4 linear on an AMX CPU
    keeps that layout (not the bf16 tiles): decode rows on VNNI, from INT4_A8_AMX_ROWS rows on the tiles."""
    import torch

    from toolkit.engine.runtime import kernels as linear_kernels

    _need_amx(kernels)
    gen = torch.Generator().manual_seed(29)
    for n, k, group in ((100, 768, 128), (64, 512, 256), (2304, 768, 128)):
        values = torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int8)
        scales = torch.rand(n, k // group, generator=gen) * 0.01 + 0.001
        packed, lanes = kernels.pack_int4_lanes(values), kernels.lane_scales(scales)
        for rows in (1, 15, 16, 17, 40, 129):
            x = (torch.randn(rows, k, generator=gen) * 3).to(torch.bfloat16)
            for fp8_scale in (None, 0.05):
                vnni = kernels.gemm_int4_a8(x, packed, lanes, group, n, fp8_scale)
                tiles = kernels.gemm_int4_a8(x, packed, lanes, group, n, fp8_scale, tiles=True)
                assert torch.equal(vnni.view(torch.int16), tiles.view(torch.int16)), (n, k, group, rows, fp8_scale)
    linear = linear_kernels.Int4Linear(torch.randint(-8, 8, (64, 768)), torch.rand(64, 6), 128, torch.bfloat16,
                                       native=kernels)
    assert linear.int8_activations and not linear.amx
    tiled = []
    original = kernels.gemm_int4_a8
    monkeypatch.setattr(kernels, "gemm_int4_a8", lambda *a, tiles=False: tiled.append(tiles) or original(*a, tiles=tiles))
    for rows in (1, linear_kernels.INT4_A8_AMX_ROWS - 1, linear_kernels.INT4_A8_AMX_ROWS, 128):
        linear(torch.randn(rows, 768).to(torch.bfloat16))
    assert tiled == [False, False, True, True]
    bf16_acts = linear_kernels.Int4Linear(torch.randint(-8, 8, (64, 768)), torch.rand(64, 6), 128, torch.bfloat16,
                                          native=kernels, int4_activations="bf16")
    assert bf16_acts.amx  # int4_activations: bf16 keeps the bf16 tiles


@pytest.mark.parametrize("in_features", [768, 200])
def test_int8_sq_on_amx_equals_the_vnni_kernel_bit_for_bit(kernels, in_features):
    """INT8-SQ on AMX tiles (K padded to 64 with zero weights) sums the same integers as the VNNI kernel and scales
    them in its order: outputs equal at every row count, in both activation dtypes."""
    import torch

    _need_amx(kernels)
    gen = torch.Generator().manual_seed(in_features)
    w = torch.randint(-127, 128, (96, in_features), generator=gen, dtype=torch.int8)
    scale = torch.rand(96, generator=gen) * 0.01
    packed = kernels.pack_amx(w, "int8")
    assert torch.equal(kernels.unpack_amx(packed, 96, in_features, torch.int8), w)
    for dtype in (torch.float32, torch.bfloat16):
        for rows in (1, 3, 16, 17, 40):
            x = (torch.randn(rows, in_features, generator=gen) * 2).to(dtype)
            x[0, :2] = torch.tensor([1e4, -1e4])
            vnni = kernels.gemm_int8_vnni(x, kernels.pack_int8_lanes(w, scale), 0.02)
            assert torch.equal(kernels.gemm_int8_amx(x, packed, scale, 96, 0.02), vnni)


@pytest.mark.parametrize("act_quant", ["int8", "fp8"])
def test_int8_gemm_rounds_activations_as_modelopt_calibrated(kernels, act_quant):
    """The activation rounding fused into the int8 GEMM equals kernels.fake_quant_activation's, then the GEMM."""
    import torch

    from toolkit.engine.runtime.kernels import fake_quant_activation

    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(3, 768, generator=gen) * 3).to(torch.bfloat16)
    x[0, :4] = torch.tensor([1e4, -1e4, 0.0, 1e-6])  # clamped, clamped, zero, subnormal territory
    input_scale = torch.tensor(0.02 if act_quant == "int8" else 0.01)
    rounded = fake_quant_activation(x, act_quant, input_scale)
    widened = kernels.gemm_int8(x, torch.eye(768, dtype=torch.int8), torch.ones(768), act_quant, float(input_scale))
    assert torch.equal(widened, rounded)  # identity weights: the kernel's rounded activations, exactly
    q = torch.randint(-127, 128, (200, 768), generator=gen, dtype=torch.int8)
    scale = torch.rand(200, generator=gen) * 0.01
    expected = rounded.float() @ (q.float() * scale[:, None]).t()
    got = kernels.gemm_int8(x, q, scale, act_quant, float(input_scale)).float()
    assert (got - expected).abs().max().item() <= 0.01 * expected.abs().max().item()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_residual_add_into_rms_norm_and_swiglu_round_as_the_torch_ops(kernels, dtype):
    import torch
    import torch.nn.functional as F

    dt = _dtype(dtype)
    gen = torch.Generator().manual_seed(3)
    h, delta, w = (torch.randn(4, 768, generator=gen).to(dt) for _ in range(3))
    w = w[0]
    expected_h = h + delta
    xf = expected_h.float()
    expected = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dt)
    normed = kernels.add_rms_norm_(h, delta, w, 1e-5)
    assert torch.equal(h, expected_h)  # the residual, updated in place, rounded as `h + delta`
    tolerance = 1e-5 if dtype == "fp32" else 1e-2
    assert (normed.float() - expected.float()).abs().max().item() < tolerance
    gate_up = torch.randn(4, 2 * 512, generator=gen).to(dt)
    gate, up = gate_up.chunk(2, dim=-1)
    plain = kernels.silu_mul(gate_up)
    assert (plain.float() - (F.silu(gate) * up).float()).abs().max().item() < tolerance
    smooth = (torch.rand(512, generator=gen) + 0.5).to(dt)  # a pre_quant_scale: its product rounded as torch's
    assert torch.equal(kernels.silu_mul(gate_up, smooth), plain * smooth)
    # a prompt's o-projection input times its pre_quant_scale, in place, rounded as `x * smooth`
    x = torch.randn(40, 512, generator=gen).to(dt)
    expected_x = x * smooth
    assert kernels.smooth_rows_(x, smooth) is x and torch.equal(x, expected_x)


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 13, 40])
@pytest.mark.parametrize("in_features", [768, 200])
def test_int8_sq_gemm_on_vnni_is_exact_in_integers(kernels, rows, in_features):
    """INT8-SQ on VNNI: x rounded to int8 at input_scale (ties to even, clamped to [-128, 127]) times the int8
    weights summed exactly in integers, then scaled: equal to that integer reference up to the final rounding, and
    each row's output the same bits whatever rows come with it."""
    import torch

    if not kernels.has_int8_vnni:
        pytest.skip("this CPU has no AVX512-VNNI: INT8-SQ stays on the widening kernel")
    gen = torch.Generator().manual_seed(rows * in_features)
    input_scale = 0.02
    x = torch.randn(rows, in_features, generator=gen) * 1.5
    x[0, :6] = torch.tensor([1e4, -1e4, 0.5 * input_scale, 1.5 * input_scale, -2.5 * input_scale, 0.0])
    w = torch.randint(-127, 128, (282, in_features), generator=gen, dtype=torch.int8)  # the last 16-row block padded
    scale = torch.rand(282, generator=gen) * 0.01
    for act in (torch.float32, torch.bfloat16):
        xa = x.to(act)
        q = torch.round(xa.float() / input_scale).clamp(-128, 127).to(torch.int64)  # round() ties to even
        exact = (q @ w.to(torch.int64).t()).double() * input_scale * scale.double()[None, :]
        lanes = kernels.pack_int8_lanes(w, scale)
        got = kernels.gemm_int8_vnni(xa, lanes, input_scale)
        assert got.dtype == act
        rel = 1e-6 if act == torch.float32 else 2 ** -8
        assert ((got.double() - exact).abs() <= rel * exact.abs() + 1e-6).all()
        assert torch.equal(kernels.gemm_int8_vnni(xa[-1:], lanes, input_scale)[0], got[-1])  # integer sums


@pytest.mark.parametrize("amx", [False, True])
def test_int8_sq_prompt_rows_equal_the_decode_kernel_bit_for_bit(kernels, amx, monkeypatch):
    """INT8-SQ above the decode kernel's rows (prompt chunks, mixed steps): the same int8 activations on an int8 x
    int8 GEMM, scaled in the same order, so each row's output equals the decode kernel's for that row alone."""
    import torch

    from toolkit.engine.runtime import kernels as linear_kernels

    if not kernels.has_int8_vnni:
        pytest.skip("this CPU has no AVX512-VNNI: INT8-SQ stays on the widening kernel")
    if amx:
        _need_amx(kernels)
    monkeypatch.setattr(kernels, "has_amx", amx)
    gen = torch.Generator().manual_seed(5)
    w = torch.randint(-127, 128, (96, 200), generator=gen, dtype=torch.int8)
    linear = linear_kernels.Int8Linear(w, torch.rand(96, generator=gen) * 0.01, torch.bfloat16, "int8",
                                       torch.tensor(0.02), native=kernels)
    for dtype in (torch.float32, torch.bfloat16):
        for rows in (linear_kernels.NATIVE_INT8_VNNI_ROWS + 1, 40, 128):
            x = (torch.randn(rows, 200, generator=gen) * 2).to(dtype)
            x[0, :2] = torch.tensor([1e4, -1e4])  # clamped to the int8 range alike
            one_at_a_time = torch.cat([linear(x[i:i + 1]) for i in range(rows)])
            assert torch.equal(linear(x), one_at_a_time)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 16, 31])
def test_fp8_weights_as_int8_on_int8_activations_equal_the_rounded_product_at_every_batch(kernels, rows):
    """gemm_int8_a8 (fp8 served as int8 where fp8's own kernel cannot run, AVX2): x rounded to int8 per 128 inputs as
    gemm_int4_a8 rounds it, times the int8 weights exactly in integers, each 128's sum times its scale and the row's
    scale in fp32: that product in float up to fp32 summation and the bf16 output; a row's bits the same alone as in a
    batch; the fp8 rounding in the kernel's pass the same as rounding first."""
    import torch

    if not kernels.has_int8_a8:
        pytest.skip("this build has no int8 x int8 kernel for fp8 (VNNI or AVX2)")
    gen = torch.Generator().manual_seed(rows)
    n, k = 90, 768  # not a multiple of 16 rows: the last block padded
    values = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scale = torch.rand(n, generator=gen) * 0.01
    packed, lane_scale = kernels.pack_int8_a8(values, scale)
    x = (torch.randn(rows, k, generator=gen) * 3).to(torch.bfloat16)
    x[0, :128] = 0  # an all-zero 128 (scale 1, all zeros)
    groups = x.float().reshape(rows, -1, 128)
    amax = groups.abs().amax(-1, keepdim=True)
    step = (amax / 127).where(amax > 0, torch.ones(1))
    expected = (torch.round(groups / step) * step).reshape(rows, k) @ (values.float() * scale[:, None]).t()
    got = kernels.gemm_int8_a8(x, packed, lane_scale, n)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    assert (got.float() - expected).abs().max().item() <= 0.01 * expected.abs().max().item()
    for row in {0, rows - 1}:
        assert torch.equal(kernels.gemm_int8_a8(x[row:row + 1], packed, lane_scale, n), got[row:row + 1])
    assert torch.equal(kernels.gemm_int8_a8(x, packed, lane_scale, n, fp8_scale=0.02),
                       kernels.gemm_int8_a8(kernels.round_activations(x, "fp8", 0.02), packed, lane_scale, n))


@pytest.mark.parametrize("act_quant", ["int8", "fp8"])
def test_prefill_rounding_and_int8_widening_equal_the_torch_ops(kernels, act_quant):
    """Prefill's 8-bit helpers: activations rounded exactly as fake_quant_activation, and int8 weights widened
    to bf16 as (q * scale) rounded once."""
    import torch

    from toolkit.engine.runtime.kernels import fake_quant_activation

    gen = torch.Generator().manual_seed(11)
    input_scale = 0.02 if act_quant == "int8" else 0.01
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(40, 300, generator=gen) * 3).to(dtype)
        x[0, :3] = torch.tensor([1e4, -1e4, 0.0])
        x[1] = (torch.logspace(-8, 2, 300) * torch.randn(300, generator=gen).sign()).to(dtype)  # fp8's subnormals too
        assert torch.equal(kernels.round_activations(x, act_quant, input_scale),
                           fake_quant_activation(x, act_quant, torch.tensor(input_scale)))
    q = torch.randint(-127, 128, (70, 300), generator=gen, dtype=torch.int8)
    scale = torch.rand(70, generator=gen) * 0.01
    assert torch.equal(kernels.widen_int8(q, scale), (q.float() * scale[:, None]).to(torch.bfloat16))


@pytest.mark.parametrize("rows, k, n", [(1, 768, 200), (2, 768, 200), (5, 768, 200), (8, 768, 200), (12, 768, 200),
                                        (13, 768, 200), (31, 768, 200), (16, 2048, 200), (17, 2048, 200),
                                        (1, 768, 198), (5, 768, 201)])
# fp8_tile in passes of 3 rows (one or two: no prefetch); N not a multiple of 4: rows in turn, 2 or 1 a block
def test_fp8_gemm_computes_modelopts_fp8_values(kernels, rows, k, n):
    """FP8 on the CPU: the e4m3 bytes turned into bf16 by a shift (times 2^-120) and multiplied by the fp8-rounded
    activations in bf16 dot products: equal to the fp32 product of the exact fp8 values (subnormals, which the
    instruction reads as zero, dropped) up to summation order and the output's bf16 rounding; prefill's widened
    weights are those same values times the scale; and a row's result does not depend on the rows beside it."""
    import torch

    from toolkit.engine.runtime.kernels import fake_quant_activation

    if not kernels.has_fp8_gemm:
        pytest.skip("this build has no AVX512-BF16: fp8 weights are served as int8 x int8 activations there "
                    "(test_fp8_weights_as_int8_on_int8_activations_equal_the_rounded_product_at_every_batch)")
    gen = torch.Generator().manual_seed(rows)
    values = (torch.randn(n, k, generator=gen) * 60).to(torch.float8_e4m3fn)
    bytes_ = values.view(torch.uint8)
    bytes_[0, :8] = torch.tensor([0x00, 0x80, 0x01, 0x87, 0x08, 0x88, 0x7E, 0xFE], dtype=torch.uint8)  # 0s, subnormals, min normal, max
    subnormal = ((bytes_ & 0x78) == 0) & ((bytes_ & 0x07) != 0)
    exact = values.float().masked_fill(subnormal, 0.0)
    scale = torch.rand(n, generator=gen) * 0.01 + 1e-3
    packed = kernels.pack_fp8(values)
    assert not torch.equal(packed, bytes_)  # stored in the kernel's order
    assert torch.equal(kernels.widen_fp8(packed, scale), (exact * scale[:, None]).to(torch.bfloat16))
    x = (torch.randn(rows, k, generator=gen) * 2).to(torch.bfloat16)
    x[0, :3] = torch.tensor([1e4, -1e-6, 0.0])  # clamped; a tiny one whose products stay in fp32's range
    input_scale = 0.01
    rounded = fake_quant_activation(x, "fp8", torch.tensor(input_scale)).float()
    expected = rounded @ (exact * scale[:, None]).t()
    got = kernels.gemm_fp8(x, packed, scale, "fp8", input_scale)
    assert got.dtype == torch.bfloat16
    assert ((got.float() - expected).abs() <= 2 ** -8 * expected.abs() + 1e-4 * expected.abs().max()).all()
    assert torch.equal(kernels.gemm_fp8(x[-1:], packed, scale, "fp8", input_scale)[0], got[-1])


def test_int8_sq_weights_of_minus_128_keep_the_widening_kernel_where_the_integer_one_cannot_take_them(kernels):
    """The AVX2 port of the int8 x int8 kernel flips the weights' signs in 8 bits, which -128 does not survive: a
    checkpoint with such a weight stays on the widening kernel there (and its output stays right); elsewhere the
    integer kernel takes it."""
    import torch

    from toolkit.engine.runtime import kernels as linear_kernels

    values = torch.randint(-127, 128, (64, 768), dtype=torch.int8)
    values[3, 5] = -128
    linear = linear_kernels.Int8Linear(values, torch.rand(64), torch.bfloat16, "int8", torch.tensor(0.02),
                                       native=kernels)
    if not kernels.has_int8_vnni:
        pytest.skip("no int8 x int8 kernel on this build")
    assert (linear.vnni or linear.amx) == (not kernels.int8_weights_symmetric)  # AMX's tiles take -128 too
    x = torch.randn(3, 768).to(torch.bfloat16)
    q = torch.clamp(torch.round(x.float() / 0.02), -128, 127) * 0.02
    expected = q @ (values.float() * linear.scales_fp32[:, None]).t()
    assert (linear(x).float() - expected).abs().max().item() <= 0.01 * expected.abs().max().item()


def test_the_int8_activation_kernels_give_the_same_bits_on_every_build_this_cpu_runs():
    """gemm_int4_a8 and gemm_int8_a8 (INT4-AWQ, W4A8, fp8 served as int8) exist as AVX-512 VNNI kernels (with AVX512-BF16,
    or without it: Cascade Lake, Ice Lake) and AVX2 ones; all sum the same integers and round in the same fp32 steps, so
    a model's outputs do not depend on which of them the CPU picks: held bit for bit on every build this CPU runs."""
    import torch

    from toolkit.engine.runtime import native_kernels

    flags = native_kernels.cpu_flags()
    marches = ["native"] + (["x86-64-v3"] if native_kernels.BOTH_BUILDS_FLAGS <= flags else [])
    marches += ["cascadelake"] if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags else []
    builds = {march: native_kernels.load(None if march == "native" else march) for march in marches}
    builds = {march: k for march, k in builds.items() if k is not None and k.has_int4_a8 and k.has_int8_a8}
    if len(builds) < 2:
        pytest.skip(f"fewer than two builds with both kernels run on this CPU ({', '.join(builds) or 'none'})")
    gen = torch.Generator().manual_seed(3)
    n, k = 90, 768
    int8_values, int8_scale = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8), torch.rand(n) * 0.01
    int4_values, int4_scales = torch.randint(-8, 8, (n, k), generator=gen), torch.rand(n, k // 128) * 0.1
    for rows in (1, 2, 3, 9):
        x = (torch.randn(rows, k, generator=gen) * 3).to(torch.bfloat16)
        outputs = {}
        for march, kernels in builds.items():
            packed, lane_scale = kernels.pack_int8_a8(int8_values, int8_scale)
            outputs[march] = (kernels.gemm_int8_a8(x, packed, lane_scale, n, fp8_scale=0.02),
                              kernels.gemm_int4_a8(x, kernels.pack_int4_lanes(int4_values),
                                                   kernels.lane_scales(int4_scales), 128, n))
        first = next(iter(outputs.values()))
        for march, (int8_out, int4_out) in outputs.items():
            assert torch.equal(int8_out, first[0]) and torch.equal(int4_out, first[1]), (march, rows)


# The ISA levels whose branches of the C kernels differ and that the `kernels` fixture does not build already
# (native, and x86-64-v3: AVX2): portable loops; AVX-512 without VNNI or BF16; VNNI without BF16; BF16 with AMX.
@pytest.mark.parametrize("march", ["x86-64-v2", "skylake-avx512", "cascadelake", "sapphirerapids"])
def test_the_kernels_build_for_every_x86_level_users_run(march):
    """All of the kernels' ISA branches compile, whatever this CPU is (a Cascade Lake or Ice Lake build failed on an
    AVX512-BF16 instruction in the VNNI kernel until 2026-11-28, leaving such Xeons on torch ops). Built, not run."""
    import platform
    import subprocess

    from toolkit.compile_native import compiled_library, find_compiler
    from toolkit.engine.runtime import native_kernels

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 targets")
    code = b"\n".join((native_kernels.resources.files("toolkit.engine.runtime") / "csrc" / name).read_bytes()
                      for name in native_kernels.SOURCES)
    # -O0: the target-specific builtins are checked as always_inline functions are inlined, at any level; faster
    flags = ["-O0" if flag == "-O3" else flag for flag in native_kernels.compile_flags(march)]
    compiler = find_compiler("c")
    known = subprocess.run([compiler, f"-march={march}", "-x", "c", "-c", "/dev/null", "-o", "/dev/null"],
                           capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"{compiler} does not know -march={march}")  # an older compiler; the other targets still build
    path = compiled_library("engine_kernels_check", "libcheck.so", "decode_kernels.c", code, compiler, flags)
    assert path.is_file()
