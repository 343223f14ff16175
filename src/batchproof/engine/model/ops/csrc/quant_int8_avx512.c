/* The int8 numerics' AVX-512 twin (quant_int8.h defines the arithmetic; quant_int8.c spells it
 * out in scalar C; quant_int8_avx2.c is the AVX2 twin this one follows): x quantized a block of
 * 32 floats in two 16-lane registers (AVX-512 F + BW), and the weights' block dots by AVX-512
 * VNNI's vpdpbusd: four u8 x s8 products added into each int32 lane with no int16 step, one
 * instruction for what maddubs + madd + add did.
 *
 * Two tiles of 8 weight rows at a time, side by side in 16-lane registers (lanes 0-7 the first
 * tile's rows, 8-15 the second's; the driver, quant_int8_linear.c, says which tiles pair): the
 * layout's 32-byte chunk holds one tile's 8 rows' quants for 4 weights each, so one x broadcast
 * (4 bytes) meets a chunk of each tile, and one float scale of x and one conversion serve 16
 * outputs. Where 512-bit operations are split in two (Zen 4) the dots cost the same as on 8
 * lanes and the rest is what a record pair saves: a tile at a time (8 lanes, until 2026-12-05)
 * took ~150 instructions a 4-row record for 32 vpdpbusd. An odd last tile runs as a pair with
 * itself, its second half not stored: 8 lanes' work thrown away once a matmul, for one code path.
 *
 * Same bits: lane j is output j's accumulator and takes step 3's float operations in the AVX2
 * twin's order on the same values; only the exact integer sums are formed in wider registers.
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
#define V16 static inline __attribute__((always_inline, target(VTARGET)))

#define RMAX 4 /* rows of x a record pair's quants are unpacked for at once (8 spill registers: slower) */

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

/* 32 bytes at a, then 32 at b */
V16 __m512i load_pair(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}
/* 8 float16 at a, then 8 at b, exactly */
V16 __m512 halves_pair(const uint8_t *a, const uint8_t *b) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                                   _mm_loadu_si128((const __m128i *)b), 1));
}
/* 8 unsigned bytes at a, then 8 at b, as floats (exactly) */
V16 __m512 bytes_pair(const uint8_t *a, const uint8_t *b) {
    const __m128i v = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a), _mm_loadl_epi64((const __m128i *)b));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
}
V16 __m512i shift16(__m512i v, const int by) { return by >= 0 ? _mm512_slli_epi16(v, by) : _mm512_srli_epi16(v, -by); }

/* quant_int8.h's int8_plane_merge on both tiles' chunk c: the same shifts and masks, wider */
V16 void plane_merge(const uint8_t *pa, const uint8_t *pb, const int bits, const int c, __m512i *l, __m512i *h) {
    if (bits == 1) {
        const __m512i p = load_pair(pa, pb), five = _mm512_set1_epi8(0x10);
        *l = _mm512_or_si512(*l, _mm512_and_si512(shift16(p, 4 - 2 * c), five));
        *h = _mm512_or_si512(*h, _mm512_and_si512(shift16(p, 3 - 2 * c), five));
    } else if (bits == 2) {
        const __m512i p = load_pair(pa + 32 * (c / 2), pb + 32 * (c / 2)), two = _mm512_set1_epi8(0x30);
        *l = _mm512_or_si512(*l, _mm512_and_si512(shift16(p, 4 - 4 * (c % 2)), two));
        *h = _mm512_or_si512(*h, _mm512_and_si512(shift16(p, 2 - 4 * (c % 2)), two));
    }
}

/* Rows 0..R of x (R <= RMAX, a constant) against the quants of two records (qa, qb): into lo[i]
 * and hi[i] (which start at what the caller puts there) the int32 sums, lane j weight row j's
 * (qa's rows, then qb's), of two halves of the products: Q6_K weights 0..15 and 16..31 (its two
 * scales; chunks 0-1 and 2-3), the other nibble types the low and the high nibbles, Q8_0 chunks
 * 0-3 and 4-7 (two chains, each half as long). */
V16 void packed_dot(const uint8_t *qa, const uint8_t *qb, const int8_t *const *xq, const int R, const int type,
                    __m512i *lo, __m512i *hi) {
#define XB(i, at) _mm512_set1_epi32(*(const int32_t *)(xq[i] + (at)))
    if (int8_nibbles(type)) {
        const __m512i nibble = _mm512_set1_epi8(0x0F);
        for (int c = 0; c < 4; c++) {
            const __m512i v = load_pair(qa + 32 * c, qb + 32 * c);
            __m512i l = _mm512_and_si512(v, nibble), h = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
            plane_merge(qa + 128, qb + 128, int8_plane_bits(type), c, &l, &h);
            for (int i = 0; i < R; i++) {
                if (type == T_Q6_K) {
                    __m512i *half = c < 2 ? &lo[i] : &hi[i];
                    *half = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(*half, l, XB(i, 8 * c)), h, XB(i, 8 * c + 4));
                } else {
                    lo[i] = _mm512_dpbusd_epi32(lo[i], l, XB(i, 8 * c));
                    hi[i] = _mm512_dpbusd_epi32(hi[i], h, XB(i, 8 * c + 4));
                }
            }
        }
    } else { /* Q8_0: q + 128, unsigned */
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        for (int c = 0; c < 8; c++) {
            const __m512i v = _mm512_xor_si512(load_pair(qa + 32 * c, qb + 32 * c), flip);
            for (int i = 0; i < R; i++) {
                if (c < 4) lo[i] = _mm512_dpbusd_epi32(lo[i], v, XB(i, 4 * c));
                else hi[i] = _mm512_dpbusd_epi32(hi[i], v, XB(i, 4 * c));
            }
        }
    }
#undef XB
}

/* Rows m0 + i0 .. + R of x (R <= RMAX) against block b's records of both tiles (wa, wb): step 3
 * into acc, the AVX2 twin's float operations. */
V16 void record_rows(const qx_rows *x, int64_t m0, const int i0, const int R, const uint8_t *wa, const uint8_t *wb,
                     int64_t b, const int type, __m512 *acc) {
    const int has_min = int8_has_min(type);
    const int zero = type == T_Q4_0 ? 8 : type == T_Q5_0 ? 16 : type == T_Q8_0 ? 128 : 0;
    const int64_t sb = int8_sb_at(type, b), at_rec = int8_group_at(type, b);
    const uint8_t *ra = wa + at_rec, *rb = wb + at_rec;
    __m512 dw, mw = _mm512_setzero_ps();
    if (type == T_Q4_K || type == T_Q5_K) { /* d * sc and -(dmin * m): the definition's products */
        dw = _mm512_mul_ps(halves_pair(wa + sb, wb + sb), bytes_pair(ra, rb));
        mw = _mm512_xor_ps(_mm512_mul_ps(halves_pair(wa + sb + 16, wb + sb + 16), bytes_pair(ra + 8, rb + 8)),
                           _mm512_set1_ps(-0.0f));
    } else if (type == T_Q6_K) {
        dw = halves_pair(wa + sb, wb + sb);
    } else {
        dw = halves_pair(ra, rb);
        if (has_min) mw = halves_pair(ra + 16, rb + 16);
    }
    const int8_t *xq[RMAX];
    __m512i lo[RMAX], hi[RMAX];
    for (int i = 0; i < R; i++) {
        const int64_t at = (m0 + i0 + i) * x->nb + b;
        xq[i] = x->q + (m0 + i0 + i) * x->K + b * QB;
        if (type == T_Q6_K) {
            lo[i] = _mm512_set1_epi32(-32 * x->sum[3 * at + 1]);
            hi[i] = _mm512_set1_epi32(-32 * x->sum[3 * at + 2]);
        } else {
            lo[i] = _mm512_set1_epi32(-zero * x->sum[3 * at]);
            hi[i] = _mm512_setzero_si512();
        }
    }
    const int64_t header = int8_group_header(type);
    packed_dot(ra + header, rb + header, xq, R, type, lo, hi);
    __m512i sc_a = _mm512_setzero_si512(), sc_b = sc_a;
    if (type == T_Q6_K) { /* each lane's int8 pair (sc_a, sc_b), sign-extended to int32 */
        const __m512i scales = _mm512_cvtepu16_epi32(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)ra)), _mm_loadu_si128((const __m128i *)rb), 1));
        sc_a = _mm512_srai_epi32(_mm512_slli_epi32(scales, 24), 24);
        sc_b = _mm512_srai_epi32(_mm512_slli_epi32(scales, 16), 24);
    }
    for (int i = 0; i < R; i++) {
        const int64_t at = (m0 + i0 + i) * x->nb + b;
        const __m512i isum = type == T_Q6_K
                                 ? _mm512_add_epi32(_mm512_mullo_epi32(lo[i], sc_a), _mm512_mullo_epi32(hi[i], sc_b))
                                 : _mm512_add_epi32(lo[i], hi[i]);
        const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(x->d[at]));
        acc[i0 + i] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(isum), acc[i0 + i]);
        if (has_min) acc[i0 + i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x->sx[at]), acc[i0 + i]);
    }
}

/* mt rows of x against the tiles at wa and wb: sums[i * 2 * IW + j], j < 8 wa's rows, 8.. wb's
 * (wa == wb: one tile, twice). */
V16 void itile(const qx_rows *x, int64_t m0, const int mt, const uint8_t *wa, const uint8_t *wb, float *sums,
               const int type) {
    const int64_t gb = int8_group_bytes(type);
    __m512 acc[IROWS];
    for (int i = 0; i < mt; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < x->nb; b++) {
        const int64_t at = int8_group_at(type, b);
        /* about two records ahead in each, as the AVX2 twin (farther, 1-4 KB, helped one row against
         * a weight in L3 and hurt one streaming from memory, by 10-20% each way, on Zen 4) */
        for (int64_t line = 0; line < gb; line += 64) {
            _mm_prefetch((const char *)(wa + at + 2 * gb + line), _MM_HINT_T0);
            _mm_prefetch((const char *)(wb + at + 2 * gb + line), _MM_HINT_T0);
        }
        int i0 = 0;
        for (; i0 + RMAX <= mt; i0 += RMAX) record_rows(x, m0, i0, RMAX, wa, wb, b, type, acc);
        switch (mt - i0) {
        case 1: record_rows(x, m0, i0, 1, wa, wb, b, type, acc); break;
        case 2: record_rows(x, m0, i0, 2, wa, wb, b, type, acc); break;
        case 3: record_rows(x, m0, i0, 3, wa, wb, b, type, acc); break;
        }
    }
    for (int i = 0; i < mt; i++) _mm512_storeu_ps(sums + i * 2 * IW, acc[i]);
}

/* One function per type (quant_int8.h's ITILE_BY_ROWS: every row count a constant). */
#define ITILE2_FN(NAME, TYPE)                                                                               \
    __attribute__((target(VTARGET))) static void NAME(const qx_rows *x, int64_t m0, int mt, const uint8_t *wa, \
                                                      const uint8_t *wb, float *sums) {                         \
        ITILE_BY_ROWS(TYPE, wa, wb)                                                                             \
    }
/* Every quantized type's tile (quant.h's BP_QUANT_TYPES), q4_0_wide and so on, and the picker's
 * switch among them. */
#define BP_TWIN_FN(name) name##_wide
#define ITILE2_WIDE(id, name, bytes, elems) ITILE2_FN(BP_TWIN_FN(name), id)
BP_QUANT_TYPES(ITILE2_WIDE)

itile2_fn bp_itile2_avx512(int type) {
    switch (type) {
    BP_QUANT_TYPES(BP_QUANT_CASE)
    default: return NULL;
    }
}
#undef BP_TWIN_FN
#endif
