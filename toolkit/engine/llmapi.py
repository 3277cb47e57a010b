"""Target `llmapi`: TensorRT-LLM's engine-free PyTorch backend.

Nothing is compiled: the "engine" is the unified HF checkpoint plus the arguments `LLM(...)`,
`trtllm-serve --extra_llm_api_options` and Triton's `llmapi` model read. Written here as YAML.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from toolkit.engine.engine_config import EngineConfig
from toolkit.config import EngineSection

LLMAPI_CONFIG_FILE = "llm_api_config.yaml"


def llmapi_options(checkpoint_dir: Path, engine: EngineSection, limits: EngineConfig) -> dict:
    kv_dtype = {"fp8": "fp8", "int8": "int8"}.get(limits.kv_cache_dtype, "auto")
    return {
        "model": str(checkpoint_dir),
        "backend": "pytorch",
        "tensor_parallel_size": limits.tp,
        "pipeline_parallel_size": limits.pp,
        "max_batch_size": limits.max_batch_size,
        "max_num_tokens": limits.max_num_tokens,
        "max_seq_len": limits.max_seq_len,
        "enable_chunked_prefill": engine.enable_chunked_context,
        "kv_cache_config": {
            "dtype": kv_dtype,
            "free_gpu_memory_fraction": engine.kv_cache_free_gpu_mem_fraction,
            "enable_block_reuse": engine.enable_kv_cache_reuse,
            "tokens_per_block": limits.tokens_per_block,
        },
        "cuda_graph_config": ({"enable_padding": True, "max_batch_size": limits.max_batch_size}
                              if engine.use_cuda_graph else None),
    }


def write_llmapi_config(checkpoint_dir: Path, engine_dir: Path, engine: EngineSection, limits: EngineConfig) -> dict:
    engine_dir.mkdir(parents=True, exist_ok=True)
    path = engine_dir / LLMAPI_CONFIG_FILE
    path.write_text(yaml.safe_dump(llmapi_options(checkpoint_dir.resolve(), engine, limits), sort_keys=False))
    limits.write(engine_dir)
    return {"llm_api_config": str(path)}
