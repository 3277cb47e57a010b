/* Decode attention called from a C loop, no Python between the calls: one step's attention (every layer) of
 * `small`'s shapes (12 query heads over 4 kv heads of 64, bf16), over a paged cache on 2 MiB pages, the context's
 * blocks in order or scattered at random. Used for the variants written in perf/README ("What is still open
 * there"): build one binary per variant of decode_kernels.c and run them in interleaved rounds, since this VM's
 * memory speed flips between runs:
 *
 *   gcc -std=gnu11 -O3 -march=native -fopenmp -fno-math-errno -DKERNELS='"../toolkit/engine/runtime/csrc/decode_kernels.c"' \
 *       -DTAG='"head"' -o /tmp/attention_loop perf/attention_loop.c -lm
 *   OMP_NUM_THREADS=2 /tmp/attention_loop SEQUENCES CONTEXT LAYERS SCATTERED [EVICT_MIB]    # e.g. 16 160 16 1
 *
 * BLOCK=32 in the environment: 32 tokens a block (the configs' tokens_per_block) instead of 16.
 * Prints the best of 30 steps, in us a layer and GB/s of K and V read. With EVICT_MIB, each layer's call is timed
 * alone after a read of that many MiB (untimed), as in a served step, where the layer's weights stream through the
 * caches between one step's attention and the next: the cache comes from memory, not from L2 / L3. */
#include KERNELS
#include <stdio.h>
#include <sys/mman.h>

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: %s SEQUENCES CONTEXT LAYERS SCATTERED(0/1) [EVICT_MIB]\n", argv[0]);
        return 2;
    }
    int seqs = atoi(argv[1]), ctx = atoi(argv[2]), layers = atoi(argv[3]), scattered = atoi(argv[4]);
    size_t evict = argc == 6 ? (size_t)atoi(argv[5]) << 20 : 0;
    float *other = evict ? malloc(evict) : NULL;  /* what streams through the caches between the calls */
    for (size_t i = 0; i < evict / 4; i++) other[i] = 1.0f;
    volatile float sink = 0.0f;
    int heads = 12, kv_heads = 4, head_dim = 64, block = getenv("BLOCK") ? atoi(getenv("BLOCK")) : 16, per_seq = (ctx + block - 1) / block;
    int blocks = seqs * per_seq * 3;  /* a cache three times what the batch holds, as attention_bench.py */
    size_t layer_elems = (size_t)blocks * block * kv_heads * head_dim, bytes = 2 * layers * layer_elems * 2;
    size_t huge = (size_t)1 << 21;
    uint16_t *cache = aligned_alloc(huge, (bytes + huge - 1) & ~(huge - 1));
    madvise(cache, bytes, MADV_HUGEPAGE);
    for (size_t i = 0; i < bytes / 2; i++) cache[i] = (uint16_t)(0x3c00 + i * 7919 % 512);  /* small bf16 values */
    int64_t *tables = malloc(sizeof(int64_t) * seqs * per_seq), *lens = malloc(sizeof(int64_t) * seqs);
    int *order = malloc(sizeof(int) * blocks);
    for (int i = 0; i < blocks; i++) order[i] = i;
    srand(1);
    for (int i = blocks - 1; i > 0; i--) {
        int j = rand() % (i + 1), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    for (int i = 0; i < seqs * per_seq; i++) tables[i] = scattered ? order[i] : i;
    for (int i = 0; i < seqs; i++) lens[i] = ctx;
    uint16_t *q = malloc(2 * (size_t)seqs * heads * head_dim), *out = malloc(2 * (size_t)seqs * heads * head_dim);
    for (int i = 0; i < seqs * heads * head_dim; i++) q[i] = (uint16_t)(0x3f80 + i % 64);
    double best = 1e9;
    for (int rep = 0; rep < 30; rep++) {
        double took = 0.0;
        for (int l = 0; l < layers; l++) {
            uint16_t *k = cache + (size_t)2 * l * layer_elems, *v = k + layer_elems;
            if (evict) {
                float s = 0.0f;
                #pragma omp parallel for reduction(+ : s)
                for (size_t i = 0; i < evict / 4; i += 16) s += other[i];
                sink += s;
            }
            double start = seconds();
            decode_attention(q, k, v, tables, lens, out, seqs, heads, kv_heads, head_dim, per_seq, block, 1.0f, 1.0f,
                             BF16, BF16);
            took += seconds() - start;
        }
        best = took < best ? took : best;
    }
    double kv = 2.0 * layers * seqs * ctx * kv_heads * head_dim * 2;
    printf("%-10s %2d sequences x %4d tokens, %2d layers, blocks %s%s: %.1f us a layer, %.1f GB/s\n", TAG, seqs, ctx,
           layers, scattered ? "scattered" : "in order", evict ? ", from memory" : "", best / layers * 1e6, kv / best / 1e9);
    return 0;
}
