"""The engine targets (`engine.target`), one object each: what differs between serving with the embedded
CPU engine, with TensorRT engines and with TensorRT-LLM's LLM API is said here once, and the stages ask
`target_of(config)` instead of comparing the target's name.

cpu: the embedded engine (toolkit/engine/runtime/) behind python-backend models.
trtllm: TensorRT engines built by trtllm-build behind Triton's inflight_batcher_llm models.
llmapi: TensorRT-LLM's PyTorch backend (no engine build) behind TensorRT-LLM's own llmapi model.

config.py imports this module for the target names it accepts, so the stages a target delegates to (which
import config.py) are imported when a method runs, not here.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.engine.runtime.layout import CHECKPOINT_SUBDIR

if TYPE_CHECKING:
    from toolkit.config import DeploymentConfig
    from toolkit.engine.engine_config import EngineConfig
    from toolkit.serve.install import TritonInstall


class EngineTarget:
    name: str
    # TensorRT-LLM on NVIDIA GPUs: TP × PP ranks, GPU pods, a catalog GPU to plan on. False: the embedded CPU
    # engine, one process on this machine, whose own server the pipeline, scenarios and testbed run and read.
    on_gpu: bool
    # Default instances of preprocessing / postprocessing / BLS (engine.python_model_instances unset).
    python_model_instances: int
    # Wraps each MPI rank's tritonserver when TP × PP > 1.
    rank_launcher: tuple[str, ...] = ()
    # Its engine takes engine.stream_interval (the embedded engine; the LLM API's stream_interval); TensorRT-LLM's
    # C++ backend streams every step's tokens and has no such parameter.
    takes_stream_interval: bool = True
    # Dynamo's disaggregated prefill/decode workers can serve it.
    disaggregates: bool = False

    def build(self, config: DeploymentConfig, checkpoint_dir: Path, engine_dir: Path, limits: EngineConfig,
              quantize_inputs: dict) -> dict:
        """`toolkit build` from the quantized checkpoint; returns the build manifest's outputs."""
        raise NotImplementedError

    def build_plan(self, config: DeploymentConfig, checkpoint_dir: Path, engine_dir: Path, limits: EngineConfig,
                   checkpoint_present: bool) -> str:
        """What `build` would run or write (`toolkit build --dry-run`), checked as far as it can be."""
        raise NotImplementedError

    def tokenizer_dir(self, engine_dir: Path) -> Path:
        """Where the built engine's tokenizer lies, for the repository's pre/postprocessing and the clients."""
        raise NotImplementedError

    def write_models(self, config: DeploymentConfig, engine_dir: Path, repo_dir: Path) -> dict:
        """Write the repository's models (repo_dir is rewritten whole); returns the repo manifest's outputs.
        Unless a target says otherwise, the inflight_batcher_llm layout around its `engine_model`."""
        from toolkit.repo.writer import write_ensemble_models

        return write_ensemble_models(self, config, engine_dir, repo_dir)

    def engine_model(self, config: DeploymentConfig, engine_dir: Path) -> tuple[str, dict]:
        """The ensemble's `tensorrt_llm` model as (Triton backend, parameters)."""
        raise NotImplementedError

    def triton(self, work_dir: Path, tritonserver: str | None) -> TritonInstall:
        """The tritonserver that serves this target's repository (server.tritonserver: an explicit binary)."""
        raise NotImplementedError


class CPU(EngineTarget):
    name = "cpu"
    on_gpu = False
    python_model_instances = 1  # two cores: more instances only contend for them

    def build(self, config: DeploymentConfig, checkpoint_dir: Path, engine_dir: Path, limits: EngineConfig,
              quantize_inputs: dict) -> dict:
        from toolkit.engine.cpu import build_cpu_engine

        return build_cpu_engine(checkpoint_dir, engine_dir, limits)

    def build_plan(self, config: DeploymentConfig, checkpoint_dir: Path, engine_dir: Path, limits: EngineConfig,
                   checkpoint_present: bool) -> str:
        return f"# cpu target: copies {checkpoint_dir} to {engine_dir} and writes engine_config.json (nothing to run)"

    def tokenizer_dir(self, engine_dir: Path) -> Path:
        return engine_dir / CHECKPOINT_SUBDIR  # the engine is the checkpoint, tokenizer included

    def engine_model(self, config: DeploymentConfig, engine_dir: Path) -> tuple[str, dict]:
        # The toolkit's python model over the embedded engine (python_models/cpu_engine.py).
        params = {"engine_dir": engine_dir, "enable_kv_cache_reuse": config.engine.enable_kv_cache_reuse}
        if config.engine.cpu_threads:
            params["cpu_threads"] = config.engine.cpu_threads
        if config.engine.cpu_numa != "auto":
            params["cpu_numa"] = config.engine.cpu_numa
        if config.engine.stream_interval > 1:
            params["stream_interval"] = config.engine.stream_interval
        return "python", params

    def triton(self, work_dir: Path, tritonserver: str | None) -> TritonInstall:
        from toolkit.serve.install import cpu_triton

        return cpu_triton(work_dir)  # no NGC container on CPU: the real tritonserver the nvidia-pytriton wheel carries


class _TensorRTLLM(EngineTarget):
    on_gpu = True
    python_model_instances = 4  # upstream advises more than one: every stream's every token passes through them

    def tokenizer_dir(self, engine_dir: Path) -> Path:
        return engine_dir / "tokenizer"  # copied there by `build`: neither engines nor model.yaml carry one

    def _copy_tokenizer(self, checkpoint_dir: Path, engine_dir: Path) -> dict:
        from toolkit.engine.stage import copy_tokenizer

        return {"tokenizer_dir": str(copy_tokenizer(checkpoint_dir, self.tokenizer_dir(engine_dir)))}

    def triton(self, work_dir: Path, tritonserver: str | None) -> TritonInstall:
        from toolkit.serve.install import gpu_triton

        return gpu_triton(tritonserver)  # the NGC Triton + TensorRT-LLM container's


class TRTLLM(_TensorRTLLM):
    name = "trtllm"
    takes_stream_interval = False

    def build(self, config: DeploymentConfig, checkpoint_dir: Path, engine_dir: Path, limits: EngineConfig,
              quantize_inputs: dict) -> dict:
        from toolkit.engine.trtllm import check_trtllm_checkpoint, run_trtllm_build, trtllm_build_command

        check_trtllm_checkpoint(checkpoint_dir, quantize_inputs, limits)
        cmd = trtllm_build_command(checkpoint_dir, engine_dir, config.engine, limits)
        outputs = run_trtllm_build(cmd, engine_dir) | {"command": shlex.join(cmd)}
        limits.write(engine_dir)
        return outputs | self._copy_tokenizer(checkpoint_dir, engine_dir)

    def build_plan(self, config: DeploymentConfig, checkpoint_dir: Path, engine_dir: Path, limits: EngineConfig,
                   checkpoint_present: bool) -> str:
        from toolkit.engine.trtllm import check_trtllm_checkpoint, trtllm_build_command
        from toolkit.manifest import read_manifest

        if checkpoint_present:
            check_trtllm_checkpoint(checkpoint_dir, read_manifest(checkpoint_dir, "quantize", "")["inputs"], limits)
        return shlex.join(trtllm_build_command(checkpoint_dir, engine_dir, config.engine, limits))

    def engine_model(self, config: DeploymentConfig, engine_dir: Path) -> tuple[str, dict]:
        from toolkit.errors import ToolkitError
        from toolkit.repo.writer import trtllm_parameters

        if config.engine.stream_interval > 1:
            raise ToolkitError(f"engine.stream_interval {config.engine.stream_interval}: TensorRT-LLM's C++ backend "
                               "(target trtllm) streams every step's tokens and has no such parameter",
                               "set engine.stream_interval 1, or serve with engine.target llmapi (the LLM API's "
                               "stream_interval) or cpu")
        return "tensorrtllm", trtllm_parameters(config, engine_dir)


class LLMAPI(_TensorRTLLM):
    name = "llmapi"
    # TensorRT-LLM's PyTorch backend spans the ranks with its own MPI session, which this sets up.
    rank_launcher = ("trtllm-llmapi-launch",)
    disaggregates = True  # Dynamo's TensorRT-LLM workers run the LLM API

    def build(self, config: DeploymentConfig, checkpoint_dir: Path, engine_dir: Path, limits: EngineConfig,
              quantize_inputs: dict) -> dict:
        from toolkit.engine.llmapi import check_llmapi_checkpoint, write_llmapi_config

        check_llmapi_checkpoint(checkpoint_dir, quantize_inputs)
        outputs = write_llmapi_config(checkpoint_dir, engine_dir, config.engine, limits)
        return outputs | self._copy_tokenizer(checkpoint_dir, engine_dir)

    def build_plan(self, config: DeploymentConfig, checkpoint_dir: Path, engine_dir: Path, limits: EngineConfig,
                   checkpoint_present: bool) -> str:
        import yaml

        from toolkit.engine.llmapi import (LLMAPI_CONFIG_FILE, check_llmapi_checkpoint, llmapi_options,
                                           validate_llmapi_options)

        check_llmapi_checkpoint(checkpoint_dir, {"export": config.quantize.export})
        options = llmapi_options(checkpoint_dir.resolve(), config.engine, limits)
        validate_llmapi_options(options)
        return f"# {engine_dir / LLMAPI_CONFIG_FILE}\n" + yaml.safe_dump(options, sort_keys=False).rstrip()

    def write_models(self, config: DeploymentConfig, engine_dir: Path, repo_dir: Path) -> dict:
        from toolkit.repo.writer import write_llmapi_models

        return write_llmapi_models(self, config, engine_dir, repo_dir)


TARGETS: dict[str, EngineTarget] = {t.name: t for t in (CPU(), TRTLLM(), LLMAPI())}


def target_of(config: DeploymentConfig) -> EngineTarget:
    return TARGETS[config.engine.target]
