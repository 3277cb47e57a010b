"""`toolkit deploy k8s` output against real validators: Kubernetes' schemas for three minor versions,
the published CRD schemas, promtool (check + unit tests of every rule), kubectl kustomize, and the
toolkit's own cross-object checks; then mutated manifests, each of which some validator must reject."""

from __future__ import annotations

import copy
import shutil
import subprocess

import pytest
import yaml

from deploy_schemas import validate
from toolkit.config import load_config
from toolkit.deploy import names as n
from toolkit.deploy.lint import lint
from toolkit.deploy.objects import gpus_per_pod
from toolkit.deploy.rules import rule_file
from toolkit.deploy.stage import build_objects, deploy_k8s

PVC = {"kind": "pvc", "claim": "models"}
GPU_CONFIG = "configs/gpu-llama3-8b-fp8-tp2.yaml"

VARIANTS = {  # name → (config, overrides, autoscaler)
    "one-node-hpa": (GPU_CONFIG, {"deploy.artifacts": PVC,
                                  "deploy.node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}, "hpa"),
    "multi-node-keda": (GPU_CONFIG, {"deploy.artifacts": {"kind": "init-container", "image": "registry/artifacts:1"},
                                     "parallel.tp": 8, "parallel.pp": 2}, "keda"),
    "cpu-hpa": ("configs/cpu-tiny.yaml", {"deploy.artifacts": PVC}, "hpa"),
}


def _config(name):
    path, overrides, _ = VARIANTS[name]
    return load_config(path, copy.deepcopy(overrides))


@pytest.fixture(params=sorted(VARIANTS))
def emitted(request, tmp_path):
    config = _config(request.param)
    files, _ = deploy_k8s(config, tmp_path / "k8s", VARIANTS[request.param][2])
    return config, tmp_path / "k8s", files


def _objects(folder):
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    return [yaml.safe_load((folder / name).read_text()) for name in kustomization["resources"]]


def test_every_object_validates_against_kubernetes_and_crd_schemas(emitted):
    _, folder, _ = emitted
    objs = _objects(folder)
    kinds = {o["kind"] for o in objs}
    assert {"Service", "PodDisruptionBudget", "PodMonitor", "PrometheusRule"} <= kinds
    assert kinds & {"Deployment", "LeaderWorkerSet"} and kinds & {"HorizontalPodAutoscaler", "ScaledObject"}
    for obj in objs:
        assert validate(obj) == [], obj["kind"]


def test_kustomize_renders_the_folder(emitted):
    if not shutil.which("kubectl"):
        pytest.skip("kubectl is not installed")
    _, folder, _ = emitted
    out = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, check=True).stdout
    rendered = [d for d in yaml.safe_load_all(out) if d]
    assert len(rendered) == len(_objects(folder))
    assert {d["metadata"]["namespace"] for d in rendered} == {"llm"}


def test_multi_node_serves_monitors_and_scales_the_leader_only():
    objs = {o["kind"]: o for o in build_objects(_config("multi-node-keda"), "keda")}
    lws = objs["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    assert lws["size"] == 2  # 16 GPUs on nodes of 8
    assert objs["Service"]["spec"]["selector"]["role"] == "leader"
    assert objs["PodMonitor"]["spec"]["selector"]["matchLabels"]["role"] == "leader"
    assert objs["ScaledObject"]["spec"]["scaleTargetRef"]["kind"] == "LeaderWorkerSet"
    assert {"ServiceAccount", "Role", "RoleBinding"} <= set(objs)
    leader = lws["leaderTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_disaggregated_graph_validates_against_the_dynamo_crd(tmp_path):
    config = load_config(GPU_CONFIG, {"deploy.artifacts": PVC, "engine.target": "llmapi"})
    files, split = deploy_k8s(config, tmp_path / "k8s", disaggregated=True, requests_per_s=20, ttft_ms=500,
                              itl_ms=30)
    graph = next(o for o in _objects(tmp_path / "k8s") if o["kind"] == "DynamoGraphDeployment")
    assert validate(graph) == []
    services = graph["spec"]["services"]
    assert services["TRTLLMPrefillWorker"]["replicas"] == split.prefill_replicas
    assert services["TRTLLMDecodeWorker"]["replicas"] == split.decode_replicas
    assert "--disaggregation-mode decode" in services["TRTLLMDecodeWorker"]["extraPodSpec"]["mainContainer"]["args"][0]


# ---- promtool -------------------------------------------------------------------------------------

def _promtool():
    if not shutil.which("promtool"):
        pytest.skip("promtool is not installed (make setup-tools: apt-get install prometheus)")
    return "promtool"


def _pod(name):
    return f'model="tensorrt_llm",version="1",pod="{name}",namespace="llm",job="llm/cpu-tiny"'


JOB = 'namespace="llm",job="llm/cpu-tiny"'
KV = n.KV_BLOCKS


def rule_unit_tests() -> dict:
    """Sample series in, each recorded series and alert out, with values worked by hand."""
    series = [
        (f'{KV}{{kv_cache_block_type="used",{_pod("a")}}}', "30x30"),
        (f'{KV}{{kv_cache_block_type="max",{_pod("a")}}}', "100x30"),
        (f'{KV}{{kv_cache_block_type="free",{_pod("a")}}}', "70x30"),
        (f'{KV}{{kv_cache_block_type="used",{_pod("b")}}}', "95x30"),
        (f'{KV}{{kv_cache_block_type="max",{_pod("b")}}}', "100x30"),
        (f'nv_trt_llm_request_metrics{{request_type="waiting",{_pod("a")}}}', "3x30"),
        (f'nv_trt_llm_request_metrics{{request_type="active",{_pod("a")}}}', "8x30"),
        # ... and 2 more queued in Triton for the tokenizer: 5 waiting in all
        (f'nv_inference_pending_request_count{{{_pod("a").replace("tensorrt_llm", "preprocessing")}}}', "2x30"),
        (f'nv_inference_pending_request_count{{{_pod("a")}}}', "0x30"),
        # Per minute: 60 ms queued and 240 ms computing per second of wall time → ratio 0.25; the ensemble's
        # queue time is not the engine's and must not count.
        (f'nv_inference_queue_duration_us{{{_pod("a")}}}', "0+60000x30"),
        (f'nv_inference_compute_infer_duration_us{{{_pod("a")}}}', "0+240000x30"),
        (f'nv_inference_queue_duration_us{{{_pod("a").replace("tensorrt_llm", "ensemble")}}}', "0+999999x30"),
        # TTFT: 80 of 100 requests ≤ 0.1 s, 90 ≤ 0.5 s, all ≤ 1 s → p95 interpolates to 0.75 s.
        (f'toolkit_prefill_time_seconds_bucket{{le="0.1",{_pod("a")}}}', "0+80x30"),
        (f'toolkit_prefill_time_seconds_bucket{{le="0.5",{_pod("a")}}}', "0+90x30"),
        (f'toolkit_prefill_time_seconds_bucket{{le="1",{_pod("a")}}}', "0+100x30"),
        (f'toolkit_prefill_time_seconds_bucket{{le="+Inf",{_pod("a")}}}', "0+100x30"),
        # ITL: 30 s of decode over 1100 tokens of 100 requests (1000 gaps) per minute → 30 ms.
        (f'toolkit_decode_time_seconds_sum{{{_pod("a")}}}', "0+30x30"),
        (f'toolkit_decode_time_seconds_count{{{_pod("a")}}}', "0+100x30"),
        (f'toolkit_generated_tokens_total{{{_pod("a")}}}', "0+1100x30"),
        ('kube_horizontalpodautoscaler_status_current_replicas{horizontalpodautoscaler="cpu-tiny"}', "4x30"),
        ('kube_horizontalpodautoscaler_spec_max_replicas{horizontalpodautoscaler="cpu-tiny"}', "4x30"),
    ]

    def sample(name, labels, value):
        return {"expr": f"round({name}, 0.001)", "eval_time": "10m",
                "exp_samples": [{"labels": f"{{{labels}}}", "value": value}]}

    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series],
        "promql_expr_test": [
            {"expr": n.KV_OCCUPANCY, "eval_time": "10m", "exp_samples": [
                {"labels": f'{n.KV_OCCUPANCY}{{{_pod("a")}}}', "value": 0.3},
                {"labels": f'{n.KV_OCCUPANCY}{{{_pod("b")}}}', "value": 0.95}]},
            {"expr": n.WAITING, "eval_time": "10m", "exp_samples": [
                {"labels": f'{n.WAITING}{{pod="a",{JOB}}}', "value": 5}]},
            sample(n.QUEUE_COMPUTE, f'pod="a",{JOB}', 0.25),
            sample(n.TTFT_P95, JOB, 0.75),
            sample(n.ITL_MEAN, JOB, 0.03),
        ],
        "alert_rule_test": [
            {"eval_time": "4m", "alertname": "LLMKVCacheNearFull", "exp_alerts": []},  # not yet 5 minutes
            {"eval_time": "10m", "alertname": "LLMKVCacheNearFull", "exp_alerts": [
                {"exp_labels": {"severity": "warning", **_labels(_pod("b"))},
                 "exp_annotations": {"summary": "KV cache b is 95% full",
                                     "description": "New requests wait for blocks; add replicas or shorten max_seq_len."}}]},
            {"eval_time": "10m", "alertname": "LLMTTFTSLOBurn", "exp_alerts": [
                {"exp_labels": {"severity": "critical", **_labels(JOB)},
                 "exp_annotations": {"summary": "TTFT p95 750ms is over the 500 ms SLO",
                                     "description": "Queueing or long prompts: check llm:queue_to_compute "
                                                    "and the waiting requests."}}]},
            {"eval_time": "10m", "alertname": "LLMReplicasAtMax", "exp_alerts": []},  # 15 minutes not yet
            {"eval_time": "20m", "alertname": "LLMReplicasAtMax", "exp_alerts": [
                {"exp_labels": {"severity": "warning", "horizontalpodautoscaler": "cpu-tiny"},
                 "exp_annotations": {"summary": "cpu-tiny has run at its maximum replicas for 15 minutes",
                                     "description": "The autoscaler cannot add capacity: raise max_replicas "
                                                    "or the GPU quota."}}]},
        ]}]}


def _labels(text):
    return dict(part.split("=", 1) for part in text.replace('"', "").split(","))


def _write_rules(tmp_path, config=None):
    config = config or load_config("configs/cpu-tiny.yaml", {"deploy.slo_ttft_ms": 500})
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_file(config, "cpu-tiny")))
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(rule_unit_tests(), sort_keys=False))


def _promtool_test(tmp_path):
    return subprocess.run([_promtool(), "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True)


def test_rules_pass_promtool_check(emitted):
    _, folder, _ = emitted
    out = subprocess.run([_promtool(), "check", "rules", str(folder / "prometheus" / "rules.yaml")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 8 rules found" in out.stdout


def test_every_rule_computes_the_worked_values(tmp_path):
    _write_rules(tmp_path)
    out = _promtool_test(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_a_metric_name_typo_in_a_rule_fails_the_unit_tests(tmp_path):
    _write_rules(tmp_path)
    rules = (tmp_path / "rules.yaml").read_text()
    (tmp_path / "rules.yaml").write_text(rules.replace('request_type=~"waiting|"', 'request_type=~"wait|"'))
    out = _promtool_test(tmp_path)
    assert out.returncode != 0 and n.WAITING in out.stdout + out.stderr


# ---- mutations: each wrong manifest is caught --------------------------------------------------------

def _good():
    config = _config("one-node-hpa")
    return config, build_objects(config, "hpa")


def _find(objs, kind):
    return next(o for o in objs if o["kind"] == kind)


def _container(objs):
    return _find(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def _caught(config, objs) -> list[str]:
    return lint(objs, gpus_per_pod(config)) + [e for o in objs for e in validate(o)]


def test_the_good_manifest_passes_every_check():
    config, objs = _good()
    assert _caught(config, objs) == []
    pod = _find(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}  # as the config says


def test_wrong_port_is_caught():
    config, objs = _good()
    _container(objs)["ports"][0]["containerPort"] = 8080
    assert any("not where Triton listens" in f for f in _caught(config, objs))


def test_service_to_a_missing_port_is_caught():
    config, objs = _good()
    _find(objs, "Service")["spec"]["ports"][0]["targetPort"] = "web"
    assert any("no container port" in f for f in _caught(config, objs))


def test_missing_gpu_limit_is_caught():
    config, objs = _good()
    del _container(objs)["resources"]["limits"]["nvidia.com/gpu"]
    assert any("nvidia.com/gpu limits is None" in f for f in _caught(config, objs))


def test_metric_name_typo_in_the_hpa_is_caught():
    config, objs = _good()
    _find(objs, "HorizontalPodAutoscaler")["spec"]["metrics"][0]["pods"]["metric"]["name"] = "llm_kv_cache_ocupancy"
    assert any("not in the custom metrics API" in f for f in _caught(config, objs))


def test_metric_name_typo_in_the_keda_query_is_caught():
    config = _config("multi-node-keda")
    objs = build_objects(config, "keda")
    trigger = _find(objs, "ScaledObject")["spec"]["triggers"][0]["metadata"]
    trigger["query"] = trigger["query"].replace("occupancy", "ocupancy")
    assert any("reads no recorded series" in f for f in _caught(config, objs))


def test_probe_on_a_path_triton_does_not_serve_is_caught():
    config, objs = _good()
    _container(objs)["readinessProbe"]["httpGet"]["path"] = "/healthz"
    assert any("'/healthz', which Triton does not serve" in f for f in _caught(config, objs))


def test_unknown_field_and_wrong_type_are_caught_by_the_schemas():
    config, objs = _good()
    _container(objs)["ports"][0]["containerPort"] = "8000"  # a string where the schema wants an integer
    assert any("k8s 1.35.0" in f for f in _caught(config, objs))
    config, objs = _good()
    _find(objs, "PodMonitor")["spec"]["podMetricEndpoints"] = []  # typo of podMetricsEndpoints
    assert any("podMetricEndpoints" in f for f in _caught(config, objs))
    multi = build_objects(_config("multi-node-keda"), "keda")
    _find(multi, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]["size"] = "two"
    assert any("leaderWorkerTemplate.size" in f for f in validate(_find(multi, "LeaderWorkerSet")))
