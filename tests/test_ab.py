"""A/B verdicts on synthetic repetitions with known differences."""

import random
from pathlib import Path

import pytest

from toolkit.ab.stats import compare


def reps(center, count=3, n=40, noise=0.02, seed=0, drift=None):
    rng = random.Random(seed)
    out = []
    for i in range(count):
        shift = 1 + (drift[i] if drift else 0)
        out.append([center * shift * (1 + rng.gauss(0, noise)) for _ in range(n)])
    return out


def test_a_clear_improvement_is_better():
    c = compare("time_to_first_token", "s", "A", "B", reps(100, seed=1), reps(80, seed=2), lower_is_better=True)
    assert c.verdict == "better"
    assert c.relative_change == pytest.approx(-0.2, abs=0.02)
    assert c.ci_high < 0 and c.agreeing_repetitions == 3


def test_a_clear_regression_is_worse():
    c = compare("output_token_throughput", "s", "A", "B", reps(500, n=1, noise=0.01, seed=3),
                reps(400, n=1, noise=0.01, seed=4), lower_is_better=False)
    assert c.verdict == "worse"


def test_identical_distributions_are_noise():
    c = compare("inter_token_latency", "s", "A", "B", reps(50, seed=5), reps(50, seed=6), lower_is_better=True)
    assert c.verdict == "noise" and c.ci_low <= 0 <= c.ci_high


def test_runs_that_do_not_reproduce_are_refused():
    # B looks 20 % faster overall, but the baseline's repetitions differ by 60 %: not a real result.
    base = reps(100, seed=7, drift=[0.0, 0.6, -0.1])
    c = compare("request_latency", "s", "A", "B", base, reps(80, seed=8), lower_is_better=True)
    assert c.verdict == "noise" and "do not reproduce" in c.reason


def test_repetitions_that_drift_yet_lie_far_apart_are_judged():
    # The candidate's repetitions differ by 35 % (the machine's state moved), but the nearest two of the variants'
    # lie 48 % apart: the difference is larger than any drift seen, so it reproduces.
    c = compare("inter_token_latency", "s", "A", "B", reps(100, seed=10, drift=[0.0, 0.01, -0.01]),
                reps(40, seed=11, drift=[0.3, 0.0, -0.05]), lower_is_better=True)
    assert c.rep_spread > 0.25 and c.rep_gap > c.rep_spread
    assert c.verdict == "better" and "apart" in c.reason
    # the same drift against a difference it could close stays noise, naming both figures
    c = compare("inter_token_latency", "s", "A", "B", reps(100, seed=10, drift=[0.0, 0.01, -0.01]),
                reps(60, seed=11, drift=[0.4, 0.0, -0.05]), lower_is_better=True)
    assert c.rep_gap < c.rep_spread and c.verdict == "noise" and "between the variants' nearest ones" in c.reason
    # and higher-is-better: the candidate's lowest repetition above the baseline's highest
    c = compare("output_token_throughput", "s", "A", "B", reps(100, n=1, noise=0.001, seed=12, drift=[0.0, 0.01, 0.0]),
                reps(220, n=1, noise=0.001, seed=13, drift=[-0.15, 0.0, 0.15]), lower_is_better=False)
    assert c.rep_spread > 0.25 and c.verdict == "better"


def test_one_repetition_is_never_enough():
    c = compare("time_to_first_token", "s", "A", "B", reps(100, count=1), reps(50, count=1, seed=9), True)
    assert c.verdict == "noise" and "repeat" in c.reason


def test_bootstrap_is_seeded():
    args = ("time_to_first_token", "s", "A", "B", reps(100, seed=1), reps(90, seed=2), True)
    assert compare(*args).ci_low == compare(*args).ci_low


def test_per_run_metrics_need_three_repetitions():
    c = compare("output_token_throughput", "s", "A", "B", reps(500, count=2, n=1, noise=0.001),
                reps(400, count=2, n=1, noise=0.001, seed=1), lower_is_better=False)
    assert c.verdict == "noise" and "--repeat ≥ 3" in c.reason


@pytest.mark.e2e
def test_ab_runs_variants_interleaved(tmp_path, tiny_model_dir):
    from e2e_helpers import tiny_deployment
    from toolkit.ab.run import parse_variant, run_ab
    import json

    config, _ = tiny_deployment(tmp_path, tiny_model_dir, name="ab",
                                sweep={"concurrencies": [1], "requests_per_step": 4, "warmup_requests": 0})
    out = run_ab(config, [parse_variant("fp8:quantize.qformat=fp8"), parse_variant("int8:quantize.qformat=int8_sq")],
                 repeat=2, out_root=tmp_path / "ab", progress=lambda _: None)
    result = json.loads((out / "ab.json").read_text())
    assert set(result["runs"]) == {"fp8", "int8"} and all(len(v) == 2 for v in result["runs"].values())
    metrics = {r["metric"] for r in result["results"]}
    assert metrics == {"time_to_first_token", "inter_token_latency", "request_latency", "output_token_throughput"}
    assert all(r["verdict"] in ("better", "worse", "noise") for r in result["results"])
    # interleaved: fp8 rep 1, int8 rep 1, int8 rep 2, fp8 rep 2 (ABBA)
    order = sorted((json.loads((Path(p) / "config.json").read_text())["repetition"], Path(p).stat().st_mtime, label)
                   for label, paths in result["runs"].items() for p in paths)
    assert [label for _, _, label in order] == ["fp8", "int8", "int8", "fp8"]
    assert (out / "ab.md").read_text().startswith("# A/B: fp8 vs int8")
    assert (out / "report.html").is_file()


def test_variant_parsing_errors():
    from toolkit.ab.run import parse_variant
    from toolkit.errors import ToolkitError

    assert parse_variant("kv:engine.enable_kv_cache_reuse=true,quantize.kv_cache_dtype=fp8") == (
        "kv", {"engine.enable_kv_cache_reuse": "true", "quantize.kv_cache_dtype": "fp8"})
    with pytest.raises(ToolkitError, match="needs a label"):
        parse_variant(":quantize.qformat=fp8")
    with pytest.raises(ToolkitError, match="not key=value"):
        parse_variant("x:quantize.qformat")
