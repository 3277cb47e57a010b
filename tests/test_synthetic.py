"""The synthetic streaming model (client calibration) behind a real Triton server, on both backends."""

import pytest

from toolkit.bench.clients import TritonGrpcClient
from toolkit.bench.records import RequestRecord
from toolkit.bench.sweep import Target, run_sweep
from toolkit.config import validate_config
from toolkit.errors import ToolkitError
from toolkit.model.tokenizer import load_tokenizer
from toolkit.bench.rundir import RunDir
from toolkit import compile_native
from toolkit.repo import native
from toolkit.repo.writer import write_synthetic_repository
from toolkit.serve.server import running_server


NO_COMPILER = pytest.mark.skipif(native.compiler() is None, reason="no C++ compiler here to build the native backend")
AVAILABLE_BACKEND = "native" if native.compiler() else "python"


def _sweep_config(**sweep):
    return validate_config({"name": "synthetic", "sweep": {
        "model": "synthetic", "concurrencies": [4], "requests_per_step": 8, "warmup_requests": 0,
        "input_tokens_mean": 8, "output_tokens": 10, **sweep}})


@pytest.mark.e2e
@pytest.mark.parametrize("backend", [pytest.param("native", marks=NO_COMPILER), "python"])
def test_synthetic_model_streams_on_its_schedule(tmp_path, tiny_model_dir, backend):
    repo = write_synthetic_repository(tmp_path / "repo", ttft_ms=60, itl_ms=15, max_batch_size=8, backend=backend)
    config = _sweep_config(step_warmup_requests=4)
    with running_server(config, repo, tmp_path, tmp_path / "server.json") as handle:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        run_sweep(config.sweep, Target(handle.grpc_url, handle.http_url), load_tokenizer(tiny_model_dir), run_dir,
                  {"config_name": "synthetic"}, progress=lambda _: None)
    run = RunDir.open(run_dir)
    records = run.records()
    # step warm-up: the first 4 requests of the step are sent under its load, recorded, and not measured
    assert len(records) == 12
    assert [r.warmup for r in sorted(records, key=lambda r: r.request_index)] == [True] * 4 + [False] * 8
    for record in records:
        assert record.ok and len(record.chunk_times) == 10 and record.output_tokens == 10
        # the model sends on an absolute schedule (token k at arrival + ttft + k·itl): nothing arrives early.
        # (A late first token shortens the gaps after it, so the ITL of one request has no lower bound.)
        assert record.ttft >= 0.060
        assert record.e2e_latency >= 0.060 + 9 * 0.015
    step = run.steps[0]
    assert step["request_count"] == 8 and step["error_count"] == 0
    assert step["metrics"]["inter_token_latency"]["p50"] == pytest.approx(15, rel=0.35)


@pytest.mark.e2e
def test_grpc_client_names_a_server_side_error(tmp_path, tiny_model_dir):
    import asyncio

    repo = write_synthetic_repository(tmp_path / "repo", ttft_ms=10, itl_ms=5, max_batch_size=8,
                                      backend=AVAILABLE_BACKEND)
    config = _sweep_config()
    with running_server(config, repo, tmp_path, tmp_path / "server.json") as handle:
        async def ask(model):
            client = TritonGrpcClient(handle.grpc_url, model)
            record = RequestRecord(0, "s", 0.0, 8, 3)
            try:
                await client.generate("hello", 3, record)
                again = RequestRecord(1, "s", 0.0, 8, 3)
                await client.generate("hello", 3, again)  # on a stream reused from the pool
            finally:
                await client.close()
            return record, again

        bad, bad_again = asyncio.run(ask("no_such_model"))
        good, good_again = asyncio.run(ask("synthetic"))
    assert bad.error_kind == "server_error" and "no_such_model" in bad.error and bad.end_time is None
    assert bad_again.error_kind == "server_error"
    for record in (good, good_again):
        assert record.ok and record.server_output_tokens == 3 and record.output_text == " tok" * 3


def test_synthetic_backend_choice_is_checked(tmp_path):
    with pytest.raises(ToolkitError, match="unknown synthetic backend"):
        write_synthetic_repository(tmp_path / "repo", 10, 5, backend="cuda")


def test_native_backend_without_a_compiler_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(compile_native, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(native, "compiler", lambda: None)
    with pytest.raises(ToolkitError, match="no C\\+\\+ compiler") as info:
        write_synthetic_repository(tmp_path / "repo", 10, 5)
    assert "python" in str(info.value)


@NO_COMPILER
def test_native_backend_is_compiled_once_and_exports_the_backend_api(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setattr(compile_native, "CACHE_DIR", tmp_path / "cache")
    library = native.build_backend("toolkit_synthetic", "synthetic_backend.cc")
    assert library.name == "libtriton_toolkit_synthetic.so"
    assert native.build_backend("toolkit_synthetic", "synthetic_backend.cc") == library  # cached
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
    for name in ("TRITONBACKEND_Initialize", "TRITONBACKEND_ModelInitialize", "TRITONBACKEND_ModelFinalize",
                 "TRITONBACKEND_ModelInstanceExecute"):
        assert name in symbols
