/* The int8 numerics' AVX-512 twin (quant_int8.h defines the arithmetic; quant_int8.c spells it
 * out in scalar C; quant_int8_avx2.c is the AVX2 twin this one follows): x quantized a block of
 * 32 floats in two 16-lane registers (AVX-512 F + BW), and tiles of 8 weight rows whose block
 * dots are AVX-512 VNNI's vpdpbusd on 8-lane registers (VL): four u8 x s8 products added into
 * each int32 lane with no int16 step, one instruction for what maddubs + madd + add did. 8 lanes,
 * not 16: the layout's 32-byte chunk holds 8 rows' quants for 4 weights each, so one x broadcast
 * (4 bytes, from memory) meets one chunk; a 16-lane form needs a permute of x per chunk pair,
 * and where 512-bit operations are split in two (Zen 4: vpdpbusd on 8 lanes runs two a cycle,
 * on 16 one) it does no more work a cycle. Step 3's float operations are the AVX2 twin's, in its
 * order, lane j output j: the same bits.
 *
 * vpdpbusd multiplies an unsigned byte by a signed one: the weights go in unsigned (Q4_*, Q5_*,
 * Q6_K as the layout holds them, Q8_0 as q + 128, its sign bit flipped), x signed, and each
 * sum starts at -zero * (the row's block sum) (Q4_0 8, Q5_0 16, Q8_0 128; Q6_K 32 times each
 * half's sum), so it ends at step 2's integer. Bounds (|q_x| <= 127): a lane's start at most
 * 128 x 32 x 127 = 520,192, then at most 32 products of 255 x 127 (Q8_0), 1,036,320; Q6_K's
 * halves end within 16 x 32 x 127 = 65,024, times its int8 scales (|sc| <= 128, vpmulld) and
 * added, 16,646,144: every intermediate well inside int32. vpdpbusds (saturating) is never
 * used. VNNI is asked of the CPU at run time (bp_isa_vnni, isa.c): an AVX-512 CPU without it
 * runs the AVX2 twin's tiles.
 */
#include "quant_int8.h"

#ifdef BP_X86
#include <immintrin.h>

#define ZTARGET "avx2,fma,f16c,avx512f,avx512vl,avx512dq,avx512bw"
#define VTARGET ZTARGET ",avx512vnni"
#define V8 static inline __attribute__((always_inline, target(VTARGET)))

#define RMAX 4 /* rows of x a record's quants are unpacked for at once (8 spill registers: slower) */

/* Step 1, as quant_int8.c's quantize_block: the block's halves (weights 0..15, 16..31) are the
 * two registers. Needs AVX-512 F + BW only (not VNNI). */
__attribute__((target(ZTARGET))) void bp_quantize_x_avx512(const float *x, int64_t M, int64_t K, qx_rows *qx) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
    const __m512 lim = _mm512_set1_ps(127.0f), neg_lim = _mm512_set1_ps(-127.0f);
    for (int64_t i = 0; i < M; i++)
        for (int64_t b = 0; b < qx->nb; b++) {
            const int64_t at = i * qx->nb + b;
            const float *xb = x + i * K + b * QB;
            int8_t *q = qx->q + i * K + b * QB;
            const __m512i v0 = _mm512_loadu_si512(xb), v1 = _mm512_loadu_si512(xb + 16);
            const uint32_t amax_bits = (uint32_t)_mm512_reduce_max_epu32(
                _mm512_max_epu32(_mm512_and_si512(v0, abs_mask), _mm512_and_si512(v1, abs_mask)));
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
            const __m512 id = _mm512_set1_ps(127.0f / amax);
            /* x * (127 / amax), rounded half to even, clamped to +-127: exactly as the other twins */
#define QUANT(v)                                                                                                  \
    _mm512_cvttps_epi32(_mm512_min_ps(                                                                           \
        _mm512_max_ps(_mm512_roundscale_ps(_mm512_mul_ps(_mm512_castsi512_ps(v), id),                            \
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),                       \
                      neg_lim),                                                                                  \
        lim))
            const __m512i r0 = QUANT(v0), r1 = QUANT(v1);
#undef QUANT
            sum[1] = _mm512_reduce_add_epi32(r0);
            sum[2] = _mm512_reduce_add_epi32(r1);
            sum[0] = sum[1] + sum[2];
            _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(r0)); /* in [-127, 127]: exact */
            _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(r1));
            qx->d[at] = amax / 127.0f;
            qx->sx[at] = qx->d[at] * (float)sum[0];
        }
}

/* Rows 0..R of x (R <= RMAX, a constant) against a record's quants: into lo[i] and hi[i] (which
 * start at what the caller puts there) the int32 sums, lane j weight row j's, of two halves of
 * the products: Q6_K weights 0..15 and 16..31 (its two scales; chunks 0-1 and 2-3), the other
 * nibble types the low and the high nibbles, Q8_0 chunks 0-3 and 4-7 (two chains, each half as
 * long). */
V8 void packed_dot(const uint8_t *qs, const int8_t *const *xq, const int R, const int type, __m256i *lo,
                   __m256i *hi) {
#define XB(i, at) _mm256_set1_epi32(*(const int32_t *)(xq[i] + (at))) /* 4 bytes of row i in every lane */
#define WB(c) _mm256_loadu_si256((const __m256i *)(qs + 32 * (c)))
    if (int8_nibbles(type)) {
        const __m256i nibble = _mm256_set1_epi8(0x0F);
        for (int c = 0; c < 4; c++) {
            const __m256i v = WB(c);
            __m256i l = _mm256_and_si256(v, nibble), h = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
            int8_plane_merge(qs + 128, int8_plane_bits(type), c, &l, &h);
            for (int i = 0; i < R; i++) {
                if (type == T_Q6_K) { /* weights 8c.. 8c + 7: the first half for c < 2 */
                    __m256i *half = c < 2 ? &lo[i] : &hi[i];
                    *half = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(*half, l, XB(i, 8 * c)), h, XB(i, 8 * c + 4));
                } else {
                    lo[i] = _mm256_dpbusd_epi32(lo[i], l, XB(i, 8 * c));
                    hi[i] = _mm256_dpbusd_epi32(hi[i], h, XB(i, 8 * c + 4));
                }
            }
        }
    } else { /* Q8_0: q + 128, unsigned */
        const __m256i flip = _mm256_set1_epi8((char)0x80);
        for (int c = 0; c < 8; c++) {
            const __m256i v = _mm256_xor_si256(WB(c), flip);
            for (int i = 0; i < R; i++) {
                if (c < 4) lo[i] = _mm256_dpbusd_epi32(lo[i], v, XB(i, 4 * c));
                else hi[i] = _mm256_dpbusd_epi32(hi[i], v, XB(i, 4 * c));
            }
        }
    }
#undef WB
#undef XB
}

/* Rows m0 + i0 .. + R of x (R <= RMAX) against block b's record: step 3 into acc, the AVX2
 * twin's float operations. */
V8 void record_rows(const qx_rows *x, int64_t m0, const int i0, const int R, const uint8_t *w, int64_t b,
                    const int type, __m256 *acc) {
    const int has_min = int8_has_min(type);
    const int zero = type == T_Q4_0 ? 8 : type == T_Q5_0 ? 16 : type == T_Q8_0 ? 128 : 0;
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
    const int8_t *xq[RMAX];
    __m256i lo[RMAX], hi[RMAX];
    for (int i = 0; i < R; i++) {
        const int64_t at = (m0 + i0 + i) * x->nb + b;
        xq[i] = x->q + (m0 + i0 + i) * x->K + b * QB;
        /* the zero taken off up front: the sums start at -zero * sum(q_x), Q6_K's each half's own */
        if (type == T_Q6_K) {
            lo[i] = _mm256_set1_epi32(-32 * x->sum[3 * at + 1]);
            hi[i] = _mm256_set1_epi32(-32 * x->sum[3 * at + 2]);
        } else {
            lo[i] = _mm256_set1_epi32(-zero * x->sum[3 * at]); /* 0 for the types with a min */
            hi[i] = _mm256_setzero_si256();
        }
    }
    packed_dot(rec + int8_group_header(type), xq, R, type, lo, hi);
    __m256i sc_a = _mm256_setzero_si256(), sc_b = sc_a;
    if (type == T_Q6_K) { /* each lane's int8 pair (sc_a, sc_b), sign-extended to int32 */
        const __m256i scales = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)rec));
        sc_a = _mm256_srai_epi32(_mm256_slli_epi32(scales, 24), 24);
        sc_b = _mm256_srai_epi32(_mm256_slli_epi32(scales, 16), 24);
    }
    for (int i = 0; i < R; i++) {
        const int64_t at = (m0 + i0 + i) * x->nb + b;
        __m256i isum;
        if (type == T_Q6_K) /* sc_a sum_{0..15} (q_w - 32) q_x + sc_b sum_{16..31} (q_w - 32) q_x */
            isum = _mm256_add_epi32(_mm256_mullo_epi32(lo[i], sc_a), _mm256_mullo_epi32(hi[i], sc_b));
        else
            isum = _mm256_add_epi32(lo[i], hi[i]);
        const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(x->d[at]));
        acc[i0 + i] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(isum), acc[i0 + i]);
        if (has_min) acc[i0 + i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x->sx[at]), acc[i0 + i]);
    }
}

/* mt rows of x against a tile of 8 weight rows in records: quant_int8.h's step 3, lane j output j. */
V8 void itile(const qx_rows *x, int64_t m0, const int mt, const uint8_t *w, float *sums, const int type) {
    const int64_t gb = int8_group_bytes(type);
    __m256 acc[IROWS];
    for (int i = 0; i < mt; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < x->nb; b++) {
        const uint8_t *rec = w + int8_group_at(type, b);
        /* about two records ahead, as the AVX2 twin (farther, 1-4 KB, helped one row against a
         * weight in L3 and hurt one streaming from memory, by 10-20% each way, on Zen 4) */
        for (int64_t line = 0; line < gb; line += 64)
            _mm_prefetch((const char *)(rec + 2 * gb + line), _MM_HINT_T0);
        int i0 = 0;
        for (; i0 + RMAX <= mt; i0 += RMAX) record_rows(x, m0, i0, RMAX, w, b, type, acc);
        switch (mt - i0) {
        case 1: record_rows(x, m0, i0, 1, w, b, type, acc); break;
        case 2: record_rows(x, m0, i0, 2, w, b, type, acc); break;
        case 3: record_rows(x, m0, i0, 3, w, b, type, acc); break;
        }
    }
    for (int i = 0; i < mt; i++) _mm256_storeu_ps(sums + i * IW, acc[i]);
}

/* One function per type (quant_int8.h's ITILE_BY_ROWS: every row count a constant). */
#define ITILE_FN(NAME, TYPE)                                                                             \
    __attribute__((target(VTARGET))) static void NAME(const qx_rows *x, int64_t m0, int mt,            \
                                                      const uint8_t *w, float *sums) {                 \
        ITILE_BY_ROWS(TYPE)                                                                              \
    }
ITILE_FN(q4_0_vnni, T_Q4_0)
ITILE_FN(q4_1_vnni, T_Q4_1)
ITILE_FN(q5_0_vnni, T_Q5_0)
ITILE_FN(q5_1_vnni, T_Q5_1)
ITILE_FN(q8_0_vnni, T_Q8_0)
ITILE_FN(q4_k_vnni, T_Q4_K)
ITILE_FN(q5_k_vnni, T_Q5_K)
ITILE_FN(q6_k_vnni, T_Q6_K)

itile_fn bp_itile_avx512(int type) {
    switch (type) {
    case T_Q4_0: return q4_0_vnni;
    case T_Q4_1: return q4_1_vnni;
    case T_Q5_0: return q5_0_vnni;
    case T_Q5_1: return q5_1_vnni;
    case T_Q8_0: return q8_0_vnni;
    case T_Q4_K: return q4_k_vnni;
    case T_Q5_K: return q5_k_vnni;
    case T_Q6_K: return q6_k_vnni;
    default: return NULL;
    }
}
#endif
