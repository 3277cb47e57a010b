"""`ModelSpec`: the architecture numbers every stage needs, read from a checkpoint's config.json."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.errors import ToolkitError

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    architecture: str = "LlamaForCausalLM"

    # Parameter counts come from the architecture (Llama family: GQA attention, gated MLP, RMSNorm).
    @property
    def layer_gemm_shapes(self) -> list[tuple[int, int]]:
        """(out, in) features of one layer's matmuls as engines fuse them: q/k/v, o, gate/up, down."""
        q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return [(q_out + 2 * kv_out, self.hidden_size), (self.hidden_size, q_out),
                (2 * self.intermediate_size, self.hidden_size), (self.hidden_size, self.intermediate_size)]

    @property
    def attention_params_per_layer(self) -> int:
        return sum(n * k for n, k in self.layer_gemm_shapes[:2])  # q/k/v, o

    @property
    def mlp_params_per_layer(self) -> int:
        return sum(n * k for n, k in self.layer_gemm_shapes[2:])  # gate/up, down

    @property
    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def linear_params(self) -> int:
        """Parameters in the matmuls that quantization touches (attention + MLP; not embeddings/lm_head)."""
        return self.num_layers * (self.attention_params_per_layer + self.mlp_params_per_layer)

    @property
    def total_params(self) -> int:
        per_layer = self.attention_params_per_layer + self.mlp_params_per_layer + self.norm_params_per_layer
        return self.num_layers * per_layer + self.embedding_params + self.lm_head_params + self.hidden_size

    def to_dict(self) -> dict:
        return asdict(self) | {"total_params": self.total_params}


def spec_from_hf_config(config: dict, name: str) -> ModelSpec:
    missing = [k for k in _REQUIRED if k not in config]
    if missing:
        raise ToolkitError(f"config.json of {name} lacks {', '.join(missing)}",
                           "point at a Hugging Face decoder checkpoint (Llama-style config.json)")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    # transformers 5 moved rope_theta under rope_parameters; older configs keep it at top level.
    rope = config.get("rope_parameters") or {}
    rope_theta = float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0)
    archs = config.get("architectures") or ["LlamaForCausalLM"]
    spec = ModelSpec(
        name=name,
        hidden_size=hidden,
        num_layers=int(config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        rope_theta=rope_theta,
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
        architecture=archs[0],
    )
    for field in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size"):
        if getattr(spec, field) <= 0:
            raise ToolkitError(f"config.json of {name}: {field} must be positive", "fix the checkpoint's config.json")
    if spec.num_heads % spec.num_kv_heads:
        raise ToolkitError(f"config.json of {name}: {spec.num_heads} heads not divisible by {spec.num_kv_heads} KV heads",
                           "fix num_key_value_heads")
    return spec


def load_model_spec(checkpoint_dir: str | Path) -> ModelSpec:
    checkpoint_dir = Path(checkpoint_dir)
    path = checkpoint_dir / "config.json"
    if not path.is_file():
        raise ToolkitError(f"{checkpoint_dir} has no config.json",
                           "point at a Hugging Face checkpoint directory, or run `toolkit init-model`")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ToolkitError(f"{path} is not valid JSON (line {exc.lineno})", "repair or re-export the checkpoint") from None
    return spec_from_hf_config(config, checkpoint_dir.name)
