"""Each doctor check on run directories crafted to trigger it (and not to)."""

import json

from toolkit.bench.metrics import calculate_metrics, phase_split
from toolkit.bench.records import RecordWriter, RequestRecord
from toolkit.report.doctor import diagnose, write_doctor
from toolkit.bench.rundir import RunDir


def record(i, step, ttft, gaps, isl=64):
    chunks = [ttft]
    for g in gaps:
        chunks.append(chunks[-1] + g)
    return RequestRecord(i, step, 0.0, isl, len(chunks), chunk_times=chunks, end_time=chunks[-1],
                         output_tokens=len(chunks))


def make_run(tmp_path, steps, server=None, samples=None, run_meta=None):
    """steps: {concurrency: [records]}; server: {concurrency: server summary}; run_meta: summary's "run"."""
    writer = RecordWriter(tmp_path / "records.jsonl")
    summary_steps = []
    for level, records in steps.items():
        for r in records:
            writer.write(r)
        s = {"step": records[0].step, "mode": "concurrency", "concurrency": level,
             "input_tokens": records[0].input_tokens, "output_tokens": 10, **calculate_metrics(records)}
        s["phases"] = phase_split(s)
        s["server"] = (server or {}).get(level, {})
        summary_steps.append(s)
    writer.close()
    (tmp_path / "summary.json").write_text(json.dumps({"run": run_meta or {}, "steps": summary_steps}))
    if samples:
        (tmp_path / "server_metrics.jsonl").write_text("\n".join(json.dumps(s) for s in samples))
    return RunDir.open(tmp_path)


def checks(run):
    return {f.check for f in diagnose(run)}


def test_decode_dominates(tmp_path):
    run = make_run(tmp_path, {1: [record(i, "c1", 0.01, [0.02] * 20) for i in range(5)]})
    found = [f for f in diagnose(run) if f.check == "decode_dominates"]
    assert found and "FP8" in found[0].lever and "%" in found[0].evidence


def test_decode_dominates_lever_offers_only_the_byte_cuts_the_run_has_not_taken(tmp_path):
    records = {1: [record(i, "c1", 0.01, [0.02] * 20) for i in range(5)]}

    def lever(directory, **meta):
        found = [f for f in diagnose(make_run(directory, records, run_meta=meta)) if f.check == "decode_dominates"]
        return found[0].lever

    fp8 = lever(tmp_path / "a", qformat="fp8", kv_cache_dtype="none")
    assert "INT4-AWQ" in fp8 and "FP8 or" not in fp8 and "FP8 KV cache" in fp8
    compact = lever(tmp_path / "b", qformat="int4_awq", kv_cache_dtype="fp8")
    assert "already compact" in compact and "INT4-AWQ weights" not in compact


def test_prefill_heavy_run_is_not_decode_dominated(tmp_path):
    run = make_run(tmp_path, {1: [record(i, "c1", 1.0, [0.01] * 5) for i in range(5)]})
    assert "decode_dominates" not in checks(run)


def test_queueing_from_server_queue_time(tmp_path):
    run = make_run(tmp_path, {4: [record(i, "c4", 0.2, [0.01] * 5) for i in range(5)]},
                   server={4: {"tensorrt_llm": {"queue_ms_per_request": 150.0, "compute_ms_per_request": 5.0}}})
    found = [f for f in diagnose(run) if f.check == "queueing"]
    assert found and "150.0 ms of 200.0 ms" in found[0].evidence


def test_queueing_in_the_tokenizer_names_the_python_models(tmp_path):
    """Requests that wait for the tokenizer (preprocessing) show in the queue's breakdown, and the lever is its
    instances, not the engine's batch."""
    records = [record(i, "c4", 0.2, [0.01] * 5) for i in range(5)]
    run = make_run(tmp_path / "tokenizer", {4: records}, run_meta={"engine": {"python_model_instances": 1}},
                   server={4: {"preprocessing": {"queue_ms_per_request": 120.0},
                               "tensorrt_llm": {"queue_ms_per_request": 10.0}}})
    found = [f for f in diagnose(run) if f.check == "queueing"][0]
    assert "130.0 ms of 200.0 ms" in found.evidence and "preprocessing 120.0, tensorrt_llm 10.0 ms" in found.evidence
    assert "engine.python_model_instances, now 1" in found.lever
    engine_bound = make_run(tmp_path / "engine", {4: records},
                            server={4: {"preprocessing": {"queue_ms_per_request": 10.0},
                                        "tensorrt_llm": {"queue_ms_per_request": 120.0}}})
    found = [f for f in diagnose(engine_bound) if f.check == "queueing"][0]
    assert "python_model_instances" not in found.lever and "max_batch_size" in found.lever


def test_itl_growth_names_the_detokenizer_where_its_queue_is_a_tenth_of_the_gap(tmp_path):
    steps = {1: [record(i, "c1", 0.05, [0.02] * 10) for i in range(5)],
             4: [record(i, "c4", 0.06, [0.05] * 10) for i in range(5, 10)]}
    slow = make_run(tmp_path / "slow", steps, server={4: {"postprocessing": {"queue_ms_per_request": 6.0}}})
    found = [f for f in diagnose(slow) if f.check == "itl_grows_with_load"][0]
    assert "each response waited 6.00 ms for the detokenizer (postprocessing) at c4, 12 % of its ITL" in found.evidence
    assert "python_model_instances" in found.lever
    quick = make_run(tmp_path / "quick", steps, server={4: {"postprocessing": {"queue_ms_per_request": 1.0}}})
    found = [f for f in diagnose(quick) if f.check == "itl_grows_with_load"][0]
    assert "detokenizer" not in found.evidence and "python_model_instances" not in found.lever


def test_kv_cache_near_full(tmp_path):
    run = make_run(tmp_path, {8: [record(i, "c8", 0.1, [0.01] * 5) for i in range(5)]},
                   server={8: {"kv_cache": {"source": "cpu_engine", "blocks_used_max": 125, "blocks_max": 128,
                                            "blocks_used_mean": 100, "utilization_max": 125 / 128}}})
    assert "kv_cache_full" in checks(run)


def test_ttft_grows_while_itl_flat(tmp_path):
    run = make_run(tmp_path, {1: [record(i, "c1", 0.05, [0.02] * 10) for i in range(5)],
                              8: [record(i, "c8", 0.15, [0.021] * 10) for i in range(5, 10)]})
    found = {f.check: f for f in diagnose(run)}
    assert "ttft_grows_itl_flat" in found and "chunked prefill" in found["ttft_grows_itl_flat"].lever


def test_itl_spikes_in_one_step(tmp_path):
    gaps = [0.01] * 30 + [0.2]
    run = make_run(tmp_path, {2: [record(i, "c2", 0.05, gaps) for i in range(5)]})
    assert "itl_spikes" in checks(run)


STALLED_GAPS = ([0.005] * 12 + [0.06]) * 5  # a 60 ms stall after every 12 tokens of 5 ms


def _stalls(records):
    return [(a, b) for r in records for a, b in zip(r.chunk_times, r.chunk_times[1:]) if b - a > 0.05]


def _timeline(tmp_path, steps):
    """engine_timeline.jsonl from (start, duration, prefill tokens, decode tokens) on the records' clock."""
    (tmp_path / "engine_timeline.jsonl").write_text("".join(json.dumps(
        {"step": i, "start": 1e9 + mono, "mono": mono, "duration": duration, "forward": duration, "batch_size": 1,
         "context_requests": int(prefill > 0), "generation_requests": 1, "prefill_tokens": prefill,
         "decode_tokens": decode, "draft_tokens": 0, "accepted_tokens": 0, "kv_blocks_used": 4, "kv_blocks_max": 32,
         "waiting": 0, "preempted": 0}) + "\n" for i, (mono, duration, prefill, decode) in enumerate(steps)))


def _spikes(run):
    return [f for f in diagnose(run) if f.check == "itl_spikes"][0]


def test_stalls_the_engine_stepped_through_are_the_response_path_not_prefill(tmp_path):
    """The embedded engine kept its 5 ms steps through each stall: its tokens were made on time and reached the
    client late (the demo's stalls at concurrency 1-8 were mostly these, 2026-11-27)."""
    records = [record(0, "c1", 0.05, STALLED_GAPS)]
    run = make_run(tmp_path, {1: records})
    _timeline(tmp_path, [(0.05 + 0.005 * k, 0.004, 0, 1) for k in range(200)])
    found = _spikes(run)
    assert "puts the 5 gaps over 15.0 ms as 100 % delivery" in found.evidence
    # the embedded engine on the CPU shares the host's cores with the serving processes
    assert "engine.cpu_threads below the core count (now every core)" in found.lever
    assert "engine.stream_interval above 1 (now 1)" in found.lever
    assert "detokenizer (postprocessing) model" in found.lever and "prefill" not in found.lever
    gpu = make_run(tmp_path / "gpu", {1: records}, run_meta={"engine": {"device": "cuda"}})
    _timeline(tmp_path / "gpu", [(0.05 + 0.005 * k, 0.004, 0, 1) for k in range(200)])
    found = _spikes(gpu)
    assert found.lever.startswith("the response path held tokens") and "cpu_threads" not in found.lever


def test_delivery_stalls_name_a_client_in_another_session_first(tmp_path):
    """The sweep recorded that it ran in another session's scheduler autogroup than the local server: on a host
    the server fills, that client waits for cores, and that is named before the response path's other parts."""
    split = {"client": "/autogroup-476", "server": "/autogroup-561"}
    run = make_run(tmp_path, {1: [record(0, "c1", 0.05, STALLED_GAPS)]}, run_meta={"host_scheduling": split})
    _timeline(tmp_path, [(0.05 + 0.005 * k, 0.004, 0, 1) for k in range(200)])
    found = _spikes(run)
    assert found.lever.startswith("the sweep client ran in another session than the server on this host "
                                  "(scheduler autogroups /autogroup-476 / /autogroup-561)")
    assert "kernel.sched_autogroup_enabled=0" in found.lever and "engine.stream_interval" in found.lever


def test_stalls_in_one_long_engine_step_are_the_host_and_in_prefill_steps_are_prefill(tmp_path):
    stalls = _stalls([record(0, "c2", 0.05, STALLED_GAPS)])
    for prefill, expected, lever in ((0, "100 % engine step", "the host held the engine back"),
                                     (300, "100 % prefill", "a prefill is blocking running decodes")):
        path = tmp_path / str(prefill)
        path.mkdir()
        run = make_run(path, {2: [record(0, "c2", 0.05, STALLED_GAPS)]})
        # the engine's ordinary steps, and one step filling each stall
        _timeline(path, [(0.05 + 0.005 * k, 0.004, 0, 1) for k in range(200)]
                  + [(a + 0.001, b - a - 0.002, prefill, 1) for a, b in stalls])
        found = _spikes(run)
        assert expected in found.evidence and lever in found.lever, found
        # the embedded engine on the CPU: the serving processes take its cores mid-step
        assert ("engine.stream_interval above 1 (now 1)" in found.lever) == (prefill == 0)


def test_stalls_without_a_timeline_at_concurrency_1_are_not_blamed_on_prefill(tmp_path):
    one = _spikes(make_run(tmp_path / "c1", {1: [record(0, "c1", 0.05, STALLED_GAPS)]}))
    assert "no other request was in flight" in one.evidence and "not another request's prefill" in one.lever
    two = _spikes(make_run(tmp_path / "c2", {2: [record(0, "c2", 0.05, STALLED_GAPS)]}))
    assert "a prefill blocking running decodes" in two.lever and "response path" in two.lever


def test_itl_grows_with_context_within_a_step(tmp_path):
    records = [record(i, "c1", 0.05, [0.01 + 0.0001 * isl] * 10, isl=isl) for i, isl in enumerate(range(50, 500, 50))]
    run = make_run(tmp_path, {1: records})
    assert "itl_grows_with_context" in checks(run)


def test_memory_flat_is_explained_not_flagged(tmp_path):
    samples = [{"time": t, "step": "c1", "metrics": {'nv_gpu_memory_used_bytes{gpu_uuid="x"}': 70e9}} for t in range(5)]
    run = make_run(tmp_path, {1: [record(i, "c1", 0.5, [0.01] * 3) for i in range(5)]}, samples=samples)
    found = [f for f in diagnose(run) if f.check == "memory_flat"]
    assert found and found[0].severity == "info" and "reserved at start-up" in found[0].lever


def test_a_healthy_run_has_no_warnings_and_doctor_md_says_so(tmp_path):
    run = make_run(tmp_path, {1: [record(i, "c1", 0.5, [0.01] * 10) for i in range(5)]})
    assert diagnose(run) == []
    assert "No findings" in write_doctor(run, []).read_text()


def test_itl_grows_with_load(tmp_path):
    run = make_run(tmp_path, {1: [record(i, "c1", 0.05, [0.02] * 10) for i in range(5)],
                              4: [record(i, "c4", 0.06, [0.05] * 10) for i in range(5, 10)]})
    found = {f.check: f for f in diagnose(run)}
    assert "itl_grows_with_load" in found and "×2.5" in found["itl_grows_with_load"].evidence
    assert "ttft_grows_itl_flat" not in found


def run_with_engine(tmp_path, engine, ttft_low, ttft_high, high=8, server_high=None):
    """Two concurrency steps, the run's engine settings recorded as the sweep records them."""
    run = make_run(tmp_path, {1: [record(i, "c1", ttft_low, [0.02] * 10) for i in range(5)],
                              high: [record(i, f"c{high}", ttft_high, [0.021] * 10) for i in range(5, 10)]},
                   server={high: server_high or {}})
    run.summary["run"] = {"engine": engine}
    return run


def test_ttft_growing_slower_than_load_is_not_waiting(tmp_path):
    # The demo's case: TTFT ×4.1 for load ×8 with Triton's queue ~0 is not "requests wait".
    run = run_with_engine(tmp_path, {"max_batch_size": 8, "enable_chunked_context": True}, 0.05, 0.205,
                          server_high={"tensorrt_llm": {"queue_ms_per_request": 0.02, "compute_ms_per_request": 1}})
    assert "queueing" not in checks(run)


def test_levers_already_pulled_are_not_advised(tmp_path):
    run = run_with_engine(tmp_path, {"max_batch_size": 8, "enable_chunked_context": True, "max_num_tokens": 1024},
                          0.05, 1.5, server_high={"tensorrt_llm": {"queue_ms_per_request": 0.02,
                                                                   "compute_ms_per_request": 1}})
    found = {f.check: f for f in diagnose(run)}
    queueing = found["queueing"]
    assert "do not wait in Triton's queue" in queueing.summary and "queue 0.0 ms" in queueing.evidence
    for finding in found.values():
        assert "raise max_batch_size" not in finding.lever and "enable chunked prefill" not in finding.lever
    assert "max_num_tokens (1024)" in queueing.lever


def test_levers_left_open_are_advised(tmp_path):
    run = run_with_engine(tmp_path, {"max_batch_size": 4, "enable_chunked_context": False}, 0.05, 1.5)
    found = {f.check: f for f in diagnose(run)}
    assert found["queueing"].summary.startswith("Requests wait for a batch slot")
    assert "raise max_batch_size (4) to the concurrency (8)" in found["queueing"].lever
    assert "enable chunked prefill" in found["queueing"].lever
    assert "enable chunked prefill" in found["ttft_grows_itl_flat"].lever
