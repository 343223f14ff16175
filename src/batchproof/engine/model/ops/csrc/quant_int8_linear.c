/* The int8 numerics' matmul driver (--numerics int8): x quantized by the threads together, then
 * each tile of 8 weight rows against every row of x by the twin of the instruction set in use
 * (quant_int8.c, quant_int8_avx2.c, quant_int8_avx512.c, quant_int8_neon.c); weights with no quants take the float
 * path. The arithmetic is quant_int8.h's. */
#include <stdlib.h>

#include "lanes.h"
#include "quant_int8.h"

/* The outputs of a tile of IW starting at n that exist (the last tile may be ragged). */
static inline int outputs_from(int64_t N, int64_t n) { return (int)(N - n < IW ? N - n : IW); }

/* y[:, 0:N] (+)= x @ w^T (+ b) in the int8 numerics, w in this numerics' layout
 * (bp_int8_repack; row_bytes unused); weights with no quants (F16, BF16, F32) are never
 * repacked and take the float path (bp_linear_q), whose bits are the same in either numerics. */
void bp_linear_q_int8(const float *x, const uint8_t *w, int type, int64_t row_bytes, const float *b, float *y,
                      int64_t ldy, int64_t M, int64_t N, int64_t K, int accumulate, int num_threads) {
    /* The AVX-512 level's tiles need VNNI as well, and run two at a time (16-lane registers);
     * without VNNI, the AVX2 twin's tiles one at a time (the same bits). */
#ifdef BP_ARM
    /* BP_PICK knows x86's levels only: aarch64's dot-product tiles where the CPU has sdot, unless
     * capped to the portable level (as quant_tiles_pick.c does for the float tiles). */
    const itile2_fn wide = NULL;
    itile_fn tile = bp_isa_level() >= BP_ISA_NEON ? bp_itile_neon(type) : NULL;
    if (!tile) tile = bp_itile_portable(type);
#else
    itile2_fn wide = BP_PICK(bp_isa_vnni() ? bp_itile2_avx512(type) : NULL, NULL, NULL);
    itile_fn tile = wide ? NULL : BP_PICK(bp_itile_avx2(type), bp_itile_avx2(type), bp_itile_portable(type));
#endif
    if ((!wide && !tile) || K % (QB * int8_groups(type))) {
        bp_linear_q(x, w, type, row_bytes, b, y, ldy, M, N, K, accumulate, num_threads);
        return;
    }
    const int64_t nb = K / QB, tile_bytes = nb / int8_groups(type) * int8_sb_bytes(type);
    qx_rows qx = {aligned_alloc(64, (size_t)((M * K + 63) / 64 * 64)), malloc((size_t)(M * nb) * 4),
                  malloc((size_t)(M * nb) * 4), malloc((size_t)(M * nb) * 12), M, K, nb};
    const quantize_fn quantize = BP_PICK(bp_quantize_x_avx512, bp_quantize_x_avx2, bp_quantize_x_portable);
    const int64_t num_tiles = (N + IW - 1) / IW, halves = nb >= 2 ? 2 : 1;
#pragma omp parallel num_threads(num_threads)
    {
        /* Step 1 shared by the threads, by row and half of a row's blocks, before any tile reads
         * it (the barrier closing the loop): done by one thread, its few microseconds a matmul
         * left the other thread spinning, and a decode step of 4 rows runs ~120 of them. Each
         * block's scale and quants depend on that block only, whichever thread and twin
         * quantizes it. */
#pragma omp for schedule(static)
        for (int64_t part = 0; part < M * halves; part++) {
            const int64_t i = part / halves, b0 = part % halves * nb / halves, b1 = (part % halves + 1) * nb / halves;
            const int64_t at = i * nb + b0;
            qx_rows piece = {qx.q + i * K + b0 * QB, qx.d + at, qx.sx + at, qx.sum + 3 * at, 1, (b1 - b0) * QB, b1 - b0};
            quantize(x + i * K + b0 * QB, 1, piece.K, &piece);
        }
        /* Threads split outputs, never K: each output is summed by exactly one thread. With the
         * wide tiles, tile u goes with tile u + half, so each of a thread's two weight streams
         * reads its tiles in order, one after the other in memory: neighbouring tiles paired
         * jumped a tile ahead at every pair, and one row of x against weights from memory took
         * up to 2.8x the time. An odd last tile runs as a pair with itself, its copy not stored. */
        const int64_t half = wide ? num_tiles / 2 : 0, units = half + (num_tiles - 2 * half);
#pragma omp for schedule(static)
        for (int64_t u = 0; u < units; u++) {
            const int64_t t = u < half ? u : half + u; /* u >= half: the tiles past the pairs */
            const int64_t second = u < half ? t + half : t, n2 = second * IW; /* the second tile, its first output */
            float sums[IROWS * 2 * IW];
            for (int64_t m = 0; m < M; m += IROWS) {
                const int mt = (int)(M - m < IROWS ? M - m : IROWS);
                if (wide) {
                    wide(&qx, m, mt, w + t * tile_bytes, w + second * tile_bytes, sums);
                    bp_store_tile(sums, 2 * IW, b, y, m, t * IW, mt, outputs_from(N, t * IW), ldy, accumulate);
                    if (second != t)
                        bp_store_tile(sums + IW, 2 * IW, b, y, m, n2, mt, outputs_from(N, n2), ldy, accumulate);
                } else {
                    tile(&qx, m, mt, w + t * tile_bytes, sums);
                    bp_store_tile(sums, IW, b, y, m, t * IW, mt, outputs_from(N, t * IW), ldy, accumulate);
                }
            }
        }
    }
    free(qx.q); free(qx.d); free(qx.sx); free(qx.sum);
}
