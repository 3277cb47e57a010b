"""Shared set-up for tests that run the real pipeline and a real Triton server on the tiny model."""

from __future__ import annotations

import time

import numpy as np

from toolkit import pipeline
from toolkit.config import ArtifactLayout, validate_config


def tiny_deployment(tmp_path, model_dir, name="e2e", **sections):
    raw = {
        "name": name,
        "model": {"source": str(model_dir), "name": "tiny"},
        "quantize": {"qformat": "fp8"},
        "engine": {"max_batch_size": 4, "max_input_len": 96, "max_seq_len": 160, "kv_cache_blocks": 32,
                   "tokens_per_block": 16, "max_num_tokens": 256},
        "sweep": {"concurrencies": [1, 4], "requests_per_step": 8, "warmup_requests": 1,
                  "input_tokens_mean": 32, "output_tokens": 12},
        "paths": {"build_dir": str(tmp_path / "build"), "repo_root": str(tmp_path / "model_repo"),
                  "runs_dir": str(tmp_path / "runs")},
    }
    for key, value in sections.items():
        raw.setdefault(key, {}).update(value)
    config = validate_config(raw)
    return config, ArtifactLayout(config)


def deploy(config, layout):
    """quantize → build → repo → serve; returns the server handle."""
    pipeline.quantize(config, layout)
    pipeline.build(config, layout)
    pipeline.repo(config, layout)
    return pipeline.serve(config, layout)


def grpc_stream(url, text, max_tokens, ignore_eos=True, model="ensemble"):
    """One streaming request over gRPC; returns [(arrival, text, token_count)] and any error."""
    import queue

    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((time.perf_counter(), result, error)))

    def tensor(name, array, dtype):
        t = grpcclient.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        return t

    inputs = [tensor("text_input", np.array([[text]], dtype=object), "BYTES"),
              tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
              tensor("stream", np.array([[True]]), "BOOL"),
              tensor("ignore_eos", np.array([[ignore_eos]]), "BOOL")]
    sent = time.perf_counter()
    client.async_stream_infer(model, inputs, enable_empty_final_response=True)
    chunks, error = [], None
    while True:
        arrival, result, err = responses.get(timeout=60)
        if err is not None:
            error = str(err)
            break
        text_out = result.as_numpy("text_output")
        if text_out is not None:
            chunks.append((arrival, text_out.reshape(-1)[0].decode(), int(result.as_numpy("output_token_count").sum())))
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    return sent, chunks, error
