"""The demo's format effect: the built CPU engine against the same model unquantized, on the engine alone."""

import json

import pytest
import yaml

from test_cli_errors import assert_one_line_error, run_cli
from toolkit import pipeline
from toolkit.config import ArtifactLayout, load_config
from toolkit.bench.rundir import RunDir
from toolkit.engine.format_effect import (FormatEffect, format_effect_sentence, planner_ratios, read_format_effect,
                                          write_format_effect)
from toolkit.report.markdown import run_header

EFFECT = FormatEffect("int4_awq", "int4-g128-int8act", 56_000_000, 205_000_000, 128, {1: 2.0, 8: 9.6}, {1: 6.0, 8: 8.0},
                      {1: 0.3, 8: 1.05})


def test_planner_ratios_read_the_plans_format_table_at_batch_1_and_the_deployments():
    plan = {"deployment": {"batch": 8},
            "formats": [{"weights": "bf16", "decode_step_batch1_s": 0.006, "decode_step_s": 0.008},
                        {"weights": "int4_awq", "decode_step_batch1_s": 0.0018, "decode_step_s": 0.0084}]}
    assert planner_ratios(plan, "int4_awq") == pytest.approx({1: 0.3, 8: 1.05})
    assert planner_ratios(plan, "none") == pytest.approx({1: 1.0, 8: 1.0})
    assert planner_ratios(plan, "fp8") == {} == planner_ratios(None, "fp8")


def test_sentence_says_both_steps_the_bytes_and_the_planner_at_each_batch():
    sentence = format_effect_sentence(EFFECT)
    assert ("int4_awq on int4-g128-int8act kernels took 2.00 ms a step against 6.00 ms at 1 sequence (x0.33), reading "
            "56 of 205 MB of weights (x0.27); the planner predicted x0.30; at 8 sequences 9.60 against 8.00 ms (x1.20; "
            "planner x1.05).") in sentence
    one_batch = FormatEffect(**{**EFFECT.__dict__, "step_ms": {1: 2.0}, "reference_step_ms": {1: 6.0}, "planner_ratios": {}})
    assert format_effect_sentence(one_batch).endswith("reading 56 of 205 MB of weights (x0.27).")


def test_sentence_says_why_fewer_bytes_were_no_faster_only_where_they_were_not():
    # 8 sequences: x1.20 with a quarter of the bytes, so the sentence explains it (compute-bound there)
    assert format_effect_sentence(EFFECT).endswith(
        "At 8 sequences it is no faster: such a step does 8 times the arithmetic on the same weights, so its time is "
        "set by how fast the kernel computes, not by the bytes the format saves, and on this CPU the int4-g128-int8act "
        "kernel computes no faster than bf16's (`toolkit plan` gives the batch where each format turns compute-bound).")
    faster = FormatEffect(**{**EFFECT.__dict__, "step_ms": {1: 2.0, 8: 7.0}})
    assert "no faster" not in format_effect_sentence(faster)


def test_the_run_folder_keeps_it_and_the_report_says_it(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"run": {"model": "small", "qformat": "int4_awq"}, "steps": []}))
    assert read_format_effect(tmp_path) is None
    assert not any("format's effect" in line for line in run_header(RunDir.open(tmp_path)))
    write_format_effect(EFFECT, tmp_path)
    assert read_format_effect(tmp_path) == EFFECT
    assert f"- weight format's effect. {format_effect_sentence(EFFECT)}" in run_header(RunDir.open(tmp_path))
    (tmp_path / "format_effect.json").write_text("{broken")
    assert read_format_effect(tmp_path) is None  # a damaged file costs the line, not the report


@pytest.fixture(scope="module")
def int8_engine(tmp_path_factory, tiny_model_dir):
    """A tiny INT8-SQ CPU engine built from a config file, as a user's `toolkit build -c` leaves it."""
    tmp = tmp_path_factory.mktemp("format-effect")
    config_file = tmp / "int8.yaml"
    config_file.write_text(yaml.safe_dump({
        "name": "fx", "model": {"source": str(tiny_model_dir), "name": "tiny"}, "quantize": {"qformat": "int8_sq"},
        "engine": {"max_batch_size": 4, "max_input_len": 96, "max_seq_len": 160, "kv_cache_blocks": 32,
                   "tokens_per_block": 16, "max_num_tokens": 256},
        "sweep": {"concurrencies": [1, 8]},
        "paths": {"build_dir": str(tmp / "build"), "repo_root": str(tmp / "model_repo"), "runs_dir": str(tmp / "runs")}}))
    config = load_config(config_file)
    layout = ArtifactLayout(config)
    pipeline.quantize(config, layout)
    pipeline.build(config, layout)
    return config_file, config, layout


def test_measured_on_the_built_engine_against_the_unquantized_model(tmp_path, int8_engine):
    _, config, layout = int8_engine
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"run": {}, "steps": []}))
    effect = pipeline.format_effect(config, layout, run_dir)
    assert effect.qformat == "int8_sq" and effect.weight_format.startswith("int8")
    # int8 linears against bf16 ones; the embeddings, norms and lm_head stay 16-bit in both
    assert effect.reference_weight_bytes > effect.weight_bytes > 0
    # one sequence and the sweep's most in flight, as far as the engine batches them (sweep 1, 8; batch 4)
    assert set(effect.step_ms) == set(effect.reference_step_ms) == {1, 4}
    assert min(effect.step_ms.values()) > 0 and min(effect.reference_step_ms.values()) > 0
    assert effect.planner_ratios == {}  # this run folder has no plan.json
    assert read_format_effect(run_dir) == effect


def test_the_command_says_it_and_refuses_what_it_cannot_compare(tmp_path, int8_engine):
    config_file, _, _ = int8_engine
    result = run_cli("format-effect", "-c", str(config_file))
    assert result.returncode == 0, result.stderr
    assert "int8_sq on int8" in result.stdout and "the planner predicted x" in result.stdout  # planned here
    assert "at 4 sequences" in result.stdout and "; planner x" in result.stdout  # the plan's batch: the engine's 4
    unquantized = tmp_path / "none.yaml"
    unquantized.write_text(config_file.read_text().replace("int8_sq", "none"))
    assert_one_line_error(run_cli("format-effect", "-c", str(unquantized)), "nothing to compare", "quantize.qformat is none")
    unbuilt = tmp_path / "unbuilt.yaml"
    unbuilt.write_text(config_file.read_text().replace(str(config_file.parent / "build"), str(tmp_path / "empty")))
    assert_one_line_error(run_cli("format-effect", "-c", str(unbuilt)), "no CPU engine built at", "toolkit build")


def test_a_model_the_memory_cannot_hold_twice_is_refused_with_the_numbers():
    from toolkit.engine.format_effect import refuse_what_memory_cannot_hold
    from toolkit.errors import ToolkitError

    refuse_what_memory_cannot_hold(100_000_000)  # `small` fits
    with pytest.raises(ToolkitError, match=r"needs ~37252.9 GiB of memory \(10000.00 B parameters held twice\), and "
                                           r"[0-9.]+ GiB is free — free memory, or compare formats .*toolkit ab"):
        refuse_what_memory_cannot_hold(10**13)
