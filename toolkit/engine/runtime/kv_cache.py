"""The physical paged KV cache: one K and one V tensor per layer, indexed by slot.

slot = block_id * block_size + offset (the scheduler's logical blocks map onto these rows). The cache
stores K/V in the compute dtype, or in 8 bits (kv_cache_dtype fp8 / int8) with one scale per layer
and tensor: ModelOpt's calibrated k/v scales when the checkpoint has them, else a fixed scale that
keeps the values of a normalised model in range (stated in `scale_source`).
"""

from __future__ import annotations

from toolkit.engine.runtime.weight_arena import zeroed_on_huge_pages

KV_CACHE_DTYPES = ("auto", "fp8", "int8")
_FP8_MAX = 448.0
_INT8_MAX = 127.0


class PagedKVCache:
    def __init__(self, *, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 compute_dtype, kv_cache_dtype: str = "auto", scales: list[dict] | None = None, device="cpu",
                 spare_blocks: int = 0):
        import torch

        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
        self.kv_cache_dtype = kv_cache_dtype
        self.compute_dtype = compute_dtype
        self.block_size = block_size
        self.num_blocks = num_blocks
        storage = {"auto": compute_dtype, "fp8": torch.float8_e4m3fn, "int8": torch.int8}[kv_cache_dtype]
        # Spare blocks past num_blocks belong to no sequence: padded rows of a CUDA-graph step write there.
        self.spare_slot = num_blocks * block_size if spare_blocks else None
        shape = ((num_blocks + spare_blocks) * block_size, num_kv_heads, head_dim)
        if torch.device(device).type == "cpu":
            # A sequence's blocks end up scattered over the cache as requests come and go; decode attention then
            # jumps from block to block, and on 4 KiB pages each jump was a TLB miss: with the blocks at random, a
            # 16-sequence step's attention ran 10-18 % faster on 2 MiB pages; in order, alike
            # (perf/attention_bench.py, 2026-11-27).
            tensors = zeroed_on_huge_pages(shape, storage, 2 * num_layers)
            self.k, self.v = tensors[:num_layers], tensors[num_layers:]
        else:
            self.k = [torch.zeros(shape, dtype=storage, device=device) for _ in range(num_layers)]
            self.v = [torch.zeros(shape, dtype=storage, device=device) for _ in range(num_layers)]
        # ModelOpt's k/v scales are amax / 448 (fp8); for int8 the same amax is spread over 127 steps.
        self.scale_source = "none"
        self.k_scale = [1.0] * num_layers
        self.v_scale = [1.0] * num_layers
        if kv_cache_dtype != "auto":
            have = scales and all("k" in s and "v" in s for s in scales)
            self.scale_source = "checkpoint" if have else "fixed"
            for i in range(num_layers):
                k_amax = scales[i]["k"] * _FP8_MAX if have else 16.0
                v_amax = scales[i]["v"] * _FP8_MAX if have else 16.0
                top = _FP8_MAX if kv_cache_dtype == "fp8" else _INT8_MAX
                self.k_scale[i], self.v_scale[i] = k_amax / top, v_amax / top

    @property
    def bytes_per_token(self) -> int:
        k = self.k[0]
        return 2 * len(self.k) * k.shape[1] * k.shape[2] * k.element_size()

    def _encode(self, x, scale):
        import torch

        if self.kv_cache_dtype == "auto":
            return x
        x = x.float() / scale
        if self.kv_cache_dtype == "fp8":
            return x.clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
        return x.round().clamp(-_INT8_MAX, _INT8_MAX).to(torch.int8)

    def _decode(self, x, scale):
        if self.kv_cache_dtype == "auto":
            return x
        return x.to(self.compute_dtype) * scale

    def write(self, layer: int, slots, k, v) -> None:
        """k, v: [T, kv_heads, head_dim] for the step's new tokens, written at `slots` [T]."""
        # fp8 tensors lack index kernels on CPU: move their bytes as uint8.
        self._bytes(self.k[layer]).index_copy_(0, slots, self._bytes(self._encode(k, self.k_scale[layer])))
        self._bytes(self.v[layer]).index_copy_(0, slots, self._bytes(self._encode(v, self.v_scale[layer])))

    def read(self, layer: int, slots):
        """K, V at `slots` (any shape of slot ids) → [..., kv_heads, head_dim] in the compute dtype."""
        k, v = self.k[layer], self.v[layer]
        if self.kv_cache_dtype == "fp8":
            k, v = self._bytes(k)[slots].view(k.dtype), self._bytes(v)[slots].view(v.dtype)
        else:
            k, v = k[slots], v[slots]
        return self._decode(k, self.k_scale[layer]), self._decode(v, self.v_scale[layer])

    def _bytes(self, x):
        import torch

        return x.view(torch.uint8) if self.kv_cache_dtype == "fp8" else x
