/* Matmuls on weights kept in their GGUF block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q4_K, Q5_K, Q6_K, F16, BF16, F32): the file's bytes stay in memory (memory-mapped),
 * never expanded to float32.
 *
 * Exactness: every weight is the float32 that gguf.quants computes (quant_dequant.c), and
 * goes through the float32 kernel's own tile (lanes.h, matmul.c), which adds each output's
 * terms in one fixed order. A quantized matmul therefore gives bitwise the float32 path's
 * result, at any row count, and on any host.
 *
 * Speed: a thread dequantizes a tile of weight rows into a small buffer that stays in L1/L2 and
 * runs every row tile of x against it, so a decode step reads each quantized byte once
 * (98 MB a step for the default model instead of 540) and a prefill dequantizes each
 * weight once for all the prompt's rows.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lanes.h"
#include "quant.h"

/* ---- up to four rows of x: blocks dequantized in registers, straight into the FMAs ----
 *
 * A decode step of a few sequences multiplies a few rows, so dequantizing a tile into a buffer and
 * reading it back (the path below) costs a store and a load per weight besides the
 * unpacking, for one to four FMAs. Here each block's 32 weights are unpacked into four
 * registers and used at once. The weights are the same floats: d * q is exact in float32
 * (an f16 scale has 11 significant bits, q at most 8), so fma(d, q, m) rounds d * q + m
 * once, as d * q + m does; and each output's accumulator still takes its terms 8 at a
 * time in increasing k, then the tree of sum8: the float tile's sum, bit for bit.
 *
 * An f16 scale comes from a table built with f16() (so a NaN keeps its payload), which
 * costs two loads where the conversion cost a dozen instructions per block. */

#define PREFETCH_TILES 1
/* Outputs per tile by rows of x (at most FUSED_ROWS): with one row, 8 accumulators hide the
 * FMA latency; with more, rows x outputs accumulators must leave registers for the
 * unpacking (4 x 3 spilled some, and ran ~5% slower than 4 x 2). Past 4 rows, unpacking a tile
 * once into a buffer for all of them is faster (16 rows: 3.3 against 4.1 ms a row for the
 * default model's matmuls). */
#define QW 8
#define FUSED_ROWS 4
static inline int fused_width(int64_t M) { return M == 1 ? QW : M == 2 ? QW / 2 : 2; }

typedef void (*qtile_fn)(const float *, const uint8_t *, int64_t, int, float *, int64_t, int, int, const uint8_t *);

#ifdef BP_X86
static float f16_table[65536];

__attribute__((constructor)) static void fill_f16_table(void) {
    for (uint32_t h = 0; h < 65536; h++) {
        const uint8_t bytes[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
        f16_table[h] = f16(bytes);
    }
}

static inline const float *f16_at(const uint8_t *p) { return f16_table + (p[0] | (p[1] << 8)); }

/* Weights 8c..8c+7 of a Q4_0 / Q4_1 / Q8_0 block as floats (d, m: its scales, broadcast). */
static inline __attribute__((always_inline, target("avx2,fma")))
__m256 block_chunk(const uint8_t *blk, const int type, const int c, __m256 d, __m256 m) {
    if (type == T_Q8_0)
        return _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * c)))), d);
    /* bytes 0..7 (c = 0, 2) or 8..15 (c = 1, 3); low nibbles are weights 0..15, high ones 16..31 */
    const uint8_t *qs = blk + (type == T_Q4_1 ? 4 : 2);
    __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * (c & 1))));
    q = c < 2 ? _mm256_and_si256(q, _mm256_set1_epi32(0x0F)) : _mm256_srli_epi32(q, 4);
    return type == T_Q4_1 ? _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), m)
                          : _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(8))));
}

/* One tile: mt rows of x against nt weight rows, each output's accumulator taking its terms
 * 8 at a time in increasing k. x is `mt` rows interleaved by 8 (x[(k / 8 * mt + i) * 8 +
 * k % 8]; one row is just the row), so one pointer reaches every row; ACC_ROWS x ACC_COLS
 * bounds the accumulators, sized to each caller (a bigger array kept them in memory). */
#define QTILE_BODY(NAME, ACC_ROWS, ACC_COLS)                                                                 \
    static inline __attribute__((always_inline, target("avx2,fma"))) void NAME(                              \
        const float *x, const uint8_t *w, int64_t row_bytes, const int type, float *sums, int64_t K,         \
        const int mt, const int nt, const uint8_t *prefetch) {                                               \
        __m256 acc[ACC_ROWS][ACC_COLS];                                                                      \
        for (int i = 0; i < mt; i++)                                                                         \
            for (int j = 0; j < nt; j++) acc[i][j] = _mm256_setzero_ps();                                    \
        const int bytes = type == T_Q4_1 ? 20 : type == T_Q4_0 ? 18 : 34;                                    \
        for (int64_t b = 0; b < K / 32; b++) {                                                               \
            const float *xb = x + 32 * mt * b;                                                               \
            _Pragma("GCC unroll 8") /* fully: the accumulators must stay in registers */                     \
            for (int j = 0; j < nt; j++) {                                                                   \
                const uint8_t *blk = w + j * row_bytes + b * bytes;                                          \
                /* The tile after next, a line per block and row: this tile's rows are read side by      \
                 * side, which the hardware prefetcher follows badly (a prefetch never faults). */        \
                _mm_prefetch((const char *)(prefetch + (b * nt + j) * 64), _MM_HINT_T0);                     \
                const __m256 d = _mm256_broadcast_ss(f16_at(blk));                                           \
                const __m256 m = type == T_Q4_1 ? _mm256_broadcast_ss(f16_at(blk + 2)) : d;                  \
                _Pragma("GCC unroll 4")                                                                      \
                for (int c = 0; c < 4; c++) {                                                                \
                    const __m256 wc = block_chunk(blk, type, c, d, m);                                       \
                    for (int i = 0; i < mt; i++)                                                             \
                        acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + (c * mt + i) * 8), wc, acc[i][j]);  \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
        for (int i = 0; i < mt; i++)                                                                         \
            for (int j = 0; j < nt; j++) sums[i * QW + j] = hsum_avx2(acc[i][j]);                            \
    }

QTILE_BODY(qtile_narrow, 2, QW) /* one or two rows */
QTILE_BODY(qtile_wide, FUSED_ROWS, 2) /* three or four */

/* Constant type, row count and (for full tiles) width, so each case keeps its
 * accumulators in registers; a macro, since each ISA's function must inline the body
 * under its own target. */
#define QTILE_DISPATCH(TYPE)                                                                       \
    if (mt == 1 && nt == QW) qtile_narrow(x, w, row_bytes, TYPE, sums, K, 1, QW, prefetch);        \
    else if (mt == 2 && nt == QW / 2) qtile_narrow(x, w, row_bytes, TYPE, sums, K, 2, QW / 2, prefetch); \
    else if (mt <= 2) qtile_narrow(x, w, row_bytes, TYPE, sums, K, mt, nt, prefetch);              \
    else if (mt == 3 && nt == 2) qtile_wide(x, w, row_bytes, TYPE, sums, K, 3, 2, prefetch);       \
    else if (mt == 4 && nt == 2) qtile_wide(x, w, row_bytes, TYPE, sums, K, 4, 2, prefetch);       \
    else qtile_wide(x, w, row_bytes, TYPE, sums, K, mt, nt, prefetch)

#define QTILE_FN(NAME, TARGET)                                                                              \
    __attribute__((target(TARGET))) static void NAME(const float *x, const uint8_t *w, int64_t row_bytes, \
                                                     int type, float *sums, int64_t K, int mt, int nt,     \
                                                     const uint8_t *prefetch) {                            \
        switch (type) {                                                                                     \
        case T_Q4_0: QTILE_DISPATCH(T_Q4_0); return;                                                        \
        case T_Q4_1: QTILE_DISPATCH(T_Q4_1); return;                                                        \
        default: QTILE_DISPATCH(T_Q8_0); return;                                                            \
        }                                                                                                   \
    }

QTILE_FN(qtile_avx2, "avx2,fma")
/* AVX-512 hosts run the same 8-lane code, with 32 registers. */
QTILE_FN(qtile_avx512, "avx2,fma,avx512f,avx512vl")
#endif

/* y[:, 0:N] (+)= x @ w^T (+ b) for M <= FUSED_ROWS rows and a Q4_0 / Q4_1 / Q8_0 weight, by
 * `tile` (qtile_avx2 or qtile_avx512). */
static void linear_q_fused(qtile_fn tile, const float *x, const uint8_t *w, int type, int64_t row_bytes,
                           const float *b, float *y, int64_t ldy, int64_t M, int64_t N, int64_t K, int accumulate,
                           int num_threads) {
    const int width = fused_width(M);
    const int64_t num_tiles = (N + width - 1) / width;
    float *packed = NULL;
    if (M > 1) { /* the rows interleaved by 8 (the tile reads them through one pointer) */
        packed = aligned_alloc(64, (size_t)(M * K * 4 + 63) / 64 * 64);
        for (int64_t k8 = 0; k8 < K / 8; k8++)
            for (int64_t i = 0; i < M; i++) memcpy(packed + (k8 * M + i) * 8, x + i * K + k8 * 8, 32);
        x = packed;
    }
    /* Threads split outputs, never K: each output is summed by exactly one thread. */
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t t = 0; t < num_tiles; t++) {
        const int64_t n = t * width;
        const int nt = (int)(N - n < width ? N - n : width);
        float sums[FUSED_ROWS * QW];
        const int64_t next = n + PREFETCH_TILES * width < N ? n + PREFETCH_TILES * width : n;
        tile(x, w + n * row_bytes, row_bytes, type, sums, K, (int)M, nt, w + next * row_bytes);
        bp_store_tile(sums, QW, b, y, 0, n, (int)M, nt, ldy, accumulate);
    }
    free(packed);
}

/* y[:, 0:N] (+)= x @ w^T (+ b) through a buffer: each tile of weight rows dequantized once
 * (`dequant`: the weight's type's), then the float32 tile over it for every row tile of x. */
static void linear_q_buffered(dequant_fn dequant, const float *x, const uint8_t *w, int64_t row_bytes, const float *b,
                              float *y, int64_t ldy, int64_t M, int64_t N, int64_t K, int accumulate,
                              int num_threads) {
    tile_fn tile = bp_pick_tile();
    const int width = bp_tile_width(M);
    int64_t num_tiles = (N + width - 1) / width;
#pragma omp parallel num_threads(num_threads)
    {
        float *buf = aligned_alloc(64, (size_t)((NT * K * 4 + 63) / 64 * 64));
        float sums[MT * NT];
        /* Threads split outputs, never K: each output is summed by exactly one thread. */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < num_tiles; t++) {
            int64_t n = t * width;
            int nt = (int)(N - n < width ? N - n : width);
            if (t + 1 < num_tiles) /* the next tile's bytes, on their way to L2 meanwhile */
                for (int64_t off = 0; off < width * row_bytes && (n + width) * row_bytes + off < N * row_bytes;
                     off += 64)
                    __builtin_prefetch(w + (n + width) * row_bytes + off, 0, 2);
            for (int j = 0; j < nt; j++) dequant(w + (n + j) * row_bytes, K, buf + j * K);
            for (int64_t m = 0; m < M; m += MT) {
                int mt = (int)(M - m < MT ? M - m : MT);
                tile(x + m * K, buf, sums, K, NT, mt, nt, buf);
                bp_store_tile(sums, NT, b, y, m, n, mt, nt, ldy, accumulate);
            }
        }
        free(buf);
    }
}

/* y[:, 0:N] = x @ w^T (+ b), or += with accumulate; y's rows are ldy floats apart, so
 * several weights (Q, K and V of different types) can fill one fused output. */
void bp_linear_q(const float *x, const uint8_t *w, int type, int64_t row_bytes, const float *b, float *y,
                 int64_t ldy, int64_t M, int64_t N, int64_t K, int accumulate, int num_threads) {
    const block_type *t = bp_block_type(type);
    if (!t) return; /* not a type we run */
    qtile_fn fused_tile = BP_PICK(qtile_avx512, qtile_avx2, NULL);
    if (fused_tile && M <= FUSED_ROWS && (type == T_Q4_0 || type == T_Q4_1 || type == T_Q8_0))
        linear_q_fused(fused_tile, x, w, type, row_bytes, b, y, ldy, M, N, K, accumulate, num_threads);
    else
        linear_q_buffered(t->dequant, x, w, row_bytes, b, y, ldy, M, N, K, accumulate, num_threads);
}
