/* An experiment, not part of the package (nothing builds or tests it): Q4_1 weights with 8
 * rows interleaved, so that the vector lanes are weight rows instead of k, for one row of x
 * and for two to four (a decode step of a few sequences). bench/interleaved_q4_1.py compiles
 * it, checks its outputs against the library's bit for bit, and times both.
 *
 * Why: on a Zen 1 every 8-lane instruction costs about an FMA's time, and the register path
 * (quant_tiles.h) pays, besides each weight's unpacking, two broadcasts per block and row for
 * the f16 scales d and m, through the conversion table. Here the 8 rows' scales are one
 * vector load each (converted to float once, at repacking), and x is broadcast once per k
 * for all 8 rows (precomputed, a memory operand of the FMA).
 *
 * The same bits: each weight is fma(d, q, m), as there. Each output keeps 8 partial sums,
 * one per k mod 8, each taking its terms in increasing k (block by block: k = c, c + 8,
 * c + 16, c + 24 for class c), and ends with sum8's tree, done lane by lane across the 8
 * classes' vectors (lane j is output j), the same adds in the same order as hsum_avx2.
 *
 * Repacked block, per group of 8 rows and per block of 32 k: d[8], m[8] as float32, then 16
 * chunks of 8 bytes, chunk p's byte j being row j's quant byte p (weights p and p + 16 of
 * the block, low and high nibble): 192 bytes for the 160 of 8 GGUF blocks. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GROUP_BLOCK 192

__attribute__((target("f16c"))) static float f16_to_f32(uint16_t h) {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); /* exact (a NaN's payload aside) */
}

/* w: N rows of K / 32 GGUF Q4_1 blocks (20 bytes each); N a multiple of 8. */
void repack(const uint8_t *w, int64_t N, int64_t K, uint8_t *out) {
    const int64_t blocks = K / 32, row_bytes = blocks * 20;
    for (int64_t g = 0; g < N / 8; g++)
        for (int64_t b = 0; b < blocks; b++) {
            uint8_t *o = out + (g * blocks + b) * GROUP_BLOCK;
            float scales[16];
            for (int j = 0; j < 8; j++) {
                const uint8_t *blk = w + (g * 8 + j) * row_bytes + b * 20;
                uint16_t d, m;
                memcpy(&d, blk, 2);
                memcpy(&m, blk + 2, 2);
                scales[j] = f16_to_f32(d);
                scales[8 + j] = f16_to_f32(m);
                for (int p = 0; p < 16; p++) o[64 + p * 8 + j] = blk[4 + p];
            }
            memcpy(o, scales, 64);
        }
}

/* One group of 8 weight rows against MT rows of x, CP classes (k mod 8) at a time: CP * MT
 * accumulators, enough independent chains to hide the FMA latency and few enough for AVX2's
 * 16 registers (one row: all 8 classes in one pass; two: 4; three: 4; four: 2). A group's
 * weights (3.5 KB at K = 576) stay in L1 between passes; each pass unpacks only its own
 * classes' quants, so every weight is still unpacked once. xb: x's rows broadcast, 8 floats
 * per k (row i's k at xb + (i * K + k) * 8). */
#define GROUP_KERNEL(NAME, CP, MT)                                                                             \
    __attribute__((target("avx2,fma"))) static void NAME(const float *xb, const uint8_t *packed, float *y,    \
                                                         int64_t N, int64_t K, int64_t g) {                    \
        const int64_t blocks = K / 32;                                                                        \
        const __m256i nibble = _mm256_set1_epi32(0x0F);                                                       \
        __m256 part[MT][8]; /* part[i][c], lane j: row i of x against weight row j, the k = c mod 8 */        \
        for (int c0 = 0; c0 < 8; c0 += CP) {                                                                  \
            __m256 acc[CP][MT];                                                                               \
            for (int cc = 0; cc < CP; cc++)                                                                   \
                for (int i = 0; i < MT; i++) acc[cc][i] = _mm256_setzero_ps();                                \
            for (int64_t b = 0; b < blocks; b++) {                                                            \
                const uint8_t *o = packed + (g * blocks + b) * GROUP_BLOCK;                                   \
                if (c0 == 0)                                                                                  \
                    for (int line = 0; line < 3; line++)                                                      \
                        _mm_prefetch((const char *)(o + 4 * GROUP_BLOCK + 64 * line), _MM_HINT_T0);           \
                const __m256 d = _mm256_loadu_ps((const float *)o), m = _mm256_loadu_ps((const float *)o + 8); \
                _Pragma("GCC unroll 8") for (int cc = 0; cc < CP; cc++) {                                     \
                    const int c = c0 + cc; /* k = c, c + 8 (low nibbles), c + 16, c + 24 (high) */            \
                    const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(o + 64 + 8 * c))); \
                    const __m256i e =                                                                         \
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(o + 64 + 8 * (c + 8))));       \
                    const __m256i q[4] = {_mm256_and_si256(a, nibble), _mm256_and_si256(e, nibble),           \
                                          _mm256_srli_epi32(a, 4), _mm256_srli_epi32(e, 4)};                  \
                    _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {                                     \
                        const __m256 w = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q[t]), m);                     \
                        const int64_t k = 32 * b + c + 8 * t;                                                 \
                        _Pragma("GCC unroll 4") for (int i = 0; i < MT; i++) acc[cc][i] =                     \
                            _mm256_fmadd_ps(_mm256_load_ps(xb + (i * K + k) * 8), w, acc[cc][i]);             \
                    }                                                                                         \
                }                                                                                             \
            }                                                                                                 \
            for (int cc = 0; cc < CP; cc++)                                                                   \
                for (int i = 0; i < MT; i++) part[i][c0 + cc] = acc[cc][i];                                   \
        }                                                                                                     \
        /* sum8's tree, lane by lane: (l0 + l4, l1 + l5, l2 + l6, l3 + l7), then (t0 + t2) + (t1 + t3) */     \
        for (int i = 0; i < MT; i++) {                                                                        \
            const __m256 t0 = _mm256_add_ps(part[i][0], part[i][4]), t1 = _mm256_add_ps(part[i][1], part[i][5]); \
            const __m256 t2 = _mm256_add_ps(part[i][2], part[i][6]), t3 = _mm256_add_ps(part[i][3], part[i][7]); \
            _mm256_storeu_ps(y + i * N + 8 * g, _mm256_add_ps(_mm256_add_ps(t0, t2), _mm256_add_ps(t1, t3)));   \
        }                                                                                                     \
    }

GROUP_KERNEL(group_rows1, 8, 1)
GROUP_KERNEL(group_rows2, 4, 2)
GROUP_KERNEL(group_rows3, 4, 3)
GROUP_KERNEL(group_rows4, 2, 4)

/* y[M, N] = x[M, K] @ w^T for 1 <= M <= 4 rows of x, w repacked. */
__attribute__((target("avx2,fma"))) void linear_interleaved(const float *x, int64_t M, const uint8_t *packed,
                                                            float *y, int64_t N, int64_t K, int num_threads) {
    float *xb = aligned_alloc(32, (size_t)(M * K * 32));
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++) _mm256_store_ps(xb + (i * K + k) * 8, _mm256_set1_ps(x[i * K + k]));
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t g = 0; g < N / 8; g++) {
        switch (M) {
        case 1: group_rows1(xb, packed, y, N, K, g); break;
        case 2: group_rows2(xb, packed, y, N, K, g); break;
        case 3: group_rows3(xb, packed, y, N, K, g); break;
        default: group_rows4(xb, packed, y, N, K, g); break;
        }
    }
    free(xb);
}
