"""The inflight_batcher_llm layout: the four models, their tensors and the ensemble's wiring.

Names and tensors follow the TensorRT-LLM backend's templates (triton_backend/all_models/
inflight_batcher_llm, and llmapi for the engine-free target), so clients written for that layout work
against ours unchanged. Each tensor we declare has the template's type, dims, reshape, optional and
allow_ragged_batch (tests/test_upstream_templates.py compares them); what we add beyond the templates is
listed, with the reason, in toolkit/repo/upstream.py (EXTENSIONS).
"""

from __future__ import annotations

from toolkit.repo.pbtxt import EnsembleStep, TensorSpec

I32, BOOL, STR, FP32, U64 = "TYPE_INT32", "TYPE_BOOL", "TYPE_STRING", "TYPE_FP32", "TYPE_UINT64"

PREPROCESSING_INPUTS = [
    TensorSpec("QUERY", STR, (1,)),
    TensorSpec("REQUEST_OUTPUT_LEN", I32, (1,)),
    TensorSpec("END_ID", I32, (1,), optional=True),
    TensorSpec("IGNORE_EOS", BOOL, (1,), optional=True),
]
PREPROCESSING_OUTPUTS = [
    TensorSpec("INPUT_ID", I32, (-1,)),
    TensorSpec("REQUEST_INPUT_LEN", I32, (1,)),
    TensorSpec("REQUEST_OUTPUT_LEN", I32, (-1,)),
    TensorSpec("OUT_END_ID", I32, (1,)),
]
# Triton batches requests for the engine model (dynamic_batching, max_batch_size > 0): prompts of any
# length share a batch (ragged input_ids), and per-request values arrive as [batch] (reshape to scalar);
# the TensorRT-LLM backend rejects a [batch, 1] input_lengths.
ENGINE_INPUTS = [
    TensorSpec("input_ids", I32, (-1,), optional=True, ragged=True),
    TensorSpec("input_lengths", I32, (1,), scalar=True),
    TensorSpec("request_output_len", I32, (1,), scalar=True),
    TensorSpec("end_id", I32, (1,), optional=True, scalar=True),
    TensorSpec("streaming", BOOL, (1,), optional=True, scalar=True),
    # Sampling, as the template carries it (none sent: greedy; the CPU engine's sampling.py).
    TensorSpec("beam_width", I32, (1,), optional=True, scalar=True),
    TensorSpec("temperature", FP32, (1,), optional=True, scalar=True),
    TensorSpec("runtime_top_k", I32, (1,), optional=True, scalar=True),
    TensorSpec("runtime_top_p", FP32, (1,), optional=True, scalar=True),
    TensorSpec("seed", U64, (1,), optional=True, scalar=True),
]
ENGINE_OUTPUTS = [
    TensorSpec("output_ids", I32, (-1, -1)),
    TensorSpec("sequence_length", I32, (-1,)),
]
POSTPROCESSING_INPUTS = [
    TensorSpec("TOKENS_BATCH", I32, (-1, -1)),
    TensorSpec("SEQUENCE_LENGTH", I32, (-1,)),
]
POSTPROCESSING_OUTPUTS = [TensorSpec("OUTPUT", STR, (-1,)), TensorSpec("OUTPUT_TOKEN_COUNT", I32, (1,))]

ENSEMBLE_INPUTS = [
    TensorSpec("text_input", STR, (1,)),
    TensorSpec("max_tokens", I32, (1,)),
    TensorSpec("stream", BOOL, (1,), optional=True),
    TensorSpec("end_id", I32, (1,), optional=True),
    TensorSpec("ignore_eos", BOOL, (1,), optional=True),
    TensorSpec("top_k", I32, (1,), optional=True),
    TensorSpec("top_p", FP32, (1,), optional=True),
    TensorSpec("temperature", FP32, (1,), optional=True),
    TensorSpec("seed", U64, (1,), optional=True),
    TensorSpec("beam_width", I32, (1,), optional=True),
]
# The ensemble's sampling inputs → the engine model's (the template's wiring).
SAMPLING_TO_ENGINE = {"runtime_top_k": "top_k", "runtime_top_p": "top_p", "temperature": "temperature",
                      "seed": "seed", "beam_width": "beam_width"}
# output_token_count: tokens in this response, as the engine counted them. Clients should prefer it
# to re-tokenizing text_output (a streamed token can be a partial UTF-8 character, so text is lossy).
ENSEMBLE_OUTPUTS = [TensorSpec("text_output", STR, (-1,)), TensorSpec("output_token_count", I32, (1,))]

ENSEMBLE_STEPS = [
    EnsembleStep("preprocessing",
                 inputs={"QUERY": "text_input", "REQUEST_OUTPUT_LEN": "max_tokens", "END_ID": "end_id",
                         "IGNORE_EOS": "ignore_eos"},
                 outputs={"INPUT_ID": "_INPUT_ID", "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
                          "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN", "OUT_END_ID": "_END_ID"}),
    EnsembleStep("tensorrt_llm",
                 inputs={"input_ids": "_INPUT_ID", "input_lengths": "_REQUEST_INPUT_LEN",
                         "request_output_len": "_REQUEST_OUTPUT_LEN", "end_id": "_END_ID", "streaming": "stream",
                         **SAMPLING_TO_ENGINE},
                 outputs={"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH"}),
    EnsembleStep("postprocessing",
                 inputs={"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
                 outputs={"OUTPUT": "text_output", "OUTPUT_TOKEN_COUNT": "output_token_count"}),
]

# The engine-free target: TensorRT-LLM's own llmapi python model (text in, text out). All of its
# template's tensors, so the generated config.pbtxt is the template's with max_batch_size and
# decoupled written out (see writer.llmapi_model_config).
LLMAPI_INPUTS = [
    TensorSpec("text_input", STR, (-1,)),
    TensorSpec("image_url", STR, (-1,), optional=True),
    TensorSpec("streaming", BOOL, (1,), optional=True),
    TensorSpec("sampling_param_best_of", I32, (1,), optional=True),
    TensorSpec("sampling_param_temperature", FP32, (1,), optional=True),
    TensorSpec("sampling_param_top_k", I32, (1,), optional=True),
    TensorSpec("sampling_param_top_p", FP32, (1,), optional=True),
    TensorSpec("sampling_param_frequency_penalty", FP32, (1,), optional=True),
    TensorSpec("sampling_param_presence_penalty", FP32, (1,), optional=True),
    TensorSpec("sampling_param_max_tokens", I32, (1,), optional=True),
    TensorSpec("sampling_param_stop", STR, (-1,), optional=True),
    TensorSpec("sampling_param_seed", U64, (1,), optional=True),
    TensorSpec("sampling_param_exclude_input_from_output", BOOL, (1,), optional=True),
    TensorSpec("sampling_param_return_perf_metrics", BOOL, (1,), optional=True),
    TensorSpec("return_finish_reason", BOOL, (1,), optional=True),
    TensorSpec("return_stop_reason", BOOL, (1,), optional=True),
    TensorSpec("return_cumulative_logprob", BOOL, (1,), optional=True),
    TensorSpec("stop", BOOL, (1,), optional=True),
    TensorSpec("lora_id", U64, (1,), optional=True),
    TensorSpec("lora_name", STR, (1,), optional=True),
    TensorSpec("lora_path", STR, (1,), optional=True),
    TensorSpec("lora_ckpt_source", STR, (1,), optional=True),
]
_I64 = "TYPE_INT64"
LLMAPI_OUTPUTS = [
    TensorSpec("text_output", STR, (-1,)),
    TensorSpec("finish_reason", STR, (-1,)),
    TensorSpec("stop_reason", STR, (-1,)),
    TensorSpec("cumulative_logprob", FP32, (-1,)),
    TensorSpec("kv_cache_reused_block", I32, (-1,)),
    TensorSpec("kv_cache_missed_block", I32, (-1,)),
    TensorSpec("kv_cache_alloc_new_blocks", I32, (-1,)),
    TensorSpec("kv_cache_alloc_total_blocks", I32, (-1,)),
    TensorSpec("kv_cache_hit_rate", FP32, (-1,)),
    TensorSpec("arrival_time_ns", _I64, (1,)),
    TensorSpec("first_scheduled_time_ns", _I64, (1,)),
    TensorSpec("first_token_time_ns", _I64, (1,)),
    TensorSpec("last_token_time_ns", _I64, (1,)),
    TensorSpec("acceptance_rate", FP32, (1,)),
    TensorSpec("total_accepted_draft_tokens", I32, (1,)),
    TensorSpec("total_draft_tokens", I32, (1,)),
]

MODEL_TENSORS = {
    "preprocessing": (PREPROCESSING_INPUTS, PREPROCESSING_OUTPUTS),
    "tensorrt_llm": (ENGINE_INPUTS, ENGINE_OUTPUTS),
    "postprocessing": (POSTPROCESSING_INPUTS, POSTPROCESSING_OUTPUTS),
    "ensemble": (ENSEMBLE_INPUTS, ENSEMBLE_OUTPUTS),
    "tensorrt_llm_bls": (ENSEMBLE_INPUTS, ENSEMBLE_OUTPUTS),
}
