"""What NVIDIA's own sources define for the GPU repository, in one place.

The writer takes from here which parameters each model sets, the checker which values are valid
(the domains documented for the TensorRT-LLM backend, docs/model_config.md) and which LLM-API keys
exist, and the tests compare every generated model with the upstream templates
(tests/data/upstream/templates.json, read from NVIDIA/TensorRT-LLM triton_backend/all_models/).

Every parameter key a template has is either set (`Param.set_by`) or deliberately left out
(`Param.omitted`, with the reason). Nothing here imports TensorRT-LLM.
"""

from __future__ import annotations

from dataclasses import dataclass

# The NGC image and TensorRT-LLM release every GPU artifact was checked against (docs/gpu-artifacts.md).
# Source: Triton's release compatibility matrix (container trtllm-python-py3).
TRITON_IMAGE_TAG = "25.12-trtllm-python-py3"
TRTLLM_VERSION = "1.1.0"
# Template trees whose version we have compared with ours. `toolkit repo` refuses others (override:
# TOOLKIT_UNCHECKED_TEMPLATES=1), since a renamed tensor or parameter only shows on the GPU.
CHECKED_TEMPLATE_VERSIONS = ("1.1.0",)
TEMPLATE_VERSION_ENV = "TRTLLM_TEMPLATES_VERSION"
# NVIDIA's guide gets the templates by cloning TensorRT-LLM at the image's tag (docker/Dockerfile does).
TEMPLATE_DIR_ENV = "TRTLLM_TRITON_MODELS"


@dataclass(frozen=True)
class Domain:
    """A documented value domain: kind is bool | int | float | enum | path | int_list | text."""
    kind: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low < value rather than low <= value
    choices: tuple[str, ...] = ()

    def problem(self, value: str) -> str | None:
        """Why `value` is outside the domain, or None."""
        text = value.strip()
        if self.kind == "bool":
            return None if text.lower() in ("true", "false", "1", "0", "yes", "no") else "is not a boolean (true/false)"
        if self.kind == "enum":
            return None if text in self.choices else f"is not one of {', '.join(self.choices)}"
        if self.kind == "int_list":
            parts = [p for chunk in text.split(";") for p in chunk.split(",")]
            return None if all(p.strip().isdigit() for p in parts) else "is not a comma-separated list of integers"
        if self.kind in ("int", "float"):
            try:
                number = int(text) if self.kind == "int" else float(text)
            except ValueError:
                return f"is not {'an integer' if self.kind == 'int' else 'a number'}"
            if self.low is not None and (number <= self.low if self.low_open else number < self.low):
                return f"must be {'>' if self.low_open else '≥'} {self.low:g}"
            if self.high is not None and number > self.high:
                return f"must be ≤ {self.high:g}"
        return None


BOOL = Domain("bool")
PATH = Domain("path")
TEXT = Domain("text")
INT_LIST = Domain("int_list")


def count(low: int = 0) -> Domain:
    return Domain("int", low=low)


def fraction(low_open: bool = True) -> Domain:
    return Domain("float", low=0, high=1, low_open=low_open)


@dataclass(frozen=True)
class Param:
    domain: Domain
    set_by: str = ""  # the config key (or fixed value) it comes from, when the writer sets it
    omitted: str = ""  # why the writer leaves it out

    def __post_init__(self):
        assert bool(self.set_by) != bool(self.omitted), "a parameter is either set or omitted with a reason"


_LORA = "LoRA adapters are not part of this toolkit's deployments"
_SPEC = "speculative decoding (Medusa / EAGLE / lookahead) is not configured by this toolkit"
_ENCDEC = "encoder-decoder models only; the toolkit deploys decoder-only Llama-family models"
_MULTINODE = "single-node deployments: Triton's MPI ranks give the device mapping (orchestrator mode not used)"
_DEFAULT = "the backend's default is what we want"

# The `tensorrtllm` backend's model (inflight_batcher_llm/tensorrt_llm), every key of its template.
TRTLLM_PARAMS: dict[str, Param] = {
    "max_beam_width": Param(count(1), set_by="1 (greedy / sampling; beam search is not benchmarked)"),
    "FORCE_CPU_ONLY_INPUT_TENSORS": Param(Domain("enum", choices=("yes", "no")), set_by='"no", as the template'),
    "gpt_model_type": Param(Domain("enum", choices=("inflight_fused_batching", "inflight_batching", "V1")),
                            set_by="inflight_fused_batching (in-flight batching)"),
    "gpt_model_path": Param(PATH, set_by="the engine directory (toolkit build)"),
    "encoder_model_path": Param(PATH, omitted=_ENCDEC),
    "max_tokens_in_paged_kv_cache": Param(count(1), set_by="engine.max_tokens_in_paged_kv_cache (when set)"),
    "max_attention_window_size": Param(count(1), omitted="full attention: the window is the engine's max_seq_len"),
    "sink_token_length": Param(count(0), omitted="StreamingLLM attention sinks are not used"),
    "batch_scheduler_policy": Param(Domain("enum", choices=("max_utilization", "guaranteed_no_evict")),
                                    set_by="engine.batch_scheduler_policy"),
    # A fraction (0.9), not a percentage (90): of the GPU memory free after the weights and activations.
    "kv_cache_free_gpu_mem_fraction": Param(fraction(), set_by="engine.kv_cache_free_gpu_mem_fraction"),
    "cross_kv_cache_fraction": Param(fraction(), omitted=_ENCDEC),
    "kv_cache_host_memory_bytes": Param(count(0), omitted="no host offload of KV blocks (default 0)"),
    "kv_cache_onboard_blocks": Param(BOOL, omitted="only meaningful with host offload"),
    "enable_trt_overlap": Param(BOOL, omitted="deprecated upstream; the backend ignores it"),
    "exclude_input_in_output": Param(BOOL, set_by="true: responses carry only generated tokens, so counts are right"),
    "cancellation_check_period_ms": Param(count(0), omitted=_DEFAULT + " (100 ms)"),
    "stats_check_period_ms": Param(count(0), omitted=_DEFAULT + " (100 ms)"),
    "iter_stats_max_iterations": Param(count(0), omitted=_DEFAULT),
    "request_stats_max_iterations": Param(count(0), omitted=_DEFAULT),
    "enable_kv_cache_reuse": Param(BOOL, set_by="engine.enable_kv_cache_reuse"),
    "normalize_log_probs": Param(BOOL, omitted="log probabilities are not requested by the sweeps"),
    "enable_chunked_context": Param(BOOL, set_by="engine.enable_chunked_context"),
    "gpu_device_ids": Param(INT_LIST, omitted=_MULTINODE),
    "participant_ids": Param(INT_LIST, omitted=_MULTINODE),
    "num_nodes": Param(count(1), omitted=_MULTINODE),
    "lora_cache_optimal_adapter_size": Param(count(1), omitted=_LORA),
    "lora_cache_max_adapter_size": Param(count(1), omitted=_LORA),
    "lora_cache_gpu_memory_fraction": Param(fraction(), omitted=_LORA),
    "lora_cache_host_memory_bytes": Param(count(0), omitted=_LORA),
    "lora_prefetch_dir": Param(PATH, omitted=_LORA),
    "decoding_mode": Param(Domain("enum", choices=("top_k", "top_p", "top_k_top_p", "beam_search", "medusa",
                                                   "redrafter", "lookahead", "eagle")),
                           omitted=_DEFAULT + " (chosen from the request's sampling parameters)"),
    "executor_worker_path": Param(PATH, set_by="the image's trtllmExecutorWorker, as the template"),
    "lookahead_window_size": Param(count(1), omitted=_SPEC),
    "lookahead_ngram_size": Param(count(1), omitted=_SPEC),
    "lookahead_verification_set_size": Param(count(1), omitted=_SPEC),
    "medusa_choices": Param(TEXT, omitted=_SPEC),
    "eagle_choices": Param(TEXT, omitted=_SPEC),
    "gpu_weights_percent": Param(Domain("float", low=0, high=1), omitted="weight streaming is not used (all weights on GPU)"),
    "enable_context_fmha_fp32_acc": Param(BOOL, omitted=_DEFAULT + " (fp16/bf16 accumulation)"),
    "multi_block_mode": Param(BOOL, omitted=_DEFAULT + " (on since TensorRT-LLM 0.13)"),
    "cuda_graph_mode": Param(BOOL, set_by="engine.use_cuda_graph"),
    "cuda_graph_cache_size": Param(count(0), omitted=_DEFAULT),
    "speculative_decoding_fast_logits": Param(BOOL, omitted=_SPEC),
    "tokenizer_dir": Param(PATH, omitted="read only for guided decoding, which is not configured"),
    "guided_decoding_backend": Param(Domain("enum", choices=("xgrammar",)), omitted="guided decoding is not configured"),
    "xgrammar_tokenizer_info_path": Param(PATH, omitted="guided decoding is not configured"),
}
EXECUTOR_WORKER_PATH = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"

_MULTIMODAL = "multimodal inputs are not part of this toolkit's deployments"
PREPROCESSING_PARAMS: dict[str, Param] = {
    "tokenizer_dir": Param(PATH, set_by="the tokenizer copied beside the engine"),
    "add_special_tokens": Param(BOOL, set_by="true (BOS as the model was trained), the template's default"),
    "multimodal_model_path": Param(PATH, omitted=_MULTIMODAL),
    "gpt_model_path": Param(PATH, omitted="read by upstream's preprocessing for multimodal models only"),
    "max_num_images": Param(count(1), omitted=_MULTIMODAL),
    "hf_model_path": Param(PATH, omitted=_MULTIMODAL),
}
POSTPROCESSING_PARAMS: dict[str, Param] = {
    "tokenizer_dir": Param(PATH, set_by="the tokenizer copied beside the engine"),
    "skip_special_tokens": Param(BOOL, set_by="true, the template's default"),
}
BLS_PARAMS: dict[str, Param] = {
    "accumulate_tokens": Param(BOOL, omitted="our BLS detokenizes incrementally with a held-back partial "
                                             "character (toolkit/repo/python_models/bls.py): neither mode applies"),
    "tensorrt_llm_model_name": Param(TEXT, set_by='"tensorrt_llm"'),
    "tensorrt_llm_draft_model_name": Param(TEXT, omitted=_SPEC),
    "multimodal_encoders_name": Param(TEXT, omitted=_MULTIMODAL),
}
PARAMS_BY_MODEL = {"tensorrt_llm": TRTLLM_PARAMS, "preprocessing": PREPROCESSING_PARAMS,
                   "postprocessing": POSTPROCESSING_PARAMS, "tensorrt_llm_bls": BLS_PARAMS}

# Tensors we add beyond the templates: (model, "input" | "output", name) → why.
_COUNT = "tokens in this response as the engine counted them, so clients need not re-tokenize lossy streamed text"
_EOS = "fixed-length benchmarks (vLLM / AIPerf convention): generate exactly max_tokens tokens"
EXTENSIONS: dict[tuple[str, str, str], str] = {
    ("preprocessing", "input", "IGNORE_EOS"): _EOS,
    ("ensemble", "input", "ignore_eos"): _EOS,
    ("tensorrt_llm_bls", "input", "ignore_eos"): _EOS,
    ("postprocessing", "output", "OUTPUT_TOKEN_COUNT"): _COUNT,
    ("ensemble", "output", "output_token_count"): _COUNT,
    ("tensorrt_llm_bls", "output", "output_token_count"): _COUNT,
}

# The llmapi model's model.yaml: `triton_config` keys its model.py reads, and LLM(...) arguments — the fields
# of BaseLlmArgs + TorchLlmArgs (StrictBaseModel, extra="forbid": an unknown key stops LLM(...)) and of the
# nested configs we write, as tensorrt_llm/llmapi/llm_args.py declares them (read 2026-11-23 from a stored
# version whose TorchLlmArgs ends with ray_worker_extension_cls and whose KvCacheConfig has tokens_per_block).
# Not verified at v1.1.0 itself (commit 48b7b5d8): no copy of that release could be read here, see
# tests/data/upstream/README.md. `mpi_session` is left out: model.py sets it itself.
LLMAPI_TRITON_CONFIG_KEYS = ("max_batch_size", "decoupled", "cancellation_check_period_ms")
LLMAPI_ARGS = frozenset("""
model tokenizer tokenizer_mode skip_tokenizer_init trust_remote_code tensor_parallel_size dtype revision
tokenizer_revision pipeline_parallel_size context_parallel_size gpus_per_node moe_cluster_parallel_size
moe_tensor_parallel_size moe_expert_parallel_size enable_attention_dp enable_lm_head_tp_in_adp cp_config
load_format fail_fast_on_attention_window_too_large enable_lora lora_config kv_cache_config
enable_chunked_prefill guided_decoding_backend batched_logits_processor iter_stats_max_iterations
request_stats_max_iterations peft_cache_config scheduler_config cache_transceiver_config
sparse_attention_config speculative_config max_batch_size max_input_len max_seq_len max_beam_width
max_num_tokens gather_generation_logits num_postprocess_workers postprocess_tokenizer_dir reasoning_parser
decoding_config backend return_perf_metrics orchestrator_type
build_config garbage_collection_gen0_threshold cuda_graph_config attention_dp_config disable_overlap_scheduler
moe_config attn_backend sampler_type enable_iter_perf_stats enable_iter_req_stats print_iter_log
perf_metrics_max_requests batch_wait_timeout_ms batch_wait_timeout_iters batch_wait_max_tokens_ratio
torch_compile_config enable_autotuner enable_layerwise_nvtx_marker enable_min_latency stream_interval
force_dynamic_quantization allreduce_strategy checkpoint_loader checkpoint_format kv_connector_config
mm_encoder_only ray_worker_extension_cls
""".split())
LLMAPI_NESTED = {
    "kv_cache_config": frozenset("""enable_block_reuse max_tokens max_attention_window sink_token_length
        free_gpu_memory_fraction host_cache_size onboard_blocks cross_kv_cache_fraction secondary_offload_min_priority
        event_buffer_max_size attention_dp_events_gather_period_ms enable_partial_reuse copy_on_partial_reuse use_uvm
        max_gpu_total_bytes dtype mamba_ssm_cache_dtype tokens_per_block""".split()),
    "scheduler_config": frozenset({"capacity_scheduler_policy", "context_chunking_policy", "dynamic_batch_config"}),
    "cuda_graph_config": frozenset({"batch_sizes", "max_batch_size", "enable_padding"}),
}
LLMAPI_ENUMS = {
    ("scheduler_config", "capacity_scheduler_policy"): ("MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH"),
    # The PyTorch backend syncs "fp8" into the checkpoint's KV quantization; "auto" follows the checkpoint.
    ("kv_cache_config", "dtype"): ("auto", "fp8"),
    ("", "dtype"): ("auto", "float16", "bfloat16", "float32"),
    ("", "backend"): ("pytorch", "_autodeploy"),
}
LLMAPI_RANGES = {
    ("kv_cache_config", "free_gpu_memory_fraction"): Domain("float", low=0, high=1),
    ("kv_cache_config", "tokens_per_block"): count(1),
    ("", "tensor_parallel_size"): count(1),
    ("", "pipeline_parallel_size"): count(1),
    ("", "max_batch_size"): count(1),
    ("", "max_num_tokens"): count(1),
    ("", "max_seq_len"): count(1),
}


def llmapi_problems(options: dict) -> list[tuple[str, str, str]]:
    """(key, problem, fix) for every LLM-API argument in a model.yaml / extra options dict that TensorRT-LLM
    would reject: unknown names (LLM(...) is strict), unknown nested fields, values outside an enumeration."""
    found = []
    for key, value in options.items():
        if key == "triton_config":
            continue
        if key not in LLMAPI_ARGS:
            found.append((key, f'"{key}" is not an LLM API argument (TorchLlmArgs, TensorRT-LLM {TRTLLM_VERSION})',
                          "remove it or fix its spelling; LLM(...) rejects unknown arguments"))
        elif key in LLMAPI_NESTED and isinstance(value, dict):
            found += [(sub, f'"{key}.{sub}" is not a field of {key} (TensorRT-LLM {TRTLLM_VERSION})',
                       "remove it or fix its spelling") for sub in value if sub not in LLMAPI_NESTED[key]]
    for (section, key), choices in LLMAPI_ENUMS.items():
        holder = options.get(section) if section else options
        value = holder.get(key) if isinstance(holder, dict) else None
        if value is not None and str(value) not in choices:
            name = f"{section}.{key}" if section else key
            found.append((key, f'{name} = "{value}" is not one of {", ".join(choices)}', f"set {name} to one of them"))
    for (section, key), domain in LLMAPI_RANGES.items():
        holder = options.get(section) if section else options
        value = holder.get(key) if isinstance(holder, dict) else None
        problem = domain.problem(str(value)) if value is not None else None
        if problem:
            name = f"{section}.{key}" if section else key
            found.append((key, f"{name} = {value} {problem}", f"set {name} within its range"))
    return found
