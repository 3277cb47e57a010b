"""The engine targets (`engine.target`), one object each: what differs between serving with the embedded
CPU engine, with TensorRT engines and with TensorRT-LLM's LLM API is said here once, and the stages ask
`target_of(config)` instead of comparing the target's name.

cpu: the embedded engine (toolkit/engine/runtime/) behind python-backend models.
trtllm: TensorRT engines built by trtllm-build behind Triton's inflight_batcher_llm models.
llmapi: TensorRT-LLM's PyTorch backend (no engine build) behind TensorRT-LLM's own llmapi model.

config.py imports this module for the target names it accepts, so the stages a target delegates to are
imported when a method runs, not here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolkit.config import DeploymentConfig


class EngineTarget:
    name: str
    # Default instances of preprocessing / postprocessing / BLS (engine.python_model_instances unset).
    python_model_instances: int

    def tokenizer_dir(self, engine_dir: Path) -> Path:
        """Where the built engine's tokenizer lies, for the repository's pre/postprocessing and the clients."""
        raise NotImplementedError

    def write_models(self, config: DeploymentConfig, engine_dir: Path, repo_dir: Path) -> dict:
        """Write the repository's models into an emptied repo_dir; returns the repo manifest's outputs."""
        raise NotImplementedError


class CPU(EngineTarget):
    name = "cpu"
    python_model_instances = 1  # two cores: more instances only contend for them

    def tokenizer_dir(self, engine_dir: Path) -> Path:
        from toolkit.engine.runtime.layout import CHECKPOINT_SUBDIR

        return engine_dir / CHECKPOINT_SUBDIR  # the engine is the checkpoint, tokenizer included

    def write_models(self, config: DeploymentConfig, engine_dir: Path, repo_dir: Path) -> dict:
        from toolkit.repo.writer import write_ensemble_models

        return write_ensemble_models(self, config, engine_dir, repo_dir)

    def engine_model(self, config: DeploymentConfig, engine_dir: Path) -> tuple[str, dict]:
        """The `tensorrt_llm` model's (backend, parameters): the toolkit's python adapter over the engine."""
        return "python", {"engine_dir": engine_dir, "enable_kv_cache_reuse": config.engine.enable_kv_cache_reuse}


class _TensorRTLLM(EngineTarget):
    python_model_instances = 4  # upstream advises more than one: every stream's every token passes through them

    def tokenizer_dir(self, engine_dir: Path) -> Path:
        return engine_dir / "tokenizer"  # copied there by `toolkit build`: engines carry none


class TRTLLM(_TensorRTLLM):
    name = "trtllm"

    def write_models(self, config: DeploymentConfig, engine_dir: Path, repo_dir: Path) -> dict:
        from toolkit.repo.writer import write_ensemble_models

        return write_ensemble_models(self, config, engine_dir, repo_dir)

    def engine_model(self, config: DeploymentConfig, engine_dir: Path) -> tuple[str, dict]:
        from toolkit.repo.writer import trtllm_parameters

        return "tensorrtllm", trtllm_parameters(config, engine_dir)


class LLMAPI(_TensorRTLLM):
    name = "llmapi"

    def write_models(self, config: DeploymentConfig, engine_dir: Path, repo_dir: Path) -> dict:
        from toolkit.repo.writer import write_llmapi_models

        return write_llmapi_models(self, config, engine_dir, repo_dir)


TARGETS: dict[str, EngineTarget] = {t.name: t for t in (CPU(), TRTLLM(), LLMAPI())}


def target_of(config: DeploymentConfig) -> EngineTarget:
    return TARGETS[config.engine.target]
