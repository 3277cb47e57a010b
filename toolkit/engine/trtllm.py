"""Target `trtllm`: assemble and run `trtllm-build` (TensorRT engines, TensorRT-LLM 1.x).

The command follows NVIDIA's performance tuning guidance. It runs only where `trtllm-build` is on
PATH (the NGC Triton + TensorRT-LLM container); elsewhere the stage fails with one line, and
`--dry-run` prints the command. Tensor/pipeline parallelism is not a trtllm-build flag: it comes
from the checkpoint's `mapping`, set by `toolkit quantize --export trtllm --tp N --pp M`.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

from toolkit.engine.engine_config import EngineConfig
from toolkit.config import EngineSection
from toolkit.errors import ToolkitError, missing_dependency
from toolkit.quantize.formats import trtllm_build_flags

def trtllm_build_command(checkpoint_dir: Path, engine_dir: Path, engine: EngineSection, limits: EngineConfig) -> list[str]:
    cmd = [
        "trtllm-build",
        "--checkpoint_dir", str(checkpoint_dir),
        "--output_dir", str(engine_dir),
        "--gpt_attention_plugin", "auto",
        "--context_fmha", "enable",
        "--use_paged_context_fmha", "enable",
        "--kv_cache_type", "paged",
        "--tokens_per_block", str(limits.tokens_per_block),
        "--max_batch_size", str(limits.max_batch_size),
        "--max_input_len", str(limits.max_input_len),
        "--max_seq_len", str(limits.max_seq_len),
        "--max_num_tokens", str(limits.max_num_tokens),
        "--multiple_profiles", "enable",
        "--workers", str(min(engine.workers, limits.tp * limits.pp)),
    ]
    # From the format table: the GEMM plugin (auto for bf16/fp16/int4, disable for FP8 where TensorRT's own
    # FP8 kernels are faster, nvfp4 for NVFP4 on Blackwell) and FP8 context attention beside FP8/FP4 GEMMs or KV.
    cmd += trtllm_build_flags(limits.qformat, limits.kv_cache_dtype)
    if limits.tp > 1:
        # Fuses the all-reduce with the following residual add + RMSNorm. (The custom all-reduce
        # kernel that used to be `--use_custom_all_reduce` is on by default in TensorRT-LLM ≥ 0.12.)
        cmd += ["--reduce_fusion", "enable"]
    return cmd


def checkpoint_mapping(checkpoint_dir: Path) -> tuple[int, int]:
    """TP and PP of a TensorRT-LLM checkpoint, from config.json's `mapping`."""
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise ToolkitError(f"{checkpoint_dir} has no config.json", "run `toolkit quantize --export trtllm` first")
    mapping = json.loads(path.read_text()).get("mapping")
    if not mapping:
        raise ToolkitError(f"{path} has no `mapping`: it is not a TensorRT-LLM checkpoint",
                           "run `toolkit quantize --export trtllm --tp N --pp M`")
    return int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))


def check_trtllm_checkpoint(checkpoint_dir: Path, quantize_inputs: dict, limits: EngineConfig) -> None:
    if quantize_inputs.get("export") != "trtllm":
        raise ToolkitError(f"{checkpoint_dir} is a unified HF checkpoint; trtllm-build needs a TensorRT-LLM one",
                           "set quantize.export: trtllm (or use engine.target: llmapi)")
    tp, pp = checkpoint_mapping(checkpoint_dir)
    if (tp, pp) != (limits.tp, limits.pp):
        raise ToolkitError(f"checkpoint mapping is tp={tp} pp={pp} but the config asks tp={limits.tp} pp={limits.pp}",
                           "re-run `toolkit quantize` with the config's parallel section")


def run_trtllm_build(cmd: list[str], engine_dir: Path) -> dict:
    if shutil.which("trtllm-build") is None:
        raise missing_dependency("TensorRT-LLM (trtllm-build)",
                                 "run inside the NGC Triton + TensorRT-LLM container (docker/), "
                                 "or use --dry-run to print the command")
    engine_dir.mkdir(parents=True, exist_ok=True)
    log_path = engine_dir / "trtllm-build.log"
    with log_path.open("w") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:  # stream to the terminal and the log as it builds
            print(line, end="")
            log.write(line)
        code = proc.wait()
    if code:
        raise ToolkitError(f"trtllm-build exited with {code}", f"read {log_path}")
    engine_config = engine_dir / "config.json"
    return {"log": str(log_path), "engine_config": json.loads(engine_config.read_text()) if engine_config.is_file() else None}
