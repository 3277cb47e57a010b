"""Triton python model `synthetic`: streams tokens at a configured TTFT and ITL, with no model behind it.

For calibrating load generators: the client should measure exactly the configured TTFT and ITL, so any
difference is client (or transport) overhead. Same tensors as the ensemble (text_input, max_tokens,
stream → text_output, output_token_count). Token k of a request is sent at
arrival + ttft + k·itl on an absolute schedule, so delays do not accumulate.

Runs inside Triton's python backend; imports only numpy and triton_python_backend_utils.
"""

import asyncio
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
        self.ttft = float(params.get("ttft_ms", "100")) / 1e3
        self.itl = float(params.get("itl_ms", "20")) / 1e3
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="synthetic-stream", daemon=True).start()
        self.token = pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("text_output", np.array([[b" tok"]], dtype=object)),
            pb_utils.Tensor("output_token_count", np.array([[1]], dtype=np.int32))])

    def execute(self, requests):
        arrival = time.monotonic()
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)[0])
            sender = request.get_response_sender()
            self.loop.call_soon_threadsafe(self._schedule, sender, arrival, max(count, 1))
        return None

    def _schedule(self, sender, arrival, count):
        # loop.time() is time.monotonic(): absolute deadlines, no drift
        for k in range(count):
            self.loop.call_at(arrival + self.ttft + k * self.itl, self._send, sender, k == count - 1)

    def _send(self, sender, last):
        try:
            sender.send(self.token, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
        except Exception:
            pass  # the client went away

    def finalize(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
