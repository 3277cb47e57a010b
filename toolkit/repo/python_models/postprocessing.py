"""Triton python model `postprocessing`: token ids → text (TensorRT-LLM backend tensor names).

In streaming, each call receives only the new tokens of one response and returns their text.
Runs inside Triton's python backend; imports only numpy, transformers and triton_python_backend_utils.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"]["string_value"])
        flag = params.get("skip_special_tokens", {}).get("string_value", "true")
        self.skip_special_tokens = flag.lower() in ("true", "1", "yes")

    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()  # [batch, beam, n]
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()  # [batch, beam]
            texts = []
            for batch_tokens, batch_lengths in zip(tokens, lengths):
                for beam_tokens, length in zip(batch_tokens, batch_lengths):
                    ids = beam_tokens[: int(length)].tolist()
                    texts.append(self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens).encode("utf-8"))
            out = np.array(texts, dtype=object).reshape(tokens.shape[0], -1)
            # Tokens in this response (first beam), so clients need not re-tokenize lossy streamed text.
            counts = lengths[:, :1].astype(np.int32).reshape(tokens.shape[0], 1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", out), pb_utils.Tensor("OUTPUT_TOKEN_COUNT", counts)]))
        return responses
