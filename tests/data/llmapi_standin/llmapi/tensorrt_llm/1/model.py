"""A stand-in for TensorRT-LLM's llmapi python model, which needs TensorRT-LLM and a GPU.

It has what a client and Triton see of the real one: the tensors of the generated config.pbtxt, the
`triton_config` read from model.yaml beside it, one response per generated token whose text_output is the
whole text so far (the LLM API's CompletionOutput.text), and a final response. It generates words, not a
model's tokens: it exists to test the toolkit's repository, launch and clients up to TensorRT-LLM.
"""

import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

from helpers import scalar


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(os.path.dirname(__file__), "model.yaml")) as f:
            self.triton_config = yaml.safe_load(f)["triton_config"]
        assert self.triton_config["decoupled"], "the stand-in streams: decoupled must be true"

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._serve, args=(request,), daemon=True).start()
        return None

    def _serve(self, request):
        sender = request.get_response_sender()
        prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
        max_tokens = int(scalar(request, "sampling_param_max_tokens", 16))
        streaming = bool(scalar(request, "streaming", False))
        words = [f"w{i}" for i in range(max_tokens)]
        for count in range(1, max_tokens + 1) if streaming else [max_tokens]:
            text = " ".join(words[:count]).encode("utf-8")
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("text_output", np.array([text], dtype=object))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
