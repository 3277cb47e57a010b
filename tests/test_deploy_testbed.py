"""The autoscaling loop on real parts, small: Triton replicas of the tiny CPU deployment behind haproxy,
Prometheus on the emitted rule file, the controller holding the emitted HPA, and a rate ramp through
haproxy. Replicas must be added when the load's metrics cross their targets, removed after the
stabilization window, and no request may fail or be cut off."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from e2e_helpers import tiny_deployment

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def testbed_run(tmp_path_factory, tiny_model_dir):
    missing = [tool for tool in ("haproxy", "prometheus") if not shutil.which(tool)
               and not (tool == "haproxy" and shutil.which("/usr/sbin/haproxy"))]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (make setup-tools: apt-get install prometheus haproxy)")
    from toolkit.deploy.testbed.run import run_testbed

    tmp = tmp_path_factory.mktemp("testbed")
    # 4 sequences of 32 + 96 tokens fill the 32 blocks of 16 tokens: the ramp's peak crosses the targets.
    config, _ = tiny_deployment(
        tmp, tiny_model_dir, name="tb",
        engine={"max_batch_size": 4, "kv_cache_blocks": 32, "tokens_per_block": 16},
        sweep={"input_tokens_mean": 32, "output_tokens": 96, "warmup_requests": 1},
        deploy={"min_replicas": 1, "max_replicas": 2, "kv_occupancy_target": 0.5, "waiting_requests_target": 2,
                "scale_down_window_s": 30, "scale_period_s": 10, "drain_timeout_s": 60})
    # A replica takes ~40 s to load on 2 busy cores: the peak lasts 30 s, the low tail 45 s, so the new
    # replica serves before the 30 s window lets the loop scale back down, under the tail's load.
    out = run_testbed(config, [1, 6, 6, 0.5, 0.5, 0.5], step_s=15, out_root=tmp / "runs", sync_s=1)
    return out, json.loads((out / "summary.json").read_text())


def test_replicas_follow_the_load_up_and_back_down(testbed_run):
    _, summary = testbed_run
    ups = [e for e in summary["events"] if e["to"] > e["from"]]
    downs = [e for e in summary["events"] if e["to"] < e["from"]]
    assert summary["max_ready_replicas"] == 2
    assert ups and downs and downs[-1]["to"] == 1 and ups[0]["t"] < downs[-1]["t"]


def test_scale_up_came_from_a_metric_over_its_target(testbed_run):
    out, summary = testbed_run
    rows = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()]
    first_up = next(row for row in rows if row["desired"] > 1)
    over = {k: v / summary["targets"][k] for k, v in first_up["metrics"].items()}
    assert max(over.values()) > 1.1, over  # past the 10 % tolerance


def test_scale_down_waited_for_the_stabilization_window(testbed_run):
    out, summary = testbed_run
    rows = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()]
    first_down = next(i for i, row in enumerate(rows) if row["desired"] < row["current"])
    last_high = max(row["t"] for row in rows[:first_down] if row["raw_desired"] >= 2)
    assert rows[first_down]["t"] - last_high >= summary["scale_down_window_s"] - 1


def test_no_request_failed_or_was_cut_off(testbed_run):
    _, summary = testbed_run
    assert summary["requests"] > 50
    assert (summary["failed"], summary["cut_off"]) == (0, 0), summary["errors"]
    assert summary["drains"] and all(d["drain_s"] < 60 for d in summary["drains"])


def test_prometheus_ran_the_rule_file_deploy_emitted(testbed_run):
    out, _ = testbed_run
    prometheus = yaml.safe_load((out / "prometheus.yml").read_text())
    assert prometheus["rule_files"] == [str((out / "k8s" / "prometheus" / "rules.yaml").resolve())]
    assert (out / "timeline.png").stat().st_size > 10_000
