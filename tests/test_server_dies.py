"""A server that dies mid-sweep: the step ends with the records so far saved, the failure counted and
named, a partial summary, report and exports, and an error (non-zero exit from the CLI)."""

import os
import signal
import threading

import pytest

from e2e_helpers import deploy, tiny_deployment
from toolkit import pipeline
from toolkit.bench.records import read_records
from toolkit.bench.sweep import SweepAborted
from toolkit.bench.rundir import RunDir

pytestmark = pytest.mark.e2e


def test_sweep_survives_a_dying_server(tmp_path, tiny_model_dir):
    config, layout = tiny_deployment(tmp_path, tiny_model_dir, name="dies",
                                     sweep={"concurrencies": [2, 4], "requests_per_step": 400, "output_tokens": 40,
                                            "warmup_requests": 0, "request_timeout_s": 20})
    handle = deploy(config, layout)
    killer = threading.Timer(2.0, lambda: os.killpg(handle.pid, signal.SIGKILL))
    killer.start()
    try:
        with pytest.raises(SweepAborted, match="stopped answering during concurrency_2") as err:
            pipeline.sweep(config, layout, progress=lambda _: None)
    finally:
        killer.cancel()
        pipeline.stop(layout)  # as a user would after it died: ends any stub left, removes its shared memory
    assert "records so far are saved" in str(err.value)
    run_dir = sorted(layout.runs_dir.iterdir())[-1]
    records = read_records(run_dir / "records.jsonl")
    finished = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    assert finished and failed
    assert {r.error_kind for r in failed} <= {"connection", "server_error", "timeout"}
    run = RunDir.open(run_dir)
    assert run.summary["complete"] is False and "stopped answering" in run.summary["aborted"]
    step = run.steps[0]
    assert step["request_count"] == len(finished) and step["error_count"] == len(failed)
    report = (run_dir / "report.md").read_text()  # written by the failing sweep itself
    assert "Partial run" in report and (run_dir / "report.html").is_file()
    assert (run_dir / "exports" / "concurrency_2" / "profile_export_genai_perf.json").is_file()
