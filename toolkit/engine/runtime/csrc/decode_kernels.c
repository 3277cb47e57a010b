/* Fused CPU kernels for the embedded engine's step, called through ctypes on torch tensors' memory.
 *
 * Why C and not more torch ops: at batch 1 a decode step of the `small` preset does ~40 small torch
 * ops per layer (norms, RoPE, a gathered K/V copy, two tiny batched matmuls and a softmax); each op
 * costs a few microseconds of dispatch and the tiny matmuls run far below the machine's rate, so the
 * non-GEMM part of the step cost more than the weight-bound GEMMs. These kernels do that part in one
 * call each, in fp32 arithmetic, reading K/V straight from the paged cache through the block table.
 *
 * dtype codes (shared with native_kernels.py): 0 float32, 1 bfloat16, 2 int8 (times a scale),
 * 3 float8_e4m3fn (times a scale). Activations are 0 or 1; the KV cache may be any of the four.
 */
#define _GNU_SOURCE /* syscall() (AMX's permission request) under -std=c11 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
/* The bf16 GEMM and the int4 GEMM with bf16 activations: on AVX512-BF16's dot products, or, on a CPU with AVX2 and
 * FMA but not AVX512-BF16 (Zen 2 and 3, Intel's client cores; and any CPU with TOOLKIT_NATIVE_MARCH=x86-64-v3), on
 * the AVX2 kernels below (HAVE_AVX2_GEMMS). */
#if defined(__AVX512BF16__) || (defined(__AVX2__) && defined(__FMA__))
#define HAVE_GEMM_BF16 1
#endif
#if !defined(__AVX512BF16__) && defined(__AVX2__) && defined(__FMA__)
#define HAVE_AVX2_GEMMS 1
#endif

/* The vector extensions this build's kernels use (the engine's description names them: the same engine runs a different
 * set of kernels on a CPU without AVX-512, and a run's figures mean little without it). */
const char *kernels_isa(void) {
    return ""
#if defined(__AVX512F__)
           "AVX-512"
#if defined(__AVX512BF16__)
           " + BF16"
#endif
#if defined(__AVX512VNNI__)
           " + VNNI"
#endif
#if defined(__AMX_TILE__)
           " + AMX"
#endif
#elif defined(__AVX2__) && defined(__FMA__)
           "AVX2 + FMA"
#elif defined(__ARM_NEON)
           "portable C (NEON by the compiler only)"
#else
           "portable C"
#endif
        ;
}

/* The calling thread's OpenMP team of n threads (itself first) bound one to each of cpus, as vLLM's CPU backend binds
 * its threads: with one thread per physical core, two of a step's threads on one core's hyperthreads would share its
 * FMA units and hold every barrier of the step. libgomp keeps a master thread's team between regions (torch's
 * parallel loops on that thread use it too), so the binding holds for the steps that follow. Returns how many threads
 * could not be bound (0: all), -1 off Linux. */
#if defined(__linux__)
#include <sched.h>
#endif
int pin_team(const int32_t *cpus, int n) {
#if defined(__linux__)
    int failed = 0;
#pragma omp parallel num_threads(n) reduction(+ : failed)
    {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpus[omp_get_thread_num()], &set);
        failed += sched_setaffinity(0, sizeof set, &set) != 0;
    }
    return failed;
#else
    (void)cpus;
    (void)n;
    return -1;
#endif
}

enum { F32 = 0, BF16 = 1, I8 = 2, F8E4M3 = 3 };
/* How a linear's activations are rounded before its GEMM, as ModelOpt calibrated them (native_kernels.ACT_QUANT). */
enum { ACT_NONE = 0, ACT_INT8 = 1, ACT_FP8 = 2 };
#define INLINE static inline __attribute__((always_inline))
/* `call` for i = 0 .. n - 1 (an int64_t named by i), over the OpenMP team where n >= from, else on this thread
 * alone. Not an `if` clause: libgomp starts a one-thread team for `if (0)` too, ~0.5 us a loop (2026-11-27, Zen 4:
 * rms_norm of one row 0.75 us that way, 0.25 without), and a batch-1 decode step of `small` ran about ten such
 * per-row loops a layer (norms, RoPE, SwiGLU's middle, the GEMMs' activation rounding). */
#define FOR_ROWS(i, n, from, call)                                                            \
    if ((n) >= (from)) {                                                                      \
        _Pragma("omp parallel for schedule(static)") for (int64_t i = 0; i < (n); i++) call; \
    } else                                                                                    \
        for (int64_t i = 0; i < (n); i++) call
/* CALL(n) with n = 1 .. 8 a constant (8 for anything above): loops over n vectors, in a function inlined
 * with n a constant, keep them in registers. With n a runtime value they lived on the stack (the int4
 * GEMM ran at a third of torch's speed that way). */
#define FOR_1_TO_8(n, CALL) \
    switch (n) {            \
    case 1: CALL(1); break; \
    case 2: CALL(2); break; \
    case 3: CALL(3); break; \
    case 4: CALL(4); break; \
    case 5: CALL(5); break; \
    case 6: CALL(6); break; \
    case 7: CALL(7); break; \
    default: CALL(8); break; \
    }
/* The same for blocks whose accumulators allow fewer rows (n at most 4 or 6). */
#define FOR_1_TO_4(n, CALL) \
    switch (n) {            \
    case 1: CALL(1); break; \
    case 2: CALL(2); break; \
    case 3: CALL(3); break; \
    default: CALL(4); break; \
    }
#define FOR_1_TO_6(n, CALL) \
    switch (n) {            \
    case 1: CALL(1); break; \
    case 2: CALL(2); break; \
    case 3: CALL(3); break; \
    case 4: CALL(4); break; \
    case 5: CALL(5); break; \
    default: CALL(6); break; \
    }

/* Rows per pass where M rows run in passes of at most `most`: split evenly (8 rows as 4 + 4 at most 6, not
 * 6 + 2: a short pass reuses the weights it loaded little). */
static inline int64_t rows_per_pass(int64_t M, int64_t most) {
    const int64_t passes = (M + most - 1) / most;
    return (M + passes - 1) / passes;
}

static float fp8_table[256];
static int fp8_ready = 0;

static void init_fp8(void) {
    if (fp8_ready) return;
    for (int i = 0; i < 256; i++) {
        int sign = i >> 7, exp = (i >> 3) & 15, man = i & 7;
        float v;
        if (exp == 15 && man == 7) v = NAN;
        else if (exp == 0) v = ldexpf((float)man / 8.0f, -6);
        else v = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
        fp8_table[i] = sign ? -v : v;
    }
    fp8_ready = 1;
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);  /* round to nearest even, as torch does */
    return (uint16_t)(u >> 16);
}

#if defined(__AVX2__)
/* 8 bf16 values at s widened exactly to fp32 (a bf16 is the top half of its fp32) */
static inline __m256 bf16x8(const uint16_t *s) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)s)), 16));
}
#endif

/* n values of dtype `kind` at `src` (element offset `at`) into fp32 `dst`, times `scale` for 8-bit kinds. */
static inline void load_row(float *dst, const void *src, int64_t at, int n, int kind, float scale) {
    switch (kind) {
    case F32: memcpy(dst, (const float *)src + at, (size_t)n * 4); break;
    case BF16: {
        const uint16_t *s = (const uint16_t *)src + at;
        int i = 0;
#ifdef __AVX512F__
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                                          _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + i))), 16)));
#elif defined(__AVX2__)
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, bf16x8(s + i));
#endif
        for (; i < n; i++) dst[i] = bf16_to_f32(s[i]);
        break;
    }
    case I8: { const int8_t *s = (const int8_t *)src + at; for (int i = 0; i < n; i++) dst[i] = (float)s[i] * scale; break; }
    default: { const uint8_t *s = (const uint8_t *)src + at; for (int i = 0; i < n; i++) dst[i] = fp8_table[s[i]] * scale; break; }
    }
}

static inline void store_row(void *dst, int64_t at, const float *src, int n, int kind) {
    if (kind == F32) {
        memcpy((float *)dst + at, src, (size_t)n * 4);
        return;
    }
    uint16_t *d = (uint16_t *)dst + at;
    int i = 0;
#ifdef __AVX512BF16__
    for (; i + 16 <= n; i += 16) /* the instruction rounds to nearest even and keeps NaN a NaN, as f32_to_bf16 */
        _mm256_storeu_si256((__m256i *)(d + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
#elif defined(__AVX2__)
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff), magnitude = _mm256_set1_epi32(0x7fffffff),
                  inf = _mm256_set1_epi32(0x7f800000), quiet = _mm256_set1_epi32(0x40);
    for (; i + 8 <= n; i += 8) { /* f32_to_bf16, 8 at a time */
        const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i)), top = _mm256_srli_epi32(u, 16);
        const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(half, _mm256_and_si256(top, one))), 16);
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, magnitude), inf);
        const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(top, quiet), nan);
        _mm_storeu_si128((__m128i *)(d + i), _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8)));
    }
#endif
    for (; i < n; i++) d[i] = f32_to_bf16(src[i]);
}

static inline size_t act_bytes(int kind) { return kind == F32 ? 4 : 2; } /* activations: fp32 or bf16 */
static inline int cache_bytes(int kind) { return kind == F32 ? 4 : kind == BF16 ? 2 : 1; } /* KV cache elements */

/* Rounds v to the activation dtype, as a torch op whose output has that dtype would. */
static inline float round_to(float v, int kind) { return kind == BF16 ? bf16_to_f32(f32_to_bf16(v)) : v; }

#ifdef __AVX512F__
/* round_to for 16 values (finite ones: what activations are) */
static inline __m512 round_to16(__m512 v, int kind) {
    if (kind != BF16) return v;
    __m512i u = _mm512_castps_si512(v); /* round to nearest even at bit 16, as f32_to_bf16 (finite values) */
    __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_add_epi32(u, bias), _mm512_set1_epi32((int)0xffff0000u)));
}
#endif
#if defined(__AVX2__)  /* the AVX2 kernels' (also where AVX-512 lacks what their AVX-512 versions need) */
/* round_to for 8 values (finite ones), as round_to16 */
static inline __m256 round_to8(__m256 v, int kind) {
    if (kind != BF16) return v;
    __m256i u = _mm256_castps_si256(v);
    __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_add_epi32(u, bias), _mm256_set1_epi32((int)0xffff0000u)));
}
#endif

/* The per-token elementwise loops run 16 at a time where they can (a scalar bf16 rounding per element cost
 * ~1 ms of a 16-sequence decode step of `small`): row[i] = round(a[i] + b[i]) if add, else round(a[i] * b[i]). */
static inline void combine_rounded(float *row, const float *a, const float *b, int n, int kind, int add) {
    int i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16) {
        __m512 va = _mm512_loadu_ps(a + i), vb = _mm512_loadu_ps(b + i);
        _mm512_storeu_ps(row + i, round_to16(add ? _mm512_add_ps(va, vb) : _mm512_mul_ps(va, vb), kind));
    }
#elif defined(__AVX2__)
    for (; i + 8 <= n; i += 8) {
        __m256 va = _mm256_loadu_ps(a + i), vb = _mm256_loadu_ps(b + i);
        _mm256_storeu_ps(row + i, round_to8(add ? _mm256_add_ps(va, vb) : _mm256_mul_ps(va, vb), kind));
    }
#endif
    for (; i < n; i++) row[i] = round_to(add ? a[i] + b[i] : a[i] * b[i], kind);
}

static void rms_norm_row(const void *x, const void *w, void *out, int64_t t, int hidden, float eps, int kind) {
    float row[hidden], wf[hidden];
    load_row(row, x, t * hidden, hidden, kind, 1.0f);
    load_row(wf, w, 0, hidden, kind, 1.0f);
    float ss = 0.0f;
    #pragma omp simd reduction(+ : ss)
    for (int i = 0; i < hidden; i++) ss += row[i] * row[i];
    float r = 1.0f / sqrtf(ss / (float)hidden + eps);
    int i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= hidden; i += 16) {
        __m512 normed = round_to16(_mm512_mul_ps(_mm512_loadu_ps(row + i), _mm512_set1_ps(r)), kind);
        _mm512_storeu_ps(row + i, round_to16(_mm512_mul_ps(_mm512_loadu_ps(wf + i), normed), kind));
    }
#elif defined(__AVX2__)
    for (; i + 8 <= hidden; i += 8) {
        __m256 normed = round_to8(_mm256_mul_ps(_mm256_loadu_ps(row + i), _mm256_set1_ps(r)), kind);
        _mm256_storeu_ps(row + i, round_to8(_mm256_mul_ps(_mm256_loadu_ps(wf + i), normed), kind));
    }
#endif
    for (; i < hidden; i++) row[i] = round_to(wf[i] * round_to(row[i] * r, kind), kind);
    store_row(out, t * hidden, row, hidden, kind);
}

/* out[t] = w * to_dtype(x[t] * rsqrt(mean(x[t]^2) + eps)), as HF Llama's RMSNorm rounds. */
void rms_norm(const void *x, const void *w, void *out, int64_t tokens, int hidden, float eps, int kind) {
    FOR_ROWS(t, tokens, 5, rms_norm_row(x, w, out, t, hidden, eps, kind));
}

static void add_rms_norm_row(void *h, const void *delta, const void *w, void *out, int64_t t, int hidden, float eps,
                             int kind) {
    float row[hidden], d[hidden];
    load_row(row, h, t * hidden, hidden, kind, 1.0f);
    load_row(d, delta, t * hidden, hidden, kind, 1.0f);
    combine_rounded(row, row, d, hidden, kind, 1);
    store_row(h, t * hidden, row, hidden, kind);
    rms_norm_row(h, w, out, t, hidden, eps, kind);
}

/* The residual add and the next RMSNorm in one pass: h[t] = to_dtype(h[t] + delta[t]) in place (as
 * `h = h + delta` rounds), then out[t] = rms_norm(h[t]). */
void add_rms_norm(void *h, const void *delta, const void *w, void *out, int64_t tokens, int hidden, float eps,
                  int kind) {
    FOR_ROWS(t, tokens, 5, add_rms_norm_row(h, delta, w, out, t, hidden, eps, kind));
}

static void rope_row(void *x, int64_t row_stride, const int64_t *positions, const void *cos_t, const void *sin_t,
                     int64_t t, int heads, int head_dim, int kind) {
    const int half = head_dim / 2;
    float c[head_dim], s[head_dim], row[head_dim], outr[head_dim];
    load_row(c, cos_t, positions[t] * head_dim, head_dim, kind, 1.0f);
    load_row(s, sin_t, positions[t] * head_dim, head_dim, kind, 1.0f);
    for (int h = 0; h < heads; h++) {
        int64_t at = t * row_stride + (int64_t)h * head_dim;
        load_row(row, x, at, head_dim, kind, 1.0f);
        for (int i = 0; i < half; i++) {
            outr[i] = row[i] * c[i] - row[i + half] * s[i];
            outr[i + half] = row[i + half] * c[i + half] + row[i] * s[i + half];
        }
        store_row(x, at, outr, head_dim, kind);
    }
}

/* In place on x, `heads` heads of head_dim per token, token t's first head at t * row_stride (so the q or
 * k part of a fused qkv row can be rotated where it lies): non-interleaved RoPE (HF Llama's rotate_half)
 * at positions[t], cos/sin tables [max_pos, head_dim] in the activation dtype. */
void rope(void *x, int64_t row_stride, const int64_t *positions, const void *cos_t, const void *sin_t,
          int64_t tokens, int heads, int head_dim, int kind) {
    FOR_ROWS(t, tokens, 5, rope_row(x, row_stride, positions, cos_t, sin_t, t, heads, head_dim, kind));
}

/* ---- paged decode attention ----------------------------------------------------------------------
 * One query token per row, over its own context (a decode step's sequences, or each row of a prefill chunk over
 * the prefix up to it). A work item is one row and one kv head together with the `group`
 * query heads that read it (HF's repeat_kv): each K and V row is read from the cache (and widened to
 * fp32) once for the whole group, where a work item per query head re-read and re-widened it `group`
 * times. */

/* The cache lines of the next work item a thread will take, fetched into L2 a few at a time while it computes the
 * current one (next_item_lines, fetch_some). From memory the kernel took about its in-cache time plus the time of a
 * plain read of its rows: the loads did not overlap its arithmetic, and prefetching an item's rows in one burst
 * before computing it did not help either (the burst waits on the same misses). Spread over the current item's
 * tiles, the next item's rows arrive while it computes. Attention timed in place in decode steps of `small`, two
 * builds alternating (2026-11-27, Zen 4): INT4-AWQ -4 / -10 / -12 % at 4 / 8 / 16 sequences, bf16 -7 / -9 % at 8 /
 * 16; from a C loop (perf/attention_loop.c, each layer after a 64 MiB read) 16 x 256 tokens -15 %, 1 x 136 and
 * 4 x 1024 unchanged. At most PLAN_LINES (256 KiB) of it, so that the current and the next item share L2: all of a
 * 1024-token item made 4 sequences 7 % slower. Batch 1 has no next item (one per thread). */
#define PLAN_LINES 4096
#define FETCH_PER_K_TILE 16  /* lines fetched per kv head and tile of 16 tokens of the K pass */
#define FETCH_PER_V_PAIR 8   /* ... and per two tokens of each V sweep */
typedef struct {
    const char *line[PLAN_LINES];
    int n, at;
} next_item_t;

/* plan <- the lines of kv heads kv0 .. kv0 + per_item of each of the context's ctx rows, K and V, in token order */
static void next_item_lines(next_item_t *plan, const char *k, const char *v, const int64_t *table, int64_t ctx,
                            int block_size, int kv_heads, int kv0, int per_item, int head_dim, int cb) {
    const int64_t row_bytes = (int64_t)kv_heads * head_dim * cb, slice = (int64_t)per_item * head_dim * cb;
    plan->n = plan->at = 0;
    for (int64_t t = 0, blk = 0; t < ctx && plan->n < PLAN_LINES; blk++) {
        const int64_t at = table[blk] * block_size * row_bytes + (int64_t)kv0 * head_dim * cb;
        const int64_t n = ctx - t < block_size ? ctx - t : block_size;
        for (int64_t i = 0; i < n; i++)
            for (int64_t off = 0; off < slice && plan->n + 2 <= PLAN_LINES; off += 64) {
                plan->line[plan->n++] = k + at + i * row_bytes + off;
                plan->line[plan->n++] = v + at + i * row_bytes + off;
            }
        t += n;
    }
}

/* the plan's next `count` lines into L2 */
static inline void fetch_some(next_item_t *plan, int count) {
    for (const int end = plan->at + count < plan->n ? plan->at + count : plan->n; plan->at < end; plan->at++)
        __builtin_prefetch(plan->line[plan->at], 0, 2);  /* into L2 (prefetcht1) */
}

/* Each pass also fetches its own rows AHEAD_TOKENS ahead into L2 (fetch_row), and the score pass's last tiles the V
 * pass's first rows: the next-item plan above covers at most 256 KiB of the next item, and nothing of a thread's first
 * item, so a long context's rows (and every row at batch 1) came as demand misses, the hardware's prefetchers restarting
 * at every scattered block. perf/attention_loop.c, 16 layers each after a 64 MiB read, blocks of 32 scattered, 2 threads,
 * best of 3 rounds (2026-11-28, Zen 4): 1 x 160 13.1 -> 10.7 us a layer, 8 x 160 67.9 -> 54.6, 16 x 160 125.8 ->
 * 103.5, 1 x 1024 70.7 -> 50.3, 4 x 1024 247.5 -> 177.7; in cache (one layer over and over) unchanged. 16 and 48
 * tokens ahead did about as well, 64-128 less, prefetcht0 (into L1) nothing. */
#define AHEAD_TOKENS 32
/* The lines of context row t (elements at rows[t], `bytes` of them from there) into L2, where 0 <= t < ctx. An asm
 * prefetch: GCC 12 dropped __builtin_prefetch from these loops altogether (-O3). */
static inline void fetch_row(const char *cache, const int64_t *rows, int64_t t, int64_t ctx, int bytes, int cb) {
    if (t >= 0 && t < ctx)
        for (int off = 0; off < bytes; off += 64)
            __asm__ volatile("prefetcht1 %0" : : "m"(*(cache + rows[t] * cb + off)));
}

/* Element offsets of the context's rows of kv head kvh: token t lies at slot table[t / block_size] *
 * block_size + t % block_size. Walking the blocks once per work item avoids an integer division per
 * token (a third of the loop's time when it had them) and serves both the K and the V pass. Padded to a
 * multiple of 16 by repeating the last row: the vector path scores whole tiles of 16 and masks the rest. */
static void context_rows(int64_t *rows, const int64_t *table, int64_t ctx, int block_size, int kv_heads, int kvh,
                         int head_dim) {
    int64_t stride = (int64_t)kv_heads * head_dim;
    for (int64_t t = 0, blk = 0; t < ctx; blk++) {
        int64_t first = (table[blk] * block_size * kv_heads + kvh) * head_dim;
        int64_t n = ctx - t < block_size ? ctx - t : block_size;  /* a counted loop: it vectorises */
        for (int64_t i = 0; i < n; i++) rows[t + i] = first + i * stride;
        t += n;
    }
    for (int64_t t = ctx; t & 15; t++) rows[t] = rows[ctx - 1];
}

/* The query heads of one kv head (q pre-scaled, fp32 [group][head_dim]) against its context, in loops the compiler
 * vectorizes: the path where the AVX-512 one below does not apply (a CPU without AVX-512, another head_dim). Each
 * K and V row is widened once for all the group's heads (one head at a time widened each row `group` times: a
 * third of a batch-1 step of `small` on AVX2). scores: [group][ctx]. */
static void attend_group_scalar(int group, int head_dim, const float qf[group][head_dim], const void *k_cache,
                                const void *v_cache, const int64_t *rows, int64_t ctx, float k_scale, float v_scale,
                                int cache_kind, float *scores, float *out) {
    float row[head_dim], mx[group], sum[group];
    for (int g = 0; g < group; g++) mx[g] = -INFINITY, sum[g] = 0.0f;
    for (int64_t t = 0; t < ctx; t++) {
        load_row(row, k_cache, rows[t], head_dim, cache_kind, k_scale);
        for (int g = 0; g < group; g++) {
            float s = 0.0f;
            #pragma omp simd reduction(+ : s)
            for (int i = 0; i < head_dim; i++) s += qf[g][i] * row[i];
            scores[g * ctx + t] = s;
            mx[g] = s > mx[g] ? s : mx[g];
        }
    }
    for (int i = 0; i < group * head_dim; i++) out[i] = 0.0f;
    for (int64_t t = 0; t < ctx; t++) {
        load_row(row, v_cache, rows[t], head_dim, cache_kind, v_scale);
        for (int g = 0; g < group; g++) {
            const float p = expf(scores[g * ctx + t] - mx[g]);
            float *o = out + g * head_dim;
            sum[g] += p;
            #pragma omp simd
            for (int i = 0; i < head_dim; i++) o[i] += p * row[i];
        }
    }
    for (int g = 0; g < group; g++)
        for (int i = 0; i < head_dim; i++) out[g * head_dim + i] /= sum[g];
}

#ifdef __AVX512F__
static inline __m512 load16(const void *base, int64_t at, int kind, float scale) {
    switch (kind) {
    case F32: return _mm512_loadu_ps((const float *)base + at);
    case BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + at))), 16));
    case I8:
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                 _mm_loadu_si128((const __m128i *)((const int8_t *)base + at)))), _mm512_set1_ps(scale));
    default:  /* fp8: fp8_table looked up 16 at a time */
        return _mm512_mul_ps(_mm512_i32gather_ps(_mm512_cvtepu8_epi32(
                                 _mm_loadu_si128((const __m128i *)((const uint8_t *)base + at))), fp8_table, 4),
                             _mm512_set1_ps(scale));
    }
}

/* e^x for x <= 0 (Cephes' expf polynomial, ~1 ulp): softmax's exponentials 16 at a time. */
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* The vector path: a work item's `group` query heads (up to 8 at once; FOR_1_TO_8 makes the count a
 * constant) keep q and their accumulators in registers, and each K or V row is loaded into registers
 * (widened to fp32, or as it is for bf16 dot products) once and used by all of them. */

/* The row at `at` as nv fp32 vectors, the 8-bit kinds' scale left out: it is applied to q and to the
 * output instead, once per work item rather than per element. */
INLINE void widen_row(__m512 *row, const void *cache, int64_t at, const int nv, int kind) {
    for (int j = 0; j < nv; j++) row[j] = load16(cache, at + 16 * j, kind, 1.0f);
}

INLINE __m512 dot_parts(const __m512 *q, const __m512 *row, const int nv) {
    __m512 d = _mm512_mul_ps(q[0], row[0]);
    for (int j = 1; j < nv; j++) d = _mm512_fmadd_ps(q[j], row[j], d);
    return d;
}

#if defined(__AVX512BF16__)
/* The same from bf16 q and K as they are (q: np = nv / 2 vectors of 32): AVX512-BF16 multiplies pairs and
 * accumulates in fp32, half the instructions of widening and FMAs, and the products are exact (bf16 x bf16
 * fits an fp32 significand), so the scores round as the widened path's do. */
INLINE __m512 dot_pairs(const __m512 *q, const __m512i *row, const int np) {
    __m512 d = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)q[0], (__m512bh)row[0]);
    for (int j = 1; j < np; j++) d = _mm512_dpbf16_ps(d, (__m512bh)q[j], (__m512bh)row[j]);
    return d;
}
#endif

/* Scores for 16 tokens come from 16 per-token vectors of partial sums (one lane per 16th of head_dim),
 * reduced by a 16x16 transpose-add in four levels (~3 shuffles/adds per token), not a horizontal reduce
 * per token, which cost as much as the dot product itself. Each level halves the vectors: */

/* tokens a, b -> per 128-bit lane [a, b, a, b] partial sums */
static inline __m512 tree_pair(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
}

/* pairs (a, b), (c, d) -> per 128-bit lane [a, b, c, d] partial sums */
static inline __m512 tree_quad(__m512 ab, __m512 cd) {
    return _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
}

/* Adds neighbouring 128-bit lanes: quads of tokens 0-3, 4-7 -> [0-3, 0-3, 4-7, 4-7] (half sums), and
 * those of 0-7, 8-15 -> the 16 full sums in token order. */
static inline __m512 tree_lanes(__m512 x, __m512 y) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* out[g] = the level-reduced scores of query head g (q: G x nv vectors) against the 2 or 4 tokens at
 * rows[]: built from halves so that at most one pending vector per level and head is live. */
INLINE void scores2(__m512 *out, const __m512 *q, const void *k, const int64_t *rows, const int G, const int nv,
                    int kind, const int bf16_dots) {
#if defined(__AVX512BF16__)
    if (bf16_dots) {
        const int np = nv / 2;
        __m512i r0[4], r1[4];
        for (int j = 0; j < np; j++) {
            r0[j] = _mm512_loadu_si512((const void *)((const uint16_t *)k + rows[0] + 32 * j));
            r1[j] = _mm512_loadu_si512((const void *)((const uint16_t *)k + rows[1] + 32 * j));
        }
        for (int g = 0; g < G; g++) out[g] = tree_pair(dot_pairs(q + g * np, r0, np), dot_pairs(q + g * np, r1, np));
        return;
    }
#endif
    (void)bf16_dots;
    __m512 r0[8], r1[8];
    widen_row(r0, k, rows[0], nv, kind);
    widen_row(r1, k, rows[1], nv, kind);
    for (int g = 0; g < G; g++) out[g] = tree_pair(dot_parts(q + g * nv, r0, nv), dot_parts(q + g * nv, r1, nv));
}

INLINE void scores4(__m512 *out, const __m512 *q, const void *k, const int64_t *rows, const int G, const int nv,
                    int kind, const int bf16_dots) {
    __m512 a[8], b[8];
    scores2(a, q, k, rows, G, nv, kind, bf16_dots);
    scores2(b, q, k, rows + 2, G, nv, kind, bf16_dots);
    for (int g = 0; g < G; g++) out[g] = tree_quad(a[g], b[g]);
}

/* Stores e, s's exponentials t .. t + 15: as fp32, or with to_bf16 rounded to bf16 into the t-th uint16 of
 * s (in place: that lies before the fp32 still to be read); returns what was stored, widened. */
static inline __m512 store_numerators(float *s, int64_t t, __m512 e, int to_bf16) {
#if defined(__AVX512BF16__)
    if (to_bf16) {
        __m256i b = (__m256i)_mm512_cvtneps_pbh(e);
        _mm256_storeu_si256((__m256i *)((uint16_t *)s + t), b);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    }
#endif
    (void)to_bf16;
    _mm512_storeu_ps(s + t, e);
    return e;
}

/* s[t] = e^(s[t] - max) for t < ctx, in place (see store_numerators), and 0 in the padding up to a
 * multiple of 16 (s is that long); returns 1 / the sum of what was stored. */
static float softmax_numerators(float *s, int64_t ctx, float max, int to_bf16) {
    int64_t full = ctx & ~(int64_t)15;
    __mmask16 tail = (__mmask16)((1u << (ctx - full)) - 1u);
    __m512 m16 = _mm512_set1_ps(max), sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < full; t += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + t), m16));
        sum = _mm512_add_ps(sum, store_numerators(s, t, e, to_bf16));
    }
    if (tail) {
        __m512 e = _mm512_maskz_mov_ps(tail, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + full), m16)));
        sum = _mm512_add_ps(sum, store_numerators(s, full, e, to_bf16));
    }
    return 1.0f / _mm512_reduce_add_ps(sum);
}

/* out[g] = scale[g] * sum over t < ctx of p[g][t] * v[t], p[g] = scores + g * padded (fp32), V widened
 * to fp32. V's columns go in chunks of cv vectors so that the G x cv accumulators fit in registers (at most
 * 16); each chunk reads only its columns, so every V element is still widened once. */
INLINE void weigh_rows(float *out, const float *scores, int64_t padded, const void *v_cache, const int64_t *rows,
                       int64_t ctx, const int G, const int nv, int kind, const float *scale, next_item_t *plan) {
    const int cv = G * nv <= 16 ? nv : G * nv <= 32 ? nv / 2 : nv / 4;
    for (int c0 = 0; c0 < nv; c0 += cv) {
        __m512 acc[8 * 8], row[8];
        for (int i = 0; i < G * cv; i++) acc[i] = _mm512_setzero_ps();
        for (int64_t t = 0; t < ctx; t++) {
            fetch_some(plan, FETCH_PER_V_PAIR / 2);
            fetch_row((const char *)v_cache + 16 * c0 * cache_bytes(kind), rows, t + AHEAD_TOKENS, ctx,
                      cv * 16 * cache_bytes(kind), cache_bytes(kind));
            widen_row(row, v_cache, rows[t] + 16 * c0, cv, kind);
            for (int g = 0; g < G; g++) {
                __m512 p = _mm512_set1_ps(scores[g * padded + t]);
                for (int j = 0; j < cv; j++) acc[g * cv + j] = _mm512_fmadd_ps(p, row[j], acc[g * cv + j]);
            }
        }
        for (int g = 0; g < G; g++)
            for (int j = 0; j < cv; j++)
                _mm512_storeu_ps(out + g * nv * 16 + 16 * (c0 + j),
                                 _mm512_mul_ps(acc[g * cv + j], _mm512_set1_ps(scale[g])));
    }
}

#if defined(__AVX512BF16__)
/* The same from a bf16 V as it is and p in bf16 (softmax_numerators' to_bf16), two tokens per AVX512-BF16
 * dot product: half the instructions of widening V and FMAs. p rounded to bf16 is what the torch path and
 * HF's eager attention multiply V by; the largest p, 1, rounds exactly. Rows t, t + 1 interleaved per
 * 16-bit element put dims 8L .. 8L + 3 of each 128-bit lane L in `lo`, 8L + 4 .. 8L + 7 in `hi`; put back
 * in order at the end. */
INLINE void weigh_row_pairs(float *out, const float *scores, int64_t padded, const uint16_t *v_cache,
                            const int64_t *rows, int64_t ctx, const int G, const int nv, const float *scale,
                            next_item_t *plan) {
    static const int first_half[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
    static const int second_half[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
    const int np = nv / 2, cp = G * nv <= 16 ? np : G * nv <= 32 ? np / 2 : np / 4;  /* weigh_rows' chunks */
    for (int c0 = 0; c0 < np; c0 += cp) {
        __m512 lo[8 * 4], hi[8 * 4];
        for (int i = 0; i < G * cp; i++) lo[i] = hi[i] = _mm512_setzero_ps();
        /* an odd ctx's last pair takes the padding: p 0 and a repeated row */
        for (int64_t t = 0; t < ctx; t += 2) {
            fetch_some(plan, FETCH_PER_V_PAIR);
            fetch_row((const char *)(v_cache + 32 * c0), rows, t + AHEAD_TOKENS, ctx, 64 * cp, 2);
            fetch_row((const char *)(v_cache + 32 * c0), rows, t + 1 + AHEAD_TOKENS, ctx, 64 * cp, 2);
            __m512i il[4], ih[4];
            for (int j = 0; j < cp; j++) {
                __m512i a = _mm512_loadu_si512((const void *)(v_cache + rows[t] + 32 * (c0 + j)));
                __m512i b = _mm512_loadu_si512((const void *)(v_cache + rows[t + 1] + 32 * (c0 + j)));
                il[j] = _mm512_unpacklo_epi16(a, b);
                ih[j] = _mm512_unpackhi_epi16(a, b);
            }
            for (int g = 0; g < G; g++) {
                int32_t pair;
                memcpy(&pair, (const uint16_t *)(scores + g * padded) + t, sizeof pair);
                __m512bh p = (__m512bh)_mm512_set1_epi32(pair);
                for (int j = 0; j < cp; j++) {
                    lo[g * cp + j] = _mm512_dpbf16_ps(lo[g * cp + j], (__m512bh)il[j], p);
                    hi[g * cp + j] = _mm512_dpbf16_ps(hi[g * cp + j], (__m512bh)ih[j], p);
                }
            }
        }
        for (int g = 0; g < G; g++)
            for (int j = 0; j < cp; j++) {
                float *o = out + g * nv * 16 + 32 * (c0 + j);
                __m512 sc = _mm512_set1_ps(scale[g]), l = lo[g * cp + j], h = hi[g * cp + j];
                __m512i first = _mm512_loadu_si512(first_half), second = _mm512_loadu_si512(second_half);
                _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_permutex2var_ps(l, first, h), sc));
                _mm512_storeu_ps(o + 16, _mm512_mul_ps(_mm512_permutex2var_ps(l, second, h), sc));
            }
    }
}
#endif

static inline float max_of(const float *s, int64_t padded) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < padded; t += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + t));
    return _mm512_reduce_max_ps(m);
}

/* kv_count adjacent kv heads of one query row, each with G of its query heads: qg [kv_count][group][nv * 16]
 * in the activation dtype (G <= group heads used from each kv head's `group`), against the context rows of
 * the first kv head (padded to a multiple of 16 by repeating the last; head h's lie h * nv * 16 elements on)
 * -> out [kv_count][group][nv * 16] fp32; scores: kv_count x group x (ctx rounded up to 16) floats.
 * bf16_dots: bf16 q and cache, q used as it is and the scores scaled instead. Two passes: the scores tile by
 * tile, every kv head's within a tile, so that each cache row's kv heads are read together; then, kv head by
 * kv head, the softmax-weighted V rows. One step's attention of `small` at 4-16 sequences over scattered
 * blocks ran 7-10 % faster than with a work item per kv head, whose 128-byte slices of each 512-byte row
 * were read apart (perf/attention_bench.py --base, 2026-11-27); blocks in order, unchanged. */
INLINE void attend_group(const void *qg, int act_kind, float softmax_scale, const char *k_cache, const char *v_cache,
                         const int64_t *rows, int64_t ctx, int kv_count, int group, const int G, const int nv,
                         const int bf16_dots, float k_scale, float v_scale, int kind, float *scores, float *out,
                         next_item_t *plan) {
    int64_t padded = (ctx + 15) & ~(int64_t)15;
    float ks = kind >= I8 ? k_scale : 1.0f, vs = kind >= I8 ? v_scale : 1.0f;
    const int head_bytes = nv * 16 * cache_bytes(kind);
    const int64_t q_stride = (int64_t)group * nv * 16;  /* elements from one kv head's query heads to the next's */
    __m512 q[8 * 8];
    __m512 score_scale = _mm512_set1_ps(bf16_dots ? softmax_scale : 1.0f);
    /* the padding's scores repeat the last token's, so they leave the max as it is */
    for (int64_t t0 = 0; t0 < ctx; t0 += 16) {
        /* every kv head's slice of the rows ahead; past the end, the V pass's first rows */
        for (int64_t t = t0 + AHEAD_TOKENS; t < t0 + AHEAD_TOKENS + 16; t++)
            fetch_row(t < ctx ? k_cache : v_cache, rows, t < ctx ? t : t - ctx, ctx, kv_count * head_bytes,
                      cache_bytes(kind));
        for (int h = 0; h < kv_count; h++) {
            const char *qh = (const char *)qg + h * q_stride * act_bytes(act_kind);
            if (bf16_dots)
                for (int i = 0; i < G * nv / 2; i++)
                    q[i] = _mm512_castsi512_ps(_mm512_loadu_si512((const void *)((const uint16_t *)qh + 32 * i)));
            else
                for (int i = 0; i < G * nv; i++)
                    q[i] = _mm512_mul_ps(load16(qh, 16 * i, act_kind, 1.0f), _mm512_set1_ps(softmax_scale * ks));
            __m512 quad[4][8];
            fetch_some(plan, FETCH_PER_K_TILE);
            /* a loop, not unrolled: four copies of scores4 for each group size made the build several times slower */
            #pragma GCC unroll 1
            for (int c = 0; c < 4; c++)
                scores4(quad[c], q, k_cache + h * head_bytes, rows + t0 + 4 * c, G, nv, kind, bf16_dots);
            for (int g = 0; g < G; g++) {
                __m512 s = tree_lanes(tree_lanes(quad[0][g], quad[1][g]), tree_lanes(quad[2][g], quad[3][g]));
                s = bf16_dots ? _mm512_mul_ps(s, score_scale) : s;
                _mm512_storeu_ps(scores + (h * group + g) * padded + t0, s);
            }
        }
    }
    for (int h = 0; h < kv_count; h++) {
        float inv[8], *sh = scores + (int64_t)h * group * padded, *oh = out + h * q_stride;
        for (int g = 0; g < G; g++)
            inv[g] = softmax_numerators(sh + g * padded, ctx, max_of(sh + g * padded, padded), bf16_dots) * vs;
#if defined(__AVX512BF16__)
        if (bf16_dots) {
            weigh_row_pairs(oh, sh, padded, (const uint16_t *)(v_cache + h * head_bytes), rows, ctx, G, nv, inv, plan);
            continue;
        }
#endif
        weigh_rows(oh, sh, padded, v_cache + h * head_bytes, rows, ctx, G, nv, kind, inv, plan);
    }
}
#endif

/* A work item's scratch (row offsets and scores) lives on the stack up to this size, past it on the heap:
 * a malloc per work item cost as much as a short context's attention. */
#define ATTN_STACK_BYTES (128 * 1024)

#if defined(__AVX2__)
/* The sum of a vector's 8 lanes, in one fixed order. */
static inline float sum8_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* The largest of a vector's 8 lanes. */
static inline float max8_avx2(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
#endif

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define HAVE_AVX2_ATTENTION 1
/* e^x for x <= 0, 8 at a time (exp512's range reduction and polynomial on AVX2). */
static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* times 2^n: n (>= -126 here) added to the exponent field */
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* 8 vectors' sums in the lanes of one: lane j = the sum of a[j]'s 8 lanes */
static inline __m256 sum8x8(const __m256 a[8]) {
    const __m256 a0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 a4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    /* a0123: vectors 0-3's sums of their low 4 lanes, then of their high 4 lanes; a4567 likewise */
    return _mm256_add_ps(_mm256_permute2f128_ps(a0123, a4567, 0x20), _mm256_permute2f128_ps(a0123, a4567, 0x31));
}

/* One sweep of attend_group_avx2's V pass: dims d0 .. d0 + 15 of query heads g0 .. g0 + heads - 1 (heads 1-3, a
 * constant once inlined: with it a runtime flag, GCC kept the accumulators on the stack, each token's FMAs waiting on
 * the last one's store, half of the kernel's time in cache), the weighted V rows summed over the context in registers,
 * each row's slice widened once for all the sweep's heads (a kv head's 3 query heads in one sweep: per token half the
 * widening of two sweeps of 32 dims over 2 heads and 1). */
INLINE void v_sweep_avx2(const int heads, int head_dim, const void *v_cache, const int64_t *rows, int64_t ctx,
                         float v_scale, int cache_kind, const float *scores, const float *sum, float *out,
                         next_item_t *plan, int d0, int g0) {
    __m256 acc[6];
    float slice[16];
    for (int j = 0; j < 2 * heads; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t t = 0; t < ctx; t++) {
        __m256 v[2];
        if (cache_kind == BF16) {
            const uint16_t *src = (const uint16_t *)v_cache + rows[t] + d0;
            for (int j = 0; j < 2; j++) v[j] = bf16x8(src + 8 * j);
        } else {
            load_row(slice, v_cache, rows[t] + d0, 16, cache_kind, v_scale);
            for (int j = 0; j < 2; j++) v[j] = _mm256_loadu_ps(slice + 8 * j);
        }
        if (plan != NULL && (t & 1)) fetch_some(plan, 1);
        for (int h = 0; h < heads; h++) {
            const __m256 p = _mm256_broadcast_ss(scores + (g0 + h) * ctx + t);
            for (int j = 0; j < 2; j++) acc[2 * h + j] = _mm256_fmadd_ps(p, v[j], acc[2 * h + j]);
        }
    }
    for (int h = 0; h < heads; h++) {
        const __m256 inv = _mm256_set1_ps(1.0f / sum[g0 + h]);
        for (int j = 0; j < 2; j++)
            _mm256_storeu_ps(out + (g0 + h) * head_dim + d0 + 8 * j, _mm256_mul_ps(acc[2 * h + j], inv));
    }
}

/* attend_group_scalar's work on AVX2 + FMA, head_dim a multiple of 32: the scores by 8-wide FMAs, their exponentials
 * 8 at a time, and the weighted V rows summed in registers (up to three heads x 16 dims at a time, v_sweep_avx2). */
static void attend_group_avx2(int group, int head_dim, const float qf[group][head_dim], const void *k_cache,
                              const void *v_cache, const int64_t *rows, int64_t ctx, float k_scale, float v_scale,
                              int cache_kind, float *scores, float *out, next_item_t *plan) {
    float kt[head_dim / 8][8][8], row[head_dim], mx[group], sum[group];  /* kt: a tile's K, [8 dims][token][dim] */
    __m256 top[group];  /* each head's running maximum, lane by lane */
    const int cb = cache_bytes(cache_kind);
    for (int g = 0; g < group; g++) top[g] = _mm256_set1_ps(-INFINITY);
    /* 8 tokens at a time: the 8 tokens' partial sums reduced across the lanes together (sum8x8), where one reduction
     * per token and head cost as many instructions as its dot products; the K and V rows AHEAD_TOKENS ahead fetched
     * into L2 meanwhile (as the AVX-512 kernel's own rows). rows[] is padded to 16 by repeating the last row, so a last
     * tile's extra lanes score that row again: the maximum stands, and only the real lanes are stored. */
    for (int64_t t0 = 0; t0 < ctx; t0 += 8) {
        const int live = ctx - t0 < 8 ? (int)(ctx - t0) : 8;
        for (int j = 0; j < 8; j++) {  /* each row's 8 dims at a time beside the other tokens' (one base address below) */
            if (cache_kind == BF16) {
                const uint16_t *src = (const uint16_t *)k_cache + rows[t0 + j];
                for (int c = 0; c < head_dim / 8; c++) _mm256_storeu_ps(kt[c][j], bf16x8(src + 8 * c));
            } else {
                load_row(row, k_cache, rows[t0 + j], head_dim, cache_kind, k_scale);
                for (int c = 0; c < head_dim / 8; c++) memcpy(kt[c][j], row + 8 * c, sizeof(kt[c][j]));
            }
            fetch_row((const char *)k_cache, rows, t0 + j + AHEAD_TOKENS, ctx, head_dim * cb, cb);
            fetch_row((const char *)v_cache, rows, t0 + j + AHEAD_TOKENS, ctx, head_dim * cb, cb);
        }
        if (plan != NULL) fetch_some(plan, FETCH_PER_K_TILE / 2);  /* the next item's lines, as the AVX-512 kernel */
        for (int g = 0; g < group; g++) {
            __m256 a[8];
            for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
            for (int c = 0; c < head_dim / 8; c++) {
                const __m256 qv = _mm256_loadu_ps(qf[g] + 8 * c);
                for (int j = 0; j < 8; j++) a[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kt[c][j]), a[j]);
            }
            const __m256 s = sum8x8(a);
            top[g] = _mm256_max_ps(top[g], s);
            if (live == 8) _mm256_storeu_ps(scores + g * ctx + t0, s);
            else {
                float last[8];
                _mm256_storeu_ps(last, s);
                memcpy(scores + g * ctx + t0, last, sizeof(float) * (size_t)live);
            }
        }
    }
    for (int g = 0; g < group; g++) mx[g] = max8_avx2(top[g]);
    for (int g = 0; g < group; g++) {
        float *sg = scores + g * ctx;
        const __m256 m = _mm256_set1_ps(mx[g]);
        __m256 total = _mm256_setzero_ps();
        int64_t t = 0;
        for (; t + 8 <= ctx; t += 8) {
            const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sg + t), m));
            _mm256_storeu_ps(sg + t, e);
            total = _mm256_add_ps(total, e);
        }
        sum[g] = sum8_avx2(total);
        for (; t < ctx; t++) sum[g] += sg[t] = expf(sg[t] - mx[g]);
    }
    for (int d0 = 0; d0 < head_dim; d0 += 16)
        for (int g0 = 0; g0 < group; g0 += 3) {
#define V_SWEEP(H) v_sweep_avx2(H, head_dim, v_cache, rows, ctx, v_scale, cache_kind, scores, sum, out, plan, d0, g0)
            if (group - g0 >= 3) V_SWEEP(3);
            else if (group - g0 == 2) V_SWEEP(2);
            else V_SWEEP(1);
#undef V_SWEEP
        }
}
#endif

/* One kv head's query heads without AVX-512 (q widened and pre-scaled here). */
static void attend_heads_scalar(const void *q, int act_kind, float softmax_scale, const void *k_cache,
                                const void *v_cache, const int64_t *rows, int64_t ctx, int group, int head_dim,
                                float k_scale, float v_scale, int cache_kind, float *scores, float *out,
                                next_item_t *plan) {
    float qf[group][head_dim];
    for (int g = 0; g < group; g++) {
        load_row(qf[g], q, (int64_t)g * head_dim, head_dim, act_kind, 1.0f);
        for (int i = 0; i < head_dim; i++) qf[g][i] *= softmax_scale;
    }
#if defined(HAVE_AVX2_ATTENTION)
    if (head_dim % 32 == 0) {
        attend_group_avx2(group, head_dim, (const float(*)[head_dim])qf, k_cache, v_cache, rows, ctx, k_scale, v_scale,
                          cache_kind, scores, out, plan);
        return;
    }
#endif
    (void)plan;  /* the scalar loop fetches nothing ahead */
    attend_group_scalar(group, head_dim, (const float(*)[head_dim])qf, k_cache, v_cache, rows, ctx, k_scale, v_scale,
                        cache_kind, scores, out);
}

/* kv heads a work item takes, of one query row: all of them (so that each cache row is read whole, see
 * attend_group), unless the rows are too few to keep every thread busy, then the fewest that do. */
static int kv_heads_per_item(int batch, int kv_heads, int threads) {
    if (batch >= 4 * threads) return kv_heads;
    for (int split = 1; split <= kv_heads; split++)
        if (kv_heads % split == 0 && (batch * split) % threads == 0) return kv_heads / split;
    return 1;
}

typedef struct {  /* one attention call's work: its items, how they split over `threads`, what it fetches next */
    const void *q, *k_cache, *v_cache, *then_k, *then_v;
    const int64_t *block_tables, *context_lens;
    void *out;
    int batch, heads, kv_heads, head_dim, max_blocks, block_size, act_kind, cache_kind, threads, per_item, parts;
    float k_scale, v_scale;
} attention_work_t;

static attention_work_t attention_work(const void *q, const void *k_cache, const void *v_cache,
                                       const int64_t *block_tables, const int64_t *context_lens, void *out, int batch,
                                       int heads, int kv_heads, int head_dim, int max_blocks, int block_size,
                                       float k_scale, float v_scale, int act_kind, int cache_kind, const void *then_k,
                                       const void *then_v, int threads) {
    const int per_item = kv_heads_per_item(batch, kv_heads, threads);
    return (attention_work_t){.q = q, .k_cache = k_cache, .v_cache = v_cache, .then_k = then_k, .then_v = then_v,
                              .block_tables = block_tables, .context_lens = context_lens, .out = out, .batch = batch,
                              .heads = heads, .kv_heads = kv_heads, .head_dim = head_dim, .max_blocks = max_blocks,
                              .block_size = block_size, .act_kind = act_kind, .cache_kind = cache_kind,
                              .threads = threads, .per_item = per_item, .parts = kv_heads / per_item,
                              .k_scale = k_scale, .v_scale = v_scale};
}

/* Work item `item` of `w`: one row b and kv heads kv0 .. kv0 + per_item with their query heads. The thread that
 * takes item i takes i + threads next (attention_then's round robin), whose lines it fetches while computing this
 * one; after its last, its first item in the layer whose caches are then_k / then_v. */
static void attention_item(const attention_work_t *w, int item) {
    const void *q = w->q, *k_cache = w->k_cache, *v_cache = w->v_cache, *then_k = w->then_k, *then_v = w->then_v;
    const int64_t *block_tables = w->block_tables, *context_lens = w->context_lens;
    void *out = w->out;
    const int batch = w->batch, heads = w->heads, kv_heads = w->kv_heads, head_dim = w->head_dim;
    const int max_blocks = w->max_blocks, block_size = w->block_size, act_kind = w->act_kind;
    const int cache_kind = w->cache_kind, per_item = w->per_item, parts = w->parts;
    const float k_scale = w->k_scale, v_scale = w->v_scale;
    const int group = heads / kv_heads;
    const int64_t head_bytes = (int64_t)head_dim * cache_bytes(cache_kind);
    const float softmax_scale = 1.0f / sqrtf((float)head_dim);
    int b = item / parts, kv0 = item % parts * per_item;
    int64_t ctx = context_lens[b], padded = (ctx + 15) & ~(int64_t)15;
    if (ctx == 0) return;  /* a prompt chunk's row, which chunk_attention takes */
    int64_t scratch = padded * (8 + 4 * (int64_t)group * per_item);
    int on_heap = scratch > ATTN_STACK_BYTES;
    int64_t rows_on_stack[on_heap ? 1 : padded];
    float scores_on_stack[on_heap ? 1 : group * per_item * padded], o[per_item * group * head_dim];
    void *heap = on_heap ? malloc((size_t)scratch) : NULL;
    int64_t *rows = on_heap ? (int64_t *)heap : rows_on_stack;
    float *scores = on_heap ? (float *)(rows + padded) : scores_on_stack;
    int64_t at = ((int64_t)b * heads + (int64_t)kv0 * group) * head_dim;  /* the item's heads are adjacent */
    const char *qg = (const char *)q + at * act_bytes(act_kind);
    context_rows(rows, block_tables + (int64_t)b * max_blocks, ctx, block_size, kv_heads, kv0, head_dim);
#if defined(__AVX512F__) || defined(HAVE_AVX2_ATTENTION)
    /* this thread's next item (schedule(static, 1)), fetched while this one is computed; after its last, its first
     * in the layer whose caches are then_k / then_v */
    next_item_t plan;  /* not zero-initialised: that wrote its 32 KiB of pointers per item */
    plan.n = plan.at = 0;
    const int threads = w->threads, later = item + threads < batch * parts;
    const int next = later ? item + threads : item % threads;
#if defined(__AVX512F__)
    const int plan_next = later || then_k != NULL;
#else  /* AVX2: the next layer's first item fetched during this layer's last made one sequence of 1024 tokens 3-4 %
        * slower (perf/ab_steps.py, both orders, 2026-11-28), and nothing faster at 128 */
    const int plan_next = later;
#endif
    if (plan_next)
        next_item_lines(&plan, later ? k_cache : then_k, later ? v_cache : then_v,
                        block_tables + (int64_t)(next / parts) * max_blocks, context_lens[next / parts], block_size,
                        kv_heads, next % parts * per_item, per_item, head_dim, cache_bytes(cache_kind));
    next_item_t *const next_lines = &plan;
#else
    next_item_t *const next_lines = NULL;
    (void)then_k, (void)then_v, (void)batch;
#endif
#ifdef __AVX512F__
    if (head_dim == 64 || head_dim == 128) {
#if defined(__AVX512BF16__)
        int bf16_dots = act_kind == BF16 && cache_kind == BF16;
#else
        int bf16_dots = 0;
#endif
        /* more than 8 heads per kv head: in sub-groups of 8, each reading K/V again */
        for (int g0 = 0; g0 < group; g0 += 8) {
            const char *qs = qg + (int64_t)g0 * head_dim * act_bytes(act_kind);
            float *os = o + g0 * head_dim, *ss = scores + (int64_t)g0 * padded;
#define ATTEND_NV(G, NV, DOTS)                                                                                  \
    attend_group(qs, act_kind, softmax_scale, k_cache, v_cache, rows, ctx, per_item, group, G, NV, DOTS, k_scale, \
                 v_scale, cache_kind, ss, os, next_lines)
#define ATTEND(G)                                                                                  \
    if (head_dim == 64) { if (bf16_dots) ATTEND_NV(G, 4, 1); else ATTEND_NV(G, 4, 0); }           \
    else { if (bf16_dots) ATTEND_NV(G, 8, 1); else ATTEND_NV(G, 8, 0); }
            FOR_1_TO_8(group - g0, ATTEND)
#undef ATTEND
#undef ATTEND_NV
        }
    } else
#endif
        for (int h = 0; h < per_item; h++)
            attend_heads_scalar(qg + (int64_t)h * group * head_dim * act_bytes(act_kind), act_kind, softmax_scale,
                                (const char *)k_cache + h * head_bytes, (const char *)v_cache + h * head_bytes,
                                rows, ctx, group,
                                head_dim, k_scale, v_scale, cache_kind, scores, o + h * group * head_dim, next_lines);
    store_row(out, at, o, per_item * group * head_dim, act_kind);
    free(heap);
}

/* One query token per row, over its context, work split over rows (and kv heads, see kv_heads_per_item): q, out:
 * [batch, heads, head_dim] (activation dtype); k_cache, v_cache: [slots, kv_heads, head_dim] (cache dtype, times
 * k_scale / v_scale for 8-bit kinds); block_tables: [batch, max_blocks]; context_lens: [batch], 0 for a row to skip
 * (its output untouched).
 * Query head h reads kv head h / (heads / kv_heads), as HF's repeat_kv. then_k, then_v: the caches of the layer the
 * caller attends next (same shapes and tables), or NULL: each thread fetches its first work item there into L2
 * during its last one here. */
static void attention_then(const void *q, const void *k_cache, const void *v_cache, const int64_t *block_tables,
                           const int64_t *context_lens, void *out, int batch, int heads, int kv_heads, int head_dim,
                           int max_blocks, int block_size, float k_scale, float v_scale, int act_kind, int cache_kind,
                           const void *then_k, const void *then_v) {
    init_fp8();
    const attention_work_t w = attention_work(q, k_cache, v_cache, block_tables, context_lens, out, batch, heads,
                                              kv_heads, head_dim, max_blocks, block_size, k_scale, v_scale, act_kind,
                                              cache_kind, then_k, then_v, omp_get_max_threads());
    /* round robin: a prefill chunk's rows (model_runner's _native_attention_plan) have contexts growing by one
     * token each, so halves in order would give one thread three times the other's work */
    #pragma omp parallel for schedule(static, 1)
    for (int item = 0; item < batch * w.parts; item++) attention_item(&w, item);
}

/* One query token per sequence against its paged context (attention_then, fetching nothing for a next layer). */
void decode_attention(const void *q, const void *k_cache, const void *v_cache, const int64_t *block_tables,
                      const int64_t *context_lens, void *out, int batch, int heads, int kv_heads, int head_dim,
                      int max_blocks, int block_size, float k_scale, float v_scale, int act_kind, int cache_kind) {
    attention_then(q, k_cache, v_cache, block_tables, context_lens, out, batch, heads, kv_heads, head_dim, max_blocks,
                   block_size, k_scale, v_scale, act_kind, cache_kind, NULL, NULL);
}

/* SwiGLU's middle: out[t, i] = to_dtype(to_dtype(silu(gate)) * up) for gate_up[t] = [gate | up], as
 * `F.silu(gate) * up` rounds. Vectorized: a scalar expf per element cost 1.3 ms per layer for a 128-token
 * prefill of `small` (a fifth of its TTFT). */
#ifdef __AVX512F__
/* silu(g) = g / (1 + e^-g), with e^-|g| only (exp512 takes x <= 0): g * e / (1 + e) where g < 0. */
static inline __m512 silu16(__m512 g) {
    __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
    __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_div_ps(_mm512_mask_mul_ps(g, neg, g, e), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}
#elif defined(HAVE_AVX2_ATTENTION)
/* silu16 on 8 lanes (exp256: exp512's operations, so the same bits) */
static inline __m256 silu8(__m256 g) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g)));
    const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
    return _mm256_div_ps(_mm256_blendv_ps(g, _mm256_mul_ps(g, e), neg), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}
#endif

/* smooth: NULL, or the down projection's AWQ / SmoothQuant pre_quant_scale (fp32), multiplied in and rounded as
 * `mlp_in * down_smooth` rounds after the product. */
static void silu_mul_row(const void *gate_up, void *out, int64_t t, int inter, int kind, const float *smooth) {
    float g[inter], u[inter];
    load_row(g, gate_up, t * 2 * inter, inter, kind, 1.0f);
    load_row(u, gate_up, t * 2 * inter + inter, inter, kind, 1.0f);
    int i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= inter; i += 16) {
        __m512 a = round_to16(silu16(_mm512_loadu_ps(g + i)), kind);
        _mm512_storeu_ps(g + i, round_to16(_mm512_mul_ps(a, _mm512_loadu_ps(u + i)), kind));
    }
#elif defined(HAVE_AVX2_ATTENTION)
    for (; i + 8 <= inter; i += 8) {
        __m256 a = round_to8(silu8(_mm256_loadu_ps(g + i)), kind);
        _mm256_storeu_ps(g + i, round_to8(_mm256_mul_ps(a, _mm256_loadu_ps(u + i)), kind));
    }
#endif
    for (; i < inter; i++) g[i] = round_to(round_to(g[i] / (1.0f + expf(-g[i])), kind) * u[i], kind);
    if (smooth != NULL) combine_rounded(g, g, smooth, inter, kind, 0);
    store_row(out, t * inter, g, inter, kind);
}

void silu_mul(const void *gate_up, void *out, int64_t tokens, int inter, int kind) {
    FOR_ROWS(t, tokens, 5, silu_mul_row(gate_up, out, t, inter, kind, NULL));
}

/* silu_mul, then times smooth [inter] (activation dtype), rounded: a prompt's down-projection input in one pass (the
 * separate torch multiply took ~36 us a layer at 128 rows of `small`) */
void silu_mul_smoothed(const void *gate_up, void *out, int64_t tokens, int inter, int kind, const void *smooth) {
    float s[inter];
    load_row(s, smooth, 0, inter, kind, 1.0f);
    FOR_ROWS(t, tokens, 5, silu_mul_row(gate_up, out, t, inter, kind, s));
}

/* ---- weight-only GEMMs for few rows (decode) ------------------------------------------------------
 * y[m, n] = sum_k x[m, k] * w[n, k] * scale, weights read once per tile of up to TILE_M rows and widened
 * to fp32 in registers: a decode step streams each weight byte once, which is what makes it memory-bound.
 * torch's stock bf16 and int8 kernels read them at 40-60 % of the machine's bandwidth at batch 1
 * (perf/README.md); past a few rows the step turns compute-bound and torch's kernels are as fast.
 *
 * int8: w [N, K] int8, scale [N] fp32 (one per output row); x [M, K] in the activation dtype, widened
 * once to fp32; y [M, N] in the activation dtype. (int4 stays on torch's kernel: a kernel of this shape
 * unpacking nibbles ran at a third of its speed, measured.)
 */
#define TILE_M 8
/* Bytes ahead of the weight row being read that the streaming GEMMs prefetch: without it the loads of a
 * decode step's weights did not overlap the kernels' arithmetic (int4 at 1 row: 30.8 GB/s-equivalent with
 * the weights in cache, 17.8 streaming; 24-26 with it; 1-8 KiB all alike; bf16 from 4 rows up: 8 rows
 * 239 -> 185 us per 2048x768; the int8 widening kernel got slower with it, so it has none). */
#define WEIGHT_PREFETCH 2048
/* Where one or two activation rows leave the streaming GEMMs memory-bound: prefetch into L2, once per cache
 * line, 8 KiB ahead (more misses in flight than L1's fill buffers allow). The int4 kernel's arithmetic per
 * byte is high enough that loads and unpacking ran one after the other without it (17-19 GB/s streaming where
 * a plain sum read 25-30, the same kernel in cache 38): a step's int4 GEMMs at one row 18-20 % faster, fp8's
 * 8-15 %, bf16's within noise, INT8-SQ's 16 -> 21-24 GB/s (measured 2026-11-24 and -23, perf/ab_kernels.py).
 * From 4 rows up (compute-bound, each weight reused from L1) it made int4 7-38 % slower: there WEIGHT_PREFETCH.
 * bf16 and INT8-SQ take it at every row count: bf16's whole decode steps of `small` at 4, 8 and 16 sequences
 * ran 25 %, 18 % and 4 % faster with it than with WEIGHT_PREFETCH (2026-11-26, Zen 4, two builds' runners in
 * one process, alternating); fp8's did not move then, and since the night of 2026-11-26 takes it too (steps at 4 /
 * 8 / 12 sequences -11..-13 / 0..-6 / -2..-3 %, both memory states, against WEIGHT_PREFETCH into L1).
 * One row of the lanes kernels takes none (prefetch_lanes). */
#define STREAM_PREFETCH 8192
#ifdef __AVX512F__
/* The one prefetch policy of the streaming GEMMs: the weights at `at` fetched STREAM_PREFETCH ahead into L2
 * where few rows leave the kernel memory-bound, WEIGHT_PREFETCH ahead into L1 where it is compute-bound; or,
 * where a kernel reads a block of weight rows side by side (`block` bytes) longer than that, the next block's
 * same line: a shorter reach lands in the block's own later rows, already on their way, and leaves the next
 * block's unfetched (bf16 from 8 rows, 4 rows of down's 2048 inputs: whole steps at 8 / 12 / 16 sequences
 * -8..-10 / -7 / -5 %, 2026-11-26, Zen 4, both memory states). */
INLINE void prefetch_weights(const void *at, const int memory_bound, const int64_t block) {
    const int64_t usual = memory_bound ? STREAM_PREFETCH : WEIGHT_PREFETCH, ahead = block > usual ? block : usual;
    if (memory_bound) _mm_prefetch((const char *)at + ahead, _MM_HINT_T1);
    else _mm_prefetch((const char *)at + ahead, _MM_HINT_T0);
}

/* prefetch_weights for the lanes kernels (int4 x int8, INT8-SQ: 16 output rows side by side) reading at `at` for
 * `rows` activation rows: into L2 at 2 rows, L1 from 3, and none at one row but on Intel (below). There their weights
 * are one sequential stream per thread, which the hardware prefetchers keep up with: with the prefetch both kernels
 * streamed at 30-39 GB/s in the fast memory state against a 51-64 GB/s read (a step's GEMMs from C); whole batch-1
 * steps without it, alternating with it in one process (perf/ab_steps.py --slices 48, both memory states): INT8-SQ
 * -5..-7 %, INT4-AWQ -5..-14 % (one run of four 1.00), W4A8 -3..-11 %. That was a Zen 4. On an Intel Xeon (AMX, 2
 * vCPUs, 2026-11-29) the one-row int4 x int8 kernel read 46-48 GB/s without it and 54 with it (48 MiB re-read), as
 * fast as at 2 rows, where the step's batch-1 GEMMs had read 38-41 GB/s and 2 rows' 50-53: so into L2 at one row too
 * on Intel CPUs (TOOLKIT_INTEL_CPU, from native_kernels.compile_flags). fp8's blocks of 4 rows take none at one
 * and two rows since their rows are interleaved into one stream (pack_fp8; side by side they ran 1.7x slower
 * without it). */
#if defined(TOOLKIT_INTEL_CPU)
#define LANES_PREFETCH_FROM_ROWS 1
#else
#define LANES_PREFETCH_FROM_ROWS 2
#endif
INLINE void prefetch_lanes(const void *at, const int rows) {
    if (rows >= LANES_PREFETCH_FROM_ROWS) prefetch_weights(at, rows <= 2, 0);
}
#endif
#if defined(__AVX2__)
/* The AVX2 lanes kernels' (int4 x int8, INT8-SQ, fp8 as int8 where VNNI is missing) prefetch: they read each 64-byte
 * line as two 32-byte halves and spend 12-20 instructions on it at one row (vpmaddubsw, vpmaddwd and the adds that
 * VNNI's one vpdpbusd does), so the out-of-order window reaches far fewer lines ahead than the VNNI kernels' and the
 * hardware prefetchers alone fell behind. Into L1, 4 KiB ahead, at every row count: whole INT4-AWQ steps of `small`
 * (this Zen 4 built as x86-64-v3) 0.93 / 0.91 / 0.95 at 1 / 2 / 4 sequences, 0.90 at 8 (perf/ab_steps.py --slices,
 * slow state; the builds swapped: the same). */
#define AVX2_LANES_PREFETCH 4096
INLINE void prefetch_lanes_avx2(const void *at) { _mm_prefetch((const char *)at + AVX2_LANES_PREFETCH, _MM_HINT_T0); }

/* The AVX2 int8 x int8 step of INT8-SQ's and fp8-as-int8's lanes kernels: a[0], a[1] (the two halves' 8 rows) plus
 * the products of one 64-byte line w of a block (4 weights of each of 16 rows) with the 4 broadcast activation bytes
 * q, summed by 4 into 32 bits. vpmaddubsw takes |q| (unsigned) against the weights carrying q's sign (vpsignb: the
 * weights must avoid -128, whose sign does not flip in 8 bits), its pairs at most 2 x 128 x 127 in 16 bits, and
 * vpmaddwd against ones adds the pairs: the exact integer VNNI's vpdpbusd gives. */
INLINE void signed_products(const __m256i w[2], const __m256i q, __m256i a[2]) {
    const __m256i size = _mm256_abs_epi8(q), ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++)
        a[h] = _mm256_add_epi32(a[h], _mm256_madd_epi16(_mm256_maddubs_epi16(size, _mm256_sign_epi8(w[h], q)), ones));
}
#endif
/* Tile loops run over `rows` accumulators, `rows` made a constant by FOR_1_TO_8. */

/* x rounded to float8_e4m3fn (round to nearest even, as torch's cast; |x| already <= 448). */
static inline float round_e4m3(float v) {
    float a = fabsf(v);
    if (a == 0.0f) return v;
    int e;
    frexpf(a, &e);
    int lead = e - 1 < -6 ? -6 : e - 1;  /* below 2^-6 the subnormal spacing 2^-9 holds */
    float step = ldexpf(1.0f, lead - 3);
    return copysignf(nearbyintf(a / step) * step, v);
}

/* v as fp8 activations at `scale` round it (ModelOpt's static per-tensor scale): v / scale clamped to e4m3's range,
 * rounded to e4m3, times scale, in the activation dtype `kind`; fp8_steps16 is the same 16 at a time. */
static inline float fp8_activation(float v, float scale, int kind) {
    const float q = v / scale;
    return round_to(round_e4m3(q < -448.0f ? -448.0f : q > 448.0f ? 448.0f : q) * scale, kind);
}

#ifdef __AVX512F__
/* v / s clamped to fp8's range and rounded to its nearest e4m3 value, 16 at a time (the scalar frexpf/ldexpf path
 * cost ~20 ns per element, most of an fp8 decode GEMM's activation work): step 2^(max(floor(log2 |q|), -6) - 3),
 * q / step rounded to even, times step. */
static inline __m512 fp8_steps16(__m512 v, __m512 s) {
    const __m512 q = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(v, s), _mm512_set1_ps(-448.0f)), _mm512_set1_ps(448.0f));
    const __m512 lead = _mm512_max_ps(_mm512_getexp_ps(q), _mm512_set1_ps(-6.0f));
    const __m512 shift = _mm512_sub_ps(_mm512_set1_ps(3.0f), lead);
    return _mm512_scalef_ps(_mm512_roundscale_ps(_mm512_scalef_ps(q, shift), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                            _mm512_sub_ps(_mm512_setzero_ps(), shift));
}
#endif
#if defined(__AVX2__)
/* fp8_steps16 on 8 lanes, without getexp and scalef: floor(log2 |q|) from q's exponent bits (q = 0 reads -127, held
 * to -6 as subnormals are), the steps 2^(3 - lead) and 2^(lead - 3) built as floats from their exponents; q times a
 * power of two is exact, so this is the scalar round_e4m3's value (element by element it cost ~20 ns an activation:
 * W4A8's and fp8's rounding ~0.9 ms of a batch-1 step of `small` on AVX2). */
static inline __m256 fp8_steps8(__m256 v, __m256 s) {
    const __m256 q = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(v, s), _mm256_set1_ps(-448.0f)), _mm256_set1_ps(448.0f));
    const __m256i bits = _mm256_and_si256(_mm256_castps_si256(q), _mm256_set1_epi32(0x7f800000));
    const __m256i lead = _mm256_max_epi32(_mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(127)),
                                          _mm256_set1_epi32(-6));
    const __m256 up = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(127 + 3), lead), 23));
    const __m256 down = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(lead, _mm256_set1_epi32(127 - 3)), 23));
    return _mm256_mul_ps(_mm256_round_ps(_mm256_mul_ps(q, up), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), down);
}
#endif

/* v / scale rounded to nearest even and clamped to int8's range: SmoothQuant's activation level (as a float) */
static inline float int8_level(float v, float scale) {
    const float q = nearbyintf(v / scale);
    return q < -128.0f ? -128.0f : q > 127.0f ? 127.0f : q;
}

/* Activations widened to fp32, and rounded first as ModelOpt calibrated them (static per-tensor scale):
 * act_quant ACT_NONE, ACT_INT8 (SmoothQuant) or ACT_FP8 (e4m3): what fake_quant_activation does in torch. */
static float *widen_activations(const void *x, int64_t M, int K, int kind, int act_quant, float input_scale) {
    float *xf = (float *)malloc(sizeof(float) * (size_t)(M * K));
    for (int64_t m = 0; m < M; m++) {
        float *row = xf + m * K;
        load_row(row, x, m * K, K, kind, 1.0f);
        if (act_quant == ACT_INT8)
            for (int k = 0; k < K; k++) row[k] = round_to(int8_level(row[k], input_scale) * input_scale, kind);
        else if (act_quant == ACT_FP8) {
            int k = 0;
#ifdef __AVX512F__
            const __m512 s = _mm512_set1_ps(input_scale);
            for (; k + 16 <= K; k += 16)
                _mm512_storeu_ps(row + k, round_to16(_mm512_mul_ps(fp8_steps16(_mm512_loadu_ps(row + k), s), s), kind));
#elif defined(__AVX2__)
            const __m256 s = _mm256_set1_ps(input_scale);
            for (; k + 8 <= K; k += 8)
                _mm256_storeu_ps(row + k, round_to8(_mm256_mul_ps(fp8_steps8(_mm256_loadu_ps(row + k), s), s), kind));
#endif
            for (; k < K; k++) row[k] = fp8_activation(row[k], input_scale, kind);
        }
    }
    return xf;
}

static void round_activations_row(const void *x, int64_t m, int K, int kind, int act_quant, float input_scale,
                                  void *out) {
    float *row = widen_activations((const char *)x + m * K * act_bytes(kind), 1, K, kind, act_quant,
                                   input_scale);
    store_row(out, m * K, row, K, kind);
    free(row);
}

/* Prefill's side of the 8-bit formats (rows of a prompt chunk, where the dense bf16 GEMM is fastest):
 * x rounded as calibrated, in x's dtype (what kernels.fake_quant_activation returns, in one pass instead
 * of five torch ops), and int8 weights widened to bf16 with their row scale folded in (q * scale, rounded
 * once: one pass over the weights, where `.to(bf16)` then scaling the output took two). */
void round_activations(const void *x, int64_t M, int K, int kind, int act_quant, float input_scale, void *out) {
    FOR_ROWS(m, M, 5, round_activations_row(x, m, K, kind, act_quant, input_scale, out));
}

#if defined(__AVX512BF16__)  /* fp8's own kernels' (gemm_fp8, AMX): built where they are */
static void shifted_activations_row(const uint16_t *x, int64_t m, int K, int act_quant, float input_scale,
                                    float shift, uint16_t *xs) {
    const uint16_t *row = x + m * K;
    uint16_t *out = xs + m * K;
    int k = 0;
    if (act_quant == ACT_FP8) {
        const __m512 s = _mm512_set1_ps(input_scale), out_scale = _mm512_set1_ps(input_scale * shift);
        for (; k + 16 <= K; k += 16) {
            const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + k))), 16));
            _mm256_storeu_si256((__m256i *)(out + k), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(fp8_steps16(v, s), out_scale)));
        }
    }
    if (k < K) { /* the rest of the row (or all of it, other roundings): as widen_activations */
        float *rest = widen_activations(row + k, 1, K - k, BF16, act_quant, input_scale);
        for (int i = 0; i < K - k; i++) rest[i] *= shift;
        store_row(out, k, rest, K - k, BF16);
        free(rest);
    }
}

/* fp8's GEMMs take x [M, K] bf16 rounded as calibrated (act_quant at input_scale, as widen_activations rounds it)
 * and times `shift` (a power of two: exact), in bf16, into xs [M, K]. For fp8 activations one pass per 16 values
 * from bf16 to bf16 (times shift folded into the last product: scaling by 2^n before the rounding to bf16 rounds
 * the same), rows split over the threads from 4: at 8 rows the three passes it replaces (widen, scale, narrow,
 * one thread) took 7 of an fp8 decode GEMM call's 22 us (2026-11-26). Bit-identical to them. */
static void shifted_activations(const uint16_t *x, int64_t M, int K, int act_quant, float input_scale, float shift,
                                uint16_t *xs) {
    FOR_ROWS(m, M, 4, shifted_activations_row(x, m, K, act_quant, input_scale, shift, xs));
}
#endif

void widen_int8(const int8_t *w, const float *scale, int N, int K, uint16_t *out) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float row[K];
        for (int k = 0; k < K; k++) row[k] = (float)w[(int64_t)n * K + k] * scale[n];
        store_row(out, (int64_t)n * K, row, K, BF16);
    }
}

INLINE void int8_rows(const float *xf, const int rows, int K, const int8_t *wrow, float *out) {
#ifdef __AVX512F__
    if (rows == 1 && K % 64 == 0) {  /* four independent chains: one would wait on each FMA's latency */
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < K; k += 64) {
            __m512i bytes = _mm512_loadu_si512((const void *)(wrow + k));
            a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_castsi512_si128(bytes))),
                                 _mm512_loadu_ps(xf + k), a0);
            a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(bytes, 1))),
                                 _mm512_loadu_ps(xf + k + 16), a1);
            a2 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(bytes, 2))),
                                 _mm512_loadu_ps(xf + k + 32), a2);
            a3 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(bytes, 3))),
                                 _mm512_loadu_ps(xf + k + 48), a3);
        }
        out[0] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
        return;
    }
    if (rows <= 4 && K % 32 == 0) {  /* two chains per row */
        __m512 a[4], b[4];
        for (int m = 0; m < rows; m++) a[m] = b[m] = _mm512_setzero_ps();
        for (int k = 0; k < K; k += 32) {
            __m256i bytes = _mm256_loadu_si256((const __m256i *)(wrow + k));
            __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(bytes)));
            __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(bytes, 1)));
            for (int m = 0; m < rows; m++) {
                a[m] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xf + (int64_t)m * K + k), a[m]);
                b[m] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xf + (int64_t)m * K + k + 16), b[m]);
            }
        }
        for (int m = 0; m < rows; m++) out[m] = _mm512_reduce_add_ps(_mm512_add_ps(a[m], b[m]));
        return;
    }
    __m512 acc[TILE_M];
    for (int m = 0; m < rows; m++) acc[m] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(wrow + k))));
        for (int m = 0; m < rows; m++) acc[m] = _mm512_fmadd_ps(w, _mm512_loadu_ps(xf + (int64_t)m * K + k), acc[m]);
    }
    for (int m = 0; m < rows; m++) {
        float s = _mm512_reduce_add_ps(acc[m]);
        for (int kk = k; kk < K; kk++) s += xf[(int64_t)m * K + kk] * (float)wrow[kk];
        out[m] = s;
    }
#elif defined(__AVX2__) && defined(__FMA__)
    /* the same on 8 lanes (one chain per row, as the compiler vectorized the loop below, ran at ~7 GB/s a core); the
     * hardware prefetchers alone (prefetching into L2 as the AVX-512 kernels do: 1 / 2 rows 1.36 -> 1.19x / 2.05 ->
     * 1.79x the compiled loop's rate, x86-64-v3 build on the Zen 4, 2026-11-28) */
    if (rows == 1 && K % 32 == 0) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < K; k += 32) {
            const __m256i bytes = _mm256_loadu_si256((const __m256i *)(wrow + k));
            const __m128i lo = _mm256_castsi256_si128(bytes), hi = _mm256_extracti128_si256(bytes, 1);
            a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), _mm256_loadu_ps(xf + k), a0);
            a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(lo, lo))),
                                 _mm256_loadu_ps(xf + k + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), _mm256_loadu_ps(xf + k + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(hi, hi))),
                                 _mm256_loadu_ps(xf + k + 24), a3);
        }
        out[0] = sum8_avx2(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        return;
    }
    if (rows <= 4 && K % 16 == 0) {  /* two chains per row */
        __m256 a[4], b[4];
        for (int m = 0; m < rows; m++) a[m] = b[m] = _mm256_setzero_ps();
        for (int k = 0; k < K; k += 16) {
            const __m128i bytes = _mm_loadu_si128((const __m128i *)(wrow + k));
            const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)),
                         w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(bytes, bytes)));
            for (int m = 0; m < rows; m++) {
                a[m] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xf + (int64_t)m * K + k), a[m]);
                b[m] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xf + (int64_t)m * K + k + 8), b[m]);
            }
        }
        for (int m = 0; m < rows; m++) out[m] = sum8_avx2(_mm256_add_ps(a[m], b[m]));
        return;
    }
    __m256 acc[TILE_M];
    for (int m = 0; m < rows; m++) acc[m] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        const __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(wrow + k))));
        for (int m = 0; m < rows; m++) acc[m] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xf + (int64_t)m * K + k), acc[m]);
    }
    for (int m = 0; m < rows; m++) {
        float s = sum8_avx2(acc[m]);
        for (int kk = k; kk < K; kk++) s += xf[(int64_t)m * K + kk] * (float)wrow[kk];
        out[m] = s;
    }
#else
    for (int m = 0; m < rows; m++) {
        float s = 0.0f;
        #pragma omp simd reduction(+ : s)
        for (int kk = 0; kk < K; kk++) s += xf[(int64_t)m * K + kk] * (float)wrow[kk];
        out[m] = s;
    }
#endif
}

void gemm_int8(const void *x, int64_t M, int K, const int8_t *w, const float *scale, int N, void *y, int kind,
               int act_quant, float input_scale) {
    float *xf = widen_activations(x, M, K, kind, act_quant, input_scale);
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        for (int64_t m0 = 0; m0 < M; m0 += TILE_M) {
            int rows = (int)(M - m0 < TILE_M ? M - m0 : TILE_M);
            float out[TILE_M];
#define INT8_TILE(R) int8_rows(xf + m0 * K, R, K, w + (int64_t)n * K, out)
            FOR_1_TO_8(rows, INT8_TILE)
#undef INT8_TILE
            for (int m = 0; m < rows; m++) {
                float v = out[m] * scale[n];
                if (kind == F32) ((float *)y)[(m0 + m) * N + n] = v;
                else ((uint16_t *)y)[(m0 + m) * N + n] = f32_to_bf16(v);
            }
        }
    }
    free(xf);
}

/* bf16: w [N, K] bf16; x [M, K] bf16 (kept in bf16: AVX512-BF16's dot product takes pairs of bf16 and
 * accumulates in fp32, which is what a bf16 GEMM does; the AVX2 kernels widen both to fp32 exactly and sum with
 * FMAs). Returns 0 where this CPU has neither AVX512-BF16 nor AVX2 + FMA, and the caller keeps F.linear; the int4
 * GEMM with bf16 activations comes with it. */
int gemm_bf16_available(void) {
#if defined(HAVE_GEMM_BF16)
    return 1;
#else
    return 0;
#endif
}

/* fp8 weights on their own kernel (gemm_fp8): AVX512-BF16 only; elsewhere the engine serves them as int8. */
int gemm_fp8_available(void) {
#if defined(__AVX512BF16__)
    return 1;
#else
    return 0;
#endif
}

#if defined(HAVE_AVX2_GEMMS)
/* ---- AVX2 + FMA: the bf16 and int4 decode GEMMs on a CPU without AVX512-BF16 ------------------------------
 * A bf16 is the top half of its fp32: unpacking 16 of them beside zero words gives two vectors of 8 exact fp32
 * (lanes permuted within each 128-bit half, the same way for weights and activations, which a dot product does not
 * mind). Every output row is summed the same way at every row count (four accumulators over k in steps of 32, added
 * in one order at the end), so a row's result does not depend on its batch; rows share the weights' loads in passes
 * of up to AVX2_ROWS (16 vector registers: 4 accumulators a row, 4 weight vectors, the activations). */
#define AVX2_ROWS 2

static inline __m256 bf16_low8(__m256i v) { return _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), v)); }
static inline __m256 bf16_high8(__m256i v) { return _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), v)); }

INLINE void bf16_tile_avx2(const uint16_t *x, const int rows, int K, const uint16_t *wrow, uint16_t *y, int64_t N) {
    __m256 acc[4 * AVX2_ROWS];
    for (int i = 0; i < 4 * rows; i++) acc[i] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 32 <= K; k += 32) {
        /* two rows: the weights 4 KiB ahead into L1 (prefetch_lanes_avx2): whole bf16 steps 0.93 / 0.87 at 8 / 16
         * sequences, both orders (2026-11-28); one row streams faster on the hardware prefetchers alone (1.09-1.15
         * with it in the fast memory state) */
        if (rows > 1) prefetch_lanes_avx2(wrow + k);
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(wrow + k)),
                      w1 = _mm256_loadu_si256((const __m256i *)(wrow + k + 16));
        const __m256 w[4] = {bf16_low8(w0), bf16_high8(w0), bf16_low8(w1), bf16_high8(w1)};
        for (int m = 0; m < rows; m++) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(x + (int64_t)m * K + k)),
                          x1 = _mm256_loadu_si256((const __m256i *)(x + (int64_t)m * K + k + 16));
            acc[4 * m] = _mm256_fmadd_ps(w[0], bf16_low8(x0), acc[4 * m]);
            acc[4 * m + 1] = _mm256_fmadd_ps(w[1], bf16_high8(x0), acc[4 * m + 1]);
            acc[4 * m + 2] = _mm256_fmadd_ps(w[2], bf16_low8(x1), acc[4 * m + 2]);
            acc[4 * m + 3] = _mm256_fmadd_ps(w[3], bf16_high8(x1), acc[4 * m + 3]);
        }
    }
    for (int m = 0; m < rows; m++) {
        float s = sum8_avx2(_mm256_add_ps(_mm256_add_ps(acc[4 * m], acc[4 * m + 1]),
                                          _mm256_add_ps(acc[4 * m + 2], acc[4 * m + 3])));
        for (int kk = k; kk < K; kk++) s += bf16_to_f32(wrow[kk]) * bf16_to_f32(x[(int64_t)m * K + kk]);
        y[(int64_t)m * N] = f32_to_bf16(s);
    }
}

static inline int bf16_unit(int64_t M, int K, int N) {
    (void)M, (void)K, (void)N;
    return 1;
}

static inline void bf16_rows(const uint16_t *x, int64_t M, int K, const uint16_t *w, int N, uint16_t *y, int n0,
                             int n1) {
    for (int n = n0; n < n1; n++)
        for (int64_t m0 = 0; m0 < M; m0 += AVX2_ROWS) {
            if (M - m0 >= 2) bf16_tile_avx2(x + m0 * K, 2, K, w + (int64_t)n * K, y + m0 * N + n, N);
            else bf16_tile_avx2(x + m0 * K, 1, K, w + (int64_t)n * K, y + m0 * N + n, N);
        }
}

/* int4 (gemm_int4's layout: per 64 k, byte i holds k0 + i low and k0 + 32 + i high, as q + 8) against bf16
 * activations widened to fp32 once per call (xf [M, K], k in order): the nibbles become q as int8 (a mask, a shift,
 * a subtraction of 8 for 32 at once), then 8 at a time int32 and fp32 for an FMA into four accumulators a row, a
 * group's sums times its scale. The same per row at every row count. Only with `engine.int4_activations: bf16` on
 * AVX2: by default the int4 formats take the int4 x int8 kernel below (HAVE_GEMM_INT4_A8). */
INLINE void int4_tile_avx2(const float *xf, const int rows, int K, const uint8_t *wrow, const float *s, int group,
                           uint16_t *y, int64_t N) {
    const __m256i low = _mm256_set1_epi8(15), eight = _mm256_set1_epi8(8);
    __m256 acc[AVX2_ROWS], part[4 * AVX2_ROWS];
    for (int m = 0; m < rows; m++) acc[m] = _mm256_setzero_ps();
    for (int g0 = 0; g0 < K; g0 += group) {
        for (int i = 0; i < 4 * rows; i++) part[i] = _mm256_setzero_ps();
        for (int k = g0; k < g0 + group; k += 64) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(wrow + k / 2));
            const __m256i q[2] = {_mm256_sub_epi8(_mm256_and_si256(v, low), eight),
                                  _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), eight)};
            __m256 wf[8]; /* k0 + 8 j .. k0 + 8 j + 7 */
            for (int h = 0; h < 2; h++) {
                const __m128i a = _mm256_castsi256_si128(q[h]), b = _mm256_extracti128_si256(q[h], 1);
                wf[4 * h] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a));
                wf[4 * h + 1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(a, a)));
                wf[4 * h + 2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
                wf[4 * h + 3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(b, b)));
            }
            for (int m = 0; m < rows; m++) {
                const float *xm = xf + (int64_t)m * K + k;
                for (int j = 0; j < 8; j++)
                    part[4 * m + j % 4] = _mm256_fmadd_ps(wf[j], _mm256_loadu_ps(xm + 8 * j), part[4 * m + j % 4]);
            }
        }
        for (int m = 0; m < rows; m++) {
            const __m256 p = _mm256_add_ps(_mm256_add_ps(part[4 * m], part[4 * m + 1]),
                                           _mm256_add_ps(part[4 * m + 2], part[4 * m + 3]));
            acc[m] = _mm256_fmadd_ps(p, _mm256_set1_ps(s[g0 / group]), acc[m]);
        }
    }
    for (int m = 0; m < rows; m++) y[(int64_t)m * N] = f32_to_bf16(sum8_avx2(acc[m]));
}

static void gemm_int4_avx2(const uint16_t *x, int64_t M, int K, const uint8_t *w, const float *scales, int group,
                           int N, uint16_t *y) {
    float *xf = malloc(sizeof(float) * M * K);
    for (int64_t i = 0; i < M * K; i++) xf[i] = bf16_to_f32(x[i]);
    const int groups = K / group;
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int64_t m0 = 0; m0 < M; m0 += AVX2_ROWS) {
            const uint8_t *wrow = w + (int64_t)n * (K / 2);
            const float *srow = scales + (int64_t)n * groups;
            if (M - m0 >= 2) int4_tile_avx2(xf + m0 * K, 2, K, wrow, srow, group, y + m0 * N + n, N);
            else int4_tile_avx2(xf + m0 * K, 1, K, wrow, srow, group, y + m0 * N + n, N);
        }
    free(xf);
}
#endif

#if defined(__AVX512BF16__)
/* The full sums of four accumulators (lanes 0-3), by the transpose-add tree the attention scores use. Every
 * bf16 output is summed in this one order, by bf16_tile (sum_four(a, a, a, a)) as by bf16_block, so a row's
 * result does not depend on the batch it came in (which kernel its row count picked). */
static inline __m128 sum_four(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m512 q = tree_quad(tree_pair(a, b), tree_pair(c, d)); /* per 128-bit lane [a b c d] partial sums */
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(q), _mm512_extractf32x8_ps(q, 1));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

INLINE void bf16_tile(const uint16_t *x, const int rows, int K, const uint16_t *wrow, uint16_t *y, int64_t N) {
    __m512 acc[TILE_M];
    for (int m = 0; m < rows; m++) acc[m] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 32 <= K; k += 32) {
        /* 1-2 rows: the hardware prefetchers alone stream faster (whole bf16 steps at 1 / 2 sequences -22 / -5..-8 %
         * against prefetching into L2, more where the VM's memory runs fast; 2026-11-26, alternating in one process).
         * fp8, INT8-SQ and int4 do more work per byte and keep theirs (without: fp8 +4 %, int4 GEMVs at half speed). */
        if (rows > 2) prefetch_weights(wrow + k, 1, 2 * (int64_t)K);
        __m512bh wv = (__m512bh)_mm512_loadu_si512((const void *)(wrow + k));
        for (int m = 0; m < rows; m++)
            acc[m] = _mm512_dpbf16_ps(acc[m], wv, (__m512bh)_mm512_loadu_si512((const void *)(x + m * K + k)));
    }
    for (int m = 0; m < rows; m++) {
        float s = _mm_cvtss_f32(sum_four(acc[m], acc[m], acc[m], acc[m]));
        for (int kk = k; kk < K; kk++) s += bf16_to_f32(wrow[kk]) * bf16_to_f32(x[m * K + kk]);
        y[m * N] = f32_to_bf16(s);
    }
}

/* From BF16_BLOCK_MIN rows: `rows` (up to 6) activation rows against 4 weight rows at once, 24 accumulators
 * beside the 4 weight vectors and an activation vector in the 32 registers. Each activation load feeds 4 dot
 * products (bf16_tile's feeds one, with a weight load per 8), and 4 outputs share one reduction tree. Whole
 * GEMMs of a `small` decode step, streaming, on the 2-core Zen 4 (2026-11-26, alternating in one process):
 * 8 rows 0-10 %, 10 rows 18 %, 16 rows 27 %, 32 rows 44 % faster than bf16_tile; at 4-7 rows (memory-bound)
 * 3-6 % slower, so those stay on bf16_tile. Whole bf16 decode steps: 8 / 12 / 16 sequences 2 / 25 / 21 %. */
#define BF16_BLOCK_ROWS 6
#define BF16_BLOCK_MIN 8
INLINE void bf16_block(const uint16_t *x, const int rows, int K, const uint16_t *w, uint16_t *y, int64_t N) {
    __m512 acc[4 * BF16_BLOCK_ROWS];
    for (int i = 0; i < 4 * rows; i++) acc[i] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 32) {
        __m512bh wv[4];
        for (int j = 0; j < 4; j++) {
            prefetch_weights(w + (int64_t)j * K + k, 1, 4 * 2 * (int64_t)K);
            wv[j] = (__m512bh)_mm512_loadu_si512((const void *)(w + (int64_t)j * K + k));
        }
        for (int m = 0; m < rows; m++) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512((const void *)(x + (int64_t)m * K + k));
            for (int j = 0; j < 4; j++) acc[m * 4 + j] = _mm512_dpbf16_ps(acc[m * 4 + j], wv[j], xv);
        }
    }
    for (int m = 0; m < rows; m++) {
        float sums[4];
        _mm_storeu_ps(sums, sum_four(acc[m * 4], acc[m * 4 + 1], acc[m * 4 + 2], acc[m * 4 + 3]));
        for (int j = 0; j < 4; j++) y[m * N + j] = f32_to_bf16(sums[j]);
    }
}
#endif

#if defined(__AVX512BF16__)
/* Weight rows gemm_bf16 takes at a time (its unit of work): 4 in the 6x4 blocks from BF16_BLOCK_MIN rows, else 1. */
static inline int bf16_unit(int64_t M, int K, int N) {
    return M >= BF16_BLOCK_MIN && N % 4 == 0 && K % 32 == 0 ? 4 : 1;
}

/* gemm_bf16's output rows n0 .. n1 - 1 (n0 a multiple of bf16_unit). */
static inline void bf16_rows(const uint16_t *x, int64_t M, int K, const uint16_t *w, int N, uint16_t *y, int n0,
                             int n1) {
    if (bf16_unit(M, K, N) == 4) {
        const int64_t per_pass = rows_per_pass(M, BF16_BLOCK_ROWS);
        for (int n = n0; n < n1; n += 4)
            for (int64_t m0 = 0; m0 < M; m0 += per_pass) {
                int rows = (int)(M - m0 < per_pass ? M - m0 : per_pass);
#define BF16_BLOCK(R) bf16_block(x + m0 * K, R, K, w + (int64_t)n * K, y + m0 * N + n, N)
                FOR_1_TO_6(rows, BF16_BLOCK)
#undef BF16_BLOCK
            }
        return;
    }
    for (int n = n0; n < n1; n++) {
        const uint16_t *wrow = w + (int64_t)n * K;
        for (int64_t m0 = 0; m0 < M; m0 += TILE_M) {
            int rows = (int)(M - m0 < TILE_M ? M - m0 : TILE_M);
#define BF16_TILE(R) bf16_tile(x + m0 * K, R, K, wrow, y + m0 * N + n, N)
            FOR_1_TO_8(rows, BF16_TILE)
#undef BF16_TILE
        }
    }
}
#endif

void gemm_bf16(const uint16_t *x, int64_t M, int K, const uint16_t *w, int N, uint16_t *y) {
#if defined(HAVE_GEMM_BF16)
    const int unit = bf16_unit(M, K, N);
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n += unit) bf16_rows(x, M, K, w, N, y, n, n + unit);
#else
    (void)x; (void)M; (void)K; (void)w; (void)N; (void)y;
#endif
}

/* int4: w [N, K/2] bytes; within each 64 consecutive k, byte i holds k0+i in its low nibble and k0+32+i in
 * its high nibble, each stored as q + 8 for q in [-8, 7]; scales [N, K/group] fp32; group a multiple of 64.
 * A nibble becomes the bf16 of q by one 32-entry table permute (vpermw), then AVX512-BF16 dot products
 * with the bf16 activations: 64 weights cost a load, two masks, two permutes and two dot products per row,
 * where widening each nibble to fp32 for an FMA (tried first) ran at a third of torch's kernel. */
#if defined(__AVX512BF16__)
static inline __m512i int4_table(void) {
    /* bf16 of -8 .. 7 at indices 0 .. 15 (and again at 16 .. 31: indices only use 4 bits) */
    static const uint16_t bf16_of[16] = {0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,
                                         0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0};
    uint16_t t[32];
    for (int i = 0; i < 32; i++) t[i] = bf16_of[i & 15];
    return _mm512_loadu_si512((const void *)t);
}

/* `rows` activation rows against `nb` consecutive output rows (weights), both compile-time constants so the
 * rows * nb accumulators stay in registers. nb > 1 at one or two activation rows: one output row alone is a
 * single chain of dependent dot products (latency-bound: 1 row ran slower than 2), and the activation loads
 * are shared by the nb weight rows. */
INLINE void int4_block(const uint16_t *x, const int rows, const int nb, int K, const uint8_t *w, const float *s,
                       int group, __m512i table, uint16_t *y, int64_t N) {
    const __m512i low = _mm512_set1_epi16(15);
    const int64_t wstride = K / 2, groups = K / group;
    const int streaming = rows <= 2; /* few rows: memory-bound, prefetched into L2 once per cache line */
    __m512 acc[TILE_M], part[TILE_M];
    for (int i = 0; i < rows * nb; i++) acc[i] = _mm512_setzero_ps();
    for (int g0 = 0; g0 < K; g0 += group) {
        for (int i = 0; i < rows * nb; i++) part[i] = _mm512_setzero_ps();
        for (int k = g0; k < g0 + group; k += 64) {
            for (int j = 0; j < nb; j++) {
                /* several activation rows (nb 1): every 32 bytes into L1; one or two: once per cache line */
                if (!streaming || (k & 127) == 0) prefetch_weights(w + j * wstride + k / 2, streaming, nb * wstride);
                __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(w + j * wstride + k / 2)));
                __m512bh w0 = (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(bytes, low), table);
                __m512bh w1 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), table);
                for (int m = 0; m < rows; m++) {
                    const uint16_t *xm = x + m * K + k;
                    part[m * nb + j] = _mm512_dpbf16_ps(part[m * nb + j], w0, (__m512bh)_mm512_loadu_si512((const void *)xm));
                    part[m * nb + j] =
                        _mm512_dpbf16_ps(part[m * nb + j], w1, (__m512bh)_mm512_loadu_si512((const void *)(xm + 32)));
                }
            }
        }
        for (int j = 0; j < nb; j++) {
            __m512 sc = _mm512_set1_ps(s[j * groups + g0 / group]);
            for (int m = 0; m < rows; m++) acc[m * nb + j] = _mm512_fmadd_ps(part[m * nb + j], sc, acc[m * nb + j]);
        }
    }
    for (int m = 0; m < rows; m++)
        for (int j = 0; j < nb; j++) y[m * N + j] = f32_to_bf16(_mm512_reduce_add_ps(acc[m * nb + j]));
}
#endif

#ifdef __AVX512F__
/* The lanes kernels' store mask: the first `live` of a block's 16 output rows are real (the rest are padding). */
static inline __mmask16 lanes_live(int live) {
    return live >= 16 ? (__mmask16)0xFFFF : live <= 0 ? (__mmask16)0 : (__mmask16)((1u << live) - 1);
}

/* The first `live` of v's 16 lanes to bf16 at y (rounded to nearest even). */
static inline void store_lanes(__m512 v, uint16_t *y, int live) {
#if defined(__AVX512BF16__)
    _mm256_mask_storeu_epi16((void *)y, lanes_live(live), (__m256i)_mm512_cvtneps_pbh(v));
#else  /* VNNI without AVX512-BF16 (Cascade Lake, Ice Lake): the same rounding, lane by lane */
    float lanes[16];
    _mm512_storeu_ps(lanes, v);
    store_row(y, 0, lanes, live < 16 ? live : 16, BF16);
#endif
}
#endif

/* 32 bytes of pack_int4's layout (low nibbles k0 + i, high ones k0 + 32 + i) → 64 bf16 weights q * s, rounded once */
static inline void unpack_64(const uint8_t *bytes, float s, uint16_t *out) {
#if defined(__AVX512BF16__)
    for (int i0 = 0; i0 < 32; i0 += 16) {
        __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(bytes + i0)));
        __m512i eight = _mm512_set1_epi32(8);
        __m512 lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(b, _mm512_set1_epi32(15)), eight));
        __m512 hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(b, 4), eight));
        _mm256_storeu_si256((__m256i *)(out + i0), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(lo, _mm512_set1_ps(s))));
        _mm256_storeu_si256((__m256i *)(out + 32 + i0), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(hi, _mm512_set1_ps(s))));
    }
#else
    for (int i = 0; i < 32; i++) {
        out[i] = f32_to_bf16((float)((bytes[i] & 15) - 8) * s);
        out[32 + i] = f32_to_bf16((float)((bytes[i] >> 4) - 8) * s);
    }
#endif
}

/* ---- int4 x int8 on VNNI: INT4-AWQ's and W4A8's decode rows -----------------------------------------------
 * The bf16 int4 kernel below spends, per 64 weights and row, a widening load, two masks, two table permutes and
 * two dot products; the permutes run on two of Zen 4's four vector pipes, and the kernel topped out near 38 GB/s
 * of int4 on this 2-core machine with the weights in cache. Here the nibbles, stored as q + 8 (0..15), are
 * vpdpbusd's unsigned operand as they lie: a mask for the low ones, a shift and a mask for the high ones, against
 * the activations rounded to int8 per 128 of k (each 128's max |x| / 127: as llama.cpp rounds them against q4_0
 * in blocks of 32; ModelOpt's INT4-AWQ keeps them in 16 bits and W4A8 in fp8, so this is one more rounding
 * (W4A8's after its fp8 one), held to a stated tolerance in tests/test_model_runner.py; int4_activations: bf16
 * keeps the exact kernel). sum (q + 8) a = sum q a + 8 sum a: each 128's integer sum starts at -8 sum a.
 *
 * Output rows in the vector lanes (pack_int4_lanes): per block of 16 weight rows and 128 inputs, 16 vectors of
 * 64 bytes, vector d holding in lane n the bytes 4d .. 4d+3 of pack_int4's 64 for row n. One vpdpbusd against the
 * broadcast 4 activation bytes that pair with them then adds 4 products to each of 16 rows' sums, and a 128's sums
 * leave for fp32 once per 16 outputs (convert, the two scales' product, an FMA), where the kernel with each row's
 * partial sums across the lanes (before 2026-11-27) paid those three per output row and 128: 12-17 % of its time
 * in cache at one row, and at 16 rows most of it (int4 steps slower than bf16's there). The weights of a block are
 * read once per pass of up to 8 activation rows. The 128's sum is an integer, exact in any order, and each output's
 * fp32 accumulation runs 128 by 128 in k order at every row count: a row's outputs do not depend on the batch.
 * x bf16 [M, K] (fp8_scale > 0: rounded to fp8 at that scale first, W4A8); w pack_int4_lanes' bytes; scales
 * lane_scales' [N / 16][K / group][16] fp32; group a multiple of 128; N padded to 16 in w and scales, y [M, N]
 * the N real rows. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define HAVE_GEMM_INT4_A8 1

/* x [K] bf16 → xq [K] int8 in the weights' nibble order (per 128 k: k 0-31 and 64-95 for the low nibbles, then
 * 32-63 and 96-127 for the high ones), xs [K / 128] their scales, x8 [K / 128] -8 times each 128's sum of xq.
 * fp8_scale > 0 (W4A8): x first rounded to fp8 at that scale, in bf16, as widen_activations rounds it, in the same
 * pass (a step's separate rounding, one thread over all rows, cost W4A8 0.05 ms per sequence over INT4-AWQ). */
static void quantize_int4_activations(const uint16_t *x, int K, int8_t *xq, float *xs, int32_t *x8, float fp8_scale) {
    const __m512 fs = _mm512_set1_ps(fp8_scale);
    for (int c = 0; c < K; c += 128) {
        __m512 v[8], amax = _mm512_setzero_ps();
        for (int part = 0; part < 8; part++) {
            v[part] = load16(x, c + 16 * part, BF16, 1.0f);
            if (fp8_scale > 0.0f) v[part] = round_to16(_mm512_mul_ps(fp8_steps16(v[part], fs), fs), BF16);
            amax = _mm512_max_ps(amax, _mm512_abs_ps(v[part]));
        }
        const float m = _mm512_reduce_max_ps(amax), s = m > 0.0f ? m / 127.0f : 1.0f;
        const __m512 inv = _mm512_set1_ps(1.0f / s);
        __m512i sum = _mm512_setzero_si512();
        for (int part = 0; part < 8; part++) { /* k = c + 16 part: the 32-wide quarter part / 2 of the 128 */
            const int quarter = part / 2, at = c + (quarter % 2) * 64 + (quarter / 2) * 32 + (part % 2) * 16;
            const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v[part], inv));
            sum = _mm512_add_epi32(sum, q);
            _mm_storeu_si128((__m128i *)(xq + at), _mm512_cvtepi32_epi8(q));
        }
        x8[c / 128] = -8 * _mm512_reduce_add_epi32(sum);
        xs[c / 128] = s;
    }
}

/* `rows` activation rows (a constant: their sums stay in registers) against one block of 16 weight rows, of which
 * the first `valid` are real. One or two rows split their 32 dot products per 128 over 4 chains (one chain waits
 * on each instruction's latency). */
INLINE void int4_lanes_block(const int8_t *xq, const float *xs, const int32_t *x8, const int rows, int K, int group,
                             const uint8_t *wb, const float *sb, uint16_t *y, int64_t N, int valid) {
    const __m512i low = _mm512_set1_epi8(15), high = _mm512_set1_epi8((char)0xf0);
    const int64_t chunks = K / 128, per_group = group / 128;
    /* one or two rows: the odd chains take only high nibbles, which they multiply in place (16 times their value,
     * one instruction fewer per 64 bytes than shifting them down) and divide by 16 once per 128 of k, exactly */
    const int chains = rows == 1 ? 4 : rows == 2 ? 2 : 1, high_in_place = chains > 1;
    __m512 f[8];
    for (int m = 0; m < rows; m++) f[m] = _mm512_setzero_ps();
    const float *sg = sb;
    for (int64_t c = 0, in_group = 0; c < chunks; c++) {
        const uint8_t *wc = wb + c * 1024;
        __m512i a[8];
        for (int m = 0; m < rows; m++)
            for (int h = 0; h < chains; h++) a[m * chains + h] = h ? _mm512_setzero_si512() : _mm512_set1_epi32(x8[m * chunks + c]);
        for (int d = 0; d < 16; d++) {
            prefetch_lanes(wc + d * 64, rows);
            const __m512i v = _mm512_loadu_si512((const void *)(wc + d * 64));
            const __m512i lo = _mm512_and_si512(v, low),
                          hi = high_in_place ? _mm512_and_si512(v, high) : _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            const int h0 = (2 * d) % chains, h1 = (2 * d + 1) % chains;
            for (int m = 0; m < rows; m++) {
                const int8_t *xm = xq + (int64_t)m * K + c * 128 + 4 * d;
                int32_t x_lo, x_hi;
                memcpy(&x_lo, xm, 4), memcpy(&x_hi, xm + 64, 4);
                a[m * chains + h0] = _mm512_dpbusd_epi32(a[m * chains + h0], lo, _mm512_set1_epi32(x_lo));
                a[m * chains + h1] = _mm512_dpbusd_epi32(a[m * chains + h1], hi, _mm512_set1_epi32(x_hi));
            }
        }
        const __m512 sw = _mm512_loadu_ps(sg);
        if (++in_group == per_group) in_group = 0, sg += 16;  /* no division per 128 of k */
        for (int m = 0; m < rows; m++) {
            __m512i sum = a[m * chains];
            if (high_in_place) {
                __m512i highs = a[m * chains + 1];
                for (int h = 3; h < chains; h += 2) highs = _mm512_add_epi32(highs, a[m * chains + h]);
                for (int h = 2; h < chains; h += 2) sum = _mm512_add_epi32(sum, a[m * chains + h]);
                sum = _mm512_add_epi32(sum, _mm512_srai_epi32(highs, 4));
            }
            f[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(sw, _mm512_set1_ps(xs[m * chunks + c])), f[m]);
        }
    }
    for (int m = 0; m < rows; m++) store_lanes(f[m], y + (int64_t)m * N, valid);
}

/* ---- int8 x int8 per 128 on VNNI: fp8 weights where fp8's own kernel cannot run (Cascade Lake, Ice Lake; see the
 * AVX2 kernel, int8_a8_block, for why): the same layout, activations and integers, vpdpbusd taking the weights as
 * the unsigned operand w ^ 0x80 = w + 128, so each 128's sum starts at -128 sum q = 16 x8 (x8 = -8 sum q); the same
 * fp32 operations per output as the AVX2 kernel's, so the same bits. One or two rows split each 128 over 4 or 2
 * chains (one chain waits on each instruction's latency). */
#define HAVE_GEMM_INT8_A8 1
INLINE void int8_a8_block(const int8_t *xq, const float *xs, const int32_t *x8, const int rows, int K,
                          const int8_t *wb, const float *sb, uint16_t *y, int64_t N, int valid) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const int64_t chunks = K / 128;
    const int chains = rows == 1 ? 4 : rows == 2 ? 2 : 1;
    __m512 f[8];
    for (int m = 0; m < rows; m++) f[m] = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; c++) {
        const int8_t *wc = wb + c * 2048;
        __m512i a[8];
        for (int m = 0; m < rows; m++)
            for (int h = 0; h < chains; h++)
                a[m * chains + h] = h ? _mm512_setzero_si512() : _mm512_set1_epi32(16 * x8[m * chunks + c]);
        for (int d0 = 0; d0 < 32; d0 += 4)
            for (int u = 0; u < 4; u++) {  /* u % chains: a constant once unrolled, so the chains stay in registers */
                const int d = d0 + u, h = u % chains;
                prefetch_lanes(wc + d * 64, rows);
                const __m512i w = _mm512_xor_si512(_mm512_loadu_si512((const void *)(wc + d * 64)), flip);
                for (int m = 0; m < rows; m++) {
                    int32_t xv;
                    memcpy(&xv, xq + (int64_t)m * K + c * 128 + 4 * d, 4);
                    a[m * chains + h] = _mm512_dpbusd_epi32(a[m * chains + h], w, _mm512_set1_epi32(xv));
                }
            }
        for (int m = 0; m < rows; m++) {
            __m512i sum = a[m * chains];
            for (int h = 1; h < chains; h++) sum = _mm512_add_epi32(sum, a[m * chains + h]);
            f[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(xs[m * chunks + c]), f[m]);
        }
    }
    const __m512 scale = _mm512_loadu_ps(sb);
    for (int m = 0; m < rows; m++) store_lanes(_mm512_mul_ps(f[m], scale), y + (int64_t)m * N, valid);
}

/* The output blocks b0 .. b1 - 1 (16 rows each) of gemm_int8_a8 from its quantized activations. */
static inline void int8_a8_blocks(const int8_t *xq, const float *xs, const int32_t *x8, int64_t M, int K,
                                  const int8_t *w, const float *scale, int N, uint16_t *y, int64_t b0, int64_t b1) {
    const int64_t chunks = K / 128, per_pass = rows_per_pass(M, 8);
    for (int64_t b = b0; b < b1; b++) {
        const int valid = N - 16 * b < 16 ? (int)(N - 16 * b) : 16;
        for (int64_t m0 = 0; m0 < M; m0 += per_pass) {
            const int rows = (int)(M - m0 < per_pass ? M - m0 : per_pass);
#define I8_BLOCK(R) int8_a8_block(xq + m0 * K, xs + m0 * chunks, x8 + m0 * chunks, R, K, w + b * 16 * K, \
                                  scale + 16 * b, y + m0 * N + 16 * b, N, valid)
            FOR_1_TO_8(rows, I8_BLOCK)
#undef I8_BLOCK
        }
    }
}

/* The output blocks b0 .. b1 - 1 (16 rows each) of gemm_int4_a8 from its quantized activations. */
static inline void int4_a8_blocks(const int8_t *xq, const float *xs, const int32_t *x8, int64_t M, int K,
                                  const uint8_t *w, const float *scales, int group, int N, uint16_t *y, int64_t b0,
                                  int64_t b1) {
    const int64_t chunks = K / 128, groups = K / group, per_pass = rows_per_pass(M, 8);
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *wb = w + b * chunks * 1024;
        const float *sb = scales + b * groups * 16;
        const int valid = N - 16 * b < 16 ? (int)(N - 16 * b) : 16;
        for (int64_t m0 = 0; m0 < M; m0 += per_pass) {
            const int rows = (int)(M - m0 < per_pass ? M - m0 : per_pass);
#define A8_LANES(R) int4_lanes_block(xq + m0 * K, xs + m0 * chunks, x8 + m0 * chunks, R, K, group, wb, sb, \
                                     y + m0 * N + 16 * b, N, valid)
            FOR_1_TO_8(rows, A8_LANES)
#undef A8_LANES
        }
    }
}

#elif defined(__AVX2__) && defined(__FMA__)
#define HAVE_GEMM_INT4_A8 1
/* ---- the same on AVX2 (a CPU without AVX-512: Zen 2 and 3, Intel's client cores) ------------------------------
 * The same layout, activations and sums: each 64-byte vector of a block is two halves of 8 output rows; vpmaddubsw
 * multiplies the nibbles (unsigned) by the activation bytes and adds pairs in 16 bits (at most 2 x 15 x 127, no
 * saturation), the low and high nibbles' pairs are added in 16 bits, and vpmaddwd against ones adds those pairs into
 * the 32-bit sums: the same integers as vpdpbusd's, and each output's fp32 accumulation the same operations in the
 * same order, so the outputs are the AVX-512 kernel's bits. */

/* quantize_int4_activations on 8 lanes (W4A8's fp8 rounding as widen_activations rounds) */
static void quantize_int4_activations(const uint16_t *x, int K, int8_t *xq, float *xs, int32_t *x8, float fp8_scale) {
    float v[128];
    for (int c = 0; c < K; c += 128) {
        load_row(v, x, c, 128, BF16, 1.0f);
        const __m256 fs = _mm256_set1_ps(fp8_scale);
        if (fp8_scale > 0.0f)
            for (int k = 0; k < 128; k += 8)
                _mm256_storeu_ps(v + k, round_to8(_mm256_mul_ps(fp8_steps8(_mm256_loadu_ps(v + k), fs), fs), BF16));
        __m256 amax = _mm256_setzero_ps();
        const __m256 sign = _mm256_set1_ps(-0.0f);
        for (int k = 0; k < 128; k += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + k)));
        const float m = max8_avx2(amax), s = m > 0.0f ? m / 127.0f : 1.0f;
        const __m256 inv = _mm256_set1_ps(1.0f / s);
        __m256i sum = _mm256_setzero_si256();
        for (int part = 0; part < 16; part++) { /* k = c + 8 part, into the weights' nibble order as the AVX-512 one */
            const int sixteen = part / 2, quarter = sixteen / 2;
            const int at = c + (quarter % 2) * 64 + (quarter / 2) * 32 + (sixteen % 2) * 16 + (part % 2) * 8;
            const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 8 * part), inv));
            sum = _mm256_add_epi32(sum, q);
            const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
            _mm_storel_epi64((__m128i *)(xq + at), _mm_packs_epi16(q16, q16));
        }
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        x8[c / 128] = -8 * _mm_cvtsi128_si32(s4);
        xs[c / 128] = s;
    }
}

/* `rows` activation rows (a constant: the sums stay in registers) against a block of 16 weight rows, the first `valid`
 * real: each 64-byte vector is two halves of 8 output rows, taken together so that the block streams in one pass and
 * each row's broadcast bytes serve both (half by half, each a pass over every line of the block re-broadcasting the
 * bytes, whole steps of `small` ran 1.15-1.2x as long at 1-4 sequences, 2026-11-28). */
INLINE void int4_lanes_block(const int8_t *xq, const float *xs, const int32_t *x8, const int rows, int K, int group,
                             const uint8_t *wb, const float *sb, uint16_t *y, int64_t N, int valid) {
    const __m256i low = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const int64_t chunks = K / 128, per_group = group / 128;
    __m256 f[8];  /* [row][half]; touched once per 128 inputs, so spilling them costs little */
    for (int i = 0; i < 2 * rows; i++) f[i] = _mm256_setzero_ps();
    const float *sg = sb;
    for (int64_t c = 0, in_group = 0; c < chunks; c++) {
        const uint8_t *wc = wb + c * 1024;
        __m256i a[8];
        for (int i = 0; i < 2 * rows; i++) a[i] = _mm256_set1_epi32(x8[i / 2 * chunks + c]);
        for (int d = 0; d < 16; d++) {
            prefetch_lanes_avx2(wc + d * 64);
            __m256i lo[2], hi[2];
            for (int h = 0; h < 2; h++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(wc + d * 64 + 32 * h));
                lo[h] = _mm256_and_si256(v, low), hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            }
            for (int m = 0; m < rows; m++) {
                const int8_t *xm = xq + (int64_t)m * K + c * 128 + 4 * d;
                int32_t x_lo, x_hi;
                memcpy(&x_lo, xm, 4), memcpy(&x_hi, xm + 64, 4);
                const __m256i bl = _mm256_set1_epi32(x_lo), bh = _mm256_set1_epi32(x_hi);
                for (int h = 0; h < 2; h++) {
                    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], bl), _mm256_maddubs_epi16(hi[h], bh));
                    a[2 * m + h] = _mm256_add_epi32(a[2 * m + h], _mm256_madd_epi16(pairs, ones));
                }
            }
        }
        for (int i = 0; i < 2 * rows; i++)
            f[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[i]),
                                   _mm256_mul_ps(_mm256_loadu_ps(sg + 8 * (i % 2)), _mm256_set1_ps(xs[i / 2 * chunks + c])),
                                   f[i]);
        if (++in_group == per_group) in_group = 0, sg += 16;
    }
    for (int m = 0; m < rows; m++) {
        float out[16];
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(out + 8 * h, f[2 * m + h]);
        store_row(y, (int64_t)m * N, out, valid, BF16);
    }
}

static inline void int4_a8_blocks(const int8_t *xq, const float *xs, const int32_t *x8, int64_t M, int K,
                                  const uint8_t *w, const float *scales, int group, int N, uint16_t *y, int64_t b0,
                                  int64_t b1) {
    const int64_t chunks = K / 128, groups = K / group, per_pass = rows_per_pass(M, 4);
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *wb = w + b * chunks * 1024;
        const float *sb = scales + b * groups * 16;
        const int valid = N - 16 * b < 16 ? (int)(N - 16 * b) : 16;
        for (int64_t m0 = 0; m0 < M; m0 += per_pass) {
            const int rows = (int)(M - m0 < per_pass ? M - m0 : per_pass);
#define A8_LANES(R) int4_lanes_block(xq + m0 * K, xs + m0 * chunks, x8 + m0 * chunks, R, K, group, wb, sb, \
                                     y + m0 * N + 16 * b, N, valid)
            FOR_1_TO_4(rows, A8_LANES)
#undef A8_LANES
        }
    }
}

/* ---- int8 x int8 per 128 on AVX2: fp8 weights where fp8's own kernel cannot run -------------------------------
 * Without AVX512-BF16 fp8's weights are served as int8 per output row (kernels.fp8_as_int8) and their activations,
 * once rounded to fp8 as ModelOpt calibrated them, are fp8 values, not integers: INT8-SQ's kernel cannot take them
 * and the widening kernel ran compute-bound (0.73x bf16's step at one sequence, slower than bf16 at eight). Here
 * they are rounded to int8 per 128 inputs as the int4 x int8 kernel rounds them (quantize_int4_activations, W4A8's
 * fp8 rounding in the same pass; llama.cpp's q8_0 x q8_0 likewise, in blocks of 32), and each 128's products summed
 * exactly in integers: |q| against the weights carrying q's sign (vpsignb; the weights avoid -128, as fp8_as_int8
 * rounds them to +-127), vpmaddubsw's pairs (at most 2 x 127 x 127) and vpmaddwd into 32 bits; each 128's sum times
 * its activation scale added in fp32 in k order, times the row's scale at the end. The layout is INT8-SQ's lanes
 * (pack_int8_lanes: vector d holds weights 4d .. 4d+3 of 16 rows) with each 128's inputs in the activations' nibble
 * order (native_kernels.pack_int8_a8): quantize_int4_activations stores inputs 32-63 and 64-95 of each 128 swapped.
 * w [N padded to 16, K] int8, scale [N padded] fp32, K a multiple of 128; a row's outputs do not depend on the batch. */
#define HAVE_GEMM_INT8_A8 1
/* `rows` activation rows (a constant) against a block of 16 weight rows, the first `valid` real, both halves of each
 * vector together as int4_lanes_block's: each row's broadcast bytes and their |q| serve the block's two vectors and
 * the block streams in one pass (half by half, a batch-1 fp8 step ran 1.30x as long and a 4-sequence one 1.4x). */
INLINE void int8_a8_block(const int8_t *xq, const float *xs, const int rows, int K, const int8_t *wb, const float *sb,
                          uint16_t *y, int64_t N, int valid) {
    const int64_t chunks = K / 128;
    __m256 f[8];  /* [row][half] */
    for (int i = 0; i < 2 * rows; i++) f[i] = _mm256_setzero_ps();
    for (int64_t c = 0; c < chunks; c++) {
        const int8_t *wc = wb + c * 2048;
        __m256i a[8];
        for (int i = 0; i < 2 * rows; i++) a[i] = _mm256_setzero_si256();
        for (int d = 0; d < 32; d++) {
            prefetch_lanes_avx2(wc + d * 64);
            const __m256i w[2] = {_mm256_loadu_si256((const __m256i *)(wc + d * 64)),
                                  _mm256_loadu_si256((const __m256i *)(wc + d * 64 + 32))};
            for (int m = 0; m < rows; m++) {
                int32_t xv;
                memcpy(&xv, xq + (int64_t)m * K + c * 128 + 4 * d, 4);
                signed_products(w, _mm256_set1_epi32(xv), a + 2 * m);
            }
        }
        for (int i = 0; i < 2 * rows; i++)
            f[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[i]), _mm256_set1_ps(xs[i / 2 * chunks + c]), f[i]);
    }
    for (int m = 0; m < rows; m++) {
        float out[16];
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(out + 8 * h, _mm256_mul_ps(f[2 * m + h], _mm256_loadu_ps(sb + 8 * h)));
        store_row(y, (int64_t)m * N, out, valid, BF16);
    }
}

/* The output blocks b0 .. b1 - 1 (16 rows each) of gemm_int8_a8 from its quantized activations. */
static inline void int8_a8_blocks(const int8_t *xq, const float *xs, const int32_t *x8, int64_t M, int K,
                                  const int8_t *w, const float *scale, int N, uint16_t *y, int64_t b0, int64_t b1) {
    (void)x8;  /* no offset here: the sign trick takes the weights as they are */
    const int64_t chunks = K / 128, per_pass = rows_per_pass(M, 4);
    for (int64_t b = b0; b < b1; b++) {
        const int valid = N - 16 * b < 16 ? (int)(N - 16 * b) : 16;
        for (int64_t m0 = 0; m0 < M; m0 += per_pass) {
            const int rows = (int)(M - m0 < per_pass ? M - m0 : per_pass);
#define I8_LANES(R) int8_a8_block(xq + m0 * K, xs + m0 * chunks, R, K, w + b * 16 * K, scale + 16 * b, \
                                  y + m0 * N + 16 * b, N, valid)
            FOR_1_TO_4(rows, I8_LANES)
#undef I8_LANES
        }
    }
}
#endif

#if defined(HAVE_GEMM_INT4_A8)
/* The int8-activation kernels' (int4 x int8, fp8 as int8) activations for M rows of K inputs in `scratch`: the int8
 * values, then each 128's scale, then each 128's sum (the one-call step prepares them there too). */
typedef struct { int8_t *xq; float *xs; int32_t *x8; } a8_rows_t;

static a8_rows_t a8_prepared(char *scratch, int64_t M, int64_t K) {
    float *xs = (float *)(scratch + M * K);
    return (a8_rows_t){(int8_t *)scratch, xs, (int32_t *)(xs + M * (K / 128))};
}

/* x bf16 [M, K] as the int8-activation kernels take it (quantize_int4_activations), in one allocation (free xq) */
static a8_rows_t a8_rows(const uint16_t *x, int64_t M, int K, float fp8_scale) {
    const int64_t chunks = K / 128;
    const a8_rows_t r = a8_prepared(malloc((size_t)(M * K) + (sizeof(float) + sizeof(int32_t)) * M * chunks), M, K);
    FOR_ROWS(m, M, 4, quantize_int4_activations(x + m * K, K, r.xq + m * K, r.xs + m * chunks, r.x8 + m * chunks,
                                                fp8_scale));
    return r;
}

void gemm_int4_a8(const uint16_t *x, int64_t M, int K, const uint8_t *w, const float *scales, int group, int N,
                  uint16_t *y, float fp8_scale) {
    const a8_rows_t r = a8_rows(x, M, K, fp8_scale);
    const int64_t blocks = (N + 15) / 16;
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) int4_a8_blocks(r.xq, r.xs, r.x8, M, K, w, scales, group, N, y, b, b + 1);
    free(r.xq);
}

#endif

#if defined(HAVE_GEMM_INT8_A8)
/* fp8 weights served as int8 (see int8_a8_block): x bf16 [M, K] rounded to fp8 at fp8_scale (where > 0) and to int8
 * per 128, times pack_int8_a8's weights → y bf16 [M, N] */
void gemm_int8_a8(const uint16_t *x, int64_t M, int K, const int8_t *w, const float *scale, int N, uint16_t *y,
                  float fp8_scale) {
    const a8_rows_t r = a8_rows(x, M, K, fp8_scale);
    const int64_t blocks = (N + 15) / 16;
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) int8_a8_blocks(r.xq, r.xs, r.x8, M, K, w, scale, N, y, b, b + 1);
    free(r.xq);
}
#endif

int gemm_int8_a8_available(void) {
#if defined(HAVE_GEMM_INT8_A8)
    return 1;
#else
    return 0;
#endif
}

int gemm_int4_a8_available(void) {
#if defined(HAVE_GEMM_INT4_A8)
    return 1;
#else
    return 0;
#endif
}

void gemm_int4(const uint16_t *x, int64_t M, int K, const uint8_t *w, const float *scales, int group, int N,
               uint16_t *y) {
#if defined(__AVX512BF16__)
    const __m512i table = int4_table();
    const int groups = K / group;
    /* output rows per block: 4 at one activation row, 2 at two, else 1 (the rows give the independent chains),
     * and 2 again past one tile of rows: there the rows run in passes of up to 4 against 2 weight rows, each
     * activation load feeding both (whole int4 steps at 12 and 16 sequences 12 % and 7 % faster than 8-row
     * tiles of 1 weight row; at 4 and 8 sequences 7-9 % slower, so those keep the tile; passes of 6, with 12
     * accumulators a block, spilled: 30 % slower at 8. 2026-11-26, Zen 4, two builds alternating in one process) */
    const int nb = M == 1 && N % 4 == 0 ? 4 : (M == 2 || M > TILE_M) && N % 2 == 0 ? 2 : 1;
    const int64_t per_pass = rows_per_pass(M, 4);
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n += nb) {
        const uint8_t *wrow = w + (int64_t)n * (K / 2);
        const float *srow = scales + (int64_t)n * groups;
        if (nb == 4) int4_block(x, 1, 4, K, wrow, srow, group, table, y + n, N);
        else if (nb == 2 && M == 2) int4_block(x, 2, 2, K, wrow, srow, group, table, y + n, N);
        else if (nb == 2)
            for (int64_t m0 = 0; m0 < M; m0 += per_pass) {
                int rows = (int)(M - m0 < per_pass ? M - m0 : per_pass);
#define INT4_PAIR(R) int4_block(x + m0 * K, R, 2, K, wrow, srow, group, table, y + m0 * N + n, N)
                FOR_1_TO_4(rows, INT4_PAIR)
#undef INT4_PAIR
            }
        else
            for (int64_t m0 = 0; m0 < M; m0 += TILE_M) {
                int rows = (int)(M - m0 < TILE_M ? M - m0 : TILE_M);
#define INT4_TILE(R) int4_block(x + m0 * K, R, 1, K, wrow, srow, group, table, y + m0 * N + n, N)
                FOR_1_TO_8(rows, INT4_TILE)
#undef INT4_TILE
            }
    }
#elif defined(HAVE_AVX2_GEMMS)
    gemm_int4_avx2(x, M, K, w, scales, group, N, y);
#else
    (void)x; (void)M; (void)K; (void)w; (void)scales; (void)group; (void)N; (void)y;
#endif
}

/* The same weights dequantized to bf16 [N, K] (q * scale, rounded once): prefill widens a
 * layer's int4 weights per call and runs the dense bf16 GEMM, several times faster at prompt length. */
void unpack_int4(const uint8_t *w, const float *scales, int group, int N, int K, uint16_t *out) {
    int groups = K / group;
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int k0 = 0; k0 < K; k0 += 64)
            unpack_64(w + (int64_t)n * (K / 2) + k0 / 2, scales[(int64_t)n * groups + k0 / group], out + (int64_t)n * K + k0);
}

/* ---- fp8 (FP8): ModelOpt's e4m3 weights, exact, on AVX512-BF16 dot products ------------------------------
 * An e4m3 byte s.eeee.mmm placed in the high byte of a 16-bit word, shifted right arithmetically by 4 and
 * masked, is the bf16 s.0000eeee.mmm0000: e lands in the low bits of bf16's exponent, so that bf16 is the fp8
 * value times 2^-120 exactly (a load, then 2-3 shifts and a mask per 32 weights; the widening int8 kernel
 * fp8 ran on before spent a conversion and an FMA per 16 and was compute-bound at twice the floor). fp8's
 * subnormals (e = 0: |w| < 2^-6 in units of the tensor's scale, i.e. under 1/28672 of its largest weight)
 * become bf16 subnormals, which AVX512-BF16 reads as zero; widen_fp8 below drops them too, so that prefill
 * and decode serve the same weights. Activations rounded to fp8 as calibrated are exact in bf16; they go in
 * times 2^64 (exact) so that no product with a 2^-120-scaled weight falls below fp32's normal range (the
 * instruction flushes those), and the 2^56 left over is folded into the row scale.
 * Layout (pack_fp8): each 64 weights stored as 32 words, word i holding weight k0 + i in its high byte and
 * k0 + 32 + i in its low byte: the high bytes are in place for the shift as loaded, the low ones after one shift
 * left, so 64 weights cost 5 vector instructions (fp8_pair_as_bf16), not the 6 of unpacking a natural order
 * against zeros first. Where N is a multiple of 4, each block of 4 rows (fp8_tile's block) is one stream, the
 * rows' pieces of 64 interleaved (fp8_at): a thread's weights are then one sequential stream, which the hardware
 * prefetchers keep up with at one and two rows without software prefetch, as the lanes kernels' (below). Against 4
 * rows side by side, prefetched 8 KiB ahead into L2 (2026-11-27, Zen 4): a step's 64 fp8 GEMVs of `small` from C,
 * both threads, 40 rounds alternating with a 128 MiB read: 0.95 / 1.07 of the read's rate in the fast / slow memory
 * state against 0.85 / 0.99 (without the prefetch the rows side by side ran at 0.31 / 0.53); whole fp8 steps, two
 * builds alternating (perf/ab_steps.py --slices 32, three runs, both memory states): 1 / 2 / 3 / 4 / 8 / 16
 * sequences -6..-12 / -2..-7 / -14 / -6..-10 / -9..-15 / -4..-13 %. From 3 rows the blocks are still prefetched
 * (without, 4 / 8 sequences +14 / +20 %; at 3 even). At one row the kernel is bound by those instructions (~48 GB/s
 * of fp8 from any cache level, where bf16's GEMV streams ~95; 2026-11-26), which this VM's memory outruns in its fast
 * state.
 * w [N, K] bytes, K a multiple of 64; scale [N] fp32; x [M, K] bf16; y [M, N] bf16. */
#if defined(__AVX512BF16__)
#define FP8_ACT_SHIFT 18446744073709551616.0f /* 2^64 */
#define FP8_OUT_SHIFT 72057594037927936.0f /* 2^56 = 2^120 / 2^64 */

/* Rows per interleaved block of pack_fp8's layout for N output rows: 4 where N is a multiple of 4, else 1 (rows of K
 * in turn). */
INLINE int fp8_layout_rows(int N) { return N % 4 == 0 ? 4 : 1; }

/* Weights k .. k + 63 of row j of a block of nb rows starting at `block` in pack_fp8's layout (blocks of 4: their
 * rows interleaved by 64; else rows of K in turn). */
INLINE const uint8_t *fp8_at(const uint8_t *block, const int nb, int j, int K, int k) {
    return nb == 4 ? block + (int64_t)k * 4 + j * 64 : block + (int64_t)j * K + k;
}

INLINE __m512bh fp8_as_bf16(__m512i high_bytes) {
    return (__m512bh)_mm512_and_si512(_mm512_srai_epi16(high_bytes, 4), _mm512_set1_epi16((short)0x87FF));
}

/* 64 weights in pack_fp8's layout → k0 .. k0+31 (the words' high bytes) and k0+32 .. k0+63 (their low bytes) as
 * bf16 times 2^-120: the mask also clears what the shift brings down from the other byte. */
INLINE void fp8_pair_as_bf16(__m512i words, __m512bh *first, __m512bh *second) {
    const __m512i mask = _mm512_set1_epi16((short)0x87F0);
    *first = (__m512bh)_mm512_and_si512(_mm512_srai_epi16(words, 4), mask);
    *second = (__m512bh)_mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(words, 8), 4), mask);
}

/* One accumulator per activation row and weight row, the two halves of each 64 weights summed into it in turn, and
 * the full sums by sum_four's tree four accumulators at a time (each row's sums run the same way at every tile
 * size). A chain of dot products waits on each one's latency, so blocks keep several weight rows in flight: 4,
 * against passes of up to 3 activation rows, each pass widening the block's weights again, from L1, at every row
 * count.
 * Against 2 weight rows and all rows in one pass from 5 rows (before 2026-11-27 noon; 8 rows of x at K 2048 filled
 * L1) and 4 rows in one pass: fp8 steps of `small` timed in place, two builds alternating (Zen 4): the GEMMs at 4 /
 * 5 / 6 / 7 / 8 sequences -1..-12 / -18..-27 / -12..-18 / -9..-20 / -7..-10 %, down_proj (2048 inputs) at 8 -32 %;
 * whole steps at 4-8 -4..-18 %. Passes of 2 were 3-15 % slower than of 3; passes of 4 at 8 rows 1-6 % slower than one.
 * Widening each block once into L1 for all rows, then bf16 dot products against it in passes of 6 (gemm_fp8's path from
 * 13 rows, 17 for long rows, until the rows were interleaved), with the blocks as one stream each (2026-11-27
 * afternoon, two builds alternating): whole steps at 6 / 8 / 12 / 16 sequences 27-41 / 20 / 17 / 6-8 % slower (from 5
 * rows), at 13 / 14 / 16 / 20 / 32 10-17 / 6-7 / 4 / 9 / 6 % slower (from 17 or 33); a step's GEMMs alone at 32 / 64 / 128 /
 * 256 rows 9 / 4 / 1 % slower, 2 % faster: widening then computing leaves memory idle in the second phase, where
 * fp8_tile overlaps the two, and in cache the two ran alike.
 * Against two accumulators per row (one per half) and a reduction per output (2026-11-26, Zen 4): a 2 MB GEMM in
 * cache at 1-3 rows 18-28 % faster; a step's GEMMs streamed 1-8 % faster at 1-16 rows; whole steps at 2-12
 * sequences 4-16 % faster in most runs, at 16 within this VM's noise (-2 to +8 %). */
INLINE void fp8_tile(const uint16_t *x, const int rows, const int nb, int K, const uint8_t *wrow, const float *scale,
                     uint16_t *y, int64_t N, int fetch) {
    __m512 acc[16];
    for (int i = 0; i < rows * nb; i++) acc[i] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 64) {
        for (int j = 0; j < nb; j++) {
            const uint8_t *at = fp8_at(wrow, nb, j, K, k);
            if (fetch) prefetch_weights(at, 1, nb * (int64_t)K);
            __m512bh w0, w1;
            fp8_pair_as_bf16(_mm512_loadu_si512((const void *)at), &w0, &w1);
            for (int m = 0; m < rows; m++) {
                const uint16_t *xm = x + (int64_t)m * K + k;
                acc[m * nb + j] = _mm512_dpbf16_ps(acc[m * nb + j], w0, (__m512bh)_mm512_loadu_si512((const void *)xm));
                acc[m * nb + j] = _mm512_dpbf16_ps(acc[m * nb + j], w1, (__m512bh)_mm512_loadu_si512((const void *)(xm + 32)));
            }
        }
    }
    /* each accumulator's full sum by sum_four's tree, four at a time (one order whatever the others are) */
    float sums[16];
    for (int i = 0; i < rows * nb; i += 4) {
        const int last = rows * nb - 1;
        _mm_storeu_ps(sums + i, sum_four(acc[i], acc[i + 1 <= last ? i + 1 : last], acc[i + 2 <= last ? i + 2 : last],
                                         acc[i + 3 <= last ? i + 3 : last]));
    }
    for (int m = 0; m < rows; m++)
        for (int j = 0; j < nb; j++) y[m * N + j] = f32_to_bf16(sums[m * nb + j] * (scale[j] * FP8_OUT_SHIFT));
}
#endif

#if defined(__AVX512BF16__)
/* Weight rows per block of gemm_fp8 (its unit of work): 4 in pack_fp8's one-stream layout, else 2 or 1. */
static inline int fp8_block_rows(int N) {
    return fp8_layout_rows(N) == 4 ? 4 : N % 2 == 0 ? 2 : 1;
}

/* gemm_fp8's output rows n0 .. n1 - 1 (n0 a multiple of fp8_block_rows) from its shifted activations xs. */
static inline void fp8_rows(const uint16_t *xs, int64_t M, int K, const uint8_t *w, const float *scale, int N,
                            uint16_t *y, int n0, int n1) {
    /* weight rows per block and rows per pass: see fp8_tile. Blocks of 4, one stream each (pack_fp8), take no
     * software prefetch at one or two rows (see the layout above). */
    const int nb = fp8_block_rows(N);
    const int64_t per_pass = nb == 4 ? rows_per_pass(M, 3) : M <= 8 ? M : rows_per_pass(M, 4);
    const int fetch = nb < 4 || M > 2;
    for (int n = n0; n < n1; n += nb) {
        const uint8_t *wrow = w + (int64_t)n * K;
        for (int64_t m0 = 0; m0 < M; m0 += per_pass) {
            int rows = (int)(M - m0 < per_pass ? M - m0 : per_pass);
#define FP8_FOUR(R) fp8_tile(xs + m0 * K, R, 4, K, wrow, scale + n, y + m0 * N + n, N, fetch)
#define FP8_PAIR(R) fp8_tile(xs + m0 * K, R, 2, K, wrow, scale + n, y + m0 * N + n, N, fetch)
#define FP8_ONE(R) fp8_tile(xs + m0 * K, R, 1, K, wrow, scale + n, y + m0 * N + n, N, fetch)
            if (nb == 4) { FOR_1_TO_4(rows, FP8_FOUR) }
            else if (nb == 2) { FOR_1_TO_8(rows, FP8_PAIR) }
            else { FOR_1_TO_8(rows, FP8_ONE) }
#undef FP8_FOUR
#undef FP8_PAIR
#undef FP8_ONE
        }
    }
}
#endif

void gemm_fp8(const uint16_t *x, int64_t M, int K, const uint8_t *w, const float *scale, int N, uint16_t *y,
              int act_quant, float input_scale) {
#if defined(__AVX512BF16__)
    /* x rounded as calibrated (as kernels.fake_quant_activation rounds it, in bf16), then times 2^64: exact */
    uint16_t *xs = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(M * K));
    shifted_activations(x, M, K, act_quant, input_scale, FP8_ACT_SHIFT, xs);
    const int nb = fp8_block_rows(N);
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n += nb) fp8_rows(xs, M, K, w, scale, N, y, n, n + nb);
    free(xs);
#else
    (void)x; (void)M; (void)K; (void)w; (void)scale; (void)N; (void)y; (void)act_quant; (void)input_scale;
#endif
}

/* The weights prefill computes with: the same values as gemm_fp8's (subnormals dropped) times the row
 * scale, rounded once to bf16 [N, K] in natural order (w in pack_fp8's layout). */
void widen_fp8(const uint8_t *w, const float *scale, int N, int K, uint16_t *out) {
#if defined(__AVX512BF16__)
    const int nb = fp8_layout_rows(N);
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float row[K];
        const uint8_t *block = w + (int64_t)(n - n % nb) * K;
        const __m512 s = _mm512_set1_ps(scale[n]);
        for (int k0 = 0; k0 < K; k0 += 64) {
            /* as gemm_fp8 reads them (k0 .. k0+31 in the words' high bytes, then the low bytes shifted up; what is
             * left in the low byte is masked off below), then per 16 words the fp32 of the fp8: sign, exponent
             * e + 120, mantissa; zero where e = 0 (zeros and subnormals) */
            __m512i words = _mm512_loadu_si512((const void *)fp8_at(block, nb, n % nb, K, k0));
            __m512i halves[2] = {words, _mm512_slli_epi16(words, 8)};
            for (int h = 0; h < 2; h++)
                for (int q = 0; q < 2; q++) {
                    __m512i x = _mm512_cvtepu16_epi32(q ? _mm512_extracti64x4_epi64(halves[h], 1)
                                                        : _mm512_castsi512_si256(halves[h]));
                    __m512i mag = _mm512_add_epi32(_mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x7F00)), 12),
                                                   _mm512_set1_epi32(120 << 23));
                    __mmask16 normal = _mm512_test_epi32_mask(x, _mm512_set1_epi32(0x7800));
                    __m512i bits = _mm512_maskz_or_epi32(normal, mag,
                                                         _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x8000)), 16));
                    _mm512_storeu_ps(row + k0 + 32 * h + 16 * q, _mm512_mul_ps(_mm512_castsi512_ps(bits), s));
                }
        }
        store_row(out, (int64_t)n * K, row, K, BF16);
    }
#else
    (void)w; (void)scale; (void)N; (void)K; (void)out;
#endif
}

/* ---- int8 x int8 (SmoothQuant) with VNNI ------------------------------------------------------------
 * INT8-SQ's activations are integers times input_scale once rounded (as widen_activations rounds them), so
 * the GEMM runs exactly in integers: vpdpbusd multiplies unsigned by signed bytes into int32, so x goes in
 * as u = q + 128 and each output row's sum of weights takes the offset out: sum q*w = sum u*w - 128 sum w.
 * 64 weights per instruction and row, where the widening kernel above spends a conversion and an FMA per
 * 16: it was compute-bound at 14-26 GB/s, this one streams at the memory's rate.
 * w [N, K] int8, scale [N] fp32, weight_sums [N] int32; x [M, K] in the activation dtype; y [M, N] likewise. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define HAVE_GEMM_INT8_VNNI 1

/* rows of x rounded to int8 at input_scale, stored + offset as bytes (128: unsigned for vpdpbusd; 0: the int8
 * itself), each row padded with zeros to kpad */
static void quantize_row(const void *x, int64_t m, int K, int kpad, int kind, float input_scale, int offset,
                         uint8_t *out) {
    const __m512 s = _mm512_set1_ps(input_scale), lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(127.0f);
    uint8_t *row = out + m * kpad;
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 q = _mm512_roundscale_ps(_mm512_div_ps(load16(x, m * K + k, kind, 1.0f), s),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512i u = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(q, lo), hi)),
                                     _mm512_set1_epi32(offset));
        _mm_storeu_si128((__m128i *)(row + k), _mm512_cvtepi32_epi8(u));
    }
    float tail[16];
    if (k < K) load_row(tail, x, m * K + k, K - k, kind, 1.0f);
    for (int i = 0; k + i < K; i++) row[k + i] = (uint8_t)((int)int8_level(tail[i], input_scale) + offset);
    memset(row + K, 0, (size_t)(kpad - K));
}

/* Output rows in the vector lanes (native_kernels.pack_int8_lanes): per block of 16 weight rows, K (padded to kpad)
 * in vectors of 64 bytes, vector d holding in lane n weights 4d .. 4d+3 of row n. One vpdpbusd against 4 broadcast
 * activation bytes adds 4 products to 16 rows' sums, and the sums leave for fp32 16 at a time: the kernel before
 * (2026-11-27) kept each output's partial sums across the lanes and paid a horizontal reduction per output, which at
 * `small`'s 768 inputs was as many instructions as its dot products (steps at 16 sequences 252 GFLOP/s in the step,
 * the int4 kernel laid out this way 666). A block's weights are read once per pass of up to 8 rows, so prompt chunks
 * run on it too (one kernel, one layout: a row's output is the same bits in a prompt chunk or a decode batch). The
 * sums are integers, exact in any order; each output is (float)(sum - 128 sum w) * input_scale * scale, as before. */
INLINE void int8_lanes_block(const uint8_t *xq, const int rows, const int nbk, int kpad, const int8_t *wb,
                             const float *sb, const int32_t *wsum, float input_scale, void *y, int64_t N, int kind,
                             int valid) {
    /* nbk (1 or 2) adjacent blocks of 16 weight rows at once: each broadcast activation feeds nbk instructions. With
     * two (from 8 rows: compute-bound, the pair's 24 KiB read again by each pass of rows) each line of the next pair
     * is fetched into L2 as the same line of this one is read (prefetch_weights with the pair as its block), where
     * prefetch_lanes fetched 2 KiB ahead into L1:
     * the pair's arithmetic (~1 us a pass) had not overlapped the next pair's read. Whole INT8-SQ steps of `small` at
     * 8 / 10 / 16 sequences -16..-24 / -15..-25 / -13..-15 % (2026-11-27, Zen 4, two builds alternating, both memory
     * states); at 4-6 rows (one pass, memory-bound in the slow state) the same fetch was -8..-15 % fast, +5..+9 % slow:
     * left as it was. */
    const int chains = rows == 1 ? 4 : rows == 2 ? 2 : 1;
    __m512i a[16];
    for (int i = 0; i < rows * nbk * chains; i++) a[i] = _mm512_setzero_si512();
    /* At two rows d runs in steps of `chains` (kpad / 4 is a multiple of 16), so that each chain's accumulators are
     * indexed by a constant and stay in registers: indexed by d % chains, a run-time value, they lived on the stack,
     * and two rows ran no faster than one (in L2: 190-200 GFLOP/s at 1 and 2 rows, 500 at 3; 480 at 2 rows this way,
     * 2026-11-27). At one row the same change ran 2.1x faster in L2 but its steps, memory-bound, 4 % slower (slow
     * memory state, 96 slices alternating), so one row keeps the loop it had. */
    const int step = rows == 2 ? chains : 1;
    for (int64_t d0 = 0; d0 < kpad / 4; d0 += step) {
        for (int u = 0; u < step; u++) {
            const int64_t d = d0 + u;
            const int h = rows == 2 ? u : (int)(d % chains);  /* u: a constant once the loop is unrolled */
            __m512i wv[2];
            for (int j = 0; j < nbk; j++) {
                if (nbk == 2) prefetch_weights(wb + (int64_t)j * 16 * kpad + d * 64, 1, 2 * 16 * (int64_t)kpad);
                else prefetch_lanes(wb + (int64_t)j * 16 * kpad + d * 64, rows);
                wv[j] = _mm512_loadu_si512((const void *)(wb + (int64_t)j * 16 * kpad + d * 64));
            }
            for (int m = 0; m < rows; m++) {
                int32_t xv;
                memcpy(&xv, xq + (int64_t)m * kpad + 4 * d, 4);
                const __m512i xb = _mm512_set1_epi32(xv);
                for (int j = 0; j < nbk; j++)
                    a[(m * nbk + j) * chains + h] = _mm512_dpbusd_epi32(a[(m * nbk + j) * chains + h], xb, wv[j]);
            }
        }
    }
    for (int j = 0; j < nbk; j++) {
        const __m512i offset = _mm512_mullo_epi32(_mm512_loadu_si512((const void *)(wsum + 16 * j)), _mm512_set1_epi32(128));
        const __m512 scale = _mm512_loadu_ps(sb + 16 * j), in = _mm512_set1_ps(input_scale);
        const __mmask16 keep = lanes_live(valid - 16 * j);
        for (int m = 0; m < rows; m++) {
            __m512i sum = a[(m * nbk + j) * chains];
            for (int h = 1; h < chains; h++) sum = _mm512_add_epi32(sum, a[(m * nbk + j) * chains + h]);
            const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sum, offset)), in), scale);
            if (kind == F32) _mm512_mask_storeu_ps((float *)y + (int64_t)m * N + 16 * j, keep, v);
            else store_lanes(v, (uint16_t *)y + (int64_t)m * N + 16 * j, valid - 16 * j);
        }
    }
}

/* Blocks of 16 output rows gemm_int8_vnni takes at a time (its unit of work): 2 from 8 rows, else 1. */
static inline int int8_vnni_unit(int64_t M, int N) {
    return M >= 8 && ((N + 15) / 16) % 2 == 0 ? 2 : 1;
}

/* gemm_int8_vnni's output blocks b0 .. b1 - 1 (b0 a multiple of int8_vnni_unit) from its quantized rows xq. */
static inline void int8_vnni_blocks(const uint8_t *xq, int64_t M, int kpad, const int8_t *w, const float *scale,
                                    const int32_t *weight_sums, int N, void *y, int kind, float input_scale, int64_t b0,
                                    int64_t b1) {
    const int64_t per_pass = rows_per_pass(M, 8);
    const int nbk = int8_vnni_unit(M, N);
    for (int64_t b = b0; b < b1; b += nbk) {
        const int64_t valid = N - 16 * b < 16 * nbk ? N - 16 * b : 16 * nbk;
        for (int64_t m0 = 0; m0 < M; m0 += per_pass) {
            const int rows = (int)(M - m0 < per_pass ? M - m0 : per_pass);
            void *ym = (char *)y + (m0 * N + 16 * b) * act_bytes(kind);
#define INT8_LANES(R) int8_lanes_block(xq + m0 * kpad, R, NBK, kpad, w + b * 16 * kpad, scale + 16 * b, \
                                       weight_sums + 16 * b, input_scale, ym, N, kind, (int)valid)
#define NBK 2
            if (nbk == 2) { FOR_1_TO_8(rows, INT8_LANES) }
#undef NBK
#define NBK 1
            else { FOR_1_TO_8(rows, INT8_LANES) }
#undef NBK
#undef INT8_LANES
        }
    }
}

#elif defined(__AVX2__) && defined(__FMA__)
#define HAVE_GEMM_INT8_VNNI 1
/* ---- the same on AVX2 (a CPU without AVX-512) ---------------------------------------------------------------
 * The same layout and quantized rows (u = q + 128); per 4 broadcast bytes u ^ 0x80 gives q back, and vpmaddubsw takes
 * |q| (unsigned, at most 128) against the weights carrying q's sign (vpsignb; at most 127 in size, so each pair of
 * products fits 16 bits: 2 x 128 x 127), vpmaddwd against ones adds the pairs into 32-bit sums: sum q w exactly, the
 * integer the VNNI kernel gets from sum u w - 128 sum w, then the same float operations: the same bits. The weights
 * must avoid -128 (whose sign cannot flip in 8 bits): int8_weights_symmetric() says so, and INT8-SQ keeps its other
 * kernel where a checkpoint has one (ModelOpt's rounding at amax / 127 leaves none). */
static void quantize_row(const void *x, int64_t m, int K, int kpad, int kind, float input_scale, int offset,
                         uint8_t *out) {
    float v[K];
    uint8_t *row = out + m * kpad;
    load_row(v, x, m * K, K, kind, 1.0f);
    for (int k = 0; k < K; k++) row[k] = (uint8_t)((int)int8_level(v[k], input_scale) + offset);
    memset(row + K, 0, (size_t)(kpad - K));
}

/* `rows` activation rows (a constant, 1-4) against a block of 16 weight rows, the first `valid` real: both halves of
 * each vector together, each row's broadcast and |q| serving both and the block read in one pass (half by half, in
 * passes of up to 8 rows, whole INT8-SQ steps of `small` ran 1.2-1.4x as long at 1-4 sequences and 1.1x at 8-16). */
INLINE void int8_lanes_block(const uint8_t *xq, const int rows, int kpad, const int8_t *wb, const float *sb,
                             float input_scale, void *y, int64_t N, int kind, int valid) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    __m256i a[8];  /* [row][half] */
    for (int i = 0; i < 2 * rows; i++) a[i] = _mm256_setzero_si256();
    for (int64_t d = 0; d < kpad / 4; d++) {
        prefetch_lanes_avx2(wb + d * 64);
        const __m256i w[2] = {_mm256_loadu_si256((const __m256i *)(wb + d * 64)),
                              _mm256_loadu_si256((const __m256i *)(wb + d * 64 + 32))};
        for (int m = 0; m < rows; m++) {
            int32_t xv;
            memcpy(&xv, xq + (int64_t)m * kpad + 4 * d, 4);
            signed_products(w, _mm256_xor_si256(_mm256_set1_epi32(xv), flip), a + 2 * m);
        }
    }
    const __m256 in = _mm256_set1_ps(input_scale);
    for (int m = 0; m < rows; m++) {
        float v[16];
        for (int h = 0; h < 2; h++)
            _mm256_storeu_ps(v + 8 * h, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(a[2 * m + h]), in),
                                                      _mm256_loadu_ps(sb + 8 * h)));
        store_row(y, (int64_t)m * N, v, valid, kind);
    }
}

static inline int int8_vnni_unit(int64_t M, int N) {
    (void)M, (void)N;
    return 1;
}

static inline void int8_vnni_blocks(const uint8_t *xq, int64_t M, int kpad, const int8_t *w, const float *scale,
                                    const int32_t *weight_sums, int N, void *y, int kind, float input_scale, int64_t b0,
                                    int64_t b1) {
    (void)weight_sums;
    const int64_t per_pass = rows_per_pass(M, 4);
    for (int64_t b = b0; b < b1; b++) {
        const int valid = N - 16 * b < 16 ? (int)(N - 16 * b) : 16;
        for (int64_t m0 = 0; m0 < M; m0 += per_pass) {
            const int rows = (int)(M - m0 < per_pass ? M - m0 : per_pass);
            void *ym = (char *)y + (m0 * N + 16 * b) * act_bytes(kind);
#define INT8_LANES(R) int8_lanes_block(xq + m0 * kpad, R, kpad, w + b * 16 * kpad, scale + 16 * b, input_scale, ym, N, \
                                       kind, valid)
            FOR_1_TO_4(rows, INT8_LANES)
#undef INT8_LANES
        }
    }
}
#endif

#if defined(HAVE_GEMM_INT8_VNNI)
/* quantize_row (this ISA's) over M rows */
static void quantize_rows(const void *x, int64_t M, int K, int kpad, int kind, float input_scale, int offset,
                          uint8_t *out) {
    FOR_ROWS(m, M, 32, quantize_row(x, m, K, kpad, kind, input_scale, offset, out));
}

/* x [M, K] rounded to int8 at input_scale (as gemm_int8_vnni rounds it): a prompt chunk's input to an int8 x int8
 * GEMM (torch._int_mm), exact in int32 as the decode kernel */
void quantize_int8(const void *x, int64_t M, int K, int kind, float input_scale, int8_t *out) {
    quantize_rows(x, M, K, K, kind, input_scale, 0, (uint8_t *)out);
}

/* w: pack_int8_lanes' bytes [N padded to 16, kpad]; scale, weight_sums: padded to 16 likewise (zeros). From 8 rows two
 * blocks side by side (32 outputs), passes of up to 8 rows. */
void gemm_int8_vnni(const void *x, int64_t M, int K, const int8_t *w, const float *scale, const int32_t *weight_sums,
                    int N, void *y, int kind, float input_scale) {
    const int kpad = (K + 63) / 64 * 64;
    uint8_t *xq = (uint8_t *)malloc((size_t)(M * kpad));
    quantize_rows(x, M, K, kpad, kind, input_scale, 128, xq);
    const int64_t blocks = (N + 15) / 16;
    const int nbk = int8_vnni_unit(M, N);
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b += nbk)
        int8_vnni_blocks(xq, M, kpad, w, scale, weight_sums, N, y, kind, input_scale, b, b + nbk);
    free(xq);
}
#endif

/* Whether gemm_int8_vnni needs weights without -128 (the AVX2 kernel: see there). */
int int8_weights_symmetric(void) {
#if defined(HAVE_GEMM_INT8_VNNI) && !defined(__AVX512VNNI__)
    return 1;
#else
    return 0;
#endif
}

int gemm_int8_vnni_available(void) {
#if defined(HAVE_GEMM_INT8_VNNI)
    return 1;
#else
    return 0;
#endif
}

/* AMX (Sapphire Rapids and later): the few-row bf16 and int8 GEMMs on tile dot products. At 16 rows the
 * AVX512-BF16 kernel above is compute-bound (each weight pair costs one dot-product lane per row), while one
 * TDPBF16PS multiplies a 16 x 32 slice of the activations by a 32 x 16 tile of weights in ~16 cycles: the step
 * stays at the weights' read rate up to 16 rows, as it does on a GPU's tensor cores up to its ridge.
 *
 * Weights are packed once (native_kernels.pack_amx) as the tile unit reads them: [N/16][K/kstep][16][64 bytes],
 * where for outputs n0..n0+15 and a K slice of kstep (32 bf16, 64 int8), row r of a tile holds, per output,
 * the 2 (bf16) or 4 (int8) consecutive k at 2r / 4r: TDPBF16PS / TDPBSSD's "VNNI" layout. 1 KiB per tile,
 * streamed in order. Each thread takes 4 output tiles (64 outputs) at a time: 4 accumulator tiles, one tile
 * for the activations, two for weights (8 in all). The OS must grant the tile state first (amx_enable). */
#if defined(HAVE_GEMM_INT8_VNNI) && defined(__AVX512BF16__) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && \
    defined(__AMX_INT8__)
#define HAVE_AMX 1
#include <sys/syscall.h>
#include <unistd.h>

int amx_enable(void) { /* Linux: ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; 0 where the kernel refuses */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config_t;

/* Tiles 0-3 accumulators, 4 activations: M rows; 5-6 weights: 16 rows. Loaded at every call: other code in the
 * thread (oneDNN's AMX GEMMs in torch) loads its own configuration, and tile instructions under a configuration
 * they do not fit fault (SIGILL). */
static void amx_configure(int M, int *current) {
    if (*current == M) return;
    tile_config_t c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 7; t++) {
        c.rows[t] = (uint8_t)(t < 5 ? M : 16);
        c.colsb[t] = 64;
    }
    /* the stores above must land before ldtilecfg reads them: GCC 12 kept only the memset's and the palette's where
     * this was inlined into a restructured int4_a8_tile_blocks (every tile 0 columns wide: SIGILL at its first tile
     * load, 2026-11-29) */
    __asm__ volatile("" : : "r"(&c) : "memory");
    _tile_loadconfig(&c);
    *current = M;
}

enum { AMX_BF16 = 0, AMX_INT8 = 1, AMX_FP8 = 2, AMX_INT4 = 3 };
#define AMX_PREFETCH 4096 /* bytes ahead in each output tile's weight stream */

/* The next group's weights into L2 while this group's later row chunks run from L2 (prompt chunks of more than 16
 * rows): the first chunk of a group streams its weights from memory, the others compute on them in L2, so without
 * this the memory sat idle through the compute and waited through the stream, the GEMM taking their sum (bf16 at
 * 128 rows: `small`'s 16 layers 25.4 ms in a prefill against 17.6 with the weights hot, 2026-11-28 Xeon). `ahead`
 * holds the next group's range; each call fetches `lines` more of it. */
typedef struct { const char *at, *end; int64_t lines; } group_ahead_t;

static group_ahead_t group_ahead(const uint8_t *next, int64_t bytes, int64_t later_chunks, int64_t steps_per_chunk) {
    const int64_t calls = later_chunks * steps_per_chunk;
    group_ahead_t a = {(const char *)next, (const char *)next + (bytes > 0 ? bytes : 0), 0};
    if (calls > 0 && bytes > 0) a.lines = (bytes / 64 + calls - 1) / calls;
    return a;
}

static inline void fetch_group_ahead(group_ahead_t *a) {
    for (int64_t i = 0; i < a->lines && a->at < a->end; i++, a->at += 64) _mm_prefetch(a->at, _MM_HINT_T1);
}

/* An fp8 tile (512 bytes, pack_amx's layout: per two tile rows, 64 bytes interleaved in 8-byte runs, so that one unpack
 * of each half yields the two rows) as the bf16 tile of its values times 2^-120 (gemm_fp8's shift). */
INLINE void amx_widen_fp8_tile(const uint8_t *src, uint8_t *dst) {
    const __m512i zero = _mm512_setzero_si512();
    for (int c = 0; c < 8; c++) {
        __m512i bytes = _mm512_loadu_si512((const void *)(src + 64 * c));
        _mm512_store_si512((void *)(dst + 128 * c), (__m512i)fp8_as_bf16(_mm512_unpacklo_epi8(zero, bytes)));
        _mm512_store_si512((void *)(dst + 128 * c + 64), (__m512i)fp8_as_bf16(_mm512_unpackhi_epi8(zero, bytes)));
    }
}

/* An int4 tile (256 bytes, pack_amx_int4's layout: per 64 tile values, byte b holds value b in its low nibble and
 * value 32 + b in its high one, each as q + 8) as the bf16 tile of q, by int4_table's permute. */
INLINE void amx_widen_int4_tile(const uint8_t *src, uint8_t *dst, __m512i table) {
    const __m512i low = _mm512_set1_epi16(15);
    for (int i = 0; i < 8; i++) {
        __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(src + 32 * i)));
        _mm512_store_si512((void *)(dst + 128 * i), _mm512_permutexvar_epi16(_mm512_and_si512(bytes, low), table));
        _mm512_store_si512((void *)(dst + 128 * i + 64), _mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), table));
    }
}

/* The sums (fp32 for bf16, fp8 and int4, int32 for int8) of x [M, K] (row stride lda bytes) times the packed weights,
 * into `out` (amx_out_t); kt tiles of K. Per 4 output tiles, rows in chunks of 16: the first chunk streams those tiles'
 * weights from memory (fp8 widened into this thread's kt x 4 KiB of bf16 tiles where later chunks reuse them, else
 * 4 KiB), later chunks (prompt rows) find them in L2, so one kernel serves decode and prefill. */
#define AMX_STORE(j, to)                                     \
    do {                                                     \
        if ((j) == 0) _tile_stored(0, to, 64);               \
        else if ((j) == 1) _tile_stored(1, to, 64);          \
        else if ((j) == 2) _tile_stored(2, to, 64);          \
        else _tile_stored(3, to, 64);                        \
    } while (0)

/* Where amx_gemm's sums go as each tile leaves (instead of into acc for a pass of their own: bf16's 128-row prompt
 * GEMMs 0.90-0.94x that way): y [M, N], fp32 or bf16, INT8's int32 sums times `pre` then cols[n], FP8's fp32 sums times
 * cols[n] * col_mul (the orders the kernels' own passes had), bf16's and int4's as they are. */
typedef struct {
    void *y;
    int f32;
    float pre;
    const float *cols;
    float col_mul;
} amx_out_t;

/* 16 fp32 sums (bf16, fp8, int4) of outputs n .. n + 15 into y at `at` */
INLINE void amx_out_f32(const amx_out_t *o, int mode, __m512 v, int64_t at, int64_t n) {
    if (mode == AMX_FP8)
        v = _mm512_mul_ps(v, _mm512_mul_ps(_mm512_loadu_ps(o->cols + n), _mm512_set1_ps(o->col_mul)));
    if (o->f32) _mm512_storeu_ps((float *)o->y + at, v);
    else _mm256_storeu_si256((__m256i *)((uint16_t *)o->y + at), (__m256i)_mm512_cvtneps_pbh(v));
}

/* a tile row of 16 sums (int32 for INT8, else fp32) of outputs n .. n + 15 into y at `at` */
INLINE void amx_out_row(const amx_out_t *o, int mode, const int32_t *sums, int64_t at, int64_t n) {
    if (mode != AMX_INT8) {
        amx_out_f32(o, mode, _mm512_load_ps((const float *)sums), at, n);
        return;
    }
    const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums)), _mm512_set1_ps(o->pre)),
                                   _mm512_loadu_ps(o->cols + n));
    if (o->f32) _mm512_storeu_ps((float *)o->y + at, v);
    else _mm256_storeu_si256((__m256i *)((uint16_t *)o->y + at), (__m256i)_mm512_cvtneps_pbh(v));
}

static void amx_gemm(const void *x, int64_t M, int64_t lda, int kt, const uint8_t *wp, int N, int mode,
                     const float *group_scales, int group_tiles, const amx_out_t *out) {
    /* int4: each group's sums (group_tiles K tiles) leave the tiles times the group's scales (group_scales
     * [K / group, N]) into fp32 sums, as gemm_int4 scales its per-group partial sums */
    const int nb = N / 16;
    const int64_t tile_bytes = mode == AMX_FP8 ? 512 : mode == AMX_INT4 ? 256 : 1024;
    const __m512i table = int4_table();
    const int64_t stream = (int64_t)kt * tile_bytes; /* from one output tile's weights to the next's */
    #pragma omp parallel
    {
        int32_t c[16 * 16] __attribute__((aligned(64)));
        int configured = -1;
        float sums[4][16][16] __attribute__((aligned(64)));
        const int narrow = mode == AMX_FP8 || mode == AMX_INT4;
        /* the widened tiles of every k for later row chunks to reuse; with one chunk (up to 16 rows) none is reused,
         * so 4 tiles, rewritten at each k, stay in L1 */
        uint8_t *widened = narrow ? (uint8_t *)aligned_alloc(64, (size_t)(M > 16 ? kt : 1) * 4 * 1024) : NULL;
        #pragma omp for schedule(static)
        for (int g = 0; g < (nb + 3) / 4; g++) {
            const int j0 = g * 4, count = nb - j0 < 4 ? nb - j0 : 4;
            const uint8_t *w0 = wp + (int64_t)j0 * stream;
            const int next_count = nb - j0 - 4 < 4 ? nb - j0 - 4 : 4;
            group_ahead_t ahead = group_ahead(w0 + 4 * stream, next_count * stream, (M - 1) / 16, kt);
            for (int64_t m0 = 0; m0 < M; m0 += 16) {
                const int rows = (int)(M - m0 < 16 ? M - m0 : 16);
                const char *xm = (const char *)x + m0 * lda;
                amx_configure(rows, &configured);
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (int k = 0; k < kt; k++) {
                    if (m0 > 0) fetch_group_ahead(&ahead);
                    _tile_loadd(4, xm + (int64_t)k * 64, lda);
                    const uint8_t *t = w0 + (int64_t)k * tile_bytes;
                    const uint8_t *b[4];
                    for (int j = 0; j < count; j++) {
                        const uint8_t *src = t + j * stream;
                        if (m0 == 0)
                            for (int p = 0; p < tile_bytes; p += 64)
                                _mm_prefetch((const char *)src + AMX_PREFETCH + p, _MM_HINT_T0);
                        if (narrow) {
                            uint8_t *dst = widened + ((M > 16 ? (int64_t)k * 4 : 0) + j) * 1024;
                            if (m0 == 0 && mode == AMX_FP8) amx_widen_fp8_tile(src, dst);
                            else if (m0 == 0) amx_widen_int4_tile(src, dst, table);
                            b[j] = dst;
                        } else {
                            b[j] = src;
                        }
                    }
#define AMX_DOT(C, B, j)                                \
    _tile_loadd(B, b[j], 64);                          \
    if (mode == AMX_INT8) _tile_dpbssd(C, 4, B);       \
    else _tile_dpbf16ps(C, 4, B);
                    AMX_DOT(0, 5, 0)
                    if (count > 1) { AMX_DOT(1, 6, 1) }
                    if (count > 2) { AMX_DOT(2, 5, 2) }
                    if (count > 3) { AMX_DOT(3, 6, 3) }
#undef AMX_DOT
                    if (mode == AMX_INT4 && (k + 1) % group_tiles == 0) {
                        const float *gs = group_scales + (int64_t)(k / group_tiles) * N + j0 * 16;
                        for (int j = 0; j < count; j++) {
                            AMX_STORE(j, c);
                            const __m512 sc = _mm512_loadu_ps(gs + j * 16);
                            for (int m = 0; m < rows; m++) {
                                __m512 part = _mm512_load_ps((const float *)c + m * 16);
                                __m512 before = k + 1 == group_tiles ? _mm512_setzero_ps() : _mm512_load_ps(sums[j][m]);
                                _mm512_store_ps(sums[j][m], _mm512_fmadd_ps(part, sc, before));
                            }
                        }
                        _tile_zero(0);
                        _tile_zero(1);
                        _tile_zero(2);
                        _tile_zero(3);
                    }
                }
                for (int j = 0; j < count; j++) {
                    if (mode != AMX_INT4) AMX_STORE(j, c);
                    const int32_t *from = mode == AMX_INT4 ? (const int32_t *)sums[j] : c;
                    for (int m = 0; m < rows; m++)
                        amx_out_row(out, mode, from + m * 16, (m0 + m) * N + (j0 + j) * 16, (j0 + j) * 16);
                }
            }
        }
        free(widened);
    }
}

/* One or two rows on the same tiles without the tile unit (AVX512-BF16): a tile row, 16 outputs x one k pair, times
 * that pair of x broadcast sums 16 outputs in one register, no reduction, and fp8 / int4 widen in registers. At so
 * few rows AMX's widening through memory cost more than the dot products it saves (int4 at 1 row: 3.7 ms a step
 * against 2.4 on the AVX-512 kernel's own layout, 2026-11-24). Sums run per k tile as in amx_gemm: for int4, each
 * group's sum times its scale; x for fp8 shifted as gemm_fp8 shifts it; each row's 16 sums out as amx_gemm's
 * leave its tiles (amx_out_f32). fp8 and int4 only: bf16 at one row measured no faster than amx_gemm (2026-11-28). */
/* fp8 tile rows 2c and 2c + 1 as bf16 (times 2^-120). */
INLINE void tile_rows_fp8(const uint8_t *tile, int c, __m512bh *w0, __m512bh *w1) {
    const __m512i bytes = _mm512_loadu_si512((const void *)(tile + 64 * c));
    *w0 = fp8_as_bf16(_mm512_unpacklo_epi8(_mm512_setzero_si512(), bytes));
    *w1 = fp8_as_bf16(_mm512_unpackhi_epi8(_mm512_setzero_si512(), bytes));
}

/* The GEMV's int4 rows without a permute: a nibble n = q + 8 ORed into the mantissa of bf16 128.0 is exactly
 * 128 + n = q + 136, so the dot products sum x * q + 136 x, and each group's 136 * sum(x) is taken out before its
 * scale (tile_gemv_rows); one OR where the table took a permute on the shuffle port. */
INLINE void int4_rows_offset(const uint8_t *tile, int c, __m512bh *w0, __m512bh *w1) {
    const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(tile + 32 * c)));
    const __m512i base = _mm512_set1_epi16((short)0x4300);
    *w0 = (__m512bh)_mm512_ternarylogic_epi32(bytes, _mm512_set1_epi16(15), base, 0xEA); /* (bytes & 15) | base */
    *w1 = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(bytes, 4), base);
}
#define INT4_OFFSET 136.0f

/* tile_gemv's weights fetched this far ahead into L2 (the other GEMV kernels' lesson: more misses in flight than L1's
 * fill buffers allow): fp8's one-sequence step of `small` 0.82-0.83x with 4 KiB into L1, after a 128 MiB read and
 * without (perf/ab_steps.py, 2026-11-28 Xeon); 16 KiB the same */
#define TILE_GEMV_PREFETCH 8192
INLINE __m512 chains_sum(const __m512 *c) { return _mm512_add_ps(_mm512_add_ps(c[0], c[1]), _mm512_add_ps(c[2], c[3])); }

INLINE void tile_gemv_rows(const uint16_t *x, const int rows, int K, const uint8_t *stream, int64_t tile_bytes,
                           int mode, const float *group_scales, int group_tiles, int64_t N, int n0,
                           const float *x_group_sums, const amx_out_t *out) {
    const int kt = K / 32;
    __m512 total[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    __m512 part[2][4]; /* four chains per row: one would wait on each dot product's latency */
    for (int m = 0; m < rows; m++) part[m][0] = part[m][1] = part[m][2] = part[m][3] = _mm512_setzero_ps();
    for (int k = 0; k < kt; k++) {
        const uint8_t *tile = stream + k * tile_bytes;
        for (int p = 0; p < tile_bytes; p += 64) _mm_prefetch((const char *)tile + TILE_GEMV_PREFETCH + p, _MM_HINT_T1);
        for (int c = 0; c < 8; c++) {
            __m512bh w0, w1;
            if (mode == AMX_INT4) int4_rows_offset(tile, c, &w0, &w1);
            else tile_rows_fp8(tile, c, &w0, &w1);
            for (int m = 0; m < rows; m++) {
                const uint16_t *xk = x + (int64_t)m * K + k * 32 + 4 * c;
                const int chain = 2 * (c & 1);
                part[m][chain] = _mm512_dpbf16_ps(part[m][chain], w0, (__m512bh)_mm512_set1_epi32(*(const int32_t *)xk));
                part[m][chain + 1] =
                    _mm512_dpbf16_ps(part[m][chain + 1], w1, (__m512bh)_mm512_set1_epi32(*(const int32_t *)(xk + 2)));
            }
        }
        if (mode == AMX_INT4 && (k + 1) % group_tiles == 0) {
            const int g = k / group_tiles;
            const __m512 sc = _mm512_loadu_ps(group_scales + (int64_t)g * N + n0);
            for (int m = 0; m < rows; m++) {
                const __m512 offset = _mm512_set1_ps(INT4_OFFSET * x_group_sums[m * (kt / group_tiles) + g]);
                total[m] = _mm512_fmadd_ps(_mm512_sub_ps(chains_sum(part[m]), offset), sc, total[m]);
                part[m][0] = part[m][1] = part[m][2] = part[m][3] = _mm512_setzero_ps();
            }
        }
    }
    for (int m = 0; m < rows; m++)
        amx_out_f32(out, mode, mode == AMX_INT4 ? total[m] : chains_sum(part[m]), (int64_t)m * N + n0, n0);
}

static void tile_gemv(const uint16_t *x, int64_t M, int K, const uint8_t *w, int N, int mode, const float *group_scales,
                      int group_tiles, const amx_out_t *out) {
    const int64_t tile_bytes = mode == AMX_FP8 ? 512 : 256;  /* int4 */
    const int64_t stream = (int64_t)(K / 32) * tile_bytes;
    float *x_group_sums = NULL; /* int4: each row's sum of x over each group */
    if (mode == AMX_INT4) x_group_sums = (float *)malloc(sizeof(float) * (size_t)(M * (K / (32 * group_tiles))));
    if (mode == AMX_INT4)
        for (int64_t m = 0; m < M; m++)
            for (int g = 0; g < K / (32 * group_tiles); g++) {
                float sum = 0.0f;
                for (int k = g * 32 * group_tiles; k < (g + 1) * 32 * group_tiles; k++) sum += bf16_to_f32(x[m * K + k]);
                x_group_sums[m * (K / (32 * group_tiles)) + g] = sum;
            }
    /* rows and mode made constants in each copy of the inlined loop (no per-chunk branch on them) */
#define TILE_GEMV(MODE)                                                                                              \
    _Pragma("omp parallel for schedule(static)") for (int j = 0; j < N / 16; j++) {                                 \
        if (M == 1) tile_gemv_rows(x, 1, K, w + j * stream, tile_bytes, MODE, group_scales, group_tiles, N, j * 16,  \
                                   x_group_sums, out);                                                               \
        else tile_gemv_rows(x, 2, K, w + j * stream, tile_bytes, MODE, group_scales, group_tiles, N, j * 16,         \
                            x_group_sums, out);                                                                      \
    }
    if (mode == AMX_INT4) {
        TILE_GEMV(AMX_INT4)
    } else {
        TILE_GEMV(AMX_FP8)
    }
#undef TILE_GEMV
    free(x_group_sums);
}
#define TILE_GEMV_ROWS 1 /* up to this many rows fp8 and int4 take tile_gemv (2 rows on AMX with its tiles in L1: fp8 steps of small 0.7x tile_gemv's, 2026-11-28 Xeon) */

/* x [M, K] bf16, w packed (32 k per tile), y [M, N] bf16. */
void gemm_bf16_amx(const uint16_t *x, int64_t M, int K, const uint8_t *w, int N, uint16_t *y) {
    const amx_out_t out = {y, 0, 1.0f, NULL, 1.0f};
    amx_gemm(x, M, (int64_t)K * 2, K / 32, w, N, AMX_BF16, NULL, 0, &out);
}

/* INT8-SQ: x rounded to int8 at input_scale as gemm_int8_vnni rounds it, then signed x signed (TDPBSSD), exact in
 * int32 as the VNNI kernel's sums, scaled in its order: the same output, bit for bit. w packed (64 k per tile; K
 * padded with zero weights to a multiple of 64). */
void gemm_int8_amx(const void *x, int64_t M, int K, const uint8_t *w, const float *scale, int N, void *y, int kind,
                   float input_scale) {
    const int kpad = (K + 63) / 64 * 64;
    uint8_t *xq = (uint8_t *)malloc((size_t)(M * kpad));
    quantize_rows(x, M, K, kpad, kind, input_scale, 0, xq);
    const amx_out_t out = {y, kind == F32, input_scale, scale, 1.0f};  /* (sum * input_scale) * scale[n], as VNNI's */
    amx_gemm(xq, M, kpad, kpad / 64, w, N, AMX_INT8, NULL, 0, &out);
    free(xq);
}
/* FP8: x rounded as calibrated and times 2^64 as gemm_fp8 prepares it, the fp8 tiles widened by its shift: the same
 * products; y = acc * scale[n] * 2^56 in bf16. w packed (pack_amx "fp8": 32 k per tile, 512 bytes). */
void gemm_fp8_amx(const uint16_t *x, int64_t M, int K, const uint8_t *w, const float *scale, int N, uint16_t *y,
                  int act_quant, float input_scale) {
    uint16_t *xs = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(M * K));
    shifted_activations(x, M, K, act_quant, input_scale, FP8_ACT_SHIFT, xs);
    const amx_out_t out = {y, 0, 1.0f, scale, FP8_OUT_SHIFT};  /* sum * (scale[n] * 2^56) */
    if (M > TILE_GEMV_ROWS) amx_gemm(xs, M, (int64_t)K * 2, K / 32, w, N, AMX_FP8, NULL, 0, &out);
    else tile_gemv(xs, M, K, w, N, AMX_FP8, NULL, 0, &out);
    free(xs);
}
/* INT4-AWQ / W4A8: x bf16 [M, K] (already rounded, as gemm_int4 takes it) times int4 tiles (pack_amx_int4: 32 k per
 * tile, 256 bytes) with group_scales [K / group, N] fp32 → y bf16 [M, N]; group a multiple of 32. */
void gemm_int4_amx(const uint16_t *x, int64_t M, int K, const uint8_t *w, const float *group_scales, int group, int N,
                   uint16_t *y) {
    const amx_out_t out = {y, 0, 1.0f, NULL, 1.0f};
    if (M > TILE_GEMV_ROWS) amx_gemm(x, M, (int64_t)K * 2, K / 32, w, N, AMX_INT4, group_scales, group / 32, &out);
    else tile_gemv(x, M, K, w, N, AMX_INT4, group_scales, group / 32, &out);
}

/* gemm_int4_a8 on AMX tiles, for prompt chunks: the same weights (pack_int4_lanes), activations (a8_rows) and
 * integers, so the same output bits. Why it fits: a lanes block's vector d holds in lane n the 4 bytes that pair
 * with activation bytes 4d .. 4d + 3 of a 128's low nibbles (and 64 + 4d .. of its high ones), which is row d of
 * an int8 B tile (16 outputs x 4 consecutive k, TDPBSSD's layout) once the nibbles are split: the low nibbles of
 * one 128's 16 vectors are the tile for its activation bytes 0-63, the high ones for 64-127, and the activation rows
 * in a8_rows' order are the A tile as they lie. Each 128's int32 sums (nibbles q + 8, from -8 sum x as the VNNI
 * kernel starts them) leave the tiles into the same fp32 FMA per output as int4_lanes_block's. Decode rows stay on
 * that VNNI kernel (a step of `small` at 1 / 4 / 16 sequences 1.65 / 2.31 / 7.97 ms there against 2.24 / 5.40 / 8.84
 * on the bf16-tile kernel, gemm_int4_amx, 2026-11-28 Xeon): the tile unit pays at prompt chunks. */
#if defined(HAVE_GEMM_INT4_A8)
#define HAVE_INT4_A8_TILES 1
/* This thread's split nibbles (grown, never freed: the OpenMP threads live as long as the process, and a buffer of
 * 100+ KiB from malloc at every call came from fresh pages each time) */
static __thread uint8_t *int4_split;
static __thread size_t int4_split_bytes;

/* Output blocks b0 .. b1 - 1 (16 outputs each) of gemm_int4_a8_amx from a8_rows' activations, in groups of 4 blocks
 * (4 accumulator tiles), rows in chunks of 16, on this thread. */
static void int4_a8_tile_blocks(a8_rows_t r, int64_t M, int K, const uint8_t *w, const float *scales, int group,
                                int N, uint16_t *y, int64_t b0, int64_t b1) {
    const int64_t chunks = K / 128, groups = K / group, per_group = group / 128;
    int32_t c[4][16 * 16] __attribute__((aligned(64)));
    float f[4][16][16] __attribute__((aligned(64)));
    int configured = -1;
    /* the split nibbles of a group's 4 blocks, every 128 of K: made by the first 16 rows, read by the rest */
    const size_t need = (size_t)chunks * 4 * 2048;
    if (int4_split_bytes < need) {
        free(int4_split);
        int4_split = (uint8_t *)aligned_alloc(64, need);
        int4_split_bytes = need;
    }
    uint8_t *split = int4_split;
    const __m512i low = _mm512_set1_epi8(15), eight = _mm512_set1_epi8(8);
    for (int64_t j0 = b0; j0 < b1; j0 += 4) {
        const int count = b1 - j0 < 4 ? (int)(b1 - j0) : 4;
        const int64_t next_count = b1 - j0 - 4 < 4 ? b1 - j0 - 4 : 4;
        group_ahead_t ahead = group_ahead(w + (j0 + 4) * chunks * 1024, next_count * chunks * 1024, (M - 1) / 16, chunks);
        for (int64_t m0 = 0; m0 < M; m0 += 16) {
            const int rows = (int)(M - m0 < 16 ? M - m0 : 16);
            amx_configure(rows, &configured);
            /* the output lines this chunk of rows writes at its end, fetched for writing while its tiles run: a
             * prompt's outputs are written cold, and each chunk's stores stalled on their reads for ownership
             * (INT4-AWQ's and W4A8's 128-token prompts of `small` 0.89-0.93x with this, the gate/up GEMMs having run
             * 1.3x slower in the prompt than back to back, the output then in L2; 2026-11-29 AMX Xeon). amx_gemm's
             * prompts (bf16, INT8-SQ, fp8) measured no change with the same, so it has none. */
            for (int m = 0; m < rows; m++)
                for (int j = 0; j < count; j += 2) __builtin_prefetch(y + (m0 + m) * N + 16 * (j0 + j), 1, 3);
            for (int64_t k = 0; k < chunks; k++) {
                if (m0 > 0) fetch_group_ahead(&ahead);
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (int half = 0; half < 2; half++) {
                    _tile_loadd(4, r.xq + m0 * K + k * 128 + half * 64, K);
                    for (int j = 0; j < count; j++) {
                        uint8_t *tile = split + ((k * 4 + j) * 2 + half) * 1024;
                        if (m0 == 0 && half == 0) {
                            const uint8_t *src = w + ((j0 + j) * chunks + k) * 1024;
                            for (int d = 0; d < 16; d++) {
                                _mm_prefetch((const char *)src + AMX_PREFETCH + 64 * d, _MM_HINT_T0);
                                const __m512i v = _mm512_loadu_si512((const void *)(src + 64 * d));
                                _mm512_store_si512((void *)(tile + 64 * d),
                                                   _mm512_sub_epi8(_mm512_and_si512(v, low), eight));
                                _mm512_store_si512((void *)(tile + 1024 + 64 * d),
                                                   _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), eight));
                            }
                        }
                        if (j == 0) { _tile_loadd(5, tile, 64); _tile_dpbssd(0, 4, 5); }
                        else if (j == 1) { _tile_loadd(6, tile, 64); _tile_dpbssd(1, 4, 6); }
                        else if (j == 2) { _tile_loadd(5, tile, 64); _tile_dpbssd(2, 4, 5); }
                        else { _tile_loadd(6, tile, 64); _tile_dpbssd(3, 4, 6); }
                    }
                }
                __m512 sw[4];
                for (int j = 0; j < count; j++) {
                    AMX_STORE(j, c[j]);
                    sw[j] = _mm512_loadu_ps(scales + ((j0 + j) * groups + k / per_group) * 16);
                }
                for (int m = 0; m < rows; m++) {
                    const __m512 xs = _mm512_set1_ps(r.xs[(m0 + m) * chunks + k]);
                    for (int j = 0; j < count; j++)  /* the first 128 onto zeros (not f zeroed first: a memset) */
                        _mm512_store_ps(f[j][m], _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[j] + 16 * m)),
                                                                 _mm512_mul_ps(sw[j], xs),
                                                                 k ? _mm512_load_ps(f[j][m]) : _mm512_setzero_ps()));
                }
            }
            for (int j = 0; j < count; j++) {
                const int valid = N - 16 * (j0 + j) < 16 ? (int)(N - 16 * (j0 + j)) : 16;
                for (int m = 0; m < rows; m++) store_lanes(_mm512_load_ps(f[j][m]), y + (m0 + m) * N + 16 * (j0 + j), valid);
            }
        }
    }
}

void gemm_int4_a8_amx(const uint16_t *x, int64_t M, int K, const uint8_t *w, const float *scales, int group, int N,
                      uint16_t *y, float fp8_scale) {
    const a8_rows_t r = a8_rows(x, M, K, fp8_scale);
    const int64_t nb = (N + 15) / 16, quads = (nb + 3) / 4;
    #pragma omp parallel
    {   /* contiguous groups of 4 blocks per thread (as schedule(static)), so each fetches its own next group */
        const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
        const int64_t q0 = quads * t / T, q1 = quads * (t + 1) / T;
        if (q1 > q0) int4_a8_tile_blocks(r, M, K, w, scales, group, N, y, 4 * q0, 4 * q1 < nb ? 4 * q1 : nb);
    }
    free(r.xq);
}
#endif
#else
int amx_enable(void) { return 0; }
#endif
