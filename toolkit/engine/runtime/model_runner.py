"""ModelRunner: one forward pass of a Llama model over a mixed batch, reading and writing the paged KV cache.

The contract is `step.py`: the scheduler hands a `StepInput`, the runner writes the new tokens' K/V at
`slot_mapping`, attends through `block_tables`, and returns float32 logits at `logits_indices`.

Architecture: RMSNorm, RoPE (the checkpoint's rope_theta, non-interleaved halves as in HF Llama),
grouped-query attention, SwiGLU MLP, tied or untied lm_head. Linears run on the kernels in
`kernels.py` on the weights as ModelOpt exported them; embeddings, norms and lm_head stay in the
compute dtype (ModelOpt leaves them unquantized too).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from toolkit.engine.runtime.checkpoint import LinearWeights, load_checkpoint
from toolkit.engine.runtime.cpu_binding import apply_binding, engine_binding
from toolkit.engine.runtime.kernels import DenseLinear, KernelChoice, can_fuse, make_linear
from toolkit.engine.runtime.kv_cache import PagedKVCache
from toolkit.engine.runtime.step import StepInput

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunnerSpec:
    vocab_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    max_position_embeddings: int


def decode_mask(lens, width: int):
    """[B, 1, 1, width]: which of each decode row's `width` gathered context slots are its own (the first lens[b])."""
    import torch

    return (torch.arange(width)[None, :] < lens[:, None])[:, None, None, :]


def resolve_dtype(dtype: str, device: str):
    import torch

    if dtype == "auto":
        return torch.bfloat16
    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32,
             "fp16": torch.float16, "float16": torch.float16}
    if dtype not in table:
        raise ValueError(f"dtype {dtype!r} is not one of auto, bf16, fp32, fp16")
    return table[dtype]


class _Layer:
    def __init__(self, weights, dtype, device, choice: KernelChoice = KernelChoice(), native=None):
        self.choice = choice
        self.native = native
        lin = weights.linears
        self.input_norm = weights.input_norm.float().to(device)
        self.post_norm = weights.post_attention_norm.float().to(device)
        self.qkv, self.input_norm = self._fused([lin["q"], lin["k"], lin["v"]], self.input_norm, dtype, device)
        self.gate_up, self.post_norm = self._fused([lin["gate"], lin["up"]], self.post_norm, dtype, device)
        self.o, self.o_smooth = self._single(lin["o"], dtype, device)
        self.down, self.down_smooth = self._single(lin["down"], dtype, device)
        self.splits = [lin["q"].out_features, lin["k"].out_features, lin["v"].out_features]
        self.input_norm = self.input_norm.to(dtype)
        self.post_norm = self.post_norm.to(dtype)

    def _fused(self, parts: list[LinearWeights], norm, dtype, device):
        """Fold a shared pre_quant_scale into the norm (exact), then fuse the GEMMs where formats allow."""
        smooth = parts[0].pre_quant_scale
        if smooth is not None and all(p.pre_quant_scale is not None for p in parts) and can_fuse(parts):
            norm = norm * smooth.to(device)
            parts = [LinearWeights(p.kind, p.weight, p.weight_scale, None, p.input_scale, p.act_quant) for p in parts]
        if can_fuse(parts):
            return [make_linear(parts, dtype, device, self.choice, self.native)], norm
        return [_Smoothed(make_linear([p], dtype, device, self.choice, self.native), p.pre_quant_scale, dtype,
                          device) for p in parts], norm

    def _single(self, part: LinearWeights, dtype, device):
        smooth = None if part.pre_quant_scale is None else part.pre_quant_scale.to(device).to(dtype)
        return make_linear([part], dtype, device, self.choice, self.native), smooth


def _project(linears, x):
    """One fused linear's output, or the unfused parts' outputs side by side (same columns)."""
    import torch

    return linears[0](x) if len(linears) == 1 else torch.cat([lin(x) for lin in linears], dim=-1)


class _Smoothed:
    def __init__(self, linear, smooth, dtype, device):
        self.linear = linear
        self.smooth = None if smooth is None else smooth.to(device).to(dtype)

    def __call__(self, x):
        return self.linear(x if self.smooth is None else x * self.smooth)


class ModelRunner:
    def __init__(self, checkpoint_dir, *, num_blocks: int, block_size: int, kv_cache_dtype: str = "auto",
                 dtype: str = "auto", threads: int | None = None, device: str = "cpu", fp8_kernel: str = "auto",
                 native: bool = True, prompt_gemm_dtype: str | None = None, decode_graphs: str = "auto",
                 huge_pages: bool = True, int4_activations: str = "auto", numa: str | int = "auto"):
        """threads, numa: on the CPU, the engine's threads and NUMA binding (cpu_binding.py; None: its default), applied
        to the process and to the calling thread's OpenMP team: build the runner on the thread that steps it, and where
        the process goes on to other work, inside cpu_binding.bound (format_effect.py).
        decode_graphs: "auto" replays decode steps from CUDA graphs on a GPU (cuda_graphs.py); "off" never;
        "padded" runs their padded step without capturing (how the CPU tests check what a graph replays).
        huge_pages: on the CPU, the linears' weights in one buffer on 2 MiB pages (weight_arena.py).
        fp8_kernel, int4_activations: kernels.KernelChoice (the CPU kernels of fp8 and INT4-AWQ)."""
        import torch

        from toolkit.engine.runtime.kernels import set_prompt_gemm_dtype

        self.cpu_binding = None
        if device == "cpu":  # before the weights load: first touch places their pages on the node bound to
            self.cpu_binding = engine_binding(numa, threads)
            apply_binding(self.cpu_binding)
            log.info("CPU engine: %s", self.cpu_binding.describe())
        if prompt_gemm_dtype is not None:  # the engine build's choice (engine_config.json); None: timed on first use
            set_prompt_gemm_dtype(prompt_gemm_dtype)
        self.device = device
        self.dtype = resolve_dtype(dtype, device)
        ckpt = load_checkpoint(checkpoint_dir)
        s = ckpt.spec
        self.spec = RunnerSpec(s.vocab_size, s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim, s.hidden_size,
                               s.max_position_embeddings)
        self.quant_algo = ckpt.quant_algo
        self.eps = s.rms_norm_eps
        self.block_size = block_size
        self.embed = ckpt.embed_tokens.to(device).to(self.dtype)
        self.final_norm = ckpt.final_norm.to(device).to(self.dtype)
        # Fused C kernels for norms, RoPE, decode attention and few-row GEMMs (native_kernels.py) where they build here.
        self.native = None
        if native and device == "cpu":
            from toolkit.engine.runtime import native_kernels

            kernels = native_kernels.load()
            self.native = kernels if kernels is not None and kernels.supports(self.dtype) else None
        choice = KernelChoice(fp8_kernel, int4_activations)
        self.layers = [_Layer(layer, self.dtype, device, choice, self.native) for layer in ckpt.layers]
        if decode_graphs not in ("auto", "off", "padded"):
            raise ValueError(f"decode_graphs {decode_graphs!r} is not one of auto, off, padded")
        on_cuda = torch.device(device).type == "cuda"
        if decode_graphs == "padded" and self.native is not None:
            raise ValueError("decode_graphs padded runs the torch-ops step: build the runner with native=False")
        graphs_mode = "capture" if decode_graphs == "auto" and on_cuda else "padded" if decode_graphs == "padded" else None
        self.lm_head = DenseLinear(ckpt.lm_head.to(device), self.dtype, self.native)
        inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float64) / s.head_dim))
        angles = torch.outer(torch.arange(s.max_position_embeddings, dtype=torch.float64), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.cos = angles.cos().to(self.dtype).to(device)
        self.sin = angles.sin().to(self.dtype).to(device)
        self.cache = PagedKVCache(num_layers=s.num_layers, num_blocks=num_blocks, block_size=block_size,
                                  num_kv_heads=s.num_kv_heads, head_dim=s.head_dim, compute_dtype=self.dtype,
                                  kv_cache_dtype=kv_cache_dtype, scales=[layer.kv_scales for layer in ckpt.layers],
                                  device=device, spare_blocks=1 if graphs_mode else 0)
        self.weight_arena = None
        if huge_pages and torch.device(device).type == "cpu":  # before the C step takes the weights' addresses
            from toolkit.engine.runtime.weight_arena import gather_weights

            del ckpt  # the checkpoint's copies go first: the move then holds at most one more copy of each tensor
            # The runner's own tensors too (the embedding, RoPE tables, final norm): a tied embedding is the
            # lm_head's tensor, and moving only the lm_head's would have kept a second copy of it.
            self.weight_arena = gather_weights([*(lin for layer in self.layers for lin in self._linears(layer)),
                                                self.lm_head, self])
        self.decoder = self._native_decoder()
        self.graphs = None
        if graphs_mode:
            from toolkit.engine.runtime.cuda_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(self, capture=graphs_mode == "capture")
        self.warm_up_seconds = 0.0
        if kv_cache_dtype != "auto" and self.cache.scale_source == "fixed":
            log.warning("kv_cache_dtype %s: the checkpoint has no calibrated k/v scales; using a fixed amax of 16",
                        kv_cache_dtype)

    @property
    def weight_format(self) -> str:
        formats = {lin.weight_format for layer in self.layers
                   for lin in (*self._linears(layer),)}
        return "+".join(sorted(formats))

    @property
    def prompt_gemm_dtype(self) -> str:
        """What prompt chunks' dense GEMMs compute in: a bf16 runner's in fp32 on a CPU where that is faster
        (kernels.prefill_in_fp32, timed once per process), else the runner's dtype."""
        import torch

        from toolkit.engine.runtime.kernels import prefill_in_fp32

        if self.dtype == torch.bfloat16 and torch.device(self.device).type == "cpu" and prefill_in_fp32():
            return "float32"
        return str(self.dtype).replace("torch.", "")

    @property
    def step_kernels(self) -> str:
        """What runs between the GEMMs: the fused C kernels, or torch ops where those could not be built."""
        if self.native is None:
            return "torch ops" + ("; decode steps replayed from CUDA graphs" if self.graphs and self.graphs.capture else "")
        linears = [lin for layer in self.layers for lin in self._linears(layer)]
        amx = [lin.weight_format for lin in linears if getattr(lin, "amx", False)]
        tiles_from = [(lin.weight_format, lin.tile_rows) for lin in linears if getattr(lin, "tile_rows", 0)]
        return (f"fused C on {self.native.isa} (norms, RoPE, SwiGLU, paged attention, few-row GEMMs)"
                + (f"; {sorted(set(amx))[0]} GEMMs on AMX tiles at every row count" if amx else "")
                + ("; {} GEMMs on AMX tiles from {} rows".format(*min(tiles_from)) if tiles_from else "")
                + (f"; decode steps of up to {self.decoder.max_rows} sequences in one C call" if self.decoder else "")
                + (", its layers in one OpenMP region" if self.decoder and self.native.decode_in_one_region(self.decoder)
                   else "")
                + ("; weights on 2 MiB pages" if self.weight_arena and self.weight_arena.on_huge_pages else ""))

    def _native_decoder(self):
        """The decoder layers described for the one-call C decode step (native_kernels.DecodeModel), or None
        where some part does not run on the C kernels (no compiler, neither AVX512-BF16 nor AVX2 for bf16/int4, unfused
        q/k/v or gate/up)."""
        if self.native is None:
            return None
        from toolkit.engine.runtime.native_kernels import DecodeModel, NativeLayer

        layers = []
        for i, layer in enumerate(self.layers):
            if len(layer.qkv) != 1 or len(layer.gate_up) != 1:
                return None
            parts = [lin.native_linear() for lin in (layer.qkv[0], layer.o, layer.gate_up[0], layer.down)]
            if any(p is None for p in parts):  # None: that linear is not on a C GEMM this CPU has
                return None
            layers.append(NativeLayer(*parts, layer.o_smooth, layer.down_smooth, layer.input_norm, layer.post_norm,
                                      self.cache.k[i], self.cache.v[i], self.cache.k_scale[i], self.cache.v_scale[i]))
        lm_head = self.lm_head.native_linear()
        if lm_head is None:
            return None
        s = self.spec
        return DecodeModel(layers, hidden=s.hidden_size, heads=s.num_heads, kv_heads=s.num_kv_heads,
                           head_dim=s.head_dim, inter=layers[0].gate_up.n // 2, block_size=self.block_size,
                           eps=self.eps, cos=self.cos, sin=self.sin, final_norm=self.final_norm, embed=self.embed,
                           lm_head=lm_head)

    @property
    def weight_bytes(self) -> int:
        """Bytes one decode step reads for weights (linears + lm_head; the embedding row is negligible)."""
        linear = sum(lin.weight_bytes for layer in self.layers for lin in self._linears(layer))
        return linear + self.lm_head.weight_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.cache.bytes_per_token

    @staticmethod
    def _linears(layer):
        unwrap = lambda m: getattr(m, "linear", m)  # noqa: E731
        return [unwrap(m) for m in (*layer.qkv, *layer.gate_up, layer.o, layer.down)]

    # --- the forward pass -------------------------------------------------------------------------

    def _rms_norm(self, x, weight):
        import torch

        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * xf.to(x.dtype)

    def _rope(self, x, cos, sin):
        import torch

        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _attention_plan(self, step: StepInput):
        """With the fused kernel, `_native_attention_plan`. Else, for the torch ops: per prefill sequence its
        query rows and the cache slots of its whole context; for the single-token (decode) sequences, one
        batched call over a padded gather of their slots and a mask."""
        import torch

        if self.native is not None:
            return self._native_attention_plan(step)
        bs = self.block_size
        decode_rows, decode_tables, decode_lens, prefill = [], [], [], []
        row = 0
        for q_len, ctx, table in zip(step.query_lens, step.context_lens, step.block_tables):
            blocks = list(table[: -(-ctx // bs)])
            if q_len == 1:
                decode_rows.append(row)
                decode_tables.append(blocks)
                decode_lens.append(ctx)
            else:
                prefill.append((row, q_len, ctx, self._slots(blocks, ctx).to(self.device)))
            row += q_len
        if not decode_rows:
            return None, prefill
        longest = max(decode_lens)
        slots = torch.stack([torch.nn.functional.pad(self._slots(t, n), (0, longest - n))
                             for t, n in zip(decode_tables, decode_lens)])
        mask = decode_mask(torch.tensor(decode_lens), longest)
        return (torch.tensor(decode_rows, device=self.device), slots.to(self.device), mask.to(self.device)), prefill

    def _native_attention_plan(self, step: StepInput):
        """The fused kernels' plan for every query row of the step: (row tables, row context lengths) for the rows
        the decode-attention kernel takes one by one, and (chunk tables, chunks) for the prompt chunks
        chunk_attention takes whole (`_chunk_rows`); either pair None where no row takes that kernel. A prefill
        chunk's query i sits at position ctx - q_len + i and sees the context up to it (causal): on the row kernel
        a decode-style query over that prefix of its sequence's blocks, its row's length 0 where chunk_attention
        takes it. One call for the whole step: torch's CPU flash attention took 10.5 ms of a 128-token prefill of
        `small` (16 layers), the row kernel 3.4 ms, chunk_attention on AMX tiles 1.4 ms (2026-11-29)."""
        import torch

        bs = self.block_size
        width = max(-(-ctx // bs) for ctx in step.context_lens)
        tables, lens, chunk_tables, chunks = [], [], [], []  # plain lists, one tensor each: torch ops per sequence cost ~20 us each
        row = 0
        for q_len, ctx, table in zip(step.query_lens, step.context_lens, step.block_tables):
            used = -(-ctx // bs)
            blocks = list(table[:used]) + [0] * (width - used)
            if q_len >= self._chunk_rows:
                chunk_tables.append(blocks)
                chunks.append((row, q_len, ctx))
                lens.extend([0] * q_len)
            else:
                lens.extend(range(ctx - q_len + 1, ctx + 1))
            tables.extend([blocks] * q_len)
            row += q_len
        as_rows = (torch.tensor(tables, dtype=torch.int64), torch.tensor(lens, dtype=torch.int64)) \
            if len(chunks) < len(step.query_lens) else (None, None)
        as_chunks = (torch.tensor(chunk_tables, dtype=torch.int64), torch.tensor(chunks, dtype=torch.int64)) \
            if chunks else (None, None)
        return as_rows + as_chunks

    @functools.cached_property
    def _chunk_rows(self) -> float:
        """From how many rows a prompt chunk takes chunk_attention here (NativeKernels.chunk_min_rows)."""
        spec = self.spec
        return self.native.chunk_min_rows(self.dtype, self.cache.k[0].dtype, spec.head_dim,
                                          spec.num_heads // spec.num_kv_heads)

    def _slots(self, blocks: list[int], ctx: int):
        """The cache rows of a context of `ctx` tokens laid over `blocks`."""
        import torch

        bs = self.block_size
        return (torch.tensor(blocks, dtype=torch.int64)[:, None] * bs + torch.arange(bs)).reshape(-1)[:ctx]

    def _decode_attention(self, q, k, v, mask):
        """One query per sequence: q [B, heads, hd], k/v [B, ctx, kv_heads, hd], mask [B, 1, 1, ctx].
        Two small batched matmuls: CPU's flash-attention kernel costs ~10x more for a single query."""
        import torch

        batch, heads, hd = q.shape
        kv_heads = k.shape[2]
        qg = q.reshape(batch, kv_heads, heads // kv_heads, hd)
        scores = torch.matmul(qg, k.permute(0, 2, 3, 1)).float() * (hd ** -0.5)  # [B, kvh, g, ctx]
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).to(v.dtype)
        return torch.matmul(probs, v.permute(0, 2, 1, 3)).reshape(batch, heads, hd)

    def _attend(self, layer_idx: int, q, plan):
        """q: [T, heads, head_dim] → [T, heads * head_dim], reading K/V from the cache."""
        import torch
        import torch.nn.functional as F

        if self.native is not None:
            tables, lens, chunk_tables, chunks = plan
            k, v, ks, vs = (self.cache.k[layer_idx], self.cache.v[layer_idx], self.cache.k_scale[layer_idx],
                            self.cache.v_scale[layer_idx])
            q = q.contiguous()
            out = torch.empty_like(q)
            if chunks is not None:
                self.native.chunk_attention(q, k, v, chunk_tables, chunks, self.block_size, ks, vs, out)
            if tables is not None:
                self.native.decode_attention(q, k, v, tables, lens, self.block_size, ks, vs, out=out)
            return out.reshape(q.shape[0], -1)
        decode, prefill = plan
        out = torch.empty_like(q)
        if decode is not None:
            rows, slots, mask = decode
            k, v = self.cache.read(layer_idx, slots)  # [S, ctx, kv_heads, hd]
            out[rows] = self._decode_attention(q[rows], k, v, mask)
        for start, q_len, ctx, slots in prefill:
            k, v = self.cache.read(layer_idx, slots)  # [ctx, kv_heads, hd]
            qs = q[start:start + q_len].transpose(0, 1).unsqueeze(0)
            if q_len == ctx:
                o = F.scaled_dot_product_attention(qs, k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                                   is_causal=True, enable_gqa=True)
            else:  # a later chunk (or draft verification): query i sits at position ctx - q_len + i
                mask = torch.arange(ctx, device=q.device)[None, :] <= torch.arange(ctx - q_len, ctx, device=q.device)[:, None]
                o = F.scaled_dot_product_attention(qs, k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                                   attn_mask=mask, enable_gqa=True)
            out[start:start + q_len] = o[0].transpose(0, 1)
        return out.reshape(q.shape[0], -1)

    def forward(self, step: StepInput):
        import torch

        if (self.decoder is not None and step.num_tokens == step.num_sequences
                and step.num_tokens <= self.decoder.max_rows):  # decode only, where the C GEMMs beat torch's
            return self._decode_in_one_call(step)
        with torch.inference_mode():
            return self._forward(step)

    def _decode_in_one_call(self, step: StepInput):
        """A decode-only step on the one-call C step (CPU only), its block tables and context lengths in plain int64
        arrays. Why not torch here: the previous step's weights have streamed through the caches, and each torch op on
        the way in missed them; inference_mode's entry and the two small tensors of the attention plan took ~0.17 ms
        of every step, a tenth of an int4 step at one sequence (2026-11-26)."""
        from array import array

        bs = self.block_size
        used = [-(-ctx // bs) for ctx in step.context_lens]
        width = max(used)
        tables = array("q", bytes(8 * width * len(used)))  # zeros past each sequence's blocks
        for s, (table, n) in enumerate(zip(step.block_tables, used)):
            tables[s * width:s * width + n] = array("q", table[:n])
        return self.native.decode_step(self.decoder, step.token_ids, step.positions, step.slot_mapping, tables, width,
                                       array("q", step.context_lens), step.logits_indices)

    def _forward(self, step: StepInput):
        if self.graphs is not None and self.graphs.accepts(step):
            logits = self.graphs.run(step)
            if logits is not None:
                return logits.float()

        token_ids = step.token_ids.to(self.device)
        positions = step.positions.to(self.device)
        slots = step.slot_mapping.to(self.device)
        plan = self._attention_plan(step)
        logits_indices = step.logits_indices.to(self.device)
        if self.native is not None:
            x = self._fused_layers(token_ids, positions, slots, lambda i, q: self._attend(i, q, plan))
            return self.lm_head(x[logits_indices]).float()
        h = self._layers(token_ids, positions, slots, lambda i, q: self._attend(i, q, plan))
        return self._logits(h[logits_indices])

    def _fused_layers(self, token_ids, positions, slots, attend):
        """`_layers` on the fused C kernels: each residual add folded into the RMSNorm after it, RoPE in
        place on the qkv output, K and V from there into the cache, SwiGLU's middle in one call. Returns the
        final-normed hidden states."""
        import torch

        spec, native, eps, cache = self.spec, self.native, self.eps, self.cache
        positions = positions.to(torch.int64).contiguous()
        h = self.embed[token_ids].contiguous()
        x = native.rms_norm(h, self.layers[0].input_norm, eps)
        for i, layer in enumerate(self.layers):
            qkv = _project(layer.qkv, x)
            native.rope_(qkv, spec.num_heads, spec.head_dim, positions, self.cos, self.sin)
            native.rope_(qkv[:, layer.splits[0]:], spec.num_kv_heads, spec.head_dim, positions, self.cos, self.sin)
            native.write_kv_cache(qkv, spec.num_heads, spec.num_kv_heads, spec.head_dim, slots, cache.k[i], cache.v[i],
                                  cache.k_scale[i], cache.v_scale[i])
            attn = attend(i, qkv[:, :layer.splits[0]].reshape(-1, spec.num_heads, spec.head_dim))
            if layer.o_smooth is not None:  # the o projection's AWQ / SmoothQuant scale, in place
                native.smooth_rows_(attn, layer.o_smooth)
            x = native.add_rms_norm_(h, layer.o(attn), layer.post_norm, eps)
            gu = _project(layer.gate_up, x)
            mlp_in = native.silu_mul(gu, layer.down_smooth)  # the down projection's smoothing folded in
            after = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.final_norm
            x = native.add_rms_norm_(h, layer.down(mlp_in), after, eps)
        return x

    def _layers(self, token_ids, positions, slots, attend):
        """Embedding and every decoder layer in torch ops (the path without the fused kernels, and their
        reference in the tests); `attend(layer, q)` reads the cache after this step's writes."""
        import torch.nn.functional as F

        spec = self.spec
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        h = self.embed[token_ids]
        for i, layer in enumerate(self.layers):
            x = self._rms_norm(h, layer.input_norm)
            qkv = _project(layer.qkv, x)
            q, k, v = qkv.split(layer.splits, dim=-1)
            q = self._rope(q.reshape(-1, spec.num_heads, spec.head_dim), cos, sin)
            k = self._rope(k.reshape(-1, spec.num_kv_heads, spec.head_dim), cos, sin)
            self.cache.write(i, slots, k, v.reshape(-1, spec.num_kv_heads, spec.head_dim))
            attn = attend(i, q)
            h = h + layer.o(attn if layer.o_smooth is None else attn * layer.o_smooth)
            x = self._rms_norm(h, layer.post_norm)
            gu = _project(layer.gate_up, x)
            gate, up = gu.chunk(2, dim=-1)
            mlp_in = F.silu(gate) * up
            h = h + layer.down(mlp_in if layer.down_smooth is None else mlp_in * layer.down_smooth)
        return h

    def _logits(self, h):
        return self.lm_head(self._rms_norm(h, self.final_norm)).float()

    def warm_up(self, max_batch_size: int, max_num_tokens: int) -> None:
        """First-call costs paid before serving: one prefill
        of max_num_tokens tokens and one decode step per padded batch size up to max_batch_size. The
        writes land in the cache's first blocks, which the scheduler's first real writes overwrite
        before any read."""
        import time

        import torch

        start = time.perf_counter()
        bs = self.block_size
        capacity = self.cache.num_blocks * bs
        n = min(max_num_tokens, capacity, self.spec.max_position_embeddings)
        blocks = list(range(-(-n // bs)))
        self.forward(StepInput(torch.zeros(n, dtype=torch.int64), torch.arange(n), [n], [n], [blocks],
                               torch.arange(n), torch.tensor([n - 1])))
        batch = 1
        while True:
            size = min(batch, max_batch_size, self.cache.num_blocks)
            self.forward(StepInput(torch.zeros(size, dtype=torch.int64), torch.zeros(size, dtype=torch.int64),
                                   [1] * size, [1] * size, [[b] for b in range(size)],
                                   torch.arange(size) * bs, torch.arange(size)))
            if size >= min(max_batch_size, self.cache.num_blocks):
                break
            batch *= 2
        self.warm_up_seconds = time.perf_counter() - start
        log.info("engine warm-up took %.1f s", self.warm_up_seconds)
