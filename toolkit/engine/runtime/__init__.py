"""The embedded engine's runtime: model runner (quantized kernels, paged attention), scheduler
(in-flight batching, chunked prefill, KV block reuse, speculative decoding), sampling, metrics and
the per-step timeline. Importable and testable without Triton; the Triton python model
`tensorrt_llm` (toolkit/repo/python_models/cpu_engine.py) is a thin adapter over it.

Imports only torch, numpy, safetensors and the standard library (it runs inside Triton's python
backend process too), never the CLI or the stages.
"""
