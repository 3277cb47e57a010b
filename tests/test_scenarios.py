"""Scenarios and the doctor's workload symptoms.

The doctor checks run on run directories crafted in the sweep's own format (records.jsonl,
summary.json, server_metrics.jsonl, engine_timeline.jsonl) with and without each symptom; the
scenario catalog is validated against the shipped configs; one scenario runs end to end on a real
Triton server with the tiny model (e2e)."""

import json
import math
from pathlib import Path

import pytest

from toolkit.bench.metrics import calculate_metrics, phase_split
from toolkit.bench.records import RecordWriter, RequestRecord
from toolkit.bench.rundir import RunDir
from toolkit.config import load_config
from toolkit.report.doctor import diagnose
from toolkit.report.doctor_workloads import counter_deltas, prefill_floor_ms
from toolkit.scenarios.catalog import SCENARIOS, scenario
from toolkit.scenarios.run import lever_gaps, scenario_config, write_scenario_report
from toolkit.ab.run import variant_config
from toolkit.errors import ToolkitError


def stream(i, step, send, ttft, gaps, isl=16, cls=None, session=None, turn=None):
    chunks = [send + ttft]
    for g in gaps:
        chunks.append(chunks[-1] + g)
    return RequestRecord(i, step, send, isl, len(chunks), chunk_times=chunks, end_time=chunks[-1],
                         output_tokens=len(chunks), request_class=cls, session=session, turn=turn)


def make_run(path: Path, steps: dict, info=None, samples=None, timeline=None, server=None):
    """steps: {step name: (concurrency, [records])}."""
    path.mkdir(parents=True, exist_ok=True)
    writer = RecordWriter(path / "records.jsonl")
    out = []
    for name, (level, records) in steps.items():
        for r in records:
            writer.write(r)
        s = {"step": name, "mode": "concurrency", "concurrency": level,
             "input_tokens": records[0].input_tokens, "output_tokens": 8, **calculate_metrics(records)}
        s["phases"] = phase_split(s)
        s["server"] = (server or {}).get(name, {})
        out.append(s)
    writer.close()
    (path / "summary.json").write_text(json.dumps({"run": info or {}, "steps": out}))
    if samples:
        (path / "server_metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    if timeline:
        (path / "engine_timeline.jsonl").write_text("".join(json.dumps(t) + "\n" for t in timeline))
    return RunDir.open(path)


def found(run, check):
    return [f for f in diagnose(run) if f.check == check]


def stalled_streams(prefill_at):
    """Two short streams with 5 ms gaps, and a 40 ms stall around each time in `prefill_at`."""
    records = []
    for i in range(2):
        t, gaps = 0.0 + 0.002 * i, []
        for _ in range(60):
            stall = any(t < p < t + 0.045 for p in prefill_at) and not any(t - 0.045 < p < t for p in prefill_at)
            gap = 0.040 if stall else 0.005
            gaps.append(gap)
            t += gap
        records.append(stream(i, "concurrency_2", -0.01, 0.01 + 0.002 * i, gaps, cls="short"))
    return records


def timeline_step(mono, duration, prefill, decode=2):
    return {"step": 0, "start": 1e9 + mono, "mono": mono, "duration": duration, "forward": duration,
            "batch_size": 3, "context_requests": int(prefill > 0), "generation_requests": 2, "prefill_tokens": prefill,
            "decode_tokens": decode, "draft_tokens": 0, "accepted_tokens": 0, "kv_blocks_used": 4, "kv_blocks_max": 32,
            "waiting": 0, "preempted": 0}


PREFILLS = [0.06, 0.12, 0.18, 0.24, 0.30, 0.36]


def test_itl_spikes_coinciding_with_engine_prefill_steps(tmp_path):
    records = stalled_streams(PREFILLS)
    # While a long prefill step runs, no stream gets a token: the step fills the stall.
    stalls = [(a, b) for a, b in zip(records[0].chunk_times, records[0].chunk_times[1:]) if b - a > 0.03]
    timeline = [timeline_step(a + 0.001, b - a - 0.002, 200) for a, b in stalls] + \
               [timeline_step(k * 0.005, 0.004, 0) for k in range(80)]
    run = make_run(tmp_path, {"concurrency_2": (2, records)}, info={"engine": {"enable_chunked_context": False,
                                                                               "max_num_tokens": 1024}},
                   timeline=timeline)
    f = found(run, "itl_spikes_with_prefill")
    assert f and "mostly filled by engine steps carrying prefill tokens" in f[0].evidence
    assert "up to 200 prompt tokens" in f[0].evidence
    assert "enable_chunked_context" in f[0].lever


def test_itl_spikes_elsewhere_than_prefill_are_not_blamed_on_it(tmp_path):
    records = stalled_streams(PREFILLS)
    timeline = [timeline_step(p + 0.2, 0.001, 200) for p in (1.0, 2.0)] + \
               [timeline_step(k * 0.005, 0.004, 0) for k in range(80)]
    run = make_run(tmp_path, {"concurrency_2": (2, records)}, timeline=timeline)
    assert not found(run, "itl_spikes_with_prefill")


def test_itl_spikes_from_records_alone_when_no_timeline(tmp_path):
    records = stalled_streams(PREFILLS)
    longs = [stream(10 + k, "concurrency_2", p - 0.03, 0.03, [0.001], isl=230, cls="long") for k, p in enumerate(PREFILLS)]
    run = make_run(tmp_path, {"concurrency_2": (2, records + longs)},
                   info={"engine": {"enable_chunked_context": True, "max_num_tokens": 512}})
    f = found(run, "itl_spikes_with_prefill")
    assert f and "other requests' first tokens" in f[0].evidence and "max_num_tokens (now 512)" in f[0].lever


def test_stalls_beside_small_prefill_chunks_are_not_blamed_on_them(tmp_path):
    """Chunked prefill: every few steps carry a short chunk, but the stalls are far longer than those steps."""
    records = stalled_streams(PREFILLS)
    timeline = [timeline_step(k * 0.02, 0.002, 32) for k in range(20)] + \
               [timeline_step(k * 0.005, 0.004, 0) for k in range(80)]
    assert not found(make_run(tmp_path, {"concurrency_2": (2, records)}, timeline=timeline), "itl_spikes_with_prefill")


def test_steady_streams_have_no_prefill_spikes(tmp_path):
    records = stalled_streams([])
    run = make_run(tmp_path, {"concurrency_2": (2, records)}, timeline=[timeline_step(0.1, 0.01, 100)])
    assert not found(run, "itl_spikes_with_prefill")


def plan_info(path: Path) -> dict:
    """plan.json as the sweep writes it beside a run: llama-3-8b, bf16, one H100."""
    from toolkit.model.presets import known_model_spec
    from toolkit.plan.gpus import catalog_gpu
    from toolkit.plan.memory import Deployment
    from toolkit.plan.stage import make_plan

    d = Deployment(tp=1, pp=1, weights="bf16", kv_dtype="bf16", kv_free_mem_fraction=0.9, runtime_overhead_gb=2.0,
                   max_seq_len=4096, max_num_tokens=8192, batch=1, isl=1024, osl=128, prefill_efficiency=0.6)
    path.mkdir(parents=True, exist_ok=True)
    (path / "plan.json").write_text(json.dumps(make_plan(known_model_spec("llama-3-8b"), catalog_gpu("h100-sxm"), d)))
    return {}


def length_steps(ttft_ms):
    return {f"concurrency_1_isl{isl}_osl8": (1, [stream(i, f"concurrency_1_isl{isl}_osl8", 0.0, ms / 1e3, [0.01] * 7,
                                                       isl=isl) for i in range(4)]) for isl, ms in ttft_ms.items()}


def test_ttft_far_beyond_the_prefill_floor(tmp_path):
    run = make_run(tmp_path, length_steps({256: 60.0, 512: 250.0, 1024: 640.0}), info=plan_info(tmp_path))
    floor = prefill_floor_ms(run, 1024)
    assert floor is not None and 10 < floor < 100  # llama-3-8b on one H100: tens of ms for 1024 tokens
    f = found(run, "ttft_beyond_prefill_floor")
    assert f and "256 → 1024 prompt tokens" in f[0].evidence and "floor" in f[0].evidence


def test_ttft_near_the_floor_is_silent(tmp_path):
    probe = make_run(tmp_path / "probe", length_steps({256: 1.0}), info=plan_info(tmp_path / "probe"))
    near = {isl: 1.3 * prefill_floor_ms(probe, isl) for isl in (256, 512, 1024)}
    run = make_run(tmp_path / "run", length_steps(near), info=plan_info(tmp_path / "run"))
    assert not found(run, "ttft_beyond_prefill_floor")
    assert not found(make_run(tmp_path / "noplan", length_steps({256: 60.0, 1024: 640.0})), "ttft_beyond_prefill_floor")


def samples(step, **counters_by_time):
    """Two metrics samples of one step: every counter at 0 then at its value."""
    return [{"time": 0.0, "step": step, "metrics": {k: 0.0 for k in counters_by_time}},
            {"time": 1.0, "step": step, "metrics": dict(counters_by_time)}]


def test_kv_exhaustion_names_the_blocks_the_batch_needs(tmp_path):
    records = [stream(i, "concurrency_8", 0.0, 0.5 + 0.1 * i, [0.01] * 7) for i in range(8)]
    engine = {"kv_cache_blocks": 13, "max_batch_size": 8, "max_seq_len": 384, "tokens_per_block": 32}
    run = make_run(tmp_path, {"concurrency_8": (8, records)}, info={"engine": engine},
                   samples=samples("concurrency_8", toolkit_kv_cache_admission_waits_total=6.0),
                   server={"concurrency_8": {"kv_cache": {"blocks_used_max": 13, "blocks_max": 13, "utilization_max": 1.0,
                                                          "source": "cpu_engine"}}})
    f = found(run, "kv_exhaustion")
    assert f and "6 requests waited for KV blocks" in f[0].evidence and "13 of 13 blocks" in f[0].evidence
    assert "need 96 blocks" in f[0].lever


def test_kv_exhaustion_silent_when_nobody_waited(tmp_path):
    records = [stream(i, "concurrency_8", 0.0, 0.05, [0.01] * 7) for i in range(8)]
    run = make_run(tmp_path, {"concurrency_8": (8, records)},
                   samples=samples("concurrency_8", toolkit_kv_cache_admission_waits_total=0.0,
                                   toolkit_preemptions_total=0.0))
    assert not found(run, "kv_exhaustion")


def shared_prefix_info(reuse):
    return {"engine": {"enable_kv_cache_reuse": reuse},
            "sweep": {"workload": {"kind": "shared_prefix", "prefixes": 2, "prefix_tokens": 96, "users_per_prefix": 4}}}


def test_low_prefix_reuse_when_reuse_is_off(tmp_path):
    records = [stream(i, "concurrency_2", 0.0, 0.05, [0.01] * 7, isl=112) for i in range(8)]
    run = make_run(tmp_path, {"concurrency_2": (2, records)}, info=shared_prefix_info(False))
    f = found(run, "low_prefix_reuse")
    assert f and "enable_kv_cache_reuse: false" in f[0].evidence and "2 system prompt(s) of 96 tokens" in f[0].evidence


def test_low_prefix_reuse_from_the_servers_hit_counter(tmp_path):
    records = [stream(i, "concurrency_2", 0.0, 0.05, [0.01] * 7, isl=112) for i in range(8)]
    low = make_run(tmp_path / "low", {"concurrency_2": (2, records)}, info=shared_prefix_info(True),
                   samples=samples("concurrency_2", toolkit_kv_cache_reuse_hits_total=2.0,
                                   toolkit_kv_cache_reuse_misses_total=30.0))
    f = found(low, "low_prefix_reuse")
    assert f and "reused 2 of 32 prompt blocks" in f[0].evidence
    good = make_run(tmp_path / "good", {"concurrency_2": (2, records)}, info=shared_prefix_info(True),
                    samples=samples("concurrency_2", toolkit_kv_cache_reuse_hits_total=18.0,
                                    toolkit_kv_cache_reuse_misses_total=14.0))
    assert not found(good, "low_prefix_reuse")
    plain = make_run(tmp_path / "plain", {"concurrency_2": (2, records)}, info={"engine": {"enable_kv_cache_reuse": False}})
    assert not found(plain, "low_prefix_reuse")


def test_itl_growing_with_context_over_a_conversation(tmp_path):
    records = [stream(s * 6 + t, "concurrency_2", 0.0, 0.02, [0.004 + 0.002 * t] * 15, isl=24 + 40 * t,
                      session=f"s{s}", turn=t) for s in range(2) for t in range(6)]
    run = make_run(tmp_path, {"concurrency_2": (2, records)})
    assert found(run, "itl_grows_with_context")
    flat = [stream(s * 6 + t, "concurrency_2", 0.0, 0.02, [0.004 + 0.0001 * ((s + t) % 2)] * 15, isl=24 + 40 * t)
            for s in range(2) for t in range(6)]
    assert not found(make_run(tmp_path / "flat", {"concurrency_2": (2, flat)}), "itl_grows_with_context")


def test_counter_deltas_sum_labels_and_skip_absent_counters():
    s = [{"metrics": {"toolkit_preemptions_total": 1.0}}, {"metrics": {"toolkit_preemptions_total": 4.0}}]
    assert counter_deltas(s) == {"toolkit_preemptions_total": 3.0}


@pytest.mark.parametrize("config_path", ["configs/cpu-tiny.yaml", "configs/cpu-small.yaml"])
def test_every_scenario_and_its_variants_are_valid_configs(config_path):
    base = load_config(config_path)
    for sc in SCENARIOS.values():
        config = scenario_config(base, sc)
        assert config.name.endswith(sc.name)
        for label, overrides in (("baseline", sc.baseline(config)), (sc.fix_label, sc.fix(config))):
            variant = variant_config(config, label, {k: str(v) for k, v in overrides.items()})
            assert variant.sweep.workload.kind == config.sweep.workload.kind
        if sc.name == "oom":
            blocks = math.ceil(config.engine.max_seq_len / config.engine.tokens_per_block)
            assert sc.fix(config)["engine.kv_cache_blocks"] == str(config.engine.max_batch_size * blocks)


def test_unknown_scenario_names_the_choices():
    with pytest.raises(ToolkitError, match="stuttering-stream"):
        scenario("stutter")


def test_levers_the_served_engine_ignores_are_named():
    config = scenario_config(load_config("configs/cpu-tiny.yaml"), SCENARIOS["stuttering-stream"])
    from toolkit.scenarios.run import CPU_ENGINE_MODEL

    gaps = lever_gaps(config, SCENARIOS["stuttering-stream"])
    uses_runtime = "engine.runtime" in CPU_ENGINE_MODEL.read_text() or "from runtime" in CPU_ENGINE_MODEL.read_text()
    assert (gaps == []) == uses_runtime
    assert all("enable_chunked_context" in g for g in gaps)
    assert lever_gaps(config, SCENARIOS["chatty-slowdown"]) == []  # a workload-side fix needs no engine lever


def test_gpu_repositories_carry_the_fix_levers():
    """On the TensorRT-LLM target the fixes are backend parameters (held by `toolkit repo check`)."""
    from toolkit.repo.writer import trtllm_parameters

    base = load_config("configs/gpu-llama3-8b-fp8-tp2.yaml", {"engine.target": "trtllm"})
    for name, key in (("stuttering-stream", "enable_chunked_context"), ("shared-prefix", "enable_kv_cache_reuse")):
        sc = SCENARIOS[name]
        config = scenario_config(base, sc)
        for label, overrides, expected in (("baseline", sc.baseline(config), False), (sc.fix_label, sc.fix(config), True)):
            variant = variant_config(config, label, {k: str(v) for k, v in overrides.items()})
            assert trtllm_parameters(variant, Path("/engines/x"))[key] is expected
    assert lever_gaps(scenario_config(base, SCENARIOS["shared-prefix"]), SCENARIOS["shared-prefix"]) == []
    assert "not configured by this toolkit" in lever_gaps(scenario_config(base, SCENARIOS["speculative"]),
                                                          SCENARIOS["speculative"])[0]
    streams = SCENARIOS["streaming-overhead"]
    assert "C++ backend" in lever_gaps(scenario_config(base, streams), streams)[0]
    llmapi = load_config("configs/gpu-llama3-8b-fp8-tp2.yaml", {"engine.target": "llmapi"})
    assert lever_gaps(scenario_config(llmapi, streams), streams) == []


def test_scenario_report_from_runs_with_a_real_improvement(tmp_path):
    """Two repetitions each: the fix halves the short streams' stalls; the report says better, with an
    interval, and draws the figure."""
    runs = {}
    for label, stall in (("baseline", 0.040), ("chunked-prefill", 0.012)):
        runs[label] = []
        for rep in range(2):
            records = [stream(i, "concurrency_2", 0.0, 0.01, [0.005] * 20 + [stall + 0.001 * (i % 3)] + [0.005] * 20,
                              cls="short") for i in range(12)]
            records += [stream(20 + i, "concurrency_2", 0.0, 0.2, [0.001], isl=230, cls="long") for i in range(2)]
            runs[label].append(make_run(tmp_path / f"{label}-{rep}", {"concurrency_2": (2, records)},
                                        samples=samples("concurrency_2", toolkit_kv_cache_reuse_hits_total=0.0)))
    out = write_scenario_report(SCENARIOS["stuttering-stream"], runs, tmp_path / "out", [], [("baseline", {}),
                                                                                           ("chunked-prefill", {})])
    text = (out / "scenario.md").read_text()
    assert "**short streams' longest pause, concurrency_2: 41.0 → 13.0 ms (-68 %" in text and ": better.**" in text
    data = json.loads((out / "scenario.json").read_text())
    assert data["results"][0]["verdict"] == "better" and data["results"][0]["ci_high"] < 0
    assert (out / "scenario.png").stat().st_size > 10_000
    assert "## What `toolkit doctor` says" in text and "- baseline: " in text


@pytest.mark.e2e
def test_shared_prefix_scenario_end_to_end(tmp_path, tiny_model_dir):
    """`toolkit scenario` as a user runs it, on the tiny model with a real Triton server (one repetition)."""
    import yaml
    from click.testing import CliRunner

    from toolkit.cli import cli

    config = {"name": "scen", "model": {"source": str(tiny_model_dir), "name": "tiny"}, "quantize": {"qformat": "none"},
              "engine": {"max_batch_size": 4, "max_input_len": 96, "max_seq_len": 160, "kv_cache_blocks": 40,
                         "tokens_per_block": 16, "max_num_tokens": 256},
              "sweep": {"requests_per_step": 6, "warmup_requests": 1, "output_tokens": 8},
              "paths": {"build_dir": str(tmp_path / "build"), "repo_root": str(tmp_path / "repo"),
                        "runs_dir": str(tmp_path / "runs")}}
    path = tmp_path / "scen.yaml"
    path.write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(cli, ["scenario", "shared-prefix", "-c", str(path), "--repeat", "1",
                                      "--out", str(tmp_path / "scenarios")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = next((tmp_path / "scenarios").iterdir())
    data = json.loads((out / "scenario.json").read_text())
    assert set(data["runs"]) == {"baseline", "prefix-reuse"} and data["results"]
    assert data["results"][0]["title"] == "TTFT" and data["results"][0]["verdict"] == "noise"  # one repetition
    for label, paths in data["runs"].items():
        run = RunDir.open(paths[0])
        assert run.summary["run"]["sweep"]["workload"]["kind"] == "shared_prefix"
        assert {r.request_class for r in run.records() if not r.warmup} == {"prefix0", "prefix1"}
        assert run.summary["run"]["engine"]["enable_kv_cache_reuse"] == (label == "prefix-reuse")
    assert "prefix-reuse" in (out / "scenario.md").read_text() and (out / "scenario.png").is_file()


def test_itl_with_context_is_read_within_a_request_class(tmp_path):
    """A mixed workload: short streams' ITL is flat; the few long prompts decode slower beside them.
    Across classes ITL would correlate with prompt length; within each it does not."""
    shorts = [stream(i, "concurrency_2", 0.0, 0.02, [0.005] * 15, isl=14 + i % 4, cls="short") for i in range(12)]
    longs = [stream(20 + i, "concurrency_2", 0.0, 0.2, [0.02, 0.02], isl=230 + i, cls="long") for i in range(3)]
    assert not found(make_run(tmp_path, {"concurrency_2": (2, shorts + longs)}), "itl_grows_with_context")


RECORDED = Path(__file__).parent / "data" / "runs"  # real sweeps of the tiny model on this machine kind
WORKLOAD_CHECKS = {"itl_spikes_with_prefill", "ttft_beyond_prefill_floor", "kv_exhaustion", "low_prefix_reuse"}


def workload_findings(name):
    return {f.check: f for f in diagnose(RunDir.open(RECORDED / name)) if f.check in WORKLOAD_CHECKS}


def test_recorded_multi_turn_run_without_reuse(monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[1])
    found_ = workload_findings("multi_turn-reuse-off")
    assert set(found_) == {"low_prefix_reuse"} and "conversations of 4 turns" in found_["low_prefix_reuse"].evidence


def test_recorded_trace_run_names_its_repeating_blocks(monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[1])
    found_ = workload_findings("trace-reuse-off")
    assert set(found_) == {"low_prefix_reuse"} and "50 % seen before" in found_["low_prefix_reuse"].evidence


def test_recorded_dataset_run_has_no_workload_symptom(monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[1])
    assert workload_findings("dataset-sharegpt") == {}


def test_recorded_mixed_run_stalls_during_prefill_and_chunked_prefill_does_not():
    """Real runs of the stuttering-stream workload on the embedded engine (engine timeline included):
    without chunked prefill the short streams' stalls are the long prompts' prefill steps; with it, not."""
    stalled = workload_findings("mixed-chunking-off")
    assert set(stalled) == {"itl_spikes_with_prefill"}
    assert "enable_chunked_context" in stalled["itl_spikes_with_prefill"].lever
    assert workload_findings("mixed-chunked-prefill") == {}
