"""Triton python model `tensorrt_llm_bls`: preprocessing → tensorrt_llm → postprocessing as
Business Logic Scripting, an alternative to the ensemble with the same inputs and outputs.

What it adds over the ensemble: incremental detokenization that keeps characters whole
(incremental_text.py: a few tokens of left context, a held-back partial UTF-8 character; the ensemble
decodes each streamed token alone, which can split multi-byte characters), at a constant cost per token:
the whole sequence is never re-decoded.
Each request runs on its own thread so that requests reach the engine concurrently (in-flight batching).

Runs inside Triton's python backend; imports only numpy, triton_python_backend_utils and its sibling
incremental_text.py.
"""

import threading

import numpy as np
import triton_python_backend_utils as pb_utils
from incremental_text import IncrementalText



_SAMPLING = (("runtime_top_k", "top_k", np.int32), ("runtime_top_p", "top_p", np.float32),
             ("temperature", "temperature", np.float32), ("seed", "seed", np.uint64),
             ("beam_width", "beam_width", np.int32))


def _value(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


def _tensor(name, value, dtype):
    return pb_utils.Tensor(name, np.array([[value]], dtype=dtype))


def _raise_if_error(response, step):
    if response.has_error():
        raise RuntimeError(f"{step}: {response.error().message()}")


class TritonPythonModel:
    def initialize(self, args):
        import json

        self.threads = set()
        params = json.loads(args["model_config"]).get("parameters", {})
        self.engine_model = params.get("tensorrt_llm_model_name", {}).get("string_value", "tensorrt_llm")
        self.postprocessing_model = "postprocessing"

    def execute(self, requests):
        for request in requests:
            thread = threading.Thread(target=self._serve, args=(request,), daemon=True)
            self.threads.add(thread)
            thread.start()
        return None

    def _serve(self, request):
        sender = request.get_response_sender()
        try:
            self._generate(request, sender)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:  # the client gets one error response naming the failing step
            try:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception:
                pass  # the client has gone
        finally:
            self.threads.discard(threading.current_thread())

    def _generate(self, request, sender):
        text = _value(request, "text_input")
        max_tokens = int(_value(request, "max_tokens"))
        stream = bool(_value(request, "stream", False))
        pre_inputs = [_tensor("QUERY", text, object), _tensor("REQUEST_OUTPUT_LEN", max_tokens, np.int32)]
        end_id = _value(request, "end_id")
        if end_id is not None:
            pre_inputs.append(_tensor("END_ID", int(end_id), np.int32))
        pre_inputs.append(_tensor("IGNORE_EOS", bool(_value(request, "ignore_eos", False)), bool))
        pre = pb_utils.InferenceRequest(model_name="preprocessing", inputs=pre_inputs,
                                        requested_output_names=["INPUT_ID", "REQUEST_INPUT_LEN",
                                                                "REQUEST_OUTPUT_LEN", "OUT_END_ID"]).exec()
        _raise_if_error(pre, "preprocessing")
        out = {name: pb_utils.get_output_tensor_by_name(pre, name).as_numpy()
               for name in ("INPUT_ID", "REQUEST_INPUT_LEN", "REQUEST_OUTPUT_LEN", "OUT_END_ID")}
        engine_inputs = [
            pb_utils.Tensor("input_ids", out["INPUT_ID"]),
            pb_utils.Tensor("input_lengths", out["REQUEST_INPUT_LEN"]),
            pb_utils.Tensor("request_output_len", out["REQUEST_OUTPUT_LEN"]),
            pb_utils.Tensor("end_id", out["OUT_END_ID"]),
            _tensor("streaming", stream, bool),
        ]
        for engine_name, name, dtype in _SAMPLING:  # as the ensemble wires them
            value = _value(request, name)
            if value is not None:
                engine_inputs.append(_tensor(engine_name, value, dtype))
        responses = pb_utils.InferenceRequest(model_name=self.engine_model, inputs=engine_inputs,
                                              requested_output_names=["output_ids", "sequence_length"]
                                              ).exec(decoupled=True)
        text = IncrementalText()
        for response in responses:
            _raise_if_error(response, "tensorrt_llm")
            ids = pb_utils.get_output_tensor_by_name(response, "output_ids")
            if ids is None:
                continue  # the empty final response
            lengths = pb_utils.get_output_tensor_by_name(response, "sequence_length").as_numpy()
            new = ids.as_numpy()[0, 0, : int(lengths.reshape(-1)[0])].tolist()
            context, full = self._detokenize(list(text.windows(new)))
            delta = text.delta(context, full, hold_partial=stream)
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                _tensor("text_output", delta.encode("utf-8"), object),
                _tensor("output_token_count", len(new), np.int32)]))

    def _detokenize(self, pieces):
        """Decode several token lists in one postprocessing call (one beam each, so the batch stays 1)."""
        width = max(1, max(len(p) for p in pieces))
        batch = np.zeros((1, len(pieces), width), dtype=np.int32)
        for beam, piece in enumerate(pieces):
            batch[0, beam, :len(piece)] = piece
        lengths = np.array([[len(p) for p in pieces]], dtype=np.int32)
        post = pb_utils.InferenceRequest(
            model_name=self.postprocessing_model,
            inputs=[pb_utils.Tensor("TOKENS_BATCH", batch), pb_utils.Tensor("SEQUENCE_LENGTH", lengths)],
            requested_output_names=["OUTPUT"]).exec()
        _raise_if_error(post, "postprocessing")
        values = pb_utils.get_output_tensor_by_name(post, "OUTPUT").as_numpy().reshape(-1)
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]
