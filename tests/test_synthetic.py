"""The synthetic streaming model (client calibration) behind a real Triton server."""

import pytest

from toolkit.bench.sweep import Target, run_sweep
from toolkit.config import validate_config
from toolkit.model.tokenizer import load_tokenizer
from toolkit.report.rundir import RunDir
from toolkit.repo.writer import write_synthetic_repository
from toolkit.serve.server import running_server

pytestmark = pytest.mark.e2e


def test_synthetic_model_streams_on_its_schedule(tmp_path, tiny_model_dir):
    repo = write_synthetic_repository(tmp_path / "repo", ttft_ms=60, itl_ms=15, max_batch_size=8)
    config = validate_config({"name": "synthetic", "sweep": {
        "model": "synthetic", "concurrencies": [4], "requests_per_step": 8, "warmup_requests": 0,
        "input_tokens_mean": 8, "output_tokens": 10}})
    with running_server(config, repo, tmp_path, tmp_path / "server.json") as handle:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        run_sweep(config.sweep, Target(handle.grpc_url, handle.http_url), load_tokenizer(tiny_model_dir), run_dir,
                  {"config_name": "synthetic"}, progress=lambda _: None)
    run = RunDir.open(run_dir)
    for record in run.records():
        assert record.ok and len(record.chunk_times) == 10 and record.output_tokens == 10
        # the model sends on an absolute schedule (token k at arrival + ttft + k·itl): nothing arrives early.
        # (A late first token shortens the gaps after it, so the ITL of one request has no lower bound.)
        assert record.ttft >= 0.060
        assert record.e2e_latency >= 0.060 + 9 * 0.015
    step = run.steps[0]
    assert step["metrics"]["inter_token_latency"]["p50"] == pytest.approx(15, rel=0.35)
