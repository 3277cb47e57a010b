"""`toolkit repo`: write a Triton model repository for an engine; the target (toolkit/targets.py) says which.

The ensemble layout (targets `cpu` and `trtllm`): python-backend pre/postprocessing and BLS
(toolkit/repo/python_models/) around the `tensorrt_llm` engine model — for `cpu` a python model
over the embedded engine, for `trtllm` the `tensorrtllm` backend with its inflight_fused_batching
parameters (runs in the NGC container). Target `llmapi`: TensorRT-LLM's own `llmapi` python model
with a model.yaml of LLM(...) arguments.
Tensors and parameters follow the upstream templates (toolkit/repo/upstream.py says what is set,
what is left out and why).
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
from toolkit.repo.models import ENSEMBLE_STEPS, LLMAPI_INPUTS, LLMAPI_OUTPUTS, MODEL_TENSORS
from toolkit.repo.native import build_backend
from toolkit.repo.pbtxt import DynamicBatching, ensemble_scheduling, model_config
from toolkit.repo.upstream import (CHECKED_TEMPLATE_VERSIONS, EXECUTOR_WORKER_PATH, TEMPLATE_DIR_ENV,
                                   TEMPLATE_VERSION_ENV, TRITON_IMAGE_TAG)
from toolkit.targets import EngineTarget, target_of

# python_models/<source> → <model>/1/<file>
_PYTHON_FILES = {
    "preprocessing": {"preprocessing.py": "model.py"},
    "postprocessing": {"postprocessing.py": "model.py"},
    "tensorrt_llm": {"cpu_engine.py": "model.py"},  # an adapter over toolkit.engine.runtime (in the venv)
    "tensorrt_llm_bls": {"bls.py": "model.py", "incremental_text.py": "incremental_text.py"},
    "synthetic": {"synthetic.py": "model.py"},
}


def _copy_python_model(repo_dir: Path, model: str) -> None:
    version_dir = repo_dir / model / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    package = resources.files("toolkit.repo.python_models")
    for source, dest in _PYTHON_FILES[model].items():
        (version_dir / dest).write_text(package.joinpath(source).read_text())


def python_model_instances(config: DeploymentConfig) -> int:
    """Instances of preprocessing / postprocessing / BLS: every stream's every token passes through them."""
    return config.engine.python_model_instances or target_of(config).python_model_instances


def _batching(config: DeploymentConfig, engine: EngineConfig) -> DynamicBatching:
    e = config.engine
    return DynamicBatching(engine.max_batch_size, e.max_queue_delay_microseconds, e.max_queue_size)


def trtllm_parameters(config: DeploymentConfig, engine_dir: Path) -> dict[str, object]:
    """The `tensorrtllm` backend's parameters: the keys upstream.TRTLLM_PARAMS marks as set."""
    e = config.engine
    params: dict[str, object] = {
        "max_beam_width": 1,
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": engine_dir,
        "batch_scheduler_policy": e.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": e.kv_cache_free_gpu_mem_fraction,
        "enable_kv_cache_reuse": e.enable_kv_cache_reuse,
        "enable_chunked_context": e.enable_chunked_context,
        # Only generated tokens come back, so clients count output tokens, not prompt + output.
        "exclude_input_in_output": True,
        "cuda_graph_mode": e.use_cuda_graph,
        "executor_worker_path": EXECUTOR_WORKER_PATH,
    }
    if e.max_tokens_in_paged_kv_cache:
        params["max_tokens_in_paged_kv_cache"] = e.max_tokens_in_paged_kv_cache
    return params


_LLMAPI_TEMPLATE_CANDIDATES = ("/opt/tensorrt_llm/triton_backend/all_models", "/app/all_models",
                               "/workspace/tensorrt_llm/triton_backend/all_models")


def llmapi_template_dir() -> Path | None:
    """TensorRT-LLM's own llmapi Triton model (1/model.py, 1/helpers.py), from the TensorRT-LLM tree the
    image cloned at its release tag (TRTLLM_TRITON_MODELS), as NVIDIA's guide gets it."""
    import os

    roots = [os.environ[TEMPLATE_DIR_ENV]] if os.environ.get(TEMPLATE_DIR_ENV) else []
    for root in roots + list(_LLMAPI_TEMPLATE_CANDIDATES):
        candidate = Path(root) / "llmapi" / "tensorrt_llm"
        if (candidate / "1" / "model.py").is_file():
            return candidate
    return None


def template_version() -> str | None:
    """The TensorRT-LLM version of the templates: TRTLLM_TEMPLATES_VERSION, else the installed package's."""
    import os
    from importlib import metadata

    if os.environ.get(TEMPLATE_VERSION_ENV):
        return os.environ[TEMPLATE_VERSION_ENV]
    try:
        return metadata.version("tensorrt_llm")
    except metadata.PackageNotFoundError:
        return None


def check_template_version(version: str | None) -> None:
    import os

    if version in CHECKED_TEMPLATE_VERSIONS or os.environ.get("TOOLKIT_UNCHECKED_TEMPLATES") == "1":
        return
    what = f"TensorRT-LLM {version}" if version else "templates of unknown version"
    raise ToolkitError(f"{what}: the toolkit's repository was checked against TensorRT-LLM "
                       f"{', '.join(CHECKED_TEMPLATE_VERSIONS)} only",
                       f"use the image docker/Dockerfile pins ({TRITON_IMAGE_TAG}), set {TEMPLATE_VERSION_ENV} to the "
                       "tag you cloned, or TOOLKIT_UNCHECKED_TEMPLATES=1 to go on unchecked")


def llmapi_model_config() -> str:
    """The llmapi template's config.pbtxt with max_batch_size and decoupled written out: the template leaves
    them to model.yaml via auto_complete_config, which Triton skips under --disable-auto-complete-config
    (NVIDIA's launch_triton_server.py passes it, and so do we)."""
    return model_config("tensorrt_llm", "python", LLMAPI_MAX_BATCH_SIZE, LLMAPI_INPUTS, LLMAPI_OUTPUTS, decoupled=True)


# The llmapi model takes one prompt per request ("batch support is tracked" upstream): batching happens
# inside the LLM API's scheduler, so Triton's max_batch_size is 0.
LLMAPI_MAX_BATCH_SIZE = 0


def write_llmapi_models(target: EngineTarget, config: DeploymentConfig, engine_dir: Path, repo_dir: Path) -> dict:
    """The engine-free variant: one `tensorrt_llm` model (TensorRT-LLM's llmapi python model) whose
    model.yaml holds the LLM(...) arguments written by `toolkit build --target llmapi`. Its python files come
    from TensorRT-LLM at a checked version; without them the repository check fails and says where to get them."""
    import yaml

    from toolkit.engine.llmapi import LLMAPI_CONFIG_FILE

    _empty_dir(repo_dir)
    model_dir = repo_dir / "tensorrt_llm"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    options = yaml.safe_load((engine_dir / LLMAPI_CONFIG_FILE).read_text())
    options["triton_config"] = {"max_batch_size": LLMAPI_MAX_BATCH_SIZE, "decoupled": True}
    (model_dir / "1" / "model.yaml").write_text(yaml.safe_dump(options, sort_keys=False))
    _write(model_dir / "config.pbtxt", llmapi_model_config())
    template = llmapi_template_dir()
    templates = []
    if template is not None:
        check_template_version(template_version())
        for source in sorted((template / "1").glob("*.py")):
            shutil.copy2(source, model_dir / "1" / source.name)
        templates = [str(template)]
    return {"models": ["tensorrt_llm"], "templates": templates, "tokenizer_dir": str(target.tokenizer_dir(engine_dir)),
            "client_model": "tensorrt_llm", "tensors": "llmapi"}


def write_repository(config: DeploymentConfig, engine_dir: Path, repo_dir: Path) -> Path:
    start = time.perf_counter()
    read_manifest(engine_dir, "build", "toolkit build --config ...")
    engine_dir = engine_dir.resolve()
    target = target_of(config)
    outputs = target.write_models(config, engine_dir, repo_dir)
    write_manifest(repo_dir, "repo", {"engine_dir": str(engine_dir), "target": target.name}, outputs,
                   time.perf_counter() - start)
    return repo_dir


def write_ensemble_models(target: EngineTarget, config: DeploymentConfig, engine_dir: Path, repo_dir: Path) -> dict:
    """Pre/postprocessing, the target's engine model, BLS and the ensemble over them (inflight_batcher_llm)."""
    engine = EngineConfig.read(engine_dir)
    _empty_dir(repo_dir)
    batch = engine.max_batch_size
    instances = python_model_instances(config)
    tokenizer_dir = target.tokenizer_dir(engine_dir)

    pre_in, pre_out = MODEL_TENSORS["preprocessing"]
    _write(repo_dir / "preprocessing" / "config.pbtxt",
           model_config("preprocessing", "python", batch, pre_in, pre_out,
                        {"tokenizer_dir": tokenizer_dir, "add_special_tokens": True},
                        instance_count=instances, batching=_batching(config, engine)))
    post_in, post_out = MODEL_TENSORS["postprocessing"]
    _write(repo_dir / "postprocessing" / "config.pbtxt",
           model_config("postprocessing", "python", batch, post_in, post_out,
                        {"tokenizer_dir": tokenizer_dir, "skip_special_tokens": True},
                        instance_count=instances, batching=DynamicBatching()))
    for name in ("preprocessing", "postprocessing"):
        _copy_python_model(repo_dir, name)

    backend, params = target.engine_model(config, engine_dir)
    engine_in, engine_out = MODEL_TENSORS["tensorrt_llm"]
    _write(repo_dir / "tensorrt_llm" / "config.pbtxt",
           model_config("tensorrt_llm", backend, batch, engine_in, engine_out, params, decoupled=True,
                        batching=_batching(config, engine)))
    if backend == "python":  # runs the 1/model.py beside it; the tensorrtllm backend loads gpt_model_path
        _copy_python_model(repo_dir, "tensorrt_llm")
    else:
        (repo_dir / "tensorrt_llm" / "1").mkdir(parents=True, exist_ok=True)

    inputs, outputs = MODEL_TENSORS["ensemble"]
    # The BLS alternative to the ensemble: same tensors, decoupled, incremental detokenization.
    _write(repo_dir / "tensorrt_llm_bls" / "config.pbtxt",
           model_config("tensorrt_llm_bls", "python", batch, inputs, outputs,
                        {"tensorrt_llm_model_name": "tensorrt_llm"}, decoupled=True, instance_count=instances))
    _copy_python_model(repo_dir, "tensorrt_llm_bls")
    _write(repo_dir / "ensemble" / "config.pbtxt",
           model_config("ensemble", None, batch, inputs, outputs, extra=ensemble_scheduling(ENSEMBLE_STEPS)))
    (repo_dir / "ensemble" / "1").mkdir(parents=True, exist_ok=True)

    return {"models": sorted(p.name for p in repo_dir.iterdir() if p.is_dir()),
            "tokenizer_dir": str(tokenizer_dir), "client_model": "ensemble", "tensors": "ensemble"}


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
