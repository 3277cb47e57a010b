"""Bad input through the real CLI: one line naming the problem and the fix, non-zero exit, no traceback."""

import json
import os
import socket
import subprocess
import sys

import pytest

from e2e_helpers import tiny_deployment
from toolkit import pipeline
from toolkit.errors import ToolkitError


def run_cli(*args, cwd=None):
    env = os.environ | {"TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def assert_one_line_error(result, *needles):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_missing_config(tmp_path):
    assert_one_line_error(run_cli("quantize", "-c", str(tmp_path / "none.yaml")), "does not exist", "--config")


def test_malformed_config(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nengine: [unclosed\n")
    assert_one_line_error(run_cli("build", "-c", str(bad)), "not valid YAML")


def test_unknown_qformat_via_set(tmp_path):
    result = run_cli("quantize", "--set", "quantize.qformat=nvfp8")
    assert_one_line_error(result, "quantize.qformat")


def test_unknown_qformat_flag_is_a_usage_error():
    result = run_cli("quantize", "--qformat", "nvfp8")
    assert result.returncode == 2 and "nvfp8" in result.stderr and "Traceback" not in result.stderr


def test_checkpoint_without_config_json(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"name: x\nmodel:\n  source: {tmp_path / 'empty'}\npaths:\n  build_dir: {tmp_path / 'b'}\n")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run_cli("quantize", "-c", str(config)), "has no config.json")


def test_trtllm_build_without_tensorrt_llm_says_so(tmp_path, tiny_model_dir):
    config, layout = tiny_deployment(tmp_path, tiny_model_dir, quantize={"export": "trtllm", "qformat": "fp8"},
                                     engine={"target": "trtllm"})
    pipeline.quantize(config, layout)
    dry = pipeline.build(config, layout, dry_run=True)["command"]
    assert dry.startswith("trtllm-build --checkpoint_dir")
    with pytest.raises(ToolkitError, match="TensorRT-LLM \\(trtllm-build\\) is not installed here"):
        pipeline.build(config, layout)


def test_port_in_use(tmp_path, tiny_model_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config, layout = tiny_deployment(tmp_path, tiny_model_dir, server={"http_port": port})
        pipeline.quantize(config, layout)
        pipeline.build(config, layout)
        pipeline.repo(config, layout)
        with pytest.raises(ToolkitError, match=f"http port {port} on 127.0.0.1 is already in use"):
            pipeline.serve(config, layout)


def test_model_that_fails_to_load_shows_the_log_line(tmp_path, tiny_model_dir):
    config, layout = tiny_deployment(tmp_path, tiny_model_dir, name="broken")
    pipeline.quantize(config, layout)
    pipeline.build(config, layout)
    repo_dir, _ = pipeline.repo(config, layout)
    model_py = repo_dir / "postprocessing" / "1" / "model.py"
    model_py.write_text(model_py.read_text().replace("def initialize(self, args):",
                                                     "def initialize(self, args):\n        raise RuntimeError('tokenizer exploded')"))
    with pytest.raises(ToolkitError) as err:
        pipeline.serve(config, layout)
    message = str(err.value)
    assert "tokenizer exploded" in message and "postprocessing" in message and "\n" not in message
    assert not layout.server_state_file.exists()


@pytest.mark.e2e
def test_serve_in_foreground_stops_cleanly_on_ctrl_c(tmp_path, tiny_model_dir):
    import signal
    import time

    config_path = tmp_path / "c.yaml"
    config_path.write_text(
        f"name: fg\nmodel:\n  source: {tiny_model_dir}\n  name: tiny\n"
        f"engine:\n  max_batch_size: 2\n  max_input_len: 64\n  max_seq_len: 128\n  kv_cache_blocks: 16\n"
        f"sweep:\n  input_tokens_mean: 16\n  output_tokens: 8\n"
        f"paths:\n  build_dir: {tmp_path / 'build'}\n  repo_root: {tmp_path / 'repo'}\n  runs_dir: {tmp_path / 'runs'}\n")
    for stage in ("quantize", "build", "repo"):
        assert run_cli(stage, "-c", str(config_path)).returncode == 0
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "toolkit", "serve", "-c", str(config_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    server_pid = None
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "Ctrl-C to stop" in line or not line:
                break
        state = tmp_path / "build" / "servers" / "fg.json"
        assert state.is_file(), "".join(lines)
        server_pid = json.loads(state.read_text())["pid"]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "stopped" in out
        assert not state.exists()
        with pytest.raises(ProcessLookupError):
            os.kill(server_pid, 0)
    finally:  # a failed assertion above must not leave the server (and its stubs) running
        if proc.poll() is None:
            proc.kill()
        state = tmp_path / "build" / "servers" / "fg.json"
        if server_pid is None and state.is_file():
            server_pid = json.loads(state.read_text())["pid"]
        if server_pid is not None:
            try:
                os.killpg(server_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_flag_value_is_blamed_on_the_flag():
    assert_one_line_error(run_cli("sweep", "--concurrency", "0"), "--concurrency 0", "change --concurrency")
    assert_one_line_error(run_cli("sweep", "--request-rate", "-1"), "--rate -1.0")


def test_sweep_where_every_request_fails_exits_non_zero_and_says_why(tmp_path, tiny_model_dir):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "c.yaml"
    config.write_text(f"name: nowhere\nmodel:\n  source: {tiny_model_dir}\n"
                      f"sweep:\n  input_tokens_mean: 16\n  output_tokens: 4\n  request_timeout_s: 10\n"
                      f"paths:\n  build_dir: {tmp_path / 'b'}\n  runs_dir: {tmp_path / 'runs'}\n")
    result = run_cli("sweep", "-c", str(config), "--url", f"127.0.0.1:{port}", "--endpoint-type", "kserve",
                     "--request-count", "2", "--concurrency", "1")
    assert_one_line_error(result, "every request of the warm-up failed", "connection")
    summary = json.loads(next((tmp_path / "runs").glob("*/summary.json")).read_text())
    assert summary["complete"] is False and "every request" in summary["aborted"]


def test_report_out_into_a_missing_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"run": {"config_name": "x"}, "steps": [], "complete": True}))
    result = run_cli("report", str(run), "--out", str(tmp_path / "new" / "deeper" / "report.md"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "new" / "deeper" / "report.md").is_file()
