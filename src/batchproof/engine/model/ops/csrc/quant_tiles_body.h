/* The register path's 8-lane code, which each instruction set's twin inlines under its own
 * target (quant_tiles_avx2.c, quant_tiles_avx512.c): up to four rows of x against a tile of
 * quantized weight rows, each block unpacked in registers and fed straight to the FMAs
 * (quant_linear.c runs these for a decode step of a few sequences; more rows go through
 * its buffer). Not part of the interface (kernels.h).
 *
 * Why: a few rows of x make one to four FMAs per weight, so dequantizing into a buffer and
 * reading it back (a store and a load per weight) costs about as much as the arithmetic.
 *
 * Exactness: every weight is the float32 that quant_dequant.c (gguf.quants) computes, and
 * each output's accumulator takes its terms 8 at a time in increasing k, then the tree of
 * sum8: the float32 tile's sum over those weights, bit for bit. Per type, why each weight is
 * the same float. d, dmin are f16 scales: at most 11 significant bits, and at least 2^-24 when
 * not zero, so no product below comes near float32's subnormals or its overflow; an integer
 * below 2^b has at most b significant bits, and a product of values of a and b significant
 * bits has at most a + b (checked exhaustively over every finite f16 and every quant).
 *   Q8_0, Q4_0, Q5_0  q * d, d * (q - 8), d * (q - 16): the same integer, the same multiply.
 *   Q6_K  (d * sc) * (q - 32): d * sc first, as there (exact: 11 + 7 bits, sc's odd part at most
 *         127); the weight is then exact too (2047 * 127 * 31 < 2^23), and a multiply of its
 *         own, a float before the FMA that uses it.
 *   Q4_1, Q5_1  fma(d, q, m) for d * q + m: d * q is exact (11 + 5 bits), so the FMA's one
 *         rounding of d * q + m is the add's rounding.
 *   Q4_K, Q5_K  fma(d1, q, -m1) for d1 * q - m1, where d1 = d * sc and m1 = dmin * m are float
 *         products as there (exact: 11 + 6 bits): d1 * q is exact (17 + 5 bits), so the FMA
 *         rounds d1 * q + (-m1) once, as the subtraction rounds d1 * q - m1, which IEEE defines
 *         as that sum (signed zeros included).
 * Infinite and NaN scales give infinite and NaN weights on both paths (a NaN's payload is not
 * promised, as everywhere in the kernels).
 *
 * f16 scales come from a table built with f16() (so a NaN keeps its payload; filled in
 * quant_tiles_avx2.c), two loads where the conversion cost a dozen instructions per block.
 */
#ifndef BP_QUANT_TILES_BODY_H
#define BP_QUANT_TILES_BODY_H
#include <stdint.h>
#include <string.h>

#include "lanes.h"
#include "quant.h"

#ifdef BP_X86
#define INLINE static inline __attribute__((always_inline, target("avx2,fma")))

BP_INTERNAL extern float bp_f16_table[65536];

static inline const float *f16_at(const uint8_t *p) { return bp_f16_table + (p[0] | (p[1] << 8)); }

/* A K-quant super-block holds 8 groups of 32 weights; its size, as every block's, is in quant.h. */
static inline int is_k_quant(int type) { return type == T_Q4_K || type == T_Q5_K || type == T_Q6_K; }

/* A K-quant super-block's scales into s[16], the very products quant_dequant.c computes:
 * Q4_K / Q5_K: s[g] = d * sc_g, s[8 + g] = -(dmin * m_g) (negated, for the FMA to add);
 * Q6_K: s[i] = d * sc_i, one per 16 weights. The 6-bit sc and m of Q4_K / Q5_K unpacked 8 at
 * a time: the bytes scale_min_k4 reads, bit for bit (sub-blocks 4-7 take their top two bits
 * from bits 6-7 of sub-blocks 0-3's bytes). */
INLINE void k_scales(const uint8_t *blk, int type, float *s) {
    if (type == T_Q6_K) {
        const __m256 d = _mm256_broadcast_ss(f16_at(blk + 208));
        const __m128i sc = _mm_loadu_si128((const __m128i *)(blk + 192));
        _mm256_storeu_ps(s, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
        _mm256_storeu_ps(s + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
        return;
    }
    uint32_t u[3];
    memcpy(u, blk + 4, 12);
    const uint32_t sc_high = (u[2] & 0x0F0F0F0Fu) | (u[0] >> 6 & 0x03030303u) << 4;
    const uint32_t m_high = (u[2] >> 4 & 0x0F0F0F0Fu) | (u[1] >> 6 & 0x03030303u) << 4;
    const uint64_t sc = (u[0] & 0x3F3F3F3Fu) | (uint64_t)sc_high << 32;
    const uint64_t m = (u[1] & 0x3F3F3F3Fu) | (uint64_t)m_high << 32;
    const __m256 d = _mm256_broadcast_ss(f16_at(blk)), dmin = _mm256_broadcast_ss(f16_at(blk + 2));
    _mm256_storeu_ps(s, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((int64_t)sc)))));
    const __m256 dm = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((int64_t)m))));
    _mm256_storeu_ps(s + 8, _mm256_xor_ps(dm, _mm256_set1_ps(-0.0f)));
}

/* Bytes shifted right by a count known only at run time (16-bit lanes: the caller masks
 * what crosses from the next byte). */
INLINE __m128i srl16(__m128i v, int n) { return _mm_srl_epi16(v, _mm_cvtsi32_si128(n)); }
INLINE __m128i load16(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }

/* Group g's 32 integer quants of a Q5_0, Q5_1 or K-quant block, less their zero for Q5_0 and
 * Q6_K, as quant_dequant.c unpacks them: signed bytes, weights 0..15 in *lo and 16..31 in *hi.
 * Byte-wide work, 16 weights an instruction, leaves 8 weights an instruction only for the
 * widening, the conversion and the scale (Gemma 3's Q5_0, Q4_K and Q6_K matmuls ran 1.1-1.7x
 * faster than unpacking 8 at a time in 32-bit lanes). Q4_0, Q4_1 and Q8_0: chunk_weights; Q4_K too
 * on the one- and two-row tiles and the buffer's unpacking (chunk_weights' `direct`): there the
 * 8-at-a-time read of the block, a nibble per 32-bit lane as Q4_1's, ran the Llama 3.2 1B file's
 * Q4_K matmuls at one row in 0.76x the time (2026-12-07, 2-core Zen 2, AVX2), while at 4 rows it
 * took 1.19x (so the wide and tall tiles keep this way), and Q6_K read that way took 1.05x. */
INLINE void group_q(const uint8_t *blk, const int type, const int g, __m128i *lo, __m128i *hi) {
    const __m128i nibble = _mm_set1_epi8(0x0F);
    *lo = *hi = _mm_setzero_si128(); /* unused by Q4_0, Q4_1, Q8_0 */
    if (type == T_Q6_K) { /* group g = 4 * half + quarter: nibble quarter / 2 of ql, bits 2 * quarter of qh */
        const int half = g >> 2, quarter = g & 3;
        const uint8_t *ql = blk + 64 * half + 32 * (quarter & 1), *qh = blk + 128 + 32 * half;
        /* both halves in one 256-bit register: the same byte operations, half the instructions */
        const __m256i l = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)ql),
                                                            _mm_cvtsi32_si128(4 * (quarter >> 1))),
                                           _mm256_set1_epi8(0x0F));
        const __m256i h = _mm256_and_si256(
            _mm256_slli_epi16(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)qh), _mm_cvtsi32_si128(2 * quarter)), 4),
            _mm256_set1_epi8(0x30));
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(l, h), _mm256_set1_epi8(32));
        *lo = _mm256_castsi256_si128(q);
        *hi = _mm256_extracti128_si256(q, 1);
        return;
    }
    if (type == T_Q4_K || type == T_Q5_K) { /* sub-block g: nibble g % 2 of bytes 32 * (g / 2).. */
        const uint8_t *qs = blk + (type == T_Q5_K ? 48 : 16) + 32 * (g >> 1);
        for (int e = 0; e < 2; e++) {
            __m128i q = _mm_and_si128(srl16(load16(qs + 16 * e), 4 * (g & 1)), nibble);
            if (type == T_Q5_K) /* the fifth bit: bit g of qh[j] */
                q = _mm_or_si128(q, _mm_and_si128(_mm_slli_epi16(srl16(load16(blk + 16 + 16 * e), g), 4),
                                                  _mm_set1_epi8(0x10)));
            *(e ? hi : lo) = q;
        }
        return;
    }
    if (type == T_Q5_0 || type == T_Q5_1) { /* low nibbles are weights 0..15, high ones 16..31 */
        const __m128i qs = load16(blk + (type == T_Q5_0 ? 6 : 8));
        *lo = _mm_and_si128(qs, nibble);
        *hi = _mm_and_si128(_mm_srli_epi16(qs, 4), nibble);
        /* bit j of qh: weight j's fifth bit */
        const __m128i qh = _mm_cvtsi32_si128((int)u32le(blk + (type == T_Q5_1 ? 4 : 2)));
        const __m128i bit = _mm_set1_epi64x(0x8040201008040201);
        for (int e = 0; e < 2; e++) { /* byte j / 8 of qh to weights j of this half, then bit j % 8 */
            const __m128i spread = _mm_shuffle_epi8(qh, _mm_set_epi64x(0x0101010101010101 * (2 * e + 1),
                                                                       0x0101010101010101 * (2 * e)));
            const __m128i set = _mm_cmpeq_epi8(_mm_and_si128(spread, bit), bit);
            __m128i *q = e ? hi : lo; /* Q5_0: q - 16 is the nibble, less 16 where the bit is clear */
            *q = type == T_Q5_0 ? _mm_add_epi8(*q, _mm_andnot_si128(set, _mm_set1_epi8(-16)))
                                : _mm_or_si128(*q, _mm_and_si128(set, _mm_set1_epi8(16)));
        }
    }
}

/* Weights 8c..8c+7 of group g as floats: its quants q (group_q's lo and hi; Q8_0's, Q4_0's and
 * Q4_1's are read from the block, and Q4_K's where direct is 1), d and m its scale and added term
 * (Q6_K: m is the scale of weights 16..31), in every lane. The order of the operations and the
 * one rounding of each: see the top of the file. */
INLINE __m256 chunk_weights(const uint8_t *blk, const int type, const int g, const int c, __m256 d, __m256 m,
                            __m128i lo, __m128i hi, const int direct) {
    if (type == T_Q8_0)
        return _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * c)))), d);
    if (type == T_Q4_0 || type == T_Q4_1) { /* 8 at a time (~5% faster here than group_q's way) */
        /* bytes 0..7 (c = 0, 2) or 8..15 (c = 1, 3); low nibbles are weights 0..15, high ones 16..31 */
        const uint8_t *qs = blk + (type == T_Q4_1 ? 4 : 2) + 8 * (c & 1);
        __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qs));
        q = c < 2 ? _mm256_and_si256(q, _mm256_set1_epi32(0x0F)) : _mm256_srli_epi32(q, 4);
        return type == T_Q4_1 ? _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), m)
                              : _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(8))));
    }
    if (type == T_Q4_K && direct) { /* as Q4_1: nibble g % 2 of bytes 8c..8c+7 of the group pair's 32 */
        __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 16 + 32 * (g >> 1) + 8 * c)));
        q = g & 1 ? _mm256_srli_epi32(q, 4) : _mm256_and_si256(q, _mm256_set1_epi32(0x0F));
        return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), m); /* d1 * q - m1 */
    }
    const __m128i half = c < 2 ? lo : hi;
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c & 1 ? _mm_srli_si128(half, 8) : half));
    switch (type) {
    case T_Q5_0: return _mm256_mul_ps(d, q);
    case T_Q6_K: return _mm256_mul_ps(c < 2 ? d : m, q);
    default: return _mm256_fmadd_ps(d, q, m); /* Q5_1 (d * q + m), Q4_K, Q5_K (d1 * q - m1) */
    }
}

/* Group g's d and m (as chunk_weights takes them) from the block or, for a K-quant, from
 * its super-block's scales s. */
INLINE void group_scales(const uint8_t *blk, const int type, const int g, const float *s, __m256 *d, __m256 *m) {
    if (type == T_Q6_K) {
        *d = _mm256_broadcast_ss(s + 2 * g);
        *m = _mm256_broadcast_ss(s + 2 * g + 1);
    } else if (is_k_quant(type)) {
        *d = _mm256_broadcast_ss(s + g);
        *m = _mm256_broadcast_ss(s + 8 + g);
    } else {
        *d = _mm256_broadcast_ss(f16_at(blk));
        *m = type == T_Q4_1 || type == T_Q5_1 ? _mm256_broadcast_ss(f16_at(blk + 2)) : *d;
    }
}

/* One tile: mt rows of x against nt weight rows, each output's accumulator taking its terms
 * 8 at a time in increasing k. x is `mt` rows interleaved by 8 (x[(k / 8 * mt + i) * 8 +
 * k % 8]; one row is just the row), so one pointer reaches every row; ACC_ROWS x ACC_COLS
 * bounds the accumulators, sized to each caller (a bigger array kept them in memory). A
 * K-quant super-block's scales are unpacked once per row (into kscale) for its 8 groups. */
#define QTILE_BODY(NAME, ACC_ROWS, ACC_COLS, DIRECT)                                                               \
    INLINE void NAME(const float *x, const uint8_t *w, int64_t row_bytes, const int type, float *sums,       \
                     int64_t K, const int mt, const int nt, const uint8_t *prefetch) {                       \
        __m256 acc[ACC_ROWS][ACC_COLS];                                                                      \
        float kscale[ACC_COLS][16];                                                                          \
        for (int i = 0; i < mt; i++)                                                                         \
            for (int j = 0; j < nt; j++) acc[i][j] = _mm256_setzero_ps();                                    \
        const int bytes = block_bytes(type), groups = is_k_quant(type) ? 8 : 1;                              \
        for (int64_t b = 0; b < K / 32; b++) {                                                               \
            const int g = (int)(b % groups);                                                                 \
            const uint8_t *blocks = w + b / groups * bytes;                                                  \
            if (groups > 1 && g == 0)                                                                        \
                for (int j = 0; j < nt; j++) k_scales(blocks + j * row_bytes, type, kscale[j]);              \
            const float *xb = x + 32 * mt * b;                                                               \
            _Pragma("GCC unroll 8") /* fully: the accumulators must stay in registers */                     \
            for (int j = 0; j < nt; j++) {                                                                   \
                const uint8_t *blk = blocks + j * row_bytes;                                                 \
                /* The tile after next, a line per group and row: this tile's rows are read side by      \
                 * side, which the hardware prefetcher follows badly (a prefetch never faults). */        \
                _mm_prefetch((const char *)(prefetch + (b * nt + j) * 64), _MM_HINT_T0);                     \
                __m256 d, m;                                                                                 \
                __m128i lo, hi;                                                                              \
                group_scales(blk, type, g, kscale[j], &d, &m);                                               \
                group_q(blk, type, g, &lo, &hi);                                                             \
                _Pragma("GCC unroll 4")                                                                      \
                for (int c = 0; c < 4; c++) {                                                                \
                    const __m256 wc = chunk_weights(blk, type, g, c, d, m, lo, hi, DIRECT);                      \
                    for (int i = 0; i < mt; i++)                                                             \
                        acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + (c * mt + i) * 8), wc, acc[i][j]);  \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
        for (int i = 0; i < mt; i++)                                                                         \
            for (int j = 0; j < nt; j++) sums[i * QW + j] = hsum_avx2(acc[i][j]);                            \
    }

QTILE_BODY(qtile_narrow, 2, QW, 1) /* one or two rows */
QTILE_BODY(qtile_wide, FUSED_ROWS, 2, 0) /* three or four */

/* Constant type, row count and (for full tiles) width, so each case keeps its
 * accumulators in registers; a macro, since each ISA's function must inline the body
 * under its own target. */
#define QTILE_DISPATCH(TYPE)                                                                       \
    if (mt == 1 && nt == QW) qtile_narrow(x, w, row_bytes, TYPE, sums, K, 1, QW, prefetch);        \
    else if (mt == 2 && nt == fused_width(TYPE, 2))                                                \
        qtile_narrow(x, w, row_bytes, TYPE, sums, K, 2, fused_width(TYPE, 2), prefetch);            \
    else if (mt <= 2) qtile_narrow(x, w, row_bytes, TYPE, sums, K, mt, nt, prefetch);              \
    else if (mt == 3 && nt == 2) qtile_wide(x, w, row_bytes, TYPE, sums, K, 3, 2, prefetch);       \
    else if (mt == 4 && nt == 2) qtile_wide(x, w, row_bytes, TYPE, sums, K, 4, 2, prefetch);       \
    else qtile_wide(x, w, row_bytes, TYPE, sums, K, mt, nt, prefetch)
#endif
#endif
