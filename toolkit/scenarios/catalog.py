"""The scenarios: the four production failures the guides name, plus the levers that cut latency when a
workload allows them (prefix reuse, speculative decoding, fewer streamed responses). Each is pure data over a
config."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from toolkit.config import DeploymentConfig
from toolkit.errors import ToolkitError


@dataclass(frozen=True)
class Judged:
    """What decides the scenario: a per-request value (ms), in which request class, lower is better."""
    metric: str  # a key of VALUES in analysis.py
    request_class: str | None = None
    title: str = ""


@dataclass(frozen=True)
class Scenario:
    name: str
    failure: str  # what the user sees, one line
    cause: str  # why, one line
    fix_label: str
    fix_note: str  # what the fix changes, one line
    levers: tuple[str, ...]  # engine keys the fix needs the served engine to honour
    workload: Callable[[DeploymentConfig], dict]  # config overrides both variants share
    fix: Callable[[DeploymentConfig], dict]  # overrides of the fixed variant
    judged: tuple[Judged, ...]
    figure: str  # figures.py function name
    baseline: Callable[[DeploymentConfig], dict] = field(default=lambda c: {})


def _longest_prompt(config: DeploymentConfig, osl: int) -> int:
    """The longest prompt the engine takes with `osl` output tokens, less a margin: the server counts its
    begin-of-sequence token, and a decoded prompt can re-tokenize a token longer."""
    return min(config.engine.max_input_len, config.engine.max_seq_len - osl) - 2


def _lengths(config: DeploymentConfig, fractions: tuple[float, ...], osl: int) -> str:
    top = _longest_prompt(config, osl)
    return "[" + ",".join(f"[{max(8, int(top * f))},{osl}]" for f in fractions) + "]"


def _blocks_per_sequence(config: DeploymentConfig) -> int:
    return math.ceil(config.engine.max_seq_len / config.engine.tokens_per_block)


def _sluggish_workload(c: DeploymentConfig) -> dict:
    return {"sweep.workload.kind": "shared_prefix", "sweep.workload.prefixes": 1, "sweep.workload.suffix_tokens": 8,
            "sweep.workload.users_per_prefix": 8, "sweep.lengths": _lengths(c, (0.125, 0.25, 0.5, 0.9), 4),
            "sweep.concurrencies": "[1]", "sweep.mode": "concurrency"}


def _chatty_workload(c: DeploymentConfig) -> dict:
    osl, turn = 16, 24
    turns = max(3, min(12, c.engine.max_input_len // (osl + turn)))
    return {"sweep.workload.kind": "multi_turn", "sweep.workload.turns": turns, "sweep.workload.turn_tokens": turn,
            "sweep.workload.think_time_s": 0.05, "sweep.output_tokens": osl, "sweep.concurrencies": "[2]",
            "sweep.mode": "concurrency", "sweep.requests_per_step": 2 * turns}


def _stutter_workload(c: DeploymentConfig) -> dict:
    long_in = int(_longest_prompt(c, 2) * 0.9)
    return {"sweep.workload.kind": "mixed", "sweep.workload.long_input_tokens": long_in,
            "sweep.workload.long_output_tokens": 2, "sweep.workload.long_rate": 3.0, "sweep.requests_per_step": 16,
            "sweep.input_tokens_mean": 16, "sweep.output_tokens": 48, "sweep.concurrencies": "[2]",
            "sweep.mode": "concurrency", "sweep.lengths": "null"}


def _oom_workload(c: DeploymentConfig) -> dict:
    osl = max(8, c.engine.max_seq_len // 4)
    isl = _longest_prompt(c, osl)
    return {"sweep.workload.kind": "synthetic", "sweep.lengths": f"[[{isl},{osl}]]",
            "sweep.concurrencies": f"[{c.engine.max_batch_size}]", "sweep.mode": "concurrency",
            "sweep.requests_per_step": 2 * c.engine.max_batch_size}


def _shared_prefix_workload(c: DeploymentConfig) -> dict:
    prefix = int(_longest_prompt(c, c.sweep.output_tokens) * 0.75)
    return {"sweep.workload.kind": "shared_prefix", "sweep.workload.prefixes": 2, "sweep.workload.prefix_tokens": prefix,
            "sweep.workload.suffix_tokens": 16, "sweep.workload.users_per_prefix": 4, "sweep.lengths": "null",
            "sweep.concurrencies": "[2]", "sweep.mode": "concurrency"}


def _speculative_workload(c: DeploymentConfig) -> dict:
    return {"sweep.workload.kind": "synthetic", "sweep.lengths": "null", "sweep.output_tokens": 48,
            "sweep.concurrencies": f"[1,{c.engine.max_batch_size}]", "sweep.mode": "concurrency"}


def _many_streams_workload(c: DeploymentConfig) -> dict:
    return {"sweep.workload.kind": "synthetic", "sweep.lengths": "null", "sweep.output_tokens": 48,
            "sweep.concurrencies": f"[{c.engine.max_batch_size}]", "sweep.mode": "concurrency"}


SCENARIOS = {s.name: s for s in (
    Scenario("sluggish-start", "a long prompt's first token takes long",
             "prefill reads the whole prompt in one compute-bound pass: TTFT grows about linearly with its length",
             "prefix-reuse", "enable_kv_cache_reuse: a prompt that opens with an already-read document prefills only "
             "the rest (prompts that share nothing need more compute instead: FP8 context attention, TP)",
             ("enable_kv_cache_reuse",), _sluggish_workload, lambda c: {"engine.enable_kv_cache_reuse": "true"},
             (Judged("ttft", title="TTFT"),), "ttft_vs_isl", lambda c: {"engine.enable_kv_cache_reuse": "false"}),
    Scenario("chatty-slowdown", "a conversation gets slower turn by turn",
             "every decode step reads the whole conversation's KV cache, which grows with each turn",
             "shorter-context", "keep a quarter of max_input_len of history (a context window); on a GPU, an FP8 KV cache "
             "(quantize.kv_cache_dtype=fp8) halves the bytes read instead", (),
             _chatty_workload, lambda c: {"sweep.workload.history_tokens": str(max(16, c.engine.max_input_len // 4))},
             (Judged("itl", title="ITL"),), "itl_vs_context"),
    Scenario("stuttering-stream", "short streams pause while someone else's long prompt is read",
             "continuous batching puts a long prefill into the same step as running decodes: every stream waits for it",
             "chunked-prefill", "enable_chunked_context with a small max_num_tokens: the long prefill is cut into "
             "chunks that share steps with the decodes", ("enable_chunked_context",), _stutter_workload,
             lambda c: {"engine.enable_chunked_context": "true", "engine.max_num_tokens": str(max(
                 c.engine.tokens_per_block, 2 * c.engine.max_batch_size, 32))},
             (Judged("max_gap", "short", "short streams' longest pause"), Judged("itl", "short", "short streams' ITL")),
             "gaps_cdf", lambda c: {"engine.enable_chunked_context": "false"}),
    Scenario("oom", "a burst of long requests exceeds the KV cache",
             "each sequence holds KV blocks for its whole context: a burst needs more blocks than the cache has, so "
             "requests wait for blocks (guaranteed_no_evict), are paused (max_utilization), or are refused",
             "cache-sized-by-plan", "kv_cache_blocks = max_batch_size × ceil(max_seq_len / tokens_per_block), what "
             "`toolkit plan` sizes for the batch (on a GPU: kv_cache_free_gpu_mem_fraction)", (),
             _oom_workload, lambda c: {"engine.kv_cache_blocks": str(c.engine.max_batch_size * _blocks_per_sequence(c))},
             (Judged("ttft", title="TTFT"), Judged("latency", title="request latency")), "kv_and_latency",
             lambda c: {"engine.kv_cache_blocks": str(_blocks_per_sequence(c) + 1)}),
    Scenario("shared-prefix", "every user's request re-reads the same system prompt",
             "without KV-cache reuse each request prefills the shared prefix again",
             "prefix-reuse", "enable_kv_cache_reuse (prefix caching): the prefix's KV blocks are computed once and "
             "shared", ("enable_kv_cache_reuse",), _shared_prefix_workload,
             lambda c: {"engine.enable_kv_cache_reuse": "true"}, (Judged("ttft", title="TTFT"),), "ttft_cdf",
             lambda c: {"engine.enable_kv_cache_reuse": "false"}),
    Scenario("speculative", "decode at low concurrency leaves the hardware idle",
             "one token per forward pass: a memory-bound step that could verify several tokens at the same cost",
             "ngram-draft", "n-gram (prompt lookup) speculative decoding: drafts verified in one pass; it helps at low "
             "concurrency and costs at high concurrency, where the step is no longer free",
             ("speculative_decoding",), _speculative_workload,
             lambda c: {"engine.speculative_decoding": "ngram"}, (Judged("itl", title="ITL"),), "itl_by_step",
             lambda c: {"engine.speculative_decoding": "none"}),
    Scenario("streaming-overhead", "at many streams, tokens reach users slower than the engine makes them",
             "every token is a response of its own through the server's frontend, ensemble and detokenizer, whose CPU "
             "the engine's host shares", "stream-interval", "engine.stream_interval 4: each stream's tokens go out at "
             "its first step, every 4th and its last, a quarter of the responses", ("stream_interval",),
             _many_streams_workload, lambda c: {"engine.stream_interval": "4"}, (Judged("itl", title="ITL"),),
             "itl_by_step", lambda c: {"engine.stream_interval": "1"}),
)}


def scenario(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise ToolkitError(f"no scenario {name!r}", f"pick one of: {', '.join(SCENARIOS)} (toolkit scenario --list)")
    return SCENARIOS[name]
