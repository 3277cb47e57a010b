"""Linear kernels on the weights as ModelOpt exported them, kept in low precision.

  dense  bf16 (or fp32) weights: on a CPU with AMX, in tiles on the C AMX GEMM at every row count (decode and
         prefill); else the C few-row GEMM (AVX512-BF16, or AVX2 + FMA) for decode, `F.linear` above (in fp32 where this CPU runs
         that faster: `prefill_in_fp32`)
  int4   packed int4 with group scales — INT4-AWQ, W4A8-AWQ: with VNNI (or AVX2) the C int4 x int8 GEMM (16 output
         rows side by side) at every row count, its prompt chunks on AMX tiles where the CPU has them (the same bits);
         with bf16 activations (int4_activations: bf16, or no VNNI) on AMX widened tile by tile into bf16 tiles,
         group scales applied to each group's sums, at every row count, else the C GEMM with bf16 activations
         (AVX512-BF16, or AVX2 + FMA) up to 31 rows and prefill widened to bf16; without the C kernels
         `torch._weight_int4pack_mm_for_cpu`
  int8   int8 weights, per-channel scales — INT8 SmoothQuant: int8 x int8 on AMX tiles at every row count where
         the CPU has them, else on VNNI at every row count, 16 output rows side by side (all exact in integers:
         the same output on every path; AVX2 without VNNI: the same integers on vpmaddubsw); the C widening GEMM
         elsewhere;
         `torch._weight_int8pack_mm` / widened above
  fp8    fp8_e4m3 weights: `torch._scaled_mm` with fp8 activations off the CPU; with AMX, widened tile by tile
         into bf16 tiles at every row count; else on the CPU (whose fp8
         GEMM is a slow reference path in torch 2.13) ModelOpt's fp8 bytes as they are, turned into bf16 by a
         shift in the C GEMM (AVX512-BF16 dot products, exact but for fp8 subnormals, which count as zero),
         prefill widened to bf16; without AVX512-BF16 re-quantized to int8 per channel (stated once): on VNNI or AVX2
         times activations rounded to int8 per 128 after their fp8 rounding (the C int8 x int8 GEMM, every row
         count, as the int4 formats'; int4_activations bf16 keeps them fp8 values), else the widening int8 GEMM

Each linear also describes itself for the one-call C decode step (`native_linear`, csrc/decode_step.c).

Activation quantization is reproduced as ModelOpt calibrated it (static per-tensor `input_scale`):
FP8 and W4A8 round activations to fp8_e4m3, SmoothQuant to int8, before the GEMM. AWQ / SmoothQuant
`pre_quant_scale` multiplies the input; the runner folds it into the preceding RMSNorm weight where
every consumer of that norm shares it (q/k/v, gate/up), which is exact.

Linears that read the same input (q/k/v, gate/up) are fused into one GEMM when their formats allow.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from toolkit.engine.runtime.checkpoint import LinearWeights

log = logging.getLogger(__name__)
_FP8_MAX = 448.0
_INT8_MAX = 127.0
WIDEN_ROWS = 32  # from this many rows (prefill chunks), 8-bit weights are widened per call for the dense GEMM
# Up to this many rows the fused C GEMMs (native_kernels.py) beat torch's, measured on `small`'s shapes
# streaming from memory (perf/README.md): int8 1.6x at 1, 1.3x at 8, slower at 16. bf16 since its 6x4 register
# blocks (2026-11-26, Zen 4, a step's GEMMs): 2.0x oneDNN at 8 rows, 1.7x at 16, 1.3x at 31, 1.1x at 48; up to
# WIDEN_ROWS - 1, so prompt chunks from WIDEN_ROWS keep oneDNN. (int4: theirs from 1 row up to WIDEN_ROWS,
# where widening to bf16 takes over.)
NATIVE_BF16_ROWS = 31
NATIVE_INT8_ROWS = 8
# A whole decode step in one C call (csrc/decode_step.c) saves ~1 ms of Python per step, so it takes the
# C GEMMs to more rows than a lone linear would: measured on `small`, 16 sequences bf16 31.8 vs 34.5 ms,
# int4 24.9 vs 26.2; int8 on the widening kernel 47.5 vs 42.4 (so int8 stays at its own limit).
STEP_BF16_ROWS = NATIVE_BF16_ROWS
NATIVE_INT8_VNNI_ROWS = 16  # INT8-SQ's integer kernel (VNNI)
NATIVE_FP8_ROWS = 16  # FP8's kernel: bf16 dot products as the bf16 GEMM's, on half the bytes
# The AMX kernels take any row count: their weights, in tiles, stay in L2 across a prompt's 16-row chunks, and on
# `small` they ran the 16 layers' GEMMs at 128 rows in 17 ms (bf16) and 14 (int8) where oneDNN's took 28 and 23,
# flat from 2 to 16 rows at ~6 ms (bf16) where the AVX512-BF16 kernel went from 9 to 18 (2026-11-24, Xeon).
AMX_ROWS = 1 << 20
# From this many rows the int4 x int8 kernel runs on AMX tiles where the CPU has them (gemm_int4_a8_amx: the same
# weights and output bits; decode rows stay on VNNI, which ran `small`'s steps 1.1-2.3x as fast as AMX's bf16 tiles)
INT4_A8_AMX_ROWS = 16
_warned: set[str] = set()


def _say_once(key: str, message: str, level: int = logging.WARNING) -> None:
    if key not in _warned:
        _warned.add(key)
        log.log(level, message)


def fake_quant_activation(x, act_quant: str | None, input_scale):
    """x rounded to the activation format ModelOpt calibrated (static per-tensor scale), back in x's dtype."""
    import torch

    if act_quant is None:
        return x
    scaled = x.float() / input_scale
    if act_quant == "fp8":
        q = scaled.clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn).float()
    else:
        q = scaled.round().clamp(-_INT8_MAX - 1, _INT8_MAX)
    return (q * input_scale).to(x.dtype)


def fp8_scaled_mm_available(device: str) -> bool:
    import torch

    try:
        a = torch.zeros(16, 16, dtype=torch.float8_e4m3fn, device=device)
        one = torch.ones((), device=device)
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return True
    except (RuntimeError, NotImplementedError):
        return False


@functools.cache
def int8pack_mm_available(device: str) -> bool:
    """Whether torch has its weight-only int8 GEMM (`_weight_int8pack_mm`) on `device`'s type (CPU: yes)."""
    import torch

    try:
        torch._weight_int8pack_mm(torch.zeros(1, 64, dtype=torch.bfloat16, device=device),
                                  torch.zeros(64, 64, dtype=torch.int8, device=device),
                                  torch.ones(64, dtype=torch.bfloat16, device=device))
        return True
    except (RuntimeError, NotImplementedError):
        return False


_built_prompt_fp32: bool | None = None  # the engine build's choice (set_prompt_gemm_dtype), else timed here


def set_prompt_gemm_dtype(dtype: str | None) -> None:
    """The dtype an engine was built to run prompt GEMMs in ("bfloat16", "float32"; None or "auto": time it)."""
    global _built_prompt_fp32
    _built_prompt_fp32 = None if dtype in (None, "auto") else dtype == "float32"


def prefill_in_fp32() -> bool:
    """Whether a prompt chunk's bf16 GEMMs run as fp32 (inputs widened per call): TOOLKIT_PREFILL_DTYPE=bf16|fp32
    if set, else what the engine build chose (engine_config.json's prompt_gemm_dtype: `toolkit build` times it on
    a quiet machine, as trtllm-build picks its tactics), else timed once in this process. The same numbers either
    way (bf16 products are exact in fp32 and oneDNN's bf16 GEMM accumulates in fp32; only the summation order
    differs); which is faster depends on the CPU: oneDNN's bf16 GEMM ran ~400 GFLOP/s on a Zen 4 (2026-11-24
    morning) and 170 on a Xeon without AMX, whose fp32 GEMM ran 290 (afternoon)."""
    import os

    forced = os.environ.get("TOOLKIT_PREFILL_DTYPE")
    if forced in ("bf16", "fp32"):
        return forced == "fp32"
    if _built_prompt_fp32 is not None:
        return _built_prompt_fp32
    return time_prompt_gemm_in_fp32()


@functools.cache
def time_prompt_gemm_in_fp32() -> bool:
    """fp32 against bf16 on a `small`-sized layer (128 x 768 x 2048), the two alternated, best of 10 each after 3
    warm-up calls; fp32 when 10 % faster. Timed inside a starting server (its neighbours loading, a client
    sending) it chose bf16 in one demo of two here, hence the build-time choice above."""
    import time

    import torch
    import torch.nn.functional as F

    x, w = torch.randn(128, 768, dtype=torch.bfloat16), torch.randn(2048, 768, dtype=torch.bfloat16)

    def bf16_call():
        F.linear(x, w)

    def fp32_call():
        F.linear(x.float(), w.float()).to(torch.bfloat16)

    # The first calls page-fault their fresh fp32 buffers until glibc's mmap threshold adapts (a 6 MB widened weight:
    # 1.8 ms warm, up to 2.9 cold), and a server times this while its neighbours start: warm up, then alternate the
    # two so that a busy moment slows both, best of 10 each.
    times: dict = {bf16_call: [], fp32_call: []}
    for _ in range(3):
        bf16_call(), fp32_call()
    for i in range(20):
        fn = (bf16_call, fp32_call)[i % 2]
        start = time.perf_counter()
        fn()
        times[fn].append(time.perf_counter() - start)
    bf16, fp32 = min(times[bf16_call]), min(times[fp32_call])
    chosen = fp32 < 0.9 * bf16
    log.info("prompt-chunk GEMMs in %s on this CPU (bf16 %.2f ms, fp32 with widening %.2f ms per 128x768x2048)",
             "fp32" if chosen else "bf16", bf16 * 1e3, fp32 * 1e3)
    return chosen


def dense_gemm(x, weight):
    """x @ weight.T for prompt-sized inputs: in fp32 where this CPU's bf16 GEMM is the slower (prefill_in_fp32)."""
    import torch
    import torch.nn.functional as F

    if (x.dtype == weight.dtype == torch.bfloat16 and x.device.type == "cpu" and x.numel() >= WIDEN_ROWS * x.shape[-1]
            and prefill_in_fp32()):
        return F.linear(x.float(), weight.float()).to(torch.bfloat16)
    return F.linear(x, weight)


def _prefill_gemm(native, x, widened, act_quant, input_scale: float):
    """A prompt chunk's rows on an 8-bit format's weights widened to bf16: x rounded as calibrated (in C), then
    the dense GEMM, which at prompt length is ~2x the few-row kernels."""
    if act_quant is not None:
        x = native.round_activations(x, act_quant, input_scale)
    return dense_gemm(x, widened)


class Linear:
    """y = x @ W.T on stored weights; `weight_format` names what the kernel really runs."""

    weight_format = "?"
    weight_bytes = 0

    def __call__(self, x):
        raise NotImplementedError

    def native_linear(self):
        """This linear as the whole-step C driver runs it (native_kernels.NativeLinear), or None where it
        does not run on one of the few-row C GEMMs (the step then stays in Python)."""
        return None


def _amx_ready(native, weight, kind: str) -> bool:
    return native is not None and weight.device.type == "cpu" and native.amx_packable(weight, kind)


class DenseLinear(Linear):
    """bf16 (fp32, fp16) weights; with AMX (bf16) only in tiles (`packed`), `weight` then None."""

    def __init__(self, weight, dtype, native=None):
        import torch

        weight = weight.to(dtype)
        self.out_features, self.in_features = weight.shape
        self.native = native if native is not None and native.has_bf16_gemm else None
        self.weight_format = {"torch.bfloat16": "bf16", "torch.float32": "fp32", "torch.float16": "fp16"}[str(dtype)]
        self.weight_bytes = weight.numel() * weight.element_size()
        self.amx = dtype == torch.bfloat16 and _amx_ready(self.native, weight, "bf16")
        self.packed = self.native.pack_amx(weight, "bf16") if self.amx else None
        self.weight = None if self.amx else weight.contiguous()

    def __call__(self, x):
        import torch

        if self.amx and x.dtype == torch.bfloat16:
            return self.native.gemm_bf16_amx(x.reshape(-1, x.shape[-1]), self.packed, self.out_features).reshape(
                *x.shape[:-1], -1)
        if self.native is not None and x.dtype == torch.bfloat16 and x.numel() <= NATIVE_BF16_ROWS * x.shape[-1]:
            return self.native.gemm_bf16(x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], -1)
        return dense_gemm(x, self.dense_weight())

    def dense_weight(self):
        """The weights as [out, in] (unpacked from the tiles where they live there)."""
        import torch

        if self.weight is not None:
            return self.weight
        return self.native.unpack_amx(self.packed, self.out_features, self.in_features, torch.bfloat16)

    def native_linear(self):
        from toolkit.engine.runtime.native_kernels import LIN_BF16, LIN_BF16_AMX, NativeLinear

        if self.amx:
            return NativeLinear(LIN_BF16_AMX, self.packed, self.out_features, self.in_features, AMX_ROWS)
        if self.native is None or self.weight_format != "bf16":
            return None
        return NativeLinear(LIN_BF16, self.weight, *self.weight.shape, STEP_BF16_ROWS)


class Int4Linear(Linear):
    """Packed int4 (two per byte), per-group scales, zero point 0. With the fused C kernels, in their layout: with
    int8 activations (VNNI), pack_int4_lanes (16 output rows side by side) and the int4 x int8 kernel for decode
    rows and prompt chunks alike (chunks on AMX tiles where the CPU has them); with bf16 activations on an AMX CPU,
    pack_amx_int4's bf16 tiles at every row count; else native_kernels.pack_int4, decode rows on the int4 GEMM and
    prompt chunks on the weights widened to bf16 per call (twice as fast as torch's int4 kernel at 128 rows).
    Otherwise torch's CPU tile layout and `_weight_int4pack_mm_for_cpu`."""

    def __init__(self, values, scales, group_size: int, dtype, act_quant=None, input_scale=None, native=None,
                 int4_activations: str = "auto"):
        import torch

        if int4_activations not in INT4_ACTIVATIONS:
            raise ValueError(f"int4_activations {int4_activations!r} is not one of {', '.join(INT4_ACTIVATIONS)}")
        self.out_features, self.in_features = values.shape
        self.group_size = group_size
        self.device = values.device
        self.act_quant, self.input_scale = act_quant, input_scale
        self.input_scale_value = 1.0 if input_scale is None else float(input_scale)
        self.weight_format = f"int4-g{group_size}" + ("-a8" if act_quant else "")
        self.native = None
        self.amx = False
        self.int8_activations = False
        self.tile_rows = 0
        if (native is not None and native.has_bf16_gemm and dtype == torch.bfloat16 and values.device.type == "cpu"
                and native.int4_packable(self.in_features, group_size)):
            self.native = native
            self.int8_activations = _int8_activations(native, act_quant, group_size, int4_activations)
            if not self.int8_activations and native.amx_packable(values, "bf16"):  # in AMX tiles, every row count
                self.amx = True
                self.packed = native.pack_amx_int4(values)
                self.group_scales = scales.float().t().contiguous()  # [in / group, out]: 16 outputs' scales in a row
                self.weight_bytes = self.packed.numel() + self.group_scales.numel() * 4
                return
            if self.int8_activations:  # output rows in the vector lanes (gemm_int4_a8, decode_kernels.c)
                # from this many rows on AMX tiles where the CPU has them (0: never), here and in the C step alike
                self.tile_rows = INT4_A8_AMX_ROWS if native.has_int4_a8_amx else 0
                self.weight_format += "-int8act"
                self.packed, self.scales_fp32 = native.pack_int4_lanes(values), native.lane_scales(scales)
            else:
                self.packed, self.scales_fp32 = native.pack_int4(values), scales.float().contiguous()
            self.weight_bytes = self.packed.numel() + self.scales_fp32.numel() * 4
            return
        # torch's int4pack stores unsigned nibbles q + 8 and dequantizes as (q - 8) * scale + zero.
        if values.device.type == "cpu":
            self.packed = torch._convert_weight_to_int4pack_for_cpu((values.to(torch.int32) + 8).contiguous(), 1)
        else:  # CUDA layout (not exercised on this machine): uint8 [out, in/2], even column in the high nibble
            unsigned = values.to(torch.int32) + 8
            self.packed = torch._convert_weight_to_int4pack((unsigned[:, ::2] << 4 | unsigned[:, 1::2]).to(torch.uint8), 8)
        scales_t = scales.t().to(dtype).contiguous()  # [in / group, out]
        self.scales_and_zeros = torch.stack([scales_t, torch.zeros_like(scales_t)], dim=-1).contiguous()
        self.weight_bytes = values.numel() // 2 + self.scales_and_zeros.numel() * self.scales_and_zeros.element_size() // 2

    def __call__(self, x):
        import torch

        shape = x.shape
        if self.int8_activations:
            # decode rows and prompt chunks on the int4 x int8 kernel (at 128 prompt rows 2.5x the weights widened
            # for the dense bf16 GEMM, and a row's output the same in either), W4A8's fp8 rounding inside its pass
            # (int4's act_quant is None or fp8: checkpoint.QUANT_ALGOS)
            fp8_scale = self.input_scale_value if self.act_quant == "fp8" else None
            x2 = x.reshape(-1, shape[-1])
            y = self.native.gemm_int4_a8(x2, self.packed, self.scales_fp32, self.group_size, self.out_features,
                                         fp8_scale, tiles=0 < self.tile_rows <= x2.shape[0])
            return y.reshape(*shape[:-1], self.out_features)
        if self.act_quant is not None and self.native is not None:  # in C, as the fp8 and INT8-SQ prompt rows
            x = self.native.round_activations(x, self.act_quant, self.input_scale_value)
        else:
            x = fake_quant_activation(x, self.act_quant, self.input_scale)
        x2 = x.reshape(-1, shape[-1])
        if self.amx:
            y = self.native.gemm_int4_amx(x2, self.packed, self.group_scales, self.group_size, self.out_features)
        elif self.native is not None and x2.shape[0] < WIDEN_ROWS:
            y = self.native.gemm_int4(x2, self.packed, self.scales_fp32, self.group_size)
        elif self.native is not None:
            y = dense_gemm(x2, self.native.unpack_int4(self.packed, self.scales_fp32, self.group_size))
        elif self.device.type == "cpu":
            y = torch._weight_int4pack_mm_for_cpu(x2, self.packed, self.group_size, self.scales_and_zeros)
        else:
            y = torch._weight_int4pack_mm(x2, self.packed, self.group_size, self.scales_and_zeros)
        return y.reshape(*shape[:-1], self.out_features)

    def native_linear(self):
        from toolkit.engine.runtime.native_kernels import LIN_INT4, LIN_INT4_A8, LIN_INT4_AMX, NativeLinear

        if self.native is None:
            return None
        if self.amx:
            return NativeLinear(LIN_INT4_AMX, self.packed, self.out_features, self.in_features, AMX_ROWS,
                                self.group_scales, group=self.group_size, act_quant=self.act_quant,
                                input_scale=self.input_scale_value)
        return NativeLinear(LIN_INT4_A8 if self.int8_activations else LIN_INT4, self.packed, self.out_features,
                            self.in_features, WIDEN_ROWS - 1, self.scales_fp32, group=self.group_size,
                            act_quant=self.act_quant, input_scale=self.input_scale_value, tile_rows=self.tile_rows)


def _int8_activations(native, act_quant, group_size: int, int4_activations: str) -> bool:
    """Whether INT4-AWQ's and W4A8's linears (decode rows and prompt chunks) run on the int4 x int8 kernel
    (gemm_int4_a8, decode_kernels.c)."""
    if int4_activations == "bf16":
        return False
    if native.has_int4_a8 and group_size % 128 == 0:
        if int4_activations == "auto":  # the served default, not a fallback: said at info level (the weight
            # format, int4-g128-int8act, names it wherever the engine's kernels are shown)
            _say_once("int4-int8act", "int4 weights: activations (W4A8's after their fp8 rounding) "
                                      "rounded to int8 per 128 inputs for the int4 x int8 kernel (VNNI, or AVX2's "
                                      "vpmaddubsw), as llama.cpp's "
                                      "q4_0 x q8_0 (TensorRT-LLM keeps them in 16 or 8 bits); int4_activations: bf16 "
                                      "keeps them exact, slower", logging.INFO)
        return True
    if int4_activations == "int8":
        _say_once("int4-int8act-missing", "int4_activations int8 needs AVX512-VNNI or AVX2 and groups of a multiple of 128 "
                                          f"(here {group_size}): int4 weights run with bf16 activations instead")
    return False


class Int8Linear(Linear):
    """int8 weights with a per-output-channel scale (SmoothQuant's weights; activations fake-quantized to int8), or fp8
    weights re-quantized to int8 (fp8_as_int8; int8_activations: on the int8 x int8 per 128 kernel)."""

    def __init__(self, values, scales, dtype, act_quant=None, input_scale=None, native=None,
                 int8_activations: bool = False):
        import torch

        self.out_features, self.in_features = values.shape
        self.scales = scales.to(dtype).contiguous()
        self.native = native
        self.scales_fp32 = scales.float().contiguous() if native is not None else None
        self.input_scale_value = 1.0 if input_scale is None else float(input_scale)
        # INT8-SQ in integers: on AMX tiles (the weights kept only in tiles), else VNNI or its AVX2 port (see
        # decode_kernels.c; the port takes weights without -128, as ModelOpt rounds them)
        self.amx = act_quant == "int8" and native is not None and native.has_int8_vnni and _amx_ready(native, values, "int8")
        self.packed = native.pack_amx(values, "int8") if self.amx else None
        self.vnni = (native is not None and native.has_int8_vnni and act_quant == "int8" and not self.amx
                     and (not native.int8_weights_symmetric or int(values.min()) > -128))
        # fp8 served as int8 (fp8_as_int8): int8 x int8 per 128 inputs, decode rows and prompt chunks alike
        self.int8_activations = int8_activations and not (self.amx or self.vnni)
        if self.int8_activations:
            self.packed, self.scales_fp32 = native.pack_int8_a8(values, scales)
        self.weight = None if self.amx or self.vnni or self.int8_activations else values.contiguous()
        if self.vnni:  # in its own layout only (16 output rows side by side), decode rows and prompt chunks alike;
            # kept as tensor attributes, which the weight arena moves onto 2 MiB pages (a step streams them all)
            lanes = native.pack_int8_lanes(values, scales)
            self.packed, self.scales_fp32, self.weight_sums = lanes.weight, lanes.scale, lanes.sums
        self.act_quant, self.input_scale = act_quant, input_scale
        self.weight_format = "int8" + ("-a8" if act_quant else "")
        self.int8pack = int8pack_mm_available(values.device.type)  # the torch path's few-row GEMM (else widened)
        if not self.int8pack:
            _say_once("int8pack", f"int8 weights: torch {torch.__version__} has no weight-only int8 GEMM on "
                                  f"{values.device.type}; each GEMM widens them to the activation dtype (8-bit "
                                  "weight reads, a 16-bit copy written and read per call)")
        self.weight_bytes = values.numel() + self.scales.numel() * self.scales.element_size()

    def __call__(self, x):
        import torch
        import torch.nn.functional as F

        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.amx:
            y = self.native.gemm_int8_amx(x2, self.packed, self.scales_fp32, self.out_features, self.input_scale_value)
            return y.reshape(*shape[:-1], self.out_features)
        if self.vnni:  # decode rows and prompt chunks on the one kernel: a row's output whatever came with it
            y = self.native.gemm_int8_vnni(x2, self.lanes(), self.input_scale_value)
            return y.reshape(*shape[:-1], self.out_features)
        if self.int8_activations:  # likewise; the fp8 rounding inside the kernel's pass
            fp8_scale = self.input_scale_value if self.act_quant == "fp8" else None
            y = self.native.gemm_int8_a8(x2, self.packed, self.scales_fp32, self.out_features, fp8_scale)
            return y.reshape(*shape[:-1], self.out_features)
        if self.native is not None and x2.shape[0] <= NATIVE_INT8_ROWS:  # activation rounding fused in
            y = self.native.gemm_int8(x2, self.weight, self.scales_fp32, self.act_quant, self.input_scale_value)
            return y.reshape(*shape[:-1], self.weight.shape[0])
        if self.native is not None and x2.shape[0] >= WIDEN_ROWS and x2.dtype == torch.bfloat16:
            # Prefill: the few-row kernels are built for decode; the layer's weights widened to bf16 (one pass,
            # scale folded in) on the dense GEMM are ~2x faster at prompt length, the rounding done in C too.
            widened = self.native.widen_int8(self.weight, self.scales_fp32)
            return _prefill_gemm(self.native, x2, widened, self.act_quant, self.input_scale_value).reshape(*shape[:-1], -1)
        x2 = fake_quant_activation(x2, self.act_quant, self.input_scale)
        if (x2.shape[0] >= WIDEN_ROWS and x2.dtype != torch.float32) or not self.int8pack:
            # Prefill without the C kernels (or no int8 GEMM on this device): the weights widened to the activation
            # dtype for the dense GEMM.
            y = F.linear(x2, self.weight.to(x2.dtype)) * self.scales
        else:
            y = torch._weight_int8pack_mm(x2, self.weight, self.scales)
        return y.reshape(*shape[:-1], self.weight.shape[0])

    def lanes(self):
        from toolkit.engine.runtime.native_kernels import Int8Lanes

        return Int8Lanes(self.packed, self.scales_fp32, self.weight_sums, self.out_features, self.in_features)

    def native_linear(self):
        from toolkit.engine.runtime.native_kernels import (LIN_INT8, LIN_INT8_A8, LIN_INT8_AMX, LIN_INT8_VNNI,
                                                           NativeLinear)

        if self.native is None:
            return None
        if self.int8_activations:
            return NativeLinear(LIN_INT8_A8, self.packed, self.out_features, self.in_features, WIDEN_ROWS - 1,
                                self.scales_fp32, act_quant=self.act_quant, input_scale=self.input_scale_value)
        if self.amx:
            return NativeLinear(LIN_INT8_AMX, self.packed, self.out_features, self.in_features, AMX_ROWS,
                                self.scales_fp32, act_quant=self.act_quant, input_scale=self.input_scale_value)
        if self.vnni:
            return NativeLinear(LIN_INT8_VNNI, self.packed, self.out_features, self.in_features,
                                NATIVE_INT8_VNNI_ROWS, self.scales_fp32, self.weight_sums, act_quant=self.act_quant,
                                input_scale=self.input_scale_value)
        return NativeLinear(LIN_INT8, self.weight, *self.weight.shape, NATIVE_INT8_ROWS, self.scales_fp32,
                            act_quant=self.act_quant, input_scale=self.input_scale_value)


class Fp8Linear(Linear):
    """fp8_e4m3 weights with a per-output-channel scale (ModelOpt's per-tensor scales, one per fused part).

    With the C kernels (`native_ready`): the fp8 bytes in gemm_fp8's layout, decode on that GEMM, prefill
    chunks on it too, or where this CPU runs prompt GEMMs in fp32 on the weights widened per call (the same
    values: fp8 subnormals dropped by both).
    Otherwise `torch._scaled_mm` (GPUs), or the weights widened inside each torch GEMM."""

    def __init__(self, values, row_scales, dtype, act_quant=None, input_scale=None, use_scaled_mm=True, native=None):
        import torch

        self.out_features, self.in_features = values.shape
        self.row_scales = row_scales.float().contiguous()
        self.dtype = dtype
        self.act_quant, self.input_scale = act_quant, input_scale
        self.input_scale_value = 1.0 if input_scale is None else float(input_scale)
        self.native = native if self.native_ready(native, dtype, values) else None
        self.use_scaled_mm = use_scaled_mm and act_quant == "fp8" and self.native is None
        self.one = torch.ones((), device=values.device)
        self.amx = self.native is not None and _amx_ready(self.native, values, "fp8")
        if self.amx:  # in AMX tiles only, at every row count
            self.weight = self.native.pack_amx(values, "fp8")
            self.weight_format = "fp8" + ("-a8" if act_quant else "")
        elif self.native is not None:
            self.weight = self.native.pack_fp8(values)
            self.weight_format = "fp8" + ("-a8" if act_quant else "")
        else:
            self.weight = values.contiguous()
            self.weight_format = "fp8" + ("-a8" if act_quant else "") + ("" if self.use_scaled_mm else "-widened")
        self.weight_bytes = self.weight.numel() + self.row_scales.numel() * 4

    @staticmethod
    def native_ready(native, dtype, values) -> bool:
        import torch

        return (native is not None and native.has_fp8_gemm and dtype == torch.bfloat16
                and values.device.type == "cpu" and native.fp8_packable(values.shape[1]))

    def __call__(self, x):
        import torch
        import torch.nn.functional as F

        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.amx:
            y = self.native.gemm_fp8_amx(x2, self.weight, self.row_scales, self.out_features, self.act_quant,
                                         self.input_scale_value)
            return y.reshape(*shape[:-1], self.out_features)
        if self.native is not None:
            # prompt chunks too where this CPU's prompt GEMMs run in bf16: each block of weights widened in L1 for
            # each pass of rows (128 rows 286 against 250 GFLOP/s for the whole matrix widened per call and the
            # dense GEMM, 2026-11-27), the scale applied after the sums, and a row's output the same as a decode row's
            if x2.shape[0] <= NATIVE_FP8_ROWS or not prefill_in_fp32():
                y = self.native.gemm_fp8(x2, self.weight, self.row_scales, self.act_quant, self.input_scale_value)
            else:
                widened = self.native.widen_fp8(self.weight, self.row_scales)
                y = _prefill_gemm(self.native, x2, widened, self.act_quant, self.input_scale_value)
            return y.reshape(*shape[:-1], self.out_features)
        if self.use_scaled_mm:
            xq = (x2.float() / self.input_scale).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
            y = torch._scaled_mm(xq, self.weight.t(), scale_a=self.input_scale, scale_b=self.one, out_dtype=torch.float32)
        else:
            x2 = fake_quant_activation(x2, self.act_quant, self.input_scale)
            y = F.linear(x2.float() if self.dtype == torch.float32 else x2, self.weight.to(x2.dtype)).float()
        return (y * self.row_scales).to(x.dtype).reshape(*shape[:-1], self.weight.shape[0])

    def native_linear(self):
        from toolkit.engine.runtime.native_kernels import LIN_FP8, LIN_FP8_AMX, NativeLinear

        if self.native is None:
            return None
        if self.amx:
            return NativeLinear(LIN_FP8_AMX, self.weight, self.out_features, self.in_features, AMX_ROWS, self.row_scales,
                                act_quant=self.act_quant, input_scale=self.input_scale_value)
        return NativeLinear(LIN_FP8, self.weight, self.out_features, self.in_features, NATIVE_FP8_ROWS, self.row_scales,
                            act_quant=self.act_quant, input_scale=self.input_scale_value)


def _same(tensors) -> bool:
    import torch

    first = tensors[0]
    if first is None:
        return all(t is None for t in tensors)
    return all(t is not None and t.shape == first.shape and torch.equal(t, first) for t in tensors[1:])


def can_fuse(parts: list[LinearWeights]) -> bool:
    """One GEMM for linears that read the same input: same format, activation scale, smoothing, group size."""
    kinds = {p.kind for p in parts}
    return (len(kinds) == 1 and _same([p.input_scale for p in parts]) and _same([p.pre_quant_scale for p in parts])
            and len({p.group_size for p in parts}) == 1)


FP8_KERNELS = ("auto", "scaled_mm", "int8")
# INT4-AWQ's and W4A8's decode rows: "auto" int8 per 128 inputs where the CPU has the VNNI kernel, "int8" the same (said
# when it cannot), "bf16" exact: the 16-bit activations TensorRT-LLM's W4A16 kernels take (W4A8's fp8 values, exactly).
# The same for FP8's weights where they are served as int8 (_fp8_int8_activations).
INT4_ACTIVATIONS = ("auto", "int8", "bf16")


@dataclass(frozen=True)
class KernelChoice:
    """Where a quantized format has more than one kernel on the CPU, the one to run (ModelRunner's options)."""

    fp8_kernel: str = "auto"  # see make_linear
    int4_activations: str = "auto"  # see INT4_ACTIVATIONS

    def __post_init__(self):  # one check for the runner's choice, whichever format's linears then read it
        if self.int4_activations not in INT4_ACTIVATIONS:
            raise ValueError(f"int4_activations {self.int4_activations!r} is not one of {', '.join(INT4_ACTIVATIONS)}")


def make_linear(parts: list[LinearWeights], dtype, device="cpu", choice: KernelChoice = KernelChoice(),
                native=None) -> Linear:
    """One kernel over `parts` stacked along the output dimension (pre_quant_scale already handled).

    choice.fp8_kernel: "scaled_mm" runs torch's fp8 GEMM on ModelOpt's exact values; "int8" re-quantizes the
    fp8 weights to int8 per output channel and runs the int8 kernel; "auto" picks scaled_mm off the
    CPU and on it the engine's own fp8 GEMM where it builds (AVX512-BF16), else int8: torch 2.13's fp8
    GEMM on CPU is a reference loop (~50x slower than bf16 at batch 1, perf/README.md). native: the fused
    C kernels (native_kernels.py) for few-row GEMMs, or None. choice.int4_activations: INT4_ACTIVATIONS."""
    import torch

    first = parts[0]
    weight = torch.cat([p.weight for p in parts]).to(device)
    input_scale = None if first.input_scale is None else first.input_scale.to(device)
    if first.kind == "dense":
        return DenseLinear(weight, dtype, native)
    if first.kind == "int4":
        scales = torch.cat([p.weight_scale for p in parts]).to(device)
        return Int4Linear(weight, scales, first.group_size, dtype, first.act_quant, input_scale, native,
                          choice.int4_activations)
    if first.kind == "int8":
        scales = torch.cat([p.weight_scale for p in parts]).to(device)
        return Int8Linear(weight, scales, dtype, first.act_quant, input_scale, native)
    if first.kind == "fp8":
        rows = torch.cat([p.weight_scale.float().expand(p.out_features) for p in parts]).to(device)
        return fp8_linear(weight, rows, dtype, first.act_quant, input_scale, device, choice.fp8_kernel, native,
                          choice.int4_activations)
    raise ValueError(f"no kernel for weight kind {first.kind!r}")


def fp8_linear(weight, row_scales, dtype, act_quant, input_scale, device="cpu", fp8_kernel: str = "auto",
               native=None, int4_activations: str = "auto") -> Linear:
    """fp8 weights [N, K] with a scale per output row on the kernel `fp8_kernel` picks (see make_linear);
    int4_activations (INT4_ACTIVATIONS) also says whether, served as int8, their activations go to int8 per 128."""
    import torch

    if fp8_kernel not in FP8_KERNELS:
        raise ValueError(f"fp8_kernel {fp8_kernel!r} is not one of {', '.join(FP8_KERNELS)}")
    on_cpu = torch.device(device).type == "cpu"
    if fp8_kernel == "auto" and on_cpu and Fp8Linear.native_ready(native, dtype, weight):
        return Fp8Linear(weight, row_scales, dtype, act_quant, input_scale, native=native)
    if fp8_kernel == "int8" or (fp8_kernel == "auto" and on_cpu):
        linear = fp8_as_int8(weight, row_scales, dtype, act_quant, input_scale, native, int4_activations)
        if fp8_kernel == "auto":
            _say_once("fp8-int8", "fp8 weights: the engine's fp8 kernel needs AVX512-BF16, bf16 activations and "
                                  "the C kernels, and torch's fp8 GEMM on CPU is a slow reference path; serving "
                                  "them as int8 per output channel (re-quantized from the fp8 values), activations "
                                  "rounded to fp8 as calibrated, " + (
                                      "then to int8 per 128 inputs for the int8 x int8 kernel (VNNI or AVX2), as the "
                                      "int4 formats' (engine.int4_activations: bf16 keeps the fp8 values, slower)"
                                      if linear.int8_activations else "on the widening int8 kernel"))
        return linear
    if not fp8_scaled_mm_available(str(device)):
        _say_once("fp8", f"fp8: torch._scaled_mm is not available on {device}: fp8 weights are widened to "
                         f"{dtype} inside each GEMM (8-bit weight reads, {dtype} arithmetic)")
        return Fp8Linear(weight, row_scales, dtype, act_quant, input_scale, use_scaled_mm=False)
    return Fp8Linear(weight, row_scales, dtype, act_quant, input_scale)


def fp8_as_int8(values, row_scales, dtype, act_quant, input_scale, native=None,
                int4_activations: str = "auto") -> Int8Linear:
    """fp8 weights (times their scales) re-quantized to int8 with one scale per output row: at most half
    an int8 step of the row's largest weight away from ModelOpt's values (never -128: the int8 x int8 kernel's
    sign trick cannot take it). Their activations, rounded to fp8, go on to int8 per 128 inputs where the int8 x
    int8 kernel runs (_fp8_int8_activations), else stay fp8 values on the widening kernel."""
    import torch

    exact = values.float() * row_scales[:, None]
    scale = exact.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    rounded = torch.round(exact / scale[:, None]).clamp(-127, 127).to(torch.int8)
    int8_activations = _fp8_int8_activations(native, dtype, values.shape[1], int4_activations)
    linear = Int8Linear(rounded, scale, dtype, act_quant, input_scale, native, int8_activations=int8_activations)
    linear.weight_format = "int8(fp8)" + ("-a8" if act_quant else "") + ("-int8act" if int8_activations else "")
    return linear


def _fp8_int8_activations(native, dtype, in_features: int, int4_activations: str) -> bool:
    """Whether fp8 weights served as int8 run on the int8 x int8 kernel (gemm_int8_a8: VNNI or AVX2, bf16 activations,
    inputs a multiple of 128), their activations rounded to int8 per 128 after their fp8 rounding: as the int4
    formats' (int4_activations governs both; "bf16" keeps them fp8 values on the widening kernel)."""
    import torch

    if int4_activations == "bf16":
        return False
    if native is not None and native.has_int8_a8 and dtype == torch.bfloat16 and in_features % 128 == 0:
        return True
    if int4_activations == "int8":
        _say_once("fp8-int8act-missing", "int4_activations int8: fp8 weights served as int8 take int8 activations only "
                                         "on the int8 x int8 kernel (VNNI or AVX2) with bf16 activations and inputs a multiple "
                                         f"of 128 (here {in_features}): their activations stay fp8 values")
    return False
