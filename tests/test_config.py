import pytest

from toolkit.config import ArtifactLayout, apply_overrides, load_config, parse_set_options, validate_config
from toolkit.errors import ToolkitError


def write(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_configs_load():
    for name in ("cpu-tiny", "cpu-small", "gpu-llama3-8b-fp8-tp2"):
        config = load_config(f"configs/{name}.yaml")
        assert config.name
    gpu = load_config("configs/gpu-llama3-8b-fp8-tp2.yaml")
    assert gpu.parallel.world_size == 2 and gpu.engine.target == "trtllm" and gpu.quantize.export == "trtllm"


def test_overrides_parse_yaml_scalars_and_lists(tmp_path):
    path = write(tmp_path, "name: x\nsweep:\n  concurrencies: [1]\n")
    config = load_config(path, parse_set_options(["sweep.concurrencies=[2, 8]", "quantize.qformat=int4_awq",
                                                  "engine.enable_kv_cache_reuse=true"]))
    assert config.sweep.concurrencies == [2, 8]
    assert config.quantize.qformat == "int4_awq"
    assert config.engine.enable_kv_cache_reuse is True


def test_flag_values_override_file(tmp_path):
    path = write(tmp_path, "name: x\nquantize:\n  qformat: fp8\n")
    assert load_config(path, {"quantize.qformat": "int8_sq"}).quantize.qformat == "int8_sq"


def test_name_defaults_to_file_stem(tmp_path):
    assert load_config(write(tmp_path, "{}\n", "my-deploy.yaml")).name == "my-deploy"


@pytest.mark.parametrize("text, expected", [
    ("name: x\nquantize:\n  qformat: fp4\n", "quantize.qformat"),
    ("name: x\nengine:\n  max_input_len: 512\n  max_seq_len: 256\n", "max_input_len (512) must be < max_seq_len"),
    ("name: x\nengine:\n  bogus: 1\n", "engine.bogus"),
    ("name: x\nsweep:\n  concurrencies: [0]\n", "concurrencies"),
    ("name: x\nparallel:\n  tp: 2\n", "cpu target runs one process"),
    ("name: x\nengine:\n  cpu_numa: -1\n", "not a NUMA node"),
    ("name: x\nengine:\n  cpu_numa: true\n", "auto, off, or a NUMA node number"),
])
def test_invalid_configs_name_the_key(tmp_path, text, expected):
    with pytest.raises(ToolkitError) as err:
        load_config(write(tmp_path, text))
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ToolkitError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ToolkitError, match="not valid YAML at line"):
        load_config(write(tmp_path, "name: x\nsweep: [1,\n"))
    with pytest.raises(ToolkitError, match="KEY=VALUE"):
        parse_set_options(["novalue"])


def test_artifact_layout_is_derived_from_config(tmp_path):
    config = validate_config({"name": "d", "quantize": {"qformat": "int4_awq", "kv_cache_dtype": "fp8"},
                              "paths": {"build_dir": str(tmp_path / "b")}})
    layout = ArtifactLayout(config)
    assert layout.model_dir == tmp_path / "b" / "models" / "tiny"
    assert layout.checkpoint_dir.name == "tiny-int4_awq-kvfp8"
    assert layout.engine_dir.name == "d-cpu"


def test_apply_overrides_refuses_scalar_as_section():
    with pytest.raises(ToolkitError, match="not a section"):
        apply_overrides({"name": "x"}, {"name.sub": "1"})


def test_auto_target_is_picked_from_what_is_installed(monkeypatch):
    import importlib.util
    import shutil

    from toolkit.config import detect_target

    assert validate_config({"name": "x", "engine": {"target": "auto"}}).engine.target == "cpu"  # no TensorRT-LLM here
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "tensorrt_llm" else None)
    monkeypatch.setattr(shutil, "which", lambda cmd: None)
    assert detect_target() == "llmapi"
    monkeypatch.setattr(shutil, "which", lambda cmd: "/usr/local/bin/trtllm-build")
    assert detect_target() == "llmapi"  # engines only when asked for (engine.target: trtllm)


def test_cpu_numa_off_in_yaml_is_off_not_node_0(tmp_path):
    """YAML reads a bare off as false, and pydantic would pass false as the int 0: node 0, not unbound."""
    assert load_config(write(tmp_path, "name: x\nengine:\n  cpu_numa: off\n")).engine.cpu_numa == "off"
    assert load_config(write(tmp_path, "name: x\nengine:\n  cpu_numa: 1\n")).engine.cpu_numa == 1
    assert load_config(write(tmp_path, "name: x\n")).engine.cpu_numa == "auto"
