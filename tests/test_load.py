"""Load shapes, exports and server-metric summaries: deterministic, no server needed."""

import asyncio
import json
import time

import pytest

from toolkit.bench.exports import write_exports
from toolkit.bench.load import LoadShape, arrival_gaps, drive
from toolkit.bench.metrics import calculate_metrics
from toolkit.bench.records import RecordWriter, RequestRecord
from toolkit.bench.server_metrics import parse_metrics, summarize_server_metrics
from toolkit.cli import parse_slo
from toolkit.errors import ToolkitError


def run_drive(shape, service_s=0.0, stop_after=None):
    """Drive a load shape against a fake service; returns (send times, peak in flight)."""
    sent, in_flight, peak = [], 0, 0
    counter = iter(range(10**6))

    async def send(item):
        nonlocal in_flight, peak
        sent.append(time.perf_counter())
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(service_s)
        in_flight -= 1
        return stop_after is None or len(sent) < stop_after

    asyncio.run(drive(shape, lambda: next(counter), send))
    return sent, peak


def test_concurrency_mode_keeps_n_in_flight_and_stops_at_count():
    sent, peak = run_drive(LoadShape("concurrency", 4, max_requests=20), service_s=0.01)
    assert len(sent) == 20 and peak == 4


def test_rate_mode_constant_spacing():
    sent, _ = run_drive(LoadShape("rate", 50, arrival="constant", max_requests=11))
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    assert len(sent) == 11
    assert sum(gaps) / len(gaps) == pytest.approx(0.02, rel=0.5)  # absolute schedule: no drift


def test_poisson_gaps_are_seeded_and_have_the_rate():
    a = [g for g, _ in zip(arrival_gaps(10, "poisson", 7), range(2000))]
    b = [g for g, _ in zip(arrival_gaps(10, "poisson", 7), range(2000))]
    assert a == b
    assert sum(a) / len(a) == pytest.approx(0.1, rel=0.08)
    assert len(set(round(g, 6) for g in a)) > 1900  # not constant


def test_rate_mode_caps_requests_in_flight():
    _, peak = run_drive(LoadShape("rate", 500, arrival="constant", max_concurrency=2, max_requests=12), service_s=0.02)
    assert peak == 2


def test_duration_bounds_a_step():
    start = time.perf_counter()
    sent, _ = run_drive(LoadShape("concurrency", 2, duration_s=0.2), service_s=0.01)
    assert 0.18 < time.perf_counter() - start < 2.0 and 5 < len(sent) < 60


def test_send_returning_false_stops_the_step():
    sent, _ = run_drive(LoadShape("concurrency", 1, max_requests=50), stop_after=3)
    assert len(sent) == 3


def test_slo_flag_parsing():
    assert parse_slo("ttft=500ms,itl=50ms,latency=2s") == {
        "sweep.slo_ttft_ms": 500.0, "sweep.slo_itl_ms": 50.0, "sweep.slo_latency_ms": 2000.0}
    with pytest.raises(ToolkitError, match="ttft\\|itl\\|latency"):
        parse_slo("tpot=3ms")


def _record(i, ttft, gaps, step="concurrency_1"):
    chunks = [10.0 + ttft]
    for g in gaps:
        chunks.append(chunks[-1] + g)
    return RequestRecord(i, step, 10.0, 8, len(chunks), chunk_times=chunks, end_time=chunks[-1],
                         output_tokens=len(chunks))


def test_genai_perf_and_aiperf_exports(tmp_path):
    records = [_record(0, 0.1, [0.02] * 4), _record(1, 0.3, [0.04] * 4)]
    writer = RecordWriter(tmp_path / "records.jsonl")
    for r in records:
        writer.write(r)
    writer.close()
    step = {"step": "concurrency_1", "concurrency": 1, "input_tokens": 8, "output_tokens": 5,
            **calculate_metrics(records)}
    (tmp_path / "summary.json").write_text(json.dumps({"run": {"model": "tiny", "endpoint": "triton-grpc"},
                                                       "steps": [step]}))
    write_exports(tmp_path)
    genai = json.loads((tmp_path / "exports" / "concurrency_1" / "profile_export_genai_perf.json").read_text())
    assert genai["time_to_first_token"]["unit"] == "ms"
    assert genai["time_to_first_token"]["avg"] == pytest.approx(200)
    assert genai["inter_token_latency"]["p50"] == pytest.approx(30)
    assert genai["request_throughput"]["unit"] == "requests/sec"
    assert genai["input_config"]["concurrency"] == 1
    csv_text = (tmp_path / "exports" / "concurrency_1" / "profile_export_genai_perf.csv").read_text()
    assert csv_text.startswith("Metric,avg,min,max,p99,p95,p90,p75,p50,p25")
    assert "Time To First Token (ms),200.00" in csv_text and "Request Throughput (per sec)" in csv_text
    lines = (tmp_path / "exports" / "tiny-triton-grpc-concurrency1" / "profile_export.jsonl").read_text().splitlines()
    first = json.loads(lines[0])  # AIPerf's per-request records (more in tests/test_exports.py)
    assert first["metrics"]["time_to_first_token"] == {"value": pytest.approx(100), "unit": "ms"}
    assert len(first["metrics"]["inter_chunk_latency"]["value"]) == 4


PROM = """# HELP nv_inference_request_success x
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="ensemble",version="1"}} {ok}
nv_inference_request_success{{model="tensorrt_llm",version="1"}} {ok}
nv_inference_request_success{{model="preprocessing",version="1"}} {ok}
nv_inference_request_success{{model="postprocessing",version="1"}} {responses}
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{{model="tensorrt_llm",version="1"}} {queue}
nv_inference_queue_duration_us{{model="preprocessing",version="1"}} {queue}
nv_inference_queue_duration_us{{model="postprocessing",version="1"}} {queue}
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{{model="tensorrt_llm",version="1"}} {compute}
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="tensorrt_llm",version="1"}} {pending}
# TYPE toolkit_kv_cache_blocks_used gauge
toolkit_kv_cache_blocks_used{{model="tensorrt_llm",version="1"}} {kv}
# TYPE toolkit_kv_cache_blocks_max gauge
toolkit_kv_cache_blocks_max{{model="tensorrt_llm",version="1"}} 100
# TYPE toolkit_decode_time_seconds histogram
toolkit_decode_time_seconds_sum{{model="tensorrt_llm",version="1"}} {dsum}
toolkit_decode_time_seconds_count{{model="tensorrt_llm",version="1"}} {dcount}
"""


def test_server_metric_summary_from_two_scrapes():
    samples = [
        {"metrics": parse_metrics(PROM.format(ok=10, responses=100, queue=1000, compute=50000, pending=0, kv=10,
                                              dsum=1.0, dcount=10))},
        {"metrics": parse_metrics(PROM.format(ok=20, responses=200, queue=21000, compute=150000, pending=3, kv=60,
                                              dsum=3.0, dcount=20))},
    ]
    s = summarize_server_metrics(samples)
    assert s["tensorrt_llm"]["queue_ms_per_request"] == pytest.approx(2.0)
    # the tokenizer per request, the detokenizer per streamed response (10 requests, 100 responses in the step)
    assert s["preprocessing"]["queue_ms_per_request"] == pytest.approx(2.0)
    assert s["postprocessing"] == {"requests": 100, "queue_ms_per_request": pytest.approx(0.2)}
    assert "compute_ms_per_request" not in s["tensorrt_llm"]  # a decoupled model's execute() is not its compute
    assert s["pending_requests_max"] == 3
    assert s["kv_cache"]["blocks_used_max"] == 60 and s["kv_cache"]["utilization_max"] == pytest.approx(0.6)
    assert s["decode_ms_mean"] == pytest.approx(200.0)
    assert summarize_server_metrics(samples[:1]) == {}


def test_the_scraper_takes_a_step_s_first_sample_before_the_step_begins(tmp_path):
    """The step's first sample is on record when start() returns: a request the step sends at once (rate mode sends
    its first at t = 0) cannot be counted in it, and so not missed by the step's delta. And the last samples wait for
    the server's counters to settle: Triton counts a decoupled request when it is released, after the final response
    the client saw. A real HTTP server here, whose counter moves as soon as start() returns and then trails by two."""
    from aiohttp import web
    from local_http import serving

    from toolkit.bench.server_metrics import MetricsScraper

    count = {"ok": 0, "trailing": 0}

    async def run():
        async def metrics(_request):
            ok = count["ok"]
            if count["trailing"]:  # each later scrape sees one more request released
                count["ok"], count["trailing"] = ok + 1, count["trailing"] - 1
            return web.Response(text=f'nv_inference_request_success{{model="preprocessing",version="1"}} {ok}\n'
                                     f'nv_inference_queue_duration_us{{model="preprocessing",version="1"}} 0\n')

        async with serving({"/metrics": metrics}) as base:
            scraper = MetricsScraper(base + "/metrics", tmp_path / "server_metrics.jsonl", interval_s=10)
            await scraper.start("step")
            count["ok"], count["trailing"] = 6, 2  # the step's requests: 6 through, 2 more still to be released
            return await scraper.stop(settle_s=0.01)

    samples = asyncio.run(run())
    assert samples[0]["step"] == "step" and len(samples) == 5  # the first, then 6, 7, 8 and 8 again
    assert summarize_server_metrics(samples)["preprocessing"]["requests"] == 8


def test_genai_perf_and_aiperf_flag_spellings_set_the_same_keys():
    from click.testing import CliRunner

    from toolkit.cli import cli, sweep_overrides

    seen = {}

    def capture(**flags):
        seen.update(sweep_overrides(flags))

    command = cli.commands["sweep"]
    original, command.callback = command.callback, lambda config_path, sets, **flags: capture(**flags)
    try:
        result = CliRunner().invoke(cli, [
            "sweep", "--request-rate", "2", "--request-count", "40", "--synthetic-input-tokens-mean", "100",
            "--synthetic-input-tokens-stddev", "5", "--output-tokens-mean", "20", "--output-tokens-stddev", "2",
            "--warmup-request-count", "3", "--random-seed", "7", "--endpoint-type", "chat", "--streaming",
            "--goodput", "time_to_first_token:100 inter_token_latency:3.4", "--artifact-dir", "out", "-m", "m1",
            "-u", "http://h:1"])
    finally:
        command.callback = original
    assert result.exit_code == 0, result.output
    assert seen | {} == seen and {k: v for k, v in seen.items() if v is not None} == {
        "sweep.request_rates": [2.0], "sweep.mode": "rate", "sweep.requests_per_step": 40,
        "sweep.input_tokens_mean": 100, "sweep.input_tokens_stddev": 5.0, "sweep.output_tokens": 20,
        "sweep.output_tokens_stddev": 2.0, "sweep.warmup_requests": 3, "sweep.seed": 7,
        "sweep.endpoint": "openai-chat", "sweep.slo_ttft_ms": 100.0, "sweep.slo_itl_ms": 3.4,
        "paths.runs_dir": "out", "sweep.model": "m1", "sweep.url": "http://h:1"}


def test_duration_alone_bounds_a_step_by_time():
    from toolkit.cli import SWEEP_FLAGS, _param_name, sweep_overrides

    flags = {_param_name(decls): None for _, decls, _ in SWEEP_FLAGS} | {"concurrencies": (), "rates": (),
                                                                         "duration": 30.0}
    assert sweep_overrides(flags)["sweep.requests_per_step"] == "null"
    assert sweep_overrides(flags | {"requests": 8})["sweep.requests_per_step"] == 8


def test_demo_ends_with_one_sentence_of_what_was_measured():
    from toolkit.cli import measured_sentence

    def step(level, ttft, itl, tps):
        return {"mode": "concurrency", "concurrency": level, "request_count": 32,
                "metrics": {"time_to_first_token": {"p50": ttft}, "inter_token_latency": {"p50": itl}},
                "output_token_throughput": {"avg": tps}}

    summary = {"run": {"model": "small", "qformat": "fp8", "target": "cpu", "endpoint": "triton-grpc",
                       "served_engine": {"weight_format": "int8(fp8)-a8", "compute_dtype": "bfloat16"},
                       "sweep": {"step_warmup_requests": 8}},
               "steps": [step(1, 50.0, 20.0, 48), step(8, 210.5, 31.25, 240)]}
    assert measured_sentence(summary) == (
        "Measured small (fp8 checkpoint on int8(fp8)-a8 kernels, bfloat16 activations) behind Triton with in-flight batching over "
        "triton-grpc: from concurrency 1 to 8, TTFT p50 50.0 → 210.5 ms, ITL p50 20.0 → 31.2 ms, output 48 → 240 "
        "tokens/s (32 requests per step after 8 warm-up requests).")
    summary["run"]["served_engine"]["kernel_isa"] = "AVX2 + FMA"  # which of the engine's builds served it
    assert measured_sentence(summary).startswith("Measured small (fp8 checkpoint on int8(fp8)-a8 kernels (AVX2 + FMA), "
                                                 "bfloat16 activations) behind Triton")
    assert measured_sentence({"steps": [{"request_count": 0}]}).startswith("Nothing was measured")
    # A run that did not record what the engine runs claims no compute precision.
    del summary["run"]["served_engine"]
    assert measured_sentence(summary).startswith("Measured small (fp8 weights) behind Triton")


def test_a_run_stops_when_nothing_has_succeeded_but_not_after_a_step_that_did():
    from toolkit.bench.sweep import SweepAborted, _raise_if_nothing_succeeded

    failed = [RequestRecord(i, "concurrency_8", 0.0, 8, 4, error="HTTP 404: no such model", error_kind="server_error")
              for i in range(3)]
    summary = {"steps": []}
    with pytest.raises(SweepAborted, match="every request of concurrency_8 failed .3 of 3: server_error: HTTP 404"):
        _raise_if_nothing_succeeded(failed, summary, "concurrency_8")
    assert "HTTP 404" in summary["aborted"]
    # A load at which every request fails after a lower one succeeded is a measurement, not a broken run.
    _raise_if_nothing_succeeded(failed, {"steps": [{"request_count": 16}]}, "concurrency_8")
