"""The GPU-side command lines, checked up to the boundary (no TensorRT-LLM or GPU here)."""

from pathlib import Path

from toolkit.engine.engine_config import EngineConfig
from toolkit.engine.trtllm import trtllm_build_command
from toolkit.config import load_config, validate_config
from toolkit.serve.install import TritonInstall
from toolkit.serve.server import tritonserver_command
from toolkit.targets import TARGETS


def flags(cmd):
    return {cmd[i]: cmd[i + 1] for i in range(1, len(cmd) - 1) if cmd[i].startswith("--") and not cmd[i + 1].startswith("--")}


def build_cmd(**sections):
    config = validate_config({"name": "g", **sections})
    return trtllm_build_command(Path("/ck"), Path("/eng"), config.engine, EngineConfig.from_deployment(config))


def test_gpu_example_config_builds_an_fp8_tp2_engine_command():
    config = load_config("configs/gpu-llama3-8b-fp8-tp2.yaml")
    cmd = trtllm_build_command(Path("/ck"), Path("/eng"), config.engine, EngineConfig.from_deployment(config))
    f = flags(cmd)
    assert cmd[0] == "trtllm-build"
    assert f["--gpt_attention_plugin"] == "auto" and f["--context_fmha"] == "enable"
    assert f["--use_paged_context_fmha"] == "enable" and f["--kv_cache_type"] == "paged"
    assert f["--tokens_per_block"] == "64" and f["--max_batch_size"] == "256"
    assert f["--max_input_len"] == "4096" and f["--max_seq_len"] == "8192" and f["--max_num_tokens"] == "8192"
    assert f["--multiple_profiles"] == "enable"
    assert f["--gemm_plugin"] == "disable"  # FP8: TensorRT's FP8 GEMMs beat the plugin
    assert f["--use_fp8_context_fmha"] == "enable"
    assert f["--reduce_fusion"] == "enable"  # TP = 2
    assert f["--workers"] == "2"


def test_bf16_single_gpu_uses_gemm_plugin_and_no_tp_flags():
    f = flags(build_cmd(quantize={"qformat": "none", "export": "trtllm"}, engine={"target": "trtllm"}))
    assert f["--gemm_plugin"] == "auto"
    assert "--use_fp8_context_fmha" not in f and "--reduce_fusion" not in f
    assert f["--workers"] == "1"


def test_single_rank_server_command():
    install = TritonInstall(Path("/opt/tritonserver/bin/tritonserver"))
    cmd = tritonserver_command(install, Path("/repo"), "127.0.0.1", {"http": 1, "grpc": 2, "metrics": 3}, Path("/l"))
    assert cmd[0] == "/opt/tritonserver/bin/tritonserver"
    assert "--http-address=127.0.0.1" in cmd and "--grpc-port=2" in cmd and "--metrics-port=3" in cmd
    assert not any(arg.startswith("--backend-config") for arg in cmd)  # a pod's own /dev/shm: Triton's default names
    named = tritonserver_command(install, Path("/repo"), "127.0.0.1", {"http": 1, "grpc": 2, "metrics": 3}, Path("/l"),
                                 shm_prefix="toolkit_ab12_")
    assert named[-1] == "--backend-config=python,shm-region-prefix-name=toolkit_ab12_"


def test_single_gpu_llmapi_runs_without_mpi():
    install = TritonInstall(Path("tritonserver"))
    cmd = tritonserver_command(install, Path("/repo"), "127.0.0.1", {"http": 1, "grpc": 2, "metrics": 3}, Path("/l"),
                               world_size=1, rank_launcher=TARGETS["llmapi"].rank_launcher)
    assert cmd[0] == "tritonserver" and "mpirun" not in cmd and "trtllm-llmapi-launch" not in cmd
    assert "--disable-auto-complete-config" in cmd


def test_multi_gpu_llmapi_wraps_every_rank_in_trtllm_llmapi_launch():
    install = TritonInstall(Path("tritonserver"))
    cmd = tritonserver_command(install, Path("/repo"), "127.0.0.1", {"http": 1, "grpc": 2, "metrics": 3}, Path("/l"),
                               world_size=2, rank_launcher=TARGETS["llmapi"].rank_launcher)
    ranks = " ".join(cmd).split(" : ")
    assert ranks[0].startswith("mpirun --allow-run-as-root -n 1 trtllm-llmapi-launch tritonserver ")
    assert ranks[1].startswith("-n 1 trtllm-llmapi-launch tritonserver ") and "--load-model=tensorrt_llm" in ranks[1]


def test_multi_gpu_server_launches_one_mpi_rank_per_gpu():
    install = TritonInstall(Path("tritonserver"))
    cmd = tritonserver_command(install, Path("/repo"), "127.0.0.1", {"http": 1, "grpc": 2, "metrics": 3}, Path("/l"),
                               world_size=4)
    assert cmd[:2] == ["mpirun", "--allow-run-as-root"]
    ranks = " ".join(cmd).split(" : ")
    assert len(ranks) == 4
    assert "--http-port=1" in ranks[0] and "--load-model=tensorrt_llm" not in ranks[0]
    for rank, text in enumerate(ranks):
        assert text.split()[-1] == f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"
        if rank:
            assert "--model-control-mode=explicit" in text and "--load-model=tensorrt_llm" in text
            assert "--allow-http=false" in text


def test_nvfp4_engine_uses_the_nvfp4_gemm_plugin_and_fp8_context_attention():
    f = flags(build_cmd(quantize={"qformat": "nvfp4", "kv_cache_dtype": "fp8", "export": "trtllm"},
                        engine={"target": "trtllm"}))
    assert f["--gemm_plugin"] == "nvfp4" and f["--use_fp8_context_fmha"] == "enable"


def run_cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True, timeout=120)


def test_build_dry_run_prints_the_command_before_the_checkpoint_exists(tmp_path):
    result = run_cli("build", "-c", "configs/gpu-llama3-8b-fp8-tp2.yaml", "--dry-run",
                     "--set", f"paths.build_dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("trtllm-build --checkpoint_dir") and "--reduce_fusion enable" in result.stdout
    assert "is not there yet" in result.stderr and "toolkit quantize" in result.stderr
    result = run_cli("build", "-c", "configs/gpu-llama3-8b-fp8-llmapi-tp2.yaml", "--dry-run",
                     "--set", f"paths.build_dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert "tensor_parallel_size: 2" in result.stdout and "capacity_scheduler_policy: GUARANTEED_NO_EVICT" in result.stdout


def test_parallel_quantize_on_a_cpu_config_says_what_to_change():
    result = run_cli("quantize", "-c", "configs/cpu-tiny.yaml", "--export", "trtllm", "--tp", "2")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "GPU target" in result.stderr and "configs/gpu-*.yaml" in result.stderr


def test_the_default_gpu_config_is_the_llmapi_route():
    config = load_config("configs/gpu-llama3-8b-fp8-llmapi-tp2.yaml")
    assert config.engine.target == "llmapi" and config.quantize.export == "hf" and config.parallel.tp == 2


def test_image_and_templates_are_the_versions_the_repository_was_checked_against():
    """docker/Dockerfile, the template check and docs name one TensorRT-LLM / Triton pair (toolkit/repo/upstream.py)."""
    import re

    from toolkit.repo.upstream import CHECKED_TEMPLATE_VERSIONS, TRITON_IMAGE_TAG, TRTLLM_VERSION

    dockerfile = Path("docker/Dockerfile").read_text()
    assert re.search(rf"^ARG TRITON_TAG={re.escape(TRITON_IMAGE_TAG)}$", dockerfile, re.M)
    assert re.search(rf"^ARG TRTLLM_TAG=v{re.escape(TRTLLM_VERSION)}$", dockerfile, re.M)
    assert f"TRTLLM_TEMPLATES_VERSION={TRTLLM_VERSION}" in dockerfile and TRTLLM_VERSION in CHECKED_TEMPLATE_VERSIONS
    # The image's own ModelOpt / transformers / torch (what its TensorRT-LLM pins) are not replaced.
    installs = " ".join(line for line in dockerfile.splitlines() if "pip install" in line or line.startswith("        "))
    assert not re.search(r"nvidia-modelopt|transformers|torch", installs)
    docs = Path("docs/gpu-artifacts.md").read_text()
    assert TRITON_IMAGE_TAG in docs and f"TensorRT-LLM {TRTLLM_VERSION}" in docs


def test_serving_a_repository_written_for_another_target_is_refused(tmp_path):
    import json

    import pytest

    from toolkit.errors import ToolkitError
    from toolkit.serve.server import check_repository_target

    (tmp_path / "manifest.json").write_text(json.dumps({"inputs": {"target": "trtllm"}}))
    with pytest.raises(ToolkitError, match="written for engine.target trtllm but the config says llmapi") as err:
        check_repository_target(tmp_path, "llmapi")
    assert "toolkit repo" in err.value.fix
    check_repository_target(tmp_path, "trtllm")
