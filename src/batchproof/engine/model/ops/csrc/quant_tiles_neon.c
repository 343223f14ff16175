/* The register path's NEON twin (quant.h), aarch64 only: up to four rows of x against quantized
 * weight rows of Q4_0, Q4_1, Q8_0, Q4_K and Q6_K, each block unpacked in registers and fed
 * straight to the FMAs, as quant_tiles_avx2.c does on x86 (why a register path pays: the top of
 * quant_tiles_body.h). The other quantized types (Q5_0, Q5_1, Q5_K) return NULL and go through
 * quant_linear.c's buffer, the portable path.
 *
 * The same bits as every other path: each output keeps the one 8-lane sum (lanes.h), here as two
 * 4-lane registers, lo holding lanes 0-3 and hi lanes 4-7; lane l takes x[k] * w[k] for k = l mod 8
 * in increasing k, each by one fused multiply-add (vfmaq_f32: one rounding, as the portable
 * path's fmaf and AVX2's vfmadd), then sum8's tree: lo + hi (lane l plus lane l + 4), the pairs
 * (0, 2) and (1, 3), their sum. Every weight is the float32 quant_dequant.c computes, by the
 * operations quant_tiles_body.h's top gives for each type: Q8_0 q * d; Q4_0 d * (q - 8); Q6_K
 * (d * sc) * (q - 32); Q4_1 fma(d, q, m) (d * q is exact, so one rounding as the add's); Q4_K
 * fma(d * sc, q, -(dmin * m)) (likewise). The K-quants' scale products are made in scalar code,
 * the very products quant_dequant.c makes; f16 scales through quant.h's exact f16(). The build's
 * -ffp-contract=off keeps the compiler from fusing anything else.
 *
 * tests/aarch64 runs every case of the kernels' digests under qemu-aarch64 at this level and
 * capped to the portable one, both equal to x86's. Speed has not been measured on ARM hardware.
 */
#include <stdint.h>

#include "quant.h"

#ifdef BP_ARM
#include <arm_neon.h>

#define INLINE static inline __attribute__((always_inline))

/* sum8's tree (lanes.h) of the 8 lanes lo (0-3) and hi (4-7). */
INLINE float hsum8_neon(float32x4_t lo, float32x4_t hi) {
    const float32x4_t t = vaddq_f32(lo, hi);                            /* t_l = lane l + lane l + 4 */
    const float32x2_t u = vadd_f32(vget_low_f32(t), vget_high_f32(t)); /* t0 + t2, t1 + t3 */
    return vget_lane_f32(u, 0) + vget_lane_f32(u, 1);
}

static inline int is_k_quant(int type) { return type == T_Q4_K || type == T_Q6_K; }

/* A K-quant super-block's scales into s[16], quant_dequant.c's products: Q4_K s[g] = d * sc_g and
 * s[8 + g] = -(dmin * m_g) (negated for the FMA to add; scale_min_k4's 6-bit unpacking); Q6_K
 * s[i] = d * sc_i, one per 16 weights. */
INLINE void k_scales(const uint8_t *blk, const int type, float *s) {
    if (type == T_Q6_K) {
        const float d = f16(blk + 208);
        for (int i = 0; i < 16; i++) s[i] = d * (float)(int8_t)blk[192 + i];
        return;
    }
    const float d = f16(blk), dmin = f16(blk + 2);
    const uint8_t *sc = blk + 4;
    for (int g = 0; g < 8; g++) {
        const int scale = g < 4 ? sc[g] & 63 : (sc[g + 4] & 0xF) | ((sc[g - 4] >> 6) << 4);
        const int min = g < 4 ? sc[g + 4] & 63 : (sc[g + 4] >> 4) | ((sc[g] >> 6) << 4);
        s[g] = d * (float)scale;
        s[8 + g] = -(dmin * (float)min);
    }
}

/* 16 signed bytes -> 16 floats, in order, into f[0..3]. */
INLINE void widen16(int8x16_t q, float32x4_t *f) {
    const int16x8_t a = vmovl_s8(vget_low_s8(q)), b = vmovl_high_s8(q);
    f[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(a)));
    f[1] = vcvtq_f32_s32(vmovl_high_s16(a));
    f[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(b)));
    f[3] = vcvtq_f32_s32(vmovl_high_s16(b));
}

/* Weights 0..31 of group g of the block (a block of 32, or group g of a K-quant super-block
 * whose scales are s) into w[0..7], four a register. */
INLINE void group_weights(const uint8_t *blk, const int type, const int g, const float *s, float32x4_t *w) {
    float32x4_t q[8];
    if (type == T_Q8_0) {
        widen16(vld1q_s8((const int8_t *)blk + 2), q);
        widen16(vld1q_s8((const int8_t *)blk + 18), q + 4);
        const float32x4_t d = vdupq_n_f32(f16(blk));
        for (int i = 0; i < 8; i++) w[i] = vmulq_f32(q[i], d);
        return;
    }
    const uint8x16_t nibble = vdupq_n_u8(0x0F);
    if (type == T_Q4_0 || type == T_Q4_1) { /* low nibbles are weights 0..15, high ones 16..31 */
        const uint8x16_t qs = vld1q_u8(blk + (type == T_Q4_1 ? 4 : 2));
        uint8x16_t lo = vandq_u8(qs, nibble), hi = vshrq_n_u8(qs, 4);
        if (type == T_Q4_0) { /* q - 8 as a signed byte */
            lo = vsubq_u8(lo, vdupq_n_u8(8));
            hi = vsubq_u8(hi, vdupq_n_u8(8));
        }
        widen16(vreinterpretq_s8_u8(lo), q);
        widen16(vreinterpretq_s8_u8(hi), q + 4);
        const float32x4_t d = vdupq_n_f32(f16(blk));
        if (type == T_Q4_0) {
            for (int i = 0; i < 8; i++) w[i] = vmulq_f32(d, q[i]);
        } else {
            const float32x4_t m = vdupq_n_f32(f16(blk + 2));
            for (int i = 0; i < 8; i++) w[i] = vfmaq_f32(m, d, q[i]);
        }
        return;
    }
    if (type == T_Q4_K) { /* sub-block g: nibble g % 2 of bytes 32 * (g / 2).. */
        const uint8_t *qs = blk + 16 + 32 * (g >> 1);
        for (int e = 0; e < 2; e++) {
            const uint8x16_t bytes = vld1q_u8(qs + 16 * e);
            const uint8x16_t v = g & 1 ? vshrq_n_u8(bytes, 4) : vandq_u8(bytes, nibble);
            widen16(vreinterpretq_s8_u8(v), q + 4 * e);
        }
        const float32x4_t d = vdupq_n_f32(s[g]), m = vdupq_n_f32(s[8 + g]);
        for (int i = 0; i < 8; i++) w[i] = vfmaq_f32(m, d, q[i]);
        return;
    }
    /* Q6_K: group g = 4 * half + quarter: nibble quarter / 2 of ql, bits 2 * quarter of qh, less 32 */
    const int half = g >> 2, quarter = g & 3;
    const uint8_t *ql = blk + 64 * half + 32 * (quarter & 1), *qh = blk + 128 + 32 * half;
    const int8x16_t lo_shift = vdupq_n_s8((int8_t)(-4 * (quarter >> 1))), hi_shift = vdupq_n_s8((int8_t)(-2 * quarter));
    for (int e = 0; e < 2; e++) {
        const uint8x16_t l = vandq_u8(vshlq_u8(vld1q_u8(ql + 16 * e), lo_shift), nibble);
        const uint8x16_t h = vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(qh + 16 * e), hi_shift), vdupq_n_u8(3)), 4);
        widen16(vreinterpretq_s8_u8(vsubq_u8(vorrq_u8(l, h), vdupq_n_u8(32))), q + 4 * e);
    }
    const float32x4_t d0 = vdupq_n_f32(s[2 * g]), d1 = vdupq_n_f32(s[2 * g + 1]);
    for (int i = 0; i < 8; i++) w[i] = vmulq_f32(i < 4 ? d0 : d1, q[i]);
}

/* One tile: mt rows of x (interleaved by 8, as quant_linear.c packs them: x[(k / 8 * mt + i) * 8 +
 * k % 8]) against nt weight rows; each output's two registers take their terms 8 at a time in
 * increasing k. ACC_ROWS x ACC_COLS bounds the accumulators (two registers each, of 32). */
#define QTILE_BODY_NEON(NAME, ACC_ROWS, ACC_COLS)                                                             \
    INLINE void NAME(const float *x, const uint8_t *w, int64_t row_bytes, const int type, float *sums,        \
                     int64_t K, const int mt, const int nt, const uint8_t *prefetch) {                        \
        float32x4_t lo[ACC_ROWS][ACC_COLS], hi[ACC_ROWS][ACC_COLS];                                           \
        float kscale[ACC_COLS][16];                                                                           \
        for (int i = 0; i < mt; i++)                                                                          \
            for (int j = 0; j < nt; j++) lo[i][j] = hi[i][j] = vdupq_n_f32(0.0f);                             \
        const int bytes = block_bytes(type), groups = is_k_quant(type) ? 8 : 1;                               \
        for (int64_t b = 0; b < K / 32; b++) {                                                                \
            const int g = (int)(b % groups);                                                                  \
            const uint8_t *blocks = w + b / groups * bytes;                                                   \
            if (groups > 1 && g == 0)                                                                         \
                for (int j = 0; j < nt; j++) k_scales(blocks + j * row_bytes, type, kscale[j]);               \
            const float *xb = x + 32 * mt * b;                                                                \
            _Pragma("GCC unroll 8") /* fully: the accumulators must stay in registers */                      \
            for (int j = 0; j < nt; j++) {                                                                    \
                __builtin_prefetch(prefetch + (b * nt + j) * 64);                                             \
                float32x4_t wq[8];                                                                            \
                group_weights(blocks + j * row_bytes, type, g, kscale[j], wq);                                \
                _Pragma("GCC unroll 4")                                                                       \
                for (int c = 0; c < 4; c++)                                                                   \
                    for (int i = 0; i < mt; i++) {                                                            \
                        const float *xc = xb + (c * mt + i) * 8;                                              \
                        lo[i][j] = vfmaq_f32(lo[i][j], vld1q_f32(xc), wq[2 * c]);                             \
                        hi[i][j] = vfmaq_f32(hi[i][j], vld1q_f32(xc + 4), wq[2 * c + 1]);                     \
                    }                                                                                         \
            }                                                                                                 \
        }                                                                                                     \
        for (int i = 0; i < mt; i++)                                                                          \
            for (int j = 0; j < nt; j++) sums[i * QW + j] = hsum8_neon(lo[i][j], hi[i][j]);                   \
    }

QTILE_BODY_NEON(qtile_narrow, 2, QW)        /* one or two rows */
QTILE_BODY_NEON(qtile_wide, FUSED_ROWS, 2)  /* three or four */

/* Constant type, row count and (for full tiles) width, so each case keeps its accumulators in
 * registers (quant_tiles_body.h's QTILE_DISPATCH, for this twin). At most FUSED_ROWS rows: on
 * aarch64 bp_fused_rows (quant_tiles_pick.c) is FUSED_ROWS, as BP_PICK's portable choice. */
#define QTILE_FN_NEON(NAME, TYPE)                                                                            \
    static void NAME(const float *x, const uint8_t *w, int64_t row_bytes, float *sums, int64_t K, int mt,    \
                     int nt, const uint8_t *prefetch) {                                                      \
        if (mt == 1 && nt == QW) qtile_narrow(x, w, row_bytes, TYPE, sums, K, 1, QW, prefetch);              \
        else if (mt == 2 && nt == fused_width(TYPE, 2))                                                      \
            qtile_narrow(x, w, row_bytes, TYPE, sums, K, 2, fused_width(TYPE, 2), prefetch);                  \
        else if (mt <= 2) qtile_narrow(x, w, row_bytes, TYPE, sums, K, mt, nt, prefetch);                    \
        else if (mt == 3 && nt == 2) qtile_wide(x, w, row_bytes, TYPE, sums, K, 3, 2, prefetch);             \
        else if (mt == 4 && nt == 2) qtile_wide(x, w, row_bytes, TYPE, sums, K, 4, 2, prefetch);             \
        else qtile_wide(x, w, row_bytes, TYPE, sums, K, mt, nt, prefetch);                                   \
    }
QTILE_FN_NEON(q4_0_neon, T_Q4_0)
QTILE_FN_NEON(q4_1_neon, T_Q4_1)
QTILE_FN_NEON(q8_0_neon, T_Q8_0)
QTILE_FN_NEON(q4_k_neon, T_Q4_K)
QTILE_FN_NEON(q6_k_neon, T_Q6_K)

qtile_fn bp_qtile_neon(int type) {
    switch (type) {
    case T_Q4_0: return q4_0_neon;
    case T_Q4_1: return q4_1_neon;
    case T_Q8_0: return q8_0_neon;
    case T_Q4_K: return q4_k_neon;
    case T_Q6_K: return q6_k_neon;
    default: return NULL; /* Q5_0, Q5_1, Q5_K, F16, BF16, F32: the buffer */
    }
}
#endif
