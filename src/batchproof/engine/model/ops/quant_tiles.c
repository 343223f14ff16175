/* Up to four rows of x against a tile of quantized weight rows, each block unpacked in
 * registers and fed straight to the FMAs (quant_linear.c runs these for a decode step of a
 * few sequences; more rows go through its buffer).
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
 * f16 scales come from a table built with f16() (so a NaN keeps its payload), two loads
 * where the conversion cost a dozen instructions per block.
 */
#include <stdint.h>
#include <string.h>

#include "lanes.h"
#include "quant.h"

#ifdef BP_X86
#define INLINE static inline __attribute__((always_inline, target("avx2,fma")))

static float f16_table[65536];

__attribute__((constructor)) static void fill_f16_table(void) {
    for (uint32_t h = 0; h < 65536; h++) {
        const uint8_t bytes[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
        f16_table[h] = f16(bytes);
    }
}

static inline const float *f16_at(const uint8_t *p) { return f16_table + (p[0] | (p[1] << 8)); }

/* A block's bytes and its groups of 32 weights (a K-quant super-block has 8). */
static inline int tile_block_bytes(int type) {
    switch (type) {
    case T_Q4_0: return 18;
    case T_Q4_1: return 20;
    case T_Q5_0: return 22;
    case T_Q5_1: return 24;
    case T_Q8_0: return 34;
    case T_Q4_K: return 144;
    case T_Q5_K: return 176;
    default: return 210; /* T_Q6_K */
    }
}
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
 * faster than unpacking 8 at a time in 32-bit lanes). Q4_0, Q4_1 and Q8_0: chunk_weights. */
INLINE void group_q(const uint8_t *blk, const int type, const int g, __m128i *lo, __m128i *hi) {
    const __m128i nibble = _mm_set1_epi8(0x0F);
    *lo = *hi = _mm_setzero_si128(); /* unused by Q4_0, Q4_1, Q8_0 */
    if (type == T_Q6_K) { /* group g = 4 * half + quarter: nibble quarter / 2 of ql, bits 2 * quarter of qh */
        const int half = g >> 2, quarter = g & 3;
        const uint8_t *ql = blk + 64 * half + 32 * (quarter & 1), *qh = blk + 128 + 32 * half;
        const __m128i two_bits = _mm_set1_epi8(0x30), zero = _mm_set1_epi8(32);
        for (int e = 0; e < 2; e++) {
            const __m128i l = _mm_and_si128(srl16(load16(ql + 16 * e), 4 * (quarter >> 1)), nibble);
            const __m128i h = _mm_and_si128(_mm_slli_epi16(srl16(load16(qh + 16 * e), 2 * quarter), 4), two_bits);
            *(e ? hi : lo) = _mm_sub_epi8(_mm_or_si128(l, h), zero);
        }
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

/* Weights 8c..8c+7 of the group as floats: its quants q (group_q's lo and hi; Q8_0's are
 * read from the block), d and m its scale and added term (Q6_K: m is the scale of weights
 * 16..31), in every lane. The order of the operations and the one rounding of each: see
 * the top of the file. */
INLINE __m256 chunk_weights(const uint8_t *blk, const int type, const int c, __m256 d, __m256 m, __m128i lo,
                            __m128i hi) {
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
#define QTILE_BODY(NAME, ACC_ROWS, ACC_COLS)                                                                 \
    INLINE void NAME(const float *x, const uint8_t *w, int64_t row_bytes, const int type, float *sums,       \
                     int64_t K, const int mt, const int nt, const uint8_t *prefetch) {                       \
        __m256 acc[ACC_ROWS][ACC_COLS];                                                                      \
        float kscale[ACC_COLS][16];                                                                          \
        for (int i = 0; i < mt; i++)                                                                         \
            for (int j = 0; j < nt; j++) acc[i][j] = _mm256_setzero_ps();                                    \
        const int bytes = tile_block_bytes(type), groups = is_k_quant(type) ? 8 : 1;                         \
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
                    const __m256 wc = chunk_weights(blk, type, c, d, m, lo, hi);                              \
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
    else if (mt == 2 && nt == fused_width(TYPE, 2))                                                \
        qtile_narrow(x, w, row_bytes, TYPE, sums, K, 2, fused_width(TYPE, 2), prefetch);            \
    else if (mt <= 2) qtile_narrow(x, w, row_bytes, TYPE, sums, K, mt, nt, prefetch);              \
    else if (mt == 3 && nt == 2) qtile_wide(x, w, row_bytes, TYPE, sums, K, 3, 2, prefetch);       \
    else if (mt == 4 && nt == 2) qtile_wide(x, w, row_bytes, TYPE, sums, K, 4, 2, prefetch);       \
    else qtile_wide(x, w, row_bytes, TYPE, sums, K, mt, nt, prefetch)

/* One row of K weights into floats for the buffer (quant_linear.c), by the unpacking above:
 * each weight the float chunk_weights computes, which is quant_dequant.c's (the top of the
 * file), 8 at a time. The K-quants' scalar unpacking took 2.4x the register tile's time in
 * Gemma 3's Q6_K matmuls at 8 rows. */
INLINE void unpack_row(const uint8_t *w, const int type, int64_t K, float *dst) {
    float kscale[16];
    const int bytes = tile_block_bytes(type), groups = is_k_quant(type) ? 8 : 1;
    for (int64_t b = 0; b < K / 32; b++) {
        const int g = (int)(b % groups);
        const uint8_t *blk = w + b / groups * bytes;
        if (groups > 1 && g == 0) k_scales(blk, type, kscale);
        __m256 d, m;
        __m128i lo, hi;
        group_scales(blk, type, g, kscale, &d, &m);
        group_q(blk, type, g, &lo, &hi);
        _Pragma("GCC unroll 4")
        for (int c = 0; c < 4; c++) _mm256_storeu_ps(dst + 32 * b + 8 * c, chunk_weights(blk, type, c, d, m, lo, hi));
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

/* ---- AVX-512, one row of x: two weight rows a register ----
 *
 * One row of x against a full tile of QW weight rows: rows 2p and 2p + 1 share a 16-lane
 * register, row 2p in its lower half, each half that row's 8-lane accumulator taking the
 * same terms in the same order as the 8-lane code above (16 lanes of one row would sum other
 * terms together). A CPU with 512-bit units then unpacks, converts, scales and accumulates
 * two rows' weights an instruction (Zen 5: a decode step's Q4_1 matmuls ran ~1.4x faster).
 * Each weight is the same float: the same integer, the same scale, the same operation. */
#define ZTARGET "avx2,fma,f16c,avx512f,avx512vl,avx512dq,avx512bw"
#define ZINLINE static inline __attribute__((always_inline, target(ZTARGET)))

ZINLINE __m512 pair_ps(__m256 lo, __m256 hi) { return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1); }

/* Rows a and b's d and m (as chunk_weights takes them), a's in the lower half. Scales kept
 * in the block convert with F16C, exact for every half (subnormals included; a signalling
 * NaN comes out quiet, as the first multiply or FMA makes it on the 8-lane path). */
ZINLINE void pair_scales(const uint8_t *ba, const uint8_t *bb, const int type, const int g, const float *sa,
                         const float *sb, __m512 *d, __m512 *m) {
    if (is_k_quant(type)) {
        __m256 da, ma, db, mb;
        group_scales(ba, type, g, sa, &da, &ma);
        group_scales(bb, type, g, sb, &db, &mb);
        *d = pair_ps(da, db);
        *m = pair_ps(ma, mb);
        return;
    }
    /* d (and Q4_1 / Q5_1's m) are a block's first 4 bytes: halves [d_a, m_a, d_b, m_b] */
    const __m128 dm = _mm_cvtph_ps(_mm_set_epi32(0, 0, (int)u32le(bb), (int)u32le(ba)));
    const __m512 dm16 = _mm512_castps128_ps512(dm);
    *d = _mm512_permutexvar_ps(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), dm16);
    *m = type == T_Q4_1 || type == T_Q5_1
             ? _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), dm16)
             : *d;
}

/* chunk_weights for rows a (lower half) and b: weights 8c..8c+7 of the group of each. qa and
 * qb: Q4_0 / Q4_1's 16 quant bytes, or group_q's lo (and *_hi its hi) of the others. */
ZINLINE __m512 pair_chunk(const uint8_t *ba, const uint8_t *bb, const int type, const int c, __m512 d, __m512 m,
                          __m128i qa, __m128i qb, __m128i qa_hi, __m128i qb_hi) {
    if (type == T_Q8_0) {
        const __m128i q = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(ba + 2 + 8 * c)),
                                             _mm_loadl_epi64((const __m128i *)(bb + 2 + 8 * c)));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
    }
    if (type == T_Q4_0 || type == T_Q4_1) { /* bytes 0..7 (c = 0, 2) or 8..15 (c = 1, 3) of each */
        const __m128i bytes = c & 1 ? _mm_unpackhi_epi64(qa, qb) : _mm_unpacklo_epi64(qa, qb);
        __m512i q = _mm512_cvtepu8_epi32(bytes);
        q = c < 2 ? _mm512_and_si512(q, _mm512_set1_epi32(0x0F)) : _mm512_srli_epi32(q, 4);
        return type == T_Q4_1 ? _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(q), m)
                              : _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(8))));
    }
    const __m128i a = c < 2 ? qa : qa_hi, b = c < 2 ? qb : qb_hi;
    const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c & 1 ? _mm_unpackhi_epi64(a, b)
                                                                    : _mm_unpacklo_epi64(a, b)));
    switch (type) {
    case T_Q5_0: return _mm512_mul_ps(d, q);
    case T_Q6_K: return _mm512_mul_ps(c < 2 ? d : m, q);
    default: return _mm512_fmadd_ps(d, q, m);
    }
}

/* qtile_narrow's one-row full tile (mt = 1, nt = QW), two weight rows a register. */
ZINLINE void qtile_pairs(const float *x, const uint8_t *w, int64_t row_bytes, const int type, float *sums,
                         int64_t K, const uint8_t *prefetch) {
    __m512 acc[QW / 2];
    float kscale[QW][16];
    for (int p = 0; p < QW / 2; p++) acc[p] = _mm512_setzero_ps();
    const int bytes = tile_block_bytes(type), groups = is_k_quant(type) ? 8 : 1;
    for (int64_t b = 0; b < K / 32; b++) {
        const int g = (int)(b % groups);
        const uint8_t *blocks = w + b / groups * bytes;
        if (groups > 1 && g == 0)
            for (int j = 0; j < QW; j++) k_scales(blocks + j * row_bytes, type, kscale[j]);
        __m512 xc[4]; /* x's chunk c in both halves, for every pair */
        for (int c = 0; c < 4; c++) xc[c] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + 32 * b + 8 * c));
        _Pragma("GCC unroll 4")
        for (int p = 0; p < QW / 2; p++) {
            const uint8_t *ba = blocks + 2 * p * row_bytes, *bb = ba + row_bytes;
            _mm_prefetch((const char *)(prefetch + (b * QW + 2 * p) * 64), _MM_HINT_T0);
            _mm_prefetch((const char *)(prefetch + (b * QW + 2 * p + 1) * 64), _MM_HINT_T0);
            __m512 d, m;
            pair_scales(ba, bb, type, g, kscale[2 * p], kscale[2 * p + 1], &d, &m);
            __m128i qa, qb, qa_hi = _mm_setzero_si128(), qb_hi = _mm_setzero_si128();
            if (type == T_Q4_0 || type == T_Q4_1) {
                qa = load16(ba + (type == T_Q4_1 ? 4 : 2));
                qb = load16(bb + (type == T_Q4_1 ? 4 : 2));
            } else {
                group_q(ba, type, g, &qa, &qa_hi);
                group_q(bb, type, g, &qb, &qb_hi);
            }
            _Pragma("GCC unroll 4")
            for (int c = 0; c < 4; c++)
                acc[p] = _mm512_fmadd_ps(xc[c], pair_chunk(ba, bb, type, c, d, m, qa, qb, qa_hi, qb_hi), acc[p]);
        }
    }
    for (int p = 0; p < QW / 2; p++) {
        sums[2 * p] = hsum_avx2(_mm512_castps512_ps256(acc[p]));
        sums[2 * p + 1] = hsum_avx2(_mm512_extractf32x8_ps(acc[p], 1));
    }
}

/* Up to XP_ROWS rows of x, packed in pairs (lanes.h), against nt <= XP_WIDTH weight rows:
 * each row's chunk of 8 weights (chunk_weights: the same floats) in both halves of a register,
 * one FMA per pair of rows of x. quant.h says why. */
ZINLINE void qtile_xpairs(const float *xp, int64_t stride, const uint8_t *w, int64_t row_bytes, const int type,
                          float *sums, int64_t K, const int pairs, const int mt, const int nt,
                          const uint8_t *prefetch) {
    __m512 acc[XP_ROWS / 2][XP_WIDTH];
    float kscale[XP_WIDTH][16];
    for (int p = 0; p < pairs; p++)
        for (int j = 0; j < nt; j++) acc[p][j] = _mm512_setzero_ps();
    const int bytes = tile_block_bytes(type), groups = is_k_quant(type) ? 8 : 1;
    for (int64_t b = 0; b < K / 32; b++) {
        const int g = (int)(b % groups);
        const uint8_t *blocks = w + b / groups * bytes;
        if (groups > 1 && g == 0)
            for (int j = 0; j < nt; j++) k_scales(blocks + j * row_bytes, type, kscale[j]);
        __m256 d[XP_WIDTH], m[XP_WIDTH];
        __m128i lo[XP_WIDTH], hi[XP_WIDTH];
        for (int j = 0; j < nt; j++) {
            const uint8_t *blk = blocks + j * row_bytes;
            _mm_prefetch((const char *)(prefetch + (b * nt + j) * 64), _MM_HINT_T0);
            group_scales(blk, type, g, kscale[j], &d[j], &m[j]);
            group_q(blk, type, g, &lo[j], &hi[j]);
        }
        _Pragma("GCC unroll 4")
        for (int c = 0; c < 4; c++) {
            __m512 wz[XP_WIDTH];
            for (int j = 0; j < nt; j++) {
                const __m256 wc = chunk_weights(blocks + j * row_bytes, type, c, d[j], m[j], lo[j], hi[j]);
                wz[j] = pair_ps(wc, wc);
            }
            const float *xc = xp + 2 * (32 * b + 8 * c);
            for (int p = 0; p < pairs; p++) {
                const __m512 xv = _mm512_loadu_ps(xc + p * stride);
                for (int j = 0; j < nt; j++) acc[p][j] = _mm512_fmadd_ps(xv, wz[j], acc[p][j]);
            }
        }
    }
    for (int p = 0; p < pairs; p++)
        for (int j = 0; j < nt; j++) {
            sums[2 * p * QW + j] = hsum_avx2(_mm512_castps512_ps256(acc[p][j]));
            if (2 * p + 1 < mt) sums[(2 * p + 1) * QW + j] = hsum_avx2(_mm512_extractf32x8_ps(acc[p][j], 1));
        }
}

#define XTILE_FN(NAME, TYPE)                                                                                   \
    __attribute__((target(ZTARGET))) static void NAME(const float *xp, int64_t stride, const uint8_t *w,        \
                                                      int64_t row_bytes, float *sums, int64_t K, int mt, int nt, \
                                                      const uint8_t *prefetch) {                                \
        if (nt == XP_WIDTH) { /* constant pairs and width: the accumulators stay in registers */            \
            switch ((mt + 1) / 2) {                                                                             \
            case 4: qtile_xpairs(xp, stride, w, row_bytes, TYPE, sums, K, 4, mt, XP_WIDTH, prefetch); return;   \
            case 3: qtile_xpairs(xp, stride, w, row_bytes, TYPE, sums, K, 3, mt, XP_WIDTH, prefetch); return;   \
            case 2: qtile_xpairs(xp, stride, w, row_bytes, TYPE, sums, K, 2, mt, XP_WIDTH, prefetch); return;   \
            case 1: qtile_xpairs(xp, stride, w, row_bytes, TYPE, sums, K, 1, mt, XP_WIDTH, prefetch); return;   \
            }                                                                                                   \
        }                                                                                                       \
        qtile_xpairs(xp, stride, w, row_bytes, TYPE, sums, K, (mt + 1) / 2, mt, nt, prefetch);                  \
    }

/* One function per type and instruction set, picked once per matmul (bp_pick_qtile). */
#define QTILE_FN(NAME, TARGET, TYPE)                                                                      \
    __attribute__((target(TARGET))) static void NAME(const float *x, const uint8_t *w, int64_t row_bytes, \
                                                     float *sums, int64_t K, int mt, int nt,               \
                                                     const uint8_t *prefetch) {                            \
        QTILE_DISPATCH(TYPE);                                                                               \
    }
/* AVX-512 hosts: two weight rows a register for one row of x, else the 8-lane code with 32
 * registers. */
#define QTILE_FN_AVX512(NAME, TYPE)                                                                       \
    __attribute__((target(ZTARGET))) static void NAME(const float *x, const uint8_t *w, int64_t row_bytes, \
                                                      float *sums, int64_t K, int mt, int nt,               \
                                                      const uint8_t *prefetch) {                            \
        if (mt == 1 && nt == QW) {                                                                          \
            qtile_pairs(x, w, row_bytes, TYPE, sums, K, prefetch);                                          \
            return;                                                                                         \
        }                                                                                                   \
        QTILE_DISPATCH(TYPE);                                                                               \
    }
#define QTILE_FNS(TYPE, AVX2_NAME, AVX512_NAME) \
    QTILE_FN(AVX2_NAME, "avx2,fma", TYPE)       \
    QTILE_FN_AVX512(AVX512_NAME, TYPE)          \
    XTILE_FN(AVX512_NAME##_x, TYPE)

QTILE_FNS(T_Q4_0, q4_0_avx2, q4_0_avx512)
QTILE_FNS(T_Q4_1, q4_1_avx2, q4_1_avx512)
QTILE_FNS(T_Q5_0, q5_0_avx2, q5_0_avx512)
QTILE_FNS(T_Q5_1, q5_1_avx2, q5_1_avx512)
QTILE_FNS(T_Q8_0, q8_0_avx2, q8_0_avx512)
QTILE_FNS(T_Q4_K, q4_k_avx2, q4_k_avx512)
QTILE_FNS(T_Q5_K, q5_k_avx2, q5_k_avx512)
QTILE_FNS(T_Q6_K, q6_k_avx2, q6_k_avx512)
#endif

qtile_fn bp_pick_qtile(int type) {
    switch (type) {
    case T_Q4_0: return BP_PICK(q4_0_avx512, q4_0_avx2, NULL);
    case T_Q4_1: return BP_PICK(q4_1_avx512, q4_1_avx2, NULL);
    case T_Q5_0: return BP_PICK(q5_0_avx512, q5_0_avx2, NULL);
    case T_Q5_1: return BP_PICK(q5_1_avx512, q5_1_avx2, NULL);
    case T_Q8_0: return BP_PICK(q8_0_avx512, q8_0_avx2, NULL);
    case T_Q4_K: return BP_PICK(q4_k_avx512, q4_k_avx2, NULL);
    case T_Q5_K: return BP_PICK(q5_k_avx512, q5_k_avx2, NULL);
    case T_Q6_K: return BP_PICK(q6_k_avx512, q6_k_avx2, NULL);
    default: return NULL; /* F16, BF16, F32: the buffer (their weights need no unpacking) */
    }
}

dequant_fn bp_pick_unpack_row(int type) {
    switch (type) { /* Q4_0, Q4_1, Q8_0: quant_dequant.c's own AVX2 loops */
    case T_Q5_0: return BP_PICK(unpack_q5_0, unpack_q5_0, NULL);
    case T_Q5_1: return BP_PICK(unpack_q5_1, unpack_q5_1, NULL);
    case T_Q4_K: return BP_PICK(unpack_q4_k, unpack_q4_k, NULL);
    case T_Q5_K: return BP_PICK(unpack_q5_k, unpack_q5_k, NULL);
    case T_Q6_K: return BP_PICK(unpack_q6_k, unpack_q6_k, NULL);
    default: return NULL;
    }
}

xtile_fn bp_pick_xtile(int type) {
    switch (type) {
    case T_Q4_0: return BP_PICK(q4_0_avx512_x, NULL, NULL);
    case T_Q4_1: return BP_PICK(q4_1_avx512_x, NULL, NULL);
    case T_Q5_0: return BP_PICK(q5_0_avx512_x, NULL, NULL);
    case T_Q5_1: return BP_PICK(q5_1_avx512_x, NULL, NULL);
    case T_Q8_0: return BP_PICK(q8_0_avx512_x, NULL, NULL);
    case T_Q4_K: return BP_PICK(q4_k_avx512_x, NULL, NULL);
    case T_Q5_K: return BP_PICK(q5_k_avx512_x, NULL, NULL);
    case T_Q6_K: return BP_PICK(q6_k_avx512_x, NULL, NULL);
    default: return NULL;
    }
}
