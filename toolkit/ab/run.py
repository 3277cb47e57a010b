"""`toolkit ab`: run variants with everything else fixed, N repetitions interleaved, and compare.

Every variant is the base config plus overrides. All variants are built, their servers started
side by side, and the repetitions interleaved in alternating order (A B, B A, ...) so that drift
of the machine hits every variant alike. Output: perf/ab/<time>-<name>/ab.json, ab.md, and a
report comparing every run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from toolkit.ab.stats import AB_METRICS, compare, metric_values
from toolkit.config import ArtifactLayout, DeploymentConfig, apply_overrides, validate_config
from toolkit.errors import ToolkitError
from toolkit.bench.rundir import RunDir


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """`int4:quantize.qformat=int4_awq,engine.enable_kv_cache_reuse=true` → (label, overrides)."""
    label, _, rest = text.partition(":")
    if not label or not label.replace("-", "").replace("_", "").isalnum():
        raise ToolkitError(f"variant {text!r} needs a label", "write LABEL:key=value[,key=value], e.g. fp8:quantize.qformat=fp8")
    overrides = {}
    for pair in filter(None, rest.split(",")):
        key, sep, value = pair.partition("=")
        if not sep:
            raise ToolkitError(f"variant {label}: {pair!r} is not key=value", "e.g. quantize.qformat=int4_awq")
        overrides[key.strip()] = value.strip()
    return label, overrides


def variant_config(base: DeploymentConfig, label: str, overrides: dict[str, str]) -> DeploymentConfig:
    raw = base.model_dump()
    raw["name"] = f"{base.name}-{label}"
    return validate_config(apply_overrides(raw, overrides), source=f"variant {label}")


def _step_values(runs: list[RunDir], step: str, metric: str) -> list[list[float]]:
    """Per repetition, the values of `metric` in `step` (repetitions without that step are skipped)."""
    out = []
    for run in runs:
        summary = next((s for s in run.steps if s["step"] == step), None)
        if summary:
            out.append(metric_values(run.measured_records_by_step().get(step, []), metric, summary))
    return out


def analyse(runs: dict[str, list[RunDir]], boot: int = 2000) -> list[dict]:
    labels = list(runs)
    baseline = labels[0]
    steps = [s["step"] for s in runs[baseline][0].steps]
    results = []
    for candidate in labels[1:]:
        for step in steps:
            for metric, (_, lower_is_better) in AB_METRICS.items():
                try:
                    result = compare(metric, step, baseline, candidate, _step_values(runs[baseline], step, metric),
                                     _step_values(runs[candidate], step, metric), lower_is_better, boot=boot)
                except ValueError:
                    continue
                results.append(result.to_dict())
    return results


def render_ab_markdown(results: list[dict], runs: dict[str, list[RunDir]]) -> str:
    """ab.md: the same verdict table (with units and which way is better) as the report's A/B section."""
    from toolkit.report.markdown import ab_table

    labels = list(runs)
    lines = [f"# A/B: {' vs '.join(labels)}", "",
             f"Baseline **{labels[0]}**; {len(runs[labels[0]])} interleaved repetitions per variant.", "",
             ab_table({"results": results})]
    lines += ["", "Runs:"] + [f"- {label}: " + ", ".join(f"`{run.path}`" for run in runs[label]) for label in labels]
    return "\n".join(lines) + "\n"


def run_ab(base: DeploymentConfig, variants: list[tuple[str, dict[str, str]]], repeat: int, out_root: Path,
           progress=print) -> Path:
    from toolkit import pipeline

    if len(variants) < 2:
        raise ToolkitError("A/B needs at least two variants", "pass --variant twice (the first is the baseline)")
    if len({label for label, _ in variants}) != len(variants):
        raise ToolkitError("variant labels must be unique", "rename one of the --variant labels")
    configs = [(label, variant_config(base, label, overrides)) for label, overrides in variants]
    layouts = {label: ArtifactLayout(cfg) for label, cfg in configs}
    for label, cfg in configs:
        progress(f"[ab] building {label}")
        pipeline.quantize(cfg, layouts[label])
        pipeline.build(cfg, layouts[label])
        pipeline.repo(cfg, layouts[label])
    runs: dict[str, list[RunDir]] = {label: [] for label, _ in configs}
    started = []
    try:
        for label, cfg in configs:
            pipeline.serve(cfg, layouts[label])
            started.append(label)
        for rep in range(repeat):
            order = configs if rep % 2 == 0 else list(reversed(configs))
            for label, cfg in order:
                progress(f"[ab] repetition {rep + 1}/{repeat}: {label}")
                run_dir = pipeline.sweep(cfg, layouts[label], progress=lambda _: None,
                                         label=label, extra_info={"repetition": rep})
                runs[label].append(RunDir.open(run_dir))
    finally:
        for label in started:
            pipeline.stop(layouts[label])
    out_dir = out_root / f"{time.strftime('%Y%m%d-%H%M%S')}-{base.name}"
    out_dir.mkdir(parents=True, exist_ok=True)
    results = analyse(runs)
    (out_dir / "ab.json").write_text(json.dumps({"variants": dict(variants), "repeat": repeat, "results": results,
                                                 "runs": {k: [str(r.path) for r in v] for k, v in runs.items()}},
                                                indent=2) + "\n")
    (out_dir / "ab.md").write_text(render_ab_markdown(results, runs))
    pipeline.report(*[r.path for rs in runs.values() for r in rs], out=out_dir / "report.md")
    return out_dir
