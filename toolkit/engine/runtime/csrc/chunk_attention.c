/* Causal attention of prompt chunks (compiled after decode_kernels.c, in the same unit, whose helpers it uses).
 *
 * Why not the decode kernel row by row: a chunk of R prompt rows of one sequence reads the same K / V rows R times
 * over, and the decode kernel's dot products leave each score in 16 lanes to be summed across them (one query
 * against a context): a 128-token prompt of `small` ran its attention at ~110 GFLOP/s that way, a sixth of its
 * TTFT on the AMX Xeon (2026-11-29). Here a work item takes one sequence's kv head and up to CHUNK_LANES of its
 * query heads (rows x the kv head's group) in the lanes of 1-3 vectors: each K or V element is broadcast once to
 * all of them (AVX512-BF16 dot products, two dims or two tokens a pair), no sums across lanes, the softmax down
 * the lanes. Its numerics are the bf16 decode path's (bf16 q and K, fp32 scores, numerators rounded to bf16 and
 * summed as rounded, fp32 sums of P V), in another summation order: not bit for bit the row kernel's.
 *
 * Layout per item, L = 16 x vectors lanes, lane l = row l / group, query head l % group of the kv head:
 *   qt     [head_dim / 2][L]       q's dim pairs, transposed (0 past the item's heads)
 *   scores [tokens][L]             fp32, -inf past each lane's row position (causal)
 *   probs  [tokens / 2][L]         bf16 numerator pairs (t, t + 1) per lane
 *   vpairs [tokens / 2][head_dim]  V's rows t, t + 1 interleaved per dim
 * and for an 8-bit cache, K and V widened to bf16 (exact: fp8 e4m3 and int8 fit bf16's 8 significant bits), the
 * cache's scale on the scores and the output.
 */
#if defined(__AVX512BF16__)
#define HAVE_CHUNK_ATTENTION 1
enum { CHUNK_LANES = 48 };  /* three vectors: q pairs 3, scores 4 tokens x 3, P V 8 dims x 3 accumulators */

typedef struct {
    const uint16_t *q;
    const void *k_cache, *v_cache;
    const int64_t *tables, *chunks;  /* chunks [seqs][3]: first row in q, rows, context after the chunk */
    uint16_t *out;
    int heads, kv_heads, head_dim, max_blocks, block_size, cache_kind, rows_per_item, amx;
    float k_scale, v_scale;
} chunk_work_t;

/* One sequence's kv head, as every item over it reads it: a bf16 row per token (the cache's own rows, or for an
 * 8-bit cache widened copies), V's rows in pairs (vpairs [tokens / 2][head_dim], rows t and t + 1 interleaved per
 * dim, zeros past the context up to a multiple of 32 tokens) and, for AMX, K's dim pairs transposed (kt
 * [head_dim / 2][tokens rounded up to 16], zeros past the context). Built once per (sequence, kv head). */
typedef struct {
    const uint16_t **krow;
    uint32_t *vpairs, *kt;
    int64_t kt_stride;  /* kt's row: the context rounded up to 16 tokens */
    void *heap;
} chunk_context_t;

static void context_bf16_rows(const void *cache, const int64_t *rows, int64_t tokens, int head_dim, int kind,
                              uint16_t *copies, const uint16_t **row) {
    if (kind == BF16) {
        for (int64_t t = 0; t < tokens; t++) row[t] = (const uint16_t *)cache + rows[t];
        return;
    }
    float wide[head_dim];
    for (int64_t t = 0; t < tokens; t++) {
        load_row(wide, cache, rows[t], head_dim, kind, 1.0f);
        store_row(copies, t * head_dim, wide, head_dim, BF16);
        row[t] = copies + t * head_dim;
    }
}

/* V's rows t, t + 1 interleaved per dim: vpairs [pairs][head_dim], zero rows past the context */
static void chunk_vpairs(const uint16_t *const *vrow, int64_t tokens, int64_t pairs, int head_dim, uint32_t *vpairs) {
    static const int first_half[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
    static const int second_half[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
    const __m512i first = _mm512_loadu_si512((const void *)first_half), second = _mm512_loadu_si512((const void *)second_half);
    for (int64_t t = 0; t < 2 * pairs; t += 2)
        for (int d = 0; d < head_dim; d += 32) {
            const __m512i a = t < tokens ? _mm512_loadu_si512((const void *)(vrow[t] + d)) : _mm512_setzero_si512();
            const __m512i b = t + 1 < tokens ? _mm512_loadu_si512((const void *)(vrow[t + 1] + d)) : _mm512_setzero_si512();
            const __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
            uint32_t *to = vpairs + (t / 2) * head_dim + d;
            _mm512_storeu_si512((void *)to, _mm512_permutex2var_epi32(lo, first, hi));
            _mm512_storeu_si512((void *)(to + 16), _mm512_permutex2var_epi32(lo, second, hi));
        }
}

/* r[16] rows of 16 dwords -> their transpose, in place */
static inline void transpose16_epi32(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {  /* per 128-bit lane: [a0 b0 a1 b1], [a2 b2 a3 b3] */
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {  /* u[4i + c], lane L: column 4L + c of rows 4i .. 4i + 3 */
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int c = 0; c < 4; c++) {  /* column 4L + c: lane L of u[c], u[4 + c], u[8 + c], u[12 + c] */
        const __m512i a0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), a1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
        const __m512i b0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88), b1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
        r[c] = _mm512_shuffle_i32x4(a0, b0, 0x88);
        r[8 + c] = _mm512_shuffle_i32x4(a0, b0, 0xdd);
        r[4 + c] = _mm512_shuffle_i32x4(a1, b1, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(a1, b1, 0xdd);
    }
}

/* kt [head_dim / 2][t16]: token t's dim pair p at kt[p * t16 + t], zeros past the context */
static void chunk_kt(const uint16_t *const *krow, int64_t tokens, int64_t t16, int head_dim, uint32_t *kt) {
    for (int64_t t0 = 0; t0 < t16; t0 += 16)
        for (int p0 = 0; p0 < head_dim / 2; p0 += 16) {
            __m512i r[16];
            for (int j = 0; j < 16; j++)
                r[j] = t0 + j < tokens ? _mm512_loadu_si512((const void *)(krow[t0 + j] + 2 * p0)) : _mm512_setzero_si512();
            transpose16_epi32(r);
            for (int p = 0; p < 16; p++) _mm512_storeu_si512((void *)(kt + (p0 + p) * t16 + t0), r[p]);
        }
}

static chunk_context_t chunk_context(const chunk_work_t *w, int s, int kvh) {
    const int64_t ctx = w->chunks[3 * s + 2], padded = (ctx + 15) & ~(int64_t)15, pairs = ((ctx + 31) & ~(int64_t)31) / 2;
    const int head_dim = w->head_dim, kind = w->cache_kind;
    const size_t copies = kind == BF16 ? 0 : (size_t)2 * ctx * head_dim;
    const size_t bytes = (size_t)padded * 8 + (size_t)2 * ctx * sizeof(void *) + copies * 2 +
                         (size_t)pairs * head_dim * 4 + (w->amx ? (size_t)padded * head_dim * 2 : 0);
    chunk_context_t c;
    char *at = c.heap = malloc(bytes);
#define TAKE(type, n) (type *)(at += (size_t)(n) * sizeof(type), at - (size_t)(n) * sizeof(type))
    int64_t *rows = TAKE(int64_t, padded);
    c.krow = TAKE(const uint16_t *, ctx);
    const uint16_t **vrow = TAKE(const uint16_t *, ctx);
    uint16_t *kcopy = TAKE(uint16_t, copies / 2), *vcopy = TAKE(uint16_t, copies / 2);
    c.vpairs = TAKE(uint32_t, pairs * head_dim);
    c.kt = w->amx ? TAKE(uint32_t, padded * head_dim / 2) : NULL;
    c.kt_stride = padded;
#undef TAKE
    context_rows(rows, w->tables + (int64_t)s * w->max_blocks, ctx, w->block_size, w->kv_heads, kvh, head_dim);
    context_bf16_rows(w->k_cache, rows, ctx, head_dim, kind, kcopy, c.krow);
    context_bf16_rows(w->v_cache, rows, ctx, head_dim, kind, vcopy, vrow);
    chunk_vpairs(vrow, ctx, pairs, head_dim, c.vpairs);
    if (w->amx) chunk_kt(c.krow, ctx, padded, head_dim, c.kt);
    return c;
}

/* scores [tokens][L] = q . K over dim pairs, times `scale`, -inf where token t > lane l's position limit[l];
 * returns the lanes' maxima in mx */
INLINE void chunk_scores(const int NV, const uint32_t *qt, const uint16_t *const *krow, int64_t tokens, int head_dim,
                         __m512 scale, const __m512i *limit, float *scores, __m512 *mx) {
    const int L = 16 * NV;
    for (int v = 0; v < NV; v++) mx[v] = _mm512_set1_ps(-INFINITY);
    for (int64_t t0 = 0; t0 < tokens; t0 += 4) {
        const int n = tokens - t0 < 4 ? (int)(tokens - t0) : 4;
        const uint32_t *k[4];
        for (int j = 0; j < 4; j++) k[j] = (const uint32_t *)krow[t0 + (j < n ? j : 0)];
        __m512 acc[4][3];
        for (int j = 0; j < 4; j++)
            for (int v = 0; v < NV; v++) acc[j][v] = _mm512_setzero_ps();
        for (int p = 0; p < head_dim / 2; p++) {
            __m512bh qv[3];
            for (int v = 0; v < NV; v++) qv[v] = (__m512bh)_mm512_loadu_si512((const void *)(qt + p * L + 16 * v));
            for (int j = 0; j < 4; j++) {
                const __m512bh kb = (__m512bh)_mm512_set1_epi32((int)k[j][p]);
                for (int v = 0; v < NV; v++) acc[j][v] = _mm512_dpbf16_ps(acc[j][v], qv[v], kb);
            }
        }
        for (int j = 0; j < n; j++)
            for (int v = 0; v < NV; v++) {
                const __mmask16 seen = _mm512_cmp_epi32_mask(_mm512_set1_epi32((int)(t0 + j)), limit[v], _MM_CMPINT_LE);
                const __m512 s = _mm512_mask_mul_ps(_mm512_set1_ps(-INFINITY), seen, acc[j][v], scale);
                _mm512_storeu_ps(scores + (t0 + j) * L + 16 * v, s);
                mx[v] = _mm512_max_ps(mx[v], s);
            }
    }
}

/* probs' numerator pairs from scores (exact zeros where masked), rounded to bf16; returns 1 / their sums */
INLINE void chunk_softmax(const int NV, const float *scores, int64_t tokens, const __m512 *mx, uint32_t *probs,
                          __m512 *inv) {
    const int L = 16 * NV;
    static const short interleave[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                         8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i order = _mm512_loadu_si512((const void *)interleave);
    for (int v = 0; v < NV; v++) {
        __m512 sum = _mm512_setzero_ps();
        for (int64_t t = 0; t < tokens; t += 2) {
            __m512 e[2];
            for (int j = 0; j < 2; j++) {
                if (t + j >= tokens) { e[j] = _mm512_setzero_ps(); continue; }
                const __m512 s = _mm512_loadu_ps(scores + (t + j) * L + 16 * v);
                const __mmask16 live = _mm512_cmp_ps_mask(s, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
                e[j] = _mm512_maskz_mov_ps(live, exp512(_mm512_sub_ps(s, mx[v])));
            }
            const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(e[1], e[0]);  /* e[0]'s 16 bf16, then e[1]'s */
            /* the sum of what was stored */
            sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(
                                         _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(both, 0)), 16)));
            sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(
                                         _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(both, 1)), 16)));
            _mm512_storeu_si512((void *)(probs + (t / 2) * L + 16 * v), _mm512_permutexvar_epi16(order, both));
        }
        inv[v] = _mm512_div_ps(_mm512_set1_ps(1.0f), sum);
    }
}

/* out_t [head_dim][L] = (P V) times inv, dims 8 at a time over every token pair */
INLINE void chunk_weigh(const int NV, const uint32_t *probs, const uint32_t *vpairs, int64_t pairs, int head_dim,
                        const __m512 *inv, float *out_t) {
    const int L = 16 * NV;
    for (int d0 = 0; d0 < head_dim; d0 += 8) {
        __m512 acc[8][3];
        for (int i = 0; i < 8; i++)
            for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();
        for (int64_t tp = 0; tp < pairs; tp++) {
            __m512bh pv[3];
            for (int v = 0; v < NV; v++) pv[v] = (__m512bh)_mm512_loadu_si512((const void *)(probs + tp * L + 16 * v));
            const uint32_t *vp = vpairs + tp * head_dim + d0;
            for (int i = 0; i < 8; i++) {
                const __m512bh vb = (__m512bh)_mm512_set1_epi32((int)vp[i]);
                for (int v = 0; v < NV; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], pv[v], vb);
            }
        }
        for (int i = 0; i < 8; i++)
            for (int v = 0; v < NV; v++) _mm512_storeu_ps(out_t + (d0 + i) * L + 16 * v, _mm512_mul_ps(acc[i][v], inv[v]));
    }
}

/* lanes 0 .. n - 1 of 16 (all for n >= 16) */
static inline __mmask16 first_of_16(int64_t n) { return n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1u); }

/* Element offset in q and out of lane l of a work item over rows r0 .. of sequence s's chunk (first row first_row),
 * kv head kvh: row r0 + l / group, that kv head's query head l % group. */
static inline int64_t lane_at(const chunk_work_t *w, int64_t first_row, int64_t r0, int kvh, int group, int l) {
    return ((first_row + r0 + l / group) * w->heads + (int64_t)kvh * group + l % group) * w->head_dim;
}

#if defined(HAVE_AMX)
/* chunk_item's work on AMX tiles, heads down the tiles' rows: scores [L][t16] = Q K^T (A: q rows, B: kt), each
 * row's softmax over its own visible tokens (softmax_numerators' work with the scale folded into its exponent: bf16
 * numerators in place, zeros after them up to a multiple of 32 tokens), out [L][head_dim] = P V (A: the numerators,
 * B: vpairs); inv [L]: 1 / each row's sum, times vs. Tiles 0-3 sums, 4 and 6 A, 5 B. */
static void chunk_item_amx(const chunk_work_t *w, const chunk_context_t *c, int64_t pos0, int64_t tokens, int lanes,
                           int group, __m512 scale, float vs, const uint16_t *qc, float *scores, float *out_h,
                           float *inv) {
    const int head_dim = w->head_dim, NV = (lanes + 15) / 16;
    const int64_t t16 = (tokens + 15) & ~(int64_t)15, t32 = (tokens + 31) & ~(int64_t)31, kt_stride = c->kt_stride;
    int configured = -1;
    amx_configure(16, &configured);
    /* a K tile loaded once for the item's 1-3 row tiles of heads, whose sums are independent chains (one chain of
     * dot products waited on each one's latency: the score pass ran at half the rate) */
    for (int64_t j = 0; j < t16; j += 16) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        for (int k = 0; k < head_dim / 32; k++) {
            _tile_loadd(5, c->kt + (int64_t)16 * k * kt_stride + j, kt_stride * 4);
#define QK(M, A) _tile_loadd(A, qc + (int64_t)16 * M * head_dim + 32 * k, head_dim * 2); _tile_dpbf16ps(M, A, 5);
            QK(0, 4)
            if (NV > 1) { QK(1, 6) }
            if (NV > 2) { QK(2, 4) }
#undef QK
        }
        _tile_stored(0, scores + j, t16 * 4);
        if (NV > 1) _tile_stored(1, scores + (int64_t)16 * t16 + j, t16 * 4);
        if (NV > 2) _tile_stored(2, scores + (int64_t)32 * t16 + j, t16 * 4);
    }
    /* each row's softmax over the tokens it sees: numerators e^(scale * (s - max)) rounded to bf16 in place (as
     * softmax_numerators stores them), zeros after them up to t32 (the P V pass's last tile of tokens) */
    for (int l = 0; l < 16 * NV; l++) {
        float *row = scores + (int64_t)l * t16;
        const int64_t seen = l < lanes ? pos0 + l / group + 1 : 1;  /* a padding lane: its first token, ignored */
        __m512 mx = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
        for (int64_t t = 0; t < seen; t += 16)
            mx = _mm512_mask_max_ps(mx, first_of_16(seen - t), mx, _mm512_loadu_ps(row + t));
        const __m512 top = _mm512_mul_ps(_mm512_set1_ps(_mm512_reduce_max_ps(mx)), scale);
        for (int64_t t = 0; t < seen; t += 16) {
            const __mmask16 live = first_of_16(seen - t);
            const __m512 e = _mm512_maskz_mov_ps(live, exp512(_mm512_fmsub_ps(_mm512_loadu_ps(row + t), scale, top)));
            sum = _mm512_add_ps(sum, store_numerators(row, t, e, 1));
        }
        inv[l] = vs / _mm512_reduce_add_ps(sum);
        uint16_t *p = (uint16_t *)row;
        for (int64_t t = (seen + 15) & ~(int64_t)15; t < t32; t += 16) _mm256_storeu_si256((__m256i *)(p + t), _mm256_setzero_si256());
    }
    for (int m = 0; m < NV; m++)
        for (int n0 = 0; n0 < head_dim / 16; n0 += 4) {
            const int count = head_dim / 16 - n0 < 4 ? head_dim / 16 - n0 : 4;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t k = 0; k < t32; k += 32) {
                _tile_loadd(4, (const char *)(scores + (int64_t)16 * m * t16) + 2 * k, t16 * 4);
                const uint32_t *b = c->vpairs + (k / 2) * head_dim + 16 * n0;
#define PV(C) _tile_loadd(5, b + 16 * C, head_dim * 4); _tile_dpbf16ps(C, 4, 5);
                PV(0)
                if (count > 1) { PV(1) }
                if (count > 2) { PV(2) }
                if (count > 3) { PV(3) }
#undef PV
            }
            float *o = out_h + (int64_t)16 * m * head_dim + 16 * n0;
            _tile_stored(0, o, head_dim * 4);
            if (count > 1) _tile_stored(1, o + 16, head_dim * 4);
            if (count > 2) _tile_stored(2, o + 32, head_dim * 4);
            if (count > 3) _tile_stored(3, o + 48, head_dim * 4);
        }
}
#endif

/* One work item: sequence s's kv head kvh (its context c), chunk rows r0 .. r0 + rows_per_item (fewer at the chunk's
 * end), as query heads in L lanes: lane l = row l / group, query head l % group of the kv head. */
static void chunk_item(const chunk_work_t *w, const chunk_context_t *c, int s, int kvh, int64_t r0) {
    const int64_t first_row = w->chunks[3 * s], q_len = w->chunks[3 * s + 1], ctx = w->chunks[3 * s + 2];
    const int group = w->heads / w->kv_heads, head_dim = w->head_dim, kind = w->cache_kind;
    const int64_t rows_here = q_len - r0 < w->rows_per_item ? q_len - r0 : w->rows_per_item;
    const int lanes = (int)rows_here * group, NV = (lanes + 15) / 16, L = 16 * NV;
    const int64_t pos0 = ctx - q_len + r0, tokens = pos0 + rows_here;  /* the last row sees tokens 0 .. pos0 + rows - 1 */
    const int64_t pairs = (tokens + 1) / 2, t16 = (tokens + 15) & ~(int64_t)15;
    const size_t bytes = w->amx ? (size_t)L * head_dim * 2 + (size_t)L * t16 * 4 + (size_t)L * head_dim * 4 + (size_t)L * 4
                                : (size_t)tokens * L * 4 + (size_t)pairs * L * 4 + (size_t)head_dim / 2 * L * 4 +
                                      (size_t)head_dim * L * 4;
    char *heap = malloc(bytes), *at = heap;
#define TAKE(type, n) (type *)(at += (size_t)(n) * sizeof(type), at - (size_t)(n) * sizeof(type))
    float o[head_dim];
    const float ks = kind >= I8 ? w->k_scale : 1.0f, vs = kind >= I8 ? w->v_scale : 1.0f;
    const __m512 scale = _mm512_set1_ps(ks / sqrtf((float)head_dim));
#if defined(HAVE_AMX)
    if (w->amx) {
        uint16_t *qc = TAKE(uint16_t, L * head_dim);
        float *scores = TAKE(float, L * t16), *out_h = TAKE(float, L * head_dim), *inv = TAKE(float, L);
        for (int l = 0; l < L; l++) {
            if (l < lanes) memcpy(qc + (int64_t)l * head_dim, w->q + lane_at(w, first_row, r0, kvh, group, l), (size_t)head_dim * 2);
            else memset(qc + (int64_t)l * head_dim, 0, (size_t)head_dim * 2);
        }
        chunk_item_amx(w, c, pos0, tokens, lanes, group, scale, vs, qc, scores, out_h, inv);
        for (int l = 0; l < lanes; l++) {
            for (int d = 0; d < head_dim; d += 16)
                _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(out_h + (int64_t)l * head_dim + d), _mm512_set1_ps(inv[l])));
            store_row(w->out, lane_at(w, first_row, r0, kvh, group, l), o, head_dim, BF16);
        }
        free(heap);
        return;
    }
#endif
    float *scores = TAKE(float, tokens * L), *out_t = TAKE(float, head_dim * L);
    uint32_t *probs = TAKE(uint32_t, pairs * L), *qt = TAKE(uint32_t, head_dim / 2 * L);
#undef TAKE
    /* q's dim pairs per lane, and each lane's last visible token */
    int32_t limits[CHUNK_LANES];
    for (int l = 0; l < L; l++) {
        const uint32_t *src = (const uint32_t *)(w->q + lane_at(w, first_row, r0, kvh, group, l < lanes ? l : 0));
        for (int p = 0; p < head_dim / 2; p++) qt[p * L + l] = l < lanes ? src[p] : 0;
        limits[l] = (int32_t)(l < lanes ? pos0 + l / group : tokens - 1);
    }
    __m512i limit[3];
    __m512 mx[3], inv[3];
    for (int v = 0; v < NV; v++) limit[v] = _mm512_loadu_si512((const void *)(limits + 16 * v));
#define CHUNK(NV_)                                                                         \
    chunk_scores(NV_, qt, c->krow, tokens, head_dim, scale, limit, scores, mx);            \
    chunk_softmax(NV_, scores, tokens, mx, probs, inv);                                    \
    for (int v = 0; v < NV_; v++) inv[v] = _mm512_mul_ps(inv[v], _mm512_set1_ps(vs));      \
    chunk_weigh(NV_, probs, c->vpairs, pairs, head_dim, inv, out_t)
    if (NV == 1) { CHUNK(1); }
    else if (NV == 2) { CHUNK(2); }
    else { CHUNK(3); }
#undef CHUNK
    for (int l = 0; l < lanes; l++) {
        for (int d = 0; d < head_dim; d++) o[d] = out_t[d * L + l];
        store_row(w->out, lane_at(w, first_row, r0, kvh, group, l), o, head_dim, BF16);
    }
    free(heap);
}
#endif

/* Query rows a chunk_attention work item takes for kv heads of `group` query heads, or 0 where this build or these
 * dtypes and shapes take the decode kernel row by row (model_runner asks before planning a step's attention). */
int chunk_attention_rows(int act_kind, int cache_kind, int head_dim, int group) {
#if defined(HAVE_CHUNK_ATTENTION)
    if (act_kind == BF16 && cache_kind != F32 && head_dim % 32 == 0 && head_dim <= 256 && group <= CHUNK_LANES)
        return CHUNK_LANES / group;
#endif
    (void)act_kind, (void)cache_kind, (void)head_dim, (void)group;
    return 0;
}

/* Causal attention of `seqs` chunks of query rows, each row over its sequence's context up to its own position:
 * q, out [rows, heads, head_dim] bf16 (only the chunks' rows written); caches [slots, kv_heads, head_dim];
 * tables [seqs, max_blocks]; chunks [seqs][3]: first row, row count, context length after the chunk (its rows sit
 * at positions context - count .. context - 1). amx: on AMX tiles (the caller has had the tile state granted:
 * amx_enable), else AVX512-BF16. Returns 0, writing nothing, where chunk_attention_rows is 0. */
int chunk_attention(const void *q, const void *k_cache, const void *v_cache, const int64_t *tables,
                    const int64_t *chunks, void *out, int seqs, int heads, int kv_heads, int head_dim, int max_blocks,
                    int block_size, float k_scale, float v_scale, int act_kind, int cache_kind, int amx) {
    const int rows_per_item = chunk_attention_rows(act_kind, cache_kind, head_dim, heads / kv_heads);
    if (rows_per_item == 0) return 0;
#if defined(HAVE_CHUNK_ATTENTION)
    init_fp8();
#if !defined(HAVE_AMX)
    amx = 0;
#endif
    const chunk_work_t w = {.q = q, .k_cache = k_cache, .v_cache = v_cache, .tables = tables, .chunks = chunks,
                            .out = out, .heads = heads, .kv_heads = kv_heads, .head_dim = head_dim,
                            .max_blocks = max_blocks, .block_size = block_size, .cache_kind = cache_kind,
                            .rows_per_item = rows_per_item, .amx = amx != 0, .k_scale = k_scale, .v_scale = v_scale};
    /* items, the latest rows first (they see the most tokens), so that the last ones to run are the shortest */
    int64_t items = 0;
    for (int s = 0; s < seqs; s++) items += (chunks[3 * s + 1] + rows_per_item - 1) / rows_per_item * kv_heads;
    int64_t(*item)[3] = malloc((size_t)(items > 0 ? items : 1) * sizeof *item), n = 0;
    for (int64_t block = 0, more = 1; more; block++) {
        more = 0;
        for (int s = 0; s < seqs; s++) {
            const int64_t blocks = (chunks[3 * s + 1] + rows_per_item - 1) / rows_per_item;
            if (block >= blocks) continue;
            more = 1;
            for (int h = 0; h < kv_heads; h++)
                item[n][0] = s, item[n][1] = h, item[n][2] = (blocks - 1 - block) * rows_per_item, n++;
        }
    }
    chunk_context_t *contexts = malloc((size_t)seqs * kv_heads * sizeof *contexts);
    #pragma omp parallel
    {
        #pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < seqs * kv_heads; i++) contexts[i] = chunk_context(&w, i / kv_heads, i % kv_heads);
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < items; i++) {
            const int s = (int)item[i][0], h = (int)item[i][1];
            chunk_item(&w, &contexts[s * kv_heads + h], s, h, item[i][2]);
        }
    }
    for (int i = 0; i < seqs * kv_heads; i++) free(contexts[i].heap);
    free(contexts);
    free(item);
    return 1;
#else
    (void)q, (void)k_cache, (void)v_cache, (void)tables, (void)chunks, (void)out, (void)seqs, (void)max_blocks;
    (void)block_size, (void)k_scale, (void)v_scale, (void)amx;
    return 0;
#endif
}
