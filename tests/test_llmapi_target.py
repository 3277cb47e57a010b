"""The llmapi (engine-free) GPU target up to TensorRT-LLM: its generated repository loads in a real Triton
server, and the sweep's clients and the OpenAI front speak its tensors.

TensorRT-LLM cannot run here, so TensorRT-LLM's own llmapi model.py is replaced by a stand-in
(tests/data/llmapi_standin/) with the same tensors and streaming behaviour (whole text so far in each
response); the repository, config.pbtxt, model.yaml, Triton, the check and the clients are the real ones.
"""

import json
from pathlib import Path

import pytest
import requests

from test_repo import llmapi_engine
from toolkit.bench.clients import serves_llmapi_model
from toolkit.bench.records import read_records
from toolkit.bench.sweep import Target, run_sweep
from toolkit.config import validate_config
from toolkit.model.tokenizer import load_tokenizer
from toolkit.repo.writer import write_repository
from toolkit.serve import install
from toolkit.serve.install import cpu_triton
from toolkit.serve.server import running_server

pytestmark = pytest.mark.e2e
STANDIN = Path(__file__).parent / "data" / "llmapi_standin"


@pytest.fixture(scope="module")
def llmapi_server(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("llmapi")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRTLLM_TRITON_MODELS", str(STANDIN))
        mp.setenv("TRTLLM_TEMPLATES_VERSION", "1.1.0")
        _, engine_dir = llmapi_engine(tmp, tiny_model_dir)
        repo = write_repository(validate_config({"name": "t", "engine": {"target": "llmapi"}}), engine_dir, tmp / "repo")
    config = validate_config({"name": "llmapi", "engine": {"target": "llmapi"}, "server": {"openai": True},
                              "model": {"name": "tiny"},
                              "sweep": {"concurrencies": [2], "requests_per_step": 4, "warmup_requests": 0,
                                        "input_tokens_mean": 8, "output_tokens": 6}})
    with pytest.MonkeyPatch.context() as mp:
        # The GPU target's launch (one process at TP 1) with the CPU build of tritonserver (pytriton's) in place
        # of the image's, which has no python backend here.
        mp.setattr(install, "gpu_triton", lambda explicit: cpu_triton(tmp))
        with running_server(config, repo, tmp, tmp / "server.json") as handle:
            yield config, handle, tmp


@pytest.mark.parametrize("endpoint", ["triton-grpc", "triton-http"])
def test_sweep_speaks_the_llmapi_models_tensors(llmapi_server, tiny_model_dir, tmp_path, endpoint):
    config, handle, _ = llmapi_server
    url = handle.grpc_url if endpoint == "triton-grpc" else handle.http_url
    assert serves_llmapi_model(endpoint, url, None)  # so make_client picks the llmapi client
    sweep = config.sweep.model_copy(update={"endpoint": endpoint})
    run_sweep(sweep, Target(handle.grpc_url, handle.http_url), load_tokenizer(tiny_model_dir), tmp_path,
              {"config_name": "llmapi"}, progress=lambda _: None)
    records = read_records(tmp_path / "records.jsonl")
    assert len(records) == 4 and all(r.ok for r in records)
    for record in records:
        assert len(record.chunk_times) == 6  # one response per token
        assert record.output_text == "w0 w1 w2 w3 w4 w5"  # the last cumulative text, not the concatenation


def test_openai_front_over_the_llmapi_model(llmapi_server):
    _, handle, _ = llmapi_server
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    with requests.post(f"{handle.openai_url}/v1/completions", json=body, stream=True, timeout=30) as answer:
        assert answer.status_code == 200
        events = [json.loads(line[5:]) for line in answer.iter_lines(decode_unicode=True)
                  if line.startswith("data:") and line != "data: [DONE]"]
    text = "".join(c["text"] for e in events for c in e.get("choices", []))
    assert text == "w0 w1 w2 w3 w4"  # deltas of the model's whole-text responses
    assert events[-1]["usage"]["completion_tokens"] == 5
