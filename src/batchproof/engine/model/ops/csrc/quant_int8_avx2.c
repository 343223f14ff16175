/* The int8 numerics' AVX2 twin (quant_int8.h defines the arithmetic; quant_int8.c spells it out
 * in scalar C): x quantized 32 floats at a time, and tiles of 8 weight rows whose block dots are
 * integer (maddubs: u8 x s8 pairs into int16, madd into int32), reduced across the 8 rows into
 * one int32 lane per output, then step 3's float operations with lane j as output j.
 *
 * int16 saturation, checked per type (maddubs adds two u8 x s8 products into an int16, and
 * |q_x| <= 127): the weights go in unsigned, their zero (Q4_0 8, Q5_0 16, Q6_K 32) taken off
 * afterwards in int32 from the row's block sums: Q4 2 x 15 x 127 = 3,810; Q5 2 x 31 x 127 =
 * 7,874; Q6_K 2 x 63 x 127 = 16,002; Q8_0 (signed, so |w| against sign(x, w)): 2 x 128 x 127 =
 * 32,512 < 32,767. Q6_K's madd multiplies by its int8 scales instead of ones: at most
 * 2 x 16,002 x 128 per int32 lane.
 */
#include "quant_int8.h"

#ifdef BP_X86
#include <immintrin.h>

#define I8 static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* The largest of 8 unsigned lanes. */
I8 uint32_t hmax_epu32(__m256i v) {
    __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
    return (uint32_t)_mm_cvtsi128_si32(m);
}

I8 int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

__attribute__((target("avx2,fma,f16c"))) void bp_quantize_x_avx2(const float *x, int64_t M, int64_t K, qx_rows *qx) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
    const __m256 lim = _mm256_set1_ps(127.0f), neg_lim = _mm256_set1_ps(-127.0f);
    for (int64_t i = 0; i < M; i++)
        for (int64_t b = 0; b < qx->nb; b++) {
            const int64_t at = i * qx->nb + b;
            const float *xb = x + i * K + b * QB;
            int8_t *q = qx->q + i * K + b * QB;
            __m256i v[4], m = _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                v[c] = _mm256_loadu_si256((const __m256i *)(xb + 8 * c));
                m = _mm256_max_epu32(m, _mm256_and_si256(v[c], abs_mask));
            }
            const uint32_t amax_bits = hmax_epu32(m);
            int32_t *sum = qx->sum + 3 * at;
            if (amax_bits >= 0x7F800000u || amax_bits < TINY_BITS) { /* infinity or NaN: NaN scale; ~zeros: 0 */
                memset(q, 0, QB);
                qx->d[at] = amax_bits < TINY_BITS ? 0.0f : __builtin_nanf("");
                sum[0] = sum[1] = sum[2] = 0;
                qx->sx[at] = qx->d[at] * 0.0f;
                continue;
            }
            float amax;
            memcpy(&amax, &amax_bits, 4);
            const __m256 id = _mm256_set1_ps(127.0f / amax);
            __m256i r[4];
            for (int c = 0; c < 4; c++) {
                __m256 s = _mm256_round_ps(_mm256_mul_ps(_mm256_castsi256_ps(v[c]), id),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                s = _mm256_min_ps(_mm256_max_ps(s, neg_lim), lim);
                r[c] = _mm256_cvttps_epi32(s);
            }
            sum[1] = hsum_epi32(_mm256_add_epi32(r[0], r[1]));
            sum[2] = hsum_epi32(_mm256_add_epi32(r[2], r[3]));
            sum[0] = sum[1] + sum[2];
            /* packs interleaves the 128-bit halves: the permute puts the 32 bytes back in order */
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
            _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            qx->d[at] = amax / 127.0f;
            qx->sx[at] = qx->d[at] * (float)sum[0];
        }
}

/* v in a register here, as the source orders it: without this GCC reassociated the integer adds,
 * formed all 32 products of a 4-row record first and kept them on the stack (Q4_1: 32 stores and
 * their reloads a record, 16 registers holding 4 rows' sums). The sums are exact in any order,
 * so this is speed only: a 4-row record of Q4_1 / Q4_K 0.77x the time, Q8_0 0.95x. */
#define IN_ORDER(v) __asm__("" : "+x"(v))

/* Rows 0..R of x (R <= 4, a constant), their int32 lane j: step 2's integer for weight row j, the
 * zero not yet taken off, from the record's quants (8 rows interleaved: no reduction across
 * lanes; each chunk unpacked once for the R rows). A chunk's two nibble products are added in
 * int16, and chunks' sums only as far as the bounds above allow before madd: 4-bit 4 chunks
 * (8 x 3,810), 5-bit 2 (4 x 7,874), Q6_K 1 (2 x 16,002, madd with its scale: chunks 0-1 are
 * weights 0..15, sc_a, 2-3 weights 16..31, sc_b), Q8_0 none. */
I8 void packed_dot(const uint8_t *qs, const int8_t *const *xq, const int R, const int type, __m256i scales,
                   __m256i *out) {
    const __m256i ones = _mm256_set1_epi16(1), nibble = _mm256_set1_epi8(0x0F);
#define XB(i, at) _mm256_set1_epi32(*(const int32_t *)(xq[i] + (at))) /* 4 bytes of row i in every lane */
#define WB(c) _mm256_loadu_si256((const __m256i *)(qs + 32 * (c)))
    __m256i s16[4];
    for (int i = 0; i < R; i++) out[i] = s16[i] = _mm256_setzero_si256();
    if (int8_nibbles(type)) {
        const int bits = int8_plane_bits(type), per_madd = bits == 0 ? 4 : bits == 1 ? 2 : 1;
        /* Q6_K: each lane's pair (sc_a, sc_b) -> (sc_a, sc_a) and (sc_b, sc_b) */
        const __m256i sc_a = _mm256_shuffle_epi8(scales, _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12,
                                                                          13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12,
                                                                          13, 12, 13));
        const __m256i sc_b = _mm256_shuffle_epi8(scales, _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15,
                                                                          14, 15, 2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10,
                                                                          11, 14, 15, 14, 15));
        for (int c = 0; c < 4; c++) {
            const __m256i v = WB(c);
            __m256i l = _mm256_and_si256(v, nibble), h = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
            int8_plane_merge(qs + 128, bits, c, &l, &h);
            for (int i = 0; i < R; i++) {
                s16[i] = _mm256_add_epi16(s16[i], _mm256_maddubs_epi16(l, XB(i, 8 * c)));
                s16[i] = _mm256_add_epi16(s16[i], _mm256_maddubs_epi16(h, XB(i, 8 * c + 4)));
                IN_ORDER(s16[i]);
            }
            if (c % per_madd == per_madd - 1)
                for (int i = 0; i < R; i++) {
                    const __m256i by = type != T_Q6_K ? ones : c < 2 ? sc_a : sc_b;
                    out[i] = _mm256_add_epi32(out[i], _mm256_madd_epi16(s16[i], by));
                    IN_ORDER(out[i]);
                    s16[i] = _mm256_setzero_si256();
                }
        }
    } else { /* Q8_0: signed, so |w| against sign(x, w) */
        for (int c = 0; c < 8; c++) {
            const __m256i v = WB(c), a = _mm256_abs_epi8(v);
            for (int i = 0; i < R; i++) {
                out[i] = _mm256_add_epi32(out[i], _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(XB(i, 4 * c), v)),
                                                                    ones));
                IN_ORDER(out[i]);
            }
        }
    }
#undef WB
#undef XB
}

/* Rows m0 + i0 .. + R of x (R <= 4) against block b's record: step 3 into acc. */
I8 void record_rows(const qx_rows *x, int64_t m0, const int i0, const int R, const uint8_t *w, int64_t b,
                    const int type, __m256 *acc) {
    const int has_min = int8_has_min(type), zero = type == T_Q4_0 ? 8 : type == T_Q5_0 ? 16 : 0;
    const uint8_t *sb = w + int8_sb_at(type, b), *rec = w + int8_group_at(type, b);
#define HALVES(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))) /* 8 float16, exactly */
#define BYTES(p) _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
    __m256 dw, mw = _mm256_setzero_ps();
    if (type == T_Q4_K || type == T_Q5_K) { /* d * sc and -(dmin * m): the definition's products */
        dw = _mm256_mul_ps(HALVES(sb), BYTES(rec));
        mw = _mm256_xor_ps(_mm256_mul_ps(HALVES(sb + 16), BYTES(rec + 8)), _mm256_set1_ps(-0.0f));
    } else if (type == T_Q6_K) {
        dw = HALVES(sb);
    } else {
        dw = HALVES(rec);
        if (has_min) mw = HALVES(rec + 16);
    }
#undef HALVES
#undef BYTES
    /* Q6_K: each lane's int8 pair (sc_a, sc_b) as an int16 pair */
    const __m256i scales = type == T_Q6_K ? _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)rec))
                                          : _mm256_setzero_si256();
    const int8_t *xq[4];
    for (int i = 0; i < R; i++) xq[i] = x->q + (m0 + i0 + i) * x->K + b * QB;
    __m256i isum[4];
    packed_dot(rec + int8_group_header(type), xq, R, type, scales, isum);
    for (int i = 0; i < R; i++) {
        const int64_t at = (m0 + i0 + i) * x->nb + b;
        const int32_t *sum = x->sum + 3 * at;
        if (zero) isum[i] = _mm256_sub_epi32(isum[i], _mm256_set1_epi32(zero * sum[0]));
        if (type == T_Q6_K) /* 32 (sc_a sum_lo + sc_b sum_hi): the pairs against (sum_lo, sum_hi) */
            isum[i] = _mm256_sub_epi32(isum[i], _mm256_slli_epi32(_mm256_madd_epi16(
                scales, _mm256_set1_epi32((int32_t)((uint32_t)(uint16_t)sum[1] | (uint32_t)sum[2] << 16))), 5));
        const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(x->d[at]));
        acc[i0 + i] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(isum[i]), acc[i0 + i]);
        if (has_min) acc[i0 + i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x->sx[at]), acc[i0 + i]);
    }
}

/* mt rows of x against a tile of 8 weight rows in records: quant_int8.h's step 3, lane j output j. */
I8 void itile(const qx_rows *x, int64_t m0, const int mt, const uint8_t *w, float *sums, const int type) {
    const int64_t gb = int8_group_bytes(type);
    __m256 acc[IROWS];
    for (int i = 0; i < mt; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < x->nb; b++) {
        const uint8_t *rec = w + int8_group_at(type, b);
        for (int64_t line = 0; line < gb; line += 64) /* about two records ahead */
            _mm_prefetch((const char *)(rec + 2 * gb + line), _MM_HINT_T0);
        RECORD_ROWS_BY_FOURS(x, m0, mt, w, b, type, acc);
    }
    for (int i = 0; i < mt; i++) _mm256_storeu_ps(sums + i * IW, acc[i]);
}

/* One function per type (quant_int8.h's ITILE_BY_ROWS: every row count a constant). */
#define ITILE_FN(NAME, TYPE)                                                                             \
    __attribute__((target("avx2,fma,f16c"))) static void NAME(const qx_rows *x, int64_t m0, int mt,    \
                                                         const uint8_t *w, float *sums) {              \
        ITILE_BY_ROWS(TYPE, w)                                                                           \
    }
/* Every quantized type's tile (quant.h's BP_QUANT_TYPES), q4_0_avx2 and so on, and the picker's
 * switch among them. */
#define BP_TWIN_FN(name) name##_avx2
#define ITILE_AVX2(id, name, bytes, elems) ITILE_FN(BP_TWIN_FN(name), id)
BP_QUANT_TYPES(ITILE_AVX2)

itile_fn bp_itile_avx2(int type) {
    switch (type) {
    BP_QUANT_TYPES(BP_QUANT_CASE)
    default: return NULL;
    }
}
#undef BP_TWIN_FN
#endif
