"""Triton python model `preprocessing`: text → token ids (TensorRT-LLM backend tensor names).

Runs inside Triton's python backend; imports only numpy, transformers and triton_python_backend_utils.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer


def _optional(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"]["string_value"])
        flag = params.get("add_special_tokens", {}).get("string_value", "true")
        self.add_special_tokens = flag.lower() in ("true", "1", "yes")
        self.eos_id = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else -1

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                query = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy().reshape(-1)[0]
                text = query.decode("utf-8") if isinstance(query, bytes) else str(query)
                ids = self.tokenizer(text, add_special_tokens=self.add_special_tokens).input_ids
                output_len = int(_optional(request, "REQUEST_OUTPUT_LEN", 16))
                end_id = int(_optional(request, "END_ID", self.eos_id))
                # ignore_eos (vLLM / AIPerf convention): generate exactly REQUEST_OUTPUT_LEN tokens.
                if bool(_optional(request, "IGNORE_EOS", False)):
                    end_id = -1
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("INPUT_ID", np.array([ids], dtype=np.int32)),
                    pb_utils.Tensor("REQUEST_INPUT_LEN", np.array([[len(ids)]], dtype=np.int32)),
                    pb_utils.Tensor("REQUEST_OUTPUT_LEN", np.array([[output_len]], dtype=np.int32)),
                    pb_utils.Tensor("OUT_END_ID", np.array([[end_id]], dtype=np.int32)),
                ]))
            except Exception as exc:  # one bad request must not take the others down
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"preprocessing: {exc}")))
        return responses
