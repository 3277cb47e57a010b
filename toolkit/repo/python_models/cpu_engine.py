"""Triton python model `tensorrt_llm` for the CPU target: a thin adapter over the embedded engine
(toolkit/engine/runtime/), with the TensorRT-LLM model's tensors and decoupled streaming.

In: input_ids, input_lengths, request_output_len, end_id, streaming, and the sampling tensors as
TensorRT-LLM takes them (temperature, runtime_top_k, runtime_top_p, seed, beam_width = 1).
Out: output_ids [1, 1, tokens] and sequence_length, one response per step's new tokens when
streaming (per stream_interval steps' with that parameter > 1: the first at once, the rest with the
end), one response at the end otherwise. A request the engine refuses (too long, bad sampling
values) gets one error response naming the fix.

Parameters (config.pbtxt, written by `toolkit repo`): engine_dir; cpu_threads; cpu_numa; and, overriding the
build's engine_config.json, enable_chunked_context, enable_kv_cache_reuse, batch_scheduler_policy
(TensorRT-LLM's meanings), max_draft_len (> 0: n-gram speculative decoding); stream_interval (the LLM
API's). The engine appends one JSON line per step to engine_timeline.jsonl in this model's directory
(timeline.py), and says what it runs (kernels, dtypes, options, start-up time) in engine_info.json
there.

Metrics on Triton's /metrics: TensorRT-LLM's nv_trt_llm_* families and the toolkit's own
(toolkit/engine/runtime/metrics.py), refreshed by a small thread every 0.1 s. Responses go out on a
thread of their own too: the engine's loop only schedules, runs the model and samples.

Runs inside Triton's python backend, whose interpreter is the venv's: it imports the engine runtime
package (toolkit.engine.runtime, importable without Triton), never the CLI or the stages.
"""

import json
import queue
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from toolkit.engine.runtime.cpu_binding import numa_setting
from toolkit.engine.runtime.engine import RequestError, start_engine
from toolkit.engine.runtime.layout import ENGINE_INFO_FILE, TIMELINE_FILE
from toolkit.engine.runtime.metrics import MetricsExporter
from toolkit.engine.runtime.sampling import GREEDY, SamplingParams

METRICS_INTERVAL_S = 0.1


@dataclass
class _Stream:
    request: object
    sender: object
    streaming: bool
    tokens: list = field(default_factory=list)
    closed: bool = False


def _scalar(request, name, cast, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else cast(tensor.as_numpy().reshape(-1)[0])


def _flag(params, name):
    return None if name not in params else str(params[name]).lower() == "true"


def sampling_params(request) -> SamplingParams:
    """TensorRT-LLM's sampling tensors; none given means greedy."""
    temperature = _scalar(request, "temperature", float)
    top_k = _scalar(request, "runtime_top_k", int)
    top_p = _scalar(request, "runtime_top_p", float)
    seed = _scalar(request, "seed", int)
    beam_width = _scalar(request, "beam_width", int, 1)
    if temperature is None and top_k is None and top_p is None and beam_width == 1:
        return GREEDY
    return SamplingParams(temperature=1.0 if temperature is None else temperature, top_k=top_k or 0,
                          top_p=top_p or 0.0, seed=seed, beam_width=beam_width)


class TritonPythonModel:
    def initialize(self, args):
        # The response thread waits for the GIL while the engine's thread runs Python between its steps; at the
        # interpreter's default 5 ms the tiny model made a whole answer before its first token left. At 0.5 ms, the
        # demo at one stream: ITL p50 4.7 / 4.2 / 4.9 -> 4.1 / 4.0 / 3.7 ms (3 rounds alternating), 8 streams within
        # noise; the tiny model at 8: 0.9-1.6 -> 0.7-1.0 ms (perf/README "Served: the response path's CPU").
        sys.setswitchinterval(0.0005)
        model_config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}
        threads = int(params["cpu_threads"]) if params.get("cpu_threads") else None
        # The build's options (engine_config.json), unless config.pbtxt sets them. Built, warmed up (first
        # calls pay kernel selection and allocator growth here, not in a TTFT) and run on its own thread.
        self.engine = start_engine(
            params["engine_dir"], threads=threads, numa=numa_setting(params.get("cpu_numa")), warm_up_prompt=[1, 2, 3, 4],
            timeline_path=Path(args["model_repository"]) / TIMELINE_FILE,
            enable_chunked_context=_flag(params, "enable_chunked_context"),
            enable_kv_cache_reuse=_flag(params, "enable_kv_cache_reuse"),
            batch_scheduler_policy=params.get("batch_scheduler_policy") or None,
            max_draft_len=int(params["max_draft_len"]) if params.get("max_draft_len") else None,
            stream_interval=int(params["stream_interval"]) if params.get("stream_interval") else None)
        self.exporter = MetricsExporter(pb_utils, model_config["name"])
        self.streams: dict[str, _Stream] = {}
        self._step_times: list[float] = []
        self.engine.on_step = lambda record: self._step_times.append(record.duration)
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_loop, name="cpu-engine-responses", daemon=True)
        self._sender.start()
        (Path(args["model_repository"]) / ENGINE_INFO_FILE).write_text(json.dumps(self.engine.describe(), indent=2))
        self._stop_metrics = threading.Event()
        self._metrics_thread = threading.Thread(target=self._metrics_loop, name="cpu-engine-metrics", daemon=True)
        self._metrics_thread.start()

    def _metrics_loop(self):
        while not self._stop_metrics.wait(METRICS_INTERVAL_S):
            times, self._step_times = self._step_times, []
            for duration in times:
                self.exporter.observe_step(duration)
            self.exporter.update(self.engine)

    # ---- requests ------------------------------------------------------------------------------
    def execute(self, requests):
        for request in requests:
            self._submit(request)
        return None  # decoupled: responses go through each request's sender, so others can join the batch

    def _submit(self, request):
        sender = request.get_response_sender()
        try:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            if ids.ndim > 1 and ids.shape[0] != 1:
                raise RequestError("send one prompt per request (input_ids batch dimension must be 1)")
            input_len = _scalar(request, "input_lengths", int, ids.shape[-1])
            prompt = ids.reshape(-1)[:input_len].astype(np.int64).tolist()
            output_len = _scalar(request, "request_output_len", int, 16)
            end_id = _scalar(request, "end_id", int, -1)
            request_id = uuid.uuid4().hex
            stream = _Stream(request, sender, bool(_scalar(request, "streaming", bool, False)))
            self.streams[request_id] = stream
            self.engine.add_request(request_id, prompt, output_len, end_id=None if end_id < 0 else end_id,
                                    sampling=sampling_params(request),
                                    callback=lambda out: self._outbox.put((stream, out)))
        except (RequestError, ValueError) as exc:
            self.streams.pop(locals().get("request_id"), None)
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _send_loop(self):
        # Responses go out on this thread, not the engine's: a send is a round trip to tritonserver (0.1-0.2 ms p50
        # of wall here, up to 0.6 at p90, on 2026-11-28), which would add up per stream to every step; here it
        # overlaps the next forward pass. One response per output, never merged here: the detokenizer decodes each
        # response's tokens on their own, so merging what piled up (vLLM's collector does) made a seeded answer's
        # text depend on when the sends fell behind (perf/README "Served: the response path's CPU").
        while (item := self._outbox.get()) is not None:
            stream, out = item
            try:
                self._on_output(stream, out)
            except Exception:  # the client went away between the check and the send
                stream.closed = True
                self.streams.pop(out.request_id, None)
                if not out.finished:
                    self.engine.abort(out.request_id)

    def _on_output(self, stream, out):
        """Sends what one step gave a request (tokens, the end, or an error), in step order."""
        self.exporter.observe_request(out)
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if stream.closed:
            return
        if out.finished:
            stream.closed = True
            self.streams.pop(out.request_id, None)
        if out.error:
            stream.sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(out.error)), flags=final)
            return
        if stream.request.is_cancelled():
            self.engine.abort(out.request_id)
            if not out.finished:
                stream.closed = True
                self.streams.pop(out.request_id, None)
            stream.sender.send(flags=final)
            return
        stream.tokens.extend(out.new_tokens)
        if stream.streaming and out.new_tokens:
            stream.sender.send(self._tokens_response(out.new_tokens), flags=final if out.finished else 0)
        elif out.finished:
            stream.sender.send(None if stream.streaming else self._tokens_response(stream.tokens), flags=final)

    @staticmethod
    def _tokens_response(tokens):
        ids = np.array(tokens, dtype=np.int32).reshape(1, 1, -1)  # [batch, beam, tokens]
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("output_ids", ids),
            pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.int32)),
        ])

    def finalize(self):
        # Let requests in flight finish (the engine stops taking steps once idle), then stop the metrics.
        self.engine.stop(timeout=30)
        self._outbox.put(None)
        self._sender.join(5)
        self._stop_metrics.set()
