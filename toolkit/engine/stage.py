"""`toolkit build`: one entry point over the targets cpu, trtllm (engine) and llmapi (engine-free); what each
builds is its target's (toolkit/targets.py)."""

from __future__ import annotations

import time
from pathlib import Path

from toolkit.engine.engine_config import EngineConfig
from toolkit.config import DeploymentConfig
from toolkit.manifest import read_manifest, write_manifest
from toolkit.targets import target_of


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "generation_config.json")


def copy_tokenizer(checkpoint_dir: Path, out_dir: Path) -> Path:
    """The repository's pre/postprocessing read the tokenizer from beside the engine."""
    import shutil

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (checkpoint_dir / name).is_file():
            shutil.copy2(checkpoint_dir / name, out_dir / name)
    return out_dir


def build_engine(config: DeploymentConfig, checkpoint_dir: Path, engine_dir: Path, dry_run: bool = False) -> dict:
    start = time.perf_counter()
    limits = EngineConfig.from_deployment(config)
    target = target_of(config)
    if dry_run:
        return dry_run_plan(config, checkpoint_dir, engine_dir, limits)
    quantized = read_manifest(checkpoint_dir, "quantize", "toolkit quantize --config ...")
    outputs = target.build(config, checkpoint_dir, engine_dir, limits, quantized["inputs"])
    write_manifest(engine_dir, "build", {"checkpoint_dir": str(checkpoint_dir), "target": target.name,
                                         "quantize": quantized["inputs"]},
                   outputs | {"engine_dir": str(engine_dir)}, time.perf_counter() - start)
    return outputs


def dry_run_plan(config: DeploymentConfig, checkpoint_dir: Path, engine_dir: Path, limits: EngineConfig) -> dict:
    """What `toolkit build` would run or write, without a checkpoint having to exist yet."""
    present = (checkpoint_dir / "manifest.json").is_file()
    note = None if present else (f"the checkpoint {checkpoint_dir} is not there yet: `toolkit quantize` writes it "
                                 "before this runs")
    command = target_of(config).build_plan(config, checkpoint_dir, engine_dir, limits, present)
    return {"command": command, **({"note": note} if note else {})}
