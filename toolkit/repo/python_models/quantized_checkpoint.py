"""Load a ModelOpt unified HF checkpoint as a float32 transformers model by dequantizing its weights:
the independent reference the tests compare the engine against (the CPU engine itself keeps the
weights in low precision: toolkit/engine/runtime/checkpoint.py).

Plain `from_pretrained` cannot reload these checkpoints faithfully (the scale tensors come back as
unexpected keys and the fp8/int4 weights are cast, not scaled). Here each quantized Linear weight is
turned back into float32 exactly as ModelOpt quantized it:

  FP8 (per-tensor):          W = fp8 · weight_scale
  INT8 SmoothQuant:          W = int8 · weight_scale[out]               · pre_quant_scale[in]
  INT4 AWQ / W4A8 AWQ:       W = unpack(uint8) · weight_scale[out, in/block] · pre_quant_scale[in]

`pre_quant_scale` (AWQ / SmoothQuant smoothing) multiplies the layer's input, so it is folded into
the weight's columns. Activation quantization (`input_scale`) and KV-cache quantization are NOT
emulated here: this model computes in float32 with the quantized weights' values.

Imports only torch, safetensors and transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.engine.runtime.checkpoint import unpack_int4  # one reading of ModelOpt's int4 packing

_SCALE_SUFFIXES = ("weight_scale", "weight_scale_2", "input_scale", "pre_quant_scale",
                   "k_scale", "v_scale", "output_scale")


def dequantize_state_dict(tensors: dict, quant_algo: str | None) -> dict:
    import torch

    out = {}
    for name, tensor in tensors.items():
        if name.rsplit(".", 1)[-1] in _SCALE_SUFFIXES:
            continue
        prefix = name[: -len("weight")] if name.endswith("weight") else None
        scale = tensors.get(f"{prefix}weight_scale") if prefix is not None else None
        if scale is None:
            out[name] = tensor.float() if tensor.is_floating_point() else tensor
            continue
        scale = scale.float()
        if tensor.dtype == torch.uint8:  # packed int4
            weight = unpack_int4(tensor, tensor.shape[0] * 2).float()
            block = weight.shape[1] // scale.shape[1]
            weight = weight * scale.repeat_interleave(block, dim=1)
        elif scale.dim() == 1:  # per-output-channel (int8 SmoothQuant)
            weight = tensor.float() * scale[:, None]
        else:  # per-tensor (fp8)
            weight = tensor.float() * scale
        pre_quant = tensors.get(f"{prefix}pre_quant_scale")
        if pre_quant is not None:
            weight = weight * pre_quant.float()[None, :]
        out[name] = weight
    return out


def load_quantized_causal_lm(checkpoint_dir: str | Path):
    """Return (model in float32 eval mode, quant_algo or None)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    checkpoint_dir = Path(checkpoint_dir)
    raw_config = json.loads((checkpoint_dir / "config.json").read_text())
    quant = raw_config.get("quantization_config") or {}
    quant_algo = quant.get("quant_algo")
    tensors = {}
    for path in sorted(checkpoint_dir.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    state = dequantize_state_dict(tensors, quant_algo) if quant_algo else {k: v.float() for k, v in tensors.items()}

    config = AutoConfig.from_pretrained(str(checkpoint_dir))
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # lm_head may be tied to the embeddings; anything else missing or left over is a real mismatch.
    missing = [k for k in missing if not (k == "lm_head.weight" and getattr(config, "tie_word_embeddings", False))]
    if missing or unexpected:
        raise ValueError(f"checkpoint {checkpoint_dir} does not match its config: "
                         f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model.eval(), quant_algo
