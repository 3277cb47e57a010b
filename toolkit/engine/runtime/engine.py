"""The engine loop: requests in, one forward pass per step over an in-flight batch, tokens out.

`Engine` owns a model runner (model_runner.py) and a scheduler. `add_request` and `abort` may be
called from any thread; they land in an inbox that the loop drains between steps, so a request joins
the running batch at the next step. Each step: schedule, run the runner on the batch's `StepInput`,
sample (or verify draft tokens), commit, then hand each request its new tokens through its callback,
on the engine's thread. `start()` runs the loop in a background thread; `run_until_idle()` runs it in
the caller's (tests, benchmarks).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from toolkit.engine.runtime.sampling import GREEDY, SamplingParams, accept_greedy, sample, verify_draft
from toolkit.engine.runtime.scheduler import Scheduled, Scheduler, SchedulerConfig, Sequence, build_step_input
from toolkit.engine.runtime.timeline import StepRecord, Timeline


log = logging.getLogger(__name__)


class RequestError(ValueError):
    """A request the engine refuses; the message names the problem and the fix."""


@dataclass
class RequestOutput:
    request_id: str
    new_tokens: list[int]
    finished: bool
    prompt_len: int
    num_generated: int
    arrival: float  # perf_counter seconds
    first_token_at: float | None
    at: float  # perf_counter seconds when this output was made
    finish_reason: str | None = None
    error: str | None = None


Callback = Callable[[RequestOutput], None]


@dataclass(eq=False)
class _Request:
    seq: Sequence
    callback: Callback | None
    arrival: float
    first_token_at: float | None = None
    tokens: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)  # made, not yet handed over (stream_interval)
    iterations: int = 0  # steps that gave this request tokens


@dataclass
class EngineTotals:
    steps: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    finished_requests: int = 0


class Engine:
    def __init__(self, runner, config: SchedulerConfig, *, max_input_len: int | None = None,
                 timeline: Timeline | None = None, on_step: Callable[[StepRecord], None] | None = None,
                 stream_interval: int = 1):
        if stream_interval < 1:
            raise ValueError(f"stream_interval {stream_interval}: hand tokens over every 1 or more steps")
        self.runner = runner
        self.config = config
        # A request's tokens handed to its callback every this many of its steps (TensorRT-LLM's LLM-API
        # stream_interval): the first step's at once, the last with the finish. Each hand-over is a response through
        # Triton's python backend, its ensemble and the detokenizer, whose CPU a small host takes from the engine's
        # steps (perf/README.md).
        self.stream_interval = stream_interval
        self.max_input_len = max_input_len or config.max_seq_len - 1
        self.scheduler = Scheduler(config)
        self.timeline = timeline or Timeline()
        self.on_step = on_step
        self.totals = EngineTotals()
        self.last_step: StepRecord | None = None
        self._requests: dict[str, _Request] = {}
        self._inbox: list[_Request] = []
        self._aborts: list[str] = []
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._step_index = 0
        self.startup_seconds: float | None = None  # load and warm-up, when open_engine made it

    # ---- requests (any thread) -----------------------------------------------------------------
    def add_request(self, request_id: str, prompt: list[int], max_new_tokens: int, *, end_id: int | None = None,
                    sampling: SamplingParams = GREEDY, callback: Callback | None = None) -> None:
        self.check_request(prompt, max_new_tokens)
        vocab = self.runner.spec.vocab_size
        if any(t < 0 or t >= vocab for t in prompt):
            raise RequestError(f"input_ids hold token ids outside the model's vocabulary [0, {vocab}): "
                               "tokenize with the engine's own tokenizer")
        seq = Sequence(request_id, list(prompt), len(prompt), max_new_tokens, end_id=end_id, sampling=sampling,
                       generator=sampling.generator())
        request = _Request(seq, callback, time.perf_counter())
        with self._wake:
            if request_id in self._requests:
                raise RequestError(f"request id {request_id} is already in the engine: use a new id per request")
            self._requests[request_id] = request
            self._inbox.append(request)
            self._wake.notify()

    def check_request(self, prompt: list[int], max_new_tokens: int) -> None:
        c = self.config
        if not prompt:
            raise RequestError("empty prompt: send at least one input token")
        if len(prompt) > self.max_input_len:
            raise RequestError(f"input of {len(prompt)} tokens exceeds the engine's max_input_len {self.max_input_len}: "
                               "shorten the prompt or rebuild with a larger engine.max_input_len")
        if max_new_tokens < 1:
            raise RequestError("request_output_len must be >= 1")
        if len(prompt) + max_new_tokens > c.max_seq_len:
            raise RequestError(f"{len(prompt)} input + {max_new_tokens} output tokens exceed the engine's max_seq_len "
                               f"{c.max_seq_len}: ask for fewer tokens or rebuild with a larger engine.max_seq_len")
        needed = -(-(len(prompt) + max_new_tokens) // c.block_size)
        if needed > c.num_blocks:
            raise RequestError(f"the request needs {needed} KV blocks and the cache has {c.num_blocks}: "
                               "rebuild with more engine.kv_cache_blocks")

    def abort(self, request_id: str) -> None:
        with self._wake:
            self._aborts.append(request_id)
            self._wake.notify()

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    def describe(self) -> dict:
        """What runs: the runner's kernels and dtypes, the scheduler's options, the start-up time."""
        runner, c = self.runner, self.config
        cache = getattr(runner, "cache", None)
        return {"weight_format": getattr(runner, "weight_format", None),
                "compute_dtype": str(getattr(runner, "dtype", "")).replace("torch.", "") or None,
                "step_kernels": getattr(runner, "step_kernels", None),
                "kernel_isa": getattr(getattr(runner, "native", None), "isa", None),  # e.g. "AVX2 + FMA"
                "prompt_gemm_dtype": getattr(runner, "prompt_gemm_dtype", None),
                "kv_cache_dtype": getattr(cache, "kv_cache_dtype", None),
                "device": str(getattr(runner, "device", "cpu")),
                # the runner's own binding (torch's count is the process's, which another runner may have set since)
                "threads": binding.threads if (binding := getattr(runner, "cpu_binding", None)) else
                torch.get_num_threads(),
                "cpu_binding": binding.describe() if binding else None,
                "startup_seconds": self.startup_seconds,
                "enable_chunked_context": c.enable_chunked_context, "enable_kv_cache_reuse": c.enable_kv_cache_reuse,
                "batch_scheduler_policy": c.batch_scheduler_policy, "max_draft_len": c.max_draft_len,
                "stream_interval": self.stream_interval}

    # ---- the loop ------------------------------------------------------------------------------
    def _drain_inbox(self) -> list[tuple[_Request, RequestOutput]]:
        with self._wake:
            arrived, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
        for request in arrived:
            self.scheduler.add(request.seq)
        outputs = []
        for request_id in aborts:
            request = self._requests.get(request_id)
            if request is not None and self.scheduler.abort(request_id) is not None:
                outputs.append((request, self._output(request, [], time.perf_counter())))
        return outputs

    def step(self) -> StepRecord | None:
        """One iteration; None when there was nothing to run."""
        outputs = self._drain_inbox()
        start_wall, start = time.time(), time.perf_counter()
        batch = self.scheduler.schedule()
        record = None
        if batch:
            forward_s, emitted = self._run(batch)
            now = time.perf_counter()
            accepted = 0
            for item, new, tokens in emitted:
                request = self._requests[item.seq.request_id]
                outputs.append((request, self._output(request, tokens, now)))
                accepted += len(new) - 1 if item.draft else 0
            record = self._record(batch, start_wall, start, now - start, forward_s, accepted)
        for request, output in outputs:
            self._deliver(request, output)
        return record

    def _run(self, batch: list[Scheduled]) -> tuple[float, list[tuple[Scheduled, list[int], list[int]]]]:
        """Forward pass, then per sequence: (item, tokens sampled, tokens emitted after end_id / length)."""
        step = build_step_input(batch, self.config.block_size)
        t0 = time.perf_counter()
        try:
            logits = self.runner.forward(step)
        except Exception as exc:  # a failed step fails its requests, not the engine
            for item in batch:
                self.scheduler.finish(item.seq, "error")
                request = self._requests.get(item.seq.request_id)
                if request is not None:
                    self._deliver(request, self._output(request, [], time.perf_counter(), error=f"cpu engine: {exc}"))
            return time.perf_counter() - t0, []
        forward_s = time.perf_counter() - t0
        top = logits.argmax(-1).tolist()  # one call for every greedy row of the batch
        if logits.device.type != "cpu" and not all(item.seq.sampling.greedy for item in batch):
            logits = logits.float().cpu()  # the per-request generators (seeds) live on the CPU
        emitted, row = [], 0
        for item in batch:
            seq, greedy = item.seq, item.seq.sampling.greedy
            if item.draft:
                n = len(item.draft) + 1
                new = (accept_greedy(item.draft, top[row:row + n]) if greedy
                       else verify_draft(logits[row:row + n], item.draft, seq.sampling, seq.generator))
                row += n
            elif item.samples:
                new = [top[row] if greedy else sample(logits[row], seq.sampling, seq.generator)]
                row += 1
            else:
                new = []
            emitted.append((item, new, self.scheduler.commit(item, new)))
        return forward_s, emitted

    def _output(self, request: _Request, tokens: list[int], now: float, error: str | None = None) -> RequestOutput:
        seq = request.seq
        if tokens and request.first_token_at is None:
            request.first_token_at = now
        request.tokens.extend(tokens)
        self.totals.generated_tokens += len(tokens)
        finished = seq.finish_reason is not None
        if finished:
            self._requests.pop(seq.request_id, None)
            self.totals.finished_requests += 1
        return RequestOutput(seq.request_id, tokens, finished, seq.prompt_len, len(request.tokens), request.arrival,
                             request.first_token_at, now, seq.finish_reason, error)

    def _deliver(self, request: _Request, output: RequestOutput) -> None:
        if request.callback is None:
            return
        # TensorRT-LLM's PyTorch executor's rule: a response at a request's first decoding iteration, at every
        # stream_interval-th, and at its end (an iteration's tokens stay together: a speculative step gives several)
        request.iterations += bool(output.new_tokens)
        due = request.iterations == 1 or request.iterations % self.stream_interval == 0
        if output.new_tokens and not (due or output.finished or output.error):
            request.held += output.new_tokens
            return
        if request.held:
            output.new_tokens, request.held = request.held + output.new_tokens, []
        if not (output.finished or output.new_tokens or output.error):
            return
        try:
            request.callback(output)
        except Exception:  # a client that went away must not stop the engine
            if not output.finished:
                self.abort(output.request_id)

    def _record(self, batch: list[Scheduled], start_wall: float, start: float, duration: float, forward_s: float,
                accepted: int) -> StepRecord:
        decodes = [item for item in batch if item.is_decode]
        prefills = [item for item in batch if not item.is_decode]
        self._step_index += 1
        self.totals.steps += 1
        self.totals.prompt_tokens += sum(item.num_new for item in prefills)
        blocks = self.scheduler.blocks
        record = StepRecord(
            step=self._step_index, start=start_wall, mono=start, duration=duration, forward=forward_s, batch_size=len(batch),
            context_requests=len(prefills), generation_requests=len(decodes),
            prefill_tokens=sum(item.num_new for item in prefills),
            decode_tokens=sum(item.query_len for item in decodes),
            draft_tokens=sum(len(item.draft) for item in decodes),
            accepted_tokens=accepted, kv_blocks_used=blocks.num_used, kv_blocks_max=blocks.num_blocks,
            waiting=len(self.scheduler.waiting), preempted=self.scheduler.paused_last_step)
        self.last_step = record
        self.timeline.add(record)
        if self.on_step is not None:
            self.on_step(record)
        return record

    def run_until_idle(self) -> None:
        while True:
            if self.step() is not None:
                continue
            if not (self.scheduler.has_work or self._inbox):
                return
            if not self.scheduler.running and not self._inbox:
                raise RuntimeError("the engine cannot schedule its waiting requests (KV cache or token budget too small)")

    def start(self) -> None:
        running = threading.Event()
        threading.Thread(target=self.run_loop, args=(running.set,), name="cpu-engine", daemon=True).start()
        running.wait()  # stop() from here on finds the loop's thread

    def run_loop(self, on_running: Callable[[], None] | None = None) -> None:
        """Run the loop on the calling thread until stop(); `on_running` is called once stop() can find it."""
        self._stopping = False
        self._thread = threading.current_thread()
        if on_running is not None:
            on_running()
        self._loop()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not (self._stopping or self._inbox or self._aborts or self.scheduler.has_work):
                    self._wake.wait()
                if self._stopping and not self.scheduler.has_work and not self._inbox:
                    return
            try:
                self.step()
            except Exception as exc:  # a bug must not leave clients waiting on a dead loop
                log.exception("engine step failed")
                self._fail_all(f"cpu engine: step failed: {exc!r}")

    def _fail_all(self, error: str) -> None:
        self._drain_inbox()
        for request in list(self._requests.values()):
            self.scheduler.finish(request.seq, "error")
            self._deliver(request, self._output(request, [], time.perf_counter(), error=error))

    def stop(self, timeout: float = 30.0) -> None:
        """Let requests in flight finish (up to `timeout`), then abort what is left and end the loop."""
        if self._thread is None:
            return
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            for request_id in list(self._requests):
                self.abort(request_id)
            self._thread.join(5)
        self._thread = None
        self.timeline.close()

    # ---- convenience ---------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], max_new_tokens: int, *, end_id: int | None = None,
                 sampling: SamplingParams | list[SamplingParams] = GREEDY) -> list[list[int]]:
        """Run prompts to completion in the caller's thread (all submitted before the first step)."""
        results: dict[str, list[int]] = {}
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        ids = [f"generate-{self._step_index}-{i}" for i in range(len(prompts))]
        for request_id, prompt, p in zip(ids, prompts, params):
            results[request_id] = []
            self.add_request(request_id, prompt, max_new_tokens, end_id=end_id, sampling=p,
                             callback=lambda out: results[out.request_id].extend(out.new_tokens))
        self.run_until_idle()
        return [results[i] for i in ids]


def start_engine(engine_dir, *, warm_up_prompt: list[int] | None = None, **options) -> Engine:
    """`open_engine` (options as there), an optional warm-up generation, then the loop, all on the loop's
    own thread; returns once the engine is ready, or raises what building it raised.

    Why one thread: a runner built on one thread and stepped on another ran 1.6x slower here (small, fp8,
    batch 1: 18 ms against 11 ms built and stepped on one thread, measured 2026-11-23; the served engine's
    steps were that much slower than the benchmark's until it moved here)."""
    ready = threading.Event()
    built: dict = {}

    def run() -> None:
        try:
            engine = open_engine(engine_dir, **options)
            if warm_up_prompt:
                engine.generate([warm_up_prompt], 2)
        except BaseException as exc:  # noqa: BLE001 — handed to the caller below
            built["error"] = exc
            ready.set()
            return
        built["engine"] = engine
        engine.run_loop(on_running=ready.set)

    threading.Thread(target=run, name="cpu-engine", daemon=True).start()
    ready.wait()
    if "error" in built:
        raise built["error"]
    return built["engine"]


def open_engine(engine_dir, *, threads: int | None = None, numa: str | int = "auto", device: str | None = None,
                timeline_path=None, warm_up: bool = True, **options) -> Engine:
    """The engine for a built CPU engine directory, its runner warmed up, on `device` (default: the device it was
    built for, engine_config.json's). Scheduler options
    (enable_chunked_context, enable_kv_cache_reuse, batch_scheduler_policy, max_draft_len) and the
    activation dtype come from the engine's engine_config.json; keyword arguments that are not None
    override them. threads, numa: the CPU engine's threads and NUMA binding (cpu_binding.py)."""
    import json
    from pathlib import Path

    from toolkit.engine.runtime.layout import CHECKPOINT_SUBDIR, ENGINE_CONFIG_FILE
    from toolkit.engine.runtime.model_runner import ModelRunner

    started = time.perf_counter()
    engine_dir = Path(engine_dir)
    limits = json.loads((engine_dir / ENGINE_CONFIG_FILE).read_text())
    limits.update({k: v for k, v in options.items() if v is not None})
    kv_dtype = limits.get("kv_cache_dtype") or "none"
    runner = ModelRunner(engine_dir / CHECKPOINT_SUBDIR, num_blocks=limits["kv_cache_blocks"],
                         block_size=limits["tokens_per_block"], kv_cache_dtype="auto" if kv_dtype == "none" else kv_dtype,
                         dtype=limits.get("dtype", "auto"), threads=threads, numa=numa,
                         device=device or limits.get("device", "cpu"),
                         prompt_gemm_dtype=limits.get("prompt_gemm_dtype"),
                         int4_activations=limits.get("int4_activations", "auto"))
    config = SchedulerConfig(
        max_batch_size=limits["max_batch_size"], max_num_tokens=limits["max_num_tokens"],
        max_seq_len=limits["max_seq_len"], block_size=limits["tokens_per_block"], num_blocks=limits["kv_cache_blocks"],
        enable_chunked_context=limits.get("enable_chunked_context", True),
        enable_kv_cache_reuse=limits.get("enable_kv_cache_reuse", False),
        batch_scheduler_policy=limits.get("batch_scheduler_policy", "guaranteed_no_evict"),
        max_draft_len=limits.get("max_draft_len", 0))
    if warm_up:
        runner.warm_up(config.max_batch_size, config.max_num_tokens)
    engine = Engine(runner, config, max_input_len=limits["max_input_len"], timeline=Timeline(timeline_path),
                    stream_interval=limits.get("stream_interval", 1))
    engine.startup_seconds = round(time.perf_counter() - started, 3)
    return engine
