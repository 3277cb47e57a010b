"""Run a scenario: its workload on the given deployment, baseline and fix through the A/B stage, then
scenario.md (the sentence, the A/B intervals, the server's evidence, the figure) and scenario.json.
Output: perf/scenarios/<time>-<scenario>/ (the A/B folder with every run inside it)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from toolkit.ab.run import run_ab
from toolkit.bench.rundir import RunDir
from toolkit.config import DeploymentConfig, apply_overrides, validate_config
from toolkit.report.doctor import diagnose
from toolkit.scenarios.analysis import evidence_lines, judge, sentence, server_evidence
from toolkit.scenarios.catalog import Scenario, scenario
from toolkit.scenarios.figures import write_figure
from toolkit.targets import target_of

CPU_ENGINE_MODEL = Path(__file__).resolve().parents[1] / "repo" / "python_models" / "cpu_engine.py"


def lever_gaps(config: DeploymentConfig, sc: Scenario) -> list[str]:
    """Levers of the fix that the served engine would ignore, one line each. TensorRT-LLM targets take
    them as parameters (checked by `toolkit repo check`); the CPU engine honours them once its Triton
    model runs the toolkit's engine runtime (toolkit/engine/runtime/)."""
    target = target_of(config)
    if "stream_interval" in sc.levers and not target.takes_stream_interval:
        return [f"stream_interval: target {target.name} streams every step's tokens (TensorRT-LLM's C++ backend has no "
                "such parameter; target llmapi has): the fix cannot run"]
    if target.on_gpu:
        return [f"{lever} on TensorRT-LLM targets is not configured by this toolkit (Medusa / EAGLE / lookahead "
                "need their own engine build): the workload runs, the fix cannot show"
                for lever in sc.levers if lever == "speculative_decoding"]
    if not sc.levers:
        return []
    source = CPU_ENGINE_MODEL.read_text() if CPU_ENGINE_MODEL.is_file() else ""
    if "engine.runtime" in source or "from runtime" in source:
        return []
    return [f"the CPU engine's Triton model does not run the engine runtime yet, so it ignores "
            f"{lever}: the workload runs, the fix cannot show" for lever in sc.levers]


def scenario_config(base: DeploymentConfig, sc: Scenario) -> DeploymentConfig:
    raw = base.model_dump()
    raw["name"] = f"{base.name}-{sc.name}"
    raw["sweep"]["workload"].update(max_input_tokens=None, max_total_tokens=None)  # re-derived from the engine
    return validate_config(apply_overrides(raw, sc.workload(base)), source=f"scenario {sc.name}")


def run_scenario(name: str, base: DeploymentConfig, repeat: int, out_root: Path, progress=print) -> Path:
    sc = scenario(name)
    config = scenario_config(base, sc)
    gaps = lever_gaps(config, sc)
    for gap in gaps:
        progress(f"[scenario] note: {gap}")
    out_dir = out_root / f"{time.strftime('%Y%m%d-%H%M%S')}-{sc.name}"
    out_dir.mkdir(parents=True, exist_ok=True)
    variants = [("baseline", {k: str(v) for k, v in sc.baseline(config).items()}),
                (sc.fix_label, {k: str(v) for k, v in sc.fix(config).items()})]
    progress(f"[scenario] {sc.name}: {sc.failure}; fix: {sc.fix_label}")
    ab_dir = run_ab(config, variants, repeat, out_dir, progress=progress)
    ab = json.loads((ab_dir / "ab.json").read_text())
    runs = {label: [RunDir.open(p) for p in paths] for label, paths in ab["runs"].items()}
    return write_scenario_report(sc, runs, out_dir, gaps, variants)


def write_scenario_report(sc: Scenario, runs: dict[str, list[RunDir]], out_dir: Path, gaps: list[str],
                          variants: list[tuple[str, dict]]) -> Path:
    """scenario.md / scenario.json / scenario.png from the runs only (so a scenario can be re-reported)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = judge(runs, sc.judged)
    evidence = server_evidence(runs)
    figure = write_figure(sc.figure, runs, f"{sc.name}: baseline vs {sc.fix_label}", out_dir / "scenario.png")
    decisive = [r for r in results if r["verdict"] != "noise"]
    headline = sentence((decisive or results)[0]) if results else "no request succeeded: nothing to compare"
    lines = [f"# Scenario {sc.name}", "", f"**{headline}.**", "",
             f"- failure: {sc.failure}", f"- cause: {sc.cause}", f"- fix ({sc.fix_label}): {sc.fix_note}",
             "- variants: " + "; ".join(f"{label} " + (", ".join(f"{k}={v}" for k, v in o.items()) or "(as configured)")
                                        for label, o in variants)]
    lines += [f"- **not shown here:** {gap}" for gap in gaps]
    lines += ["", "## A/B (median per request, two-level bootstrap 95 % interval)", ""]
    lines += [f"- {sentence(r)}" for r in results] or ["- no comparable values"]
    lines += ["", "## What the server counted", ""] + evidence_lines(evidence)
    lines += ["", "## What `toolkit doctor` says (first repetition of each)", ""]
    lines += [f"- {label}: " + ("; ".join(f.summary for f in diagnose(reps[0])) or "no findings")
              for label, reps in runs.items() if reps]
    lines += ["", f"![{sc.name}]({figure.name})", "", "Runs: " + ", ".join(f"`{r.path}`" for rs in runs.values() for r in rs)]
    (out_dir / "scenario.md").write_text("\n".join(lines) + "\n")
    (out_dir / "scenario.json").write_text(json.dumps(
        {"scenario": sc.name, "headline": headline, "variants": dict(variants), "lever_gaps": gaps,
         "results": results, "evidence": evidence, "runs": {k: [str(r.path) for r in v] for k, v in runs.items()}},
        indent=2) + "\n")
    return out_dir
