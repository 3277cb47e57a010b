"""`toolkit repo`: write a Triton model repository for an engine.

Target `cpu`: python-backend models (toolkit/repo/python_models/) — the CPU engine serves the
engine directory with in-flight batching. Target `trtllm`: the same layout with the
`tensorrtllm` backend and its inflight_fused_batching parameters (runs in the NGC container).
"""

from __future__ import annotations

import shutil
import time
from importlib import resources
from pathlib import Path

from toolkit.engine.engine_config import EngineConfig
from toolkit.config import DeploymentConfig
from toolkit.errors import ToolkitError
from toolkit.manifest import read_manifest, write_manifest
from toolkit.repo.models import ENSEMBLE_STEPS, MODEL_TENSORS
from toolkit.repo.native import build_backend
from toolkit.repo.pbtxt import ensemble_scheduling, model_config

# python_models/<source> → <model>/1/<file>
_PYTHON_FILES = {
    "preprocessing": {"preprocessing.py": "model.py"},
    "postprocessing": {"postprocessing.py": "model.py"},
    "tensorrt_llm": {"cpu_engine.py": "model.py", "quantized_checkpoint.py": "quantized_checkpoint.py"},
    "tensorrt_llm_bls": {"bls.py": "model.py"},
    "synthetic": {"synthetic.py": "model.py"},
}


def tokenizer_dir_of(engine_dir: Path, target: str) -> Path:
    """Where the tokenizer lives for a built engine (beside the CPU engine's checkpoint)."""
    return engine_dir / "checkpoint" if target == "cpu" else engine_dir / "tokenizer"


def _copy_python_model(repo_dir: Path, model: str) -> None:
    version_dir = repo_dir / model / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    package = resources.files("toolkit.repo.python_models")
    for source, dest in _PYTHON_FILES[model].items():
        (version_dir / dest).write_text(package.joinpath(source).read_text())


def engine_model_config(config: DeploymentConfig, engine: EngineConfig, engine_dir: Path) -> str:
    inputs, outputs = MODEL_TENSORS["tensorrt_llm"]
    e = config.engine
    if e.target == "cpu":
        params = {"engine_dir": engine_dir, "enable_kv_cache_reuse": e.enable_kv_cache_reuse}
        return model_config("tensorrt_llm", "python", engine.max_batch_size, inputs, outputs, params, decoupled=True)
    params = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": engine_dir,
        "batch_scheduler_policy": e.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": e.kv_cache_free_gpu_mem_fraction,
        "enable_kv_cache_reuse": e.enable_kv_cache_reuse,
        "enable_chunked_context": e.enable_chunked_context,
        # Only generated tokens come back, so clients count output tokens, not prompt + output.
        "exclude_input_in_output": True,
        "max_beam_width": 1,
    }
    return model_config("tensorrt_llm", "tensorrtllm", engine.max_batch_size, inputs, outputs, params,
                        decoupled=True,
                        extra=f"dynamic_batching {{\n  preferred_batch_size: [ {engine.max_batch_size} ]\n}}\n")


LLMAPI_TEMPLATE_ENV = "TRTLLM_TRITON_MODELS"
_LLMAPI_TEMPLATE_CANDIDATES = ("/app/all_models", "/opt/tensorrt_llm/triton_backend/all_models",
                               "/workspace/tensorrt_llm/triton_backend/all_models")


def llmapi_template_dir() -> Path | None:
    """TensorRT-LLM's own llmapi Triton model (config.pbtxt + model.py), shipped in its container."""
    import os

    roots = [os.environ[LLMAPI_TEMPLATE_ENV]] if os.environ.get(LLMAPI_TEMPLATE_ENV) else []
    for root in roots + list(_LLMAPI_TEMPLATE_CANDIDATES):
        candidate = Path(root) / "llmapi" / "tensorrt_llm"
        if (candidate / "1" / "model.py").is_file():
            return candidate
    return None


def write_llmapi_repository(config: DeploymentConfig, engine_dir: Path, repo_dir: Path) -> list[str]:
    """The engine-free variant: one `tensorrt_llm` model (TensorRT-LLM's llmapi python model) whose
    model.yaml holds the LLM(...) arguments written by `toolkit build --target llmapi`.
    Its config.pbtxt and model.py come from TensorRT-LLM (not reproduced here); without them the
    repository check fails and says where to get them."""
    import yaml

    from toolkit.engine.llmapi import LLMAPI_CONFIG_FILE

    model_dir = repo_dir / "tensorrt_llm"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    options = yaml.safe_load((engine_dir / LLMAPI_CONFIG_FILE).read_text())
    options["triton_config"] = {"max_batch_size": 0, "decoupled": True}
    (model_dir / "1" / "model.yaml").write_text(yaml.safe_dump(options, sort_keys=False))
    template = llmapi_template_dir()
    if template is None:
        return []
    shutil.copy2(template / "config.pbtxt", model_dir / "config.pbtxt")
    shutil.copy2(template / "1" / "model.py", model_dir / "1" / "model.py")
    return [str(template)]


def write_repository(config: DeploymentConfig, engine_dir: Path, repo_dir: Path) -> Path:
    start = time.perf_counter()
    read_manifest(engine_dir, "build", "toolkit build --config ...")
    if config.engine.target == "llmapi":
        _empty_dir(repo_dir)
        templates = write_llmapi_repository(config, engine_dir.resolve(), repo_dir)
        write_manifest(repo_dir, "repo", {"engine_dir": str(engine_dir), "target": "llmapi"},
                       {"models": ["tensorrt_llm"], "templates": templates}, time.perf_counter() - start)
        return repo_dir
    engine = EngineConfig.read(engine_dir)
    engine_dir = engine_dir.resolve()
    tokenizer_dir = tokenizer_dir_of(engine_dir, config.engine.target)
    _empty_dir(repo_dir)
    batch = engine.max_batch_size

    for name in ("preprocessing", "postprocessing"):
        inputs, outputs = MODEL_TENSORS[name]
        _write(repo_dir / name / "config.pbtxt",
               model_config(name, "python", batch, inputs, outputs, {"tokenizer_dir": tokenizer_dir}))
        _copy_python_model(repo_dir, name)

    _write(repo_dir / "tensorrt_llm" / "config.pbtxt", engine_model_config(config, engine, engine_dir))
    if config.engine.target == "cpu":
        _copy_python_model(repo_dir, "tensorrt_llm")
    else:
        (repo_dir / "tensorrt_llm" / "1").mkdir(parents=True, exist_ok=True)

    inputs, outputs = MODEL_TENSORS["ensemble"]
    # The BLS alternative to the ensemble: same tensors, decoupled, whole-sequence detokenization.
    _write(repo_dir / "tensorrt_llm_bls" / "config.pbtxt",
           model_config("tensorrt_llm_bls", "python", batch, inputs, outputs, decoupled=True))
    _copy_python_model(repo_dir, "tensorrt_llm_bls")
    _write(repo_dir / "ensemble" / "config.pbtxt",
           model_config("ensemble", None, batch, inputs, outputs, extra=ensemble_scheduling(ENSEMBLE_STEPS)))
    (repo_dir / "ensemble" / "1").mkdir(parents=True, exist_ok=True)

    write_manifest(repo_dir, "repo", {"engine_dir": str(engine_dir), "target": config.engine.target},
                   {"models": sorted(p.name for p in repo_dir.iterdir() if p.is_dir()),
                    "tokenizer_dir": str(tokenizer_dir)}, time.perf_counter() - start)
    return repo_dir


def _empty_dir(path: Path) -> None:
    """A repository is rewritten whole: nothing of an earlier one (a model since dropped) may linger."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


SYNTHETIC_BACKENDS = ("native", "python")


def write_synthetic_repository(repo_dir: Path, ttft_ms: float, itl_ms: float, max_batch_size: int = 256,
                               instances: int = 1, backend: str = "native") -> Path:
    """A repository with one `synthetic` model streaming at a fixed TTFT and ITL (client calibration).

    backend "native": the C++ backend (toolkit/repo/cpp_backends/synthetic_backend.cc, compiled here), whose
    request intake keeps up with hundreds of simultaneous streams; "python": the python-backend twin.
    """
    if backend not in SYNTHETIC_BACKENDS:
        raise ToolkitError(f"unknown synthetic backend {backend!r}", f"use one of {', '.join(SYNTHETIC_BACKENDS)}")
    _empty_dir(repo_dir)
    inputs, outputs = MODEL_TENSORS["ensemble"]
    triton_backend = "toolkit_synthetic" if backend == "native" else "python"
    _write(repo_dir / "synthetic" / "config.pbtxt",
           model_config("synthetic", triton_backend, max_batch_size, inputs, outputs,
                        {"ttft_ms": ttft_ms, "itl_ms": itl_ms}, decoupled=True, instance_count=instances))
    if backend == "native":
        # Triton looks for libtriton_<backend>.so in the model's directory before its backend directory.
        library = build_backend("toolkit_synthetic", "synthetic_backend.cc")
        (repo_dir / "synthetic" / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy2(library, repo_dir / "synthetic" / library.name)
    else:
        _copy_python_model(repo_dir, "synthetic")
    write_manifest(repo_dir, "repo", {"synthetic": {"ttft_ms": ttft_ms, "itl_ms": itl_ms, "backend": backend}},
                   {"models": ["synthetic"]}, 0.0)
    return repo_dir
