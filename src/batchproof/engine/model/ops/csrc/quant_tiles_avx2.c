/* The register path's AVX2 twin (quant.h): up to four rows of x against quantized weight
 * rows in 8-lane registers (quant_tiles_body.h holds that code and says why each weight is the
 * same float), and the row unpacking it vectorizes for the buffer.
 */
#include "quant_tiles_body.h"

#ifdef BP_X86
float bp_f16_table[65536];

__attribute__((constructor)) static void fill_f16_table(void) {
    for (uint32_t h = 0; h < 65536; h++) {
        const uint8_t bytes[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
        bp_f16_table[h] = f16(bytes);
    }
}

/* One row of K weights into floats for the buffer (quant_linear.c), by quant_tiles_body.h's
 * unpacking: each weight the float chunk_weights computes, which is quant_dequant.c's (the top
 * of quant_tiles_body.h), 8 at a time. The K-quants' scalar unpacking took 2.4x the register
 * tile's time in Gemma 3's Q6_K matmuls at 8 rows. */
INLINE void unpack_row(const uint8_t *w, const int type, int64_t K, float *dst) {
    float kscale[16];
    const int bytes = block_bytes(type), groups = is_k_quant(type) ? 8 : 1;
    for (int64_t b = 0; b < K / 32; b++) {
        const int g = (int)(b % groups);
        const uint8_t *blk = w + b / groups * bytes;
        if (groups > 1 && g == 0) k_scales(blk, type, kscale);
        __m256 d, m;
        __m128i lo, hi;
        group_scales(blk, type, g, kscale, &d, &m);
        group_q(blk, type, g, &lo, &hi);
        _Pragma("GCC unroll 4")
        for (int c = 0; c < 4; c++) _mm256_storeu_ps(dst + 32 * b + 8 * c, chunk_weights(blk, type, g, c, d, m, lo, hi, 1));
    }
}

#define UNPACK_ROW_FN(NAME, TYPE)                                                                   \
    __attribute__((target("avx2,fma"))) static void NAME(const uint8_t *restrict src, int64_t K,    \
                                                         float *restrict dst) {                     \
        unpack_row(src, TYPE, K, dst);                                                              \
    }
UNPACK_ROW_FN(unpack_q5_0, T_Q5_0)
UNPACK_ROW_FN(unpack_q5_1, T_Q5_1)
UNPACK_ROW_FN(unpack_q4_k, T_Q4_K)
UNPACK_ROW_FN(unpack_q5_k, T_Q5_K)
UNPACK_ROW_FN(unpack_q6_k, T_Q6_K)

/* Five to eight rows (bp_fused_rows: TALL_ROWS at this level too): one weight row at a time, so
 * the 16 registers hold its 8 accumulators, the unpacked chunk, a row of x and the unpacking, and
 * each unpacked chunk feeds up to 8 FMAs. The buffer (quant_linear.c) stored and reloaded every
 * weight for these rows, and a 5-row step cost ~1.9 of a 4-row one on Zen 3 (draft/cost.py), the
 * cliff that kept a batch's drafts from paying. A tile's second weight row reads the same rows of
 * x again, from L1 or L2. Each output's sum is unchanged: its terms 8 at a time in increasing k,
 * then hsum_avx2, as in every tile. */
QTILE_BODY(qtile_tall1, TALL_ROWS, 1, 0)

INLINE void qtile_tall_avx2(const float *x, const uint8_t *w, int64_t row_bytes, const int type, float *sums,
                            int64_t K, const int mt, const int nt, const uint8_t *prefetch) {
    for (int j = 0; j < nt; j++) qtile_tall1(x, w + j * row_bytes, row_bytes, type, sums + j, K, mt, 1, prefetch);
}

/* One function per type and instruction set, picked once per matmul (bp_pick_qtile). */
#define QTILE_FN(NAME, TARGET, TYPE)                                                                      \
    __attribute__((target(TARGET))) static void NAME(const float *x, const uint8_t *w, int64_t row_bytes, \
                                                     float *sums, int64_t K, int mt, int nt,               \
                                                     const uint8_t *prefetch) {                            \
        switch (mt) { /* a constant row count each, so the accumulators stay in registers */              \
        case 5: qtile_tall_avx2(x, w, row_bytes, TYPE, sums, K, 5, nt, prefetch); return;                 \
        case 6: qtile_tall_avx2(x, w, row_bytes, TYPE, sums, K, 6, nt, prefetch); return;                 \
        case 7: qtile_tall_avx2(x, w, row_bytes, TYPE, sums, K, 7, nt, prefetch); return;                 \
        case 8: qtile_tall_avx2(x, w, row_bytes, TYPE, sums, K, 8, nt, prefetch); return;                 \
        }                                                                                                   \
        QTILE_DISPATCH(TYPE);                                                                               \
    }
/* Every quantized type's tile (quant.h's BP_QUANT_TYPES), q4_0_avx2 and so on, and the picker's
 * switch among them. */
#define BP_TWIN_FN(name) name##_avx2
#define QTILE_AVX2(id, name, bytes, elems) QTILE_FN(BP_TWIN_FN(name), "avx2,fma", id)
BP_QUANT_TYPES(QTILE_AVX2)

qtile_fn bp_qtile_avx2(int type) {
    switch (type) {
    BP_QUANT_TYPES(BP_QUANT_CASE)
    default: return NULL; /* F16, BF16, F32: the buffer (their weights need no unpacking) */
    }
}
#undef BP_TWIN_FN

dequant_fn bp_unpack_row_avx2(int type) {
    switch (type) { /* Q4_0, Q4_1, Q8_0: quant_dequant.c's own AVX2 loops */
    case T_Q5_0: return unpack_q5_0;
    case T_Q5_1: return unpack_q5_1;
    case T_Q4_K: return unpack_q4_k;
    case T_Q5_K: return unpack_q5_k;
    case T_Q6_K: return unpack_q6_k;
    default: return NULL;
    }
}
#endif
