"""The planner's numbers against first-principles figures (issue: `toolkit plan`)."""

import json

import pytest

from toolkit.errors import ToolkitError
from toolkit.model.presets import known_model_spec
from toolkit.plan.gpus import GPUS, gpu_spec
from toolkit.plan.memory import Deployment, kv_bytes_per_token, plan_memory, smallest_tp_that_fits, weight_bytes
from toolkit.plan.roofline import allreduce_seconds, matmul_intensity, phase_intensity, plan_roofline
from toolkit.plan.stage import make_plan, render_table, write_plan

H100 = GPUS["h100-sxm"]


def test_llama2_70b_bf16_on_one_h100():
    spec = known_model_spec("llama-2-70b")
    d = Deployment(isl=1000, osl=200)
    mem = plan_memory(spec, H100, d)
    assert mem.weight_bytes_total / 1e9 == pytest.approx(140, rel=0.03)
    assert not mem.fits
    roof = plan_roofline(spec, H100, d, mem)
    assert 0.040 <= roof.decode_step_floor_s <= 0.050


def test_70b_prefill_of_1000_tokens_at_989_tflops():
    spec = known_model_spec("llama-2-70b")
    d = Deployment(isl=1000, osl=1)
    roof = plan_roofline(spec, H100, d, plan_memory(spec, H100, d))
    assert roof.prefill_floor_s == pytest.approx(0.14, rel=0.03)
    assert roof.prefill_expected_s == pytest.approx(roof.prefill_floor_s / 0.6)


def test_matmul_intensities_and_h100_crossover():
    assert matmul_intensity(1000, 4096, 4096) == pytest.approx(678, rel=0.02)
    assert matmul_intensity(1, 4096, 4096) == pytest.approx(1, rel=0.01)
    assert 295 <= H100.crossover("bf16") <= 330


def test_llama2_13b_fp16_kv_and_fit():
    spec = known_model_spec("llama-2-13b")
    assert kv_bytes_per_token(spec, "fp16") / 1e6 == pytest.approx(0.8, rel=0.03)
    assert kv_bytes_per_token(spec, "fp16") * 4096 / 1e9 == pytest.approx(3.4, rel=0.03)
    assert weight_bytes(spec, "fp16") / 1e9 == pytest.approx(26, rel=0.02)
    d = Deployment(weights="fp16", kv_dtype="fp16")
    gpu24 = GPUS["rtx-4090"]
    assert not plan_memory(spec, gpu24, d).fits
    assert plan_memory(spec, gpu24, Deployment(weights="fp16", kv_dtype="fp16", tp=2)).fits
    assert smallest_tp_that_fits(spec, gpu24, d) == 2


def test_batching_raises_decode_intensity_until_crossover():
    spec = known_model_spec("llama-3-8b")
    base = phase_intensity(spec, 1, "bf16")
    for n in (2, 8, 32, 64):
        assert phase_intensity(spec, n, "bf16") == pytest.approx(n * base, rel=0.05)
    assert phase_intensity(spec, 1024, "bf16") > H100.crossover()
    d = Deployment(isl=2048, osl=256, max_seq_len=4096)
    points = plan_roofline(spec, H100, d, plan_memory(spec, H100, d)).decode_by_batch
    rates = [p.tokens_per_second for p in points]
    assert rates == sorted(rates)  # more batch, more throughput, until a bound
    assert points[0].bound == "memory" and points[-1].bound in ("compute", "capacity")


def test_quantized_weights_shrink_and_speed_decode():
    spec = known_model_spec("llama-3-8b")
    bf16 = weight_bytes(spec, "bf16")
    assert weight_bytes(spec, "fp8") < 0.6 * bf16
    assert weight_bytes(spec, "int4") < weight_bytes(spec, "fp8")
    steps = {}
    for w in ("bf16", "fp8", "int4"):
        d = Deployment(weights=w)
        steps[w] = plan_roofline(spec, H100, d, plan_memory(spec, H100, d)).decode_step_floor_s
    assert steps["int4"] < steps["fp8"] < steps["bf16"]


def test_tensor_parallel_adds_allreduce_cost():
    assert allreduce_seconds(1e6, 1, 450e9, 5e-6) == 0
    assert allreduce_seconds(1e6, 2, 450e9, 5e-6) == pytest.approx(1e6 / 450e9 + 5e-6)
    spec = known_model_spec("llama-2-70b")
    d = Deployment(tp=4)
    roof = plan_roofline(spec, H100, d, plan_memory(spec, H100, d))
    assert roof.decode_allreduce_s > 0
    assert roof.decode_step_floor_s == pytest.approx(weight_bytes(spec, "bf16") / 4 / H100.bandwidth_bytes
                                                     + roof.decode_allreduce_s, rel=0.05)


@pytest.mark.parametrize("kwargs, message", [
    ({"tp": 3}, "does not divide the 64 attention heads"),
    ({"batch": 0}, "batch must be positive"),
    ({"isl": -5}, "isl must be positive"),
    ({"kv_free_mem_fraction": 1.5}, "kv free memory fraction"),
    ({"isl": 4000, "osl": 200}, "exceeds max_seq_len"),
])
def test_bad_deployments(kwargs, message):
    with pytest.raises(ToolkitError, match=message):
        make_plan(known_model_spec("llama-2-70b"), H100, Deployment(**kwargs))


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ToolkitError, match="h100-sxm"):
        gpu_spec("h100")
    with pytest.raises(ToolkitError, match="qwen2.5-7b"):
        known_model_spec("llama-9")


def test_every_gpu_is_cited_and_sane():
    for gpu in GPUS.values():
        assert gpu.source and gpu.memory_gb > 0 and gpu.bandwidth_tbs > 0 and gpu.bf16_tflops > 0


def test_plan_outputs(tmp_path):
    plan = make_plan(known_model_spec("mistral-7b"), GPUS["l40s"], Deployment(weights="fp8", kv_dtype="fp8"))
    paths = write_plan(plan, tmp_path)
    assert json.loads(paths["plan"].read_text())["memory"]["fits"] is True
    assert paths["roofline"].read_bytes()[:4] == b"\x89PNG"
    assert "KV capacity" in render_table(plan)


def test_cpu_probe_is_measured_once_and_cached(tmp_path, monkeypatch):
    from toolkit.plan import cpu_probe

    monkeypatch.setattr(cpu_probe, "CACHE", tmp_path / "cpu_probe.json")
    first = cpu_probe.cpu_spec()
    assert first.name == "cpu" and first.bandwidth_tbs > 0 and first.bf16_tflops > 0 and first.memory_gb > 1
    assert (tmp_path / "cpu_probe.json").is_file()
    measured = json.loads((tmp_path / "cpu_probe.json").read_text())["measured"]
    assert cpu_probe.cpu_spec().source == first.source and measured in first.source  # read back, not re-measured


def test_plan_cli_table_and_errors(tmp_path):
    import subprocess
    import sys

    ok = subprocess.run([sys.executable, "-m", "toolkit", "plan", "-m", "llama-2-13b", "-g", "rtx-4090",
                         "--weights", "fp16", "--kv-dtype", "fp16", "--out", str(tmp_path)],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "smallest TP that fits: 2" in ok.stdout
    assert (tmp_path / "plan.json").is_file() and (tmp_path / "roofline.png").is_file()
    bad = subprocess.run([sys.executable, "-m", "toolkit", "plan", "-m", "llama-2-7b", "-g", "h100", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.startswith("error: unknown GPU 'h100'") and "h100-sxm" in bad.stderr
    listing = subprocess.run([sys.executable, "-m", "toolkit", "plan", "--list-gpus"], capture_output=True, text=True,
                             timeout=120)
    assert "h200" in listing.stdout and "datasheet" in listing.stdout
