"""The stages as importable functions over a DeploymentConfig. The CLI is a thin layer over these."""

from __future__ import annotations

import time
from pathlib import Path

from toolkit.config import ArtifactLayout, DeploymentConfig
from toolkit.errors import ToolkitError
from toolkit.targets import target_of


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
    from toolkit.console import library_output
    from toolkit.quantize.stage import quantize_checkpoint

    model_dir = ensure_model(config, layout)
    with library_output():  # ModelOpt prints what it registers and how many quantizers it inserted
        return quantize_checkpoint(model_dir, layout.checkpoint_dir, config.quantize, config.parallel)


def build(config: DeploymentConfig, layout: ArtifactLayout, dry_run: bool = False) -> dict:
    from toolkit.engine.stage import build_engine

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

    if explicit:
        return load_tokenizer(explicit)
    engine_tokenizer = target_of(config).tokenizer_dir(layout.engine_dir)
    return load_tokenizer(engine_tokenizer if engine_tokenizer.is_dir() else layout.model_dir)


def target_for(config: DeploymentConfig, layout: ArtifactLayout):
    """The server to load: sweep.url when set (any server), else the one `toolkit serve` started."""
    from toolkit.bench.sweep import Target
    from toolkit.serve.server import ServerHandle

    url = config.sweep.url
    if url:
        if config.sweep.endpoint == "triton-grpc":
            return Target(grpc_url=url, http_url=None)
        ready = f"{url.rstrip('/')}/v1/models" if config.sweep.endpoint.startswith("openai") else None
        return Target(grpc_url=None, http_url=url.rstrip("/"), ready_url=ready)
    handle = ServerHandle.load(layout.server_state_file)
    http = handle.openai_url if config.sweep.endpoint.startswith("openai") else handle.http_url
    return Target(handle.grpc_url, http, handle.metrics_url, ready_url=f"{handle.http_url}/v2/health/ready",
                  server_pid=handle.pid)


def sweep(config: DeploymentConfig, layout: ArtifactLayout, target=None, tokenizer_dir: str | None = None,
          progress=print, label: str | None = None, extra_info: dict | None = None) -> Path:
    from toolkit.bench.sweep import new_run_dir, run_sweep

    target = target or target_for(config, layout)
    if not target.is_ready():
        raise ToolkitError(f"the server at {target.http_url or target.grpc_url} is not ready",
                           "start it with `toolkit serve` (or check sweep.url)")
    tokenizer = tokenizer_for(config, layout, tokenizer_dir)
    run_dir = new_run_dir(layout.runs_dir, config.name)
    info = {"config_name": config.name, "model": config.model.display_name, "qformat": config.quantize.qformat,
            "kv_cache_dtype": config.quantize.kv_cache_dtype, "target": config.engine.target,
            "endpoint": config.sweep.endpoint, "sweep": config.sweep.model_dump(), "engine": config.engine.model_dump(),
            "plan": {"gpu": config.plan.gpu}, "label": label, **(extra_info or {})}
    info.update(served_engine_info(config, layout))
    split = _client_server_autogroups(target)
    if split:
        info["host_scheduling"] = split
        from toolkit.serve.server import AUTOGROUP_FIX, client_in_another_session

        progress(f"warning: this sweep runs {client_in_another_session(split)}: the kernel shares the cores between "
                 f"sessions, and a client woken on a core the server fills can wait 100+ ms, measured as token gaps: "
                 f"{AUTOGROUP_FIX}")
    try:  # lets reports hold the measurements against `toolkit plan`
        info["model_spec"] = model_spec_for(config, layout).to_dict()
        info["plan_deployment"] = deployment_for_plan(config).__dict__
    except ToolkitError:
        pass
    progress(f"sweep → {run_dir}")
    started = time.time()
    try:
        run_sweep(config.sweep, target, tokenizer, run_dir, info, progress=progress)
    except (ToolkitError, KeyboardInterrupt):
        # A dying server or Ctrl-C still leaves a (partial) report of what was measured.
        fetch_engine_timeline(config, layout, run_dir, started)
        write_run_plan(config, layout, run_dir)
        report(run_dir)
        progress(f"partial report: {run_dir / 'report.md'}")
        raise
    fetch_engine_timeline(config, layout, run_dir, started)
    write_run_plan(config, layout, run_dir)
    return run_dir


def _client_server_autogroups(target) -> dict | None:
    """separate_autogroups for a server `toolkit serve` started here (not for sweep.url's, which may be remote)."""
    from toolkit.serve.server import separate_autogroups

    return separate_autogroups(target.server_pid) if target.server_pid else None


def write_run_plan(config: DeploymentConfig, layout: ArtifactLayout, run_dir: Path) -> None:
    """The plan the run's measurements are held against (model × plan.gpu × the config's deployment),
    as plan.json + roofline.png in the run folder: reports read it and never re-plan. Written after the
    load, so that a CPU probe never runs beside a measurement."""
    from toolkit.plan.stage import plan_for_config, write_plan

    try:
        write_plan(plan_for_config(config, model_spec_for(config, layout)), run_dir)
    except ToolkitError:
        pass  # no model to plan (e.g. --url at a server whose model is not here): reports go without it


def served_engine_info(config: DeploymentConfig, layout: ArtifactLayout) -> dict:
    """What the CPU target's own server says it runs (weight_format, compute_dtype, ...); {} otherwise."""
    if target_of(config).on_gpu or config.sweep.url:
        return {}
    from toolkit.engine.runtime.layout import read_engine_info

    info = read_engine_info(layout.repo_dir)
    return {"served_engine": info, "weight_format": info.get("weight_format")} if info else {}


def fetch_engine_timeline(config: DeploymentConfig, layout: ArtifactLayout, run_dir: Path, started: float) -> None:
    """The embedded engine's steps during the run, into the run folder (engine_timeline.jsonl and a
    Chrome/Perfetto trace); only for the CPU target's own server, which writes them beside its model."""
    if target_of(config).on_gpu or config.sweep.url:
        return
    from toolkit.engine.runtime.layout import timeline_file
    from toolkit.engine.runtime.timeline import copy_window

    copy_window(timeline_file(layout.repo_dir), run_dir, started, time.time())


def format_effect(config: DeploymentConfig, layout: ArtifactLayout, run_dir: Path | None = None):
    """What the served weight format buys, on the CPU engine alone against the same model unquantized
    (toolkit/engine/format_effect.py); with `run_dir`, kept in that run folder (format_effect.json) for its report
    and held against the plan the run wrote, else against a plan made here. None where there is nothing to compare:
    a GPU target, an unquantized model, a server elsewhere."""
    if target_of(config).on_gpu or config.sweep.url or config.quantize.qformat == "none":
        return None
    from toolkit.engine.format_effect import (measure_format_effect, planner_ratios, refuse_what_memory_cannot_hold,
                                              write_format_effect)
    from toolkit.engine.runtime.layout import ENGINE_CONFIG_FILE

    if not (layout.engine_dir / ENGINE_CONFIG_FILE).is_file():
        raise ToolkitError(f"no CPU engine built at {layout.engine_dir}", "run `toolkit build` for this config first")
    spec = model_spec_for(config, layout)
    refuse_what_memory_cannot_hold(spec.total_params)
    qformat = config.quantize.qformat
    # one sequence, and the most the sweep puts in flight (as far as the engine batches them; 16 at most: seconds)
    loaded = max(config.sweep.concurrencies) if config.sweep.mode == "concurrency" else config.engine.max_batch_size
    batches = tuple(sorted({1, min(loaded, config.engine.max_batch_size, 16)}))
    effect = measure_format_effect(layout.engine_dir, ensure_model(config, layout), qformat, batches=batches,
                                   planner=planner_ratios(_plan_of(config, spec, run_dir), qformat),
                                   threads=config.engine.cpu_threads, numa=config.engine.cpu_numa)
    if run_dir is not None:
        write_format_effect(effect, run_dir)
    return effect


def _plan_of(config: DeploymentConfig, spec, run_dir: Path | None) -> dict | None:
    """The plan a run wrote beside its measurements, else this config's plan now (None where none can be made)."""
    from toolkit.bench.rundir import RunDir

    if run_dir is not None:
        return RunDir.open(run_dir).plan()
    from toolkit.plan.stage import plan_for_config

    try:
        return plan_for_config(config, spec)
    except ToolkitError:
        return None


def report(run_dir: Path, *more_runs: Path, out: Path | None = None) -> Path:
    """report.md and report.html beside the (first) run; several runs are compared on one page."""
    from toolkit.report.html import write_html_report
    from toolkit.report.markdown import write_markdown_report
    from toolkit.bench.rundir import RunDir

    runs = [RunDir.open(p) for p in (run_dir, *more_runs)]
    if out is not None:
        out = Path(out)
        out = out / "report.md" if out.is_dir() or not out.suffix else out
        out.parent.mkdir(parents=True, exist_ok=True)
    markdown = write_markdown_report(runs, out)
    write_html_report(runs, markdown.with_suffix(".html"))
    return markdown


def doctor(run_dir: Path):
    """The troubleshooting checklist over one run; returns (findings, doctor.md path)."""
    from toolkit.report.doctor import diagnose, write_doctor
    from toolkit.bench.rundir import RunDir

    run = RunDir.open(run_dir)
    findings = diagnose(run)
    return findings, write_doctor(run, findings)


def deployment_for_plan(config: DeploymentConfig, **overrides):
    """The planner's view of a deployment config on its plan.gpu (flags given as overrides win)."""
    from toolkit.plan.stage import deployment_for_config

    return deployment_for_config(config, None, config.plan.gpu, **overrides)


def model_spec_for(config: DeploymentConfig, layout: ArtifactLayout, name_or_dir: str | None = None):
    from toolkit.model.presets import KNOWN_MODELS, known_model_spec
    from toolkit.model.spec import load_model_spec

    if name_or_dir:
        return known_model_spec(name_or_dir) if name_or_dir.lower() in KNOWN_MODELS or not Path(name_or_dir).exists() \
            else load_model_spec(name_or_dir)
    if not (layout.model_dir / "config.json").is_file():
        if config.model.name and config.model.name.lower() in KNOWN_MODELS:  # plan before the checkpoint is here
            return known_model_spec(config.model.name)
        if config.model.preset:
            raise ToolkitError(f"{layout.model_dir} does not exist yet", "run `toolkit init-model` first, or pass --model")
    return load_model_spec(layout.model_dir)


def plan(config: DeploymentConfig, layout: ArtifactLayout, model: str | None = None, gpu: str | None = None,
         out_dir: Path | None = None, **flags) -> tuple[dict, dict]:
    from toolkit.plan.stage import plan_and_write

    spec = model_spec_for(config, layout, model)
    return plan_and_write(config, spec, gpu or config.plan.gpu, out_dir, layout.build_dir, **flags)
