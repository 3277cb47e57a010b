"""End to end on the tiny preset with a real Triton server: quantize → build → repo → serve →
stream over gRPC and HTTP → sweep → report."""

import json
import threading

import pytest
import requests

from e2e_helpers import deploy, grpc_stream, tiny_deployment
from toolkit import pipeline
from toolkit.bench.records import read_records
from toolkit.bench.rundir import RunDir

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("e2e")
    # float32 activations: in bf16 the engine's kernels differ by row count (fused C GEMMs up to 8 rows,
    # torch's above, widened weights for prefill chunks), so a request batched with others rounds
    # differently than alone and greedy picks on this random model's near-ties can flip; in fp32 they
    # agree to ~1e-6, and what test_inflight_batching_is_greedy_identical_to_alone checks is scheduling.
    config, layout = tiny_deployment(tmp, tiny_model_dir, server={"openai": True}, engine={"dtype": "float32"})
    handle = deploy(config, layout)
    yield config, layout, handle
    pipeline.stop(layout)


def test_grpc_streams_real_tokens_one_by_one(served):
    _, _, handle = served
    sent, chunks, error = grpc_stream(handle.grpc_url, "Decode emits one token per forward pass.", 10)
    assert error is None
    assert len(chunks) == 10 and all(count == 1 for _, _, count in chunks)
    times = [t for t, _, _ in chunks]
    assert all(b > a for a, b in zip(times, times[1:])) and times[0] > sent
    assert "".join(text for _, text, _ in chunks).strip()


def test_http_generate_stream_sends_server_sent_events(served):
    _, _, handle = served
    body = {"text_input": "Paged attention stores the cache in blocks.", "max_tokens": 6, "stream": True,
            "ignore_eos": True}
    with requests.post(f"{handle.http_url}/v2/models/ensemble/generate_stream", json=body, stream=True,
                       timeout=60) as response:
        assert response.status_code == 200
        events = [json.loads(line[5:]) for line in response.iter_lines(decode_unicode=True)
                  if line and line.startswith("data:")]
    token_events = [e for e in events if "text_output" in e]
    assert len(token_events) == 6
    assert sum(e["output_token_count"] for e in token_events) == 6


def test_inflight_batching_is_greedy_identical_to_alone(served):
    """Requests that join a running batch produce what they produce alone (greedy decoding)."""
    _, _, handle = served
    prompts = [f"Request number {i} asks about the key and value cache." for i in range(4)]
    alone = ["".join(t for _, t, _ in grpc_stream(handle.grpc_url, p, 8)[1]) for p in prompts]
    together = [None] * 4

    def run(i):
        together[i] = "".join(t for _, t, _ in grpc_stream(handle.grpc_url, prompts[i], 8)[1])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert together == alone


def test_prompt_longer_than_engine_is_refused_with_the_fix(served):
    _, _, handle = served
    _, chunks, error = grpc_stream(handle.grpc_url, "word " * 400, 4)
    assert chunks == [] and "max_input_len" in error and "rebuild" in error


def test_phase_metrics_exported_through_triton(served):
    _, _, handle = served
    grpc_stream(handle.grpc_url, "One more request for the metrics.", 4)
    text = requests.get(handle.metrics_url, timeout=5).text
    assert 'toolkit_prefill_time_seconds_count{model="tensorrt_llm",version="1"}' in text
    assert 'toolkit_decode_time_seconds_bucket{' in text
    assert 'toolkit_kv_cache_blocks_max{model="tensorrt_llm",version="1"} 32' in text


def test_engine_metrics_under_tensorrt_llm_names_and_its_step_timeline(served):
    """The CPU engine exports TensorRT-LLM's metric families (labels and meanings of its Triton backend)
    and appends each step to the timeline beside its model."""
    import re
    import time

    from toolkit.engine.runtime.layout import timeline_file
    from toolkit.engine.runtime.timeline import read_timeline

    _, layout, handle = served
    before = time.time()
    grpc_stream(handle.grpc_url, "Metrics under the names TensorRT-LLM uses.", 6)
    time.sleep(0.5)  # the engine refreshes its gauges every 0.1 s
    text = requests.get(handle.metrics_url, timeout=5).text

    def value(family, label, kind):
        match = re.search(rf'^{family}{{[^}}]*{label}="{kind}"[^}}]*}} (\S+)$', text, re.MULTILINE)
        assert match, f"{family} {label}={kind}"
        return float(match.group(1))

    kv = {k: value("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", k)
          for k in ("max", "free", "used", "tokens_per", "reused", "fraction")}
    assert kv["max"] == 32 and kv["tokens_per"] == 16 and kv["used"] + kv["free"] == 32
    assert value("nv_trt_llm_request_metrics", "request_type", "max") == 4
    for kind in ("active", "scheduled", "context", "waiting"):
        value("nv_trt_llm_request_metrics", "request_type", kind)
    for kind in ("total_context_tokens", "generation_requests", "paused_requests"):
        value("nv_trt_llm_inflight_batcher_metrics", "inflight_batcher_specific_metric", kind)
    assert value("nv_trt_llm_general_metrics", "general_type", "iteration_counter") > 0
    steps = read_timeline(timeline_file(layout.repo_dir), before, time.time())
    assert sum(s.decode_tokens for s in steps) == 5 and sum(s.prefill_tokens for s in steps) > 0


def test_sweep_and_report_are_consistent(served):
    config, layout, _ = served
    run_dir = pipeline.sweep(config, layout, progress=lambda _: None)
    run = RunDir.open(run_dir)
    assert run.summary["complete"] is True
    assert [s["concurrency"] for s in run.steps] == [1, 4]
    records = [r for r in read_records(run_dir / "records.jsonl")]
    measured = [r for r in records if not r.warmup]
    assert len(measured) == 16 and sum(r.warmup for r in records) == 1
    for r in measured:
        assert r.ok and r.output_tokens == 12 and len(r.chunk_times) == 12
        assert 0 < r.ttft < r.e2e_latency
        assert r.ttft + r.inter_token_latency * (r.output_tokens - 1) == pytest.approx(r.e2e_latency, rel=1e-9)
    for step in run.steps:
        m = step["metrics"]
        assert step["error_count"] == 0 and step["request_count"] == 8
        assert 0 < m["time_to_first_token"]["avg"] < m["request_latency"]["avg"]
        assert m["inter_token_latency"]["min"] > 0
        assert m["output_sequence_length"]["avg"] == 12
        assert step["output_token_throughput"]["avg"] > 0
    assert (run_dir / "server_metrics.jsonl").is_file()
    assert (run_dir / "engine_timeline.jsonl").is_file() and (run_dir / "engine_timeline.trace.json").is_file()
    report = pipeline.report(run_dir).read_text()
    assert "## Concurrency 4" in report and "Prefill vs decode" in report and "Time to first token" in report


def test_server_has_its_own_process_group_in_the_callers_session(served):
    """`toolkit stop` ends the group and Ctrl-C does not reach it; in the caller's session so that the kernel's
    autogroups do not split the cores between a sweep client and the server (OWN_PROCESS_GROUP)."""
    import os

    _, _, handle = served
    assert os.getpgid(handle.pid) == handle.pid != os.getpgid(0)
    assert os.getsid(handle.pid) == os.getsid(0)
    assert handle.openai_pid and os.getpgid(handle.openai_pid) == handle.openai_pid
    assert os.getsid(handle.openai_pid) == os.getsid(0)


def test_sweep_over_http_endpoint(served):
    config, layout, _ = served
    http_config = config.model_copy(update={"sweep": config.sweep.model_copy(
        update={"endpoint": "triton-http", "concurrencies": [2], "requests_per_step": 4})})
    run = RunDir.open(pipeline.sweep(http_config, layout, progress=lambda _: None))
    step = run.steps[0]
    assert step["request_count"] == 4 and step["metrics"]["output_sequence_length"]["avg"] == 12


def test_bls_matches_offline_greedy_generation_of_the_served_weights(served):
    """tensorrt_llm_bls streams what the same (dequantized) weights generate offline, detokenized as a
    whole sequence, with no split characters."""
    import torch
    from transformers import AutoTokenizer

    from toolkit.repo.python_models.quantized_checkpoint import load_quantized_causal_lm

    _, layout, handle = served
    prompt = "Chunked prefill splits a long prompt into pieces."
    _, chunks, error = grpc_stream(handle.grpc_url, prompt, 8, model="tensorrt_llm_bls")
    assert error is None and len(chunks) == 8 and all(count == 1 for _, _, count in chunks)
    served_text = "".join(t for _, t, _ in chunks)

    checkpoint = layout.engine_dir / "checkpoint"
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    model, _ = load_quantized_causal_lm(checkpoint)
    ids = torch.tensor([tokenizer(prompt).input_ids])
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                                   pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:]
    expected = tokenizer.decode(generated.tolist(), skip_special_tokens=True).rstrip("\ufffd")
    assert served_text == expected


def test_grafana_dashboard_queries_metrics_the_server_exports(served):
    """Every Triton-core and CPU-engine metric the shipped dashboard queries exists on /metrics."""
    import re
    from pathlib import Path

    _, _, handle = served
    grpc_stream(handle.grpc_url, "Metrics for the dashboard.", 4)
    exported = requests.get(handle.metrics_url, timeout=5).text
    dashboard = json.loads(Path("docker/grafana/dashboards/llm-serving.json").read_text())
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"\b(?:nv_inference_\w+|toolkit_\w+)", target["expr"])}
    assert queried
    # newer Triton builds only
    optional = {f"nv_inference_first_response_histogram_ms_{part}" for part in ("bucket", "sum", "count")}
    for name in queried - optional:
        assert re.search(rf"^{name}[{{ ]", exported, re.MULTILINE), name


def with_sweep(config, **changes):
    return config.model_copy(update={"sweep": config.sweep.model_copy(update=changes)})


def test_openai_front_completions_and_chat(served):
    _, _, handle = served
    base = f"{handle.openai_url}/v1"
    assert requests.get(f"{base}/models", timeout=5).json()["data"][0]["id"] == "tiny"  # the config's model name
    body = {"model": "tiny", "prompt": "Decode is memory bound.", "max_tokens": 5, "ignore_eos": True}
    done = requests.post(f"{base}/completions", json=body, timeout=60).json()
    assert done["object"] == "text_completion" and done["usage"]["completion_tokens"] == 5
    assert done["choices"][0]["finish_reason"] == "length"
    with requests.post(f"{base}/chat/completions", stream=True, timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4,
            "min_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}) as response:
        events = [line[5:].strip() for line in response.iter_lines(decode_unicode=True) if line.startswith("data:")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert sum(1 for c in chunks for ch in c["choices"] if ch["delta"].get("content") is not None) >= 4
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    bad = requests.post(f"{base}/completions", json={"model": "tiny", "prompt": 3}, timeout=10)
    assert bad.status_code == 400 and "prompt" in bad.json()["error"]["message"]
    # As the OpenAI API and vLLM answer: unknown model 404; n, temperature and lengths 400 with the reason.
    unknown = requests.post(f"{base}/completions", json=body | {"model": "gpt-4"}, timeout=10)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    for field, value, needle in (("n", 2, "n=2"), ("temperature", 5, "[0, 2]"), ("max_tokens", 160, "160"),
                                 ("max_tokens", 158, "max_seq_len")):
        refused = requests.post(f"{base}/completions", json=body | {field: value}, timeout=60)
        assert refused.status_code == 400 and needle in refused.json()["error"]["message"], (field, refused.text)
    # The repository's models take TensorRT-LLM's sampling inputs: the front passes OpenAI's fields through,
    # and a seed makes a sampled completion repeat.
    sampled = [requests.post(f"{base}/completions", json=body | {"temperature": 0.9, "top_p": 0.95, "seed": 11},
                             timeout=60) for _ in range(2)]
    assert all(r.status_code == 200 for r in sampled), sampled[0].text
    assert sampled[0].json()["choices"][0]["text"] == sampled[1].json()["choices"][0]["text"]


@pytest.mark.parametrize("endpoint", ["openai-completions", "openai-chat"])
def test_sweep_over_openai_endpoints(served, endpoint):
    config, layout, _ = served
    run = RunDir.open(pipeline.sweep(with_sweep(config, endpoint=endpoint, concurrencies=[2], requests_per_step=4,
                                                warmup_requests=0), layout, progress=lambda _: None))
    step = run.steps[0]
    assert step["request_count"] == 4 and step["error_count"] == 0
    assert step["metrics"]["output_sequence_length"]["avg"] == 12  # usage.completion_tokens


def test_rate_mode_sweep_with_slo_and_server_summary(served):
    config, layout, _ = served
    run_dir = pipeline.sweep(with_sweep(config, mode="rate", request_rates=[20.0], arrival="poisson",
                                        max_concurrency=3, requests_per_step=6, warmup_requests=0,
                                        slo_ttft_ms=10_000, slo_itl_ms=10_000), layout, progress=lambda _: None)
    run = RunDir.open(run_dir)
    step = run.steps[0]
    assert step["step"] == "rate_20" and step["rate"] == 20.0 and step["request_count"] == 6
    assert step["goodput"]["good_requests"] == 6
    server = step["server"]
    assert server["tensorrt_llm"]["requests"] >= 1 and "queue_ms_per_request" in server["ensemble"]
    # the tokenizer once per request, the detokenizer once per streamed response, each with its own queue
    assert server["preprocessing"]["requests"] == server["tensorrt_llm"]["requests"]
    assert server["postprocessing"]["requests"] > server["tensorrt_llm"]["requests"]
    assert server["kv_cache"]["source"] == "cpu_engine" and server["kv_cache"]["blocks_max"] == 32
    assert (run_dir / "exports" / "rate_20" / "profile_export_genai_perf.json").is_file()
    plan = json.loads((run_dir / "plan.json").read_text())  # reports read it rather than re-plan
    assert plan["deployment"]["batch"] == config.engine.max_batch_size and plan["model"]["name"]
    aiperf = run_dir / "exports" / "tiny-triton-grpc-concurrency3-request_rate20.0"  # AIPerf's folder naming
    assert (aiperf / "profile_export.jsonl").is_file() and (aiperf / "profile_export_aiperf.json").is_file()


def test_html_report_compares_runs(served, tmp_path):
    config, layout, _ = served
    first = pipeline.sweep(with_sweep(config, concurrencies=[1, 2], requests_per_step=3, warmup_requests=0), layout,
                           progress=lambda _: None)
    second = pipeline.sweep(with_sweep(config, concurrencies=[1, 2], requests_per_step=3, warmup_requests=0,
                                       endpoint="triton-http"), layout, progress=lambda _: None)
    markdown = pipeline.report(first, second, out=tmp_path / "compare.md")
    text = markdown.read_text()
    # one summary table on top; each run under its own label, which names what differs (the endpoint)
    assert "## Summary" in text and text.count("| c2 |") == 2
    assert text.count(" · triton-grpc · ") >= 2 and text.count(" · triton-http · ") >= 2
    page = (tmp_path / "compare.html").read_text()
    assert page.count("data:image/png;base64,") >= 3 + 2 * 3  # shared plots + per-run plots
    assert "roofline with measured points" in page
