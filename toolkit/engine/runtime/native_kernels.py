"""The engine's fused CPU kernels (csrc/decode_kernels.c): RMSNorm, RoPE, paged decode attention and
the few-row (decode) bf16 and int8 GEMMs.

Compiled once per machine with the system C compiler (-O3 -march=native, OpenMP; cached by source,
flags and CPU model) and called through ctypes on the tensors' memory. Why: see the C file's header.
`load()` returns None, after one log line saying why and what runs instead, when there is no C
compiler or the build fails; the runner then keeps its torch-op path (model_runner.py), which is
also the reference the tests hold these kernels to.
"""

from __future__ import annotations

import ctypes
import logging
import platform
from importlib import resources

log = logging.getLogger(__name__)

ACTIVATION_KINDS = {"torch.float32": 0, "torch.bfloat16": 1}
CACHE_KINDS = {"torch.float32": 0, "torch.bfloat16": 1, "torch.int8": 2, "torch.float8_e4m3fn": 3}
ACT_QUANT = {None: 0, "int8": 1, "fp8": 2}
_FLAGS = ["-std=c11", "-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-fno-math-errno"]
_loaded: dict[str, object] = {}


def _cpu_model() -> str:
    """What -march=native compiled for (model name and ISA flags of the first CPU): a cached library is
    only reused where both match."""
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key = line.split(":", 1)[0].strip()
                if key in ("model name", "flags") and key not in found:
                    found[key] = line.strip()
                if len(found) == 2:
                    break
    except OSError:
        pass
    return " ".join([platform.machine(), *found.values()])


class NativeKernels:
    def __init__(self, library: ctypes.CDLL):
        c = ctypes
        self._lib = library
        library.rms_norm.argtypes = [c.c_void_p, c.c_void_p, c.c_void_p, c.c_int64, c.c_int, c.c_float, c.c_int]
        library.add_rms_norm.argtypes = [c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_int64, c.c_int, c.c_float,
                                         c.c_int]
        library.silu_mul.argtypes = [c.c_void_p, c.c_void_p, c.c_int64, c.c_int, c.c_int]
        library.rope.argtypes = [c.c_void_p, c.c_int64, c.c_void_p, c.c_void_p, c.c_void_p, c.c_int64, c.c_int, c.c_int, c.c_int]
        library.decode_attention.argtypes = [c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p,
                                             c.c_int, c.c_int, c.c_int, c.c_int, c.c_int, c.c_int, c.c_float,
                                             c.c_float, c.c_int, c.c_int]
        library.gemm_int8.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_void_p, c.c_void_p, c.c_int, c.c_void_p, c.c_int,
                                      c.c_int, c.c_float]
        library.gemm_bf16.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_void_p, c.c_int, c.c_void_p]
        library.gemm_bf16_available.restype = c.c_int
        library.gemm_int4.argtypes = [c.c_void_p, c.c_int64, c.c_int, c.c_void_p, c.c_void_p, c.c_int, c.c_int, c.c_void_p]
        library.unpack_int4.argtypes = [c.c_void_p, c.c_void_p, c.c_int, c.c_int, c.c_int, c.c_void_p]
        self.has_bf16_gemm = bool(library.gemm_bf16_available())
        for fn in (library.rms_norm, library.add_rms_norm, library.silu_mul, library.rope, library.decode_attention, library.gemm_int8,
                   library.gemm_bf16, library.gemm_int4, library.unpack_int4):
            fn.restype = None

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

    def silu_mul(self, gate_up):
        """gate_up [..., 2 * inter] → silu(gate) * up [..., inter]."""
        import torch

        gate_up = gate_up.contiguous()
        inter = gate_up.shape[-1] // 2
        out = torch.empty(*gate_up.shape[:-1], inter, dtype=gate_up.dtype)
        self._lib.silu_mul(gate_up.data_ptr(), out.data_ptr(), gate_up.numel() // (2 * inter), inter,
                           ACTIVATION_KINDS[str(gate_up.dtype)])
        return out

    def rope_(self, x, heads: int, head_dim: int, positions, cos, sin) -> None:
        """In place on the first heads * head_dim columns of x [tokens, row] (unit stride in a row: the q or
        k slice of a fused qkv output); positions int64 [tokens]; cos/sin [max_pos, head_dim]."""
        assert x.stride(-1) == 1 and x.shape[-1] >= heads * head_dim
        self._lib.rope(x.data_ptr(), x.stride(0), positions.data_ptr(), cos.data_ptr(), sin.data_ptr(), x.shape[0],
                       heads, head_dim, ACTIVATION_KINDS[str(x.dtype)])

    def decode_attention(self, q, k_cache, v_cache, block_tables, context_lens, block_size: int,
                         k_scale: float, v_scale: float):
        """q [batch, heads, head_dim]; caches [slots, kv_heads, head_dim]; block_tables int64 [batch, max_blocks];
        context_lens int64 [batch] → [batch, heads, head_dim] in q's dtype."""
        import torch

        q = q.contiguous()
        out = torch.empty_like(q)
        batch, heads, head_dim = q.shape
        self._lib.decode_attention(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
                                   context_lens.data_ptr(), out.data_ptr(), batch, heads, k_cache.shape[1], head_dim,
                                   block_tables.shape[1], block_size, k_scale, v_scale,
                                   ACTIVATION_KINDS[str(q.dtype)], CACHE_KINDS[str(k_cache.dtype)])
        return out


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
        """x bf16 [M, K]; packed: pack_int4's bytes [N, K/2]; scales fp32 [N, K/group_size]."""
        import torch

        x = x.contiguous()
        n, k = packed.shape[0], packed.shape[1] * 2
        y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
        self._lib.gemm_int4(x.data_ptr(), x.shape[0], k, packed.data_ptr(), scales.data_ptr(), group_size, n,
                            y.data_ptr())
        return y

    def unpack_int4(self, packed, scales, group_size: int):
        """The bf16 weights [N, K] those bytes and scales stand for."""
        import torch

        n, k = packed.shape[0], packed.shape[1] * 2
        out = torch.empty(n, k, dtype=torch.bfloat16)
        self._lib.unpack_int4(packed.data_ptr(), scales.data_ptr(), group_size, n, k, out.data_ptr())
        return out


def load() -> NativeKernels | None:
    """The compiled kernels, or None (said once in the log) where they cannot be built here."""
    if "kernels" in _loaded:
        return _loaded["kernels"]
    from toolkit.compile_native import compiled_library, find_compiler
    from toolkit.errors import ToolkitError

    kernels = None
    cc = find_compiler("c")
    if cc is None:
        log.warning("no C compiler (gcc/cc/clang or $CC): the CPU engine runs norms, RoPE and attention as "
                    "separate torch ops, slower per step; install gcc for the fused kernels")
    else:
        code = resources.files("toolkit.engine.runtime").joinpath("csrc", "decode_kernels.c").read_bytes()
        try:
            path = compiled_library("engine_kernels", "libtoolkit_engine_kernels.so", "decode_kernels.c", code, cc,
                                    _FLAGS, extra_key=_cpu_model())
            kernels = NativeKernels(ctypes.CDLL(str(path)))
        except (ToolkitError, OSError) as error:
            log.warning("the CPU engine's fused kernels did not build (%s): running norms, RoPE and attention "
                        "as separate torch ops instead", error)
    _loaded["kernels"] = kernels
    return kernels
