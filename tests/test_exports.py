"""AIPerf / genai-perf exports of a run folder, checked against AIPerf's own schemas (tests/data/aiperf/,
generated from aiperf 0.13.0) and, where TOOLKIT_AIPERF_PYTHON names a python with aiperf installed,
read back with aiperf's own models and loader."""

import csv
import json
import os
import subprocess
from pathlib import Path

import jsonschema
import pytest

from toolkit.bench.exports import AIPERF_STAT_KEYS, InputsLog, aiperf_folder, write_exports
from toolkit.bench.metrics import METRICS, RECORD_METRICS, calculate_metrics, phase_split
from toolkit.bench.records import RecordWriter, RequestRecord

SCHEMAS = Path(__file__).parent / "data" / "aiperf"
WALL_MINUS_PERF = 1_795_000_000.0  # epoch seconds at perf_counter 0 in this made-up run


def _record(i, step, send, ttft, gaps, warmup=False, error=None):
    chunks = [send + ttft]
    for g in gaps:
        chunks.append(chunks[-1] + g)
    if error:
        return RequestRecord(i, step, send, 8, 5, error=error, error_kind="server_error", warmup=warmup)
    return RequestRecord(i, step, send, 8, 5, chunk_times=chunks, end_time=chunks[-1] + 0.001,
                         output_tokens=len(chunks), server_output_tokens=len(chunks), warmup=warmup)


def _run(tmp_path: Path, endpoint="openai-chat", mode="concurrency") -> Path:
    step_name = "concurrency_2" if mode == "concurrency" else "rate_4"
    records = [_record(0, "warmup", 10.0, 0.05, [0.01] * 4, warmup=True),
               _record(1, step_name, 11.0, 0.1, [0.02] * 4),
               _record(2, step_name, 11.0, 0.3, [0.04] * 4),
               _record(3, step_name, 11.2, 0.0, [], error="model returned 500: boom")]
    writer = RecordWriter(tmp_path / "records.jsonl")
    for r in records:
        writer.write(r)
    writer.close()
    (tmp_path / "server_metrics.jsonl").write_text(json.dumps(
        {"time": 11.0, "wall": 11.0 + WALL_MINUS_PERF, "step": step_name, "metrics": {}}) + "\n")
    (tmp_path / "inputs.jsonl").write_text("".join(
        json.dumps({"step": step_name, "request_index": i, "payload": {"messages": [{"role": "user", "content": "hi"}],
                                                                     "model": "tiny", "max_tokens": 5, "stream": True}})
        + "\n" for i in (1, 2, 3)))
    step = {"step": step_name, "mode": mode, "input_tokens": 8, "output_tokens": 5,
            **({"concurrency": 2} if mode == "concurrency" else {"rate": 4.0}),
            **calculate_metrics([r for r in records if r.step == step_name])}
    step["phases"] = phase_split(step)
    sweep = {"mode": mode, "requests_per_step": 3, "input_tokens_stddev": 0, "output_tokens_stddev": 0, "seed": 7,
             "arrival": "poisson", "max_concurrency": None, "url": "http://127.0.0.1:8000"}
    (tmp_path / "summary.json").write_text(json.dumps(
        {"run": {"model": "tiny", "endpoint": endpoint, "config_name": "cpu-tiny", "sweep": sweep},
         "steps": [step], "complete": True}))
    write_exports(tmp_path)
    return tmp_path


def _schema(name):
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def test_aiperf_folder_names_follow_aiperf():
    run = {"model": "meta/llama", "endpoint": "openai-chat", "sweep": {}}
    assert aiperf_folder(run, {"step": "concurrency_4", "mode": "concurrency", "concurrency": 4}) == \
        "meta_llama-openai-chat-concurrency4"
    assert aiperf_folder(run, {"step": "rate_2", "mode": "rate", "rate": 2}) == "meta_llama-openai-chat-request_rate2.0"
    capped = run | {"sweep": {"max_concurrency": 8}}
    assert aiperf_folder(capped, {"step": "rate_2", "mode": "rate", "rate": 2}) == \
        "meta_llama-openai-chat-concurrency8-request_rate2.0"
    # Several shapes in one sweep: the shape keeps folders apart
    assert aiperf_folder(run, {"step": "concurrency_1_isl64_osl16", "mode": "concurrency", "concurrency": 1,
                               "input_tokens": 64, "output_tokens": 16}) == \
        "meta_llama-openai-chat-concurrency1-isl64-osl16"


@pytest.mark.parametrize("endpoint", ["openai-chat", "triton-grpc"])
def test_aiperf_exports_validate_against_aiperf_schemas(tmp_path, endpoint):
    run = _run(tmp_path, endpoint)
    folder = run / "exports" / f"tiny-{endpoint}-concurrency2"
    summary = json.loads((folder / "profile_export_aiperf.json").read_text())
    jsonschema.validate(summary, _schema("profile_export_aiperf"))
    record_schema = _schema("profile_export_record")
    for line in (folder / "profile_export.jsonl").read_text().splitlines():
        jsonschema.validate(json.loads(line), record_schema)
    jsonschema.validate(json.loads((folder / "inputs.json").read_text()), _schema("inputs"))
    # genai-perf's files stay beside them
    assert (run / "exports" / "concurrency_2" / "profile_export_genai_perf.json").is_file()


def test_aiperf_rate_step_validates(tmp_path):
    folder = _run(tmp_path, mode="rate") / "exports" / "tiny-openai-chat-request_rate4.0"
    summary = json.loads((folder / "profile_export_aiperf.json").read_text())
    jsonschema.validate(summary, _schema("profile_export_aiperf"))
    assert summary["input_config"]["phases"][0] == {"name": "profiling", "kind": "profiling", "type": "poisson",
                                                    "rate": 4.0, "requests": 3}


def test_records_carry_epoch_ns_phase_request_id_and_error(tmp_path):
    folder = _run(tmp_path) / "exports" / "tiny-openai-chat-concurrency2"
    lines = [json.loads(line) for line in (folder / "profile_export.jsonl").read_text().splitlines()]
    assert [r["metadata"]["benchmark_phase"] for r in lines] == ["warmup", "profiling", "profiling", "profiling"]
    first = lines[1]
    assert first["metadata"]["x_request_id"] == "1"
    assert first["metadata"]["request_start_ns"] == round(WALL_MINUS_PERF * 1e9) + 11_000_000_000
    # end = final response (last chunk + 1 ms); ack = first token
    assert first["metadata"]["request_end_ns"] - first["metadata"]["request_start_ns"] == pytest.approx(181e6, abs=2)
    assert first["metadata"]["request_ack_ns"] - first["metadata"]["request_start_ns"] == pytest.approx(100e6, abs=2)
    assert first["metrics"]["time_to_first_token"] == {"value": pytest.approx(100), "unit": "ms"}
    assert first["metrics"]["inter_chunk_latency"]["value"] == pytest.approx([20.0] * 4)
    assert first["metrics"]["output_token_throughput_per_user"]["unit"] == "tokens/sec/user"
    assert first["error"] is None
    failed = lines[3]
    assert failed["error"] == {"code": None, "type": "server_error", "message": "model returned 500: boom"}
    assert "time_to_first_token" not in failed["metrics"]


def test_aiperf_summary_and_csv(tmp_path):
    folder = _run(tmp_path) / "exports" / "tiny-openai-chat-concurrency2"
    summary = json.loads((folder / "profile_export_aiperf.json").read_text())
    assert summary["time_to_first_token"]["unit"] == "ms"
    assert summary["time_to_first_token"]["avg"] == pytest.approx(200)
    assert summary["time_to_first_token"]["count"] == 2
    assert summary["request_count"] == {"unit": "requests", "avg": 2}
    assert summary["error_request_count"] == {"unit": "requests", "avg": 1}
    assert summary["output_token_throughput"]["unit"] == "tokens/sec"
    assert summary["error_summary"] == [{"error_details": {"type": "server_error",
                                                           "message": "model returned 500: boom"}, "count": 1}]
    assert summary["is_complete"] is True and summary["start_time"].startswith("2026-")
    rows = list(csv.reader((folder / "profile_export_aiperf.csv").open()))
    assert rows[0] == ["Metric"] + AIPERF_STAT_KEYS
    by_name = {row[0]: row[1:] for row in rows if row}
    assert by_name["Time to First Token (ms)"][0] == "200.00"
    assert by_name["Request Count"] == ["2"]
    assert by_name["Inter Token Latency (ms)"][AIPERF_STAT_KEYS.index("p50")] == "30.00"


def test_every_metric_has_unit_direction_and_its_aiperf_name():
    properties = _schema("profile_export_aiperf")["properties"]
    for metric in METRICS.values():
        assert metric.unit and metric.header
        assert metric.lower_is_better in (True, False, None)
        if metric.aiperf_header:
            assert metric.export_tag in properties, metric.tag
    assert METRICS["time_to_first_token"].lower_is_better is True
    assert METRICS["output_token_throughput"].lower_is_better is False
    assert METRICS["output_token_throughput"].improved(100, 120) is True
    assert METRICS["inter_token_latency"].improved(10, 12) is False
    assert METRICS["input_sequence_length"].improved(10, 12) is None
    assert {m.tag for m in RECORD_METRICS} <= set(METRICS)


@pytest.mark.skipif(not os.environ.get("TOOLKIT_AIPERF_PYTHON"),
                    reason="set TOOLKIT_AIPERF_PYTHON to a python with aiperf 0.13.0 (tests/data/aiperf/README.md)")
def test_aiperf_reads_our_export_with_its_own_loader(tmp_path):
    folder = _run(tmp_path) / "exports" / "tiny-openai-chat-concurrency2"
    out = subprocess.run([os.environ["TOOLKIT_AIPERF_PYTHON"], str(SCHEMAS / "validate_with_aiperf.py"), str(folder)],
                         capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"records": 4, "phases": ["profiling", "warmup"], "ttft_p50": pytest.approx(200),
                    "loader_model": "tiny", "loader_concurrency": 2,
                    "loader_requests": 3}  # the loader counts every profiling record, the failed one too


def test_inputs_log_keeps_each_payload_as_the_client_sends_it(tmp_path):
    import asyncio

    from toolkit.bench.clients import OpenAIChatClient, TritonGrpcClient

    async def log():
        chat, grpc = OpenAIChatClient("http://127.0.0.1:9/v1", "tiny"), TritonGrpcClient("127.0.0.1:9")
        inputs = InputsLog(tmp_path)
        inputs.write(RequestRecord(0, "concurrency_1", 0.0, 3, 4), chat, "hello")
        inputs.write(RequestRecord(1, "concurrency_1", 0.0, 3, 4, session="s7"), grpc, "hello")
        inputs.close()
        await chat.close()
        await grpc.close()
        return chat.body("hello", 4)

    chat_body = asyncio.run(log())
    rows = [json.loads(line) for line in (tmp_path / "inputs.jsonl").read_text().splitlines()]
    assert rows[0] == {"step": "concurrency_1", "request_index": 0, "session": None, "payload": chat_body}
    assert rows[1]["payload"] == {"text_input": "hello", "max_tokens": 4, "stream": True, "ignore_eos": True}
    assert rows[1]["session"] == "s7"


def test_a_step_where_every_request_failed_still_exports_valid_aiperf_files(tmp_path):
    records = [RequestRecord(i, "concurrency_1", 1.0 + i, 8, 4, error="connection refused", error_kind="connection")
               for i in range(3)]
    writer = RecordWriter(tmp_path / "records.jsonl")
    for r in records:
        writer.write(r)
    writer.close()
    step = {"step": "concurrency_1", "mode": "concurrency", "concurrency": 1, "input_tokens": 8, "output_tokens": 4,
            **calculate_metrics(records)}
    (tmp_path / "summary.json").write_text(json.dumps({"run": {"model": "tiny", "endpoint": "openai-chat"},
                                                       "steps": [step], "complete": False}))
    write_exports(tmp_path)
    folder = tmp_path / "exports" / "tiny-openai-chat-concurrency1"
    summary = json.loads((folder / "profile_export_aiperf.json").read_text())
    jsonschema.validate(summary, _schema("profile_export_aiperf"))
    assert summary["error_request_count"]["avg"] == 3 and summary["is_complete"] is False
    assert summary["input_config"]["phases"][0]["requests"] == 3  # no bound in the config: what was sent
    for line in (folder / "profile_export.jsonl").read_text().splitlines():
        row = json.loads(line)
        jsonschema.validate(row, _schema("profile_export_record"))
        assert row["error"]["type"] == "connection" and row["metadata"]["request_end_ns"] >= \
            row["metadata"]["request_start_ns"]
