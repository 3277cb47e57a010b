"""`toolkit`: a thin Click layer — each command parses flags, loads the config, calls one function."""

from __future__ import annotations

import json
import signal
import threading
import sys
from pathlib import Path

import click

from toolkit.config import ArtifactLayout, load_config, parse_set_options
from toolkit.errors import ToolkitError
from toolkit.quantize.formats import KV_CACHE_DTYPES, KV_ELEMENT_DTYPES, QFORMAT_NAMES, WEIGHT_FORMATS
from toolkit.targets import TARGETS

# What `make demo` builds, so that `toolkit serve --detach`, `toolkit sweep` ... after the demo find its artifacts.
DEFAULT_CONFIG = "configs/cpu-small.yaml"


def _load(config_path: str, sets: tuple[str, ...], **flags):
    overrides = parse_set_options(sets)
    flags = {k: v for k, v in flags.items() if v is not None and v != ()}
    overrides.update(flags)
    try:
        config = load_config(config_path, overrides)
    except ToolkitError as exc:
        key = getattr(exc, "key", None)
        if key in flags and key in FLAG_FOR_KEY:  # the flag's value is wrong, not the config file
            value = flags[key]
            shown = " ".join(str(v) for v in value) if isinstance(value, (list, tuple)) else value
            raise ToolkitError(f"{FLAG_FOR_KEY[key]} {shown}: {exc.reason}", f"change {FLAG_FOR_KEY[key]}") from None
        raise
    return config, ArtifactLayout(config)


def config_options(func):
    func = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                        help="Override any config key, e.g. --set sweep.output_tokens=64 (repeatable).")(func)
    return click.option("--config", "-c", "config_path", default=DEFAULT_CONFIG, show_default=True,
                        help="Deployment config (configs/*.yaml).")(func)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llm-deploy-toolkit")
@click.option("--verbose", "-v", is_flag=True, help="Also show what libraries print (warnings, notices, progress bars).")
def cli(verbose):
    """Quantize → build → Triton repository → serve → sweep → report, on TensorRT-LLM + Triton
    (or the embedded CPU default)."""
    from toolkit.console import set_verbose

    set_verbose(verbose)


@cli.command("init-model")
@config_options
@click.option("--force", is_flag=True, help="Recreate even if it exists.")
def init_model_cmd(config_path, sets, force):
    """Create the offline preset model (random weights, tokenizer trained on shipped text)."""
    from toolkit import pipeline

    config, layout = _load(config_path, sets)
    out = pipeline.init_model(config, layout, force=force)
    click.echo(f"model: {out}")


@cli.command("quantize")
@config_options
@click.option("--qformat", type=click.Choice(QFORMAT_NAMES), default=None)
@click.option("--kv-cache-dtype", type=click.Choice(KV_CACHE_DTYPES), default=None)
@click.option("--export", "export_format", type=click.Choice(["hf", "trtllm"]), default=None,
              help="hf: unified HF checkpoint; trtllm: TensorRT-LLM checkpoint with mapping (rank*.safetensors).")
@click.option("--tp", type=int, default=None, help="Tensor parallel size (trtllm export).")
@click.option("--pp", type=int, default=None, help="Pipeline parallel size (trtllm export).")
def quantize_cmd(config_path, sets, qformat, kv_cache_dtype, export_format, tp, pp):
    """Quantize with ModelOpt on shipped calibration text; quality-gate; export a checkpoint."""
    from toolkit import pipeline

    config, layout = _load(config_path, sets, **{"quantize.qformat": qformat, "quantize.kv_cache_dtype": kv_cache_dtype,
                                                 "quantize.export": export_format, "parallel.tp": tp, "parallel.pp": pp})
    result = pipeline.quantize(config, layout)
    quality = result.quality
    gate = (f" | quality: mean KL {quality.mean_kl:.5f}, perplexity ×{quality.perplexity_ratio:.4f}" if quality else "")
    click.echo(f"checkpoint: {result.checkpoint_dir} ({result.seconds:.1f}s){gate}")


@cli.command("build")
@config_options
@click.option("--target", type=click.Choice(list(TARGETS)), default=None)
@click.option("--dry-run", is_flag=True, help="Print what would run (trtllm: the trtllm-build command; llmapi: the "
                                            "LLM-API options) without building; no checkpoint needed yet.")
def build_cmd(config_path, sets, target, dry_run):
    """Build the engine: cpu (checkpoint + engine config), trtllm (trtllm-build), llmapi (LLM API config)."""
    from toolkit import pipeline

    config, layout = _load(config_path, sets, **{"engine.target": target})
    outputs = pipeline.build(config, layout, dry_run=dry_run)
    if "command" in outputs:
        click.echo(outputs["command"])
    if "note" in outputs:
        click.echo(f"note: {outputs['note']}", err=True)
    if not dry_run:
        click.echo(f"engine: {layout.engine_dir}")


@cli.group("repo", invoke_without_command=True)
@config_options
@click.pass_context
def repo_cmd(ctx, config_path, sets):
    """Write the Triton model repository for the built engine (then check it)."""
    if ctx.invoked_subcommand is not None:
        return
    from toolkit import pipeline

    config, layout = _load(config_path, sets)
    repo_dir, findings = pipeline.repo(config, layout)
    for finding in findings:
        click.echo(str(finding), err=True)
    click.echo(f"repository: {repo_dir}")


@repo_cmd.command("check")
@click.argument("repo_dir", type=click.Path(path_type=Path))
@click.option("--engine", "engine_dir", type=click.Path(path_type=Path), default=None,
              help="Engine directory to hold the repository against (default: the one it names).")
@click.option("--world-size", type=int, default=None, help="MPI ranks the server will launch (TP × PP).")
def repo_check_cmd(repo_dir, engine_dir, world_size):
    """Validate a Triton repository before the server does."""
    from toolkit.repo.checks import check_repository

    findings = check_repository(repo_dir, engine_dir, world_size)
    for finding in findings:
        click.echo(str(finding))
    errors = sum(f.severity == "error" for f in findings)
    click.echo(f"{errors} error(s), {len(findings) - errors} warning(s) in {repo_dir}")
    if errors:
        sys.exit(1)


@cli.command("serve")
@config_options
@click.option("--detach", is_flag=True, help="Return once ready and leave the server running (stop: `toolkit stop`).")
@click.option("--openai", is_flag=True, default=None, help="Also serve an OpenAI-compatible API (/v1/completions, /v1/chat/completions).")
def serve_cmd(config_path, sets, detach, openai):
    """Start Triton on 127.0.0.1 against the repository; Ctrl-C (or `toolkit stop`) stops it."""
    from toolkit import pipeline

    config, layout = _load(config_path, sets, **{"server.openai": openai or None})
    handle = pipeline.serve(config, layout)
    if detach:
        _echo_endpoints(handle)
        return
    stop_requested = threading.Event()
    try:
        # Python-level handlers (they replace an inherited SIG_IGN): whichever thread the kernel hands the
        # signal to, the handler runs in this one and only sets the event. Blocking the signals for
        # sigwait did not cover threads started earlier, and under SIG_DFL a Ctrl-C delivered to one of
        # them killed us before the server was stopped.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop_requested.set())
        _echo_endpoints(handle)
        click.echo("Ctrl-C to stop")
        while not stop_requested.wait(0.5):
            pass
    except KeyboardInterrupt:  # arrived before the handlers were installed
        pass
    finally:
        pipeline.stop(layout)
        click.echo("stopped")


def _echo_endpoints(handle) -> None:
    click.echo(f"ready (pid {handle.pid})\n  HTTP:    {handle.http_url}\n  gRPC:    {handle.grpc_url}\n"
               f"  metrics: {handle.metrics_url}\n  log:     {handle.log_file}")
    if handle.openai_url:
        click.echo(f"  OpenAI:  {handle.openai_url}/v1")


@cli.command("stop")
@config_options
def stop_cmd(config_path, sets):
    """Stop the server started by `toolkit serve` for this config."""
    from toolkit import pipeline

    _, layout = _load(config_path, sets)
    handle = pipeline.stop(layout)
    click.echo(handle.stop_summary)


def parse_slo(text: str | None) -> dict:
    """`ttft=500ms,itl=50ms,latency=2s` → sweep.slo_* keys (milliseconds)."""
    if not text:
        return {}
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key, value = key.strip().lower(), value.strip().lower()
        if key not in ("ttft", "itl", "latency") or not value:
            raise ToolkitError(f"--slo part {part!r} is not ttft|itl|latency=<time>", "write e.g. --slo ttft=500ms,itl=50ms")
        scale = 1000.0 if value.endswith("s") and not value.endswith("ms") else 1.0
        try:
            out[f"sweep.slo_{key}_ms"] = float(value.removesuffix("ms").removesuffix("s")) * scale
        except ValueError:
            raise ToolkitError(f"--slo {part!r}: {value!r} is not a time", "write e.g. ttft=500ms or latency=2s") from None
    return out


# genai-perf / AIPerf goodput names (values in ms) → our SLO keys.
GOODPUT_METRICS = {"time_to_first_token": "ttft", "inter_token_latency": "itl", "request_latency": "latency"}


def parse_goodput(text: str | None) -> dict:
    """genai-perf / AIPerf `--goodput "time_to_first_token:100 inter_token_latency:3.4"` (ms) → sweep.slo_* keys."""
    if not text:
        return {}
    out = {}
    for part in text.split():
        name, _, value = part.partition(":")
        if name not in GOODPUT_METRICS:
            raise ToolkitError(f"--goodput names {name!r}", f"use {', '.join(GOODPUT_METRICS)} with a value in ms, "
                                                             'e.g. --goodput "time_to_first_token:100"')
        try:
            out[f"sweep.slo_{GOODPUT_METRICS[name]}_ms"] = float(value)
        except ValueError:
            raise ToolkitError(f"--goodput {part!r}: {value!r} is not a number of ms",
                               'write e.g. --goodput "inter_token_latency:3.4"') from None
    return out


# genai-perf / AIPerf --endpoint-type → our endpoint (kserve: Triton's gRPC protocol, as genai-perf uses it).
ENDPOINT_TYPES = {"chat": "openai-chat", "completions": "openai-completions", "kserve": "triton-grpc"}

# The sweep's flags, one row each: config key (None: handled in the command), the flag's spellings (ours first,
# then genai-perf / AIPerf's), and click's settings. Errors in a value given by flag name the flag (FLAG_FOR_KEY).
# AIPerf's --custom-dataset-type → sweep.workload.kind (ShareGPT files are read as datasets too).
DATASET_TYPES = {"single_turn": "dataset", "sharegpt": "dataset", "mooncake_trace": "trace"}

SWEEP_FLAGS = (
    ("sweep.concurrencies", ("--concurrency", "concurrencies"), dict(type=int, multiple=True,
                                                                     help="Requests in flight, repeatable; concurrency mode.")),
    ("sweep.request_rates", ("--rate", "--request-rate", "rates"), dict(
        type=float, multiple=True, help="Requests/s, repeatable; switches to rate mode.")),
    ("sweep.arrival", ("--arrival",), dict(type=click.Choice(["constant", "poisson"]), default=None)),
    ("sweep.max_concurrency", ("--max-concurrency",), dict(type=int, help="Cap on requests in flight (rate mode).")),
    ("sweep.endpoint", ("--endpoint",), dict(type=click.Choice(["triton-grpc", "triton-http", "openai-completions",
                                                                "openai-chat"]))),
    (None, ("--endpoint-type", "endpoint_type"), dict(type=click.Choice(list(ENDPOINT_TYPES)),
                                                     help="genai-perf / AIPerf name: chat, completions "
                                                          "(OpenAI) or kserve (Triton gRPC).")),
    ("sweep.url", ("--url", "-u"), dict(help="Any server (e.g. an OpenAI-compatible one) instead of `toolkit serve`'s.")),
    ("sweep.model", ("--model", "-m"), dict(help="Model name to request (Triton model or OpenAI model id).")),
    ("sweep.requests_per_step", ("--requests", "--request-count", "requests"), dict(type=int, help="Requests per step.")),
    ("sweep.duration_s", ("--duration", "--benchmark-duration", "duration"), dict(
        type=float, help="Seconds per step; given without --requests, the step is bounded by time alone.")),
    ("sweep.step_warmup_requests", ("--step-warmup",), dict(
        type=int, help="Requests opening each step under its own load, left out of its metrics.")),
    ("sweep.warmup_requests", ("--warmup-request-count", "warmup_requests"), dict(
        type=int, help="Warm-up requests once before the first step.")),
    ("sweep.input_tokens_mean", ("--input-tokens", "--synthetic-input-tokens-mean", "input_tokens"), dict(type=int)),
    ("sweep.input_tokens_stddev", ("--synthetic-input-tokens-stddev", "input_tokens_stddev"), dict(type=float)),
    ("sweep.output_tokens", ("--output-tokens", "--output-tokens-mean", "output_tokens"), dict(type=int)),
    ("sweep.output_tokens_stddev", ("--output-tokens-stddev", "output_tokens_stddev"), dict(type=float)),
    ("sweep.seed", ("--random-seed", "--seed", "seed"), dict(type=int, help="Seed for prompts, lengths and arrivals.")),
    (None, ("--slo",), dict(help="Goodput objectives, e.g. ttft=500ms,itl=50ms,latency=5s.")),
    (None, ("--goodput",), dict(help='genai-perf / AIPerf form, in ms: "time_to_first_token:100 inter_token_latency:3.4".')),
    ("paths.runs_dir", ("--artifact-dir", "artifact_dir"), dict(help="Folder the run folder is written into "
                                                                     "(default: paths.runs_dir, perf/runs).")),
    (None, ("--streaming",), dict(is_flag=True, help="Accepted for genai-perf / AIPerf command lines: the sweep "
                                                     "always streams (TTFT and ITL need it).")),
    (None, ("--tokenizer",), dict(help="Tokenizer directory (default: the engine's).")),
    ("sweep.workload.kind", ("--workload",), dict(type=click.Choice(
        ["synthetic", "dataset", "trace", "shared_prefix", "multi_turn", "mixed"]), help="What the requests ask for "
        "(README: Workloads and scenarios); settings under sweep.workload.* via --set.")),
    ("sweep.workload.path", ("--input-file", "input_file"), dict(
        help="A dataset (ShareGPT JSON, JSONL of {\"text\", \"output_length\"}) or, with --custom-dataset-type "
             "mooncake_trace, a trace; genai-perf / AIPerf --input-file.")),
    (None, ("--custom-dataset-type", "custom_dataset_type"), dict(type=click.Choice(list(DATASET_TYPES)),
                                                                  help="AIPerf's name for the --input-file format.")),
)

FLAG_FOR_KEY = {key: decls[0] for key, decls, _ in SWEEP_FLAGS if key} | {
    "quantize.qformat": "--qformat", "quantize.kv_cache_dtype": "--kv-cache-dtype", "quantize.export": "--export",
    "parallel.tp": "--tp", "parallel.pp": "--pp", "engine.target": "--target", "server.openai": "--openai"}


def _param_name(decls: tuple[str, ...]) -> str:
    named = [d for d in decls if not d.startswith("-")]
    return named[0] if named else next(d for d in decls if d.startswith("--"))[2:].replace("-", "_")


def sweep_overrides(flags: dict) -> dict:
    """Config overrides from the sweep's flags (by parameter name), genai-perf / AIPerf spellings included."""
    overrides = {key: flags[_param_name(decls)] for key, decls, _ in SWEEP_FLAGS if key}
    for key in ("sweep.concurrencies", "sweep.request_rates"):
        overrides[key] = list(overrides[key]) or None
    if flags["rates"]:
        overrides["sweep.mode"] = "rate"
    if flags["endpoint_type"]:
        chosen = ENDPOINT_TYPES[flags["endpoint_type"]]
        if flags["endpoint"] and flags["endpoint"] != chosen:
            raise ToolkitError(f"--endpoint {flags['endpoint']} and --endpoint-type {flags['endpoint_type']} disagree",
                               "give one of them")
        overrides["sweep.endpoint"] = chosen
    if flags["custom_dataset_type"] or (flags["input_file"] and not flags["workload"]):
        overrides["sweep.workload.kind"] = DATASET_TYPES[flags["custom_dataset_type"] or "single_turn"]
    if flags["duration"] is not None and flags["requests"] is None:
        overrides["sweep.requests_per_step"] = "null"  # a duration alone bounds the step, not the config's count
    return overrides | parse_slo(flags["slo"]) | parse_goodput(flags["goodput"])


def sweep_options(func):
    for _key, decls, settings in reversed(SWEEP_FLAGS):
        func = click.option(*decls, **({"default": None} | settings))(func)
    return func


@cli.command("sweep")
@config_options
@sweep_options
def sweep_cmd(config_path, sets, **flags):
    """Streaming load over the running server; writes perf/runs/<time>-<name>/."""
    from toolkit import pipeline

    config, layout = _load(config_path, sets, **sweep_overrides(flags))
    run_dir = pipeline.sweep(config, layout, tokenizer_dir=flags["tokenizer"])
    click.echo(f"run: {run_dir}")
    pipeline.report(run_dir)
    click.echo(f"report: {run_dir / 'report.md'}")


@cli.command("report")
@click.argument("run_dirs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("perf/runs"), show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Markdown path (HTML beside it).")
def report_cmd(run_dirs, runs_dir, out):
    """report.md + report.html for one run (default: the latest), or several runs compared on one page."""
    from toolkit import pipeline
    from toolkit.bench.rundir import latest_run

    runs = list(run_dirs) or [latest_run(runs_dir)]
    path = pipeline.report(*runs, out=out)
    click.echo(f"report: {path}\nhtml:   {path.with_suffix('.html')}")


@cli.command("doctor")
@click.argument("run_dir", type=click.Path(path_type=Path), required=False)
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("perf/runs"), show_default=True)
def doctor_cmd(run_dir, runs_dir):
    """The troubleshooting checklist over a run's records and server metrics (default: the latest run)."""
    from toolkit import pipeline
    from toolkit.bench.rundir import latest_run

    _, path = pipeline.doctor(run_dir or latest_run(runs_dir))
    click.echo(path.read_text())
    click.echo(f"doctor: {path}")


@cli.command("ab")
@config_options
@click.option("--variant", "variants", multiple=True, required=True, metavar="LABEL:KEY=VALUE[,KEY=VALUE]",
              help="A variant of the config (repeatable; the first is the baseline), "
                   "e.g. fp8:quantize.qformat=fp8 int4:quantize.qformat=int4_awq")
@click.option("--repeat", type=int, default=3, show_default=True, help="Interleaved repetitions per variant.")
@click.option("--out", "out_root", type=click.Path(path_type=Path), default=Path("perf/ab"), show_default=True)
def ab_cmd(config_path, sets, variants, repeat, out_root):
    """A/B: variants with everything else fixed, repetitions interleaved; better / worse / noise per metric."""
    from toolkit.ab.run import parse_variant, run_ab

    if repeat < 1:
        raise ToolkitError(f"--repeat must be at least 1 (got {repeat})", "use --repeat 3 or more")
    config, _ = _load(config_path, sets)
    out_dir = run_ab(config, [parse_variant(v) for v in variants], repeat, out_root, progress=click.echo)
    click.echo((out_dir / "ab.md").read_text())
    click.echo(f"ab: {out_dir}")


@cli.command("scenario")
@click.argument("name", required=False)
@config_options
@click.option("--repeat", type=int, default=2, show_default=True, help="Interleaved repetitions per variant.")
@click.option("--out", "out_root", type=click.Path(path_type=Path), default=Path("perf/scenarios"), show_default=True)
@click.option("--list", "list_them", is_flag=True, help="List the scenarios and exit.")
def scenario_cmd(name, config_path, sets, repeat, out_root, list_them):
    """A production failure on this deployment, baseline vs fix by A/B: sluggish-start, chatty-slowdown,
    stuttering-stream, oom, shared-prefix, speculative."""
    from toolkit.scenarios.catalog import SCENARIOS
    from toolkit.scenarios.run import run_scenario

    if list_them or not name:
        for sc in SCENARIOS.values():
            click.echo(f"{sc.name:<18} {sc.failure}; fix: {sc.fix_label}")
        if not list_them:
            raise ToolkitError("name a scenario", "e.g. toolkit scenario stuttering-stream -c configs/cpu-tiny.yaml")
        return
    if repeat < 1:
        raise ToolkitError(f"--repeat must be at least 1 (got {repeat})", "use --repeat 2 or more")
    config, _ = _load(config_path, sets)
    out_dir = run_scenario(name, config, repeat, out_root, progress=click.echo)
    click.echo((out_dir / "scenario.md").read_text())
    click.echo(f"scenario: {out_dir}")


@cli.command("format-effect")
@config_options
@click.option("--run", "run_dir", type=click.Path(path_type=Path), default=None,
              help="A sweep run of this config to keep it in (format_effect.json; its report shows it).")
def format_effect_cmd(config_path, sets, run_dir):
    """What the weight format buys on the CPU engine alone: the built engine against the same model unquantized,
    decode steps alternating at 1 sequence and at the sweep's most in flight (seconds), beside the weight bytes'
    ratio and the planner's."""
    from toolkit import pipeline
    from toolkit.engine.format_effect import format_effect_sentence

    config, layout = _load(config_path, sets)
    effect = pipeline.format_effect(config, layout, run_dir)
    if effect is None:
        raise ToolkitError(f"nothing to compare for {config.name}: quantize.qformat is {config.quantize.qformat}, "
                           f"target {config.engine.target}" + (", a server elsewhere" if config.sweep.url else ""),
                           "the format effect is measured on the CPU engine of a quantized model (`toolkit ab` "
                           "compares formats through the server anywhere)")
    click.echo(format_effect_sentence(effect))
    if run_dir is not None:
        click.echo(f"kept in {Path(run_dir) / 'format_effect.json'}; `toolkit report {run_dir}` shows it")


@cli.command("plan")
@config_options
@click.option("--model", "-m", default=None, help="Known model name (e.g. llama-2-70b) or a checkpoint directory.")
@click.option("--gpu", "-g", default=None,
              help="GPU from the catalog, or cpu (default: plan.gpu of the config). A GPU plan from a CPU config "
                   "starts from GPU defaults: bf16 weights and KV, the model's context length, the smallest TP that fits.")
@click.option("--tp", type=int, default=None, help="Tensor parallel size (GPU default: the smallest that fits).")
@click.option("--pp", type=int, default=None)
@click.option("--weights", type=click.Choice(WEIGHT_FORMATS), default=None,
              help="An unquantized dtype or a qformat (default: bf16 on a GPU, the config's qformat otherwise).")
@click.option("--kv-dtype", type=click.Choice(KV_ELEMENT_DTYPES), default=None)
@click.option("--kv-fraction", "kv_free_mem_fraction", type=float, default=None,
              help="Share of free memory given to the KV cache (kv_cache_free_gpu_mem_fraction).")
@click.option("--max-seq-len", type=int, default=None, help="Default on a GPU: the model's own context length.")
@click.option("--max-num-tokens", type=int, default=None, help="Tokens per engine step (sizes activations).")
@click.option("--batch", type=int, default=None)
@click.option("--isl", type=int, default=None, help="Input tokens per request.")
@click.option("--osl", type=int, default=None, help="Output tokens per request.")
@click.option("--efficiency", "prefill_efficiency", type=float, default=None, help="Fraction of peak prefill reaches.")
@click.option("--overhead-gb", "runtime_overhead_gb", type=float, default=None,
              help="Per-GPU memory for CUDA context and workspaces (default: plan.runtime_overhead_gb).")
@click.option("--step-overhead-ms", type=float, default=None,
              help="CPU: cost per decode step beyond its GEMMs (default: plan.cpu_step_overhead_ms, else 0.1 ms + 0.002 ms per layer as measured; perf/engine_bench.py measures it).")
@click.option("--reprobe", is_flag=True, help="CPU: measure this machine again instead of reading the cached probe.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Where plan.json and roofline.png go (default: build/plans/<model>-<gpu>/).")
@click.option("--list-gpus", is_flag=True, help="List the GPU catalog and exit.")
@click.option("--split-rate", type=float, default=None,
              help="Disaggregated serving: size prefill and decode replicas for this many requests/s (with --slo).")
@click.option("--slo", default=None, help="With --split-rate: the objectives, e.g. ttft=500ms,itl=30ms.")
def plan_cmd(config_path, sets, model, gpu, out_dir, list_gpus, split_rate, slo, **overrides):
    """Memory and roofline plan: will it fit, on how many GPUs, and what TTFT / ITL the hardware allows."""
    from toolkit import pipeline
    from toolkit.plan.gpus import GPUS
    from toolkit.plan.stage import render_table

    if list_gpus:
        for spec in GPUS.values():
            peaks = "  ".join(f"{k} {v:g}" for k, v in spec.peak_tflops.items())
            click.echo(f"{spec.name:<10} {spec.memory_gb:>5g} GB  {spec.bandwidth_tbs:>5g} TB/s  {peaks} TFLOP/s"
                       f"  link {spec.interconnect_gbs:g} GB/s  weights {','.join(spec.weight_formats())}  [{spec.source}]")
        return
    config, layout = _load(config_path, sets)
    result, paths = pipeline.plan(config, layout, model=model, gpu=gpu, out_dir=out_dir, checkpoint_dir=model,
                                  **overrides)
    click.echo(render_table(result))
    if split_rate is not None:
        from toolkit.plan.disagg import render_split, split

        slos = parse_slo(slo)
        if not {"sweep.slo_ttft_ms", "sweep.slo_itl_ms"} <= set(slos):
            raise ToolkitError("--split-rate needs both objectives", "pass --slo ttft=500ms,itl=30ms")
        ttft, itl = slos["sweep.slo_ttft_ms"] / 1000, slos["sweep.slo_itl_ms"] / 1000
        click.echo("\n" + render_split(split(result, split_rate, ttft, itl), split_rate, ttft, itl))
    click.echo(f"\nplan: {paths['plan']}\nroofline: {paths['roofline']}")


@cli.group("deploy")
def deploy_cmd():
    """Cluster output: Kubernetes manifests (k8s), and a local autoscaling testbed (testbed)."""


@deploy_cmd.command("k8s")
@config_options
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Folder to write (default: build/deploy/<name>/k8s); replaced whole, never left partial.")
@click.option("--autoscaler", type=click.Choice(["hpa", "keda"]), default="hpa", show_default=True,
              help="hpa: autoscaling/v2 HPA through prometheus-adapter; keda: a KEDA ScaledObject.")
@click.option("--disaggregated", is_flag=True, help="Also emit a Dynamo graph with the planned prefill/decode split.")
@click.option("--rate", type=float, default=None, help="Target load for --disaggregated (requests/s).")
@click.option("--slo", default=None, help="Objectives for --disaggregated, e.g. ttft=500ms,itl=30ms.")
def deploy_k8s_cmd(config_path, sets, out_dir, autoscaler, disaggregated, rate, slo):
    """A kustomize folder (one YAML per object) for this deployment, checked before it is written."""
    from toolkit.deploy.stage import deploy_k8s

    config, layout = _load(config_path, sets, **parse_slo(slo))
    out_dir = out_dir or layout.build_dir / "deploy" / config.name / "k8s"
    files, split = deploy_k8s(config, out_dir, autoscaler, disaggregated, rate,
                              config.sweep.slo_ttft_ms, config.sweep.slo_itl_ms)
    if split:
        click.echo(f"split: {split.prefill_replicas} prefill + {split.decode_replicas} decode replicas "
                   f"(decode batch {split.decode_batch}, expected TTFT {split.expected_ttft_s * 1000:.0f} ms)")
    click.echo(f"wrote {len(files)} files to {out_dir} (apply: kubectl apply -k {out_dir})")


@deploy_cmd.command("testbed")
@config_options
@click.option("--rates", default="1,6,1", show_default=True, help="The ramp: requests/s per step, low → high → low.")
@click.option("--step-duration", type=float, default=60, show_default=True, help="Seconds per rate step.")
@click.option("--sync", "sync_s", type=float, default=5, show_default=True, help="Controller period (the HPA's is 15 s).")
@click.option("--out", "out_root", type=click.Path(path_type=Path), default=Path("perf/testbed"), show_default=True)
def deploy_testbed_cmd(config_path, sets, rates, step_duration, sync_s, out_root):
    """Replicas of the CPU deployment behind haproxy, Prometheus on the emitted rules, and the HPA's
    algorithm scaling them, under a rate ramp; writes a timeline, plot and summary."""
    from toolkit.deploy.testbed.run import run_testbed

    try:
        ramp = [float(r) for r in rates.split(",")]
    except ValueError:
        raise ToolkitError(f"--rates {rates!r} is not a list of numbers", "write e.g. --rates 1,6,1") from None
    config, _ = _load(config_path, sets)
    out = run_testbed(config, ramp, step_duration, out_root, sync_s, progress=click.echo)
    summary = (out / "summary.json").read_text()
    click.echo(summary)
    click.echo(f"testbed: {out} (timeline.png, timeline.jsonl, summary.json)")


@cli.command("demo")
@config_options
def demo_cmd(config_path, sets):
    """init-model → quantize → build → repo → serve → sweep → report, then stop the server."""
    from toolkit import pipeline
    from toolkit.engine.format_effect import format_effect_sentence

    config, layout = _load(config_path, sets)
    echo = click.echo
    echo(f"[1/7] model        {pipeline.ensure_model(config, layout)}")
    result = pipeline.quantize(config, layout)
    quality = f" (mean KL {result.quality.mean_kl:.5f})" if result.quality else ""
    echo(f"[2/7] quantize     {result.checkpoint_dir} [{config.quantize.qformat}]{quality}")
    pipeline.build(config, layout)
    echo(f"[3/7] build        {layout.engine_dir} [{config.engine.target}]")
    repo_dir, _ = pipeline.repo(config, layout)
    echo(f"[4/7] repo         {repo_dir}")
    handle = pipeline.serve(config, layout)
    echo(f"[5/7] serve        gRPC {handle.grpc_url}, HTTP {handle.http_url}, metrics {handle.metrics_url}")
    try:
        run_dir = pipeline.sweep(config, layout, progress=lambda line: echo(f"[6/7] {line}"))
    finally:
        pipeline.stop(layout)
        echo("      server       stopped")
    effect = _format_effect(config, layout, run_dir)
    report = pipeline.report(run_dir)
    findings, doctor = pipeline.doctor(run_dir)
    for finding in findings:
        echo(f"      doctor: {finding.summary} — {finding.evidence}")
    echo(f"[7/7] report       {report} (HTML: {report.with_suffix('.html')}; checklist: {doctor})")
    summary = json.loads((run_dir / "summary.json").read_text())
    prog = _how_to_call()
    again = "" if config_path == DEFAULT_CONFIG else f" -c {config_path}"
    closing = measured_sentence(summary) + (f"\n{format_effect_sentence(effect)}" if effect else "")
    echo(f"\n{closing}\nThe server is stopped. Next: `{prog} serve{again} --detach` starts it "
         f"again, `{prog} sweep{again} --concurrency 1 --concurrency 16 --step-warmup 16` measures more, "
         f"`{prog} stop{again}` stops it; open {report.with_suffix('.html')} in a browser.")


def _format_effect(config, layout, run_dir):
    """The demo's format effect (pipeline.format_effect), said as it is measured; a failure costs only this line."""
    from toolkit import pipeline

    try:
        effect = pipeline.format_effect(config, layout, run_dir)
    except (ToolkitError, OSError, RuntimeError, ValueError) as exc:
        click.echo(f"      format       not measured against the unquantized model: {exc}")
        return None
    if effect is not None:
        steps = ", ".join(f"{effect.step_ms[b]:.2f} / {effect.reference_step_ms[b]:.2f} ms at {b} (x{effect.ratio(b):.2f})"
                          for b in sorted(effect.step_ms))
        click.echo(f"      format       {effect.qformat} / unquantized bf16, a decode step at 1 and more sequences: {steps}")
    return effect


def _how_to_call() -> str:
    """How the user can type this command: `toolkit` where it is on PATH, else the path they ran."""
    import shutil

    ran = Path(sys.argv[0])
    on_path = shutil.which("toolkit")
    if on_path and ran.name == "toolkit" and Path(on_path).resolve() == ran.resolve():
        return "toolkit"
    return str(ran) if ran.name == "toolkit" else ".venv/bin/toolkit"


def measured_sentence(summary: dict) -> str:
    """One sentence on what a sweep measured, from its summary.json (pure)."""
    info, steps = summary.get("run", {}), [s for s in summary.get("steps", []) if s.get("request_count")]
    if not steps:
        return "Nothing was measured: no request succeeded."
    first, last = steps[0], steps[-1]
    load = "concurrency" if first.get("mode", "concurrency") == "concurrency" else "request rate"
    level = (lambda s: f"{s.get('concurrency') or s.get('rate'):g}")  # noqa: E731

    def span(tag: str) -> str:
        values = [s["metrics"][tag]["p50"] for s in (first, last) if tag in s["metrics"]]
        return " → ".join(f"{v:.1f}" for v in values) or "-"

    weights = info.get("qformat", "?")
    served = info.get("served_engine") or {}  # what the CPU engine said it runs; older runs lack it
    isa = f" ({served['kernel_isa']})" if served.get("kernel_isa") else ""
    precision = (f"{weights} checkpoint on {served['weight_format']} kernels{isa}, {served['compute_dtype']} activations"
                 if served.get("weight_format") and served.get("compute_dtype") else f"{weights} weights")
    sweep = info.get("sweep") or {}
    warm = f" after {sweep['step_warmup_requests']} warm-up requests" if sweep.get("step_warmup_requests") else ""
    return (f"Measured {info.get('model', '?')} ({precision}) behind Triton with in-flight batching over "
            f"{info.get('endpoint', '?')}: from {load} {level(first)} to {level(last)}, TTFT p50 "
            f"{span('time_to_first_token')} ms, ITL p50 {span('inter_token_latency')} ms, output "
            f"{first['output_token_throughput']['avg']:.0f} → {last['output_token_throughput']['avg']:.0f} tokens/s "
            f"({last['request_count']} requests per step{warm}).")


def main() -> None:
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except ToolkitError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("interrupted: records measured so far are saved", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
