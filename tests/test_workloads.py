"""Workload inputs: dataset and trace loading on the shipped samples, prompt construction, schedules.
No server: `send` here records what would be sent and answers like a server would."""

import asyncio
import json
import time

import pytest

from toolkit.bench.load import LoadShape
from toolkit.bench.records import RequestRecord
from toolkit.bench.workloads import make_workload
from toolkit.bench.workloads.datasets import dataset_prompts, parse_entry, read_dataset
from toolkit.bench.workloads.multi_turn import fit_history
from toolkit.bench.workloads.trace import read_trace, schedule, shared_block_fraction
from toolkit.config import validate_config
from toolkit.data import workload_sample
from toolkit.errors import ToolkitError


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from toolkit.model.tokenizer import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def settings(**workload):
    sweep = {k: workload.pop(k) for k in list(workload) if k in ("concurrencies", "requests_per_step", "mode",
                                                                  "request_rates", "output_tokens", "duration_s")}
    raw = {"name": "w", "engine": {"max_input_len": 256, "max_seq_len": 384}, "sweep": {**sweep, "workload": workload}}
    return validate_config(raw).sweep


class FakeServer:
    """Answers every request after `delay_s` with `output_tokens` chunks of text (no network)."""

    def __init__(self, delay_s=0.0):
        self.delay_s = delay_s
        self.sent = []

    async def send(self, prompt):
        record = RequestRecord(len(self.sent), "s", time.perf_counter(), prompt.input_tokens, prompt.output_tokens,
                               request_class=prompt.request_class, session=prompt.session, turn=prompt.turn)
        self.sent.append((prompt, record.send_time))
        await asyncio.sleep(self.delay_s)
        record.chunk_times = [time.perf_counter()] * prompt.output_tokens
        record.output_text = " answer" * prompt.output_tokens
        record.end_time = time.perf_counter()
        return record


def run(workload, shape, server):
    step = workload.steps()[0]
    asyncio.run(workload.run(step, shape, server.send))
    return step


def sent_prompts(tokenizer, concurrency, requests, **workload):
    """What a workload sends for one step at `concurrency`, `requests` in all."""
    server = FakeServer()
    run(make_workload(settings(requests_per_step=requests, **workload), tokenizer),
        LoadShape("concurrency", concurrency, max_requests=requests), server)
    return [p for p, _ in server.sent]


def test_sharegpt_sample_takes_first_user_turn_and_reply():
    entries = read_dataset(workload_sample("sharegpt_sample.json"))
    assert len(entries) == 8  # the conversation without a reply is skipped, as vLLM's benchmark does
    assert entries[0].text.startswith("What does a paged KV cache")
    assert entries[0].reply.startswith("It stores")


def test_prompt_lines_in_every_spelling():
    assert parse_entry({"text": "a", "output_length": 5}).output_tokens == 5
    assert parse_entry({"text_input": "b"}).text == "b"
    assert parse_entry({"prompt": "c", "max_tokens": 7}).output_tokens == 7
    assert parse_entry({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}]}).reply == "r"
    assert parse_entry({"text": "  "}) is None and parse_entry([1, 2]) is None


def test_dataset_lengths_come_from_the_file_and_limits_skip(tokenizer):
    entries = read_dataset(workload_sample("prompts_sample.jsonl"))
    prompts, skipped = dataset_prompts(entries, tokenizer, default_output_tokens=20, max_input_tokens=256,
                                       max_total_tokens=384)
    assert skipped == 0 and [p.output_tokens for p in prompts] == [24, 16, 8, 20, 32, 12]
    assert all(p.input_tokens == len(tokenizer(p.text, add_special_tokens=False).input_ids) for p in prompts)
    prompts, skipped = dataset_prompts(entries, tokenizer, 20, max_input_tokens=12, max_total_tokens=30)
    assert skipped > 0 and all(p.input_tokens <= 12 and p.input_tokens + p.output_tokens <= 30 for p in prompts)


def test_bad_dataset_files_name_the_problem(tmp_path):
    with pytest.raises(ToolkitError, match="does not exist"):
        read_dataset(tmp_path / "missing.json")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(ToolkitError, match="bad.jsonl:2"):
        read_dataset(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"other": 1}\n')
    with pytest.raises(ToolkitError, match="no usable prompt"):
        read_dataset(empty)


def test_trace_sample_schedule_and_sharing():
    entries = read_trace(workload_sample("mooncake_trace_sample.jsonl"))
    assert [e.timestamp_ms for e in entries] == sorted(e.timestamp_ms for e in entries)
    assert schedule(entries, speedup=2.0)[:3] == [0.0, 0.075, 0.2]
    # 4 + 4 + 4 blocks of the shared system prompt seen again, and 2 of the other shared pair: 14 of 28
    assert shared_block_fraction(entries) == pytest.approx(14 / 28)


def test_trace_prompts_share_text_where_hash_ids_do(tokenizer):
    s = settings(kind="trace", path=str(workload_sample("mooncake_trace_sample.jsonl")), trace_block_tokens=16)
    workload = make_workload(s, tokenizer)
    first, third = workload.prompts_[0].text, workload.prompts_[2].text
    shared = tokenizer.decode(tokenizer(first, add_special_tokens=False).input_ids[:60])
    assert third.startswith(shared[:len(shared) - 8])  # the same 4 blocks of 16 tokens open both
    assert workload.prompts_[1].text[:40] != first[:40]
    assert all(abs(p.input_tokens - e.input_length) <= 3 for p, e in zip(workload.prompts_, workload.entries))


def test_trace_replays_on_its_schedule(tokenizer):
    s = settings(kind="trace", path=str(workload_sample("mooncake_trace_sample.jsonl")), trace_block_tokens=16,
                 speedup=4.0)
    workload = make_workload(s, tokenizer)
    step = workload.steps()[0]
    assert step.name == "trace_x4" and step.mode == "rate"
    server = FakeServer()
    run(workload, LoadShape("rate", step.level), server)
    sent = [t - server.sent[0][1] for _, t in server.sent]
    assert len(sent) == 8
    # 2 s of trace in 0.5 s; never early, and late only by the event loop's lag on a loaded machine
    assert all(s >= o - 0.005 for s, o in zip(sent, workload.offsets))
    assert sent == pytest.approx(workload.offsets, abs=0.2) and sent[-1] < 1.0


def test_trace_errors_name_the_line(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 3}\n{"timestamp": 1}\n')
    with pytest.raises(ToolkitError, match="t.jsonl:2"):
        read_trace(bad)


def test_shared_prefix_groups_share_their_system_prompt(tokenizer):
    prompts = sent_prompts(tokenizer, 2, 12, kind="shared_prefix", prefixes=2, prefix_tokens=48, users_per_prefix=3,
                           suffix_tokens=8)
    assert len(prompts) == 12 and {p.request_class for p in prompts} == {"prefix0", "prefix1"}
    by_class = {}
    for p in prompts:
        by_class.setdefault(p.request_class, []).append(p.text)
    heads = {c: {t[:100] for t in texts} for c, texts in by_class.items()}
    assert all(len(h) == 1 for h in heads.values()) and heads["prefix0"] != heads["prefix1"]
    assert len({p.text for p in prompts}) == 12  # every question is its own
    assert all(52 <= p.input_tokens <= 58 for p in prompts)


def test_multi_turn_resends_history_with_answers(tokenizer):
    prompts = sent_prompts(tokenizer, 2, 6, kind="multi_turn", turns=3, turn_tokens=16, think_time_s=0.0,
                           output_tokens=5)
    assert sorted((p.session, p.turn) for p in prompts) == [("s0", 0), ("s0", 1), ("s0", 2), ("s1", 0), ("s1", 1), ("s1", 2)]
    s0 = sorted((p for p in prompts if p.session == "s0"), key=lambda p: p.turn)
    assert s0[1].text.startswith(s0[0].text + " answer")  # the answer is part of the next turn's history
    assert s0[0].input_tokens < s0[1].input_tokens < s0[2].input_tokens


def test_multi_turn_history_is_cut_to_the_window(tokenizer):
    s = settings(kind="multi_turn", turns=4, turn_tokens=16, think_time_s=0.0, output_tokens=5,
                 history_tokens=20, requests_per_step=4)
    server = FakeServer()
    run(make_workload(s, tokenizer), LoadShape("concurrency", 1, max_requests=4), server)
    assert max(p.input_tokens for p, _ in server.sent) <= 20 + 16 + 2
    text = "one two three four five six"
    kept = fit_history(tokenizer, text, 2)
    assert text.endswith(kept) and len(tokenizer(kept, add_special_tokens=False).input_ids) <= 2
    assert fit_history(tokenizer, text, 1000) == text and fit_history(tokenizer, text, 0) == ""


def test_mixed_sends_long_prompts_beside_the_short_stream(tokenizer):
    s = settings(kind="mixed", long_input_tokens=120, long_output_tokens=2, long_rate=20.0, output_tokens=4,
                 requests_per_step=10)
    server = FakeServer(delay_s=0.02)
    run(make_workload(s, tokenizer), LoadShape("concurrency", 2, max_requests=10), server)
    classes = [p.request_class for p, _ in server.sent]
    assert classes.count("short") == 10 and classes.count("long") >= 1
    assert all(p.input_tokens > 100 for p, _ in server.sent if p.request_class == "long")


def test_workloads_the_engine_would_refuse_fail_before_load(tokenizer):
    with pytest.raises(ToolkitError, match="long class asks for 300 input"):
        make_workload(settings(kind="mixed", long_input_tokens=300), tokenizer)
    with pytest.raises(ToolkitError, match="no path is set"):
        make_workload(settings(kind="dataset"), tokenizer)


def test_per_class_metrics_in_the_step_summary():
    from toolkit.bench.sweep import class_metrics

    def rec(i, cls, gap):
        chunks = [1.0 + gap * k for k in range(5)]
        return RequestRecord(i, "s", 0.9, 8, 5, chunk_times=chunks, end_time=chunks[-1], output_tokens=5,
                             request_class=cls)

    records = [rec(0, "short", 0.01), rec(1, "short", 0.01), rec(2, "long", 0.05)]
    classes = class_metrics(records, None)
    assert set(classes) == {"long", "short"} and classes["short"]["request_count"] == 2
    assert classes["long"]["metrics"]["inter_token_latency"]["p50"] == pytest.approx(50.0)
    assert class_metrics(records[:2], None) is None
    back = RequestRecord.from_dict(json.loads(records[2].to_json()))
    assert back.request_class == "long"


def test_itl_against_context_per_turn():
    from toolkit.bench.sweep import turn_metrics

    def rec(i, turn, isl, gap):
        chunks = [1.0 + gap * k for k in range(5)]
        return RequestRecord(i, "s", 0.9, isl, 5, chunk_times=chunks, end_time=chunks[-1], output_tokens=5,
                             session=f"s{i % 2}", turn=turn)

    turns = turn_metrics([rec(0, 0, 24, 0.01), rec(1, 0, 26, 0.01), rec(2, 1, 70, 0.02), rec(3, 1, 72, 0.02)])
    assert [t["turn"] for t in turns] == [0, 1] and turns[1]["context_tokens_mean"] == 71
    assert turns[0]["inter_token_latency_p50_ms"] == pytest.approx(10.0)
    assert turns[1]["inter_token_latency_p50_ms"] == pytest.approx(20.0)
    assert turn_metrics([rec(0, 0, 24, 0.01)]) is None


def test_report_lines_per_class_and_per_turn():
    from toolkit.bench.metrics import calculate_metrics
    from toolkit.report.workload_tables import workload_lines

    def rec(i, cls, gap, isl):
        chunks = [1.0 + gap * k for k in range(5)]
        return RequestRecord(i, "s", 0.9, isl, 5, chunk_times=chunks, end_time=chunks[-1], output_tokens=5,
                             request_class=cls)

    step = {"classes": {"long": calculate_metrics([rec(0, "long", 0.001, 230)]),
                        "short": calculate_metrics([rec(1, "short", 0.01, 16), rec(2, "short", 0.03, 16)])},
            "turns": [{"turn": 0, "context_tokens_mean": 24.0, "inter_token_latency_p50_ms": 4.0},
                      {"turn": 1, "context_tokens_mean": 70.0, "inter_token_latency_p50_ms": 6.5}]}
    text = "\n".join(workload_lines(step))
    assert "| short | 2 / 0 | 16 | 100.0 | " in text and "| 30.0 |" in text  # longest gap of the short class
    assert "turn 0: 24 tokens → 4.00 ms; turn 1: 70 tokens → 6.50 ms" in text
    assert workload_lines({}) == []


def test_aiperf_input_file_flags_pick_the_workload():
    from toolkit.cli import SWEEP_FLAGS, _param_name, sweep_overrides

    def overrides(**given):
        flags = {_param_name(decls): None for _, decls, _ in SWEEP_FLAGS}
        flags.update(concurrencies=(), rates=(), **given)
        return sweep_overrides(flags)

    trace = overrides(input_file="t.jsonl", custom_dataset_type="mooncake_trace")
    assert trace["sweep.workload.kind"] == "trace" and trace["sweep.workload.path"] == "t.jsonl"
    assert overrides(input_file="d.json")["sweep.workload.kind"] == "dataset"
    assert overrides(input_file="d.jsonl", workload="multi_turn")["sweep.workload.kind"] == "multi_turn"
    assert overrides()["sweep.workload.kind"] is None


def test_a_trace_given_as_a_dataset_says_so():
    with pytest.raises(ToolkitError, match="looks like a Mooncake trace"):
        read_dataset(workload_sample("mooncake_trace_sample.jsonl"))


def test_multi_turn_plays_a_conversation_file(tokenizer):
    """AIPerf's multi_turn format: each session's turns in order, its output lengths, the answers in the history."""
    s = settings(kind="multi_turn", path=str(workload_sample("conversations_sample.jsonl")), think_time_s=0.0,
                 output_tokens=6, requests_per_step=5)
    server = FakeServer()
    run(make_workload(s, tokenizer), LoadShape("concurrency", 1, max_requests=5), server)
    prompts = [p for p, _ in server.sent]
    assert [(p.session, p.turn, p.output_tokens) for p in prompts] == [
        ("s0", 0, 12), ("s0", 1, 12), ("s0", 2, 8), ("s1", 0, 6), ("s1", 1, 10)]
    assert prompts[0].text == "What is a KV cache?"  # the system turn is not a request
    assert prompts[1].text.startswith("What is a KV cache? answer") and prompts[1].text.endswith("the conversation?")
    assert read_dataset(workload_sample("conversations_sample.jsonl"))[1].text == "Explain time to first token."
