"""The planner's numbers against figures computed by hand (issue 12: `toolkit plan`; issue 16: the CPU roofline).

Parameter counts used below (Llama family, from the published config.json shapes):
- llama-3-8b: per layer attention 4096·(4096 + 2·1024) + 4096·4096 = 41,943,040, MLP 3·4096·14,336 =
  176,160,768, norms 8,192; × 32 layers + 2 · 128,256 · 4,096 (embeddings, lm_head) + 4,096
  = 8,030,261,248 parameters, of which 6,979,321,856 in the linears.
- llama-3-70b: per layer 150,994,944 + 704,643,072 + 16,384; × 80 + 2 · 128,256 · 8,192 + 8,192
  = 70,553,706,496; linears 68,451,041,280. llama-2-70b: vocab 32,000 → 68,976,648,192.
"""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from toolkit.config import load_config
from toolkit.errors import ToolkitError
from toolkit.model.presets import known_model_spec
from toolkit.model.spec import ModelSpec
from toolkit.plan.cpu_probe import spec_from_probe
from toolkit.plan.gpus import GPUS, hardware_spec
from toolkit.plan.memory import Deployment, kv_bytes_per_token, plan_memory, smallest_tp_that_fits, weight_bytes
from toolkit.plan.roofline import (allreduce_seconds, cpu_crossover_batch, cpu_decode_step, cpu_decode_step_seconds,
                                   cpu_prefill_seconds, matmul_intensity, phase_intensity, plan_roofline)
from toolkit.plan.stage import deployment_for_config, make_plan, render_table, write_plan
from toolkit.quantize.formats import QFORMATS, modelopt_config, weight_bytes_per_element

ROOT = Path(__file__).resolve().parents[1]
H100 = GPUS["h100-sxm"]
CPU_CONFIG = load_config(ROOT / "configs" / "cpu-tiny.yaml")


def _plan(model: str, gpu: str, **flags) -> dict:
    spec = known_model_spec(model)
    return make_plan(spec, hardware_spec(gpu), deployment_for_config(CPU_CONFIG, spec, gpu, **flags))


# --- GPU plans from the CPU demo's config get GPU defaults ----------------------------------------

def test_llama3_8b_on_one_h100_with_gpu_defaults():
    plan = _plan("llama-3-8b", "h100-sxm")
    d, m, r = plan["deployment"], plan["memory"], plan["roofline"]
    assert (d["weights"], d["kv_dtype"], d["max_seq_len"], d["tp"]) == ("bf16", "bf16", 8192, 1)
    assert d["kv_cache_tokens"] is None and (d["isl"], d["osl"]) == (1024, 128)
    assert m["weight_bytes_total"] == 2 * 8_030_261_248  # 16,060,522,496
    # Activations: 8,192 tokens × (3·4096 + 48·128 + 2·14,336) × 2 B = 771,751,936, + fp32 logits 8 × 128,256 × 4.
    assert m["activation_bytes_per_gpu"] == 771_751_936 + 4_104_192
    # Free = 80e9 − 16,060,522,496 − 775,856,128 − 2e9 = 61,163,621,376; × 0.9 / 131,072 B per token.
    assert m["free_bytes_per_gpu"] == pytest.approx(61_163_621_376)
    assert m["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2 == 131_072
    assert m["kv_capacity_tokens"] == 419_977 and m["fits"]
    # Prefill of 1,024 tokens: 2 · 8,030,261,248 · 1024 / 989e12 = 16.629 ms (docs/gpu-validation.md's floor).
    assert r["prefill_floor_s"] == pytest.approx(2 * 8_030_261_248 * 1024 / 989e12)
    # Decode at batch 1, mean context 1024 + 64: (16,060,522,496 + 1,088 · 131,072) / 3.35e12 = 4.837 ms.
    assert r["decode_step_floor_batch1_s"] == pytest.approx(16_203_128_832 / 3.35e12)
    by_batch = {p["batch"]: p["step_seconds"] for p in r["decode_by_batch"]}
    assert by_batch[8] == pytest.approx((16_060_522_496 + 8 * 142_606_336) / 3.35e12)  # 5.13 ms, as the doc
    assert by_batch[32] == pytest.approx((16_060_522_496 + 32 * 142_606_336) / 3.35e12)  # 6.16 ms
    assert r["decode_step_floor_s"] == by_batch[8]  # the planned batch's step, not batch 1's


def test_kv_fraction_and_every_flag_are_honoured():
    plan = _plan("llama-3-8b", "h100-sxm", kv_free_mem_fraction=0.5, max_seq_len=4096, batch=64, isl=2000,
                 osl=500, max_num_tokens=4096, runtime_overhead_gb=3.0)
    d, m = plan["deployment"], plan["memory"]
    assert (d["kv_free_mem_fraction"], d["max_seq_len"], d["batch"], d["isl"], d["osl"]) == (0.5, 4096, 64, 2000, 500)
    activations = 4096 * 47_104 * 2 + 64 * 128_256 * 4
    free = 80e9 - 16_060_522_496 - activations - 3e9
    assert m["kv_capacity_tokens"] == int(free * 0.5 // 131_072)


def test_llama3_70b_gets_kv_with_the_smallest_tp_that_fits():
    plan = _plan("llama-3-70b", "h100-sxm")
    d, m = plan["deployment"], plan["memory"]
    assert d["tp"] == 2 and plan["smallest_tp_that_fits"] == 2
    # Per GPU: 141,107,412,992 / 2 weights; activations 8,192 × (3·8192 + 80·128/2 + 28,672) × 2
    # = 956,301,312 + logits 8 × 64,128 × 4 = 2,052,096; free 6,487,940,096 × 0.9 / 163,840 B per token.
    assert m["weight_bytes_per_gpu"] == 70_553_706_496
    assert m["kv_bytes_per_token_per_gpu"] == 2 * 80 * 4 * 128 * 2
    assert m["kv_capacity_tokens"] == 35_639 and m["fits"]
    four = _plan("llama-3-70b", "h100-sxm", tp=4)["memory"]
    assert four["kv_capacity_tokens"] > 10 * m["kv_capacity_tokens"]
    one = _plan("llama-3-70b", "h100-sxm", tp=1)["memory"]
    assert one["kv_capacity_tokens"] == 0 and not one["fits"]


def test_llama2_70b_int4_awq_on_a100_decodes_at_the_bandwidth_floor():
    spec = known_model_spec("llama-2-70b")
    d = Deployment(weights="int4_awq", isl=1000, osl=200)
    # int4 + one fp16 scale per 128 weights = 0.515625 B; linears 68,451,041,280 × 0.515625
    # = 35,295,068,160; the rest (525,606,912 parameters) in bf16 = 1,051,213,824.
    assert weight_bytes_per_element("int4_awq") == 0.5 + 2 / 128
    assert weight_bytes(spec, "int4_awq") == 36_346_281_984
    a100 = GPUS["a100-80gb"]
    roof = plan_roofline(spec, a100, d, plan_memory(spec, a100, d))
    # KV: 1,100 tokens × 327,680 B = 360,448,000; (36,346,281,984 + 360,448,000) / 2.039e12 = 18.00 ms,
    # above the W4A16 compute time 2 · 68,976,648,192 / 312e12 = 0.44 ms.
    assert roof.decode_step_floor_batch1_s == pytest.approx(36_706_729_984 / 2.039e12)


def test_fp32_uses_the_fp32_peak():
    plan = _plan("llama-3-8b", "h100-sxm", weights="fp32", kv_dtype="fp32")
    r = plan["roofline"]
    assert r["crossover"] == pytest.approx(67e12 / 3.35e12)  # 20 FLOP/byte, not bf16's 295
    assert r["prefill_floor_s"] == pytest.approx(2 * 8_030_261_248 * 1024 / 67e12)  # 245 ms


def test_nvfp4_plans_on_blackwell_only():
    spec = known_model_spec("llama-3-70b")
    d = Deployment(weights="nvfp4", kv_dtype="fp8", isl=1000, osl=200)
    # fp4 + one fp8 scale per 16 weights = 0.5625 B: 68,451,041,280 × 0.5625 + 2,102,665,216 × 2.
    assert weight_bytes(spec, "nvfp4") == 38_503_710_720 + 4_205_330_432
    b200 = GPUS["b200"]
    roof = plan_roofline(spec, b200, d, plan_memory(spec, b200, d))
    assert roof.crossover == pytest.approx(9000e12 / 8e12)
    assert roof.prefill_floor_s == pytest.approx(2 * 70_553_706_496 * 1000 / 9000e12)
    with pytest.raises(ToolkitError, match="nvfp4 needs fp4 tensor cores .Blackwell.; h100-sxm has no fp4"):
        make_plan(spec, H100, d)
    with pytest.raises(ToolkitError, match="fp8 needs fp8 tensor cores.*a100-80gb has no fp8"):
        make_plan(spec, GPUS["a100-80gb"], Deployment(weights="fp8", tp=2))


def test_int8_sq_uses_int8_tensor_cores_and_w4a16_the_bf16_ones():
    assert H100.peak_flops("int8_sq") == 1979e12
    assert H100.peak_flops("int4_awq") == 989e12
    assert H100.peak_flops("w4a8_awq") == 1979e12
    assert GPUS["a100-80gb"].peak_flops("int8_sq") == 624e12


def test_a_gpu_config_keeps_its_own_values():
    config = load_config(ROOT / "configs" / "gpu-llama3-8b-fp8-tp2.yaml")
    d = deployment_for_config(config, known_model_spec("llama-3-8b"), "h100-sxm")
    assert (d.weights, d.kv_dtype, d.tp, d.max_seq_len, d.batch, d.isl, d.osl) == \
        ("fp8", "fp8", 2, 8192, 256, 1024, 256)


def test_the_cpu_engine_has_no_tensor_parallelism():
    with pytest.raises(ToolkitError, match="the CPU engine runs one process"):
        deployment_for_config(CPU_CONFIG, SMALL, "cpu", tp=2)


def test_70b_prefill_of_1000_tokens_at_989_tflops():
    spec = known_model_spec("llama-2-70b")
    d = Deployment(isl=1000, osl=1)
    roof = plan_roofline(spec, H100, d, plan_memory(spec, H100, d))
    assert roof.prefill_floor_s == pytest.approx(2 * 68_976_648_192 * 1000 / 989e12)  # 139.5 ms
    assert roof.prefill_expected_s == pytest.approx(roof.prefill_floor_s / 0.6)


def test_matmul_intensities_and_h100_crossover():
    assert matmul_intensity(1000, 4096, 4096) == pytest.approx(678, rel=0.02)
    assert matmul_intensity(1, 4096, 4096) == pytest.approx(1, rel=0.01)
    assert H100.crossover("bf16") == pytest.approx(989 / 3.35)


def test_llama2_13b_fp16_kv_and_fit():
    spec = known_model_spec("llama-2-13b")
    assert kv_bytes_per_token(spec, "fp16") == 2 * 40 * 40 * 128 * 2  # 819,200 B
    d = Deployment(weights="fp16", kv_dtype="fp16")
    gpu24 = GPUS["rtx-4090"]
    assert not plan_memory(spec, gpu24, d).fits
    assert plan_memory(spec, gpu24, replace(d, tp=2)).fits
    assert smallest_tp_that_fits(spec, gpu24, d) == 2


def test_batching_raises_decode_intensity_until_a_bound():
    spec = known_model_spec("llama-3-8b")
    base = phase_intensity(spec, 1, "bf16")
    for n in (2, 8, 32, 64):
        assert phase_intensity(spec, n, "bf16") == pytest.approx(n * base, rel=0.05)
    d = Deployment(isl=2048, osl=256, max_seq_len=4096)
    points = plan_roofline(spec, H100, d, plan_memory(spec, H100, d)).decode_by_batch
    rates = [p.tokens_per_second for p in points]
    assert rates == sorted(rates)
    assert points[0].bound == "memory" and points[-1].bound in ("compute", "capacity")


def test_tensor_parallel_adds_allreduce_cost():
    assert allreduce_seconds(1e6, 1, 450e9, 5e-6) == 0
    assert allreduce_seconds(1e6, 2, 450e9, 5e-6) == pytest.approx(1e6 / 450e9 + 5e-6)
    spec = known_model_spec("llama-2-70b")
    d = Deployment(tp=4, batch=1)
    roof = plan_roofline(spec, H100, d, plan_memory(spec, H100, d))
    kv = 1100 * 2 * 80 * 2 * 128 * 2  # 8 KV heads over 4 ranks
    # Per layer 2 all-reduces of 8,192 × 2 B over 450 GB/s, each ring moving 2·3/4 of it, + 5 µs.
    allreduce = 80 * 2 * (1.5 * 16_384 / 450e9 + 5e-6)
    assert roof.decode_allreduce_s == pytest.approx(allreduce)
    assert roof.decode_step_floor_s == pytest.approx((2 * 68_976_648_192 / 4 + kv) / 3.35e12 + allreduce)


@pytest.mark.parametrize("kwargs, message", [
    ({"tp": 3}, "does not divide the 64 attention heads"),
    ({"batch": 0}, "batch must be positive"),
    ({"isl": -5}, "isl must be positive"),
    ({"kv_free_mem_fraction": 1.5}, "kv free memory fraction"),
    ({"isl": 4000, "osl": 200}, "exceeds max_seq_len"),
    ({"weights": "int3"}, "unknown weight format 'int3'"),
])
def test_bad_deployments(kwargs, message):
    with pytest.raises(ToolkitError, match=message):
        make_plan(known_model_spec("llama-2-70b"), H100, Deployment(**kwargs))


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ToolkitError, match="h100-sxm"):
        hardware_spec("h100")
    with pytest.raises(ToolkitError, match="qwen2.5-7b"):
        known_model_spec("llama-9")


def test_every_gpu_is_cited_and_sane():
    for gpu in GPUS.values():
        assert gpu.source and gpu.memory_gb > 0 and gpu.bandwidth_tbs > 0
        assert gpu.peak_tflops["fp32"] < gpu.peak_tflops["bf16"] <= gpu.peak_tflops["int8"]
    assert [g.name for g in GPUS.values() if "fp4" in g.peak_tflops] == ["b200"]


def test_plan_outputs(tmp_path):
    from toolkit.plan.hardware import HardwareSpec

    plan = make_plan(known_model_spec("mistral-7b"), GPUS["l40s"], Deployment(weights="fp8", kv_dtype="fp8"))
    paths = write_plan(plan, tmp_path)
    written = json.loads(paths["plan"].read_text())
    assert written["memory"]["fits"] is True
    # Reports rebuild the plan's inputs from plan.json (they never re-plan or re-probe).
    assert HardwareSpec(**written["gpu"]) == GPUS["l40s"]
    assert Deployment(**written["deployment"]) == Deployment(weights="fp8", kv_dtype="fp8")
    cpu = spec_from_probe(PROBE)
    assert HardwareSpec(**json.loads(json.dumps(cpu.to_dict()))) == cpu
    assert paths["roofline"].read_bytes()[:4] == b"\x89PNG"
    assert "KV capacity" in render_table(plan)
    assert "per GPU" in render_table(plan) and "smallest TP that fits" in render_table(plan)
    # The CPU engine is one process: no per-GPU repeats of the totals, no tensor parallelism to pick.
    cpu_table = render_table(make_plan(known_model_spec("mistral-7b"), cpu, Deployment(weights="int4_awq")))
    assert "KV capacity" in cpu_table and "per GPU" not in cpu_table and "smallest TP" not in cpu_table
    # ... and the rate its step reads the weights at: the int4 kernel re-reading 3.9 GB, its stream's 1.2 x 20 GB/s
    reread = spec_from_probe({**PROBE, "read_bytes_s_sum": 20e9, "reread_over_read": {"int4": {"16": 3.0, "128": 1.2}}})
    cpu_table = render_table(make_plan(known_model_spec("mistral-7b"), reread, Deployment(weights="int4_awq")))
    assert "at the 24.0 GB/s its kernel re-reads them at, step after step" in cpu_table


# --- the format table drives the config, quantize and the planner ---------------------------------

def test_format_table_is_the_config_and_cli_vocabulary():
    from typing import get_args

    from toolkit.cli import quantize_cmd
    from toolkit.config import KVCacheDType, QFormat

    assert get_args(QFormat) == tuple(QFORMATS)
    assert "nvfp4" in get_args(QFormat) and get_args(KVCacheDType) == ("none", "fp8", "int8")
    choices = {p.name: p.type.choices for p in quantize_cmd.params if p.name in ("qformat", "kv_cache_dtype")}
    assert tuple(choices["qformat"]) == tuple(QFORMATS)


def test_nvfp4_quantize_refuses_on_cpu_in_one_line():
    with pytest.raises(ToolkitError) as err:
        modelopt_config("nvfp4", "none")
    assert "nvfp4 calibration needs CUDA" in err.value.problem and "\n" not in str(err.value)
    with pytest.raises(ToolkitError, match="does not take kv_cache_dtype int8"):
        modelopt_config("nvfp4", "int8", device="cuda")


def test_trtllm_build_flags_come_from_the_table():
    from toolkit.quantize.formats import trtllm_build_flags

    assert trtllm_build_flags("none", "none") == ["--gemm_plugin", "auto"]
    assert trtllm_build_flags("none", "fp8") == ["--gemm_plugin", "auto", "--use_fp8_context_fmha", "enable"]
    assert trtllm_build_flags("fp8", "none") == ["--gemm_plugin", "disable", "--use_fp8_context_fmha", "enable"]
    assert trtllm_build_flags("nvfp4", "fp8")[:2] == ["--gemm_plugin", "nvfp4"]
    assert {f.trtllm_quant_algo for f in QFORMATS.values()} == \
        {None, "FP8", "W8A8_SQ_PER_CHANNEL", "W4A16_AWQ", "W4A8_AWQ", "NVFP4"}


def test_a_quantized_checkpoint_plans_in_its_own_format(tmp_path):
    from toolkit.quantize.formats import formats_of_checkpoint

    # As ModelOpt 0.47's export_hf_checkpoint and export_tensorrt_llm_checkpoint write them.
    unified, trtllm, plain = tmp_path / "u", tmp_path / "t", tmp_path / "p"
    for d in (unified, trtllm, plain):
        d.mkdir()
    (unified / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": "FP8"}}))
    (trtllm / "config.json").write_text(json.dumps({"quantization": {"quant_algo": "W8A8_SQ_PER_CHANNEL"}}))
    (plain / "config.json").write_text(json.dumps({"hidden_size": 64}))
    assert formats_of_checkpoint(unified) == ("int4_awq", "fp8")
    assert formats_of_checkpoint(trtllm) == ("int8_sq", "none")
    assert formats_of_checkpoint(plain) is None
    from toolkit.plan.stage import plan_for_config

    d = plan_for_config(CPU_CONFIG, known_model_spec("llama-3-8b"), "h100-sxm", checkpoint_dir=unified)["deployment"]
    assert (d["weights"], d["kv_dtype"]) == ("int4_awq", "fp8")
    d = plan_for_config(CPU_CONFIG, known_model_spec("llama-3-8b"), "h100-sxm", checkpoint_dir=unified,
                        weights="fp8")["deployment"]
    assert (d["weights"], d["kv_dtype"]) == ("fp8", "fp8")  # a flag wins


def test_fp8_modelopt_config_with_fp8_kv():
    config = modelopt_config("fp8", "fp8")
    assert config["quant_cfg"][-1]["quantizer_name"] == "*[kv]_bmm_quantizer"


# --- this CPU: probe, and the roofline the engine benchmark holds itself against -------------------

SMALL = ModelSpec("small", hidden_size=768, num_layers=16, num_heads=12, num_kv_heads=4, head_dim=64,
                  intermediate_size=2048, vocab_size=4096)
# Fixed figures (not measured) so that the arithmetic below is exact.
PROBE = {"bandwidth_bytes_s": 30e9,
         "flops": {"fp32": 50e9, "bf16": 200e9, "int8a8": 100e9, "fp8": 100e9, "int4": 100e9, "w4a8": 100e9},
         "memory_bytes": 24e9, "spread": {"x": 0.05}, "rounds": 3, "threads": 2, "cpu": "test", "measured": "2026"}


def test_cpu_decode_step_per_format_by_hand():
    # small: per layer 768·(768 + 2·256) + 768·768 = 1,572,864 + MLP 3·768·2048 = 4,718,592 + norms 1,536;
    # × 16 + 2 · 4,096 · 768 + 768 = 106,980,096 parameters; linears 100,663,296.
    assert SMALL.total_params == 106_980_096 and SMALL.linear_params == 100_663_296
    # int4_awq: 100,663,296 × 0.515625 + 6,316,800 × 2 = 64,538,112 B; KV bf16 2·16·4·64·2 = 16,384 B per token.
    # Batch 1, context 160: memory (64,538,112 + 160 · 16,384) / 30e9 = 2.2387 ms, compute
    # 2 · 106,980,096 / 100e9 = 2.1396 ms → memory-bound; + 0.5 ms fixed + 0.1 ms for the one sequence.
    step = cpu_decode_step(SMALL, "int4_awq", 1, 160, PROBE, step_overhead_s=0.5e-3, sequence_overhead_s=0.1e-3)
    assert step.bound == "memory" and step.memory_s == pytest.approx(67_159_552 / 30e9)
    assert step.seconds == pytest.approx(67_159_552 / 30e9 + 0.6e-3) and step.overhead_s == pytest.approx(0.6e-3)
    # Batch 8: compute 8 × 2.1396 = 17.117 ms over memory (64,538,112 + 8 · 2,621,440) / 30e9 = 2.850 ms;
    # the per-sequence cost 8 times.
    assert cpu_decode_step_seconds(SMALL, "int4_awq", 8, 160, PROBE, step_overhead_s=0.5e-3,
                                   sequence_overhead_s=0.1e-3) == pytest.approx(8 * 2 * 106_980_096 / 100e9 + 1.3e-3)
    # Unquantized runs bf16: (213,960,192 + 2,621,440) / 30e9 = 7.219 ms at batch 1.
    assert cpu_decode_step_seconds(SMALL, "none", 1, 160, PROBE, step_overhead_s=0, sequence_overhead_s=0) == \
        pytest.approx(216_581_632 / 30e9)


def test_cpu_crossover_batch_comes_earlier_for_int4():
    # int4: (64,538,112 / 30e9) / (2.1396 ms − 2,621,440 / 30e9) = 2.1513 / 2.0522 = 1.048;
    # bf16: (213,960,192 / 30e9) / (1.0698 ms − 0.0874 ms) = 7.260.
    assert cpu_crossover_batch(SMALL, "int4_awq", 160, PROBE) == pytest.approx(
        (64_538_112 / 30e9) / (2 * 106_980_096 / 100e9 - 2_621_440 / 30e9))
    assert cpu_crossover_batch(SMALL, "none", 160, PROBE) == pytest.approx(
        (213_960_192 / 30e9) / (2 * 106_980_096 / 200e9 - 2_621_440 / 30e9))
    # TTFT floor at ISL 128: the int8 kernel (100 GFLOP/s) is slower than bf16's (200), so prefill widens
    # to bf16: 2 · 106,980,096 · 128 / 200e9 = 136.9 ms (+ fixed cost); a faster format kernel is used as is.
    assert cpu_prefill_seconds(SMALL, "int8_sq", 128, PROBE, step_overhead_s=0, sequence_overhead_s=0) == \
        pytest.approx(2 * 106_980_096 * 128 / 200e9)
    fast_int4 = {**PROBE, "flops": {**PROBE["flops"], "int4": 300e9}}
    assert cpu_prefill_seconds(SMALL, "int4_awq", 128, fast_int4, step_overhead_s=1e-3, sequence_overhead_s=0) == \
        pytest.approx(2 * 106_980_096 * 128 / 300e9 + 1e-3)
    # A probe that measured each kernel as prefill calls it: that rate, whatever the in-cache peaks say.
    as_called = {**PROBE, "prefill_flops": {"bf16": 150e9, "int8a8": 120e9}}
    assert cpu_prefill_seconds(SMALL, "int8_sq", 128, as_called, step_overhead_s=0, sequence_overhead_s=0) == \
        pytest.approx(2 * 106_980_096 * 128 / 120e9)
    # ... and on this model's own layer shapes where the probe has them (q/k/v 1280 x 768, o 768 x 768, gate/up
    # 4096 x 768, down 768 x 2048: 6,291,456 weights, small's linears a layer); another model's: the 2048 x 2048 rate
    assert SMALL.layer_gemm_shapes == [(1280, 768), (768, 768), (4096, 768), (768, 2048)]
    assert sum(n * k for n, k in SMALL.layer_gemm_shapes) * SMALL.num_layers == SMALL.linear_params
    own = {**as_called, "prefill_flops_by_layer": {"1280x768,768x768,4096x768,768x2048": {"int8a8": 80e9}}}
    assert cpu_prefill_seconds(SMALL, "int8_sq", 128, own, step_overhead_s=0, sequence_overhead_s=0) == \
        pytest.approx(2 * 106_980_096 * 128 / 80e9)
    assert cpu_prefill_seconds(SMALL, "fp8", 128, {**own, "prefill_flops": {"fp8": 90e9}}, step_overhead_s=0,
                               sequence_overhead_s=0) == pytest.approx(2 * 106_980_096 * 128 / 90e9)
    wider = replace(SMALL, hidden_size=1024)
    assert cpu_prefill_seconds(wider, "int8_sq", 128, own, step_overhead_s=0, sequence_overhead_s=0) == \
        pytest.approx(2 * wider.total_params * 128 / 120e9)
    # Beyond the GEMMs: causal attention at the probed kernel rate (128 · 129 / 2 positions · 12 heads · 16 layers
    # = 1,585,152 head-tokens at 200 M/s: 7.93 ms) and each prompt token's per-sequence cost (128 · 20 us).
    with_attention = {**as_called, "attention_head_tokens_s": 200e6}
    assert cpu_prefill_seconds(SMALL, "int8_sq", 128, with_attention, step_overhead_s=0, sequence_overhead_s=20e-6) == \
        pytest.approx(2 * 106_980_096 * 128 / 120e9 + 1_585_152 / 200e6 + 128 * 20e-6)


def test_cpu_prefill_attention_at_the_rate_probed_as_a_prompt_calls_it():
    """A prompt's causal attention reads a cache that stays in L2 / L3: the planner charges it at the rate probed that
    way at the prompt's length (linear between the probed lengths, the nearest outside them), not at the decode rate
    from memory; a probe without it keeps the decode rate."""
    from toolkit.plan.cpu_probe import spec_from_probe

    probe = {**PROBE, "attention_head_tokens_s": 200e6, "attention_prefill_head_tokens_s": {"128": 400e6, "1024": 800e6}}
    hw = spec_from_probe(probe)
    assert hw.prefill_attention_rate(128) == 400e6 and hw.prefill_attention_rate(576) == pytest.approx(600e6)
    assert hw.prefill_attention_rate(64) == 400e6 and hw.prefill_attention_rate(4096) == 800e6
    assert spec_from_probe(PROBE).prefill_attention_rate(128) is None
    bare = cpu_prefill_seconds(SMALL, "none", 1024, PROBE, step_overhead_s=0, sequence_overhead_s=0)
    # 1024 · 1025 / 2 positions · 12 heads · 16 layers = 100,761,600 head-tokens at 800 M/s
    assert cpu_prefill_seconds(SMALL, "none", 1024, probe, step_overhead_s=0, sequence_overhead_s=0) == \
        pytest.approx(bare + 100_761_600 / 800e6)
    decode_only = {**probe, "attention_prefill_head_tokens_s": {}}
    assert cpu_prefill_seconds(SMALL, "none", 1024, decode_only, step_overhead_s=0, sequence_overhead_s=0) == \
        pytest.approx(bare + 100_761_600 / 200e6)


def test_cpu_decode_rate_follows_the_probed_batches():
    """The few-row kernels' rate grows with the batch: the planner reads it at the step's batch (linear
    between probed batches, the nearest outside them), and the crossover is where compute meets memory."""
    from toolkit.plan.cpu_probe import spec_from_probe
    from toolkit.plan.roofline import decode_step
    from toolkit.plan.memory import Deployment

    rates = {"2": 100e9, "4": 200e9, "8": 250e9, "16": 300e9}  # as read back from the JSON cache
    hw = spec_from_probe({**PROBE, "decode_flops": {"bf16": rates}})
    assert hw.decode_peak_flops("bf16", 1) == 100e9 and hw.decode_peak_flops("bf16", 6) == pytest.approx(225e9)
    assert hw.decode_peak_flops("bf16", 12) == pytest.approx(275e9) and hw.decode_peak_flops("bf16", 64) == 300e9
    crossover = cpu_crossover_batch(SMALL, "none", 160, {**PROBE, "decode_flops": {"bf16": rates}})
    step = decode_step(SMALL, hw, Deployment(weights="bf16"), crossover, 160)
    assert step.compute_s == pytest.approx(step.memory_s)
    # 2 · 106,980,096 · b / rate(b) against (213,960,192 + 16,384 · 160 · b) / 30e9: at 8, 6.85 ms < 7.83 ms;
    # at 16, 11.41 ms > 8.70 ms
    assert 8 < crossover < 16


def test_cpu_step_reads_faster_where_its_bytes_fit_in_the_cache():
    """A step re-reads the same weights and KV. Its weights: at the kernel's own batch-1 re-read rate at the step's
    bytes (the probe's re-read curve, a ratio to the sum's stream read, interpolated in log size). Its KV: by a sum's
    read rate at that working set over the stream's, cut to the stream's past the last-level cache. GPUs keep 1."""
    from toolkit.plan.cpu_probe import spec_from_probe
    from toolkit.plan.gpus import gpu_spec

    curve = {"16": 60e9, "64": 60e9, "128": 48e9, "256": 30e9, "1024": 30e9}  # a 260 MiB L3, as read back
    hw = spec_from_probe({**PROBE, "stream_mib": 128, "read_curve_bytes_s": curve})
    assert hw.working_set_factor(128 * 2**20) == pytest.approx(1.0)
    assert hw.working_set_factor(32 * 2**20) == pytest.approx(60 / 48)
    assert hw.working_set_factor(2 * 2**30) == pytest.approx(30 / 48)
    assert hw.working_set_factor(181 * 2**20) == pytest.approx((48 + (30 - 48) * 0.5) / 48, rel=1e-2)  # log midpoint
    assert spec_from_probe(PROBE).working_set_factor(1e6) == 1.0  # an older probe without the curve
    # With the last-level cache's size known (48 MiB here): past it, the KV reads at the stream's rate
    sized = spec_from_probe({**PROBE, "stream_mib": 128, "read_curve_bytes_s": curve, "last_level_cache_bytes": 48 * 2**20})
    assert sized.working_set_factor(32 * 2**20) == pytest.approx(60 / 48)
    assert sized.working_set_factor(64 * 2**20) == pytest.approx(1.0)
    # The weights: int4 re-reads 16 MiB at 3x the sum's 20 GB/s stream, 64 MiB at 1.5x, its stream at 0.9x; the
    # 32 MiB point (1.2x, below the 64 MiB one's) is noise: no set re-reads slower than a larger one.
    reread = {"int4": {"16": 3.0, "32": 1.2, "64": 1.5, "128": 0.9}}
    probe = {**PROBE, "read_bytes_s_sum": 20e9, "stream_mib": 128, "read_curve_bytes_s": curve,
             "gemv_bytes_s": {"int4": 25e9}, "reread_over_read": reread}
    hw = spec_from_probe(probe)
    assert hw.weight_read_bytes("int4_awq", 64 * 2**20) == pytest.approx(30e9)
    assert hw.weight_read_bytes("int4_awq", 8 * 2**20) == pytest.approx(60e9)  # below the smallest set: its rate
    assert hw.weight_read_bytes("int4_awq", 32 * 2**20) == pytest.approx(30e9)  # the noisy point lifted to 64's
    assert hw.weight_read_bytes("int4_awq", 90.5 * 2**20) == pytest.approx(20e9 * 1.2, rel=1e-3)  # log midpoint
    assert hw.weight_read_bytes("int4_awq", 2**30) == hw.weight_read_bytes("int4_awq") == pytest.approx(18e9)
    # Sets above the stream (a VM whose L3 keeps more than the stream): between them in log size, the largest's past
    # it; without a size, the stream's
    above = spec_from_probe({**probe, "reread_over_read": {"int4": {**reread["int4"], "256": 0.6}}})
    assert above.weight_read_bytes("int4_awq", 181 * 2**20) == pytest.approx(20e9 * 0.75, rel=1e-2)
    assert above.weight_read_bytes("int4_awq", 2**30) == pytest.approx(12e9)
    assert above.weight_read_bytes("int4_awq") == pytest.approx(18e9)
    assert hw.weight_read_bytes("int8_sq", 64 * 2**20) == 30e9  # no curve, no GEMV rate: the bandwidth
    # int4 small at batch 1: 64,538,112 B of weights + 2,621,440 of KV (just over 64 MiB): 1.5 x 20 GB/s minus a
    # hair; the KV at the sum's rate there (60 / 48 of the roof's 30 GB/s)
    step = cpu_decode_step(SMALL, "int4_awq", 1, 160, probe, step_overhead_s=0, sequence_overhead_s=0)
    step_bytes = 64_538_112 + 2_621_440
    assert step.memory_s == pytest.approx(64_538_112 / hw.weight_read_bytes("int4_awq", step_bytes)
                                          + 2_621_440 / (30e9 * hw.working_set_factor(step_bytes)))
    assert 29e9 < hw.weight_read_bytes("int4_awq", step_bytes) < 30e9
    assert gpu_spec("h100-sxm").working_set_factor(1e6) == 1.0


def test_few_row_rates_between_the_working_sets_they_were_timed_re_reading():
    """A step's few-row GEMMs run at the rate the probe's few-row passes kept re-reading working sets of about the
    step's bytes: between the sets in log size, the smallest's below them and the largest's above; a set slower than
    a larger one lifted to it (noise); each set's rates in the probe's memory state (kernel_few_row_rates). int4: 0.5
    bytes a weight, 4 FLOP per byte per row; the sum reads 20 GB/s, so a pass at share s of it runs s x 80 GFLOP/s a
    row."""
    from toolkit.plan.cpu_probe import few_row_rates_at, spec_from_probe
    from toolkit.plan.gpus import gpu_spec

    timed = {"32": {"2": 300e9, "4": 500e9}, "64": {"2": 280e9, "4": 560e9}, "128": {"2": 150e9, "4": 300e9}}
    shares = {"32": {"2": 1.875, "4": 1.5625}, "64": {"2": 1.75, "4": 1.75}, "128": {"2": 0.9375, "4": 0.6}}
    probe = {**PROBE, "read_bytes_s_sum": 20e9, "stream_mib": 128,
             "reread_over_read": {"int4": {"32": 2.0, "64": 1.8, "128": 1.0}},
             "decode_flops_by_set": {"int4": timed}, "decode_over_read_by_set": {"int4": shares},
             "decode_flops_in_cache": {"int4": {"2": 600e9, "4": 650e9}}}
    probe["decode_flops"] = few_row_rates_at(probe, 20e9)
    assert probe["decode_flops"] == {"int4": {"2": 150e9, "4": 300e9}}  # the stream's set, as timed
    hw = spec_from_probe(probe)
    assert hw.decode_peak_flops("int4_awq", 4) == 300e9  # no step size: the stream's
    assert hw.decode_peak_flops("int4_awq", 2, 64 * 2**20) == pytest.approx(280e9)
    assert hw.decode_peak_flops("int4_awq", 3, 64 * 2**20) == pytest.approx(420e9)  # between the rows
    assert hw.decode_peak_flops("int4_awq", 4, 90.5 * 2**20) == pytest.approx(430e9, rel=1e-3)  # log midpoint
    assert hw.decode_peak_flops("int4_awq", 4, 32 * 2**20) == pytest.approx(560e9)  # 500 lifted to 64 MiB's
    assert hw.decode_peak_flops("int4_awq", 2, 8 * 2**20) == pytest.approx(300e9)  # below the smallest set
    assert hw.decode_peak_flops("int4_awq", 4, 2**30) == pytest.approx(300e9)  # above the largest
    # ... where the one-row curve falls past the largest set (a model larger than the last-level cache): its passes
    # where the memory reads that much slower, bound by the one-row pass's share of that read (1.0 x 10 GB/s at 1 GiB)
    past = spec_from_probe({**probe, "reread_over_read": {"int4": {"32": 2.0, "64": 1.8, "128": 1.0, "1024": 0.5}}})
    assert past.decode_peak_flops("int4_awq", 2, 2**30) == pytest.approx(80e9)
    assert past.decode_peak_flops("int4_awq", 4, 2**30) == pytest.approx(160e9)
    assert past.decode_peak_flops("int4_awq", 2, 512 * 2**20) == pytest.approx(20e9 * (1 - 0.5 * 2 / 3) * 8)
    assert past.decode_peak_flops("int4_awq", 2, 128 * 2**20) == pytest.approx(150e9)  # at the largest set: as timed
    # in a state whose sum reads 40 GB/s: the memory-bound passes move up to their rate in cache, the compute-bound
    # 4-row one at the stream stays, and no row count passes a larger one
    fast = spec_from_probe({**probe, "read_bytes_s_sum": 40e9})
    assert fast.decode_peak_flops("int4_awq", 4, 64 * 2**20) == pytest.approx(650e9)
    assert fast.decode_peak_flops("int4_awq", 2, 128 * 2**20) == pytest.approx(300e9)
    h100 = gpu_spec("h100-sxm")
    assert h100.decode_peak_flops("bf16", 4, 2**20) == h100.peak_flops("bf16")  # a GPU: its peak


def test_probe_moved_to_another_memory_state_scales_its_reads_not_its_compute():
    """probe_at_read: the planner's probe as if its memory read at another rate (a VM whose memory speed moves): the
    read curve and the cache-sized rates scale alike, each kernel's batch-1 rate is its paired ratio times the new
    read, compute rates stay; so a memory-bound batch-1 step's weight time halves where the read doubles."""
    from toolkit.plan.cpu_probe import probe_at_read

    curve = {"32": 60e9, "128": 30e9, "1024": 30e9}
    probe = {**PROBE, "bandwidth_bytes_s": 33e9, "read_bytes_s_sum": 30e9, "stream_mib": 128, "read_curve_bytes_s": curve,
             "gemv_over_read": {"int8a8": 0.9, "int4": 1.1}, "gemv_bytes_s": {"int8a8": 27e9, "int4": 33e9},
             "reread_over_read": {"int8a8": {"32": 1.6, "128": 0.9}}}
    fast = probe_at_read(probe, 60e9)
    assert fast["read_curve_bytes_s"] == {"32": 120e9, "128": 60e9, "1024": 60e9}
    assert fast["gemv_bytes_s"] == pytest.approx({"int8a8": 54e9, "int4": 66e9})
    # the re-read curve is kept as ratios: a step's weights read at them times the new sum read
    assert spec_from_probe(fast).weight_read_bytes("int8_sq", 32 * 2**20) == pytest.approx(96e9)
    assert fast["bandwidth_bytes_s"] == pytest.approx(66e9) and fast["flops"] == probe["flops"]
    assert probe["read_bytes_s_sum"] == 30e9  # the probe itself unchanged
    slow_step = cpu_decode_step(SMALL, "int8_sq", 1, 160, probe, step_overhead_s=0, sequence_overhead_s=0)
    fast_step = cpu_decode_step(SMALL, "int8_sq", 1, 160, fast, step_overhead_s=0, sequence_overhead_s=0)
    assert fast_step.memory_s == pytest.approx(slow_step.memory_s / 2)


def test_reread_sets_reach_past_the_last_level_cache_where_it_is_larger_than_the_stream(monkeypatch):
    """past_cache_mib: a set twice the last-level cache joins the re-read curve where that is past the sets above the
    stream (2x) and within 8x the stream; the few-row sets stay at 1/4 .. 2x the stream."""
    from toolkit.plan import cpu_probe

    for cache_mib, past in ((480, 960), (32, None), (100, None), (2048, None), (None, None)):
        monkeypatch.setattr(cpu_probe, "last_level_cache_bytes", lambda mib=cache_mib: mib and mib * 2**20)
        assert cpu_probe.past_cache_mib(128) == past
        assert cpu_probe.reread_sizes(128) == [16, 24, 32, 48, 64, 96, 128, 192, 256] + ([past] if past else [])
        assert cpu_probe.decode_set_sizes(128) == [32, 64, 128, 256]


def test_one_row_re_reads_become_ratios_to_the_probes_sum_read():
    """reread_ratios: each re-read pass's own read (one row and few) over the round's sum read (not the read paired
    with it, which runs slower after a larger pass); every other figure kept."""
    from toolkit.plan.cpu_probe import reread_ratios

    figures = {"reread_bytes_s_bf16_128": 40e9, "reread_bytes_s_bf16_960": 25e9, "gemv_over_read_bf16": 0.9,
               "decode_reread_bytes_s_bf16_128_2": 30e9, "decode_flops_bf16_128_2": 60e9}
    out = reread_ratios(figures, 20e9)
    assert out == {"reread_over_read_bf16_128": 2.0, "reread_over_read_bf16_960": 1.25, "gemv_over_read_bf16": 0.9,
                   "decode_reread_over_read_bf16_128_2": 1.5, "decode_flops_bf16_128_2": 60e9}
    assert "reread_bytes_s_bf16_128" in figures  # the caller's dict untouched


def test_a_set_past_the_cache_reads_no_faster_than_the_largest_within_it():
    """_curve_at: each set lifted to any larger set's ratio, but a set past the last-level cache (whose paired read
    runs slow after its pass) neither lifts the sets within the cache nor reads above the largest of them."""
    import math

    from toolkit.plan.hardware import _curve_at

    curve = {"64": 1.9, "128": 1.1, "256": 1.2, "960": 1.5}
    mib = 2**20
    assert _curve_at(curve, 128 * mib) == pytest.approx(1.5)  # no cache known: the old envelope
    cache = 480 * mib
    assert _curve_at(curve, 64 * mib, cache) == pytest.approx(1.9)
    assert _curve_at(curve, 128 * mib, cache) == pytest.approx(1.2)  # lifted by 256 MiB's, not by 960's
    assert _curve_at(curve, 256 * mib, cache) == _curve_at(curve, 960 * mib, cache) == pytest.approx(1.2)
    assert _curve_at(curve, 4096 * mib, cache) == pytest.approx(1.2)
    falling = {**curve, "960": 0.9}  # where it reads slower, it stands
    at = math.log2(600) - math.log2(256)
    assert _curve_at(falling, 600 * mib, cache) == pytest.approx(1.2 + (0.9 - 1.2) * at / (math.log2(960) - 8))


def test_few_row_rates_move_with_the_memory_state_only_where_the_pass_was_memory_bound():
    """few_row_rates_at: a few-row pass whose weights read at 0.75 of its paired sum or more moves with the read, up to
    its rate in cache; a compute-bound one gets no faster; in a slower state the weights read at the one-row pass's
    share over the same set bind both; no row count runs faster than a larger one. int4: 0.5 bytes a weight, so 4 FLOP
    per byte per row. The stream's set where no other is asked for."""
    from toolkit.plan.cpu_probe import few_row_rates_at, probe_at_read

    probe = {"stream_mib": 128, "gemv_over_read": {"int4": 0.9},
             "reread_over_read": {"int4": {"128": 0.95, "256": 0.9}},
             "decode_flops_by_set": {"int4": {"128": {"2": 200e9, "4": 400e9, "8": 500e9},
                                              "256": {"2": 100e9, "4": 200e9, "8": 400e9}}},
             "decode_over_read_by_set": {"int4": {"128": {"2": 0.8, "4": 0.6, "8": 0.3},
                                                  "256": {"2": 0.5, "4": 0.5, "8": 0.5}}},
             "decode_flops_in_cache": {"int4": {"2": 600e9, "4": 650e9, "8": 700e9}}}
    gflops = lambda read: {rows: rate / 1e9 for rows, rate in few_row_rates_at(probe, read)["int4"].items()}
    # 2 rows memory-bound: 0.8 of the read x 8 FLOP/byte; 4 and 8 rows as streamed
    assert gflops(50e9) == pytest.approx({"2": 320, "4": 400, "8": 500})
    # twice the read: 2 rows would reach 640 (its cache allows 600), but not past the 4-row pass's 400
    assert gflops(100e9) == pytest.approx({"2": 400, "4": 400, "8": 500})
    # slow memory: the weights at the one-row pass's 0.95 of the read bind 2 rows (152) and 4 (304), not 8 (608)
    assert gflops(20e9) == pytest.approx({"2": 152, "4": 304, "8": 500})
    assert few_row_rates_at(probe, 50e9, 256)["int4"] == {"2": 100e9, "4": 200e9, "8": 400e9}  # another set's: as timed
    moved = probe_at_read({**PROBE, **probe, "read_bytes_s_sum": 50e9, "read_curve_bytes_s": {"128": 50e9}}, 20e9)
    assert moved["decode_flops"] == few_row_rates_at(probe, 20e9)


def test_prompt_gemms_probed_on_the_models_own_layer_measured_once_and_cached(tmp_path, monkeypatch):
    """with_layer_prefill_rates: each kernel's 128-row GEMMs over the model's own layer (real kernels, a tiny layer
    here), saved into the probe's cache so that planning the model again measures nothing; a layer too large to copy
    keeps the probe as it is."""
    import functools

    import torch

    from toolkit.plan import cpu_probe

    monkeypatch.setattr(cpu_probe, "CACHE", tmp_path / "cpu_probe.json")
    monkeypatch.setattr(cpu_probe, "measure_cpu", functools.partial(cpu_probe.measure_cpu, rounds=1,
                                                                    stream_mib=4, repeats=1))
    probe = cpu_probe.cpu_probe()
    tiny = ModelSpec("tiny", hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
                     intermediate_size=384, vocab_size=512)
    with_rates = cpu_probe.with_layer_prefill_rates(probe, tiny)
    rates = with_rates["prefill_flops_by_layer"][cpu_probe.layer_key(tiny)]
    assert cpu_probe.layer_key(tiny) == "512x256,256x256,768x256,256x384"
    assert set(rates) == set(cpu_probe.KERNELS) and min(rates.values()) > 0
    assert "prefill_flops_by_layer" not in probe  # the probe passed in unchanged
    assert json.loads((tmp_path / "cpu_probe.json").read_text())["prefill_flops_by_layer"] == \
        with_rates["prefill_flops_by_layer"]
    monkeypatch.setattr(cpu_probe, "layer_prefill_rates", lambda *a, **k: pytest.fail("measured again"))
    assert cpu_probe.with_layer_prefill_rates(cpu_probe.cpu_probe(), tiny) == with_rates
    for name in cpu_probe.KERNELS:  # q/k/v's 1280 outputs, not a multiple of the 1024 rows the probe repeats
        _, dtype, fn = cpu_probe._kernel(name, 1280, 256)
        assert fn(torch.randn(3, 256).to(dtype)).shape == (3, 1280), name
    monkeypatch.undo()
    # a layer whose K is no multiple of int4's group of 128 (hidden 192): int4's kernels left out, the others timed
    odd = replace(tiny, hidden_size=192)
    odd_rates = cpu_probe.layer_prefill_rates(odd, repeats=1, rounds=1)
    assert set(odd_rates) == set(cpu_probe.KERNELS) - {"int4", "w4a8"} and min(odd_rates.values()) > 0
    monkeypatch.setattr(cpu_probe, "LAYER_PREFILL_MAX_MIB", 0)
    assert cpu_probe.layer_prefill_rates(tiny) is None
    assert cpu_probe.with_layer_prefill_rates(probe, tiny, save=False) == probe


def test_nvfp4_is_refused_on_the_cpu_engine():
    with pytest.raises(ToolkitError, match="nvfp4 cannot be planned on the CPU engine"):
        cpu_decode_step_seconds(SMALL, "nvfp4", 1, 160, PROBE)


def test_kernels_digest_apart_for_each_isa_choice(monkeypatch):
    """A probe cached with AMX on is stale with TOOLKIT_AMX=0 (the AVX-512 kernels run) and with another -march."""
    from toolkit.engine.runtime import native_kernels
    from toolkit.plan import cpu_probe

    def digest(**env) -> str:
        for name in ("TOOLKIT_AMX", native_kernels.MARCH_VARIABLE):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        cpu_probe.kernels_digest.cache_clear()
        return cpu_probe.kernels_digest()

    try:
        default = digest()
        assert digest(TOOLKIT_AMX="1") == default
        assert len({default, digest(TOOLKIT_AMX="0"), digest(TOOLKIT_NATIVE_MARCH="x86-64-v3")}) == 3
    finally:
        cpu_probe.kernels_digest.cache_clear()


def test_cpu_probe_measures_cached_with_date_and_spread(tmp_path, monkeypatch):
    import functools

    from toolkit.plan import cpu_probe

    monkeypatch.setattr(cpu_probe, "CACHE", tmp_path / "cpu_probe.json")
    # The real kernels on small matrices (fast); the defaults stream 128 MiB per kernel.
    monkeypatch.setattr(cpu_probe, "measure_cpu", functools.partial(cpu_probe.measure_cpu, rounds=2,
                                                                    stream_mib=4, repeats=1))
    first = cpu_probe.cpu_probe()
    kernels = set(cpu_probe.KERNELS)
    assert {"fp32", "bf16", "int8a8", "fp8", "int4", "w4a8"} <= kernels
    assert set(first["flops"]) == kernels and all(v > 0 for v in first["flops"].values())
    assert set(first["decode_flops"]) == kernels
    assert set(first["prefill_flops"]) == kernels and all(v > 0 for v in first["prefill_flops"].values())
    assert all(set(rates) == {str(rows) for rows in cpu_probe.DECODE_ROWS} and min(rates.values()) > 0
               for rates in first["decode_flops"].values())
    # the few-row passes as measured (re-reading sets of a quarter of the 4 MiB stream to twice it, paired with a sum;
    # in cache) and moved to the best read's state
    assert cpu_probe.decode_set_sizes(128) == [32, 64, 128, 256] and cpu_probe.decode_set_sizes(4) == [4, 8]
    for field in ("decode_flops_by_set", "decode_over_read_by_set"):
        assert all(set(first[field][name]) == {"4", "8"}
                   and min(min(by_rows.values()) for by_rows in first[field][name].values()) > 0
                   for name in kernels), field
    assert all(min(first["decode_flops_in_cache"][name].values()) > 0 for name in kernels)
    assert first["decode_flops"] == cpu_probe.few_row_rates_at(first, first["read_bytes_s_sum"])
    assert first["bandwidth_bytes_s"] == max(*first["gemv_bytes_s"].values(), first["read_bytes_s_sum"])
    # each kernel's read rate: its ratio to a sum read paired with it, in the memory state of the best sum read
    for name in kernels:
        assert 0 < first["gemv_over_read"][name] < 10
        assert first["gemv_bytes_s"][name] == pytest.approx(first["gemv_over_read"][name] * first["read_bytes_s_sum"])
        # re-reading each working set up to the stream (here the 4 MiB stream alone), as a ratio to the sum's read
        assert set(first["reread_over_read"][name]) == {str(m) for m in cpu_probe.reread_sizes(4)} == {"4", "6", "8"}
        assert all(0 < ratio < 100 for ratio in first["reread_over_read"][name].values())
    assert first["stream_mib"] == 4 and set(first["read_curve_bytes_s"]) == {str(m) for m in cpu_probe.READ_CURVE_MIB}
    assert min(first["read_curve_bytes_s"].values()) > 0
    assert first["rounds"] == 2 and all(0 <= v < 1 for v in first["spread"].values()) and first["measured"]
    llc = cpu_probe.last_level_cache_bytes()
    assert first["last_level_cache_bytes"] == llc and (llc is None or llc >= 2**20)
    from toolkit.engine.runtime.cpu_binding import engine_binding

    assert first["cpu_binding"] == engine_binding().describe()  # on the CPUs and threads the engine takes
    assert cpu_probe.cpu_probe() == first  # read back, not measured again
    again = cpu_probe.cpu_probe(refresh=True)
    assert again["measured"] >= first["measured"] and json.loads((tmp_path / "cpu_probe.json").read_text()) == again
    moved = {**again, "cpus": (again["cpus"] or 1) + 1}  # the same cache read on a machine with more cores
    (tmp_path / "cpu_probe.json").write_text(json.dumps(moved))
    assert cpu_probe.cpu_probe()["cpus"] == again["cpus"]  # measured again
    (tmp_path / "cpu_probe.json").write_text(json.dumps({**again, "cpu_binding": "1 threads on CPUs 0"}))
    assert cpu_probe.cpu_probe()["cpu_binding"] == again["cpu_binding"]  # measured under another taskset: again
    older_build = {**cpu_probe.cpu_probe(), "kernels": "other C kernels", "measured": "on an older build"}
    (tmp_path / "cpu_probe.json").write_text(json.dumps(older_build))
    fresh = cpu_probe.cpu_probe()  # measured again: rates of other kernels are stale
    assert fresh["measured"] != "on an older build" and fresh["kernels"] == cpu_probe.kernels_digest()
    spec = spec_from_probe(again)
    assert spec.kind == "cpu" and spec.peak_tflops["int4"] == again["flops"]["int4"] / 1e12
    # One kernel probed again in this moment's memory state (engine_bench's planner against each column): its
    # state-moved figures measured anew, every other kernel's ratios kept and moved to this moment's sum read
    before = json.loads(json.dumps(again))
    now = cpu_probe.reprobe_kernel(again, "int4")
    assert now["read_bytes_s_sum"] > 0 and again == before  # the probe itself unchanged
    for field in ("gemv_over_read", "reread_over_read", "decode_flops_by_set", "decode_over_read_by_set"):
        assert {k: v for k, v in now[field].items() if k != "int4"} == {k: v for k, v in again[field].items() if k != "int4"}
        assert now[field]["int4"] != again[field]["int4"] and (field == "gemv_over_read" or set(now[field]["int4"]) == set(again[field]["int4"]))
    assert now["decode_flops"] == cpu_probe.few_row_rates_at(now, now["read_bytes_s_sum"])
    assert now["gemv_bytes_s"]["int4"] == pytest.approx(now["gemv_over_read"]["int4"] * now["read_bytes_s_sum"])
    assert now["flops"] == again["flops"] and now["decode_flops_in_cache"] == again["decode_flops_in_cache"]
    assert again["measured"] in spec.source and "spread" in spec.source


def test_probe_and_catalog_import_without_a_cycle():
    code = ("import sys, toolkit.plan.cpu_probe; assert 'toolkit.plan.gpus' not in sys.modules; "
            "import toolkit.plan.gpus; assert 'torch' not in sys.modules or True")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_plan_cli_gpu_defaults_table_and_errors(tmp_path):
    def toolkit(*args):
        return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path)

    cpu_tiny = str(ROOT / "configs" / "cpu-tiny.yaml")
    ok = toolkit("plan", "-c", cpu_tiny, "-m", "llama-3-8b", "-g", "h100-sxm", "--batch", "8")
    assert ok.returncode == 0, ok.stderr
    assert "weights bf16" in ok.stdout and "KV bf16" in ok.stdout and "419,977 tokens" in ok.stdout
    assert "step floor 5.13 ms at batch 8 (4.84 ms at batch 1); reading the weights alone 4.79 ms" in ok.stdout
    assert "fp8 9.08 GB: decode 2.75 ms at batch 1" in ok.stdout and "nvfp4" not in ok.stdout  # no fp4 on H100
    out = tmp_path / "build" / "plans" / "llama-3-8b-h100-sxm"
    assert (out / "plan.json").is_file() and (out / "roofline.png").is_file()
    bigger = toolkit("plan", "-c", cpu_tiny, "-m", "llama-2-13b", "-g", "rtx-4090", "--weights", "fp16",
                     "--kv-dtype", "fp16", "--tp", "1", "--out", str(tmp_path / "x"))
    assert bigger.returncode == 0 and "smallest TP that fits: 2" in bigger.stdout and "fits             NO" in bigger.stdout
    bad = toolkit("plan", "-c", cpu_tiny, "-m", "llama-2-7b", "-g", "h100")
    assert bad.returncode == 1 and bad.stderr.startswith("error: unknown GPU 'h100'") and "h100-sxm" in bad.stderr
    fp4 = toolkit("plan", "-c", cpu_tiny, "-m", "llama-3-8b", "-g", "h100-sxm", "--weights", "nvfp4")
    assert fp4.returncode == 1 and "fp4 tensor cores (Blackwell)" in fp4.stderr
    listing = toolkit("plan", "--list-gpus")
    assert "h200" in listing.stdout and "datasheet" in listing.stdout and "fp4 9000" in listing.stdout


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a default binding of more than one thread")
def test_the_planner_probes_on_the_configs_threads_and_caches_each_binding_apart(tmp_path, monkeypatch):
    """engine.cpu_threads / cpu_numa reach the probe the plan is made on (a plan for one thread predicts a one-thread
    engine), each binding measured once into a cache of its own; a node the process cannot run on is refused."""
    from toolkit.engine.runtime.cpu_binding import engine_binding
    from toolkit.plan import cpu_probe
    from toolkit.plan.stage import engine_binding_for

    monkeypatch.setattr(cpu_probe, "CACHE", tmp_path / "cpu_probe.json")
    measured = []

    def measure(binding=None, **_):  # the probe's own measurement is tested above; here, what it is asked to measure
        measured.append(binding)
        return {**PROBE, "version": cpu_probe.VERSION, "cpu": cpu_probe._cpu_name(), "cpus": os.cpu_count(),
                "kernels": cpu_probe.kernels_digest(), "cpu_binding": binding.describe(), "threads": binding.threads}

    monkeypatch.setattr(cpu_probe, "measure_cpu", measure)
    one = engine_binding_for(CPU_CONFIG.model_copy(update={"engine": CPU_CONFIG.engine.model_copy(
        update={"cpu_threads": 1})}))
    assert one.threads == 1 and engine_binding_for(CPU_CONFIG) == engine_binding()
    assert hardware_spec("cpu", binding=one).probe["threads"] == 1
    assert hardware_spec("cpu").probe["cpu_binding"] == engine_binding().describe()
    assert measured == [one, engine_binding()]
    default = engine_binding()
    assert cpu_probe.cache_path(default, default) == cpu_probe.CACHE and cpu_probe.CACHE.is_file()
    assert cpu_probe.cache_path(one, default) != cpu_probe.CACHE and cpu_probe.cache_path(one, default).is_file()
    hardware_spec("cpu", binding=one), hardware_spec("cpu")
    assert len(measured) == 2  # each read back from its own cache
    far = CPU_CONFIG.model_copy(update={"engine": CPU_CONFIG.engine.model_copy(update={"cpu_numa": 63})})
    with pytest.raises(ToolkitError, match="node 63 has none of the CPUs"):
        engine_binding_for(far)
