/* The int8 numerics (quant_int8*.c): what the driver and its instruction-set twins share. Not
 * part of the interface (kernels.h).
 *
 * The arithmetic, one definition for every instruction set (the portable twin spells it out
 * in scalar C, quant_int8.c):
 *
 *  1. Each row of x is quantized on its own, block by block of 32: amax = max |x_k| (compared
 *     as bit patterns, so a NaN is the largest and the order of the comparisons is free),
 *     d = amax / 127, q_k = round-half-even(x_k * (127 / amax)) in [-127, 127]; a block whose
 *     amax is below 2^-100 (zeros, or so small that 127 / amax could overflow) has d = 0 and
 *     q = 0; a block holding an infinity or a NaN has d = NaN and q = 0, so every output it
 *     meets is NaN. Also kept: sx = d * (float)sum(q), and the integer sums
 *     of q over the block and over its two halves. A row's scales depend on that row only.
 *  2. A weight block of 32 (a K-quant's group) against a row's block: an integer sum of
 *     integer products, exact in any order (at most 32 * 128 * 127 * 128 * 2 < 2^31).
 *  3. Each output's float accumulator takes the blocks in increasing k, starting at 0:
 *       acc = fmaf(dw * d, (float)isum, acc)        every type
 *       acc = fmaf(mw, sx, acc)                      types with a min: Q4_1, Q5_1, Q4_K, Q5_K
 *     where, per type (the weight's own block layout, gguf.quants'):
 *       Q4_0, Q5_0, Q8_0  isum = sum (q_w - zero) q_x (zero 8, 16, 0), dw = f16 d
 *       Q4_1, Q5_1        isum = sum q_w q_x, dw = f16 d, mw = f16 m
 *       Q4_K, Q5_K        isum = sum q_w q_x, dw = d * sc_g, mw = -(dmin * m_g) (float products,
 *                         as quant_dequant.c forms them)
 *       Q6_K              isum = sc_a sum_{0..15} (q_w - 32) q_x + sc_b sum_{16..31} (q_w - 32) q_x
 *                         (sc_a, sc_b the group's two int8 scales), dw = f16 d
 *     then the bias (if any) and the residual add as every matmul (bp_store_tile).
 *
 * Vector twins vectorize across outputs (lane j: weight row j), so each output's float
 * operations are exactly these, in this order, and only the integer sums (exact) are formed
 * another way. Hence the same bits on every instruction set, at any row count, thread count
 * and position in a batch.
 */
#ifndef BP_QUANT_INT8_H
#define BP_QUANT_INT8_H
#include <stdint.h>

#include "quant.h"

#define QB 32        /* weights in a block of x (and in a weight block or K-quant group) */
#define IW 8         /* weight rows (outputs) a tile computes side by side */
#define IROWS 16     /* rows of x a tile call takes at most */
#define TINY_BITS 0x0D800000u /* 2^-100: a block of x whose amax is below it counts as zeros */

/* Rows of x quantized (step 1): q [M, K] int8, and per block d, sx and the integer sums
 * (sum[3 * (i * nb + b) + 0..2]: whole block, weights 0..15, weights 16..31). */
typedef struct {
    int8_t *q;
    float *d, *sx;
    int32_t *sum;
    int64_t M, K, nb;
} qx_rows;

static inline int int8_has_min(int type) {
    return type == T_Q4_1 || type == T_Q5_1 || type == T_Q4_K || type == T_Q5_K;
}

/* ---- the weights' layout in this numerics: 8 rows interleaved (bp_int8_repack, at load) ----
 *
 * For each tile of 8 weight rows (the last padded with zero rows): per K-quant super-block a
 * header of its float16 scales, lane j row j's (Q4_K, Q5_K: d[8] then dmin[8]; Q6_K: d[8]); then
 * per group of 32 weights one record: its scales (Q4_0, Q5_0, Q8_0: d[8] float16; Q4_1, Q5_1:
 * d[8] and m[8] float16; Q4_K, Q5_K: the 6-bit sc[8] and m[8] as bytes; Q6_K: (sc_a, sc_b) int8
 * pairs [8]), then the quants, chunk by chunk of 32 bytes whose 4-byte lane j is row j's. Q8_0
 * (signed) in 8 chunks of one byte a weight, chunk c byte e weight 4c + e. Every other type
 * (unsigned, zero not taken off) in 4 chunks of nibbles, chunk c byte e holding the low 4 bits
 * of weights 8c + e (low nibble) and 8c + 4 + e (high), then its higher bits in a plane: Q5_*
 * one chunk, byte e bit 2c (+ 1) the fifth bit of weight 8c + e (8c + 4 + e); Q6_K two, chunk p
 * byte e, for c = 2p + s, bits 4s..4s+1 (4s+2..4s+3) the top two bits of weight 8c + e
 * (8c + 4 + e). One load gives 8 rows' quants for the integer dots with no reduction across
 * lanes, a shift, a mask and an or put a plane's bits back above the nibbles, and the bytes a
 * weight are the file's (Q4_K 0.58 against its 0.56, Q5_0 0.69, Q6_K 0.82): one row of x streams
 * the weight from memory, so its bytes are its time. Step 3's floats (d * sc, dmin * m) are
 * formed from the scales as the definition says. */
static inline int int8_nibbles(int type) { return type != T_Q8_0; }
/* Bits a weight keeps above its nibble, in the plane after the nibble chunks. */
static inline int int8_plane_bits(int type) {
    return type == T_Q5_0 || type == T_Q5_1 || type == T_Q5_K ? 1 : type == T_Q6_K ? 2 : 0;
}
static inline int int8_groups(int type) { return type == T_Q4_K || type == T_Q5_K || type == T_Q6_K ? 8 : 1; }
static inline int64_t int8_sb_header(int type) {
    return type == T_Q4_K || type == T_Q5_K ? 32 : type == T_Q6_K ? 16 : 0;
}
static inline int64_t int8_group_header(int type) {
    return int8_groups(type) > 1 ? 16 : int8_has_min(type) ? 32 : 16;
}
static inline int64_t int8_group_bytes(int type) {
    return int8_group_header(type) + (int8_nibbles(type) ? 128 + 32 * int8_plane_bits(type) : 256);
}
static inline int64_t int8_sb_bytes(int type) { return int8_sb_header(type) + int8_groups(type) * int8_group_bytes(type); }
/* Where block (group) b's record starts in a tile; its super-block header is at b's super-block start. */
static inline int64_t int8_group_at(int type, int64_t b) {
    const int groups = int8_groups(type);
    return b / groups * int8_sb_bytes(type) + int8_sb_header(type) + b % groups * int8_group_bytes(type);
}
static inline int64_t int8_sb_at(int type, int64_t b) { return b / int8_groups(type) * int8_sb_bytes(type); }

/* Rows 0..M of x into qx (its arrays sized for M rows of K). */
typedef void (*quantize_fn)(const float *x, int64_t M, int64_t K, qx_rows *qx);

/* sums[i * IW + j] = row m0 + i (i < mt <= IROWS) of x against row j of the tile of 8 whose
 * records start at w, over all K: step 3's accumulator. */
typedef void (*itile_fn)(const qx_rows *x, int64_t m0, int mt, const uint8_t *w, float *sums);
/* The same for two tiles at once, wa's rows then wb's: sums[i * 2 * IW + j] (wa == wb runs one). */
typedef void (*itile2_fn)(const qx_rows *x, int64_t m0, int mt, const uint8_t *wa, const uint8_t *wb, float *sums);

/* Block b's records against rows m0..m0 + mt - 1 of x: four rows at a time, then the one to three
 * left, each count a constant for the twin's record_rows (its accumulators stay in registers).
 * Both twins' itile run it (quant_int8_avx2.c, quant_int8_neon.c). */
#define RECORD_ROWS_BY_FOURS(x, m0, mt, w, b, type, acc)                                        \
    do {                                                                                        \
        int i0_ = 0;                                                                            \
        for (; i0_ + 4 <= (mt); i0_ += 4) record_rows(x, m0, i0_, 4, w, b, type, acc);          \
        switch ((mt) - i0_) {                                                                   \
        case 1: record_rows(x, m0, i0_, 1, w, b, type, acc); break;                             \
        case 2: record_rows(x, m0, i0_, 2, w, b, type, acc); break;                             \
        case 3: record_rows(x, m0, i0_, 3, w, b, type, acc); break;                             \
        }                                                                                       \
    } while (0)

/* A twin's tile function body: its own inline `itile` (its weight arguments, one tile's or two's,
 * after TYPE) called with every row count a tile takes (1 to IROWS) as a constant, so the row
 * loops unroll and the accumulators stay in registers (a count left to a generic loop, as 3, 5,
 * 6 and 7 were, kept them in memory and ran 10-25% slower than its neighbours: 5 rows cost 2.0
 * one-row steps against 1.6 once constant on Zen 4, bench/step_cost.py; the same bits either way). */
#define ITILE_BY_ROWS(TYPE, ...)                               \
    switch (mt) {                                              \
    case 1: itile(x, m0, 1, __VA_ARGS__, sums, TYPE); break;   \
    case 2: itile(x, m0, 2, __VA_ARGS__, sums, TYPE); break;   \
    case 3: itile(x, m0, 3, __VA_ARGS__, sums, TYPE); break;   \
    case 4: itile(x, m0, 4, __VA_ARGS__, sums, TYPE); break;   \
    case 5: itile(x, m0, 5, __VA_ARGS__, sums, TYPE); break;   \
    case 6: itile(x, m0, 6, __VA_ARGS__, sums, TYPE); break;   \
    case 7: itile(x, m0, 7, __VA_ARGS__, sums, TYPE); break;   \
    case 8: itile(x, m0, 8, __VA_ARGS__, sums, TYPE); break;   \
    case 9: itile(x, m0, 9, __VA_ARGS__, sums, TYPE); break;   \
    case 10: itile(x, m0, 10, __VA_ARGS__, sums, TYPE); break; \
    case 11: itile(x, m0, 11, __VA_ARGS__, sums, TYPE); break; \
    case 12: itile(x, m0, 12, __VA_ARGS__, sums, TYPE); break; \
    case 13: itile(x, m0, 13, __VA_ARGS__, sums, TYPE); break; \
    case 14: itile(x, m0, 14, __VA_ARGS__, sums, TYPE); break; \
    case 15: itile(x, m0, 15, __VA_ARGS__, sums, TYPE); break; \
    case 16: itile(x, m0, 16, __VA_ARGS__, sums, TYPE); break; \
    default: itile(x, m0, mt, __VA_ARGS__, sums, TYPE);        \
    }

/* The twins: quant_int8.c (portable), quant_int8_avx2.c (AVX2), quant_int8_avx512.c (AVX-512:
 * its quantize needs F + BW, its tiles VNNI too, two at a time, so an AVX-512 CPU without VNNI
 * runs the AVX2 twin's tiles; bp_isa_vnni, isa.c, says which), quant_int8_neon.c (aarch64 with
 * the dot product: its tiles; x's quantization there is the portable twin's). */
BP_INTERNAL void bp_quantize_x_portable(const float *x, int64_t M, int64_t K, qx_rows *qx);
BP_INTERNAL itile_fn bp_itile_portable(int type);
#ifdef BP_X86
BP_INTERNAL void bp_quantize_x_avx2(const float *x, int64_t M, int64_t K, qx_rows *qx);
BP_INTERNAL itile_fn bp_itile_avx2(int type);
BP_INTERNAL void bp_quantize_x_avx512(const float *x, int64_t M, int64_t K, qx_rows *qx);
BP_INTERNAL itile2_fn bp_itile2_avx512(int type);
/* Whether this CPU has AVX-512 VNNI (vpdpbusd); asked only at the AVX-512 level (BP_PICK's first choice). */
BP_INTERNAL int bp_isa_vnni(void);
#endif
#ifdef BP_ARM
/* quant_int8_neon.c: the tiles by the Armv8.2 dot product (sdot), NULL where the CPU lacks it
 * (bp_isa_dotprod, isa.c), and then the portable twin runs. */
BP_INTERNAL itile_fn bp_itile_neon(int type);
BP_INTERNAL int bp_isa_dotprod(void);
#endif

#ifdef BP_X86
#include <immintrin.h>

/* Bits 4.. of a nibble type's weights, from its plane (the layout above), placed above the low
 * and the high nibbles of chunk c, for the AVX2 and the AVX-512 twins alike (AVX2 instructions,
 * inlined into either). Shifts of 16-bit lanes by at most 4, then a mask that keeps only bits of
 * the same byte: no bit crosses from a neighbour. */
#define INT8_PLANE static inline __attribute__((always_inline, target("avx2")))
INT8_PLANE __m256i int8_shift16(__m256i v, const int by) {
    return by >= 0 ? _mm256_slli_epi16(v, by) : _mm256_srli_epi16(v, -by);
}
INT8_PLANE void int8_plane_merge(const uint8_t *plane, const int bits, const int c, __m256i *l, __m256i *h) {
    if (bits == 1) { /* byte bit 2c: weight 8c + e's fifth bit, 2c + 1: 8c + 4 + e's */
        const __m256i p = _mm256_loadu_si256((const __m256i *)plane), five = _mm256_set1_epi8(0x10);
        *l = _mm256_or_si256(*l, _mm256_and_si256(int8_shift16(p, 4 - 2 * c), five));
        *h = _mm256_or_si256(*h, _mm256_and_si256(int8_shift16(p, 3 - 2 * c), five));
    } else if (bits == 2) { /* chunk c / 2, bits 4s, 4s + 2 (s = c % 2): the top two of each */
        const __m256i p = _mm256_loadu_si256((const __m256i *)(plane + 32 * (c / 2))), two = _mm256_set1_epi8(0x30);
        *l = _mm256_or_si256(*l, _mm256_and_si256(int8_shift16(p, 4 - 4 * (c % 2)), two));
        *h = _mm256_or_si256(*h, _mm256_and_si256(int8_shift16(p, 2 - 4 * (c % 2)), two));
    }
}
#undef INT8_PLANE
#endif

/* Q4_K / Q5_K: the 6-bit scale and min of group g from the 12 packed bytes (scale_min_k4). */
static inline void int8_scale_min_k4(int g, const uint8_t *s, int *sc, int *m) {
    if (g < 4) {
        *sc = s[g] & 63;
        *m = s[g + 4] & 63;
    } else {
        *sc = (s[g + 4] & 0xF) | ((s[g - 4] >> 6) << 4);
        *m = (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
    }
}

#endif
