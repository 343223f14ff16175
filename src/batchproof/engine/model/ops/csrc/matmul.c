/* The float32 matmul, y = x @ w^T (+ b), and the dot product and tile it is made of: each
 * output one 8-lane accumulator walking K in order, then sum8's tree (lanes.h). quant_linear.c
 * runs this tile over the weights it dequantizes, and attention and the norm use its dot.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lanes.h"

/* ---------------- the one fixed-order sum ---------------- */

/* sum_k a[k] * b[k] in the 8-lane layout. The tail is zero-padded as the vector code's
 * masked loads pad it: fma(0, 0, -0) is +0, so a padded lane's sign of zero depends on
 * the padding being there. The portable path (BP_PICK's third choice): on baseline x86-64
 * fmaf is a libm call (glibc's takes the FMA instruction where the CPU has one), an
 * instruction elsewhere; it rounds once, exactly, either way. */
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

/* AVX-512 hosts take one row of x through the same 8-lane code, with 32 registers; two or
 * more rows go through the tile of rows packed in pairs below (lanes.h). */
__attribute__((target("avx2,fma,avx512f,avx512vl")))
static void tile_avx512(const float *x, const float *w, float *y, int64_t K, int64_t N, int mt, int nt,
                        const float *next_w) {
    TILE_YMM_DISPATCH;
}
#endif

#ifdef BP_X86
/* PT_ROWS rows of x (packed in pairs) against nt weight rows: lanes.h. */
static inline __attribute__((always_inline, target("avx2,fma,avx512f,avx512vl,avx512dq")))
void pair_tile_body(const float *xp, const float *w, float *sums, int64_t K, const int pairs, const int mt,
                    const int nt, const float *next_w) {
    const int64_t stride = bp_pair_stride(K);
    __m512 acc[PT_ROWS / 2][NT];
    for (int p = 0; p < pairs; p++)
        for (int j = 0; j < nt; j++) acc[p][j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m512 wv[NT];
        for (int j = 0; j < nt; j++) {
            wv[j] = _mm512_broadcast_f32x8(_mm256_loadu_ps(w + j * K + k));
            _mm_prefetch((const char *)(next_w + j * K + k), _MM_HINT_T1);
        }
        for (int p = 0; p < pairs; p++) {
            const __m512 xv = _mm512_loadu_ps(xp + p * stride + 2 * k);
            for (int j = 0; j < nt; j++) acc[p][j] = _mm512_fmadd_ps(xv, wv[j], acc[p][j]);
        }
    }
    if (k < K) { /* x is zero-padded; the weights' tail is masked to zero, as the 8-lane tile's */
        const __mmask8 mask = (__mmask8)((1u << (K - k)) - 1);
        __m512 wv[NT];
        for (int j = 0; j < nt; j++) wv[j] = _mm512_broadcast_f32x8(_mm256_maskz_loadu_ps(mask, w + j * K + k));
        for (int p = 0; p < pairs; p++) {
            const __m512 xv = _mm512_loadu_ps(xp + p * stride + 2 * k);
            for (int j = 0; j < nt; j++) acc[p][j] = _mm512_fmadd_ps(xv, wv[j], acc[p][j]);
        }
    }
    for (int j = 0; j < nt; j++)
        for (int p = 0; p < pairs; p++) {
            const __m256 lo = _mm512_castps512_ps256(acc[p][j]), hi = _mm512_extractf32x8_ps(acc[p][j], 1);
            sums[2 * p * NT + j] = hsum_avx2(lo);
            if (2 * p + 1 < mt) sums[(2 * p + 1) * NT + j] = hsum_avx2(hi);
        }
}

__attribute__((target("avx2,fma,avx512f,avx512vl,avx512dq")))
static void pair_tile_avx512(const float *xp, const float *w, float *sums, int64_t K, int mt, int nt,
                             const float *next_w) {
    /* a constant count of pairs and outputs keeps the accumulators in registers */
    if (nt == NT) {
        switch ((mt + 1) / 2) {
        case 4: pair_tile_body(xp, w, sums, K, 4, mt, NT, next_w); return;
        case 3: pair_tile_body(xp, w, sums, K, 3, mt, NT, next_w); return;
        case 2: pair_tile_body(xp, w, sums, K, 2, mt, NT, next_w); return;
        case 1: pair_tile_body(xp, w, sums, K, 1, mt, NT, next_w); return;
        }
    }
    pair_tile_body(xp, w, sums, K, (mt + 1) / 2, mt, nt, next_w);
}
#endif

pair_tile_fn bp_pick_pair_tile(void) { return BP_PICK(pair_tile_avx512, NULL, NULL); }

float *bp_pairs_alloc(int64_t M, int64_t K) {
    return aligned_alloc(64, (size_t)(((M + 1) / 2 * bp_pair_stride(K) * 4 + 63) / 64 * 64));
}

void bp_pack_pairs(const float *x, int64_t M, int64_t K, float *xp) {
    const int64_t chunks = (K + 7) / 8, pairs = (M + 1) / 2, stride = bp_pair_stride(K);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < pairs * chunks; u++) {
        const int64_t p = u / chunks, c = u % chunks, k0 = c * 8, n = K - k0 < 8 ? K - k0 : 8;
        float *chunk = xp + p * stride + c * 16;
        for (int r = 0; r < 2; r++) {
            const int64_t have = 2 * p + r < M ? n : 0;
            if (have) memcpy(chunk + 8 * r, x + (2 * p + r) * K + k0, (size_t)have * 4);
            if (have < 8) memset(chunk + 8 * r + have, 0, (size_t)(8 - have) * 4);
        }
    }
}

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
    /* AVX-512: rows of x two a register, packed once here (lanes.h) */
    pair_tile_fn pair_tile = M >= 2 ? bp_pick_pair_tile() : NULL;
    float *xp = pair_tile ? bp_pairs_alloc(M, K) : NULL;
    const int64_t rows = pair_tile ? PT_ROWS : MT, pair_stride = bp_pair_stride(K);
    const int width = bp_tile_width(M);
    int64_t num_tiles = (N + width - 1) / width;
#pragma omp parallel num_threads(num_threads)
    {
        if (xp) bp_pack_pairs(x, M, K, xp); /* by the threads together, then their barrier */
        /* Threads split outputs, never K: each output is summed by exactly one thread. */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < num_tiles; t++) {
            int64_t n = t * width;
            int nt = (int)(N - n < width ? N - n : width);
            const float *next_w = w + (t + 1 < num_tiles ? n + width : n) * K;
            float sums[PT_ROWS * NT];
            for (int64_t m = 0; m < M; m += rows) {
                int mt = (int)(M - m < rows ? M - m : rows);
                const float *prefetch = m == 0 ? next_w : w + n * K;
                if (pair_tile) pair_tile(xp + m / 2 * pair_stride, w + n * K, sums, K, mt, nt, prefetch);
                else tile(x + m * K, w + n * K, sums, K, NT, mt, nt, prefetch);
                bp_store_tile(sums, NT, b, y, m, n, mt, nt, N, accumulate);
            }
        }
    }
    free(xp);
}
