"""Checks that a model's shapes allow a qformat at a tensor-parallel size, before minutes of calibration."""

from __future__ import annotations

from toolkit.errors import ToolkitError
from toolkit.model.spec import ModelSpec
from toolkit.quantize.formats import AWQ_FORMATS


def check_tp_shapes(spec: ModelSpec, qformat: str, tp: int, awq_block_size: int = 128) -> None:
    """Raise a ToolkitError naming the first layer whose per-rank shape does not split.

    Row-parallel layers (o_proj, down_proj) are split on their input dimension, so with AWQ each
    rank's input width must be a whole number of quantization blocks.
    """
    if spec.num_heads % tp:
        raise ToolkitError(f"tp={tp} does not divide the {spec.num_heads} attention heads of {spec.name}",
                           f"choose tp from {_divisors(spec.num_heads)}")
    if spec.num_kv_heads % tp and tp % spec.num_kv_heads:
        raise ToolkitError(f"tp={tp} neither divides nor is a multiple of the {spec.num_kv_heads} KV heads",
                           f"choose tp from {_divisors(spec.num_kv_heads)} or a multiple of {spec.num_kv_heads}")
    if spec.intermediate_size % tp:
        raise ToolkitError(f"tp={tp} does not divide intermediate_size={spec.intermediate_size}",
                           f"choose tp from {_divisors(spec.intermediate_size)[:8]}")
    if qformat not in AWQ_FORMATS:
        return
    row_parallel_inputs = {
        "self_attn.o_proj": spec.num_heads * spec.head_dim // tp,
        "mlp.down_proj": spec.intermediate_size // tp,
        "self_attn.q_proj/k_proj/v_proj, mlp.gate_proj/up_proj": spec.hidden_size,
    }
    for layer, width in row_parallel_inputs.items():
        if width % awq_block_size:
            ok_tps = [t for t in range(1, 9) if _awq_ok(spec, t, awq_block_size)]
            raise ToolkitError(
                f"{qformat} with tp={tp}: {layer} has {width} input columns per rank, "
                f"not a multiple of the AWQ block size {awq_block_size}",
                f"use tp in {ok_tps or 'none ≤ 8'}, or qformat fp8 / int8_sq",
            )


def _awq_ok(spec: ModelSpec, tp: int, block: int) -> bool:
    return (spec.num_heads % tp == 0 and spec.intermediate_size % tp == 0
            and (spec.num_heads * spec.head_dim // tp) % block == 0
            and (spec.intermediate_size // tp) % block == 0 and spec.hidden_size % block == 0)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, min(n, 64) + 1) if n % d == 0]
