"""The stages as importable functions over a DeploymentConfig. The CLI is a thin layer over these."""

from __future__ import annotations

from pathlib import Path

from toolkit.config import ArtifactLayout, DeploymentConfig
from toolkit.errors import ToolkitError


def init_model(config: DeploymentConfig, layout: ArtifactLayout, force: bool = False) -> Path:
    from toolkit.model.factory import create_offline_model

    preset = config.model.preset
    if preset is None:
        raise ToolkitError(f"model.source is the checkpoint {config.model.source}, not a preset",
                           "init-model builds presets only (model.source: preset:tiny or preset:small)")
    out = layout.model_dir
    if (out / "manifest.json").is_file() and not force:
        return out
    return create_offline_model(preset, out)


def ensure_model(config: DeploymentConfig, layout: ArtifactLayout) -> Path:
    """The model directory, creating an offline preset on first use."""
    if config.model.preset:
        return init_model(config, layout)
    if not (layout.model_dir / "config.json").is_file():
        raise ToolkitError(f"{layout.model_dir} has no config.json",
                           "point model.source at a Hugging Face checkpoint directory, or use preset:tiny")
    return layout.model_dir


def quantize(config: DeploymentConfig, layout: ArtifactLayout):
    from toolkit.quantize.stage import quantize_checkpoint

    return quantize_checkpoint(ensure_model(config, layout), layout.checkpoint_dir, config.quantize, config.parallel)


def build(config: DeploymentConfig, layout: ArtifactLayout, dry_run: bool = False) -> dict:
    from toolkit.build.stage import build_engine

    return build_engine(config, layout.checkpoint_dir, layout.engine_dir, dry_run=dry_run)


def repo(config: DeploymentConfig, layout: ArtifactLayout) -> tuple[Path, list]:
    from toolkit.repo.checks import check_repository_or_raise
    from toolkit.repo.writer import write_repository

    repo_dir = write_repository(config, layout.engine_dir, layout.repo_dir)
    findings = check_repository_or_raise(repo_dir, world_size=config.parallel.world_size)
    return repo_dir, findings


def serve(config: DeploymentConfig, layout: ArtifactLayout):
    from toolkit.serve.server import start_server

    return start_server(config, layout.repo_dir, layout.build_dir, layout.server_state_file)


def stop(layout: ArtifactLayout):
    from toolkit.serve.server import stop_server

    return stop_server(layout.server_state_file)


def tokenizer_for(config: DeploymentConfig, layout: ArtifactLayout, explicit: str | None = None):
    from toolkit.model.tokenizer import load_tokenizer
    from toolkit.repo.writer import tokenizer_dir_of

    if explicit:
        return load_tokenizer(explicit)
    engine_tokenizer = tokenizer_dir_of(layout.engine_dir, config.engine.target)
    return load_tokenizer(engine_tokenizer if engine_tokenizer.is_dir() else layout.model_dir)


def sweep(config: DeploymentConfig, layout: ArtifactLayout, target=None, tokenizer_dir: str | None = None,
          slo=None, progress=print) -> Path:
    from toolkit.bench.sweep import Target, new_run_dir, run_sweep
    from toolkit.serve.server import ServerHandle

    if target is None:
        handle = ServerHandle.load(layout.server_state_file)
        target = Target(handle.grpc_url, handle.http_url, handle.metrics_url)
    if not target.is_ready():
        raise ToolkitError(f"the server at {target.http_url} is not ready", "start it with `toolkit serve`")
    tokenizer = tokenizer_for(config, layout, tokenizer_dir)
    run_dir = new_run_dir(layout.runs_dir, config.name)
    info = {"config_name": config.name, "model": config.model.display_name, "qformat": config.quantize.qformat,
            "target": config.engine.target, "endpoint": config.sweep.endpoint,
            "sweep": config.sweep.model_dump(), "engine": config.engine.model_dump()}
    progress(f"sweep → {run_dir}")
    run_sweep(config.sweep, target, tokenizer, run_dir, info, slo=slo, progress=progress)
    return run_dir


def report(run_dir: Path) -> Path:
    from toolkit.report.markdown import write_markdown_report
    from toolkit.report.rundir import RunDir

    return write_markdown_report(RunDir.open(run_dir))
