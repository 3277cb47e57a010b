"""Read a ModelOpt unified HF checkpoint (or a plain HF Llama checkpoint) into low-precision tensors.

Nothing is dequantized here: each Linear comes back as the integers / fp8 bytes ModelOpt exported,
with its scales, so that the kernels can run on them as TensorRT-LLM would. What ModelOpt writes:

  FP8            weight fp8_e4m3 [out, in], weight_scale (), input_scale ()      W = fp8 · s
  INT8 SQ        weight int8 [out, in], weight_scale [out], input_scale (),      W = int8 · s[out]
                 pre_quant_scale [in] (SmoothQuant: multiplies the layer's input)
  INT4 AWQ       weight uint8 [out/2, in] (rows 2j low nibble, 2j+1 high), weight_scale [out, in/g],
                 pre_quant_scale [in]                                            W = int4 · s[out, in/g]
  W4A8 AWQ       as INT4 AWQ plus input_scale () (fp8 activations) and weight_scale_2 () (the fp8
                 scale of the fake quant's second stage; not part of W)

Imports only torch and safetensors (it runs inside Triton's python backend too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# quant_algo (ModelOpt / TensorRT-LLM naming) → (weight kind, activation quantization or None)
QUANT_ALGOS = {
    None: ("dense", None),
    "FP8": ("fp8", "fp8"),
    "W8A8_SQ_PER_CHANNEL": ("int8", "int8"),
    "W4A16_AWQ": ("int4", None),
    "W4A8_AWQ": ("int4", "fp8"),
}


@dataclass
class LinearWeights:
    """One Linear as stored: `weight` is float (dense), fp8, int8, or int8 holding int4 values."""

    kind: str  # dense | fp8 | int8 | int4
    weight: object
    weight_scale: object = None  # () fp8, [out] int8, [out, in/group] int4
    pre_quant_scale: object = None  # [in]: multiplies the input (AWQ / SmoothQuant smoothing)
    input_scale: object = None  # (): static per-tensor activation scale
    act_quant: str | None = None  # fp8 | int8: activations are quantized before the GEMM

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def group_size(self) -> int | None:
        if self.kind != "int4":
            return None
        return int(self.weight.shape[1] // self.weight_scale.shape[1])


@dataclass
class LlamaSpec:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool


@dataclass
class LayerWeights:
    input_norm: object
    post_attention_norm: object
    linears: dict[str, LinearWeights]  # q k v o gate up down
    kv_scales: dict[str, float] = field(default_factory=dict)  # k / v: ModelOpt's KV-cache scales


@dataclass
class Checkpoint:
    spec: LlamaSpec
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    embed_tokens: object
    final_norm: object
    lm_head: object  # float [vocab, hidden] (the embeddings when tied)
    layers: list[LayerWeights]


LINEAR_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
                "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def read_spec(config: dict) -> LlamaSpec:
    archs = config.get("architectures") or []
    if config.get("model_type") != "llama" and "LlamaForCausalLM" not in archs:
        raise ValueError(f"the CPU engine runs the Llama architecture; this checkpoint is {archs or config.get('model_type')}")
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_type", "default") not in ("default", None):
        raise ValueError(f"rope_type {rope['rope_type']!r} is not supported by the CPU engine (default RoPE only)")
    heads = config["num_attention_heads"]
    return LlamaSpec(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"], num_layers=config["num_hidden_layers"],
        num_heads=heads, num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


def unpack_int4(packed, out_features: int):
    """uint8 [out/2, in] → int8 [out, in] in -8..7; ModelOpt packs rows 2j (low nibble), 2j+1 (high)."""
    import torch

    low = (packed & 0x0F).to(torch.int8)
    high = ((packed >> 4) & 0x0F).to(torch.int8)
    low = torch.where(low > 7, low - 16, low)
    high = torch.where(high > 7, high - 16, high)
    return torch.stack([low, high], dim=1).reshape(out_features, packed.shape[-1])


def _linear(tensors: dict, prefix: str, kind: str, act_quant: str | None) -> LinearWeights:
    weight = tensors[f"{prefix}.weight"]
    scale = tensors.get(f"{prefix}.weight_scale")
    if scale is None:  # a layer ModelOpt left unquantized
        return LinearWeights("dense", weight)
    if weight.dtype.itemsize == 1 and kind == "int4":
        weight = unpack_int4(weight, weight.shape[0] * 2)
    # W4A8's weight_scale_2 is the fp8 scale ModelOpt's fake quant applies after the int4 step; the
    # int4 values times weight_scale already are the weights (TensorRT-LLM's kernel computes int4 · fp8).
    scale = scale.float()
    pre_quant = tensors.get(f"{prefix}.pre_quant_scale")
    input_scale = tensors.get(f"{prefix}.input_scale")
    return LinearWeights(kind, weight, scale, None if pre_quant is None else pre_quant.float(),
                         None if input_scale is None else input_scale.float(), act_quant if input_scale is not None else None)


def load_checkpoint(checkpoint_dir: str | Path) -> Checkpoint:
    from safetensors.torch import load_file

    checkpoint_dir = Path(checkpoint_dir)
    config = json.loads((checkpoint_dir / "config.json").read_text())
    spec = read_spec(config)
    quant = config.get("quantization_config") or {}
    quant_algo = quant.get("quant_algo")
    if quant_algo not in QUANT_ALGOS:
        raise ValueError(f"quant_algo {quant_algo!r} has no CPU kernel here; "
                         f"the CPU engine runs: {', '.join(str(a) for a in QUANT_ALGOS if a)} or unquantized")
    kind, act_quant = QUANT_ALGOS[quant_algo]
    tensors = {}
    for path in sorted(checkpoint_dir.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    if not tensors:
        raise ValueError(f"no *.safetensors in {checkpoint_dir}")
    layers = []
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        kv_scales = {}
        for name in ("k", "v"):
            for key in (f"{p}.self_attn.{name}_proj.{name}_scale", f"{p}.self_attn.{name}_scale"):
                if key in tensors:
                    kv_scales[name] = float(tensors[key])
        layers.append(LayerWeights(
            input_norm=tensors[f"{p}.input_layernorm.weight"],
            post_attention_norm=tensors[f"{p}.post_attention_layernorm.weight"],
            linears={short: _linear(tensors, f"{p}.{long}", kind, act_quant) for short, long in LINEAR_NAMES.items()},
            kv_scales=kv_scales,
        ))
    embed = tensors["model.embed_tokens.weight"]
    lm_head = tensors.get("lm_head.weight", embed if spec.tie_word_embeddings else None)
    if lm_head is None:
        raise ValueError(f"{checkpoint_dir}: no lm_head.weight and tie_word_embeddings is false")
    return Checkpoint(spec, quant_algo, quant.get("kv_cache_quant_algo"), embed,
                      tensors["model.norm.weight"], lm_head, layers)
