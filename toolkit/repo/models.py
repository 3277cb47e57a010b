"""The inflight_batcher_llm layout: the four models, their tensors and the ensemble's wiring.

Names and tensors follow the TensorRT-LLM backend's templates (triton_backend/all_models/
inflight_batcher_llm), so clients written for that layout work against ours unchanged.
"""

from __future__ import annotations

from toolkit.repo.pbtxt import EnsembleStep, TensorSpec

I32, BOOL, STR = "TYPE_INT32", "TYPE_BOOL", "TYPE_STRING"

PREPROCESSING_INPUTS = [
    TensorSpec("QUERY", STR, (1,)),
    TensorSpec("REQUEST_OUTPUT_LEN", I32, (1,)),
    TensorSpec("END_ID", I32, (1,), optional=True),
    TensorSpec("IGNORE_EOS", BOOL, (1,), optional=True),
]
PREPROCESSING_OUTPUTS = [
    TensorSpec("INPUT_ID", I32, (-1,)),
    TensorSpec("REQUEST_INPUT_LEN", I32, (1,)),
    TensorSpec("REQUEST_OUTPUT_LEN", I32, (1,)),
    TensorSpec("OUT_END_ID", I32, (1,)),
]
ENGINE_INPUTS = [
    TensorSpec("input_ids", I32, (-1,)),
    TensorSpec("input_lengths", I32, (1,)),
    TensorSpec("request_output_len", I32, (1,)),
    TensorSpec("end_id", I32, (1,), optional=True),
    TensorSpec("streaming", BOOL, (1,), optional=True),
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
]
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
                         "request_output_len": "_REQUEST_OUTPUT_LEN", "end_id": "_END_ID", "streaming": "stream"},
                 outputs={"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH"}),
    EnsembleStep("postprocessing",
                 inputs={"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
                 outputs={"OUTPUT": "text_output", "OUTPUT_TOKEN_COUNT": "output_token_count"}),
]

MODEL_TENSORS = {
    "preprocessing": (PREPROCESSING_INPUTS, PREPROCESSING_OUTPUTS),
    "tensorrt_llm": (ENGINE_INPUTS, ENGINE_OUTPUTS),
    "postprocessing": (POSTPROCESSING_INPUTS, POSTPROCESSING_OUTPUTS),
    "ensemble": (ENSEMBLE_INPUTS, ENSEMBLE_OUTPUTS),
}
