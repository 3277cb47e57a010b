"""The GPU-side command lines, checked up to the boundary (no TensorRT-LLM or GPU here)."""

from pathlib import Path

from toolkit.engine.engine_config import EngineConfig
from toolkit.engine.trtllm import trtllm_build_command
from toolkit.config import load_config, validate_config
from toolkit.serve.install import TritonInstall
from toolkit.serve.server import tritonserver_command


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


def test_single_gpu_llmapi_runs_without_mpi():
    install = TritonInstall(Path("tritonserver"))
    cmd = tritonserver_command(install, Path("/repo"), "127.0.0.1", {"http": 1, "grpc": 2, "metrics": 3}, Path("/l"),
                               world_size=1, llmapi=True)
    assert cmd[0] == "tritonserver" and "mpirun" not in cmd and "trtllm-llmapi-launch" not in cmd
    assert "--disable-auto-complete-config" in cmd


def test_multi_gpu_llmapi_wraps_every_rank_in_trtllm_llmapi_launch():
    install = TritonInstall(Path("tritonserver"))
    cmd = tritonserver_command(install, Path("/repo"), "127.0.0.1", {"http": 1, "grpc": 2, "metrics": 3}, Path("/l"),
                               world_size=2, llmapi=True)
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
