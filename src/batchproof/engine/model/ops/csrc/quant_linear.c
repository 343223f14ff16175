/* Matmuls on weights kept in their GGUF block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q4_K, Q5_K, Q6_K, F16, BF16, F32): the file's bytes stay in memory (memory-mapped),
 * never expanded to float32.
 *
 * Exactness: every weight is the float32 that gguf.quants computes (quant_dequant.c), and
 * each output's terms are added in the float32 kernel's one fixed order (lanes.h, matmul.c).
 * A quantized matmul therefore gives bitwise the float32 path's result, at any row count,
 * and on any host.
 *
 * Speed, two ways by row count (each the same bits). Up to four rows of x (a decode step of
 * a few sequences): each block is unpacked in registers, straight into the FMAs
 * (quant_tiles*.c), since with one to four FMAs per weight a store and a load per weight
 * through a buffer cost about as much as the arithmetic. More rows: a thread dequantizes a
 * tile of weight rows into a small buffer that stays in L1/L2 and runs every row tile of x
 * against it (the float32 kernel's own tile), so each weight is unpacked once for all the
 * rows. Either way a step reads each quantized byte once (98 MB a step for the default model
 * instead of 540).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lanes.h"
#include "quant.h"

#define PREFETCH_TILES 1

/* y[:, 0:N] (+)= x @ w^T (+ b) for M <= FUSED_ROWS rows, by `tile` (bp_pick_qtile's). */
static void linear_q_fused(qtile_fn tile, const float *x, const uint8_t *w, int type, int64_t row_bytes,
                           const float *b, float *y, int64_t ldy, int64_t M, int64_t N, int64_t K, int accumulate,
                           int num_threads) {
    const int width = fused_width(type, M);
    const int64_t num_tiles = (N + width - 1) / width;
    /* More than one row: the rows interleaved by 8 (the tile reads them through one pointer) */
    float *packed = M > 1 ? aligned_alloc(64, (size_t)(M * K * 4 + 63) / 64 * 64) : NULL;
    const float *xt = packed ? packed : x;
#pragma omp parallel num_threads(num_threads)
    {
        /* Packed by both threads, before any tile reads it (the loop's closing barrier): packed
         * by one, the other spun beside it, which on 2 cores slowed the packing several times
         * over (int8's quantize of x measured ~4x: quant_int8_linear.c). */
        if (packed) {
#pragma omp for schedule(static)
            for (int64_t k8 = 0; k8 < K / 8; k8++)
                for (int64_t i = 0; i < M; i++) memcpy(packed + (k8 * M + i) * 8, x + i * K + k8 * 8, 32);
        }
        /* Threads split outputs, never K: each output is summed by exactly one thread. */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < num_tiles; t++) {
            const int64_t n = t * width;
            const int nt = (int)(N - n < width ? N - n : width);
            float sums[TALL_ROWS * QW];
            const int64_t next = n + PREFETCH_TILES * width < N ? n + PREFETCH_TILES * width : n;
            tile(xt, w + n * row_bytes, row_bytes, sums, K, (int)M, nt, w + next * row_bytes);
            bp_store_tile(sums, QW, b, y, 0, n, (int)M, nt, ldy, accumulate);
        }
    }
    free(packed);
}

/* y[:, 0:N] (+)= x @ w^T (+ b) for a few more rows than FUSED_ROWS, by `tile` (bp_pick_xtile's):
 * x packed in pairs once, each weight tile unpacked once per XP_ROWS rows. */
static void linear_q_xpairs(xtile_fn tile, const float *x, const uint8_t *w, int64_t row_bytes, const float *b,
                            float *y, int64_t ldy, int64_t M, int64_t N, int64_t K, int accumulate, int num_threads) {
    float *xp = bp_pairs_alloc(M, K);
    const int64_t stride = bp_pair_stride(K), num_tiles = (N + XP_WIDTH - 1) / XP_WIDTH;
#pragma omp parallel num_threads(num_threads)
    {
        bp_pack_pairs(x, M, K, xp); /* by the threads together, then their barrier */
        /* Threads split outputs, never K: each output is summed by exactly one thread. */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < num_tiles; t++) {
            const int64_t n = t * XP_WIDTH;
            const int nt = (int)(N - n < XP_WIDTH ? N - n : XP_WIDTH);
            const int64_t next = n + XP_WIDTH < N ? n + XP_WIDTH : n;
            float sums[XP_ROWS * QW];
            for (int64_t m = 0; m < M; m += XP_ROWS) {
                const int mt = (int)(M - m < XP_ROWS ? M - m : XP_ROWS);
                tile(xp + m / 2 * stride, stride, w + n * row_bytes, row_bytes, sums, K, mt, nt, w + next * row_bytes);
                bp_store_tile(sums, QW, b, y, m, n, mt, nt, ldy, accumulate);
            }
        }
    }
    free(xp);
}

/* Dequantized weights a thread keeps for one pass over x: a group of weight tiles, sized to
 * sit in L2 beside the rows of x it meets. A prefill's x (677 rows x 576 floats: 1.5 MB) does
 * not fit in L2, so each pass over it streams from L3; a group of tiles per pass instead of
 * one cuts that traffic by the group's size (the matmuls ran ~5-8% faster at M = 677). */
#define GROUP_BYTES (96 * 1024)

/* y[:, 0:N] (+)= x @ w^T (+ b) through a buffer: a group of weight tiles dequantized once
 * (`dequant`: the weight's type's), then for each row tile of x the float32 tile over each of
 * them. Each output is still one tile call's sum over the same x and weights: the grouping
 * changes only the order in which outputs are computed, never a bit of one. */
static void linear_q_buffered(dequant_fn dequant, const float *x, const uint8_t *w, int64_t row_bytes, const float *b,
                              float *y, int64_t ldy, int64_t M, int64_t N, int64_t K, int accumulate,
                              int num_threads) {
    tile_fn tile = bp_pick_tile();
    /* AVX-512: rows of x two a register, packed once here (lanes.h) */
    pair_tile_fn pair_tile = M >= 2 ? bp_pick_pair_tile() : NULL;
    float *xp = pair_tile ? bp_pairs_alloc(M, K) : NULL;
    const int64_t rows = pair_tile ? PT_ROWS : MT, pair_stride = bp_pair_stride(K);
    const int width = bp_tile_width(M);
    const int64_t num_tiles = (N + width - 1) / width, tile_bytes = (int64_t)NT * K * 4;
    const int64_t most = GROUP_BYTES / tile_bytes > 1 ? GROUP_BYTES / tile_bytes : 1; /* tiles a group may hold */
    /* A multiple of the threads, so each thread gets as many groups (an empty one is skipped) */
    const int64_t threads = num_threads > 1 ? num_threads : 1;
    const int64_t num_groups = ((num_tiles + most - 1) / most + threads - 1) / threads * threads;
    const int64_t group = (num_tiles + num_groups - 1) / num_groups; /* the largest group's tiles */
#pragma omp parallel num_threads(num_threads)
    {
        if (xp) bp_pack_pairs(x, M, K, xp); /* by the threads together, then their barrier */
        float *buf = aligned_alloc(64, (size_t)((group * tile_bytes + 63) / 64 * 64));
        float sums[PT_ROWS * NT];
        /* Threads split outputs, never K: each output is summed by exactly one thread. */
#pragma omp for schedule(static)
        for (int64_t gi = 0; gi < num_groups; gi++) {
            /* Tiles split as evenly as the groups allow, so the threads get equal shares. */
            const int64_t t0 = gi * num_tiles / num_groups, t1 = (gi + 1) * num_tiles / num_groups;
            for (int64_t t = t0; t < t1; t++) {
                const int64_t n = t * width;
                const int nt = (int)(N - n < width ? N - n : width);
                for (int j = 0; j < nt; j++) dequant(w + (n + j) * row_bytes, K, buf + ((t - t0) * NT + j) * K);
            }
            for (int64_t m = 0; m < M; m += rows) {
                const int mt = (int)(M - m < rows ? M - m : rows);
                for (int64_t t = t0; t < t1; t++) {
                    const int64_t n = t * width;
                    const int nt = (int)(N - n < width ? N - n : width);
                    const float *wt = buf + (t - t0) * NT * K;
                    if (pair_tile) pair_tile(xp + m / 2 * pair_stride, wt, sums, K, mt, nt, wt);
                    else tile(x + m * K, wt, sums, K, NT, mt, nt, wt);
                    bp_store_tile(sums, NT, b, y, m, n, mt, nt, ldy, accumulate);
                }
            }
        }
        free(buf);
    }
    free(xp);
}

/* y[:, 0:N] = x @ w^T (+ b), or += with accumulate; y's rows are ldy floats apart, so
 * several weights (Q, K and V of different types) can fill one fused output. */
void bp_linear_q(const float *x, const uint8_t *w, int type, int64_t row_bytes, const float *b, float *y,
                 int64_t ldy, int64_t M, int64_t N, int64_t K, int accumulate, int num_threads) {
    const block_type *t = bp_block_type(type);
    if (!t) return; /* not a type we run */
    const int fused_rows = bp_fused_rows(type);
    qtile_fn fused_tile = M <= fused_rows ? bp_pick_qtile(type) : NULL;
    xtile_fn pairs_tile = M > fused_rows && M <= xp_max_rows(type) ? bp_pick_xtile(type) : NULL;
    if (fused_tile)
        linear_q_fused(fused_tile, x, w, type, row_bytes, b, y, ldy, M, N, K, accumulate, num_threads);
    else if (pairs_tile)
        linear_q_xpairs(pairs_tile, x, w, row_bytes, b, y, ldy, M, N, K, accumulate, num_threads);
    else {
        const dequant_fn unpack = bp_pick_unpack_row(type); /* vectorized where the type's own loop is not */
        linear_q_buffered(unpack ? unpack : t->dequant, x, w, row_bytes, b, y, ldy, M, N, K, accumulate, num_threads);
    }
}
