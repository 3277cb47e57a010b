"""`--disaggregated`: an NVIDIA Dynamo DynamoGraphDeployment (nvidia.com/v1alpha1) with the planner's
prefill/decode split. Dynamo's TensorRT-LLM workers run the LLM API, so the config's target is llmapi;
the worker reads the build stage's LLM-API options as its engine arguments. Pure dict."""

from __future__ import annotations

import shlex

from toolkit.config import DeploymentConfig
from toolkit.deploy.launch import pod_layout
from toolkit.deploy.objects import artifact_volumes, gpus_per_pod
from toolkit.engine.llmapi import LLMAPI_CONFIG_FILE
from toolkit.plan.disagg import DisaggSplit

DYNAMO_API = "nvidia.com/v1alpha1"


def _worker(config: DeploymentConfig, mode: str, replicas: int, namespace: str) -> dict:
    layout = pod_layout(config)
    command = ["python3", "-m", "dynamo.trtllm", "--model-path", str(layout.checkpoint_dir),
               "--served-model-name", config.model.display_name,
               "--extra-engine-args", str(layout.engine_dir / LLMAPI_CONFIG_FILE),
               "--disaggregation-mode", mode]
    volumes, mounts, inits = artifact_volumes(config)
    gpus = str(gpus_per_pod(config))  # the DGD's own resources block names GPUs `gpu`
    pod = {"volumes": volumes,
           "mainContainer": {"image": config.deploy.dynamo_image, "command": ["/bin/sh", "-c"],
                             "args": [shlex.join(command)], "volumeMounts": mounts}}
    if inits:
        pod["initContainers"] = inits
    return {"dynamoNamespace": namespace, "componentType": "worker", "replicas": replicas,
            "resources": {"requests": {"gpu": gpus}, "limits": {"gpu": gpus}}, "extraPodSpec": pod}


def graph_deployment(config: DeploymentConfig, plan_split: DisaggSplit) -> dict:
    ns = config.name
    return {"apiVersion": DYNAMO_API, "kind": "DynamoGraphDeployment",
            "metadata": {"name": config.name, "namespace": config.deploy.namespace},
            "spec": {"backendFramework": "trtllm", "services": {
                "Frontend": {"dynamoNamespace": ns, "componentType": "frontend", "replicas": 1,
                             "extraPodSpec": {"mainContainer": {"image": config.deploy.dynamo_image}}},
                "TRTLLMPrefillWorker": _worker(config, "prefill", plan_split.prefill_replicas, ns),
                "TRTLLMDecodeWorker": _worker(config, "decode", plan_split.decode_replicas, ns)}}}

