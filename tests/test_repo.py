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
    assert {"temperature", "runtime_top_k", "runtime_top_p", "seed", "beam_width"} <= names
    assert str(engine_dir.resolve()) in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert errors(check_repository(repo)) == []


def test_cpu_threads_reach_the_engine_model_only_when_set(tmp_path, tiny_model_dir):
    def params(directory, **limits):
        config, engine_dir = fake_engine(directory, tiny_model_dir, **limits)
        repo = write_repository(config, engine_dir, directory / "repo")
        engine = parse_pbtxt((repo / "tensorrt_llm" / "config.pbtxt").read_text())
        return {p.get("key").value: p.get("value").get("string_value").value for p in engine.all("parameters")}

    default = params(tmp_path / "a")
    assert "cpu_threads" not in default  # the engine then takes every core it may run on
    assert params(tmp_path / "b", cpu_threads=1)["cpu_threads"] == "1"
    assert "cpu_numa" not in default  # auto: the engine binds to a node only on multi-node hosts
    assert params(tmp_path / "e", cpu_numa="off")["cpu_numa"] == "off"
    assert "stream_interval" not in params(tmp_path / "d")  # every step's tokens
    assert params(tmp_path / "c", stream_interval=4)["stream_interval"] == "4"


def test_stream_interval_is_refused_for_the_cpp_backend_and_written_for_the_llm_api(tmp_path, tiny_model_dir):
    import yaml

    from toolkit.engine.llmapi import LLMAPI_CONFIG_FILE
    from toolkit.errors import ToolkitError

    config, engine_dir = fake_engine(tmp_path / "a", tiny_model_dir, target="trtllm", stream_interval=4)
    with pytest.raises(ToolkitError, match="engine.stream_interval 4.*C\\+\\+ backend") as refused:
        write_repository(config, engine_dir, tmp_path / "a" / "repo")
    assert "engine.target llmapi" in refused.value.fix
    config, engine_dir = llmapi_engine(tmp_path / "b", tiny_model_dir, stream_interval=4)
    assert yaml.safe_load((engine_dir / LLMAPI_CONFIG_FILE).read_text())["stream_interval"] == 4


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


def llmapi_engine(tmp_path, model_dir, **engine):
    """An llmapi "engine" directory as `toolkit build --target llmapi` leaves it."""
    from toolkit.engine.llmapi import write_llmapi_config
    from toolkit.engine.stage import copy_tokenizer

    config = validate_config({"name": "t", "engine": {"target": "llmapi", "enable_kv_cache_reuse": True, **engine},
                              "quantize": {"kv_cache_dtype": "fp8"}})
    engine_dir = tmp_path / "engine"
    write_llmapi_config(model_dir, engine_dir, config.engine, EngineConfig.from_deployment(config))
    copy_tokenizer(model_dir, engine_dir / "tokenizer")
    write_manifest(engine_dir, "build", {}, {}, 0.0)
    return config, engine_dir


def fake_templates(tmp_path, monkeypatch, version="1.1.0"):
    """A TensorRT-LLM tree holding the llmapi model's python files, as the image clones it."""
    template = tmp_path / "all_models" / "llmapi" / "tensorrt_llm"
    (template / "1").mkdir(parents=True)
    (template / "1" / "model.py").write_text("# TensorRT-LLM's llmapi model\n")
    (template / "1" / "helpers.py").write_text("# its helpers\n")
    monkeypatch.setenv("TRTLLM_TRITON_MODELS", str(tmp_path / "all_models"))
    monkeypatch.setenv("TRTLLM_TEMPLATES_VERSION", version)


def test_llmapi_repository_without_tensorrt_llm_templates_says_where_to_get_them(tmp_path, tiny_model_dir, monkeypatch):
    import yaml

    monkeypatch.delenv("TRTLLM_TRITON_MODELS", raising=False)
    config, engine_dir = llmapi_engine(tmp_path, tiny_model_dir, batch_scheduler_policy="max_utilization")
    repo = write_repository(config, engine_dir, tmp_path / "repo")
    options = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert options["backend"] == "pytorch" and options["tensor_parallel_size"] == 1
    assert options["kv_cache_config"] == {"dtype": "fp8", "free_gpu_memory_fraction": 0.9, "enable_block_reuse": True,
                                          "tokens_per_block": 32}
    assert options["enable_chunked_prefill"] is True and options["max_num_tokens"] == 1024
    # One scheduler policy for both GPU targets; the dtype is stated (the tiny preset declares float32).
    assert options["scheduler_config"] == {"capacity_scheduler_policy": "MAX_UTILIZATION"}
    assert options["dtype"] == "bfloat16"
    found = errors(check_repository(repo))
    assert len(found) == 1 and "TRTLLM_TRITON_MODELS" in found[0].fix

    # With TensorRT-LLM's tree present (as the image clones it) its python files are copied in.
    fake_templates(tmp_path, monkeypatch)
    repo = write_repository(config, engine_dir, tmp_path / "repo")
    assert (repo / "tensorrt_llm" / "1" / "model.py").is_file() and (repo / "tensorrt_llm" / "1" / "helpers.py").is_file()
    assert errors(check_repository(repo, world_size=1)) == []
    assert json.loads((repo / "manifest.json").read_text())["outputs"]["tokenizer_dir"] == str(engine_dir.resolve() / "tokenizer")


def test_llmapi_templates_of_an_unchecked_version_are_refused(tmp_path, tiny_model_dir, monkeypatch):
    from toolkit.errors import ToolkitError

    config, engine_dir = llmapi_engine(tmp_path, tiny_model_dir)
    fake_templates(tmp_path, monkeypatch, version="0.21.0")
    with pytest.raises(ToolkitError, match="TensorRT-LLM 0.21.0") as err:
        write_repository(config, engine_dir, tmp_path / "repo")
    assert "TRTLLM_TEMPLATES_VERSION" in err.value.fix


def test_llmapi_check_finds_unknown_argument_and_disagreeing_batching(tmp_path, tiny_model_dir, monkeypatch):
    config, engine_dir = llmapi_engine(tmp_path, tiny_model_dir)
    fake_templates(tmp_path, monkeypatch)
    repo = write_repository(config, engine_dir, tmp_path / "repo")
    model_yaml = repo / "tensorrt_llm" / "1" / "model.yaml"
    replace_in(model_yaml, "enable_chunked_prefill:", "enable_chunked_prefil:")
    replace_in(model_yaml, "capacity_scheduler_policy: GUARANTEED_NO_EVICT", "capacity_scheduler_policy: FAST")
    replace_in(model_yaml, "decoupled: true", "decoupled: false")
    found = errors(check_repository(repo, world_size=2))
    problems = " | ".join(f.problem for f in found)
    assert '"enable_chunked_prefil" is not an LLM API argument' in problems
    assert "capacity_scheduler_policy" in problems and "FAST" in problems
    assert "triton_config.decoupled is false" in problems
    assert "asks for 1 rank(s)" in problems
    unknown = next(f for f in found if "enable_chunked_prefil" in f.problem)
    assert unknown.line == model_yaml.read_text().splitlines().index(
        next(line for line in model_yaml.read_text().splitlines() if line.startswith("enable_chunked_prefil"))) + 1


def test_llmapi_build_refuses_an_unknown_option_before_writing(tmp_path, tiny_model_dir):
    from toolkit.engine.llmapi import validate_llmapi_options
    from toolkit.errors import ToolkitError

    with pytest.raises(ToolkitError, match="kv_cache_config.free_gpu_mem_fraction"):
        validate_llmapi_options({"model": "/m", "kv_cache_config": {"free_gpu_mem_fraction": 0.9}})
    with pytest.raises(ToolkitError, match="free_gpu_memory_fraction = 1.2 must be ≤ 1"):
        validate_llmapi_options({"model": "/m", "kv_cache_config": {"free_gpu_memory_fraction": 1.2}})
    from toolkit.engine.llmapi import llmapi_options

    cfg = validate_config({"name": "t", "engine": {"target": "llmapi"}, "quantize": {"kv_cache_dtype": "int8"}})
    with pytest.raises(ToolkitError, match="kv_cache_dtype int8 is not offered"):
        llmapi_options(tiny_model_dir, cfg.engine, EngineConfig.from_deployment(cfg))


@pytest.fixture
def trtllm_repo(tmp_path, tiny_model_dir):
    config, engine_dir = fake_engine(tmp_path, tiny_model_dir, target="trtllm")
    return write_repository(config, engine_dir, tmp_path / "repo")


def test_trtllm_check_holds_parameters_to_their_documented_domains(trtllm_repo):
    path = trtllm_repo / "tensorrt_llm" / "config.pbtxt"
    replace_in(path, 'string_value: "0.9"', 'string_value: "1.5"')
    replace_in(path, 'string_value: "guaranteed_no_evict"', 'string_value: "fifo"')
    replace_in(path, 'key: "enable_chunked_context"\n  value: { string_value: "true" }',
               'key: "enable_chunked_context"\n  value: { string_value: "yes please" }')
    text = path.read_text()
    path.write_text(text + 'parameters {\n  key: "kv_cache_free_gpu_memory_fraction"\n  value: { string_value: "0.5" }\n}\n')
    findings = check_repository(trtllm_repo)
    problems = " | ".join(f.problem for f in errors(findings))
    assert 'kv_cache_free_gpu_mem_fraction = "1.5" must be ≤ 1' in problems
    assert 'batch_scheduler_policy = "fifo" is not one of max_utilization, guaranteed_no_evict' in problems
    assert "enable_chunked_context" in problems and "not a boolean" in problems
    assert any("kv_cache_free_gpu_memory_fraction" in f.problem and f.severity == "warning" for f in findings)


def test_trtllm_check_requires_the_templates_batching_attributes(trtllm_repo):
    path = trtllm_repo / "tensorrt_llm" / "config.pbtxt"
    replace_in(path, '    name: "input_lengths"\n    data_type: TYPE_INT32\n    dims: [ 1 ]\n    reshape: { shape: [ ] }\n',
               '    name: "input_lengths"\n    data_type: TYPE_INT32\n    dims: [ 1 ]\n')
    replace_in(path, "    allow_ragged_batch: true\n", "")
    problems = " | ".join(f.problem for f in errors(check_repository(trtllm_repo)))
    assert "input_lengths lacks reshape" in problems and "input_ids lacks allow_ragged_batch" in problems


def test_check_cross_checks_models_that_must_agree(trtllm_repo, tmp_path):
    replace_in(trtllm_repo / "ensemble" / "config.pbtxt", "max_batch_size: 8", "max_batch_size: 16")
    post = trtllm_repo / "postprocessing" / "config.pbtxt"
    tokenizer = parse_pbtxt(post.read_text()).all("parameters")[0].get("value").get("string_value").value
    other = tmp_path / "other_tokenizer"
    shutil.copytree(tokenizer, other)
    replace_in(post, tokenizer, str(other))
    replace_in(trtllm_repo / "tensorrt_llm_bls" / "config.pbtxt", 'string_value: "tensorrt_llm"', 'string_value: "trtllm"')
    problems = " | ".join(f.problem for f in errors(check_repository(trtllm_repo)))
    assert "ensemble max_batch_size 16 exceeds preprocessing's 8" in problems
    assert "postprocessing decodes with" in problems
    assert 'tensorrt_llm_model_name "trtllm" is not in the repository' in problems


def test_incremental_detokenization_streams_whole_characters_at_constant_cost(tiny_model_dir):
    """The BLS's streaming text: pieces join to the full decode, no piece carries a split character, and no
    step decodes more than a few tokens beyond the new ones."""
    from toolkit.model.tokenizer import load_tokenizer
    from toolkit.repo.python_models.incremental_text import CONTEXT_TOKENS, REPLACEMENT, IncrementalText

    tokenizer = load_tokenizer(tiny_model_dir)
    ids = tokenizer("Héllo wörld — 日本語 and naïve café déjà vu 😀 again", add_special_tokens=False).input_ids
    text, pieces, widest = IncrementalText(), [], 0
    for token in ids:  # one token per response, as the engine streams
        context, full = text.windows([token])
        widest = max(widest, len(full))
        pieces.append(text.delta(tokenizer.decode(context), tokenizer.decode(full)))
    assert "".join(pieces) == tokenizer.decode(ids)
    assert all(REPLACEMENT not in piece for piece in pieces)
    assert any(piece == "" for piece in pieces)  # multi-byte characters were held back, then completed
    assert widest <= 2 * CONTEXT_TOKENS + 8  # bounded windows, not the whole sequence
