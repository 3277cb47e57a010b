"""`toolkit deploy`: the HPA algorithm the testbed applies (against the documented examples), the
planner's prefill/decode split, and bad input that must fail with one line and write nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from toolkit.config import load_config
from toolkit.deploy import names as n
from toolkit.deploy.autoscale import hpa, quantity
from toolkit.deploy.hpa import Autoscaler, Policy, Rules, desired_for_metric
from toolkit.errors import ToolkitError
from toolkit.plan.disagg import max_prefill_utilization, split

# ---- the HPA's algorithm (kubernetes.io/docs/concepts/workloads/autoscaling/horizontal-pod-autoscale) ----


def test_desired_replicas_is_ceil_of_current_times_ratio():
    # "if the current metric value is 200m, and the desired value is 100m, the number of replicas will be doubled"
    assert desired_for_metric(3, 0.2, 0.1) == 6
    # "If the current value is instead 50m, you'll halve the number of replicas"
    assert desired_for_metric(4, 0.05, 0.1) == 2
    assert desired_for_metric(3, 0.125, 0.1) == 4  # ceil(3.75)


def test_within_the_tolerance_nothing_changes():
    assert desired_for_metric(5, 0.109, 0.1) == 5  # ratio 1.09 ≤ 1 + 0.1
    assert desired_for_metric(5, 0.091, 0.1) == 5
    assert desired_for_metric(5, 0.111, 0.1) == 6  # ratio 1.11: ceil(5.55)


def test_the_metric_wanting_most_replicas_wins():
    scaler = Autoscaler(1, 10, {"kv": 0.5, "waiting": 4}, up=Rules(0), down=Rules(0))
    decision = scaler.decide(0, 2, {"kv": 0.75, "waiting": 12})  # kv → 3, waiting → 6
    assert decision.replicas == 6 and "waiting" in decision.reason
    assert scaler.decide(1, 6, {"waiting": 2}).replicas == 3  # a missing metric does not vote


def test_min_and_max_replicas_bound_the_decision():
    scaler = Autoscaler(2, 4, {"kv": 0.5}, up=Rules(0), down=Rules(0))
    assert scaler.decide(0, 2, {"kv": 5.0}).replicas == 4
    assert scaler.decide(1, 4, {"kv": 0.0}).replicas == 2


def test_scale_down_waits_for_the_stabilization_window():
    # "the highest recommendation from the last 300 seconds is used" (scaleDown default window)
    scaler = Autoscaler(1, 10, {"kv": 0.5}, up=Rules(0), down=Rules(300, (Policy("Percent", 100, 15),)))
    assert scaler.decide(0, 4, {"kv": 0.5}).replicas == 4
    assert scaler.decide(15, 4, {"kv": 0.1}).replicas == 4  # raw 1, but 4 was recommended within 300 s
    assert scaler.decide(299, 4, {"kv": 0.1}).replicas == 4
    decision = scaler.decide(301, 4, {"kv": 0.1})
    assert (decision.raw, decision.replicas) == (1, 1)


def test_scale_up_window_takes_the_lowest_recent_recommendation():
    scaler = Autoscaler(1, 10, {"kv": 0.5}, up=Rules(60, (Policy("Pods", 10, 15),)), down=Rules(0))
    assert scaler.decide(0, 2, {"kv": 0.5}).replicas == 2
    assert scaler.decide(10, 2, {"kv": 1.0}).replicas == 2  # 2 was recommended within the last 60 s
    assert scaler.decide(61, 2, {"kv": 1.0}).replicas == 4


def test_scale_down_policies_documented_example():
    # Pods 4 / Percent 10 per 60 s, selectPolicy Max, 80 replicas going to 10: "during the first step 8
    # replicas will be reduced. In the next iteration when the number of replicas is 72, 10% of the pods is
    # 7.2 but the number is rounded up to 8" — and below 40 replicas the Pods policy (4) allows more.
    scaler = Autoscaler(1, 100, {"kv": 1.0}, up=Rules(0),
                        down=Rules(0, (Policy("Pods", 4, 60), Policy("Percent", 10, 60))))
    assert scaler.decide(0, 80, {"kv": 0.125}).replicas == 72
    assert scaler.decide(30, 72, {"kv": 0.125}).replicas == 72  # same period: no more this minute
    assert scaler.decide(61, 72, {"kv": 0.125}).replicas == 64
    assert scaler.decide(200, 30, {"kv": 0.1}).replicas == 26


def test_scale_up_policies_take_the_most_permissive():
    # The default scale-up: 4 pods or 100 % per 15 s, whichever is more.
    scaler = Autoscaler(1, 100, {"kv": 0.1}, down=Rules(0))
    assert scaler.decide(0, 2, {"kv": 1.0}).replicas == 6  # max(2 + 4, 2 × 2)
    assert scaler.decide(20, 10, {"kv": 1.0}).replicas == 20  # max(14, 20)


def test_the_autoscaler_reads_the_emitted_hpa():
    config = load_config("configs/cpu-tiny.yaml", {"deploy.artifacts": {"kind": "pvc", "claim": "m"},
                                                   "deploy.kv_occupancy_target": 0.6, "deploy.scale_down_window_s": 30,
                                                   "deploy.scale_period_s": 10, "deploy.max_replicas": 3})
    scaler = Autoscaler.from_hpa(hpa(config), {v: k for k, v in n.ADAPTER_METRICS.items()})
    assert scaler.targets == {n.KV_OCCUPANCY: 0.6, n.WAITING: 4.0}
    assert (scaler.min_replicas, scaler.max_replicas, scaler.down.window_s) == (1, 3, 30)
    assert scaler.down.policies == (Policy("Pods", 1, 10),)
    assert quantity(0.6) == "600m" and quantity(4.0) == "4"


# ---- the disaggregated split --------------------------------------------------------------------------

def _plan(prefill_s=0.1, osl=100, steps=((1, 0.010), (8, 0.012), (32, 0.020), (64, 0.030))):
    return {"deployment": {"osl": osl},
            "roofline": {"prefill_expected_s": prefill_s,
                         "decode_by_batch": [{"batch": b, "step_seconds": s, "bound": "memory"} for b, s in steps]}}


def test_prefill_utilization_cap_meets_the_ttft_objective():
    rho = max_prefill_utilization(0.1, 0.3)  # headroom 2 → ρ ≤ 4/5
    assert rho == pytest.approx(0.8)
    assert 0.1 + rho * 0.1 / (2 * (1 - rho)) == pytest.approx(0.3)


def test_split_counts_replicas_per_phase():
    result = split(_plan(), requests_per_s=20, ttft_slo_s=0.3, itl_slo_s=0.025)
    # prefill: 20 req/s × 0.1 s = 2 busy replicas at ρ ≤ 0.8 → 3; decode: batch 32 (20 ms ≤ 25 ms) serves
    # 32 / (100 × 0.020) = 16 req/s → 2 replicas.
    assert (result.prefill_replicas, result.decode_replicas, result.decode_batch) == (3, 2, 32)
    assert result.prefill_utilization == pytest.approx(2 / 3)
    assert result.expected_ttft_s <= 0.3


def test_an_objective_no_replica_count_meets_is_refused():
    with pytest.raises(ToolkitError, match="over the TTFT objective"):
        split(_plan(prefill_s=0.5), 1, ttft_slo_s=0.3, itl_slo_s=0.05)
    with pytest.raises(ToolkitError, match="over the ITL objective"):
        split(_plan(), 1, ttft_slo_s=1, itl_slo_s=0.005)


# ---- bad input: one line, non-zero exit, nothing written --------------------------------------------

PVC = ["--set", "deploy.artifacts.kind=pvc", "--set", "deploy.artifacts.claim=models"]
GPU = ["-c", "configs/gpu-llama3-8b-fp8-tp2.yaml"]


@pytest.mark.parametrize("args, message", [
    (["-c", "configs/cpu-tiny.yaml"], "deploy.artifacts is not set"),
    (GPU + PVC + ["--set", "plan.gpu=h900"], "unknown GPU 'h900'"),
    (GPU + PVC + ["--set", "parallel.tp=12"], "does not fill whole nodes of 8 GPUs"),
    (GPU + PVC + ["--set", "engine.target=llmapi", "--disaggregated", "--rate", "10", "--slo", "ttft=1ms,itl=30ms"],
     "over the TTFT objective"),
    (GPU + PVC + ["--disaggregated", "--rate", "10", "--slo", "ttft=500ms,itl=30ms"], "needs engine.target llmapi"),
    (GPU + ["--set", "deploy.artifacts.kind=pvc"], "needs artifacts.claim"),
])
def test_bad_input_fails_with_one_line_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "k8s"
    proc = subprocess.run([sys.executable, "-m", "toolkit", "deploy", "k8s", *args, "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_unwritable_out_fails_with_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = subprocess.run([sys.executable, "-m", "toolkit", "deploy", "k8s", "-c", "configs/cpu-tiny.yaml", *PVC,
                           "--out", str(blocker / "k8s")], capture_output=True, text=True)
    assert proc.returncode == 1 and "cannot write to" in proc.stderr and "--out" in proc.stderr


def test_a_rerun_replaces_the_folder_whole(tmp_path):
    from toolkit.deploy.stage import deploy_k8s

    config = load_config("configs/cpu-tiny.yaml", {"deploy.artifacts": {"kind": "pvc", "claim": "m"}})
    deploy_k8s(config, tmp_path / "k8s", "keda")
    files, _ = deploy_k8s(config, tmp_path / "k8s", "hpa")
    assert not list((tmp_path / "k8s").glob("scaledobject-*"))  # the KEDA object of the first run is gone
    assert sorted(p.name for p in (tmp_path / "k8s").iterdir()) == sorted(
        {f.relative_to(tmp_path / "k8s").parts[0] for f in files})
    assert [p.name for p in tmp_path.iterdir()] == ["k8s"]  # no staging folder left behind


def test_the_rules_read_names_the_cpu_engine_exports():
    from toolkit.engine.runtime.metrics import TOOLKIT_METRICS, TRTLLM_FAMILIES

    families = {f.name: f for f in TRTLLM_FAMILIES}
    for family, label, values in [(n.KV_BLOCKS, n.KV_BLOCK_LABEL, ("used", "max")),
                                  (n.REQUESTS, n.REQUEST_LABEL, ("waiting", "active")),
                                  (n.INFLIGHT, n.INFLIGHT_LABEL, ())]:
        assert families[family].label == label and set(values) <= set(families[family].values)
    toolkit_names = {name for name, _, _ in TOOLKIT_METRICS}
    assert {n.PREFILL_SECONDS, n.DECODE_SECONDS, n.GENERATED_TOKENS} <= toolkit_names


def test_the_pod_launches_triton_as_toolkit_serve_does():
    from toolkit.deploy.launch import leader_script, server_command

    base = {"deploy.artifacts": {"kind": "pvc", "claim": "m"}}
    one = server_command(load_config("configs/cpu-tiny.yaml", base))
    assert one.startswith("tritonserver --model-repository=/work/model_repo/cpu-tiny") and "--http-port=8000" in one
    assert "--log-file" not in one and "mpirun" not in one
    tp2 = server_command(load_config(GPU[1], base))
    assert tp2.startswith("mpirun --allow-run-as-root -n 1 tritonserver") and tp2.count("tritonserver") == 2
    llmapi = server_command(load_config(GPU[1], {**base, "engine.target": "llmapi"}))
    assert llmapi.count("trtllm-llmapi-launch tritonserver") == 2
    multi = load_config(GPU[1], {**base, "parallel.tp": 8, "parallel.pp": 2})
    script = leader_script(multi, 2)
    assert 'mpirun --allow-run-as-root --host "$HOSTS" -mca plm_rsh_agent /opt/deploy/kubessh' in script
    assert script.count("tritonserver") == 16 and "want=2" in script


def test_plan_prints_the_split_for_a_target_load(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "toolkit", "plan", *GPU, "--out", str(tmp_path), "--split-rate", "20",
                           "--slo", "ttft=500ms,itl=30ms"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "disaggregated at 20 requests/s" in proc.stdout and "prefill replica(s)" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "toolkit", "plan", *GPU, "--out", str(tmp_path), "--split-rate", "20",
                           "--slo", "ttft=1ms,itl=30ms"], capture_output=True, text=True)
    assert proc.returncode == 1 and "no replica count meets it" in proc.stderr


# ---- the testbed's pure parts -------------------------------------------------------------------------

def test_haproxy_balances_on_least_connections_with_triton_health_checks(tmp_path):
    from toolkit.deploy.testbed.haproxy import config_text

    text = config_text(8080, tmp_path / "s.sock", 3)
    assert "balance leastconn" in text and "option httpchk GET /v2/health/ready" in text
    assert "bind 127.0.0.1:8080" in text and text.count("check disabled") == 3


def test_prometheus_runs_the_given_rule_file(tmp_path):
    from toolkit.deploy.testbed.prometheus import JOB, config_dict

    cfg = config_dict(tmp_path / "rules.yaml", tmp_path / "targets.json", 2)
    assert cfg["rule_files"] == [str(tmp_path / "rules.yaml")]
    assert cfg["scrape_configs"][0]["job_name"] == JOB and cfg["global"]["evaluation_interval"] == "2s"


def test_the_testbed_reads_outcomes_and_steps_from_its_files():
    from toolkit.deploy.testbed.analysis import ramp_steps, request_outcomes, scaling_events

    def rec(step, send, end, tokens=8, error=None, warmup=False):
        return {"step": step, "send_time": send, "end_time": end, "output_tokens": tokens,
                "requested_output_tokens": 8, "error": error, "warmup": warmup}

    records = [rec("warmup", 0, 1, warmup=True), rec("rate_1", 1, 3), rec("rate_1", 2, 4), rec("rate_6", 5, 9),
               rec("rate_6", 6, 7, tokens=3), rec("rate_1", 10, 12, error="connection reset"), rec("rate_1", 11, 13)]
    assert ramp_steps(records) == [(1, 4, 1.0), (5, 9, 6.0), (10, 13, 1.0)]  # a ramp may repeat a rate
    outcomes = request_outcomes(records)
    assert (outcomes["requests"], outcomes["failed"], outcomes["cut_off"]) == (6, 1, 1)
    timeline = [{"t": 100, "replicas": 1, "metrics": {}}, {"t": 102, "replicas": 2, "metrics": {"kv": 0.9}},
                {"t": 104, "replicas": 2, "metrics": {}}, {"t": 110, "replicas": 1, "metrics": {"kv": 0.1}}]
    assert [(e["t"], e["from"], e["to"]) for e in scaling_events(timeline)] == [(2, 1, 2), (10, 2, 1)]


def test_the_prestop_drain_holds_while_requests_wait_for_admission(tmp_path):
    """The pod's preStop script, against a metrics endpoint: it holds while a request is anywhere in the
    replica, queued in Triton for the tokenizer (`nv_inference_pending_request_count`), queued for the batch
    (`waiting`) or admitted (`active`), and exits once all read 0. A scrape that times out (a busy replica)
    is asked again, not taken for a server that is gone: it ended CI's drain test early once."""
    import http.server
    import threading
    import time

    from toolkit.deploy.launch import drain_script

    served = {"active": 0, "waiting": 0}
    pending = {"ensemble": 0, "preprocessing": 3, "tensorrt_llm": 0}
    stall_s = [1.0]  # longer than the script's scrape timeout below

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(stall_s[0])
            body = "".join(f'nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="{kind}",version="1"}} '
                           f"{value}\n" for kind, value in {**served, "max": 4}.items())
            body += "".join(f'nv_inference_pending_request_count{{model="{model}",version="1"}} {value}\n'
                            for model, value in pending.items())
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    script = tmp_path / "drain.py"
    script.write_text(drain_script(server.server_address[1], endpoint_settle_s=0, scrape_timeout_s=0.3))
    try:
        started = time.time()
        drain = subprocess.Popen([sys.executable, str(script), "30"], stderr=subprocess.PIPE, text=True)
        for before_the_engine, in_the_engine in ((3, 0), (0, 2)):  # tokenizer's queue, then the batch's
            pending["preprocessing"], served["waiting"] = before_the_engine, in_the_engine
            time.sleep(2.5)
            assert drain.poll() is None  # requests queued, none admitted (or no answer in time): still draining
            stall_s[0] = 0.0
        served["waiting"] = 0
        assert drain.wait(10) == 0 and time.time() - started < 15
        assert drain.stderr.read().strip() == "preStop drain: no request in flight"
    finally:
        server.shutdown()
