/* The float32 matmul, y = x @ w^T (+ b), and the dot product and tile it is made of: each
 * output one 8-lane accumulator walking K in order, then sum8's tree (lanes.h). quant_linear.c
 * runs this tile over the weights it dequantizes, and attention and the norm use its dot.
 */
#include <math.h>
#include <stdint.h>

#include "lanes.h"

/* ---------------- the one fixed-order sum ---------------- */

/* sum_k a[k] * b[k] in the 8-lane layout. The tail is zero-padded as the vector code's
 * masked loads pad it: fma(0, 0, -0) is +0, so a padded lane's sign of zero depends on
 * the padding being there. Cloned for CPUs with FMA (but maybe no AVX2), where fmaf is
 * an instruction rather than a libm call: fmaf rounds once, exactly, either way. */
__attribute__((target_clones("fma", "default")))
BP_INTERNAL float bp_dot8_scalar(const float *a, const float *b, int64_t K) {
    float lane[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8)
        for (int l = 0; l < 8; l++) lane[l] = fmaf(a[k + l], b[k + l], lane[l]);
    if (k < K)
        for (int l = 0; l < 8; l++) lane[l] = k + l < K ? fmaf(a[k + l], b[k + l], lane[l]) : fmaf(0.0f, 0.0f, lane[l]);
    return sum8(lane);
}

#ifdef BP_X86
/* bp_dot8_scalar in one register. */
__attribute__((target("avx2,fma")))
BP_INTERNAL float bp_dot8_avx2(const float *a, const float *b, int64_t K) {
    __m256 acc = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
    if (k < K) {
        __m256i mask = tail_mask_avx2(k, K);
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + k, mask), _mm256_maskload_ps(b + k, mask), acc);
    }
    return hsum_avx2(acc);
}
#endif

/* ---------------- linear: y[m, n] (+)= sum_k x[m, k] * w[n, k] (+ b[n]) ---------------- */

/* One tile: mt rows of x against nt rows of w, each output dot8's sum. The body is
 * inlined with constant mt, nt for full tiles (so the accumulators stay in registers) and
 * with variable ones for the edges; either way each output's terms are added in the same
 * order. The next tile's weights are prefetched into L2 while this one computes. */
#ifdef BP_X86
static inline __attribute__((always_inline, target("avx2,fma")))
void tile_ymm_body(const float *x, const float *w, float *y, int64_t K, int64_t N, const int mt, const int nt,
                   const float *next_w) {
    __m256 acc[MT][NT];
    for (int i = 0; i < mt; i++)
        for (int j = 0; j < nt; j++) acc[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 wv[NT];
        for (int j = 0; j < nt; j++) {
            wv[j] = _mm256_loadu_ps(w + j * K + k);
            _mm_prefetch((const char *)(next_w + j * K + k), _MM_HINT_T1);
        }
        for (int i = 0; i < mt; i++) {
            __m256 xv = _mm256_loadu_ps(x + i * K + k);
            for (int j = 0; j < nt; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (k < K) {
        __m256i mask = tail_mask_avx2(k, K);
        __m256 wv[NT];
        for (int j = 0; j < nt; j++) wv[j] = _mm256_maskload_ps(w + j * K + k, mask);
        for (int i = 0; i < mt; i++) {
            __m256 xv = _mm256_maskload_ps(x + i * K + k, mask);
            for (int j = 0; j < nt; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (mt == 4) { /* a column's four sums at once: the same trees (hsum4_avx2) */
        for (int j = 0; j < nt; j++) {
            float col[4];
            _mm_storeu_ps(col, hsum4_avx2(acc[0][j], acc[1][j], acc[2][j], acc[3][j]));
            for (int i = 0; i < 4; i++) y[i * N + j] = col[i];
        }
        return;
    }
    for (int i = 0; i < mt; i++)
        for (int j = 0; j < nt; j++) y[i * N + j] = hsum_avx2(acc[i][j]);
}

/* Full tiles get the body inlined with constant mt and nt (accumulators in registers); the
 * edges get it with variable ones. A macro, since each ISA's function must inline it under
 * its own target attribute. */
#define TILE_YMM_DISPATCH                                                       \
    if (nt == NT && mt <= 2) {                                                  \
        if (mt == 2) tile_ymm_body(x, w, y, K, N, 2, NT, next_w);              \
        else tile_ymm_body(x, w, y, K, N, 1, NT, next_w);                      \
        return;                                                                 \
    }                                                                           \
    if (nt == NT_BATCH) {                                                       \
        switch (mt) {                                                           \
        case 4: tile_ymm_body(x, w, y, K, N, 4, NT_BATCH, next_w); return;      \
        case 3: tile_ymm_body(x, w, y, K, N, 3, NT_BATCH, next_w); return;      \
        case 2: tile_ymm_body(x, w, y, K, N, 2, NT_BATCH, next_w); return;      \
        case 1: tile_ymm_body(x, w, y, K, N, 1, NT_BATCH, next_w); return;      \
        }                                                                       \
    }                                                                           \
    tile_ymm_body(x, w, y, K, N, mt, nt, next_w)

__attribute__((target("avx2,fma")))
static void tile_avx2(const float *x, const float *w, float *y, int64_t K, int64_t N, int mt, int nt,
                      const float *next_w) {
    TILE_YMM_DISPATCH;
}

/* The same source compiled for AVX-512: still 8-lane (ymm) FMAs, since 16-lane
 * accumulators would sum other terms together, but with the 32 registers of AVX512VL the
 * 16 accumulators and their operands fit without spilling. */
__attribute__((target("avx2,fma,avx512f,avx512vl")))
static void tile_avx512(const float *x, const float *w, float *y, int64_t K, int64_t N, int mt, int nt,
                        const float *next_w) {
    TILE_YMM_DISPATCH;
}
#endif

static void tile_scalar(const float *x, const float *w, float *y, int64_t K, int64_t N, int mt, int nt,
                        const float *next_w) {
    (void)next_w;
    for (int i = 0; i < mt; i++)
        for (int j = 0; j < nt; j++) y[i * N + j] = bp_dot8_scalar(x + i * K, w + j * K, K);
}

tile_fn bp_pick_tile(void) { return BP_PICK(tile_avx512, tile_avx2, tile_scalar); }

/* y = x @ w^T (+ b), or with accumulate, y += x @ w^T (+ b): the residual add done as
 * the output is written, one rounding per add as in torch's `y + linear(x)`. */
void bp_linear_f32(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t N, int64_t K,
                   int accumulate, int num_threads) {
    tile_fn tile = bp_pick_tile();
    const int width = bp_tile_width(M);
    int64_t num_tiles = (N + width - 1) / width;
    /* Threads split outputs, never K: each output is summed by exactly one thread. */
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t t = 0; t < num_tiles; t++) {
        int64_t n = t * width;
        int nt = (int)(N - n < width ? N - n : width);
        const float *next_w = w + (t + 1 < num_tiles ? n + width : n) * K;
        float sums[MT * NT];
        for (int64_t m = 0; m < M; m += MT) {
            int mt = (int)(M - m < MT ? M - m : MT);
            tile(x + m * K, w + n * K, sums, K, NT, mt, nt, m == 0 ? next_w : w + n * K);
            bp_store_tile(sums, NT, b, y, m, n, mt, nt, N, accumulate);
        }
    }
}
