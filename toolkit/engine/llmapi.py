"""Target `llmapi`: TensorRT-LLM's engine-free PyTorch backend (the route NVIDIA's guide now leads with).

Nothing is compiled: the "engine" is the unified HF checkpoint plus the arguments `LLM(...)`,
`trtllm-serve --extra_llm_api_options` and Triton's `llmapi` model read. Written here as YAML from the
same typed config as the engine target, and checked against the LLM API's argument names of the
TensorRT-LLM version we pin (toolkit/repo/upstream.py) before anything is written.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from toolkit.config import EngineSection
from toolkit.engine.engine_config import EngineConfig
from toolkit.errors import ToolkitError
from toolkit.quantize.stage import declared_dtype

LLMAPI_CONFIG_FILE = "llm_api_config.yaml"
# The PyTorch backend's KV-cache element types (KvCacheConfig.dtype); it has no INT8 KV cache.
_KV_DTYPES = {"none": "auto", "fp8": "fp8"}
_DTYPE_NAMES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}


def llmapi_dtype(engine: EngineSection, checkpoint_dir: Path) -> str:
    """The activation dtype, stated rather than left to "auto": engine.dtype when set, else the checkpoint's
    own 16-bit dtype; a checkpoint that declares float32 still runs in bfloat16 on a GPU unless asked."""
    if engine.dtype != "auto":
        return engine.dtype
    return _DTYPE_NAMES.get(declared_dtype(checkpoint_dir) or "", "bfloat16")


def llmapi_options(checkpoint_dir: Path, engine: EngineSection, limits: EngineConfig) -> dict:
    if limits.kv_cache_dtype not in _KV_DTYPES:
        raise ToolkitError(f"kv_cache_dtype {limits.kv_cache_dtype} is not offered by TensorRT-LLM's PyTorch backend "
                           "(engine.target llmapi)", "use quantize.kv_cache_dtype fp8 (or none), or engine.target trtllm")
    kv_cache = {
        "dtype": _KV_DTYPES[limits.kv_cache_dtype],
        "free_gpu_memory_fraction": engine.kv_cache_free_gpu_mem_fraction,
        "enable_block_reuse": engine.enable_kv_cache_reuse,
        "tokens_per_block": limits.tokens_per_block,
    }
    if engine.max_tokens_in_paged_kv_cache:
        kv_cache["max_tokens"] = engine.max_tokens_in_paged_kv_cache
    return {
        "model": str(checkpoint_dir),
        "backend": "pytorch",
        "dtype": llmapi_dtype(engine, checkpoint_dir),
        "tensor_parallel_size": limits.tp,
        "pipeline_parallel_size": limits.pp,
        "max_batch_size": limits.max_batch_size,
        "max_num_tokens": limits.max_num_tokens,
        "max_seq_len": limits.max_seq_len,
        "enable_chunked_prefill": engine.enable_chunked_context,
        "stream_interval": engine.stream_interval,
        "kv_cache_config": kv_cache,
        # One scheduler policy for both GPU targets (the engine target's batch_scheduler_policy).
        "scheduler_config": {"capacity_scheduler_policy": engine.batch_scheduler_policy.upper()},
        # null disables CUDA graphs in the PyTorch backend.
        "cuda_graph_config": ({"enable_padding": True, "max_batch_size": limits.max_batch_size}
                              if engine.use_cuda_graph else None),
    }


def validate_llmapi_options(options: dict) -> None:
    from toolkit.repo.upstream import llmapi_problems

    problems = llmapi_problems(options)
    if problems:
        _, problem, fix = problems[0]
        raise ToolkitError(f"LLM-API options: {problem}", fix)


def write_llmapi_config(checkpoint_dir: Path, engine_dir: Path, engine: EngineSection, limits: EngineConfig) -> dict:
    options = llmapi_options(checkpoint_dir.resolve(), engine, limits)
    validate_llmapi_options(options)
    engine_dir.mkdir(parents=True, exist_ok=True)
    path = engine_dir / LLMAPI_CONFIG_FILE
    path.write_text(yaml.safe_dump(options, sort_keys=False))
    limits.write(engine_dir)
    return {"llm_api_config": str(path)}


def check_llmapi_checkpoint(checkpoint_dir: Path, quantize_inputs: dict) -> None:
    if quantize_inputs.get("export") == "trtllm":
        raise ToolkitError(f"{checkpoint_dir} is a TensorRT-LLM (rank-sharded) checkpoint; the LLM API loads the "
                           "unified HF checkpoint and shards it itself", "set quantize.export: hf for engine.target llmapi")
