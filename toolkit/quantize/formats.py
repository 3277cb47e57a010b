"""qformat names (TensorRT-LLM / ModelOpt conventions) → ModelOpt quantization configs."""

from __future__ import annotations

import copy

from toolkit.errors import ToolkitError

MTQ_CONFIG_NAMES = {
    "fp8": "FP8_DEFAULT_CFG",
    "int4_awq": "INT4_AWQ_CFG",
    "int8_sq": "INT8_SMOOTHQUANT_CFG",
    "w4a8_awq": "W4A8_AWQ_BETA_CFG",
}
AWQ_FORMATS = {"int4_awq", "w4a8_awq"}
# Bits per weight element as stored (scales excluded) — used for size estimates and the planner.
WEIGHT_BITS = {"none": 16, "fp8": 8, "int8_sq": 8, "int4_awq": 4, "w4a8_awq": 4}
_KV_BITS = {"fp8": (4, 3), "int8": 8}


def modelopt_config(qformat: str, kv_cache_dtype: str) -> dict:
    """The mtq config dict for a qformat, with KV-cache quantizers appended when asked for."""
    import modelopt.torch.quantization as mtq

    if qformat not in MTQ_CONFIG_NAMES:
        raise ToolkitError(f"unknown qformat {qformat!r}", f"use one of: none, {', '.join(MTQ_CONFIG_NAMES)}")
    config = copy.deepcopy(getattr(mtq, MTQ_CONFIG_NAMES[qformat]))
    if kv_cache_dtype != "none":
        config["quant_cfg"] = list(config["quant_cfg"]) + [
            {"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": _KV_BITS[kv_cache_dtype], "axis": None}},
        ]
    return config
