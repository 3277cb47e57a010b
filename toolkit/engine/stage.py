"""`toolkit build`: one entry point over the targets cpu, trtllm (engine) and llmapi (engine-free)."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from toolkit.engine.cpu import build_cpu_engine
from toolkit.engine.engine_config import EngineConfig
from toolkit.engine.llmapi import LLMAPI_CONFIG_FILE, llmapi_options, validate_llmapi_options, write_llmapi_config
from toolkit.engine.trtllm import checkpoint_mapping, run_trtllm_build, trtllm_build_command
from toolkit.config import DeploymentConfig
from toolkit.errors import ToolkitError
from toolkit.manifest import read_manifest, write_manifest


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
    target = config.engine.target
    if dry_run:
        return dry_run_plan(config, checkpoint_dir, engine_dir, limits)
    quantized = read_manifest(checkpoint_dir, "quantize", "toolkit quantize --config ...")
    if target == "cpu":
        outputs = build_cpu_engine(checkpoint_dir, engine_dir, limits)
    elif target == "llmapi":
        check_llmapi_checkpoint(checkpoint_dir, quantized["inputs"])
        outputs = write_llmapi_config(checkpoint_dir, engine_dir, config.engine, limits)
    else:
        check_trtllm_checkpoint(checkpoint_dir, quantized["inputs"], limits)
        cmd = trtllm_build_command(checkpoint_dir, engine_dir, config.engine, limits)
        outputs = run_trtllm_build(cmd, engine_dir) | {"command": shlex.join(cmd)}
        limits.write(engine_dir)
    if target != "cpu":
        outputs["tokenizer_dir"] = str(copy_tokenizer(checkpoint_dir, engine_dir / "tokenizer"))
    write_manifest(engine_dir, "build", {"checkpoint_dir": str(checkpoint_dir), "target": target,
                                         "quantize": quantized["inputs"]},
                   outputs | {"engine_dir": str(engine_dir)}, time.perf_counter() - start)
    return outputs


def check_trtllm_checkpoint(checkpoint_dir: Path, quantize_inputs: dict, limits: EngineConfig) -> None:
    if quantize_inputs.get("export") != "trtllm":
        raise ToolkitError(f"{checkpoint_dir} is a unified HF checkpoint; trtllm-build needs a TensorRT-LLM one",
                           "set quantize.export: trtllm (or use engine.target: llmapi)")
    tp, pp = checkpoint_mapping(checkpoint_dir)
    if (tp, pp) != (limits.tp, limits.pp):
        raise ToolkitError(f"checkpoint mapping is tp={tp} pp={pp} but the config asks tp={limits.tp} pp={limits.pp}",
                           "re-run `toolkit quantize` with the config's parallel section")


def check_llmapi_checkpoint(checkpoint_dir: Path, quantize_inputs: dict) -> None:
    if quantize_inputs.get("export") == "trtllm":
        raise ToolkitError(f"{checkpoint_dir} is a TensorRT-LLM (rank-sharded) checkpoint; the LLM API loads the "
                           "unified HF checkpoint and shards it itself", "set quantize.export: hf for engine.target llmapi")


def dry_run_plan(config: DeploymentConfig, checkpoint_dir: Path, engine_dir: Path, limits: EngineConfig) -> dict:
    """What `toolkit build` would run or write, without a checkpoint having to exist yet."""
    import yaml

    target = config.engine.target
    present = (checkpoint_dir / "manifest.json").is_file()
    note = None if present else (f"the checkpoint {checkpoint_dir} is not there yet: `toolkit quantize` writes it "
                                 "before this runs")
    if target == "trtllm":
        if present:
            check_trtllm_checkpoint(checkpoint_dir, read_manifest(checkpoint_dir, "quantize", "")["inputs"], limits)
        command = shlex.join(trtllm_build_command(checkpoint_dir, engine_dir, config.engine, limits))
    elif target == "llmapi":
        check_llmapi_checkpoint(checkpoint_dir, {"export": config.quantize.export})
        options = llmapi_options(checkpoint_dir.resolve(), config.engine, limits)
        validate_llmapi_options(options)
        command = f"# {engine_dir / LLMAPI_CONFIG_FILE}\n" + yaml.safe_dump(options, sort_keys=False).rstrip()
    else:
        command = f"# cpu target: copies {checkpoint_dir} to {engine_dir} and writes engine_config.json (nothing to run)"
    return {"command": command, **({"note": note} if note else {})}
