"""Target `cpu`: the engine directory the embedded engine (toolkit/engine/runtime/) serves.

There is nothing to compile ahead of time on CPU: the engine is the quantized checkpoint (weights
and scales as ModelOpt exported them, kept in low precision by the runtime's model runner), the
tokenizer, and `engine_config.json` with the limits. Limits that cannot work are refused here, at
build, rather than by a server that cannot admit a request.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from toolkit.devices import resolve_device
from toolkit.engine.engine_config import EngineConfig
from toolkit.engine.runtime.layout import CHECKPOINT_SUBDIR
from toolkit.errors import ToolkitError


def check_cpu_limits(engine: EngineConfig) -> None:
    """One sequence of max_seq_len tokens must fit the paged KV cache, or no full-length request can run."""
    capacity = engine.kv_capacity_tokens
    if capacity < engine.max_seq_len:
        needed = -(-engine.max_seq_len // engine.tokens_per_block)
        raise ToolkitError(
            f"the KV cache holds {engine.kv_cache_blocks} blocks x {engine.tokens_per_block} tokens = {capacity} tokens, "
            f"less than one sequence of max_seq_len {engine.max_seq_len}",
            f"set engine.kv_cache_blocks >= {needed} ({needed * engine.max_batch_size} for max_batch_size "
            f"{engine.max_batch_size} full-length sequences), or lower engine.max_seq_len")


def build_cpu_engine(checkpoint_dir: Path, engine_dir: Path, engine: EngineConfig) -> dict:
    check_cpu_limits(engine)
    resolve_device(engine.device, "engine.device")  # cuda needs a GPU here, where it is built (as trtllm-build)
    target = engine_dir / CHECKPOINT_SUBDIR
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(checkpoint_dir, target, ignore=shutil.ignore_patterns("manifest.json"))
    if engine.prompt_gemm_dtype == "auto":  # a CPU's choice (on a GPU the runner's dtype)
        engine = replace(engine, prompt_gemm_dtype=choose_prompt_gemm_dtype() if engine.device == "cpu" else "bfloat16")
    engine.write(engine_dir)
    return {"checkpoint": str(target), "engine_config": str(engine_dir / "engine_config.json"),
            "prompt_gemm_dtype": engine.prompt_gemm_dtype}


def choose_prompt_gemm_dtype() -> str:
    """What this CPU runs prompt chunks' bf16 GEMMs faster in, timed now, at build, while nothing else runs (a
    starting server timing it among its loading neighbours chose wrong in one demo of two): the engine keeps it."""
    from toolkit.engine.runtime.kernels import time_prompt_gemm_in_fp32

    return "float32" if time_prompt_gemm_in_fp32() else "bfloat16"
