"""Create an offline model: Llama architecture, random weights, a byte-level BPE tokenizer
trained on the shipped corpus. Nothing is downloaded."""

from __future__ import annotations

import time
from pathlib import Path

from toolkit.data import corpus_paragraphs
from toolkit.errors import ToolkitError
from toolkit.manifest import write_manifest
from toolkit.model.presets import OFFLINE_PRESETS
from toolkit.model.spec import load_model_spec
from toolkit.model.tokenizer import save_portable_tokenizer

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]


def train_tokenizer(target_vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=target_vocab, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus_paragraphs(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    # PreTrainedTokenizerFast (not transformers 5's "TokenizersBackend") so that 4.x loads it too.
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")


def create_offline_model(preset: str, out_dir: Path, seed: int = 0) -> Path:
    if preset not in OFFLINE_PRESETS:
        raise ToolkitError(f"unknown preset {preset!r}", f"use one of: {', '.join(OFFLINE_PRESETS)}")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    start = time.perf_counter()
    shape = dict(OFFLINE_PRESETS[preset])
    tokenizer = train_tokenizer(shape.pop("target_vocab"))
    config = LlamaConfig(**shape, vocab_size=len(tokenizer), head_dim=shape["hidden_size"] // shape["num_attention_heads"],
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
                         rope_theta=10000.0, torch_dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    save_portable_tokenizer(tokenizer, out_dir)
    spec = load_model_spec(out_dir)
    write_manifest(out_dir, "init-model", {"preset": preset, "seed": seed},
                   {"dir": str(out_dir), "spec": spec.to_dict()}, time.perf_counter() - start)
    return out_dir

