"""Scheduling logic of the embedded engine (block accounting, chunking, reuse, full-cache policies,
drafting), driven through the real Engine loop by a paged stand-in runner.

The stand-in is not a model: it stores each new token id at its `slot_mapping` slot and computes the
next token from the whole context read back through `block_tables`. So any mistake in slots, block
tables, reuse or preemption changes its output, which is what these tests check. The engine's
behaviour with the real model runner is in test_engine_runtime.py.
"""

import pytest
import torch

from toolkit.engine.runtime.block_manager import BlockManager
from toolkit.engine.runtime.engine import Engine, RequestError
from toolkit.engine.runtime.sampling import SamplingParams
from toolkit.engine.runtime.scheduler import SchedulerConfig
from toolkit.engine.runtime.speculative import NgramIndex

VOCAB = 50


class _Spec:
    vocab_size = VOCAB


class PagedTokenRunner:
    spec = _Spec()

    def __init__(self, num_blocks, block_size, period=None):
        self.cache = torch.full((num_blocks * block_size,), -1, dtype=torch.long)
        self.block_size = block_size
        self.period = period  # next token depends only on the position: repetitive text for drafting
        self.steps = []

    def forward(self, step):
        self.steps.append(step)
        self.cache[step.slot_mapping] = step.token_ids
        rows, offset = [], 0
        for q, ctx, table in zip(step.query_lens, step.context_lens, step.block_tables):
            slots = [table[p // self.block_size] * self.block_size + p % self.block_size for p in range(ctx)]
            context = self.cache[slots].tolist()
            assert -1 not in context, "the context reads a slot nothing was written to"
            for i in range(q):
                rows.append(self._next(context[:ctx - q + i + 1]))
            offset += q
        logits = torch.stack(rows)
        return logits[step.logits_indices]

    def _next(self, prefix):
        logits = torch.zeros(VOCAB)
        if self.period:
            token = 10 + len(prefix) % self.period
        else:
            token = (sum((i + 1) * t for i, t in enumerate(prefix)) * 7 + len(prefix)) % VOCAB
        logits[token] = 5.0
        logits[(token + 1) % VOCAB] = 4.0
        return logits


def make_engine(blocks=32, block_size=4, period=None, **overrides):
    settings = dict(max_batch_size=4, max_num_tokens=64, max_seq_len=96, block_size=block_size, num_blocks=blocks)
    settings.update(overrides)
    config = SchedulerConfig(**settings)
    return Engine(PagedTokenRunner(blocks, block_size, period), config)


PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [5, 4, 3], list(range(1, 30)), [9] * 17]


def alone(prompts, n=12, **overrides):
    return [make_engine(**overrides).generate([p], n)[0] for p in prompts]


def test_batched_output_equals_alone_and_blocks_are_returned():
    engine = make_engine()
    together = engine.generate(PROMPTS, 12)
    assert together == alone(PROMPTS)
    assert all(len(t) == 12 for t in together)
    assert engine.scheduler.blocks.num_used == 0 and engine.num_requests == 0


def test_chunked_prefill_splits_a_long_prompt_on_block_boundaries():
    engine = make_engine(max_num_tokens=8)
    out = engine.generate([list(range(1, 30))], 4)
    assert out == alone([list(range(1, 30))], 4)
    prefill_chunks = [s.query_lens[0] for s in engine.runner.steps[:4]]
    assert prefill_chunks == [8, 8, 8, 5]


def test_unchunked_engine_refuses_nothing_but_runs_prompts_whole():
    engine = make_engine(max_num_tokens=40, enable_chunked_context=False)
    engine.generate([list(range(1, 30))], 2)
    assert engine.runner.steps[0].query_lens == [29]


def test_chunked_prefill_shares_steps_with_running_decodes():
    engine = make_engine(max_num_tokens=10)
    engine.add_request("short", [1, 2, 3], 20)
    engine.step()  # the short prompt is decoding now
    engine.add_request("long", list(range(1, 30)), 2)
    engine.step()
    step = engine.runner.steps[-1]
    assert step.query_lens == [1, 8]  # its decode plus an 8-token (block-aligned) chunk of the long prompt
    engine.run_until_idle()


def test_prefix_reuse_counts_hits_and_keeps_output():
    shared = list(range(1, 22))  # 5 full blocks of 4, then one token
    prompts = [shared + [30, 31], shared + [40]]
    engine = make_engine(enable_kv_cache_reuse=True)
    first = engine.generate([prompts[0]], 6)
    second = engine.generate([prompts[1]], 6)
    assert [first[0], second[0]] == alone(prompts, 6)
    counters = engine.scheduler.blocks.counters
    assert counters.reused == 5 and counters.hit_rate > 0
    assert engine.runner.steps[-6].query_lens == [2]  # only the uncached tail was computed


def test_guaranteed_no_evict_queues_and_counts_instead_of_pausing():
    engine = make_engine(blocks=12, max_batch_size=4)  # each request needs 6 blocks for 11 + 12 tokens
    out = engine.generate([PROMPTS[0]] * 3, 12)
    assert out == [alone([PROMPTS[0]])[0]] * 3
    assert engine.scheduler.counters.admission_waits == 1 and engine.scheduler.counters.preemptions == 0
    assert max(len(s.query_lens) for s in engine.runner.steps) == 2


def test_max_utilization_pauses_the_latest_request_and_recomputes_it():
    engine = make_engine(blocks=12, max_batch_size=4, batch_scheduler_policy="max_utilization")
    out = engine.generate([PROMPTS[0], PROMPTS[2], PROMPTS[3]], 12)
    assert out == alone([PROMPTS[0], PROMPTS[2], PROMPTS[3]])
    assert engine.scheduler.counters.preemptions >= 1
    assert engine.scheduler.blocks.num_used == 0


def test_ngram_drafts_are_verified_and_output_is_unchanged():
    prompt = [10, 11, 12, 13, 14, 10, 11, 12]
    plain = make_engine(period=5).generate([prompt], 20)
    engine = make_engine(period=5, max_draft_len=4)
    assert engine.generate([prompt], 20) == plain
    spec = engine.scheduler.spec
    assert spec.draft_tokens > 0 and spec.acceptance_rate > 0.5
    assert len(engine.runner.steps) < 20  # accepted drafts saved decode steps


def test_rejected_drafts_leave_output_and_blocks_right():
    prompts = [[3, 4, 5, 3, 4, 5, 3, 4], [7, 8, 7, 8, 7]]
    engine = make_engine(max_draft_len=3)
    assert engine.generate(prompts, 15) == alone(prompts, 15)
    assert engine.scheduler.spec.draft_tokens > engine.scheduler.spec.accepted_tokens
    assert engine.scheduler.blocks.num_used == 0


def test_end_id_stops_without_emitting_it():
    reference = alone([PROMPTS[1]], 12)[0]
    end = reference[3]
    out = make_engine().generate([PROMPTS[1]], 12, end_id=end)[0]
    assert out == reference[:reference.index(end)]


def test_seeded_sampling_is_reproducible_and_batch_independent():
    params = SamplingParams(temperature=1.0, top_k=2, seed=7)
    a = make_engine().generate([PROMPTS[0]], 12, sampling=params)[0]
    b = make_engine().generate([PROMPTS[1], PROMPTS[0]], 12, sampling=params)[1]
    c = make_engine().generate([PROMPTS[0]], 12, sampling=SamplingParams(temperature=1.0, top_k=2, seed=8))[0]
    assert a == b and a != c


def test_abort_frees_blocks_and_reports_finished():
    engine = make_engine()
    seen = []
    engine.add_request("a", PROMPTS[0], 30, callback=seen.append)
    engine.step()
    engine.step()
    engine.abort("a")
    engine.step()
    assert seen[-1].finished and seen[-1].finish_reason == "abort"
    assert engine.scheduler.blocks.num_used == 0 and not engine.scheduler.has_work


def test_bad_requests_name_the_fix():
    engine = make_engine(blocks=4)
    with pytest.raises(RequestError, match="max_seq_len"):
        engine.add_request("x", [1] * 90, 10)
    with pytest.raises(RequestError, match="kv_cache_blocks"):
        engine.add_request("y", [1] * 20, 10)
    with pytest.raises(RequestError, match="vocabulary"):
        engine.add_request("z", [VOCAB], 2)


def test_block_manager_evicts_least_recent_tail_first():
    blocks = BlockManager(4, 2, enable_reuse=True)
    table = blocks.allocate(3)
    for i, block in enumerate(table):
        blocks.register(block, 100 + i)
    blocks.release(table)
    assert blocks.num_free == 4 and blocks.num_used == 0
    blocks.allocate(2)  # the never-used block, then the prefix's tail
    assert 100 in blocks._block_of and 102 not in blocks._block_of


def test_ngram_index_proposes_what_followed_the_latest_match():
    index = NgramIndex(3)
    assert index.propose([1, 2, 3, 9, 1, 2, 3, 7, 1, 2], 3) == [3, 7, 1]
    assert index.propose([5, 6], 3) == []


def test_build_refuses_a_kv_cache_smaller_than_one_sequence():
    from toolkit.engine.cpu import check_cpu_limits
    from toolkit.engine.engine_config import EngineConfig
    from toolkit.errors import ToolkitError

    limits = dict(target="cpu", max_batch_size=4, max_input_len=200, max_seq_len=300, max_num_tokens=256,
                  tokens_per_block=32, qformat="none", kv_cache_dtype="none")
    with pytest.raises(ToolkitError, match=r"8 blocks x 32 tokens = 256 tokens.*max_seq_len 300.*kv_cache_blocks >= 10"):
        check_cpu_limits(EngineConfig(kv_cache_blocks=8, **limits))
    check_cpu_limits(EngineConfig(kv_cache_blocks=10, **limits))


def test_build_keeps_the_prompt_gemm_dtype_it_timed(tmp_path, tiny_model_dir):
    """A CPU engine build times bf16 against fp32 prompt GEMMs once, on this CPU, and the engine keeps the choice;
    one given in the config is kept as it is."""
    from toolkit.engine.cpu import build_cpu_engine
    from toolkit.engine.engine_config import EngineConfig

    limits = dict(target="cpu", max_batch_size=4, max_input_len=64, max_seq_len=128, max_num_tokens=128,
                  tokens_per_block=32, kv_cache_blocks=16, qformat="none", kv_cache_dtype="none")
    built = build_cpu_engine(tiny_model_dir, tmp_path / "a", EngineConfig(**limits))
    assert built["prompt_gemm_dtype"] in ("bfloat16", "float32")
    assert EngineConfig.read(tmp_path / "a").prompt_gemm_dtype == built["prompt_gemm_dtype"]
    build_cpu_engine(tiny_model_dir, tmp_path / "b", EngineConfig(prompt_gemm_dtype="bfloat16", **limits))
    assert EngineConfig.read(tmp_path / "b").prompt_gemm_dtype == "bfloat16"
    assert EngineConfig.read(tmp_path / "b").device == "cpu"


def test_engine_device_cuda_is_refused_at_build_without_a_gpu(tmp_path, tiny_model_dir):
    """engine.device: cuda serves the embedded engine on a GPU (perf/gpu_engine_generate.py checked it on an H200);
    without one the build says so, as trtllm-build would, instead of a server failing to start."""
    import torch

    from toolkit.engine.cpu import build_cpu_engine
    from toolkit.engine.engine_config import EngineConfig
    from toolkit.errors import ToolkitError

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal is for machines without one")
    limits = dict(target="cpu", max_batch_size=4, max_input_len=64, max_seq_len=128, max_num_tokens=128,
                  tokens_per_block=32, kv_cache_blocks=16, qformat="none", kv_cache_dtype="none", device="cuda")
    with pytest.raises(ToolkitError, match="sees no CUDA device") as err:
        build_cpu_engine(tiny_model_dir, tmp_path / "a", EngineConfig(**limits))
    assert "engine.device: cpu" in err.value.fix


def test_timeline_records_each_step_and_exports_a_trace(tmp_path):
    import json
    import time

    from toolkit.engine.runtime.timeline import Timeline, copy_window, read_timeline

    config = SchedulerConfig(max_batch_size=4, max_num_tokens=8, max_seq_len=96, block_size=4, num_blocks=32)
    engine = Engine(PagedTokenRunner(32, 4), config, timeline=Timeline(tmp_path / "timeline.jsonl"))
    begin = time.time()
    engine.generate([list(range(1, 20)), [1, 2, 3]], 5)
    engine.timeline.close()
    steps = read_timeline(tmp_path / "timeline.jsonl")
    assert [s.step for s in steps] == list(range(1, len(steps) + 1)) == [r.step for r in engine.timeline.records]
    assert sum(s.prefill_tokens for s in steps) == 19 + 3
    assert sum(s.decode_tokens for s in steps) == 2 * 4  # the first token of each comes from its prefill
    assert all(s.num_tokens <= 8 and s.kv_blocks_used <= 32 and s.duration >= s.forward for s in steps)
    assert steps[0].context_requests == 1 and steps[0].prefill_tokens == 8  # chunked under max_num_tokens
    out = copy_window(tmp_path / "timeline.jsonl", tmp_path, begin, time.time())
    trace = json.loads(out.with_suffix(".trace.json").read_text())
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == len(steps)


def test_timeline_file_rotates_and_is_read_across_the_rotation(tmp_path, monkeypatch):
    from toolkit.engine.runtime.timeline import Timeline, read_timeline

    monkeypatch.setattr(Timeline, "MAX_FILE_BYTES", 2000)
    timeline = Timeline(tmp_path / "t.jsonl")
    engine = Engine(PagedTokenRunner(32, 4), SchedulerConfig(max_batch_size=4, max_num_tokens=64, max_seq_len=96,
                                                             block_size=4, num_blocks=32), timeline=timeline)
    engine.generate([PROMPTS[0]], 40)
    timeline.close()
    assert (tmp_path / "t.jsonl.1").is_file() and (tmp_path / "t.jsonl").stat().st_size <= 2000
    steps = [s.step for s in read_timeline(tmp_path / "t.jsonl")]
    assert steps == list(range(steps[0], 41)) and steps[0] > 1  # the latest steps, in order, none lost between


def test_decodes_go_before_an_earlier_prompts_chunks():
    engine = make_engine(max_num_tokens=16)
    engine.add_request("a", [1, 2, 3], 2)
    engine.step()
    engine.add_request("long", list(range(1, 50)), 2)
    engine.add_request("short", [1, 2, 3], 10)
    engine.step()  # a decodes (1), long's first chunk (12, block-aligned), short's prompt (3)
    assert engine.runner.steps[-1].query_lens == [1, 12, 3]
    engine.step()  # a has finished: short decodes before long's next chunk takes the rest
    assert engine.runner.steps[-1].query_lens == [1, 12]
    engine.run_until_idle()


def test_ngram_draft_continues_a_short_loop_to_full_length():
    assert NgramIndex(3).propose([4, 5, 6, 6, 6, 6], 4) == [6, 6, 6, 6]
    assert NgramIndex(3).propose([1, 7, 8, 7, 8], 5) == [7, 8, 7, 8, 7]


def test_a_steps_int64_tensors_hold_their_values_and_outlive_the_list():
    """step.int64_tensor (the scheduler's and the benchmarks' step inputs): int64, the values in order, an empty list
    an empty tensor, any iterable of ints; the array under it lives as long as the tensor does."""
    from toolkit.engine.runtime.step import int64_tensor

    values = [3, 0, 2**40, -1]
    t = int64_tensor(values)
    values.append(7)  # the tensor is not a view of the list
    assert t.dtype == torch.int64 and t.tolist() == [3, 0, 2**40, -1]
    assert int64_tensor([]).shape == (0,) and int64_tensor([]).dtype == torch.int64
    assert int64_tensor(range(3)).tolist() == [0, 1, 2]
    made = [int64_tensor([i, i + 1]) for i in range(100)]  # each tensor keeps its own buffer
    assert [m.tolist() for m in made] == [[i, i + 1] for i in range(100)]
