"""Triton python model `tensorrt_llm` for the CPU target: the TensorRT-LLM model's tensors, served
on CPU with in-flight batching and a paged KV cache (transformers' continuous batching).

What it emulates: the `tensorrt_llm` model's interface (input_ids, input_lengths, request_output_len,
streaming, end_id → output_ids, sequence_length), decoupled streaming one token per response,
in-flight batching (requests join a running batch at any step), a paged KV cache with a fixed
number of blocks of `tokens_per_block` tokens, the engine's limits (max_batch_size,
max_input_len, max_seq_len, max_num_tokens), and the quantized weights' values (dequantized on load).
What it does not: low-precision kernels (it computes in float32), activation and KV-cache
quantization, tensor/pipeline parallelism, beam search, sampling parameters (greedy only).

It also exports phase-level Prometheus metrics through Triton's custom metrics:
  toolkit_prefill_time_seconds   histogram  arrival → first token (queueing + prefill)
  toolkit_decode_time_seconds    histogram  first → last token
  toolkit_kv_cache_blocks_used   gauge      KV blocks held by active requests
  toolkit_kv_cache_blocks_max    gauge      KV blocks in the cache
  toolkit_active_requests        gauge      requests in the engine (queued or running)
  toolkit_generated_tokens_total counter    output tokens generated

Runs inside Triton's python backend: imports only torch, transformers, numpy and the sibling
quantized_checkpoint.py, never the toolkit package.
"""

import asyncio
import json
import math
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from quantized_checkpoint import load_quantized_causal_lm
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

_LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]


@dataclass
class _Stream:
    request: object
    sender: object
    input_len: int
    streaming: bool
    arrival: float
    sent: int = 0
    tokens: list = field(default_factory=list)
    first_token_at: float | None = None
    closed: bool = False


def _input(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}
        engine_dir = Path(params["engine_dir"])
        self.limits = json.loads((engine_dir / "engine_config.json").read_text())
        torch.set_num_threads(int(params.get("cpu_threads") or os.cpu_count() or 1))

        model, self.quant_algo = load_quantized_causal_lm(engine_dir / "checkpoint")
        generation = GenerationConfig(do_sample=False, max_new_tokens=self.limits["max_seq_len"], eos_token_id=-1,
                                      pad_token_id=model.config.pad_token_id or 0)
        # Sized from the engine config, not from free RAM (the default takes ~60 % of memory).
        batching = ContinuousBatchingConfig(
            page_size=self.limits["tokens_per_block"], num_blocks=self.limits["kv_cache_blocks"],
            max_batch_tokens=self.limits["max_num_tokens"], max_requests_per_batch=self.limits["max_batch_size"],
            allow_block_sharing=params.get("enable_kv_cache_reuse", "false").lower() == "true")
        self.manager = model.init_continuous_batching(generation_config=generation, continuous_batching_config=batching)
        self.manager.start()

        # All result handlers, and so all response_sender.send calls, run on this one loop thread.
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(target=self.loop.run_forever, name="cpu-engine-results", daemon=True)
        self.loop_thread.start()
        self.streams: dict[str, _Stream] = {}
        self._init_metrics(model_config["name"])
        self._warm_up()

    # ---- metrics -------------------------------------------------------------------------------
    def _init_metrics(self, model_name):
        labels = {"model": model_name, "version": "1"}
        histogram, gauge = pb_utils.MetricFamily.HISTOGRAM, pb_utils.MetricFamily.GAUGE
        # Keep the families alive as long as their metrics (Triton refuses metrics of a deleted family).
        self.metric_families = {
            "prefill": pb_utils.MetricFamily("toolkit_prefill_time_seconds",
                                             "Arrival to first token per request (queue + prefill), seconds", histogram),
            "decode": pb_utils.MetricFamily("toolkit_decode_time_seconds",
                                            "First to last token per request (decode), seconds", histogram),
            "kv_used": pb_utils.MetricFamily("toolkit_kv_cache_blocks_used", "KV cache blocks held by active requests", gauge),
            "kv_max": pb_utils.MetricFamily("toolkit_kv_cache_blocks_max", "KV cache blocks in the paged cache", gauge),
            "active": pb_utils.MetricFamily("toolkit_active_requests", "Requests in the engine (queued or running)", gauge),
            "tokens": pb_utils.MetricFamily("toolkit_generated_tokens_total", "Output tokens generated",
                                            pb_utils.MetricFamily.COUNTER),
        }
        self.prefill_hist = self.metric_families["prefill"].Metric(labels=labels, buckets=_LATENCY_BUCKETS)
        self.decode_hist = self.metric_families["decode"].Metric(labels=labels, buckets=_LATENCY_BUCKETS)
        self.kv_used = self.metric_families["kv_used"].Metric(labels=labels)
        self.kv_max = self.metric_families["kv_max"].Metric(labels=labels)
        self.active = self.metric_families["active"].Metric(labels=labels)
        self.tokens = self.metric_families["tokens"].Metric(labels=labels)
        self.kv_max.set(self.limits["kv_cache_blocks"])

    def _update_gauges(self):
        block = self.limits["tokens_per_block"]
        used = sum(math.ceil((s.input_len + len(s.tokens)) / block) for s in self.streams.values())
        self.kv_used.set(used)
        self.active.set(len(self.streams))

    # ---- requests ------------------------------------------------------------------------------
    def _warm_up(self):
        # The batch processor is built by the first request: pay that here, not in the first TTFT.
        done = threading.Event()

        async def register():
            self.manager.register_result_handler("warmup", lambda out: out.is_finished() and done.set())

        asyncio.run_coroutine_threadsafe(register(), self.loop).result()
        self.manager.add_request([1, 2, 3, 4], request_id="warmup", max_new_tokens=2, streaming=False, eos_token_id=-1)
        done.wait(120)

    def execute(self, requests):
        for request in requests:
            self._submit(request)
        return None  # decoupled: responses go through each request's sender, so others can join the batch

    def _reject(self, sender, message):
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _submit(self, request):
        sender = request.get_response_sender()
        ids = _input(request, "input_ids")
        if ids is None or ids.shape[0] != 1:
            return self._reject(sender, "send one prompt per request (input_ids batch dimension must be 1)")
        lengths = _input(request, "input_lengths")
        input_len = int(lengths.reshape(-1)[0]) if lengths is not None else ids.shape[-1]
        prompt = ids.reshape(1, -1)[0, :input_len].astype(np.int64).tolist()
        output_len = int(_input(request, "request_output_len", np.array([[16]])).reshape(-1)[0])
        streaming = bool(_input(request, "streaming", np.array([[False]])).reshape(-1)[0])
        end_id = int(_input(request, "end_id", np.array([[-1]])).reshape(-1)[0])
        limits = self.limits
        if input_len > limits["max_input_len"]:
            return self._reject(sender, f"input of {input_len} tokens exceeds the engine's max_input_len "
                                        f"{limits['max_input_len']}: shorten the prompt or rebuild with a larger engine.max_input_len")
        if output_len < 1:
            return self._reject(sender, "request_output_len must be >= 1")
        if input_len + output_len > limits["max_seq_len"]:
            return self._reject(sender, f"{input_len} input + {output_len} output tokens exceed the engine's max_seq_len "
                                        f"{limits['max_seq_len']}: ask for fewer tokens or rebuild with a larger engine.max_seq_len")

        request_id = uuid.uuid4().hex
        stream = _Stream(request, sender, input_len, streaming, time.perf_counter())

        async def register():
            self.streams[request_id] = stream
            self.manager.register_result_handler(request_id, lambda out: self._on_output(request_id, out))

        # Register before add_request, or early tokens would land in the shared output queue.
        asyncio.run_coroutine_threadsafe(register(), self.loop).result()
        self.manager.add_request(prompt, request_id=request_id, max_new_tokens=output_len, streaming=True,
                                 eos_token_id=end_id)

    def _on_output(self, request_id, out):
        """Runs on the loop thread for every generation step of the request."""
        stream = self.streams.get(request_id)
        if stream is None or stream.closed:
            return
        now = time.perf_counter()
        new = list(out.generated_tokens[len(stream.tokens):])
        stream.tokens.extend(new)
        if new:
            self.tokens.increment(len(new))
        if new and stream.first_token_at is None:
            stream.first_token_at = now
            self.prefill_hist.observe(now - stream.arrival)
        finished = out.is_finished()
        try:
            if out.error:
                stream.sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"cpu engine: {out.error}")),
                                   flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                finished = True
            elif stream.request.is_cancelled():
                self.manager.cancel_request(request_id)
                stream.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                finished = True
            elif stream.streaming and new:
                stream.sender.send(self._tokens_response(new),
                                   flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if finished else 0)
            elif finished:
                response = self._tokens_response(stream.tokens) if not stream.streaming else None
                stream.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:
            # The client went away between our check and the send ("Response sender has been closed").
            self.manager.cancel_request(request_id)
            finished = True
        if finished:
            stream.closed = True
            if stream.first_token_at is not None:
                self.decode_hist.observe(now - stream.first_token_at)
            self.streams.pop(request_id, None)
            # A cancelled request never yields a final output, so its handler is not removed for us.
            with self.manager.output_router._lock:
                self.manager.output_router.result_handlers.pop(request_id, None)
        self._update_gauges()

    @staticmethod
    def _tokens_response(tokens):
        ids = np.array(tokens, dtype=np.int32).reshape(1, 1, -1)  # [batch, beam, tokens]
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("output_ids", ids),
            pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.int32)),
        ])

    def finalize(self):
        # Stop the manager first (blocking) so in-flight requests finish, then the loop.
        try:
            self.manager.stop(block=True, timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
