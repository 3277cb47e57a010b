"""Quantization formats: one table that the config, the CLI, the planner, quantize and the builds read.

A format's name is its ModelOpt / TensorRT-LLM `qformat` (hf_ptq.py spelling). Each row says how the
weights are stored (bits, group size, scale bytes), what the GPU's matmuls compute in (which decides
the tensor-core peak the planner uses and which GPUs can run it), how ModelOpt calibrates it, what
TensorRT-LLM calls it (`quant_algo` in hf_quant_config.json / QuantConfig) and what the embedded CPU
engine does with it. Element types (weights and KV cache) are the second table, `DTYPES`.

Nothing here imports ModelOpt or torch at module level: the config imports this file.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from toolkit.errors import ToolkitError


@dataclass(frozen=True)
class DType:
    name: str
    bytes: float


DTYPES: dict[str, DType] = {d.name: d for d in [
    DType("fp32", 4), DType("bf16", 2), DType("fp16", 2), DType("fp8", 1), DType("int8", 1),
    DType("int4", 0.5), DType("fp4", 0.5),
]}
UNQUANTIZED_DTYPES = ("fp32", "bf16", "fp16")  # what a model without a qformat holds its weights in
KV_ELEMENT_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")  # what a planned KV cache is held in


@dataclass(frozen=True)
class QuantFormat:
    name: str  # qformat, as ModelOpt's hf_ptq.py and the config spell it
    weight_dtype: str | None  # storage of the quantized linears (None: the model's own dtype)
    group_size: int | None  # weights per scale for block-scaled formats; None: per channel / per tensor
    scale_dtype: str | None  # dtype of those block scales
    gpu_compute: str | None  # what the GPU's matmuls run in: picks the tensor-core peak (None: model dtype)
    gpu_requirement: str  # which GPUs have kernels for it (the planner checks the catalog's peaks)
    modelopt_config: str | None  # mtq.<name> used to calibrate
    calibration_needs_cuda: bool
    trtllm_quant_algo: str | None  # QuantAlgo / hf_quant_config.json "quant_algo"
    trtllm_gemm_plugin: str  # trtllm-build --gemm_plugin
    cpu_kernel: str | None  # what the embedded CPU engine's linears run (a cpu_probe kernel); None: refused
    cpu_note: str  # in words, for plans and errors
    kv_cache_dtypes: tuple[str, ...] = ("none", "fp8", "int8")

    @property
    def weight_bits(self) -> float | None:
        return None if self.weight_dtype is None else DTYPES[self.weight_dtype].bytes * 8

    @property
    def is_block_scaled(self) -> bool:
        return self.group_size is not None


_INT4_GROUP = 128  # AWQ's block size (quantize.awq_block_size); one fp16 scale per 128 weights
_NVFP4_GROUP = 16  # NVFP4: an fp8 (E4M3) scale per 16 fp4 (E2M1) values, plus one fp32 scale per tensor

QFORMATS: dict[str, QuantFormat] = {f.name: f for f in [
    QuantFormat("none", weight_dtype=None, group_size=None, scale_dtype=None, gpu_compute=None,
                gpu_requirement="any GPU", modelopt_config=None, calibration_needs_cuda=False,
                trtllm_quant_algo=None, trtllm_gemm_plugin="auto",
                cpu_kernel="bf16", cpu_note="bf16 weights on the bf16 GEMM"),
    QuantFormat("fp8", weight_dtype="fp8", group_size=None, scale_dtype=None, gpu_compute="fp8",
                gpu_requirement="fp8 tensor cores (Ada, Hopper, Blackwell)", modelopt_config="FP8_DEFAULT_CFG",
                calibration_needs_cuda=False, trtllm_quant_algo="FP8", trtllm_gemm_plugin="disable",
                cpu_kernel="fp8",
                cpu_note="fp8 weights as exported, on the engine's fp8 kernel (bf16 dot products, AVX512-BF16; "
                         "else re-quantized to int8 per channel, on VNNI or AVX2 x activations rounded to int8 per 128 "
                         "after their fp8 rounding, engine.int4_activations: bf16 keeps them fp8 values): torch "
                         "2.13's CPU fp8 paths (_scaled_mm, fp8 → bf16 casts) ran at ~0.05 GB/s here (2026-11-23), "
                         "far below memory speed"),
    QuantFormat("int8_sq", weight_dtype="int8", group_size=None, scale_dtype=None, gpu_compute="int8",
                gpu_requirement="int8 tensor cores (Ampere and later)", modelopt_config="INT8_SMOOTHQUANT_CFG",
                calibration_needs_cuda=False, trtllm_quant_algo="W8A8_SQ_PER_CHANNEL", trtllm_gemm_plugin="auto",
                cpu_kernel="int8a8",
                cpu_note="int8 weights, activations rounded to int8 as calibrated: int8 x int8 dot products "
                         "(AVX512-VNNI where the CPU has it, else the int8 weight-only kernel)"),
    QuantFormat("int4_awq", weight_dtype="int4", group_size=_INT4_GROUP, scale_dtype="fp16", gpu_compute="bf16",
                gpu_requirement="W4A16 kernels (Ampere and later)", modelopt_config="INT4_AWQ_CFG",
                calibration_needs_cuda=False, trtllm_quant_algo="W4A16_AWQ", trtllm_gemm_plugin="auto",
                cpu_kernel="int4",
                cpu_note="packed int4, group 128; decode rows on an int4 x int8 kernel (activations rounded to int8 "
                         "per 128 inputs, AVX512-VNNI; engine.int4_activations: bf16 keeps them exact), prompts on "
                         "the weights widened to bf16"),
    QuantFormat("w4a8_awq", weight_dtype="int4", group_size=_INT4_GROUP, scale_dtype="fp16", gpu_compute="fp8",
                gpu_requirement="fp8 tensor cores (Ada, Hopper, Blackwell)", modelopt_config="W4A8_AWQ_BETA_CFG",
                calibration_needs_cuda=False, trtllm_quant_algo="W4A8_AWQ", trtllm_gemm_plugin="auto",
                cpu_kernel="w4a8",
                cpu_note="packed int4, group 128, activations rounded to fp8 as calibrated, then as INT4-AWQ's "
                         "(decode rows x int8 per 128 inputs on VNNI; engine.int4_activations: bf16 keeps the fp8 "
                         "values exact)"),
    QuantFormat("nvfp4", weight_dtype="fp4", group_size=_NVFP4_GROUP, scale_dtype="fp8", gpu_compute="fp4",
                gpu_requirement="fp4 tensor cores (Blackwell)", modelopt_config="NVFP4_DEFAULT_CFG",
                calibration_needs_cuda=True, trtllm_quant_algo="NVFP4", trtllm_gemm_plugin="nvfp4",
                cpu_kernel=None,
                cpu_note="not on CPU: NVFP4 calibration needs CUDA, so no checkpoint exists here to serve",
                kv_cache_dtypes=("none", "fp8")),
]}
QFORMAT_NAMES = tuple(QFORMATS)
KV_CACHE_DTYPES = ("none", "fp8", "int8")  # `none`: the model's dtype
# TensorRT-LLM's kv_cache_quant_algo (hf_quant_config.json) per kv_cache_dtype.
TRTLLM_KV_QUANT_ALGO = {"none": None, "fp8": "FP8", "int8": "INT8"}
# Old planner spellings of weight formats.
_ALIASES = {"int8": "int8_sq", "int4": "int4_awq"}
WEIGHT_FORMATS = UNQUANTIZED_DTYPES + tuple(n for n in QFORMATS if n != "none")


def qformat(name: str) -> QuantFormat:
    if name not in QFORMATS:
        raise ToolkitError(f"unknown qformat {name!r}", f"use one of: {', '.join(QFORMATS)}")
    return QFORMATS[name]


def weight_format(name: str) -> tuple[QuantFormat, str]:
    """A plan's weight format (an unquantized dtype or a qformat) → (format row, dtype of everything
    the format does not quantize: embeddings, lm_head, norms)."""
    name = _ALIASES.get(name, name)
    if name in UNQUANTIZED_DTYPES:
        return QFORMATS["none"], name
    if name in QFORMATS and name != "none":
        return QFORMATS[name], "bf16"
    raise ToolkitError(f"unknown weight format {name!r}", f"use one of: {', '.join(WEIGHT_FORMATS)}")


def weight_bytes_per_element(name: str) -> float:
    """Bytes per quantized-linear weight, block scales included (int4 g128: 0.5 + 2/128)."""
    fmt, dtype = weight_format(name)
    if fmt.weight_dtype is None:
        return DTYPES[dtype].bytes
    scales = DTYPES[fmt.scale_dtype].bytes / fmt.group_size if fmt.is_block_scaled else 0.0
    return DTYPES[fmt.weight_dtype].bytes + scales


def formats_of_checkpoint(checkpoint_dir) -> tuple[str, str] | None:
    """(qformat, kv_cache_dtype) a checkpoint was exported in, from the quant_algo ModelOpt wrote
    (hf_quant_config.json of a unified checkpoint, config.json's `quantization` of a TensorRT-LLM one);
    None when it says nothing (an unquantized checkpoint, or no checkpoint)."""
    import json
    from pathlib import Path

    for name, key in (("hf_quant_config.json", "quantization"), ("config.json", "quantization")):
        path = Path(checkpoint_dir) / name
        if not path.is_file():
            continue
        section = json.loads(path.read_text()).get(key) or {}
        algo = section.get("quant_algo")
        if algo:
            by_algo = {f.trtllm_quant_algo: f.name for f in QFORMATS.values() if f.trtllm_quant_algo}
            if algo not in by_algo:
                raise ToolkitError(f"{path}: quant_algo {algo} is not a format this toolkit knows",
                                   f"use a checkpoint in one of: {', '.join(by_algo)}")
            kv = {v: k for k, v in TRTLLM_KV_QUANT_ALGO.items() if v}.get(section.get("kv_cache_quant_algo"), "none")
            return by_algo[algo], kv
    return None


def trtllm_build_flags(qformat_name: str, kv_cache_dtype: str) -> list[str]:
    """The quantization-dependent `trtllm-build` flags. The quantization itself travels in the
    checkpoint (quant_algo / kv_cache_quant_algo in its config), not in flags."""
    fmt = qformat(qformat_name)
    check_kv_cache_dtype(fmt, kv_cache_dtype)
    flags = ["--gemm_plugin", fmt.trtllm_gemm_plugin]
    if fmt.gpu_compute in ("fp8", "fp4") or kv_cache_dtype == "fp8":
        flags += ["--use_fp8_context_fmha", "enable"]  # attention's context phase in fp8 beside fp8 GEMMs / KV
    return flags


def check_kv_cache_dtype(fmt: QuantFormat, kv_cache_dtype: str) -> None:
    if kv_cache_dtype not in fmt.kv_cache_dtypes:
        raise ToolkitError(f"qformat {fmt.name} does not take kv_cache_dtype {kv_cache_dtype}",
                           f"use one of: {', '.join(fmt.kv_cache_dtypes)}")


def modelopt_config(qformat_name: str, kv_cache_dtype: str, device: str = "cpu") -> dict:
    """The mtq config dict for a qformat, with KV-cache quantizers appended when asked for.
    `device`: where the model is calibrated (quantize.calib_device)."""
    fmt = qformat(qformat_name)
    if fmt.modelopt_config is None:
        raise ToolkitError(f"qformat {fmt.name} is not quantized: there is nothing to calibrate",
                           f"use one of: {', '.join(n for n in QFORMATS if n != 'none')}")
    check_kv_cache_dtype(fmt, kv_cache_dtype)
    if fmt.calibration_needs_cuda and not device.startswith("cuda"):
        raise ToolkitError(f"{fmt.name} calibration needs CUDA (ModelOpt's {fmt.modelopt_config} keeps its scales "
                           f"on the GPU) and this calibration runs on {device}",
                           "quantize on a GPU machine (quantize.calib_device: auto or cuda), or pick a format that calibrates on CPU "
                           "(fp8, int4_awq)")
    import modelopt.torch.quantization as mtq

    config = copy.deepcopy(getattr(mtq, fmt.modelopt_config))
    if kv_cache_dtype != "none":
        bits = {"fp8": (4, 3), "int8": 8}[kv_cache_dtype]
        config["quant_cfg"] = list(config["quant_cfg"]) + [
            {"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": bits, "axis": None}},
        ]
    return config


# The formats whose per-rank input width must be a multiple of the AWQ block (TP shape checks).
AWQ_FORMATS = {n for n, f in QFORMATS.items() if f.trtllm_quant_algo and "AWQ" in f.trtllm_quant_algo}
