"""engine.stream_interval through a real Triton: each stream's tokens arrive at its first step, every N-th and
its last, the detokenized text whole (the ensemble's postprocessing takes several tokens a response)."""

import pytest

from e2e_helpers import deploy, grpc_stream, tiny_deployment
from toolkit import pipeline

pytestmark = pytest.mark.e2e


def test_stream_interval_sends_fewer_responses_with_every_token(tmp_path, tiny_model_dir):
    prompt = "Decode emits one token per forward pass."
    config, layout = tiny_deployment(tmp_path, tiny_model_dir, name="interval",
                                     engine={"dtype": "float32", "stream_interval": 3})
    handle = deploy(config, layout)
    try:
        _, chunks, error = grpc_stream(handle.grpc_url, prompt, 10)
    finally:
        pipeline.stop(layout)
    assert error is None
    # steps 1 | 2-3 | 4-6 | 7-9 | 10 (the end): TensorRT-LLM's stream_interval rule
    assert [count for _, _, count in chunks] == [1, 2, 3, 3, 1]
    assert "".join(text for _, text, _ in chunks).strip()
