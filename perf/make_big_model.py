"""A random model larger than this machine's last-level cache, for checking the planner where a decode step's
weights stream from memory (`small`'s 0.1-0.2 GB fit a large L3 and never do).

    .venv/bin/python perf/make_big_model.py                       # build/models/big, build/checkpoints/big-none
    .venv/bin/python perf/engine_bench.py --model big --formats none --batches 1,4 --no-peers --repeats 2

Llama-shaped (hidden 2048, 16 layers, 32 heads over 8 kv heads of 64, intermediate 5632: 0.73 B parameters, 1.45 GB in
bf16), random weights (std 0.02, as `toolkit init-model`), `small`'s tokenizer. Unquantized only: the checkpoint is the
model with a quantize-stage manifest (qformat none), as `toolkit quantize --qformat none` writes for `small`. On the
AMX Xeon (480 MiB of L3, 2026-11-29) its batch-1 step ran 48.6 ms where the planner had said 28.1 before its probe
re-read a set past the cache (perf/README "The AMX Xeon, last").
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
             intermediate_size=5632)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="big")
    parser.add_argument("--like", default="small", help="the built model whose config and tokenizer it starts from")
    args = parser.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    source = ROOT / "build" / "models" / args.like
    if not (source / "config.json").is_file():
        raise SystemExit(f"no model at {source}: run `make demo` first (it builds {args.like})")
    config = json.loads((source / "config.json").read_text()) | SHAPE | {"dtype": "bfloat16"}
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config)).to(torch.bfloat16)
    out = ROOT / "build" / "models" / args.name
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, out / name)
    checkpoint = ROOT / "build" / "checkpoints" / f"{args.name}-none"
    shutil.rmtree(checkpoint, ignore_errors=True)
    shutil.copytree(out, checkpoint)
    manifest = ROOT / "build" / "checkpoints" / f"{args.like}-none" / "manifest.json"
    if manifest.is_file():  # the stage's manifest, pointed at this model
        record = json.loads(manifest.read_text())
        record["inputs"]["model_dir"] = str(out.relative_to(ROOT))
        record["outputs"]["checkpoint_dir"] = str(checkpoint.relative_to(ROOT))
        (checkpoint / "manifest.json").write_text(json.dumps(record, indent=2) + "\n")
    params = sum(p.numel() for p in model.parameters())
    print(f"{out} and {checkpoint}: {params / 1e9:.2f} B parameters, {2 * params / 1e9:.2f} GB in bf16")


if __name__ == "__main__":
    main()
