"""Every generated model against NVIDIA's template for it (tests/data/upstream/templates.json, read from
NVIDIA/TensorRT-LLM triton_backend/all_models/): tensors, batching, transaction policy, parameters."""

import json
from pathlib import Path

import pytest
import yaml

from test_repo import fake_engine, llmapi_engine
from toolkit.repo.pbtxt_parse import parse_pbtxt
from toolkit.repo.upstream import EXTENSIONS, PARAMS_BY_MODEL
from toolkit.repo.writer import write_repository

TEMPLATES = json.loads((Path(__file__).parent / "data" / "upstream" / "templates.json").read_text())["models"]
INFLIGHT = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble", "tensorrt_llm_bls")


def scalar(node, key, default=None):
    value = node.get(key) if node is not None else None
    return default if value is None else value.value


def tensor(node):
    """A generated tensor in the template's terms."""
    out = {"name": scalar(node, "name"), "data_type": scalar(node, "data_type"),
           "dims": [d.value for d in node.all("dims")]}
    if node.get("reshape") is not None:
        out["reshape"] = [d.value for d in node.get("reshape").all("shape")]
    if scalar(node, "optional", False):
        out["optional"] = True
    if scalar(node, "allow_ragged_batch", False):
        out["allow_ragged_batch"] = True
    return out


def compare_tensors(model, kind, generated, template):
    by_name = {t["name"]: t for t in template}
    for t in generated:
        if (model, kind, t["name"]) in EXTENSIONS:
            continue
        assert t["name"] in by_name, f"{model} {kind} {t['name']} is neither in the template nor an extension"
        assert t == by_name[t["name"]], f"{model} {kind} {t['name']}: ours {t} vs template {by_name[t['name']]}"
    if kind == "input":
        names = {t["name"] for t in generated}
        required = {t["name"] for t in template if not t.get("optional")}
        assert required <= names, f"{model} lacks the template's required inputs {required - names}"


def check_model(repo, model, template_key, expect_params):
    template = TEMPLATES[template_key]
    node = parse_pbtxt((repo / model / "config.pbtxt").read_text())
    for kind in ("input", "output"):
        compare_tensors(model, kind, [tensor(t) for t in node.all(kind)], template[kind + "s"])
    # Batching: dynamic batching where the template has it, none where it has none.
    assert (node.get("dynamic_batching") is not None) == (template["dynamic_batching"] is not None), model
    # Transaction policy: decoupled where the template can be (streaming), never where it cannot.
    decoupled = scalar(node.get("model_transaction_policy"), "decoupled", False)
    assert decoupled == (template["decoupled"] is not None), model
    if "instance_group" in template:
        group = node.get("instance_group")
        assert scalar(group, "kind") == template["instance_group"]["kind"] and scalar(group, "count") >= 1
    if expect_params:
        table = PARAMS_BY_MODEL.get(model, {})
        assert set(template["parameters"]) == set(table), f"{model}: the parameter table and the template disagree"
        keys = {scalar(p, "key") for p in node.all("parameters")}
        assert keys == {k for k, p in table.items() if p.set_by}, model
    return node


@pytest.fixture(scope="module")
def trtllm_repo(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("trtllm")
    config, engine_dir = fake_engine(tmp, tiny_model_dir, target="trtllm", max_tokens_in_paged_kv_cache=4096)
    return write_repository(config, engine_dir, tmp / "repo")


@pytest.fixture(scope="module")
def cpu_repo(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("cpu")
    config, engine_dir = fake_engine(tmp, tiny_model_dir)
    return write_repository(config, engine_dir, tmp / "repo")


@pytest.mark.parametrize("model", INFLIGHT)
def test_trtllm_target_matches_the_inflight_batcher_templates(trtllm_repo, model):
    node = check_model(trtllm_repo, model, f"inflight_batcher_llm/{model}", expect_params=model != "ensemble")
    if model == "tensorrt_llm":
        assert scalar(node, "backend") == "tensorrtllm"


@pytest.mark.parametrize("model", INFLIGHT)
def test_cpu_target_keeps_the_same_tensors(cpu_repo, model):
    # The CPU engine is a python model with the backend's tensors; its parameters are its own.
    check_model(cpu_repo, model, f"inflight_batcher_llm/{model}", expect_params=model not in ("ensemble", "tensorrt_llm"))


def test_ensemble_wiring_is_the_templates(trtllm_repo):
    """Each step input is fed from the same ensemble input, or the same producer model's output, as upstream's."""
    template = TEMPLATES["inflight_batcher_llm/ensemble"]["steps"]
    steps = parse_pbtxt((trtllm_repo / "ensemble" / "config.pbtxt").read_text()).get("ensemble_scheduling").all("step")

    def producers(step_maps):
        return {value: (model, key) for model, maps in step_maps.items() for key, value in maps["outputs"].items()}

    ours = {scalar(s, "model_name"): {
        "inputs": {scalar(m, "key"): scalar(m, "value") for m in s.all("input_map")},
        "outputs": {scalar(m, "key"): scalar(m, "value") for m in s.all("output_map")}} for s in steps}
    assert list(ours) == list(template)
    our_producers, their_producers = producers(ours), producers(template)
    for model, maps in ours.items():
        for key, value in maps["inputs"].items():
            if (model, "input", key) in EXTENSIONS or value == "ignore_eos":
                continue
            theirs = template[model]["inputs"][key]
            assert our_producers.get(value, value) == their_producers.get(theirs, theirs), f"{model}.{key}"
        for key, value in maps["outputs"].items():
            if value.startswith("_") or (model, "output", key) in EXTENSIONS:
                continue
            assert template[model]["outputs"][key] == value, f"{model}.{key}"


def test_every_template_parameter_is_set_or_left_out_with_a_reason():
    for model, table in PARAMS_BY_MODEL.items():
        assert set(table) == set(TEMPLATES[f"inflight_batcher_llm/{model}"]["parameters"]), model
        for key, param in table.items():
            assert param.set_by or len(param.omitted) > 10, f"{model}.{key} has no reason"


def test_llmapi_model_is_the_template_with_batching_written_out(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.delenv("TRTLLM_TRITON_MODELS", raising=False)
    config, engine_dir = llmapi_engine(tmp_path, tiny_model_dir)
    repo = write_repository(config, engine_dir, tmp_path / "repo")
    template = TEMPLATES["llmapi/tensorrt_llm"]
    node = parse_pbtxt((repo / "tensorrt_llm" / "config.pbtxt").read_text())
    for kind in ("input", "output"):
        ours = [tensor(t) for t in node.all(kind)]
        assert ours == template[kind + "s"], kind  # all of the template's tensors, in its order
    triton = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())["triton_config"]
    assert set(triton) <= set(template["model_yaml_triton_config_keys"])
    # Written in config.pbtxt too: --disable-auto-complete-config skips the template's auto_complete_config.
    assert scalar(node, "max_batch_size") == triton["max_batch_size"] == 0
    assert scalar(node.get("model_transaction_policy"), "decoupled") is True and triton["decoupled"] is True
    assert node.get("dynamic_batching") is None and scalar(node, "backend") == "python"
