"""ModelOpt on CPU: the CPU engine's dequantizing loader, the quality gate, TP shape checks."""

import copy

import pytest

from toolkit.config import ParallelSection, QuantizeSection
from toolkit.errors import ToolkitError
from toolkit.model.spec import load_model_spec
from toolkit.quantize.shapes import check_tp_shapes


@pytest.fixture(scope="module")
def original(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


def _quantize_and_export(model, qformat, out_dir):
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_hf_checkpoint

    from toolkit.quantize.formats import modelopt_config

    ids = torch.tensor([list(range(5, 69))])
    quantized = copy.deepcopy(model)
    mtq.quantize(quantized, modelopt_config(qformat, "none"), forward_loop=lambda m: m(ids))
    fake_quant = copy.deepcopy(quantized)
    with torch.inference_mode():
        export_hf_checkpoint(quantized, export_dir=out_dir)
    return fake_quant, ids


@pytest.mark.parametrize("qformat", ["fp8", "int8_sq"])
def test_dequantized_checkpoint_matches_modelopt_fake_quant(original, qformat, tmp_path):
    """Weights the CPU engine serves equal ModelOpt's quantized weights (activation quant aside)."""
    import torch

    from toolkit.repo.python_models.quantized_checkpoint import load_quantized_causal_lm

    fake_quant, ids = _quantize_and_export(original, qformat, tmp_path)
    for name, module in fake_quant.named_modules():
        if name.endswith("input_quantizer") or name.endswith("output_quantizer"):
            module.disable()
    loaded, algo = load_quantized_causal_lm(tmp_path)
    assert algo in ("FP8", "W8A8_SQ_PER_CHANNEL")
    with torch.no_grad():
        expected, got, base = fake_quant(ids).logits, loaded(ids).logits, original(ids).logits
    assert (got - expected).abs().max().item() < 1e-4
    assert (base - expected).abs().max().item() > 1e-3  # quantization changed something measurable


def test_int4_awq_unpacks_to_modelopt_weights(original, tmp_path):
    """AWQ layers with their own input (o_proj, down_proj) dequantize exactly; ModelOpt's export
    re-smooths layers that share an input (q/k/v, gate/up), so those are held to quantization error."""
    import torch
    from safetensors.torch import load_file

    from toolkit.repo.python_models.quantized_checkpoint import dequantize_state_dict

    fake_quant, _ = _quantize_and_export(original, "int4_awq", tmp_path)
    state = dequantize_state_dict(load_file(str(tmp_path / "model.safetensors")), "W4A16_AWQ")
    with torch.no_grad():
        for name, module in fake_quant.named_modules():
            if not hasattr(module, "weight_quantizer") or not module.weight_quantizer.is_enabled:
                continue
            effective = module.weight_quantizer(module.weight) * module.input_quantizer.pre_quant_scale[None]
            diff = (state[f"{name}.weight"] - effective).abs().max().item()
            if name.endswith(("o_proj", "down_proj")):
                assert diff < 1e-6, name
            else:  # within two int4 steps (max / 7 each) of the fake-quant weights
                assert diff < 2 * effective.abs().max().item() / 7, name


def test_quantize_stage_writes_manifest_and_gate(tiny_model_dir, tmp_path):
    import json

    from toolkit.quantize.stage import quantize_checkpoint

    out = tmp_path / "ck"
    result = quantize_checkpoint(tiny_model_dir, out, QuantizeSection(qformat="int4_awq"), ParallelSection())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"]["qformat"] == "int4_awq"
    assert manifest["inputs"]["calibration"]["samples"] == 16
    assert manifest["inputs"]["calibrated_on"] == "cpu"  # auto, and torch here sees no GPU
    assert manifest["outputs"]["bytes_on_disk"] > 0
    assert 0 < manifest["outputs"]["quality"]["mean_kl"] < 0.5
    assert result.quality.perplexity_ratio < 1.5
    assert (out / "tokenizer.json").is_file() and (out / "config.json").is_file()


def test_calibration_device_follows_what_torch_sees():
    import torch

    from toolkit.quantize.stage import calibration_device

    assert calibration_device("cpu") == "cpu"
    if torch.cuda.is_available():
        assert calibration_device("auto") == calibration_device("cuda") == "cuda"
        return
    assert calibration_device("auto") == "cpu"
    with pytest.raises(ToolkitError, match="torch sees no CUDA device") as err:
        calibration_device("cuda")
    assert "calib_device: auto or cpu" in err.value.fix
    with pytest.raises(Exception, match="calib_device"):
        QuantizeSection(calib_device="tpu")


def test_quality_gate_stops_a_bad_quantization(tiny_model_dir, tmp_path):
    from toolkit.quantize.stage import quantize_checkpoint

    strict = QuantizeSection(qformat="int4_awq", quality={"max_mean_kl": 1e-9})
    with pytest.raises(ToolkitError, match="failed the quality gate"):
        quantize_checkpoint(tiny_model_dir, tmp_path / "ck", strict, ParallelSection())
    assert not (tmp_path / "ck").exists()  # nothing reaches a build


def test_awq_tp_shape_check_before_calibration(tiny_model_dir):
    spec = load_model_spec(tiny_model_dir)  # hidden 128, intermediate 384
    check_tp_shapes(spec, "int4_awq", 1)
    with pytest.raises(ToolkitError, match="not a multiple of the AWQ block size 128"):
        check_tp_shapes(spec, "int4_awq", 2)
    check_tp_shapes(spec, "fp8", 2)
    with pytest.raises(ToolkitError, match="does not divide the 4 attention heads"):
        check_tp_shapes(spec, "fp8", 3)
