"""Architectures by name: the offline presets we build, and well-known models for planning.

Shapes of the public models are their published config.json values (Hugging Face model cards).
"""

from __future__ import annotations

from toolkit.errors import ToolkitError
from toolkit.model.spec import ModelSpec, spec_from_hf_config

# Offline presets: built with random weights by `toolkit init-model`. The vocab is whatever the
# byte-level BPE trained on the shipped corpus yields (capped at `target_vocab`).
OFFLINE_PRESETS: dict[str, dict] = {
    # ~0.5 M parameters: for tests.
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=384, target_vocab=512, max_position_embeddings=1024),
    # ~110 M parameters (fp32 ≈ 0.45 GB): big enough that decode is memory-bound on a CPU, as on a GPU.
    "small": dict(hidden_size=768, num_hidden_layers=16, num_attention_heads=12, num_key_value_heads=4,
                  intermediate_size=2048, target_vocab=4096, max_position_embeddings=2048),
}

_LLAMA = dict(architectures=["LlamaForCausalLM"], tie_word_embeddings=False)

KNOWN_MODELS: dict[str, dict] = {
    "llama-2-7b": _LLAMA | dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                num_key_value_heads=32, intermediate_size=11008, vocab_size=32000,
                                max_position_embeddings=4096, rope_theta=10000.0),
    "llama-2-13b": _LLAMA | dict(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40,
                                 num_key_value_heads=40, intermediate_size=13824, vocab_size=32000,
                                 max_position_embeddings=4096, rope_theta=10000.0),
    "llama-2-70b": _LLAMA | dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                                 num_key_value_heads=8, intermediate_size=28672, vocab_size=32000,
                                 max_position_embeddings=4096, rope_theta=10000.0),
    "llama-3-8b": _LLAMA | dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                                max_position_embeddings=8192, rope_theta=500000.0),
    "llama-3-70b": _LLAMA | dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                                 num_key_value_heads=8, intermediate_size=28672, vocab_size=128256,
                                 max_position_embeddings=8192, rope_theta=500000.0),
    "mistral-7b": dict(architectures=["MistralForCausalLM"], tie_word_embeddings=False, hidden_size=4096,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768,
                       rope_theta=10000.0),
    "qwen2.5-7b": dict(architectures=["Qwen2ForCausalLM"], tie_word_embeddings=False, hidden_size=3584,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, vocab_size=152064, max_position_embeddings=32768,
                       rope_theta=1000000.0),
}


def known_model_spec(name: str) -> ModelSpec:
    key = name.lower()
    if key not in KNOWN_MODELS:
        raise ToolkitError(f"unknown model {name!r}", f"use a checkpoint directory or one of: {', '.join(KNOWN_MODELS)}")
    return spec_from_hf_config(KNOWN_MODELS[key], key)
