"""Repository text and the repository checker, on repositories written by the toolkit and broken by hand."""

import json
import shutil

import pytest

from toolkit.engine.engine_config import EngineConfig
from toolkit.config import validate_config
from toolkit.repo.checks import check_repository
from toolkit.repo.models import ENSEMBLE_STEPS, MODEL_TENSORS
from toolkit.repo.pbtxt import ensemble_scheduling, model_config
from toolkit.repo.pbtxt_parse import parse_pbtxt
from toolkit.repo.writer import write_repository
from toolkit.manifest import write_manifest


def fake_engine(tmp_path, tokenizer_source, target="cpu", **limits):
    """An engine directory as `toolkit build` leaves it (engine config + tokenizer), without weights."""
    config = validate_config({"name": "t", "engine": {"target": target, **limits},
                              "quantize": {"export": "trtllm" if target == "trtllm" else "hf"}})
    engine_dir = tmp_path / "engine"
    tok_dir = engine_dir / ("checkpoint" if target == "cpu" else "tokenizer")
    shutil.copytree(tokenizer_source, tok_dir)
    EngineConfig.from_deployment(config).write(engine_dir)
    if target == "trtllm":
        (engine_dir / "config.json").write_text(json.dumps({
            "build_config": {"max_batch_size": config.engine.max_batch_size, "max_seq_len": config.engine.max_seq_len},
            "pretrained_config": {"mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}}}))
    write_manifest(engine_dir, "build", {}, {}, 0.0)
    return config, engine_dir


@pytest.fixture
def cpu_repo(tmp_path, tiny_model_dir):
    config, engine_dir = fake_engine(tmp_path, tiny_model_dir)
    return write_repository(config, engine_dir, tmp_path / "repo"), engine_dir


def errors(findings):
    return [f for f in findings if f.severity == "error"]


def test_written_cpu_repository_has_inflight_batcher_layout(cpu_repo):
    repo, engine_dir = cpu_repo
    assert sorted(p.name for p in repo.iterdir() if p.is_dir()) == ["ensemble", "postprocessing", "preprocessing",
                                                                    "tensorrt_llm", "tensorrt_llm_bls"]
    engine = parse_pbtxt((repo / "tensorrt_llm" / "config.pbtxt").read_text())
    assert engine.get("backend").value == "python"
    assert engine.get("model_transaction_policy").get("decoupled").value is True
    assert engine.get("max_batch_size").value == 8
    names = {t.get("name").value for t in engine.all("input")}
    assert {"input_ids", "input_lengths", "request_output_len", "streaming", "end_id"} <= names
    assert (repo / "tensorrt_llm" / "1" / "model.py").is_file()
    assert (repo / "tensorrt_llm" / "1" / "quantized_checkpoint.py").is_file()
    assert str(engine_dir.resolve()) in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert errors(check_repository(repo)) == []


def test_trtllm_repository_parameters(tmp_path, tiny_model_dir):
    config, engine_dir = fake_engine(tmp_path, tiny_model_dir, target="trtllm")
    repo = write_repository(config, engine_dir, tmp_path / "repo")
    text = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    node = parse_pbtxt(text)
    params = {p.get("key").value: p.get("value").get("string_value").value for p in node.all("parameters")}
    assert node.get("backend").value == "tensorrtllm"
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["exclude_input_in_output"] == "true"
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.9"
    assert params["batch_scheduler_policy"] == "guaranteed_no_evict"
    assert errors(check_repository(repo)) == []


def test_ensemble_wiring_connects_in_generated_text():
    inputs, outputs = MODEL_TENSORS["ensemble"]
    node = parse_pbtxt(model_config("ensemble", None, 4, inputs, outputs, extra=ensemble_scheduling(ENSEMBLE_STEPS)))
    steps = node.get("ensemble_scheduling").all("step")
    assert [s.get("model_name").value for s in steps] == ["preprocessing", "tensorrt_llm", "postprocessing"]
    assert node.get("platform").value == "ensemble"


def replace_in(path, old, new):
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_check_finds_placeholder_with_line(cpu_repo):
    repo, _ = cpu_repo
    replace_in(repo / "tensorrt_llm" / "config.pbtxt", "max_batch_size: 8", "max_batch_size: ${triton_max_batch_size}")
    found = errors(check_repository(repo))
    assert any("${triton_max_batch_size}" in f.problem and f.line == 3 and f.file.endswith("tensorrt_llm/config.pbtxt")
               for f in found)


def test_check_finds_batch_larger_than_engine(cpu_repo):
    repo, _ = cpu_repo
    replace_in(repo / "tensorrt_llm" / "config.pbtxt", "max_batch_size: 8", "max_batch_size: 64")
    found = errors(check_repository(repo))
    assert any("exceeds the engine's 8" in f.problem for f in found)


def test_check_finds_streaming_without_decoupled(cpu_repo):
    repo, _ = cpu_repo
    replace_in(repo / "tensorrt_llm" / "config.pbtxt", "decoupled: true", "decoupled: false")
    assert any("not decoupled" in f.problem for f in errors(check_repository(repo)))


def test_check_finds_broken_ensemble_tensor(cpu_repo):
    repo, _ = cpu_repo
    replace_in(repo / "ensemble" / "config.pbtxt", 'value: "_REQUEST_INPUT_LEN"\n      }\n      input_map',
               'value: "_REQUEST_INPUT_LENGTH"\n      }\n      input_map')
    found = errors(check_repository(repo))
    assert any('"_REQUEST_INPUT_LENGTH"' in f.problem and "neither an ensemble input" in f.problem for f in found)


def test_check_finds_missing_engine_and_tokenizer(cpu_repo):
    repo, engine_dir = cpu_repo
    shutil.rmtree(engine_dir)
    problems = " | ".join(f.problem for f in errors(check_repository(repo)))
    assert "engine directory" in problems and "does not exist" in problems
    assert "tokenizer_dir" in problems


def test_check_finds_world_size_mismatch(cpu_repo):
    repo, _ = cpu_repo
    assert any("world size 1" in f.problem for f in errors(check_repository(repo, world_size=2)))


def test_check_finds_exclude_input_in_output_false(tmp_path, tiny_model_dir):
    config, engine_dir = fake_engine(tmp_path, tiny_model_dir, target="trtllm")
    repo = write_repository(config, engine_dir, tmp_path / "repo")
    replace_in(repo / "tensorrt_llm" / "config.pbtxt", 'key: "exclude_input_in_output"\n  value: { string_value: "true" }',
               'key: "exclude_input_in_output"\n  value: { string_value: "false" }')
    assert any("exclude_input_in_output" in f.problem for f in errors(check_repository(repo)))


def test_check_reports_parse_error_line(cpu_repo):
    repo, _ = cpu_repo
    path = repo / "postprocessing" / "config.pbtxt"
    path.write_text(path.read_text() + "\ninput [ {\n")
    found = errors(check_repository(repo))
    assert any("does not parse" in f.problem for f in found)


def test_llmapi_repository_without_tensorrt_llm_templates_says_where_to_get_them(tmp_path, tiny_model_dir, monkeypatch):
    import yaml

    from toolkit.engine.llmapi import write_llmapi_config
    from toolkit.engine.stage import copy_tokenizer

    monkeypatch.delenv("TRTLLM_TRITON_MODELS", raising=False)
    config = validate_config({"name": "t", "engine": {"target": "llmapi", "enable_kv_cache_reuse": True},
                              "quantize": {"kv_cache_dtype": "fp8"}})
    engine_dir = tmp_path / "engine"
    write_llmapi_config(tiny_model_dir, engine_dir, config.engine, EngineConfig.from_deployment(config))
    copy_tokenizer(tiny_model_dir, engine_dir / "tokenizer")
    write_manifest(engine_dir, "build", {}, {}, 0.0)
    repo = write_repository(config, engine_dir, tmp_path / "repo")
    options = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert options["backend"] == "pytorch" and options["tensor_parallel_size"] == 1
    assert options["kv_cache_config"] == {"dtype": "fp8", "free_gpu_memory_fraction": 0.9, "enable_block_reuse": True,
                                          "tokens_per_block": 32}
    assert options["enable_chunked_prefill"] is True and options["max_num_tokens"] == 1024
    found = errors(check_repository(repo))
    assert len(found) == 1 and "TRTLLM_TRITON_MODELS" in found[0].fix

    # With TensorRT-LLM's templates present (as in the NGC container) they are copied in.
    template = tmp_path / "all_models" / "llmapi" / "tensorrt_llm"
    (template / "1").mkdir(parents=True)
    (template / "1" / "model.py").write_text("# TensorRT-LLM's llmapi model\n")
    (template / "config.pbtxt").write_text('name: "tensorrt_llm"\nbackend: "python"\nmax_batch_size: 0\n')
    monkeypatch.setenv("TRTLLM_TRITON_MODELS", str(tmp_path / "all_models"))
    repo = write_repository(config, engine_dir, tmp_path / "repo")
    assert (repo / "tensorrt_llm" / "1" / "model.py").is_file()
    assert not any("llmapi model" in f.problem for f in check_repository(repo))
