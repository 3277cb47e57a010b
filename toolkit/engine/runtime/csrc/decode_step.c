/* A whole decode step in one call: the tokens' embedding, the decoder layers, lm_head (decode_step at the end;
 * compiled after decode_kernels.c, in the same unit).
 *
 * Why: at batch 1 the step's GEMMs on `small` take a few milliseconds, and calling the fused kernels
 * one by one from Python (about a dozen calls per layer, each with its tensor allocations, views and
 * ctypes argument conversion) added ~1.1 ms per step: a third of an int4 step. Here the same kernels
 * run in the same order on the same data, driven by a description of the model built once at load
 * (model_t below, mirrored by ctypes structures in native_kernels.py), so the result is bit-identical
 * to the Python-driven path (tests/test_model_runner.py holds it to that).
 *
 * Scope: decode-only steps (one new token per sequence) with bf16 or fp32 activations, fused q/k/v and
 * gate/up GEMMs, and every linear on one of the few-row C GEMMs (the runner checks, else keeps Python).
 * x rounded to the activation format ModelOpt calibrated happens inside the int8 GEMMs, and here for int4.
 * Where every linear's kernel can take a per-thread share (team_linear), the layers run in one OpenMP region
 * (decode_layers_team); elsewhere decode_layers opens a team per GEMM and attention call.
 */

enum { LIN_BF16 = 0, LIN_INT8 = 1, LIN_INT4 = 2, LIN_INT8_VNNI = 3, LIN_FP8 = 4, LIN_BF16_AMX = 5, LIN_INT8_AMX = 6, LIN_FP8_AMX = 7,
       LIN_INT4_AMX = 8, LIN_INT4_A8 = 9, LIN_INT8_A8 = 10 };

typedef struct {
    int32_t kind, n, k, group, act_quant;
    float input_scale;
    const void *weight;          /* LIN_*_AMX: in tiles (native_kernels.pack_amx) */
    const float *scale;          /* int8, fp8: per output row; int4: [n, k / group] (LIN_INT4_AMX: [k / group, n]) */
    const int32_t *weight_sums;  /* LIN_INT8_VNNI: sum of each output row's int8 weights */
    const void *smooth;          /* AWQ / SmoothQuant pre_quant_scale multiplied into the input, or NULL */
    int32_t tile_rows;           /* LIN_INT4_A8: from this many rows on AMX tiles (the same bits), 0: never */
} linear_t;

typedef struct {
    linear_t qkv, o, gate_up, down;
    const void *input_norm, *post_norm;
    void *k_cache, *v_cache;
    float k_scale, v_scale;
} layer_t;

typedef struct {
    int32_t num_layers, hidden, heads, kv_heads, head_dim, inter, act_kind, cache_kind, block_size;
    float eps;
    const void *cos, *sin, *final_norm;
    const layer_t *layers;
    int32_t stub_gemms; /* benchmarks only (perf/engine_bench.py): GEMMs and attention write zeros instead */
    double *part_seconds; /* benchmarks only, NULL = off: seconds spent in each STEP_PARTS part added here */
    const void *embed;    /* [vocab, hidden] in the activation dtype (decode_step's token lookup) */
    linear_t lm_head;     /* [vocab, hidden] (decode_step's logits) */
    int32_t vocab, embed_rows; /* lm_head's outputs (the logits' width); the embedding's rows (token ids' bound) */
    int32_t row_split_min; /* tests and benchmarks only, 0 = ROW_SPLIT_MIN: decode_layers_team splits rows from here */
} model_t;

/* The parts of a step timed in place (model_t.part_seconds): where a step's time goes as it runs, which timing the
 * same kernels called one by one from Python need not show (cache and thread state between them differ). */
enum { PART_QKV = 0, PART_ATTENTION, PART_O, PART_GATE_UP, PART_DOWN, PART_REST, PART_LM_HEAD, STEP_PARTS };

static inline double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Adds the time since *mark to part `part` (when timing) and moves the mark to now. */
static inline void charge(double *parts, int part, double *mark) {
    if (parts == NULL) return;
    const double t = now_seconds();
    parts[part] += t - *mark;
    *mark = t;
}

static int decode_kind_supported(int kind) { /* what decode_layers checks before writing anything */
#if defined(HAVE_AMX)
    if (kind == LIN_BF16_AMX || kind == LIN_INT8_AMX || kind == LIN_FP8_AMX || kind == LIN_INT4_AMX) return 1;
#endif
#if defined(HAVE_GEMM_INT8_VNNI)
    if (kind == LIN_INT8_VNNI) return 1;
#endif
#if defined(HAVE_GEMM_INT4_A8)
    if (kind == LIN_INT4_A8) return 1;
#endif
#if defined(HAVE_GEMM_INT8_A8)
    if (kind == LIN_INT8_A8) return 1;
#endif
#if defined(HAVE_GEMM_BF16)
    if (kind == LIN_BF16 || kind == LIN_INT4) return 1;
#endif
#if defined(__AVX512BF16__)
    if (kind == LIN_FP8) return 1;
#endif
    return kind == LIN_INT8;
}

/* Row m of x [., k] times s (fp32 [k]), in place, rounded to act as `x * smooth` in torch rounds. */
static void smooth_row(void *x, int64_t m, int k, int act, const float *s) {
    float row[k];
    load_row(row, x, m * k, k, act, 1.0f);
    combine_rounded(row, row, s, k, act, 0);
    store_row(x, m * k, row, k, act);
}

/* x [M, k] times the linear's AWQ / SmoothQuant pre_quant_scale, in place, where it has one. */
static void smooth_input(const linear_t *l, void *x, int64_t M, int act) {
    if (l->smooth == NULL) return;
    float s[l->k];
    load_row(s, l->smooth, 0, l->k, act, 1.0f);
    for (int64_t m = 0; m < M; m++) smooth_row(x, m, l->k, act, s);
}

/* x [M, k] times smooth [k] (both in act's dtype), in place: a prompt's o-projection input (torch's multiply took
 * 13-30 us a layer at 128 rows of `small`, a new tensor each time) */
void smooth_rows_(void *x, int64_t M, int k, int act, const void *smooth) {
    float s[k];
    load_row(s, smooth, 0, k, act, 1.0f);
    FOR_ROWS(m, M, 5, smooth_row(x, m, k, act, s));
}

/* y [M, n] = linear(x [M, k]); x is scratch the smoothing may overwrite. */
static void run_linear(const linear_t *l, void *x, int64_t M, void *y, int act, int stub) {
    smooth_input(l, x, M, act);
    if (stub) {
        memset(y, 0, (size_t)M * l->n * act_bytes(act));
        return;
    }
    /* W4A8 on the int4 x int8 kernel: the kernel rounds the activations to fp8 in its own pass over them */
    const int fp8_in_kernel = l->kind == LIN_INT4_A8 && l->act_quant == ACT_FP8;
    switch (l->kind) {
    case LIN_BF16: gemm_bf16((const uint16_t *)x, M, l->k, (const uint16_t *)l->weight, l->n, (uint16_t *)y); break;
    case LIN_INT8:
        gemm_int8(x, M, l->k, (const int8_t *)l->weight, l->scale, l->n, y, act, l->act_quant, l->input_scale);
        break;
    case LIN_INT4:
    case LIN_INT4_AMX:
    case LIN_INT4_A8:
        if (l->act_quant != ACT_NONE && !fp8_in_kernel) {
            /* W4A8: activations rounded to fp8 first, as kernels.Int4Linear does in torch */
            float *rounded = widen_activations(x, M, l->k, act, l->act_quant, l->input_scale);
            for (int64_t m = 0; m < M; m++) store_row(x, m * l->k, rounded + m * l->k, l->k, act);
            free(rounded);
        }
#if defined(HAVE_AMX)
        if (l->kind == LIN_INT4_AMX) {
            gemm_int4_amx((const uint16_t *)x, M, l->k, (const uint8_t *)l->weight, l->scale, l->group, l->n,
                          (uint16_t *)y);
            break;
        }
#endif
#if defined(HAVE_INT4_A8_TILES)
        if (l->kind == LIN_INT4_A8 && l->tile_rows > 0 && M >= l->tile_rows) {
            gemm_int4_a8_amx((const uint16_t *)x, M, l->k, (const uint8_t *)l->weight, l->scale, l->group, l->n,
                             (uint16_t *)y, fp8_in_kernel ? l->input_scale : 0.0f);
            break;
        }
#endif
#if defined(HAVE_GEMM_INT4_A8)
        if (l->kind == LIN_INT4_A8) {
            gemm_int4_a8((const uint16_t *)x, M, l->k, (const uint8_t *)l->weight, l->scale, l->group, l->n,
                         (uint16_t *)y, fp8_in_kernel ? l->input_scale : 0.0f);
            break;
        }
#endif
        gemm_int4((const uint16_t *)x, M, l->k, (const uint8_t *)l->weight, l->scale, l->group, l->n, (uint16_t *)y);
        break;
#if defined(HAVE_GEMM_INT8_A8)
    case LIN_INT8_A8:  /* fp8 weights as int8: the kernel rounds the activations to fp8 in its own pass */
        gemm_int8_a8((const uint16_t *)x, M, l->k, (const int8_t *)l->weight, l->scale, l->n, (uint16_t *)y,
                     l->act_quant == ACT_FP8 ? l->input_scale : 0.0f);
        break;
#endif
    case LIN_FP8:
        gemm_fp8((const uint16_t *)x, M, l->k, (const uint8_t *)l->weight, l->scale, l->n, (uint16_t *)y, l->act_quant,
                 l->input_scale);
        break;
#if defined(HAVE_AMX)
    case LIN_BF16_AMX: gemm_bf16_amx((const uint16_t *)x, M, l->k, (const uint8_t *)l->weight, l->n, (uint16_t *)y); break;
    case LIN_INT8_AMX:
        gemm_int8_amx(x, M, l->k, (const uint8_t *)l->weight, l->scale, l->n, y, act, l->input_scale);
        break;
    case LIN_FP8_AMX:
        gemm_fp8_amx((const uint16_t *)x, M, l->k, (const uint8_t *)l->weight, l->scale, l->n, (uint16_t *)y,
                     l->act_quant, l->input_scale);
        break;
#endif
#if defined(HAVE_GEMM_INT8_VNNI)
    case LIN_INT8_VNNI:
        gemm_int8_vnni(x, M, l->k, (const int8_t *)l->weight, l->scale, l->weight_sums, l->n, y, act, l->input_scale);
        break;
#endif
    }
}

/* v rounded to float8_e4m3fn's byte (|v| <= 448, as the cache clamps first; round to nearest even). */
static uint8_t e4m3_byte(float v) {
    if (v != v) return 0x7f;
    uint8_t sign = signbit(v) ? 0x80 : 0;
    float r = fabsf(round_e4m3(v));
    if (r == 0.0f) return sign;
    int e;
    float f = frexpf(r, &e); /* r = 2f * 2^(e-1), 2f in [1, 2) */
    if (e - 1 < -6) return sign | (uint8_t)lrintf(r * 512.0f); /* subnormal: r = man * 2^-9 */
    return sign | (uint8_t)((e - 1 + 7) << 3) | (uint8_t)lrintf((2.0f * f - 1.0f) * 8.0f);
}

/* Rows b0 .. b1 - 1's K and V (rotated, in qkv rows of qkv_n elements: K's kv_cols from column q_cols, V's after
 * them), elements first .. first + count - 1 of each, into the caches at their slots, encoded as kv_cache.py's
 * PagedKVCache.write does: a copy for the compute dtype, else value / scale rounded to int8 (clamped to +-127) or to
 * fp8 (clamped to +-448). */
static void write_kv_rows(const void *qkv, int64_t b0, int64_t b1, int qkv_n, int q_cols, int kv_cols,
                          const int64_t *slots, int first, int count, void *k_cache, void *v_cache, float k_scale,
                          float v_scale, int act, int cache) {
    const size_t es = act_bytes(act);
    for (int64_t b = b0; b < b1; b++)
        for (int part = 0; part < 2; part++) {
            void *dst = part ? v_cache : k_cache;
            int64_t from = b * qkv_n + q_cols + (int64_t)part * kv_cols + first, to = slots[b] * kv_cols + first;
            if (cache == act) {
                memcpy((char *)dst + to * es, (const char *)qkv + from * es, (size_t)count * es);
                continue;
            }
            float row[count], scale = part ? v_scale : k_scale;
            load_row(row, qkv, from, count, act, 1.0f);
            for (int i = 0; i < count; i++) {
                float x = row[i] / scale;
                if (cache == I8) {
                    float r = nearbyintf(x);
                    ((int8_t *)dst)[to + i] = (int8_t)(r < -127.0f ? -127.0f : r > 127.0f ? 127.0f : r);
                } else {
                    ((uint8_t *)dst)[to + i] = e4m3_byte(x < -448.0f ? -448.0f : x > 448.0f ? 448.0f : x);
                }
            }
        }
}

/* The new tokens' K and V of kv heads kv0 .. kv0 + kv_count - 1 into the layer's cache (write_kv_rows). */
static void write_kv_heads(const model_t *m, const layer_t *l, const void *qkv, int64_t b0, int64_t b1, int qkv_n,
                           const int64_t *slots, int kv0, int kv_count) {
    write_kv_rows(qkv, b0, b1, qkv_n, m->heads * m->head_dim, m->kv_heads * m->head_dim, slots, kv0 * m->head_dim,
                  kv_count * m->head_dim, l->k_cache, l->v_cache, l->k_scale, l->v_scale, m->act_kind, m->cache_kind);
}

/* A prompt step's K and V, every row of qkv [rows, qkv_n] (the fused q/k/v output after RoPE), into a layer's cache at
 * slots: PagedKVCache.write's bytes without its torch ops (index_copy_ took ~24 us a call at 128 rows, ~0.8 ms of a
 * 128-token prompt of `small`). */
void write_kv_cache(const void *qkv, int64_t rows, int qkv_n, int heads, int kv_heads, int head_dim,
                    const int64_t *slots, void *k_cache, void *v_cache, float k_scale, float v_scale, int act_kind,
                    int cache_kind) {
    const int kv_cols = kv_heads * head_dim;
    FOR_ROWS(b, rows, 16, write_kv_rows(qkv, b, b + 1, qkv_n, heads * head_dim, kv_cols, slots, 0, kv_cols, k_cache,
                                        v_cache, k_scale, v_scale, act_kind, cache_kind));
}

static void write_kv(const model_t *m, const layer_t *l, const void *qkv, int64_t batch, int qkv_n,
                     const int64_t *slots) {
    write_kv_heads(m, l, qkv, 0, batch, qkv_n, slots, 0, m->kv_heads);
}

/* The share of `units` units of work of thread t of `threads`, as OpenMP's static schedule splits them. */
static void team_share(int64_t units, int t, int threads, int64_t *u0, int64_t *u1) {
    const int64_t q = units / threads, r = units % threads;
    *u0 = t * q + (t < r ? t : r);
    *u1 = *u0 + q + (t < r);
}

/* Bytes of the activations team_prepare_rows prepares for M rows of K inputs, for any kernel: at most 2 bytes per
 * input (fp8's shifted bf16; int8 padded to 64 inputs) and int4's two scales per 128 inputs besides. */
static int64_t prepared_bytes(int64_t M, int64_t K) {
    return M * (K + 64) * 2 + M * (K / 128 + 1) * 8;
}


/* Rows r0 .. r1 - 1 of a linear's input x [M, k] made ready for its kernel (team_supported's kinds): smoothed in place
 * and, where the kernel takes prepared activations, prepared into `scratch` as the kernel's own call would (row r at
 * its place among M rows), so that any thread can then take its share of the linear (team_compute). */
static void team_prepare_rows(const linear_t *l, void *x, int64_t r0, int64_t r1, int64_t M, int act, char *scratch) {
    const int K = l->k;
    smooth_input(l, (char *)x + r0 * K * act_bytes(act), r1 - r0, act);
    switch (l->kind) {
#if defined(HAVE_GEMM_INT4_A8)
    case LIN_INT4_A8:
    case LIN_INT8_A8: {
        const int64_t chunks = K / 128;
        const a8_rows_t p = a8_prepared(scratch, M, K);
        for (int64_t r = r0; r < r1; r++)
            quantize_int4_activations((const uint16_t *)x + r * K, K, p.xq + r * K, p.xs + r * chunks,
                                      p.x8 + r * chunks, l->act_quant == ACT_FP8 ? l->input_scale : 0.0f);
        break;
    }
#endif
#if defined(HAVE_GEMM_INT8_VNNI)
    case LIN_INT8_VNNI: {
        const int kpad = (K + 63) / 64 * 64;
        for (int64_t r = r0; r < r1; r++) quantize_row(x, r, K, kpad, act, l->input_scale, 128, (uint8_t *)scratch);
        break;
    }
#endif
#if defined(__AVX512BF16__)
    case LIN_FP8:
        for (int64_t r = r0; r < r1; r++)
            shifted_activations_row((const uint16_t *)x, r, K, l->act_quant, l->input_scale, FP8_ACT_SHIFT,
                                    (uint16_t *)scratch);
        break;
#endif
    }
}

/* Thread t of `threads`'s share of a linear whose input x [M, k] is ready for it (team_prepare_rows: every row), into
 * y [M, n] shared: the units of work the kernel's own loop gives thread t. */
static void team_compute(const linear_t *l, const void *x, int64_t M, void *y, int act, int t, int threads,
                         char *scratch) {
    const int K = l->k, N = l->n;
    int64_t u0, u1;
    (void)K, (void)N, (void)u0, (void)u1; /* a portable build (no team kernels) compiles none of the cases */
    switch (l->kind) {
#if defined(HAVE_GEMM_INT4_A8)
    case LIN_INT4_A8: {
        const a8_rows_t p = a8_prepared(scratch, M, K);
#if defined(HAVE_INT4_A8_TILES)
        if (l->tile_rows > 0 && M >= l->tile_rows) {  /* groups of 4 blocks on AMX tiles, the same bits */
            const int64_t nb = (N + 15) / 16;
            team_share((nb + 3) / 4, t, threads, &u0, &u1);
            if (u1 > u0)
                int4_a8_tile_blocks(p, M, K, (const uint8_t *)l->weight, l->scale, l->group, N, (uint16_t *)y, 4 * u0,
                                    4 * u1 < nb ? 4 * u1 : nb);
            break;
        }
#endif
        team_share((N + 15) / 16, t, threads, &u0, &u1);
        int4_a8_blocks(p.xq, p.xs, p.x8, M, K, (const uint8_t *)l->weight, l->scale, l->group, N, (uint16_t *)y, u0,
                       u1);
        break;
    }
#endif
#if defined(HAVE_GEMM_INT8_A8)
    case LIN_INT8_A8: {
        const a8_rows_t p = a8_prepared(scratch, M, K);
        team_share((N + 15) / 16, t, threads, &u0, &u1);
        int8_a8_blocks(p.xq, p.xs, p.x8, M, K, (const int8_t *)l->weight, l->scale, N, (uint16_t *)y, u0, u1);
        break;
    }
#endif
#if defined(HAVE_GEMM_INT8_VNNI)
    case LIN_INT8_VNNI: {
        const int kpad = (K + 63) / 64 * 64, unit = int8_vnni_unit(M, N);
        team_share((N + 15) / 16 / unit, t, threads, &u0, &u1);
        int8_vnni_blocks((const uint8_t *)scratch, M, kpad, (const int8_t *)l->weight, l->scale, l->weight_sums, N, y,
                         act, l->input_scale, u0 * unit, u1 * unit);
        break;
    }
#endif
#if defined(__AVX512BF16__)
    case LIN_FP8: {
        const int unit = fp8_block_rows(N);
        team_share((N + unit - 1) / unit, t, threads, &u0, &u1);
        fp8_rows((const uint16_t *)scratch, M, K, (const uint8_t *)l->weight, l->scale, N, (uint16_t *)y,
                 (int)(u0 * unit), (int)(u1 * unit < N ? u1 * unit : N));
        break;
    }
#endif
#if defined(HAVE_GEMM_BF16)
    case LIN_BF16: {
        const int unit = bf16_unit(M, K, N);
        team_share(N / unit, t, threads, &u0, &u1);
        bf16_rows((const uint16_t *)x, M, K, (const uint16_t *)l->weight, N, (uint16_t *)y, (int)(u0 * unit),
                  (int)(u1 * unit));
        break;
    }
#endif
    }
}

/* A team thread's share of a linear on one of the kernels with a per-thread share (team_supported), into y [M, n]
 * shared, the units of work of thread t of `threads` as the kernel's own loop splits them. x [M, k] and `scratch` are
 * this thread's own, and it prepares every row (r0 = 0, r1 = M, split 0); or they are shared (split 1), this thread
 * prepares rows r0 .. r1 - 1, and the team meets before any thread computes. */
static void team_linear(const linear_t *l, void *x, int64_t r0, int64_t r1, int64_t M, void *y, int act, int t,
                        int threads, char *scratch, int split, int stub) {
    if (stub) smooth_input(l, (char *)x + r0 * l->k * act_bytes(act), r1 - r0, act);
    else team_prepare_rows(l, x, r0, r1, M, act, scratch);
    if (split) {
        #pragma omp barrier
    }
    if (stub) {  /* benchmarks only (model_t.stub_gemms): zeros instead, as run_linear */
        if (t == 0) memset(y, 0, (size_t)M * l->n * act_bytes(act));
        return;
    }
    team_compute(l, x, M, y, act, t, threads, scratch);
}

/* decode_layers_team shares the rows' work between the threads from this many sequences (see there) */
#define ROW_SPLIT_MIN 4

/* A linear team_linear can share out (with bf16 activations): the int4 x int8, INT8-SQ's VNNI, fp8 and bf16 kernels,
 * as they run on an AVX512-BF16 + VNNI CPU (bf16 on AVX2 + FMA too), and fp8 as int8 x int8 (VNNI or AVX2); not AMX's tiles,
 * the widening int8 or the bf16-activation int4 kernels. */
static int team_kind(const linear_t *l) {
    const int kind = l->kind;
    if (!decode_kind_supported(kind) || (kind != LIN_INT4_A8 && kind != LIN_INT8_A8 && kind != LIN_INT8_VNNI &&
                                         kind != LIN_FP8 && kind != LIN_BF16))
        return 0;
    return (kind != LIN_INT4_A8 && kind != LIN_INT8_A8) || l->act_quant == ACT_NONE || l->act_quant == ACT_FP8;
}

/* Whether decode_layers_team runs this model: every linear a team_kind, bf16 activations, and a team to share the
 * work. */
static int team_supported(const model_t *m) {
    if (m->act_kind != BF16 || omp_get_max_threads() < 2) return 0;
    for (int i = 0; i < m->num_layers; i++) {
        const linear_t *ls[4] = {&m->layers[i].qkv, &m->layers[i].o, &m->layers[i].gate_up, &m->layers[i].down};
        for (int j = 0; j < 4; j++)
            if (!team_kind(ls[j])) return 0;
    }
    return 1;
}

/* decode_layers in one OpenMP region: each thread keeps its own copy of the residual stream and of every GEMM's
 * input, computes the norms and SwiGLU's middle on it itself, and the RoPE, KV writes and attention of its own
 * attention items (attention_then's round robin); the threads meet once after each GEMM and after attention.
 * Why: decode_layers opens a team per GEMM and per attention call (5 a layer) and runs everything between on one
 * thread while the other waits, so each layer hands data between the threads about ten times. On this 2-core VM
 * an empty 2-thread region costs 0.58 us, and 1.16 us (a cache line's round trip 326 ns against 71) in the minutes
 * when its two vCPUs sit on two CCDs of the host (perf/README). Here a layer costs 5 barriers and each thread's
 * share of the serial work is the whole of it, done at the same time as the other's. Whole decode steps of `small`,
 * two builds alternating (perf/ab_steps.py --slices, 2026-11-27): INT4-AWQ at 1 / 2 / 8 / 16 sequences -13 / -19 /
 * -12 / -4 % in the fast state, 2 / 4 / 8 / 16 -5 / -10 / -4 / -5 % in the slow one; W4A8 at 1 / 4 -11 / -17 % (fast);
 * fp8 at 1 / 4 / 8 -7 / -3 / -3 % (fast), 16 unchanged; bf16 at 1 / 8 / 16 -5 / -4 / -4 % (4 +4 %); INT8-SQ at 1 / 4 / 8
 * -2 / -2 / -4 % (slow), 16 +3 %: from 8 rows the norms and SwiGLU, done by both threads on every row, cost about
 * what the forks saved. So from ROW_SPLIT_MIN sequences (2026-11-27 evening) each thread does only its share of the
 * rows' norms, SwiGLU and the GEMMs' activation rounding, on shared buffers, and the team meets once more before each
 * GEMM: INT4-AWQ at 3 / 4 / 8 / 16 sequences -3 / -4 / -6 / -5 %, W4A8 at 4 / 8 / 16 -6 / -8 / -7 %, INT8-SQ -3 / -1 / -5
 * %, fp8 at 8 / 16 -2 / -4 % (slow memory state, the two ways alternating in one process); at 1-2 sequences 1-2 %
 * slower, and bf16 (no activation rounding to share) within noise, so neither splits. The same bits as
 * decode_layers (the same kernels on the same data; tests/test_model_runner.py holds the one-call step to the
 * Python-driven kernels, split and not). */
static int decode_layers_team(const model_t *m, void *h, void *x, int64_t batch, const int64_t *positions,
                              const int64_t *slots, const int64_t *block_tables, const int64_t *context_lens,
                              int max_blocks) {
    const int act = m->act_kind, hd = m->head_dim, q = m->heads * hd, kv = m->kv_heads * hd, qkv_n = q + 2 * kv;
    /* the widest GEMM input (q's width is o's) */
    const int group = m->heads / m->kv_heads, wider = m->inter > m->hidden ? m->inter : m->hidden;
    const int widest = wider > q ? wider : q;
    const size_t es = act_bytes(act);
    char *qkv = malloc(batch * qkv_n * es), *qbuf = malloc(batch * q * es), *attn = malloc(batch * q * es);
    char *gate_up = malloc(batch * 2 * m->inter * es), *delta = malloc(batch * m->hidden * es);
    /* each thread's own: the residual stream, a GEMM's input, SwiGLU's middle, and the kernels' prepared activations,
     * each on its own cache lines */
    const int threads = omp_get_max_threads();
    const int64_t h_bytes = batch * m->hidden * es, x_bytes = batch * widest * es, mid_bytes = batch * m->inter * es;
    const int64_t own_bytes = (h_bytes + x_bytes + mid_bytes + prepared_bytes(batch, widest) + 4 * 63) / 64 * 64;
    char *own = malloc(threads * own_bytes);
    if (!(qkv && qbuf && attn && gate_up && delta && own)) {
        free(qkv), free(qbuf), free(attn), free(gate_up), free(delta), free(own);
        return -1;
    }
    double *parts = m->part_seconds, mark = parts != NULL ? now_seconds() : 0.0;
    /* From this many sequences each thread does its share of the rows' norms, SwiGLU and activation rounding on shared
     * buffers, with one more barrier before each GEMM, instead of every row on its own copies (not for bf16's GEMMs,
     * which round no activations: there the split saved nothing beyond this VM's noise) */
    const int split = batch >= (m->row_split_min > 0 ? m->row_split_min : ROW_SPLIT_MIN) &&
                      (m->row_split_min > 0 || m->layers[0].qkv.kind != LIN_BF16);
    init_fp8();
    #pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        double *my_parts = t == 0 ? parts : NULL;
        /* rows r0 .. r1 - 1 of the per-row work are this thread's: every row on its own copies, or its share of the
         * rows on shared buffers (thread 0's) from row_split_min sequences */
        int64_t r0 = 0, r1 = batch;
        if (split) team_share(batch, t, T, &r0, &r1);
#define NEXT_LINE(p, bytes) ((char *)(((uintptr_t)(p) + (bytes) + 63) & ~(uintptr_t)63))
        char *hp = NEXT_LINE(own + (split ? 0 : t) * own_bytes, 0), *xp = NEXT_LINE(hp, h_bytes);
        char *mid = NEXT_LINE(xp, x_bytes), *scratch = NEXT_LINE(mid, mid_bytes);
#undef NEXT_LINE
        const int64_t hr = m->hidden * es;  /* bytes of a row of the residual stream */
        memcpy(hp + r0 * hr, (char *)h + r0 * hr, (r1 - r0) * hr);
        for (int64_t b = r0; b < r1; b++) rms_norm_row(hp, m->layers[0].input_norm, xp, b, m->hidden, m->eps, act);
        for (int i = 0; i < m->num_layers; i++) {
            const layer_t *l = &m->layers[i], *then = i + 1 < m->num_layers ? &m->layers[i + 1] : NULL;
            charge(my_parts, PART_REST, &mark);
            team_linear(&l->qkv, xp, r0, r1, batch, qkv, act, t, T, scratch, split, m->stub_gemms);
            #pragma omp barrier
            charge(my_parts, PART_QKV, &mark);
            const attention_work_t w = attention_work(qbuf, l->k_cache, l->v_cache, block_tables, context_lens, attn,
                                                      (int)batch, m->heads, m->kv_heads, hd, max_blocks, m->block_size,
                                                      l->k_scale, l->v_scale, act, m->cache_kind,
                                                      then ? then->k_cache : NULL, then ? then->v_cache : NULL, T);
            for (int item = t; item < batch * w.parts; item += T) {  /* RoPE, KV and q of this thread's items */
                const int b = item / w.parts, kv0 = item % w.parts * w.per_item;
                rope_row(qkv + (int64_t)kv0 * group * hd * es, qkv_n, positions, m->cos, m->sin, b, w.per_item * group,
                         hd, act);
                rope_row(qkv + (q + (int64_t)kv0 * hd) * es, qkv_n, positions, m->cos, m->sin, b, w.per_item, hd, act);
                write_kv_heads(m, l, qkv, b, b + 1, qkv_n, slots, kv0, w.per_item);
                memcpy(qbuf + ((int64_t)b * q + (int64_t)kv0 * group * hd) * es,
                       qkv + ((int64_t)b * qkv_n + (int64_t)kv0 * group * hd) * es, (size_t)w.per_item * group * hd * es);
            }
            charge(my_parts, PART_REST, &mark);
            if (m->stub_gemms) {
                if (t == 0) memset(attn, 0, batch * q * es);
            } else {
                for (int item = t; item < batch * w.parts; item += T) attention_item(&w, item);
            }
            #pragma omp barrier
            charge(my_parts, PART_ATTENTION, &mark);
            memcpy(xp + r0 * q * es, attn + r0 * q * es, (r1 - r0) * q * es);
            team_linear(&l->o, xp, r0, r1, batch, delta, act, t, T, scratch, split, m->stub_gemms);
            #pragma omp barrier
            charge(my_parts, PART_O, &mark);
            for (int64_t b = r0; b < r1; b++) add_rms_norm_row(hp, delta, l->post_norm, xp, b, m->hidden, m->eps, act);
            charge(my_parts, PART_REST, &mark);
            team_linear(&l->gate_up, xp, r0, r1, batch, gate_up, act, t, T, scratch, split, m->stub_gemms);
            #pragma omp barrier
            charge(my_parts, PART_GATE_UP, &mark);
            for (int64_t b = r0; b < r1; b++) silu_mul_row(gate_up, mid, b, m->inter, act, NULL);
            charge(my_parts, PART_REST, &mark);
            team_linear(&l->down, mid, r0, r1, batch, delta, act, t, T, scratch, split, m->stub_gemms);
            #pragma omp barrier
            charge(my_parts, PART_DOWN, &mark);
            for (int64_t b = r0; b < r1; b++)
                add_rms_norm_row(hp, delta, then != NULL ? then->input_norm : m->final_norm, xp, b, m->hidden, m->eps,
                                 act);
        }
        charge(my_parts, PART_REST, &mark);
        if (split || t == 0) {  /* each thread its rows of the shared buffers, or thread 0 its copies' every row */
            memcpy((char *)h + r0 * hr, hp + r0 * hr, (r1 - r0) * hr);
            memcpy((char *)x + r0 * hr, xp + r0 * hr, (r1 - r0) * hr);
        }
    }
    free(qkv), free(qbuf), free(attn), free(gate_up), free(delta), free(own);
    return 0;
}

/* Benchmarks only (toolkit/plan/cpu_probe.py): seconds for `calls` rounds of `count` linears one after another on
 * x [M, k] (every linear's k the same) into y [M, widest n], as a decode step runs its GEMMs. Where decode_layers would
 * run them in one OpenMP region (every linear a team_kind, bf16 activations, a team), as decode_layers_team does: each
 * thread its share of each linear (team_linear) on its own copy of x, a barrier after each. Else as decode_layers
 * does: run_linear on each in turn (each kernel its own team), on a fresh copy of x. Why not from Python: the same
 * kernels called one by one from there (a team per call, its Python cost taken out) read int4's weights at 2 rows at
 * 0.54-0.81 of a sum's rate, where the step's GEMMs read them at 0.98-1.1 of it (2026-11-27); INT8-SQ's on AMX tiles at
 * 1 row 1.5x a sum's rate where the step read them at 1.85x (2026-11-29). -1 where a linear's kind is not compiled into
 * this library, the k differ, the activations are not bf16, or no memory. */
double step_linears_seconds(const linear_t *ls, int count, const void *x, int64_t M, void *y, int act, int calls) {
    if (act != BF16 || count < 1) return -1.0;
    int in_team = omp_get_max_threads() >= 2;
    for (int j = 0; j < count; j++) {
        if (!decode_kind_supported(ls[j].kind) || ls[j].k != ls[0].k) return -1.0;
        in_team = in_team && team_kind(&ls[j]);
    }
    const int64_t K = ls[0].k;
    const int64_t es = act_bytes(act), threads = in_team ? omp_get_max_threads() : 1;
    const int64_t x_bytes = (M * K * es + 63) / 64 * 64;
    const int64_t own_bytes = x_bytes + (in_team ? (prepared_bytes(M, K) + 63) / 64 * 64 : 0);
    char *own = aligned_alloc(64, threads * own_bytes);
    if (own == NULL) return -1.0;
    init_fp8();
    const double start = now_seconds();
    if (in_team) {
        #pragma omp parallel num_threads(threads)
        {
            const int t = omp_get_thread_num(), T = omp_get_num_threads();
            char *xp = own + t * own_bytes, *scratch = xp + x_bytes;
            for (int c = 0; c < calls; c++) {
                for (int j = 0; j < count; j++) {
                    memcpy(xp, x, M * K * es);  /* as a step's threads take a fresh input per GEMM */
                    team_linear(&ls[j], xp, 0, M, M, y, act, t, T, scratch, 0, 0);
                    #pragma omp barrier
                }
            }
        }
    } else {
        for (int c = 0; c < calls; c++)
            for (int j = 0; j < count; j++) {
                memcpy(own, x, M * K * es);  /* run_linear may smooth or round its input in place */
                run_linear(&ls[j], own, M, y, act, 0);
            }
    }
    const double seconds = now_seconds() - start;
    free(own);
    return seconds;
}

/* 1 where decode_layers runs `m` in one OpenMP region (decode_layers_team), else 0. */
int decode_in_one_region(const model_t *m) {
    return team_supported(m);
}

/* Every decoder layer for `batch` sequences decoding one token each. h [batch, hidden]: the embedded
 * tokens, updated in place to the last residual stream; x [batch, hidden]: receives the final-normed
 * hidden states (lm_head's input). positions, slots [batch]; block_tables [batch, max_blocks];
 * context_lens [batch] (after this step's write). Returns 0, or -1 (having written nothing) if a linear's
 * kind is not compiled into this library or memory ran out. */
int decode_layers(const model_t *m, void *h, void *x, int64_t batch, const int64_t *positions, const int64_t *slots,
                  const int64_t *block_tables, const int64_t *context_lens, int max_blocks) {
    const int act = m->act_kind, hd = m->head_dim, q = m->heads * hd, kv = m->kv_heads * hd;
    const int qkv_n = q + 2 * kv;
    const size_t es = act_bytes(act);
    if (team_supported(m))
        return decode_layers_team(m, h, x, batch, positions, slots, block_tables, context_lens, max_blocks);
    char *qkv = malloc(batch * qkv_n * es), *qbuf = malloc(batch * q * es), *attn = malloc(batch * q * es);
    char *gate_up = malloc(batch * 2 * m->inter * es), *mid = malloc(batch * m->inter * es);
    char *delta = malloc(batch * m->hidden * es);
    int ok = qkv && qbuf && attn && gate_up && mid && delta;
    for (int i = 0; ok && i < m->num_layers; i++) {
        const layer_t *l = &m->layers[i];
        ok = decode_kind_supported(l->qkv.kind) && decode_kind_supported(l->o.kind) &&
             decode_kind_supported(l->gate_up.kind) && decode_kind_supported(l->down.kind);
    }
    double *parts = m->part_seconds, mark = parts != NULL ? now_seconds() : 0.0;
    if (ok) rms_norm(h, m->layers[0].input_norm, x, batch, m->hidden, m->eps, act);
    for (int i = 0; ok && i < m->num_layers; i++) {
        const layer_t *l = &m->layers[i], *then = i + 1 < m->num_layers ? &m->layers[i + 1] : NULL;
        charge(parts, PART_REST, &mark);
        run_linear(&l->qkv, x, batch, qkv, act, m->stub_gemms);
        charge(parts, PART_QKV, &mark);
        rope(qkv, qkv_n, positions, m->cos, m->sin, batch, m->heads, hd, act);
        rope(qkv + q * es, qkv_n, positions, m->cos, m->sin, batch, m->kv_heads, hd, act);
        write_kv(m, l, qkv, batch, qkv_n, slots);
        for (int64_t b = 0; b < batch; b++) memcpy(qbuf + b * q * es, qkv + b * qkv_n * es, q * es);
        charge(parts, PART_REST, &mark);
        if (m->stub_gemms) memset(attn, 0, batch * q * es);
        else
            /* each thread's first rows of the next layer fetched during its last item here (next_item_t), to come
             * from L3 rather than memory after the GEMMs between: INT4-AWQ attention in the step at 2 / 4 / 8
             * sequences -30..-36 / -20 / -5 %, bf16 (4x the weights streaming between) -4 / -15 % at 2 / 4; at 1
             * and 16 unchanged (2026-11-27, Zen 4, two builds alternating) */
            attention_then(qbuf, l->k_cache, l->v_cache, block_tables, context_lens, attn, (int)batch, m->heads,
                           m->kv_heads, hd, max_blocks, m->block_size, l->k_scale, l->v_scale, act, m->cache_kind,
                           then ? then->k_cache : NULL, then ? then->v_cache : NULL);
        charge(parts, PART_ATTENTION, &mark);
        run_linear(&l->o, attn, batch, delta, act, m->stub_gemms);
        charge(parts, PART_O, &mark);
        add_rms_norm(h, delta, l->post_norm, x, batch, m->hidden, m->eps, act);
        charge(parts, PART_REST, &mark);
        run_linear(&l->gate_up, x, batch, gate_up, act, m->stub_gemms);
        charge(parts, PART_GATE_UP, &mark);
        silu_mul(gate_up, mid, batch, m->inter, act);
        charge(parts, PART_REST, &mark);
        run_linear(&l->down, mid, batch, delta, act, m->stub_gemms);
        charge(parts, PART_DOWN, &mark);
        add_rms_norm(h, delta, i + 1 < m->num_layers ? m->layers[i + 1].input_norm : m->final_norm, x, batch,
                     m->hidden, m->eps, act);
    }
    charge(parts, PART_REST, &mark);
    free(qkv), free(qbuf), free(attn), free(gate_up), free(mid), free(delta);
    return ok ? 0 : -1;
}

/* A whole decode-only step: each sequence's token embedded, every decoder layer (decode_layers), then lm_head on
 * the final-normed rows `logits_rows` [n_logits] into fp32 logits [n_logits, vocab] (lm_head's activation-dtype
 * output widened, as the runner's `.float()`). Why here and not in Python: after the layers have streamed the
 * weights through the caches, each torch op on the way out (the row gather, lm_head's call, the widening) missed
 * them too, ~0.1-0.2 ms a step in all: 5-8 % of an int4 step at one sequence (2026-11-26).
 * Returns 0; -1 as decode_layers; -2 (nothing written) for a token id outside the vocabulary or a logits row outside
 * the batch. */
int decode_step(const model_t *m, const int64_t *token_ids, int64_t batch, const int64_t *positions,
                const int64_t *slots, const int64_t *block_tables, const int64_t *context_lens, int max_blocks,
                const int64_t *logits_rows, int64_t n_logits, float *logits) {
    if (!decode_kind_supported(m->lm_head.kind)) return -1;
    for (int64_t b = 0; b < batch; b++)
        if (token_ids[b] < 0 || token_ids[b] >= m->embed_rows) return -2;
    for (int64_t i = 0; i < n_logits; i++)
        if (logits_rows[i] < 0 || logits_rows[i] >= batch) return -2;
    const size_t es = act_bytes(m->act_kind), row = (size_t)m->hidden * es;
    char *h = malloc(batch * row), *x = malloc(batch * row), *rows = malloc(n_logits * row);
    void *out = malloc((size_t)n_logits * m->vocab * es);
    int rc = h && x && rows && out ? 0 : -1;
    if (rc == 0) {
        for (int64_t b = 0; b < batch; b++) memcpy(h + b * row, (const char *)m->embed + token_ids[b] * row, row);
        rc = decode_layers(m, h, x, batch, positions, slots, block_tables, context_lens, max_blocks);
    }
    if (rc == 0) {
        double mark = m->part_seconds != NULL ? now_seconds() : 0.0;
        for (int64_t i = 0; i < n_logits; i++) memcpy(rows + i * row, x + logits_rows[i] * row, row);
        run_linear(&m->lm_head, rows, n_logits, out, m->act_kind, m->stub_gemms);
        for (int64_t i = 0; i < n_logits; i++) load_row(logits + i * m->vocab, out, i * m->vocab, m->vocab, m->act_kind, 1.0f);
        charge(m->part_seconds, PART_LM_HEAD, &mark);
    }
    free(h), free(x), free(rows), free(out);
    return rc;
}
