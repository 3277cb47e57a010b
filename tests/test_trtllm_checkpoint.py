"""TensorRT-LLM checkpoints from ModelOpt: TP sharding, mapping, rope theta, KV-cache quantization."""

import json
import shutil

import pytest
import torch

from toolkit.config import ParallelSection, QuantizeSection
from toolkit.quantize.stage import quantize_checkpoint


def load_ranks(directory, count):
    from safetensors.torch import load_file

    return [load_file(str(directory / f"rank{i}.safetensors")) for i in range(count)]


def unshard(name, shards, full_shape, q_heads, kv_heads, head_dim):
    """Reassemble one tensor from its TP shards the way TensorRT-LLM split it."""
    if all(s.shape == full_shape for s in shards):
        return shards[0]  # replicated (norms, scales)
    if name.endswith("attention.qkv.weight"):
        tp = len(shards)
        q, kv = q_heads * head_dim // tp, kv_heads * head_dim // tp
        parts = [torch.split(s, [q, kv, kv], dim=0) for s in shards]
        return torch.cat([torch.cat([p[i] for p in parts], dim=0) for i in range(3)], dim=0)
    dim = next(d for d in range(len(full_shape)) if shards[0].shape[d] != full_shape[d])
    return torch.cat(shards, dim=dim)


@pytest.mark.parametrize("qformat", ["none", "fp8"])
def test_rank_files_concatenate_to_the_unsharded_weights(tiny_model_dir, tmp_path, qformat):
    single = tmp_path / "tp1"
    double = tmp_path / "tp2"
    quantize_checkpoint(tiny_model_dir, single, QuantizeSection(qformat=qformat, export="trtllm"), ParallelSection(tp=1))
    quantize_checkpoint(tiny_model_dir, double, QuantizeSection(qformat=qformat, export="trtllm"), ParallelSection(tp=2))
    config = json.loads((double / "config.json").read_text())
    assert config["mapping"]["tp_size"] == 2 and config["mapping"]["world_size"] == 2
    (full,) = load_ranks(single, 1)
    shards = load_ranks(double, 2)
    assert set(shards[0]) == set(full)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config["hidden_size"] // heads
    for name, tensor in full.items():
        rebuilt = unshard(name, [s[name] for s in shards], tensor.shape, heads, kv_heads, head_dim)
        assert torch.equal(rebuilt.float(), tensor.float()), name


def test_rope_theta_survives_transformers5(tiny_model_dir, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("rope_theta", None)
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    config_path.write_text(json.dumps(config))
    out = tmp_path / "ck"
    quantize_checkpoint(model_dir, out, QuantizeSection(qformat="fp8", export="trtllm"), ParallelSection(tp=1))
    assert json.loads((out / "config.json").read_text())["rotary_base"] == 500000.0


def test_fp8_kv_cache_is_recorded(tiny_model_dir, tmp_path):
    out = tmp_path / "ck"
    quantize_checkpoint(tiny_model_dir, out, QuantizeSection(qformat="fp8", kv_cache_dtype="fp8", export="trtllm"),
                        ParallelSection(tp=2))
    quant = json.loads((out / "config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "FP8" and quant["kv_cache_quant_algo"] == "FP8"
    assert any(k.endswith("kv_cache_scaling_factor") for k in load_ranks(out, 1)[0])


@pytest.mark.parametrize("export", ["trtllm", "hf"])
def test_checkpoint_keeps_the_models_own_16bit_dtype(tiny_model_dir, tmp_path, export):
    """A bfloat16 model (as Llama-3 ships) is exported in bfloat16: embeddings, lm_head and norms too."""
    from safetensors.torch import load_file

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("torch_dtype", None)
    config["dtype"] = "bfloat16"
    config_path.write_text(json.dumps(config))
    out = tmp_path / "ck"
    quantize_checkpoint(model_dir, out, QuantizeSection(qformat="fp8", export=export), ParallelSection(tp=1))
    written = json.loads((out / "config.json").read_text())
    assert (written.get("dtype") or written.get("torch_dtype")) == "bfloat16"
    weights = load_file(str(out / ("rank0.safetensors" if export == "trtllm" else "model.safetensors")))
    unquantized = [name for name in weights if "embed" in name or "norm" in name or "lm_head" in name]
    assert unquantized and all(weights[name].dtype == torch.bfloat16 for name in unquantized)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"]["dtype"] == "bfloat16"
