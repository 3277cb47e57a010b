"""The embedded engine with its real model runner on the tiny preset: in-flight batching, chunked
prefill, prefix reuse, the full-cache policies, speculative decoding and sampling change how steps
are made, never what greedy decoding outputs.

Outputs are compared with the same engine running each prompt alone, in float32 so that batching
cannot flip a near-tie between two logits.
"""

import pytest

from toolkit.engine.runtime.engine import Engine
from toolkit.engine.runtime.metrics import TRTLLM_FAMILIES, trtllm_values
from toolkit.engine.runtime.sampling import SamplingParams
from toolkit.engine.runtime.scheduler import SchedulerConfig

BLOCK = 16
PROMPTS = [list(range(5, 5 + n)) for n in (7, 40, 23)] + [[9, 8, 7, 6, 5] * 10]


@pytest.fixture(scope="module")
def runner_factory(tiny_model_dir):
    from toolkit.engine.runtime.model_runner import ModelRunner

    def make(num_blocks):
        return ModelRunner(tiny_model_dir, num_blocks=num_blocks, block_size=BLOCK, dtype="float32", threads=1)

    return make


@pytest.fixture(scope="module")
def make_engine(runner_factory):
    runners = {}

    def make(num_blocks=64, stream_interval=1, **overrides):
        # One runner per cache size: the engine, not the runner, holds the state a test looks at.
        runner = runners.get(num_blocks) or runners.setdefault(num_blocks, runner_factory(num_blocks))
        settings = dict(max_batch_size=4, max_num_tokens=128, max_seq_len=160, block_size=BLOCK, num_blocks=num_blocks)
        return Engine(runner, SchedulerConfig(**(settings | overrides)), stream_interval=stream_interval)

    return make


@pytest.fixture(scope="module")
def alone(make_engine):
    cache = {}

    def run(prompt, n=16):
        key = (tuple(prompt), n)
        if key not in cache:
            cache[key] = make_engine().generate([prompt], n)[0]
        return cache[key]

    return run


def test_inflight_batching_output_equals_running_alone(make_engine, alone):
    engine = make_engine()
    outputs = {i: [] for i in range(len(PROMPTS))}
    # Requests arrive while others decode: each joins the running batch at the next step.
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, 16, callback=lambda out: outputs[int(out.request_id)].extend(out.new_tokens))
        engine.step()
        engine.step()
    engine.run_until_idle()
    assert [outputs[i] for i in range(len(PROMPTS))] == [alone(p) for p in PROMPTS]
    assert max(r.batch_size for r in engine.timeline.records) == len(PROMPTS)
    assert any(r.context_requests and r.generation_requests for r in engine.timeline.records)
    assert engine.scheduler.blocks.num_used == 0


def test_stream_interval_hands_tokens_over_at_the_first_every_nth_and_the_last_step(make_engine, alone):
    """TensorRT-LLM's stream_interval: fewer hand-overs (each a response through Triton), the same tokens."""
    engine = make_engine(stream_interval=3)
    chunks = {0: [], 1: []}
    for i, prompt in enumerate(PROMPTS[:2]):
        engine.add_request(str(i), prompt, 11, callback=lambda out: chunks[int(out.request_id)].append(out.new_tokens))
    engine.run_until_idle()
    for i, prompt in enumerate(PROMPTS[:2]):
        assert [t for chunk in chunks[i] for t in chunk] == alone(prompt, 11)
        assert [len(chunk) for chunk in chunks[i]] == [1, 2, 3, 3, 2]  # steps 1 | 2-3 | 4-6 | 7-9 | 10-11, the end
    assert engine.describe()["stream_interval"] == 3
    binding = engine.runner.cpu_binding  # where it runs: threads, CPUs, NUMA node
    assert engine.describe()["cpu_binding"] == binding.describe() and engine.describe()["threads"] == binding.threads
    with pytest.raises(ValueError, match="stream_interval 0"):
        make_engine(stream_interval=0)


def _long_prompt_beside_a_decode(engine):
    out = {"short": [], "long": []}
    engine.add_request("short", PROMPTS[0], 24, callback=lambda o: out[o.request_id].extend(o.new_tokens))
    engine.step()
    engine.add_request("long", PROMPTS[3], 4, callback=lambda o: out[o.request_id].extend(o.new_tokens))
    engine.run_until_idle()
    return out, [(r.prefill_tokens, r.decode_tokens) for r in list(engine.timeline.records)[1:]]


def test_chunked_prefill_changes_the_step_composition_not_the_output(make_engine, alone):
    chunked, chunked_steps = _long_prompt_beside_a_decode(make_engine(max_num_tokens=33))
    whole, whole_steps = _long_prompt_beside_a_decode(make_engine(max_num_tokens=64, enable_chunked_context=False))
    assert chunked == whole == {"short": alone(PROMPTS[0], 24), "long": alone(PROMPTS[3], 4)}
    # On: the 50-token prompt goes in block-aligned chunks beside the running decode, never over budget.
    assert chunked_steps[:2] == [(32, 1), (18, 1)]
    # Off: it goes whole in one step.
    assert whole_steps[0] == (50, 1)


def test_prefix_reuse_hits_are_counted_and_output_is_unchanged(make_engine, alone):
    shared = list(range(20, 20 + 3 * BLOCK))  # three full blocks
    first, second = shared + [7, 8, 9], shared + [11]
    engine = make_engine(enable_kv_cache_reuse=True)
    assert engine.generate([first], 8) == [alone(first, 8)]
    assert engine.generate([second], 8) == [alone(second, 8)]
    counters = engine.scheduler.blocks.counters
    assert counters.reused == 3 and counters.missed == 3  # the first request found nothing, the second all three
    second_prefill = [r.prefill_tokens for r in engine.timeline.records if r.context_requests][-1]
    assert second_prefill == 1  # only the token after the shared blocks was computed
    assert trtllm_values(engine)["nv_trt_llm_kv_cache_block_metrics"]["reused"] == 3


def test_full_cache_guaranteed_no_evict_queues_and_counts(make_engine, alone):
    # 8 blocks of 16: each request needs 4 (40 + 16 tokens): two run, the third waits its turn.
    engine = make_engine(num_blocks=8)
    out = engine.generate([PROMPTS[1]] * 3, 16)
    assert out == [alone(PROMPTS[1])] * 3
    assert engine.scheduler.counters.admission_waits == 1 and engine.scheduler.counters.preemptions == 0
    assert max(r.batch_size for r in engine.timeline.records) == 2


def test_full_cache_max_utilization_pauses_and_recomputes(make_engine, alone):
    # Admitted on their prompts' 3 + 2 + 1 blocks, they outgrow 8 blocks (4 + 3 + 2) while decoding.
    engine = make_engine(num_blocks=8, batch_scheduler_policy="max_utilization")
    prompts = [PROMPTS[1], PROMPTS[2], PROMPTS[0]]
    assert engine.generate(prompts, 16) == [alone(p) for p in prompts]
    assert engine.scheduler.counters.preemptions >= 1
    assert sum(r.preempted for r in engine.timeline.records) == engine.scheduler.counters.preemptions


def test_speculative_decoding_equals_greedy_and_reports_acceptance(make_engine, alone):
    engine = make_engine(max_draft_len=4)
    out = engine.generate(PROMPTS, 48)
    assert out == [alone(p, 48) for p in PROMPTS]
    spec = engine.scheduler.spec
    assert spec.draft_tokens > 0 and 0 < spec.acceptance_rate <= 1
    assert sum(r.accepted_tokens for r in engine.timeline.records) == spec.accepted_tokens
    assert trtllm_values(engine)  # metrics still computable with drafts in flight


def test_seeded_sampling_is_reproducible_alone_or_batched(make_engine):
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    one = make_engine().generate([PROMPTS[2]], 16, sampling=params)[0]
    batched = make_engine().generate([PROMPTS[0], PROMPTS[2]], 16, sampling=[SamplingParams(top_k=8, seed=5), params])[1]
    other = make_engine().generate([PROMPTS[2]], 16, sampling=SamplingParams(temperature=1.0, top_p=0.95, seed=99))[0]
    assert one == batched
    assert one != other


def test_metrics_carry_tensorrt_llm_names_and_consistent_values(make_engine):
    engine = make_engine()
    engine.add_request("a", PROMPTS[1], 8)
    engine.add_request("b", PROMPTS[0], 8)
    engine.step()
    values = trtllm_values(engine)
    assert {f.name: set(f.values) for f in TRTLLM_FAMILIES} == {k: set(v) for k, v in values.items()}
    kv = values["nv_trt_llm_kv_cache_block_metrics"]
    assert kv["used"] + kv["free"] == kv["max"] == 64 and kv["tokens_per"] == BLOCK and kv["used"] == 3 + 1
    requests = values["nv_trt_llm_request_metrics"]
    assert requests == {"active": 2, "max": 4, "scheduled": 2, "context": 2, "waiting": 0}
    assert values["nv_trt_llm_inflight_batcher_metrics"]["total_context_tokens"] == 47
    engine.run_until_idle()


def test_start_engine_builds_warms_up_and_steps_on_one_thread(make_engine, alone, monkeypatch):
    """A runner built on one thread and stepped on another ran 1.6x slower (engine.start_engine's
    docstring): the served engine is opened, warmed up and looped on the same thread."""
    import threading

    from toolkit.engine.runtime import engine as engine_module

    seen = {}
    engine = make_engine()
    original_step = engine.step

    def step():
        seen.setdefault("stepped_on", set()).add(threading.current_thread().name)
        return original_step()

    engine.step = step

    def fake_open(engine_dir, **options):
        seen["opened_on"] = threading.current_thread().name
        seen["options"] = options
        return engine

    monkeypatch.setattr(engine_module, "open_engine", fake_open)
    started = engine_module.start_engine("unused", warm_up_prompt=[1, 2, 3], threads=1)
    try:
        assert started is engine and seen["options"] == {"threads": 1}
        out = []
        done = threading.Event()
        started.add_request("r", PROMPTS[0], 16, callback=lambda o: (out.extend(o.new_tokens), o.finished and done.set()))
        assert done.wait(60)
        assert out == alone(PROMPTS[0])
        assert seen["stepped_on"] == {seen["opened_on"]} and seen["opened_on"] != threading.current_thread().name
    finally:
        started.stop()

    def broken_open(engine_dir, **options):
        raise ValueError("no engine here")

    monkeypatch.setattr(engine_module, "open_engine", broken_open)
    with pytest.raises(ValueError, match="no engine here"):
        engine_module.start_engine("unused")
