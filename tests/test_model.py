import json

import pytest

from toolkit.errors import ToolkitError
from toolkit.model.presets import known_model_spec
from toolkit.model.spec import load_model_spec, spec_from_hf_config


def test_tiny_preset_is_about_half_a_million_parameters(tiny_model_dir):
    spec = load_model_spec(tiny_model_dir)
    assert 400_000 < spec.total_params < 600_000
    assert spec.num_kv_heads == 2 and spec.head_dim == 32


def test_parameter_count_matches_torch(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    assert load_model_spec(tiny_model_dir).total_params == sum(p.numel() for p in model.parameters())


def test_tokenizer_loads_with_portable_class(tiny_model_dir):
    from transformers import PreTrainedTokenizerFast

    cfg = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    tok = PreTrainedTokenizerFast.from_pretrained(str(tiny_model_dir))
    ids = tok("Prefill reads the prompt.", add_special_tokens=False).input_ids
    assert tok.decode(ids) == "Prefill reads the prompt."


def test_load_tokenizer_takes_the_named_fast_class_directly_and_autotokenizer_otherwise(tiny_model_dir, tmp_path):
    """load_tokenizer skips AutoTokenizer's model-config import where tokenizer_config.json names
    PreTrainedTokenizerFast: the same class and the same ids, special tokens and decoding as AutoTokenizer's."""
    import shutil

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from toolkit.model.tokenizer import load_tokenizer

    texts = ["Prefill reads the prompt.", "  spaces, ünïcödé and 你好 ", "<s> special </s> <pad>"]
    reference = AutoTokenizer.from_pretrained(str(tiny_model_dir))

    def same_as_reference(tok):
        assert type(tok) is type(reference)
        assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (
            reference.bos_token_id, reference.eos_token_id, reference.pad_token_id)
        for text in texts:
            ids = tok(text).input_ids
            assert ids == reference(text).input_ids
            assert tok.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)

    direct = load_tokenizer(tiny_model_dir)
    assert isinstance(direct, PreTrainedTokenizerFast)
    same_as_reference(direct)
    unnamed = tmp_path / "unnamed"  # no tokenizer_class: AutoTokenizer resolves it from the model's config
    shutil.copytree(tiny_model_dir, unnamed)
    cfg = json.loads((unnamed / "tokenizer_config.json").read_text())
    del cfg["tokenizer_class"]
    (unnamed / "tokenizer_config.json").write_text(json.dumps(cfg))
    same_as_reference(load_tokenizer(unnamed))


def test_known_models_counted_from_architecture():
    assert known_model_spec("llama-2-7b").total_params == pytest.approx(6.74e9, rel=0.01)
    assert known_model_spec("llama-2-70b").total_params == pytest.approx(68.98e9, rel=0.01)
    assert known_model_spec("llama-3-8b").total_params == pytest.approx(8.03e9, rel=0.01)
    with pytest.raises(ToolkitError, match="llama-2-7b"):
        known_model_spec("gpt-5")


def test_rope_theta_read_from_transformers5_rope_parameters():
    spec = spec_from_hf_config({"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
                                "intermediate_size": 128, "vocab_size": 100,
                                "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}, "m")
    assert spec.rope_theta == 500000.0


def test_bad_checkpoint_dirs(tmp_path):
    with pytest.raises(ToolkitError, match="has no config.json"):
        load_model_spec(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ToolkitError, match="not valid JSON"):
        load_model_spec(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ToolkitError, match="lacks num_hidden_layers"):
        load_model_spec(tmp_path)
