"""`EngineConfig`: the limits an engine was built with — the one source both the engine and the
Triton repository read (max batch, max lengths, max tokens per step, KV block size)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.config import DeploymentConfig
from toolkit.engine.runtime.layout import ENGINE_CONFIG_FILE
from toolkit.errors import ToolkitError


@dataclass(frozen=True)
class EngineConfig:
    target: str
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    tokens_per_block: int
    kv_cache_blocks: int
    qformat: str
    kv_cache_dtype: str
    tp: int = 1
    pp: int = 1
    # Scheduler options, as TensorRT-LLM names them (there they are Triton model parameters; the CPU
    # engine reads them from here, and a config.pbtxt parameter of the same name overrides).
    enable_chunked_context: bool = True
    enable_kv_cache_reuse: bool = False
    batch_scheduler_policy: str = "guaranteed_no_evict"
    max_draft_len: int = 0  # > 0: n-gram speculative decoding (CPU engine)
    dtype: str = "auto"  # activations (the CPU engine's auto: bfloat16)
    # CPU: what prompt chunks' bf16 GEMMs compute in, chosen by timing at `toolkit build` ("auto" until then)
    prompt_gemm_dtype: str = "auto"
    device: str = "cpu"  # the embedded engine's torch device (cpu, cuda)
    int4_activations: str = "auto"  # CPU engine, INT4-AWQ decode rows (config.EngineSection)

    @classmethod
    def from_deployment(cls, config: DeploymentConfig) -> "EngineConfig":
        e = config.engine
        return cls(target=e.target, max_batch_size=e.max_batch_size, max_input_len=e.max_input_len,
                   max_seq_len=e.max_seq_len, max_num_tokens=e.max_num_tokens, tokens_per_block=e.tokens_per_block,
                   kv_cache_blocks=e.kv_cache_blocks, qformat=config.quantize.qformat,
                   kv_cache_dtype=config.quantize.kv_cache_dtype, tp=config.parallel.tp, pp=config.parallel.pp,
                   enable_chunked_context=e.enable_chunked_context, enable_kv_cache_reuse=e.enable_kv_cache_reuse,
                   batch_scheduler_policy=e.batch_scheduler_policy,
                   max_draft_len=e.max_draft_len if e.speculative_decoding == "ngram" else 0, dtype=e.dtype,
                   device=e.device, int4_activations=e.int4_activations)

    def write(self, engine_dir: Path) -> Path:
        path = Path(engine_dir) / ENGINE_CONFIG_FILE
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, engine_dir: Path) -> "EngineConfig":
        path = Path(engine_dir) / ENGINE_CONFIG_FILE
        if not path.is_file():
            raise ToolkitError(f"{engine_dir} has no {ENGINE_CONFIG_FILE}", "run `toolkit build` first")
        return cls(**json.loads(path.read_text()))

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_cache_blocks * self.tokens_per_block
