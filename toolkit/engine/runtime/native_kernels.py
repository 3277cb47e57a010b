"""The engine's fused CPU kernels (csrc/decode_kernels.c): RMSNorm, RoPE, paged decode attention and
the few-row (decode) bf16, int8 and int4 GEMMs; (csrc/chunk_attention.c) prompt chunks' causal attention, rows
together; and (csrc/decode_step.c) a decode step's decoder layers in one call, driven by a description of the
model built once (`DecodeModel`).

Compiled once per machine with the system C compiler (-O3 -march=native, OpenMP; cached by source,
flags and CPU model) and called through ctypes on the tensors' memory. Why: see the C file's header.
`load()` returns None, after one log line saying why and what runs instead, when there is no C
compiler or the build fails; the runner then keeps its torch-op path (model_runner.py), which is
also the reference the tests hold these kernels to.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from dataclasses import dataclass
from importlib import resources

log = logging.getLogger(__name__)

ACTIVATION_KINDS = {"torch.float32": 0, "torch.bfloat16": 1}
CACHE_KINDS = {"torch.float32": 0, "torch.bfloat16": 1, "torch.int8": 2, "torch.float8_e4m3fn": 3}
ACT_QUANT = {None: 0, "int8": 1, "fp8": 2}  # decode_kernels.c: ACT_NONE, ACT_INT8, ACT_FP8
# TOOLKIT_NATIVE_MARCH=x86-64-v3 (any -march value) compiles for that ISA level instead of this CPU's: a library to
# copy to older machines, or, with torch held to it too (ATEN_CPU_CAPABILITY=avx2), this engine as a CPU without
# AVX-512 runs it (its C paths for AVX-512, VNNI, AVX512-BF16 and AMX compile out and torch's kernels take over).
MARCH_VARIABLE = "TOOLKIT_NATIVE_MARCH"


def compile_flags(target: str | None = None) -> list[str]:
    flags = ["-std=c11", "-O3", f"-march={target or march()}", "-fopenmp", "-fPIC", "-shared", "-fno-math-errno"]
    # The hardware prefetchers differ by vendor, and so does where software prefetch pays (decode_kernels.c's
    # prefetch_lanes); -march=native does not say the vendor (GCC tuned this Xeon as rocketlake)
    return flags + (["-DTOOLKIT_INTEL_CPU=1"] if _first_cpu().get("vendor_id", "").endswith("GenuineIntel") else [])


def march() -> str:
    return os.environ.get(MARCH_VARIABLE) or "native"


_loaded: dict[str, object] = {}
# Compiled as one unit, in this order: decode_step.c drives decode_kernels.c's functions.
# A prompt chunk takes chunk_attention from this many query heads per kv head (rows x the group) in a work item's
# lanes; below, the row-by-row decode kernel was as fast (NativeKernels.chunk_min_rows).
CHUNK_MIN_LANES = 24
SOURCES = ("decode_kernels.c", "chunk_attention.c", "decode_step.c")
(LIN_BF16, LIN_INT8, LIN_INT4, LIN_INT8_VNNI, LIN_FP8, LIN_BF16_AMX, LIN_INT8_AMX, LIN_FP8_AMX,
 LIN_INT4_AMX, LIN_INT4_A8, LIN_INT8_A8) = range(11)
# The parts of a decode step decode_step can time in place (csrc/decode_step.c's PART_*, in order)
STEP_PARTS = ("qkv", "attention", "o", "gate_up", "down", "rest", "lm_head")
# AMX tiles (csrc/decode_kernels.c): 16 outputs x one K slice of this many values, 1 KiB each
AMX_K_STEP = {"bf16": 32, "int8": 64, "fp8": 32}


class _LinearDesc(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("n", ctypes.c_int32), ("k", ctypes.c_int32), ("group", ctypes.c_int32),
                ("act_quant", ctypes.c_int32), ("input_scale", ctypes.c_float), ("weight", ctypes.c_void_p),
                ("scale", ctypes.c_void_p), ("weight_sums", ctypes.c_void_p), ("smooth", ctypes.c_void_p),
                ("tile_rows", ctypes.c_int32)]


class _LayerDesc(ctypes.Structure):
    _fields_ = [("qkv", _LinearDesc), ("o", _LinearDesc), ("gate_up", _LinearDesc), ("down", _LinearDesc),
                ("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p), ("k_cache", ctypes.c_void_p),
                ("v_cache", ctypes.c_void_p), ("k_scale", ctypes.c_float), ("v_scale", ctypes.c_float)]


class _ModelDesc(ctypes.Structure):
    _fields_ = [("num_layers", ctypes.c_int32), ("hidden", ctypes.c_int32), ("heads", ctypes.c_int32),
                ("kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32), ("inter", ctypes.c_int32),
                ("act_kind", ctypes.c_int32), ("cache_kind", ctypes.c_int32), ("block_size", ctypes.c_int32),
                ("eps", ctypes.c_float), ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p),
                ("final_norm", ctypes.c_void_p), ("layers", ctypes.POINTER(_LayerDesc)), ("stub_gemms", ctypes.c_int32),
                ("part_seconds", ctypes.POINTER(ctypes.c_double)), ("embed", ctypes.c_void_p),
                ("lm_head", _LinearDesc), ("vocab", ctypes.c_int32), ("embed_rows", ctypes.c_int32),
                ("row_split_min", ctypes.c_int32)]


def _first_cpu() -> dict[str, str]:
    """/proc/cpuinfo's "vendor_id", "model name" and "flags" lines for the first CPU (none where it cannot be read)."""
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key = line.split(":", 1)[0].strip()
                if key in ("vendor_id", "model name", "flags") and key not in found:
                    found[key] = line.strip()
                if len(found) == 3:
                    break
    except OSError:
        pass
    return found


def _cpu_model() -> str:
    """What -march=native compiled for (vendor, model name and ISA flags of the first CPU): a cached library is
    only reused where all match."""
    return " ".join([platform.machine(), *_first_cpu().values()])


def cpu_flags() -> set[str]:
    """The ISA flags /proc/cpuinfo lists for the first CPU (empty where it cannot be read)."""
    line = _first_cpu().get("flags", ":")
    return set(line.split(":", 1)[1].split())


# A CPU that runs both the kernels built for it (AVX-512) and those a CPU without AVX-512 gets (x86-64-v3): where the
# tests build and hold both to torch.
BOTH_BUILDS_FLAGS = {"avx512f", "avx2", "fma", "f16c"}


@dataclass
class NativeLinear:
    """One linear as decode_step.c's linear_t sees it (kernels.py's Linear classes say theirs)."""

    kind: int
    weight: object  # torch.Tensor [n, k] (int4: packed bytes [n, k / 2]; LIN_INT4_A8, LIN_INT8_A8: n padded to 16)
    n: int
    k: int
    max_rows: int  # up to this many rows this C GEMM beats torch's (kernels.py); a decode step takes the least
    scale: object = None  # fp32: per output row (int8, fp8) or [n, k / group] (int4; LIN_INT4_A8: lane_scales')
    weight_sums: object = None  # int32 [n] (LIN_INT8_VNNI)
    group: int = 0
    act_quant: str | None = None
    input_scale: float = 1.0
    tile_rows: int = 0  # LIN_INT4_A8: from this many rows on AMX tiles (gemm_int4_a8_amx), 0: never


@dataclass(frozen=True)
class Int8Lanes:
    """INT8-SQ's weights as gemm_int8_vnni reads them (NativeKernels.pack_int8_lanes): 16 output rows side by side,
    rows padded to 16 and inputs to 64 with zeros, the row scales and the rows' weight sums padded alike."""
    weight: object  # int8 [n padded to 16, k padded to 64], in blocks of 16 rows: vector d = 4 inputs of each row
    scale: object  # fp32 [n padded]
    sums: object  # int32 [n padded]
    n: int
    k: int


@dataclass
class NativeLayer:
    qkv: NativeLinear
    o: NativeLinear
    gate_up: NativeLinear
    down: NativeLinear
    o_smooth: object  # activation-dtype [k] or None
    down_smooth: object
    input_norm: object
    post_norm: object
    k_cache: object
    v_cache: object
    k_scale: float
    v_scale: float


class DecodeModel:
    """A model described once for `decode_step`: the ctypes structures and every tensor they point at
    (kept here so that none is freed while the description lives)."""

    def __init__(self, layers: list[NativeLayer], *, hidden: int, heads: int, kv_heads: int, head_dim: int,
                 inter: int, block_size: int, eps: float, cos, sin, final_norm, embed, lm_head: NativeLinear):
        self._keep = [cos, sin, final_norm, layers, embed, lm_head]
        self.vocab = lm_head.n  # the logits' width
        self.embed_rows = embed.shape[0]  # token ids' bound
        self.max_rows = min([lin.max_rows for layer in layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
                            + [lm_head.max_rows])
        self._layers = (_LayerDesc * len(layers))(*[self._layer(layer) for layer in layers])
        first = layers[0]
        self.desc = _ModelDesc(len(layers), hidden, heads, kv_heads, head_dim, inter,
                               ACTIVATION_KINDS[str(first.input_norm.dtype)], CACHE_KINDS[str(first.k_cache.dtype)],
                               block_size, eps, cos.data_ptr(), sin.data_ptr(), final_norm.data_ptr(),
                               ctypes.cast(self._layers, ctypes.POINTER(_LayerDesc)), 0, None, embed.data_ptr(),
                               self._linear(lm_head, None), self.vocab, self.embed_rows)

    def timing_parts(self) -> dict[str, float] | None:
        """Seconds each part of the step (STEP_PARTS) took over the steps since time_parts(True), accumulated in
        place by decode_step; None while off."""
        parts = getattr(self, "_parts", None)
        return None if parts is None else dict(zip(STEP_PARTS, parts))

    def time_parts(self, on: bool) -> None:
        """Benchmarks only: decode_step times each part of its steps in place (a clock read per part, ~0.1 %
        of a step) from now on, from zero; off again with False."""
        self._parts = (ctypes.c_double * len(STEP_PARTS))() if on else None
        self.desc.part_seconds = ctypes.cast(self._parts, ctypes.POINTER(ctypes.c_double)) if on else None

    @staticmethod
    def _ptr(tensor) -> int | None:
        return None if tensor is None else tensor.data_ptr()

    @staticmethod
    def _linear(lin: NativeLinear, smooth) -> _LinearDesc:
        ptr = DecodeModel._ptr
        return _LinearDesc(lin.kind, lin.n, lin.k, lin.group, ACT_QUANT[lin.act_quant], lin.input_scale,
                           lin.weight.data_ptr(), ptr(lin.scale), ptr(lin.weight_sums), ptr(smooth), lin.tile_rows)

    def _layer(self, layer: NativeLayer) -> _LayerDesc:
        return _LayerDesc(self._linear(layer.qkv, None), self._linear(layer.o, layer.o_smooth),
                          self._linear(layer.gate_up, None), self._linear(layer.down, layer.down_smooth),
                          layer.input_norm.data_ptr(), layer.post_norm.data_ptr(), layer.k_cache.data_ptr(),
                          layer.v_cache.data_ptr(), layer.k_scale, layer.v_scale)


def _padded_rows(t, value=0):
    """t [N, ...] with rows of `value` appended up to a multiple of 16 (the lanes kernels' blocks)."""
    import torch

    pad = -t.shape[0] % 16
    return torch.cat([t, torch.full((pad, *t.shape[1:]), value, dtype=t.dtype)]) if pad else t.contiguous()


def rows_in_lanes(byte_rows, pad_value):
    """Bytes [N, B] (B a multiple of 4; one row's bytes per output row) → the lanes kernels' layout [N padded to 16, B]:
    per block of 16 rows, B / 4 vectors of 64 bytes, vector d holding in lane n bytes 4d .. 4d+3 of row n (the
    int4 x int8 and INT8-SQ kernels, decode_kernels.c). Padding rows are filled with `pad_value`."""
    rows = _padded_rows(byte_rows, pad_value)
    n, b = rows.shape
    return rows.reshape(n // 16, 16, b // 4, 4).permute(0, 2, 1, 3).reshape(n, b).contiguous()


class NativeKernels:
    def __init__(self, library: ctypes.CDLL):
        c = ctypes
        self._lib = library
        library.rms_norm.argtypes = [c.c_void_p, c.c_void_p, c.c_void_p, c.c_int64, c.c_int, c.c_float, c.c_int]
        library.add_rms_norm.argtypes = [c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_int64, c.c_int, c.c_float,
                                         c.c_int]
        library.silu_mul.argtypes = [c.c_void_p, c.c_void_p, c.c_int64, c.c_int, c.c_int]
        library.silu_mul_smoothed.argtypes = [c.c_void_p, c.c_void_p, c.c_int64, c.c_int, c.c_int, c.c_void_p]
        library.smooth_rows_.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_int, c.c_void_p]
        library.rope.argtypes = [c.c_void_p, c.c_int64, c.c_void_p, c.c_void_p, c.c_void_p, c.c_int64, c.c_int, c.c_int, c.c_int]
        library.decode_attention.argtypes = [c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p,
                                             c.c_int, c.c_int, c.c_int, c.c_int, c.c_int, c.c_int, c.c_float,
                                             c.c_float, c.c_int, c.c_int]
        library.write_kv_cache.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_int, c.c_int, c.c_int, c.c_void_p,
                                           c.c_void_p, c.c_void_p, c.c_float, c.c_float, c.c_int, c.c_int]
        library.chunk_attention_rows.argtypes = [c.c_int, c.c_int, c.c_int, c.c_int]
        library.chunk_attention.argtypes = [c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p,
                                            c.c_int, c.c_int, c.c_int, c.c_int, c.c_int, c.c_int, c.c_float, c.c_float,
                                            c.c_int, c.c_int, c.c_int]
        library.gemm_int8.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_void_p, c.c_void_p, c.c_int, c.c_void_p, c.c_int,
                                      c.c_int, c.c_float]
        library.gemm_bf16.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_void_p, c.c_int, c.c_void_p]
        library.gemm_bf16_available.restype = c.c_int
        library.gemm_int4.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_void_p, c.c_void_p, c.c_int, c.c_int, c.c_void_p]
        library.unpack_int4.argtypes = [c.c_void_p, c.c_void_p, c.c_int, c.c_int, c.c_int, c.c_void_p]
        library.decode_step.argtypes = [c.POINTER(_ModelDesc), c.c_void_p, c.c_int64, c.c_void_p, c.c_void_p, c.c_void_p,
                                        c.c_void_p, c.c_int, c.c_void_p, c.c_int64, c.c_void_p]
        library.decode_step.restype = c.c_int
        library.decode_in_one_region.argtypes = [c.POINTER(_ModelDesc)]
        library.decode_in_one_region.restype = c.c_int
        library.step_linears_seconds.argtypes = [c.POINTER(_LinearDesc), c.c_int, c.c_void_p, c.c_int64, c.c_void_p,
                                                 c.c_int, c.c_int]
        library.step_linears_seconds.restype = c.c_double
        library.gemm_int8_vnni_available.restype = c.c_int
        library.round_activations.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_int, c.c_int, c.c_float, c.c_void_p]
        library.widen_int8.argtypes = [c.c_void_p, c.c_void_p, c.c_int, c.c_int, c.c_void_p]
        library.gemm_fp8.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_void_p, c.c_void_p, c.c_int, c.c_void_p, c.c_int,
                                     c.c_float]
        library.widen_fp8.argtypes = [c.c_void_p, c.c_void_p, c.c_int, c.c_int, c.c_void_p]
        library.round_activations.restype = library.widen_int8.restype = None
        library.gemm_fp8.restype = library.widen_fp8.restype = None
        library.amx_enable.restype = c.c_int
        # compiled with AMX and the OS granted the tile state; TOOLKIT_AMX=0 keeps the AVX-512 kernels (for A/B)
        self.has_amx = os.environ.get("TOOLKIT_AMX", "1") != "0" and bool(library.amx_enable())
        if self.has_amx:
            library.gemm_bf16_amx.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_void_p, c.c_int, c.c_void_p]
            library.gemm_int8_amx.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_void_p, c.c_void_p, c.c_int, c.c_void_p,
                                              c.c_int, c.c_float]
            library.gemm_fp8_amx.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_void_p, c.c_void_p, c.c_int, c.c_void_p,
                                             c.c_int, c.c_float]
            library.gemm_int4_amx.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_void_p, c.c_void_p, c.c_int, c.c_int,
                                              c.c_void_p]
            library.gemm_bf16_amx.restype = library.gemm_int8_amx.restype = library.gemm_fp8_amx.restype = None
            library.gemm_int4_amx.restype = None
        library.pin_team.argtypes = [c.c_void_p, c.c_int]
        library.pin_team.restype = c.c_int
        library.kernels_isa.restype = c.c_char_p
        self.isa = library.kernels_isa().decode()  # the vector extensions compiled in, e.g. "AVX2 + FMA"
        # the bf16 GEMM and the int4 one with bf16 activations (AVX512-BF16, or AVX2 + FMA); fp8's own kernel
        self.has_bf16_gemm = bool(library.gemm_bf16_available())
        library.gemm_fp8_available.restype = c.c_int
        self.has_fp8_gemm = bool(library.gemm_fp8_available())
        self.has_int8_vnni = bool(library.gemm_int8_vnni_available())  # VNNI, or its AVX2 port
        library.int8_weights_symmetric.restype = c.c_int
        self.int8_weights_symmetric = bool(library.int8_weights_symmetric())  # the AVX2 port: no weight of -128
        library.gemm_int4_a8_available.restype = c.c_int
        self.has_int4_a8 = bool(library.gemm_int4_a8_available())
        if self.has_int4_a8:
            library.gemm_int4_a8.argtypes = [*library.gemm_int4.argtypes, c.c_float]
            library.gemm_int4_a8.restype = None
        if self.has_amx and self.has_int4_a8:  # see has_int4_a8_amx
            library.gemm_int4_a8_amx.argtypes = library.gemm_int4_a8.argtypes
            library.gemm_int4_a8_amx.restype = None
        library.gemm_int8_a8_available.restype = c.c_int
        self.has_int8_a8 = bool(library.gemm_int8_a8_available())  # fp8 served as int8 x int8 (VNNI or AVX2)
        if self.has_int8_a8:
            library.gemm_int8_a8.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_void_p, c.c_void_p, c.c_int, c.c_void_p,
                                             c.c_float]
            library.gemm_int8_a8.restype = None
        if self.has_int8_vnni:
            library.gemm_int8_vnni.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_void_p, c.c_void_p, c.c_void_p, c.c_int,
                                               c.c_void_p, c.c_int, c.c_float]
            library.gemm_int8_vnni.restype = None
            library.quantize_int8.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_int, c.c_float, c.c_void_p]
            library.quantize_int8.restype = None
        for fn in (library.rms_norm, library.add_rms_norm, library.silu_mul, library.rope, library.decode_attention, library.gemm_int8,
                   library.gemm_bf16, library.gemm_int4, library.unpack_int4):
            fn.restype = None

    @property
    def has_int4_a8_amx(self) -> bool:
        """Whether the int4 x int8 kernel's prompt chunks can run on AMX tiles, from the same weights (gemm_int4_a8's
        `tiles`)."""
        return self.has_amx and self.has_int4_a8

    def pin_team(self, cpus) -> int:
        """The calling thread's OpenMP team bound one thread to each of `cpus` (csrc: pin_team); how many could not be
        (-1: not on Linux)."""
        ids = (ctypes.c_int32 * len(cpus))(*cpus)
        return self._lib.pin_team(ids, len(cpus))

    @staticmethod
    def supports(activation_dtype) -> bool:
        return str(activation_dtype) in ACTIVATION_KINDS

    def rms_norm(self, x, weight, eps: float):
        """x [..., hidden] contiguous, weight [hidden], both in the activation dtype."""
        import torch

        x = x.contiguous()
        out = torch.empty_like(x)
        hidden = x.shape[-1]
        self._lib.rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // hidden, hidden, eps,
                           ACTIVATION_KINDS[str(x.dtype)])
        return out

    def add_rms_norm_(self, h, delta, weight, eps: float):
        """h += delta in place (h contiguous), then the RMSNorm of the new h."""
        import torch

        delta = delta.contiguous()
        out = torch.empty_like(h)
        hidden = h.shape[-1]
        self._lib.add_rms_norm(h.data_ptr(), delta.data_ptr(), weight.data_ptr(), out.data_ptr(), h.numel() // hidden,
                               hidden, eps, ACTIVATION_KINDS[str(h.dtype)])
        return out

    def write_kv_cache(self, qkv, heads: int, kv_heads: int, head_dim: int, slots, k_cache, v_cache, k_scale: float,
                       v_scale: float) -> None:
        """The K and V columns of qkv [rows, (heads + 2 kv_heads) head_dim] (after RoPE) into the caches [slots,
        kv_heads, head_dim] at slots (int64 [rows]), encoded as PagedKVCache.write encodes them."""
        import torch

        assert qkv.is_contiguous() and slots.dtype == torch.int64 and slots.is_contiguous()
        self._lib.write_kv_cache(qkv.data_ptr(), qkv.shape[0], qkv.shape[1], heads, kv_heads, head_dim, slots.data_ptr(),
                                 k_cache.data_ptr(), v_cache.data_ptr(), k_scale, v_scale,
                                 ACTIVATION_KINDS[str(qkv.dtype)], CACHE_KINDS[str(k_cache.dtype)])

    def silu_mul(self, gate_up, smooth=None):
        """gate_up [..., 2 * inter] → silu(gate) * up [..., inter], times smooth [inter] where given (the down
        projection's pre_quant_scale, rounded after the product as `silu(gate) * up * smooth` in two ops rounds)."""
        import torch

        gate_up = gate_up.contiguous()
        inter = gate_up.shape[-1] // 2
        out = torch.empty(*gate_up.shape[:-1], inter, dtype=gate_up.dtype)
        rows, kind = gate_up.numel() // (2 * inter), ACTIVATION_KINDS[str(gate_up.dtype)]
        if smooth is None:
            self._lib.silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, inter, kind)
        else:
            assert smooth.dtype == gate_up.dtype and smooth.is_contiguous() and smooth.numel() == inter
            self._lib.silu_mul_smoothed(gate_up.data_ptr(), out.data_ptr(), rows, inter, kind, smooth.data_ptr())
        return out

    def smooth_rows_(self, x, smooth):
        """x [..., k] (contiguous) times smooth [k] in place, rounded as `x * smooth` rounds; returns x."""
        assert x.is_contiguous() and smooth.dtype == x.dtype and smooth.is_contiguous() and smooth.numel() == x.shape[-1]
        self._lib.smooth_rows_(x.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], ACTIVATION_KINDS[str(x.dtype)],
                               smooth.data_ptr())
        return x

    def rope_(self, x, heads: int, head_dim: int, positions, cos, sin) -> None:
        """In place on the first heads * head_dim columns of x [tokens, row] (unit stride in a row: the q or
        k slice of a fused qkv output); positions int64 [tokens]; cos/sin [max_pos, head_dim]."""
        assert x.stride(-1) == 1 and x.shape[-1] >= heads * head_dim
        self._lib.rope(x.data_ptr(), x.stride(0), positions.data_ptr(), cos.data_ptr(), sin.data_ptr(), x.shape[0],
                       heads, head_dim, ACTIVATION_KINDS[str(x.dtype)])

    def decode_attention(self, q, k_cache, v_cache, block_tables, context_lens, block_size: int,
                         k_scale: float, v_scale: float, out=None):
        """q [batch, heads, head_dim]; caches [slots, kv_heads, head_dim]; block_tables int64 [batch, max_blocks];
        context_lens int64 [batch] → [batch, heads, head_dim] in q's dtype (into `out` where given). A row of context
        length 0 is skipped, its output left as it was (a prompt chunk's row that chunk_attention writes)."""
        import torch

        q = q.contiguous()
        out = torch.empty_like(q) if out is None else out
        batch, heads, head_dim = q.shape
        self._lib.decode_attention(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
                                   context_lens.data_ptr(), out.data_ptr(), batch, heads, k_cache.shape[1], head_dim,
                                   block_tables.shape[1], block_size, k_scale, v_scale,
                                   ACTIVATION_KINDS[str(q.dtype)], CACHE_KINDS[str(k_cache.dtype)])
        return out

    def chunk_attention_rows(self, act_dtype, cache_dtype, head_dim: int, group: int) -> int:
        """Query rows one chunk_attention work item takes (for kv heads of `group` query heads), or 0 where these
        dtypes and shapes, or this build, leave prompt chunks to decode_attention row by row."""
        return self._lib.chunk_attention_rows(ACTIVATION_KINDS[str(act_dtype)], CACHE_KINDS[str(cache_dtype)],
                                              head_dim, group)

    def chunk_min_rows(self, act_dtype, cache_dtype, head_dim: int, group: int) -> float:
        """From how many rows a prompt chunk takes chunk_attention (infinite where it cannot run here): where its work
        items' lanes (rows x `group` query heads per kv head) fill CHUNK_MIN_LANES. Below, the row kernel was as fast
        or faster (8 rows of `small` over 512 tokens: 103 us row by row, 64 on AMX tiles, 116 on AVX512-BF16;
        16 rows 200 / 85 / 157 us; 2026-11-29). The engine's rule (model_runner) and the planner's probe's alike."""
        if not self.chunk_attention_rows(act_dtype, cache_dtype, head_dim, group):
            return float("inf")
        return -(-CHUNK_MIN_LANES // group)

    def chunk_attention(self, q, k_cache, v_cache, tables, chunks, block_size: int, k_scale: float, v_scale: float,
                        out, amx: bool | None = None) -> None:
        """Causal attention of prompt chunks (csrc/chunk_attention.c) into out [rows, heads, head_dim]: tables int64
        [seqs, max_blocks]; chunks int64 [seqs, 3]: the chunk's first row in q, its row count, and the sequence's
        context length after it. Only where chunk_attention_rows is not 0. amx: on AMX tiles (default: where has_amx;
        False for the AVX512-BF16 kernel, which tests hold to the same reference)."""
        q = q.contiguous()
        heads, head_dim = q.shape[1], q.shape[2]
        done = self._lib.chunk_attention(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                                         chunks.data_ptr(), out.data_ptr(), chunks.shape[0], heads, k_cache.shape[1],
                                         head_dim, tables.shape[1], block_size, k_scale, v_scale,
                                         ACTIVATION_KINDS[str(q.dtype)], CACHE_KINDS[str(k_cache.dtype)],
                                         int(self.has_amx if amx is None else amx and self.has_amx))
        if not done:
            raise ValueError(f"chunk_attention cannot take q {q.dtype} over a {k_cache.dtype} cache here "
                             "(chunk_attention_rows is 0): use decode_attention")

    def decode_in_one_region(self, model: DecodeModel) -> bool:
        """Whether decode_step runs this model's layers in one OpenMP region (csrc/decode_step.c's
        decode_layers_team: every linear on the int4 x int8, INT8-SQ's VNNI, fp8 or bf16 kernel, two threads or
        more), rather than a team per GEMM and attention call with the work between them on one thread."""
        return bool(self._lib.decode_in_one_region(ctypes.byref(model.desc)))

    def step_linears_seconds(self, linears: list[NativeLinear], x, calls: int = 1, out=None) -> float | None:
        """Benchmarks only (the planner's probe): seconds for `calls` rounds of `linears` one after another on x
        [rows, k] (bf16; every linear's k the same), as the C decode step runs its GEMMs: in one OpenMP region where it
        runs its layers so, else one kernel call after another from C (csrc/decode_step.c's step_linears_seconds);
        None where the C step would not run them (a kernel this build lacks, another activation dtype).
        out [rows, the widest n], where given, receives each linear's output in turn (the last one's stays)."""
        import torch

        descs = (_LinearDesc * len(linears))(*[DecodeModel._linear(lin, None) for lin in linears])
        y = out if out is not None else torch.empty(x.shape[0], max(lin.n for lin in linears), dtype=x.dtype)
        x = x.contiguous()
        seconds = self._lib.step_linears_seconds(descs, len(linears), x.data_ptr(), x.shape[0], y.data_ptr(),
                                                 ACTIVATION_KINDS[str(x.dtype)], calls)
        return None if seconds < 0 else seconds

    def decode_step(self, model: DecodeModel, token_ids, positions, slots, block_tables, max_blocks: int, context_lens,
                    logits_rows):
        """A whole decode-only step (csrc/decode_step.c): token_ids, positions, slots int64 tensors [batch];
        block_tables [batch * max_blocks] and context_lens [batch] as int64 arrays (array.array("q")); logits_rows
        an int64 tensor [n] (rows of the batch) → fp32 logits [n, vocab]. Raises ValueError for a token id outside
        the vocabulary or a row outside the batch (nothing written), and RuntimeError where the C side refuses the
        description (a linear kind this library lacks, or no memory)."""
        import torch

        def int64(t):  # as the step's tensors are: no torch op then
            return t if t.dtype is torch.int64 and t.is_contiguous() else t.to(torch.int64).contiguous()

        token_ids, positions, slots, logits_rows = (int64(t) for t in (token_ids, positions, slots, logits_rows))
        logits = torch.empty(logits_rows.shape[0], model.vocab, dtype=torch.float32)
        rc = self._lib.decode_step(ctypes.byref(model.desc), token_ids.data_ptr(), token_ids.shape[0],
                                   positions.data_ptr(), slots.data_ptr(), block_tables.buffer_info()[0],
                                   context_lens.buffer_info()[0], max_blocks, logits_rows.data_ptr(),
                                   logits_rows.shape[0], logits.data_ptr())
        if rc == -2:
            raise ValueError(f"decode step: a token id outside the vocabulary of {model.embed_rows} or a logits row outside "
                             f"the batch of {token_ids.shape[0]} (token ids {token_ids.tolist()}, rows {logits_rows.tolist()})")
        if rc != 0:
            raise RuntimeError("the C decode step refused the model description (out of memory, or a linear kind this "
                               "build lacks): start the engine with native=False")
        return logits

    # --- weight-only GEMMs (x [M, K] in the activation dtype → [M, N]) --------------------------------

    def gemm_int8(self, x, weight, scale, act_quant: str | None = None, input_scale: float = 1.0):
        """weight int8 [N, K], scale fp32 [N]; x first rounded to act_quant ("int8", "fp8" or None) at
        input_scale, as kernels.fake_quant_activation does."""
        import torch

        x = x.contiguous()
        n, k = weight.shape
        y = torch.empty(x.shape[0], n, dtype=x.dtype)
        self._lib.gemm_int8(x.data_ptr(), x.shape[0], k, weight.data_ptr(), scale.data_ptr(), n, y.data_ptr(),
                            ACTIVATION_KINDS[str(x.dtype)], ACT_QUANT[act_quant], input_scale)
        return y

    def round_activations(self, x, act_quant: str, input_scale: float):
        """x rounded to act_quant ("int8" or "fp8") at input_scale, in x's dtype: kernels.fake_quant_activation."""
        import torch

        x = x.contiguous()
        out = torch.empty_like(x)
        k = x.shape[-1]
        self._lib.round_activations(x.data_ptr(), x.numel() // k, k, ACTIVATION_KINDS[str(x.dtype)], ACT_QUANT[act_quant],
                                    input_scale, out.data_ptr())
        return out

    def widen_int8(self, weight, scale):
        """int8 [N, K] times fp32 scale [N] per row → bf16 [N, K] (rounded once)."""
        import torch

        out = torch.empty(weight.shape, dtype=torch.bfloat16)
        self._lib.widen_int8(weight.data_ptr(), scale.data_ptr(), weight.shape[0], weight.shape[1], out.data_ptr())
        return out

    @staticmethod
    def pack_int8_lanes(values, scale) -> Int8Lanes:
        """int8 weights [N, K] and fp32 row scales [N] → gemm_int8_vnni's layout (Int8Lanes)."""
        import torch

        n, k = values.shape
        padded = torch.zeros(n, k + (-k % 64), dtype=torch.int8)
        padded[:, :k] = values
        return Int8Lanes(rows_in_lanes(padded, 0), _padded_rows(scale.float()),
                         _padded_rows(values.sum(dim=1, dtype=torch.int32)), n, k)

    def gemm_int8_vnni(self, x, lanes: Int8Lanes, input_scale: float):
        """INT8-SQ exactly in integers (only where has_int8_vnni): x [M, K] rounded to int8 at input_scale, times
        pack_int8_lanes' weights, scaled per row → [M, N] in x's dtype. Any M: prompt chunks too."""
        import torch

        x = x.contiguous()
        y = torch.empty(x.shape[0], lanes.n, dtype=x.dtype)
        self._lib.gemm_int8_vnni(x.data_ptr(), x.shape[0], lanes.k, lanes.weight.data_ptr(), lanes.scale.data_ptr(),
                                 lanes.sums.data_ptr(), lanes.n, y.data_ptr(), ACTIVATION_KINDS[str(x.dtype)], input_scale)
        return y

    def quantize_int8(self, x, input_scale: float):
        """x [M, K] rounded to int8 at input_scale as gemm_int8_vnni rounds it → int8 [M, K] (only where
        has_int8_vnni)."""
        import torch

        x = x.contiguous()
        out = torch.empty(x.shape, dtype=torch.int8)
        self._lib.quantize_int8(x.data_ptr(), x.shape[0], x.shape[1], ACTIVATION_KINDS[str(x.dtype)], input_scale,
                                out.data_ptr())
        return out

    # --- AMX tiles (only where has_amx) -----------------------------------------------------------------

    def amx_packable(self, weight, kind: str) -> bool:
        """Whether weight [N, K] ("bf16", "int8", "fp8") fits the AMX kernels: N a multiple of 16, K of the tile's K
        slice (int8: any, zero-padded)."""
        n, k = weight.shape
        return self.has_amx and n % 16 == 0 and (kind == "int8" or k % AMX_K_STEP[kind] == 0)

    @staticmethod
    def pack_amx(weight, kind: str):
        """bf16, int8 or fp8 [N, K] → uint8 tiles [N/16, K/step, 16, 64 (fp8: 32)] as the tile loads read them: row
        r of a tile holds, for each of its 16 outputs, the weights k = 2r, 2r+1 (bf16, fp8) or 4r..4r+3 (int8) of its
        K slice (int8 K zero-padded to a multiple of 64); fp8's rows interleaved in pairs, one unpack against zeros per row."""
        import torch

        n, k = weight.shape
        step = AMX_K_STEP[kind]
        padded = torch.nn.functional.pad(weight, (0, -k % step)) if kind == "int8" else weight
        word = torch.int16 if kind == "fp8" else torch.int32
        words = padded.contiguous().view(word).reshape(n // 16, 16, padded.shape[1] // step, 16)
        tiles = words.permute(0, 2, 3, 1).contiguous().view(torch.uint8)
        if kind == "fp8":  # per two tile rows, byte 16L + 8h + i holds row 2c + h's byte 8L + i (one unpack per row)
            tiles = tiles.reshape(n // 16, -1, 8, 2, 4, 8).permute(0, 1, 2, 4, 3, 5).reshape(n // 16, -1, 16, 32)
        return tiles.contiguous()

    @staticmethod
    def unpack_amx(packed, n: int, k: int, dtype):
        """pack_amx's inverse: [N, K] in dtype (bf16, int8 or float8_e4m3fn)."""
        import torch

        nb, kt = packed.shape[0], packed.shape[1]
        if dtype == torch.float8_e4m3fn:
            packed = packed.reshape(nb, kt, 8, 4, 2, 8).permute(0, 1, 2, 4, 3, 5).contiguous()
        word = torch.int16 if dtype == torch.float8_e4m3fn else torch.int32
        words = packed.view(word).reshape(nb, kt, 16, 16).permute(0, 3, 1, 2).reshape(n, -1)
        return words.contiguous().view(dtype)[:, :k]

    def gemm_bf16_amx(self, x, packed, n: int):
        """x bf16 [M, K] times pack_amx'd bf16 weights [n, K] → bf16 [M, n]."""
        import torch

        x = x.contiguous()
        y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
        self._lib.gemm_bf16_amx(x.data_ptr(), x.shape[0], x.shape[1], packed.data_ptr(), n, y.data_ptr())
        return y

    @staticmethod
    def pack_amx_int4(values):
        """int4 values [N, K] in [-8, 7] → uint8 tiles [N/16, K/32, 256]: the bf16 tile layout (row r: per output
        the k pair 2r, 2r+1), each 64 values as 32 bytes, value b in byte b's low nibble and 32 + b in its high one,
        stored as q + 8 (gemm_int4_amx widens them by a table permute)."""
        import torch

        n, k = values.shape
        tiles = (values.to(torch.int16) + 8).to(torch.uint8).reshape(n // 16, 16, k // 32, 16, 2).permute(0, 2, 3, 1, 4)
        halves = tiles.reshape(n // 16, k // 32, 8, 2, 32)
        return (halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)).reshape(n // 16, k // 32, 256).contiguous()

    def gemm_int4_amx(self, x, packed, group_scales, group_size: int, n: int):
        """x bf16 [M, K] times pack_amx_int4'd weights [n, K], group_scales fp32 [K / group_size, n] → bf16 [M, n]."""
        import torch

        x = x.contiguous()
        y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
        self._lib.gemm_int4_amx(x.data_ptr(), x.shape[0], x.shape[1], packed.data_ptr(), group_scales.data_ptr(),
                                group_size, n, y.data_ptr())
        return y

    def gemm_fp8_amx(self, x, packed, scale, n: int, act_quant: str | None, input_scale: float):
        """FP8 as gemm_fp8 computes it (up to the summation order) on pack_amx'd fp8 weights [n, K]: x bf16 [M, K]
        rounded to act_quant at input_scale, scale fp32 [n] → bf16 [M, n]."""
        import torch

        x = x.contiguous()
        y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
        self._lib.gemm_fp8_amx(x.data_ptr(), x.shape[0], x.shape[1], packed.data_ptr(), scale.data_ptr(), n, y.data_ptr(),
                               ACT_QUANT[act_quant], input_scale)
        return y

    def gemm_int8_amx(self, x, packed, scale, n: int, input_scale: float):
        """INT8-SQ as gemm_int8_vnni computes it, bit for bit, on pack_amx'd int8 weights [n, K]."""
        import torch

        x = x.contiguous()
        y = torch.empty(x.shape[0], n, dtype=x.dtype)
        self._lib.gemm_int8_amx(x.data_ptr(), x.shape[0], x.shape[1], packed.data_ptr(), scale.data_ptr(), n, y.data_ptr(),
                                ACTIVATION_KINDS[str(x.dtype)], input_scale)
        return y

    def gemm_bf16(self, x, weight):
        """x bf16 [M, K], weight bf16 [N, K] (only where has_bf16_gemm)."""
        import torch

        x = x.contiguous()
        n, k = weight.shape
        y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
        self._lib.gemm_bf16(x.data_ptr(), x.shape[0], k, weight.data_ptr(), n, y.data_ptr())
        return y


    # --- int4 (bf16 activations; only where has_bf16_gemm) -------------------------------------------

    @staticmethod
    def int4_packable(in_features: int, group_size: int) -> bool:
        return group_size % 64 == 0 and in_features % group_size == 0

    @staticmethod
    def pack_int4(values):
        """int4 values [N, K] in [-8, 7] → bytes [N, K/2] in the kernel's layout (see decode_kernels.c)."""
        import torch

        n, k = values.shape
        nibbles = (values.to(torch.int16) + 8).to(torch.uint8).reshape(n, k // 64, 2, 32)
        return (nibbles[:, :, 0, :] | (nibbles[:, :, 1, :] << 4)).reshape(n, k // 2).contiguous()

    def gemm_int4(self, x, packed, scales, group_size: int):
        """x bf16 [M, K]; packed: pack_int4's bytes [N, K/2]; scales fp32 [N, K/group_size] → bf16 [M, N]."""
        import torch

        x = x.contiguous()
        n, k = packed.shape[0], packed.shape[1] * 2
        y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
        self._lib.gemm_int4(x.data_ptr(), x.shape[0], k, packed.data_ptr(), scales.data_ptr(), group_size, n, y.data_ptr())
        return y

    # --- int4 x int8 (where has_int4_a8: VNNI; group_size a multiple of 128) ------------------------------

    @staticmethod
    def pack_int4_lanes(values):
        """int4 values [N, K] → gemm_int4_a8's bytes: per block of 16 rows (N padded to 16 with zeros) and 128
        inputs, 16 vectors of 64 bytes, vector d holding in lane n bytes 4d .. 4d+3 of pack_int4's 64 for row n."""
        return rows_in_lanes(NativeKernels.pack_int4(values), 0x88)  # padding: q = 0 in both nibbles

    @staticmethod
    def lane_scales(scales):
        """Group scales fp32 [N, groups] → [N / 16 (padded), groups, 16] flattened to [N padded, groups]: a
        block's 16 rows' scales of one group side by side, as gemm_int4_a8 multiplies them."""
        groups = scales.shape[1]
        return _padded_rows(scales.float()).reshape(-1, 16, groups).permute(0, 2, 1).reshape(-1, groups).contiguous()

    def gemm_int4_a8(self, x, packed, scales, group_size: int, n: int, fp8_scale: float | None = None,
                     tiles: bool = False):
        """x bf16 [M, K] (first rounded to fp8 at fp8_scale where given: W4A8) rounded to int8 per 128 of K, times
        pack_int4_lanes' weights with lane_scales' scales, on VNNI → bf16 [M, n]. tiles (where has_int4_a8_amx): on
        AMX tiles instead, the same output bits."""
        import torch

        x = x.contiguous()
        y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
        gemm = self._lib.gemm_int4_a8_amx if tiles else self._lib.gemm_int4_a8
        gemm(x.data_ptr(), x.shape[0], packed.shape[1] * 2, packed.data_ptr(), scales.data_ptr(), group_size, n,
             y.data_ptr(), fp8_scale or 0.0)
        return y

    # --- fp8 weights as int8 x int8 per 128 (where has_int8_a8: VNNI or AVX2; in_features % 128 == 0) --

    @staticmethod
    def pack_int8_a8(values, scale):
        """int8 weights [N, K] (none -128) and fp32 row scales [N] → gemm_int8_a8's (bytes, scales): INT8-SQ's lanes
        (rows_in_lanes; N padded to 16 with zeros, the scales likewise) with each 128's inputs 32-63 and 64-95
        swapped, the order quantize_int4_activations stores a row in."""
        n, k = values.shape
        swapped = values.reshape(n, k // 128, 4, 32)[:, :, [0, 2, 1, 3], :].reshape(n, k)
        return rows_in_lanes(swapped, 0), _padded_rows(scale.float())

    def gemm_int8_a8(self, x, packed, scale, n: int, fp8_scale: float | None = None):
        """x bf16 [M, K] (first rounded to fp8 at fp8_scale where given) rounded to int8 per 128 of K, times
        pack_int8_a8's weights exactly in integers, scaled per row (scale fp32 [N padded to 16]) → bf16 [M, n]."""
        import torch

        x = x.contiguous()
        y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
        self._lib.gemm_int8_a8(x.data_ptr(), x.shape[0], packed.shape[1], packed.data_ptr(), scale.data_ptr(), n,
                               y.data_ptr(), fp8_scale or 0.0)
        return y

    # --- fp8 (bf16 activations; only where has_fp8_gemm) --------------------------------------------

    @staticmethod
    def fp8_packable(in_features: int) -> bool:
        return in_features % 64 == 0

    @staticmethod
    def pack_fp8(values):
        """float8_e4m3fn [N, K] → their bytes [N, K] in gemm_fp8's layout: within each 64, the 16-bit word i holds
        weight i in its high byte and weight 32 + i in its low byte (little-endian: byte 2i + 1 and byte 2i); where
        N is a multiple of 4, each block of 4 rows stored as one stream, its rows' pieces of 64 interleaved (row j's
        weights k .. k + 63 at the block's byte 4k + 64j). See decode_kernels.c."""
        import torch

        n, k = values.shape
        halves = values.contiguous().view(torch.uint8).reshape(n, k // 64, 2, 32)  # [.., (first, second), i]
        packed = halves.flip(2).permute(0, 1, 3, 2)  # byte 2i: second[i], 2i + 1: first[i]
        if n % 4 == 0:
            packed = packed.reshape(n // 4, 4, k // 64, 64).transpose(1, 2)  # [block, piece, row, 64]
        return packed.reshape(n, k).contiguous()

    def gemm_fp8(self, x, packed, scale, act_quant: str | None, input_scale: float):
        """x bf16 [M, K], first rounded to act_quant at input_scale; packed: pack_fp8's bytes [N, K]; scale
        fp32 [N] → bf16 [M, N]."""
        import torch

        x = x.contiguous()
        n, k = packed.shape
        y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
        self._lib.gemm_fp8(x.data_ptr(), x.shape[0], k, packed.data_ptr(), scale.data_ptr(), n, y.data_ptr(),
                           ACT_QUANT[act_quant], input_scale)
        return y

    def widen_fp8(self, packed, scale):
        """The bf16 weights [N, K] (times their row scale) that gemm_fp8 computes with."""
        import torch

        out = torch.empty(packed.shape, dtype=torch.bfloat16)
        self._lib.widen_fp8(packed.data_ptr(), scale.data_ptr(), packed.shape[0], packed.shape[1], out.data_ptr())
        return out

    def unpack_int4(self, packed, scales, group_size: int):
        """The bf16 weights [N, K] those bytes and scales stand for."""
        import torch

        n, k = packed.shape[0], packed.shape[1] * 2
        out = torch.empty(n, k, dtype=torch.bfloat16)
        self._lib.unpack_int4(packed.data_ptr(), scales.data_ptr(), group_size, n, k, out.data_ptr())
        return out


def load(target: str | None = None) -> NativeKernels | None:
    """The compiled kernels, or None (said once in the log) where they cannot be built here. `target`: an -march
    other than march()'s (tests hold the AVX2 kernels to torch on a CPU with AVX-512 too)."""
    key = f"kernels-{target or march()}"
    if key in _loaded:
        return _loaded[key]
    from toolkit.compile_native import compiled_library, find_compiler
    from toolkit.errors import ToolkitError

    kernels = None
    cc = find_compiler("c")
    if cc is None:
        log.warning("no C compiler (gcc/cc/clang or $CC): the CPU engine runs norms, RoPE and attention as "
                    "separate torch ops, slower per step; install gcc for the fused kernels")
    else:
        csrc = resources.files("toolkit.engine.runtime").joinpath("csrc")
        code = b"\n".join(csrc.joinpath(name).read_bytes() for name in SOURCES)
        try:
            path = compiled_library("engine_kernels", "libtoolkit_engine_kernels.so", "decode_kernels.c", code, cc,
                                    compile_flags(target), extra_key=_cpu_model())
            kernels = NativeKernels(ctypes.CDLL(str(path)))
        except (ToolkitError, OSError) as error:
            log.warning("the CPU engine's fused kernels did not build (%s): running norms, RoPE and attention "
                        "as separate torch ops instead", error)
    _loaded[key] = kernels
    return kernels
