/* The int8 numerics' aarch64 twin (quant_int8.h defines the arithmetic; quant_int8.c spells it
 * out in scalar C): tiles of 8 weight rows whose block dots are the Armv8.2 dot product (sdot:
 * four int8 x int8 products added into an int32 lane), on CPUs that have it (bp_isa_dotprod,
 * isa.c: Graviton 2 on, Apple M1 on, Ampere Altra on; the Cortex-A53/A72 class off, where the
 * portable twin runs). Only the tiles: x's quantization is the portable twin's (a few
 * microseconds a matmul).
 *
 * The records' layout (8 rows interleaved, 4 bytes a row a chunk) was made for this: one
 * 16-byte load holds 4 rows' quants of 4 consecutive weights, so sdot of it against 4 bytes of
 * x repeated in every lane gives rows 0-3's (then 4-7's) integer dots with no reduction across
 * lanes. Every integer sum is exact in any order (the bounds of quant_int8_avx2.c's header,
 * without its int16 step: sdot adds into int32), so lane j holds step 2's integer for row j as
 * every twin does, and step 3's float operations follow in the definition's order: the same bits.
 * The weights go in unsigned as stored (nibbles 0..15, Q5 0..31, Q6_K 0..63: all below 128, so
 * a signed dot reads them right), their zero taken off from x's block sums afterwards.
 */
#include <string.h>

#include "quant_int8.h"

#ifdef BP_ARM
#include <arm_neon.h>

#define DOT static inline __attribute__((always_inline, target("arch=armv8.2-a+dotprod")))

/* 4 bytes of x repeated in each 32-bit lane. */
DOT int8x16_t x4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return vreinterpretq_s8_s32(vdupq_n_s32(v));
}

/* A 5- or 6-bit type's higher bits from its plane put above chunk c's low (l) and high (h)
 * nibbles (quant_int8.h's layout; int8_plane_merge on x86): shifts by a signed count (negative
 * shifts right), then a mask within the byte. */
DOT void plane_merge(const uint8_t *plane, const int bits, const int c, uint8x16_t *l, uint8x16_t *h, int half) {
    if (bits == 1) { /* byte bit 2c: weight 8c + e's fifth bit, 2c + 1: 8c + 4 + e's */
        const uint8x16_t p = vld1q_u8(plane + 16 * half), five = vdupq_n_u8(0x10);
        *l = vorrq_u8(*l, vandq_u8(vshlq_u8(p, vdupq_n_s8((int8_t)(4 - 2 * c))), five));
        *h = vorrq_u8(*h, vandq_u8(vshlq_u8(p, vdupq_n_s8((int8_t)(3 - 2 * c))), five));
    } else if (bits == 2) { /* chunk c / 2, bits 4s, 4s + 2 (s = c % 2): the top two of each */
        const uint8x16_t p = vld1q_u8(plane + 32 * (c / 2) + 16 * half), two = vdupq_n_u8(0x30);
        *l = vorrq_u8(*l, vandq_u8(vshlq_u8(p, vdupq_n_s8((int8_t)(4 - 4 * (c % 2)))), two));
        *h = vorrq_u8(*h, vandq_u8(vshlq_u8(p, vdupq_n_s8((int8_t)(2 - 4 * (c % 2)))), two));
    }
}

/* Rows 0..R of x (R <= 4): out[i][half] lane j = step 2's integer for weight row 4 half + j, the
 * zero not yet taken off; Q6_K's two halves of the group (weights 0..15: chunks 0-1, sc_a;
 * 16..31: chunks 2-3, sc_b) in lo and hi, each times its scale afterwards. */
DOT void packed_dot(const uint8_t *qs, const int8_t *const *xq, const int R, const int type, int32x4_t out[4][2],
                    int32x4_t hi[4][2]) {
    const int32x4_t zero = vdupq_n_s32(0);
    for (int i = 0; i < R; i++)
        for (int half = 0; half < 2; half++) out[i][half] = hi[i][half] = zero;
    if (int8_nibbles(type)) {
        const int bits = int8_plane_bits(type);
        const uint8x16_t nibble = vdupq_n_u8(0x0F);
        for (int c = 0; c < 4; c++)
            for (int half = 0; half < 2; half++) {
                const uint8x16_t v = vld1q_u8(qs + 32 * c + 16 * half);
                uint8x16_t l = vandq_u8(v, nibble), h = vshrq_n_u8(v, 4);
                plane_merge(qs + 128, bits, c, &l, &h, half);
                for (int i = 0; i < R; i++) {
                    int32x4_t *acc = type == T_Q6_K && c >= 2 ? &hi[i][half] : &out[i][half];
                    *acc = vdotq_s32(*acc, vreinterpretq_s8_u8(l), x4(xq[i] + 8 * c));
                    *acc = vdotq_s32(*acc, vreinterpretq_s8_u8(h), x4(xq[i] + 8 * c + 4));
                }
            }
    } else { /* Q8_0: signed bytes, chunk c weights 4c..4c + 3 */
        for (int c = 0; c < 8; c++)
            for (int half = 0; half < 2; half++) {
                const int8x16_t v = vld1q_s8((const int8_t *)qs + 32 * c + 16 * half);
                for (int i = 0; i < R; i++) out[i][half] = vdotq_s32(out[i][half], v, x4(xq[i] + 4 * c));
            }
    }
}

/* 4 float16 from p, exactly. */
DOT float32x4_t halves4(const uint8_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p))); }
/* 4 bytes from p as floats, exactly. */
DOT float32x4_t bytes4(const uint8_t *p) {
    uint8_t b[8] = {p[0], p[1], p[2], p[3], 0, 0, 0, 0};
    return vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vld1_u8(b)))));
}

/* Rows m0 + i0 .. + R of x (R <= 4) against block b's record: step 3 into acc. */
DOT void record_rows(const qx_rows *x, int64_t m0, const int i0, const int R, const uint8_t *w, int64_t b,
                     const int type, float32x4_t acc[][2]) {
    const int has_min = int8_has_min(type), zero = type == T_Q4_0 ? 8 : type == T_Q5_0 ? 16 : 0;
    const uint8_t *sb = w + int8_sb_at(type, b), *rec = w + int8_group_at(type, b);
    float32x4_t dw[2], mw[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int32x4_t sc_a[2], sc_b[2];
    for (int half = 0; half < 2; half++) {
        const int o = 4 * half; /* rows 4 half .. 4 half + 3 */
        if (type == T_Q4_K || type == T_Q5_K) { /* d * sc and -(dmin * m): the definition's products */
            dw[half] = vmulq_f32(halves4(sb + 2 * o), bytes4(rec + o));
            mw[half] = vnegq_f32(vmulq_f32(halves4(sb + 16 + 2 * o), bytes4(rec + 8 + o)));
        } else if (type == T_Q6_K) {
            dw[half] = halves4(sb + 2 * o);
        } else {
            dw[half] = halves4(rec + 2 * o);
            if (has_min) mw[half] = halves4(rec + 16 + 2 * o);
        }
        if (type == T_Q6_K) { /* each lane's int8 pair (sc_a, sc_b) */
            const int8x8x2_t s = vld2_s8((const int8_t *)rec); /* rows 0..7's sc_a, then sc_b */
            const int16x8_t a = vmovl_s8(s.val[0]), bb = vmovl_s8(s.val[1]);
            sc_a[half] = vmovl_s16(half ? vget_high_s16(a) : vget_low_s16(a));
            sc_b[half] = vmovl_s16(half ? vget_high_s16(bb) : vget_low_s16(bb));
        }
    }
    const int8_t *xq[4];
    for (int i = 0; i < R; i++) xq[i] = x->q + (m0 + i0 + i) * x->K + b * QB;
    int32x4_t isum[4][2], hi[4][2];
    packed_dot(rec + int8_group_header(type), xq, R, type, isum, hi);
    for (int i = 0; i < R; i++) {
        const int64_t at = (m0 + i0 + i) * x->nb + b;
        const int32_t *sum = x->sum + 3 * at;
        const float32x4_t d = vdupq_n_f32(x->d[at]), sx = vdupq_n_f32(x->sx[at]);
        for (int half = 0; half < 2; half++) {
            int32x4_t s = isum[i][half];
            if (zero) s = vsubq_s32(s, vdupq_n_s32(zero * sum[0]));
            if (type == T_Q6_K) /* sc_a (lo - 32 sum_lo) + sc_b (hi - 32 sum_hi) */
                s = vaddq_s32(vmulq_s32(sc_a[half], vsubq_s32(s, vdupq_n_s32(32 * sum[1]))),
                              vmulq_s32(sc_b[half], vsubq_s32(hi[i][half], vdupq_n_s32(32 * sum[2]))));
            float32x4_t a = vfmaq_f32(acc[i0 + i][half], vmulq_f32(dw[half], d), vcvtq_f32_s32(s));
            if (has_min) a = vfmaq_f32(a, mw[half], sx);
            acc[i0 + i][half] = a;
        }
    }
}

/* mt rows of x against a tile of 8 weight rows in records: quant_int8.h's step 3, lane j output j. */
DOT void itile(const qx_rows *x, int64_t m0, const int mt, const uint8_t *w, float *sums, const int type) {
    float32x4_t acc[IROWS][2];
    for (int i = 0; i < mt; i++) acc[i][0] = acc[i][1] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < x->nb; b++) {
        RECORD_ROWS_BY_FOURS(x, m0, mt, w, b, type, acc);
    }
    for (int i = 0; i < mt; i++) {
        vst1q_f32(sums + i * IW, acc[i][0]);
        vst1q_f32(sums + i * IW + 4, acc[i][1]);
    }
}

/* One function per type (quant_int8.h's ITILE_BY_ROWS: every row count a constant). */
#define ITILE_FN(NAME, TYPE)                                                                   \
    __attribute__((target("arch=armv8.2-a+dotprod"))) static void NAME(const qx_rows *x, int64_t m0, \
                                                                      int mt, const uint8_t *w,     \
                                                                      float *sums) {                \
        ITILE_BY_ROWS(TYPE, w)                                                                      \
    }
#define BP_TWIN_FN(name) name##_neon
#define ITILE_NEON(id, name, bytes, elems) ITILE_FN(BP_TWIN_FN(name), id)
BP_QUANT_TYPES(ITILE_NEON)

itile_fn bp_itile_neon(int type) {
    if (!bp_isa_dotprod()) return NULL;
    switch (type) {
    BP_QUANT_TYPES(BP_QUANT_CASE)
    default: return NULL;
    }
}
#undef BP_TWIN_FN
#endif
