/* GGUF blocks -> float32 weights, one function per block type and one table of the types
 * per instruction set (quant.h's block sizes): the embedding lookup, and the tiles of weights
 * that quant_linear.c multiplies.
 *
 * Exactness: each block is dequantized with the very float operations gguf.quants uses
 * (d * q, d * q + m, (d * sc) * q - dmin * m, ...; one rounding each, never fused: this
 * file is built with -ffp-contract=off), so every weight is the same float32 that the
 * float32 path holds, whichever path (AVX2 or portable) unpacked it.
 */
#include <stdint.h>
#include <string.h>

#include "quant.h"

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j from the 12 packed bytes. */
static inline void scale_min_k4(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* 32 unpacked quants of a Q4_x / Q5_x block -> weights: d * q + m with a min (Q4_1, Q5_1),
 * else d * (q - zero) (Q4_0: zero 8, Q5_0: 16), as gguf.quants computes them. */
static inline void scale_block32(const uint8_t *restrict q, float d, float m, int has_min, int zero,
                                 float *restrict dst) {
    if (has_min)
        for (int j = 0; j < 32; j++) dst[j] = d * (float)q[j] + m;
    else
        for (int j = 0; j < 32; j++) dst[j] = d * (float)((int)q[j] - zero);
}

/* ---------------- one row of K weights -> K floats, one function per type ----------------
 *
 * `restrict` matters: without it a store to dst (float) may alias the quants (bytes may
 * alias anything), and the loops stay scalar. Each is inlined into twins for AVX2 and the
 * baseline (at the tables, below); IEEE multiplies and adds give the same bits in either
 * (nothing is fused: -ffp-contract=off). */
#define ROW static inline __attribute__((always_inline))

ROW void dequant_f32(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    memcpy(dst, src, (size_t)K * 4);
}

ROW void dequant_f16(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    for (int64_t k = 0; k < K; k++) dst[k] = f16(src + 2 * k);
}

ROW void dequant_bf16(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    for (int64_t k = 0; k < K; k++) {
        uint32_t bits = (uint32_t)(src[2 * k] | (src[2 * k + 1] << 8)) << 16;
        memcpy(dst + k, &bits, 4);
    }
}

/* The Q4 and Q5 AVX2 unpackers (quant_dequant_avx2.c) are noclone: one copy for both values of
 * has_min, as when one function served every type (GCC's copies for a constant has_min ran
 * Q5_0 ~5% slower). */
typedef void (*unpack32_fn)(const uint8_t *, int64_t, int, float *);

/* Q4_0 / Q4_1 (has_min): the AVX2 unpacker, or the portable loops. */
static inline void dequant_q4(const uint8_t *restrict src, int64_t K, const int has_min, float *restrict dst) {
    unpack32_fn unpack = BP_PICK(bp_dequant_q4_avx2, bp_dequant_q4_avx2, NULL);
    if (unpack) {
        unpack(src, K / 32, has_min, dst);
        return;
    }
    /* Unpack the nibbles first, then scale 32 at a time: two simple loops vectorize, one
     * mixed loop did not. */
    const int bytes = (int)(has_min ? block_bytes(T_Q4_1) : block_bytes(T_Q4_0));
    for (int64_t b = 0; b < K / 32; b++, src += bytes, dst += 32) {
        const float d = f16(src), m = has_min ? f16(src + 2) : 0.0f;
        const uint8_t *restrict qs = src + (has_min ? 4 : 2);
        uint8_t q[32];
        for (int j = 0; j < 16; j++) {
            q[j] = qs[j] & 0xF;
            q[j + 16] = qs[j] >> 4;
        }
        scale_block32(q, d, m, has_min, 8, dst);
    }
}

ROW void dequant_q4_0(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    dequant_q4(src, K, 0, dst);
}
ROW void dequant_q4_1(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    dequant_q4(src, K, 1, dst);
}

/* Q5_0 / Q5_1 (has_min): the AVX2 unpacker, or the portable loops. */
static inline void dequant_q5(const uint8_t *restrict src, int64_t K, const int has_min, float *restrict dst) {
    unpack32_fn unpack = BP_PICK(bp_dequant_q5_avx2, bp_dequant_q5_avx2, NULL);
    if (unpack) {
        unpack(src, K / 32, has_min, dst);
        return;
    }
    const int bytes = (int)(has_min ? block_bytes(T_Q5_1) : block_bytes(T_Q5_0));
    for (int64_t b = 0; b < K / 32; b++, src += bytes, dst += 32) {
        const float d = f16(src), m = has_min ? f16(src + 2) : 0.0f;
        const uint32_t qh = u32le(src + (has_min ? 4 : 2));
        const uint8_t *restrict qs = src + (has_min ? 8 : 6);
        uint8_t q[32];
        for (int j = 0; j < 16; j++) {
            q[j] = (uint8_t)((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
            q[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
        scale_block32(q, d, m, has_min, 16, dst);
    }
}

ROW void dequant_q5_0(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    dequant_q5(src, K, 0, dst);
}
ROW void dequant_q5_1(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    dequant_q5(src, K, 1, dst);
}

ROW void dequant_q8_0(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    void (*unpack)(const uint8_t *, int64_t, float *) = BP_PICK(bp_dequant_q8_avx2, bp_dequant_q8_avx2, NULL);
    if (unpack) {
        unpack(src, K / 32, dst);
        return;
    }
    for (int64_t b = 0; b < K / 32; b++, src += block_bytes(T_Q8_0), dst += 32) {
        const float d = f16(src);
        const int8_t *restrict qs = (const int8_t *)(src + 2);
        for (int j = 0; j < 32; j++) dst[j] = (float)qs[j] * d;
    }
}

/* Q4_K / Q5_K (five): 8 sub-blocks of 32, each with its 6-bit scale and min. */
static inline void dequant_k4(const uint8_t *restrict src, int64_t K, const int five, float *restrict dst) {
    const int64_t bytes = five ? block_bytes(T_Q5_K) : block_bytes(T_Q4_K);
    for (int64_t b = 0; b < K / 256; b++, src += bytes, dst += 256) {
        const float d = f16(src), dmin = f16(src + 2);
        const uint8_t *scales = src + 4, *restrict qh = src + 16, *restrict qs = src + (five ? 48 : 16);
        for (int s = 0; s < 8; s++) { /* sub-block s: nibble s % 2 of bytes 32 * (s / 2).. */
            uint8_t sc, m;
            scale_min_k4(s, scales, &sc, &m);
            const float ds = d * (float)sc, dm = dmin * (float)m;
            const uint8_t *restrict q = qs + 32 * (s / 2);
            const int shift = 4 * (s & 1);
            float *restrict out = dst + 32 * s;
            for (int j = 0; j < 32; j++) {
                int v = (q[j] >> shift) & 0xF;
                if (five) v |= ((qh[j] >> s) & 1) << 4;
                out[j] = ds * (float)v - dm;
            }
        }
    }
}

ROW void dequant_q4_k(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    dequant_k4(src, K, 0, dst);
}
ROW void dequant_q5_k(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    dequant_k4(src, K, 1, dst);
}

ROW void dequant_q6_k(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    for (int64_t b = 0; b < K / 256; b++, src += block_bytes(T_Q6_K), dst += 256) {
        const uint8_t *restrict ql = src, *restrict qh = src + 128;
        const int8_t *scales = (const int8_t *)(src + 192);
        const float d = f16(src + 208);
        for (int half = 0; half < 2; half++)
            for (int quarter = 0; quarter < 4; quarter++) { /* 32 weights: nibble quarter / 2, bits quarter */
                float *restrict out = dst + 128 * half + 32 * quarter;
                const uint8_t *restrict lo = ql + 64 * half + 32 * (quarter & 1);
                const uint8_t *restrict hi = qh + 32 * half;
                const int lo_shift = 4 * (quarter >> 1), hi_shift = 2 * quarter;
                for (int sixteen = 0; sixteen < 2; sixteen++) { /* one scale per 16 weights */
                    const float ds = d * (float)scales[(128 * half + 32 * quarter) / 16 + sixteen];
                    for (int j = 16 * sixteen; j < 16 * sixteen + 16; j++) {
                        int q = ((lo[j] >> lo_shift) & 0xF) | (((hi[j] >> hi_shift) & 3) << 4);
                        out[j] = ds * (float)(q - 32);
                    }
                }
            }
    }
}

/* ---------------- the table of block types, one per instruction set ---------------- */

/* Each type's row function as twins, each inlining the one body above: built for the baseline
 * and for AVX2 (the plain loops vectorize), each twin with its table; BP_PICK chooses. */
#define PORTABLE_TWIN(id, name, bytes, elems)                                                                \
    static void dequant_##name##_portable(const uint8_t *restrict src, int64_t K, float *restrict dst) { \
        dequant_##name(src, K, dst);                                                                         \
    }
BLOCK_SIZES(PORTABLE_TWIN)
#define PORTABLE_ENTRY(id, name, bytes, elems) [id] = {bytes, elems, dequant_##name##_portable},
static const block_type BLOCK_TYPES_PORTABLE[] = {BLOCK_SIZES(PORTABLE_ENTRY)};

#ifdef BP_X86
#define AVX2_TWIN(id, name, bytes, elems)                                                                    \
    __attribute__((target("avx2"))) static void dequant_##name##_avx2(const uint8_t *restrict src, int64_t K, \
                                                                      float *restrict dst) {                 \
        dequant_##name(src, K, dst);                                                                         \
    }
BLOCK_SIZES(AVX2_TWIN)
#define AVX2_ENTRY(id, name, bytes, elems) [id] = {bytes, elems, dequant_##name##_avx2},
static const block_type BLOCK_TYPES_AVX2[] = {BLOCK_SIZES(AVX2_ENTRY)};
#endif

/* The type's entry on the instruction set in use: indexed by GGML type id; a type we do not
 * run has no dequant. */
const block_type *bp_block_type(int type) {
    const block_type *types = BP_PICK(BLOCK_TYPES_AVX2, BLOCK_TYPES_AVX2, BLOCK_TYPES_PORTABLE);
    const int num_types = (int)(sizeof BLOCK_TYPES_PORTABLE / sizeof *BLOCK_TYPES_PORTABLE);
    if (type < 0 || type >= num_types || !types[type].dequant) return NULL;
    return &types[type];
}

int64_t bp_block_bytes(int type) {
    const block_type *t = bp_block_type(type);
    return t ? t->block_bytes : 0; /* 0: not a type we run */
}

int64_t bp_block_elems(int type) {
    const block_type *t = bp_block_type(type);
    return t ? t->block_elems : 0;
}

/* Rows ids[0..n) of a [rows, K] weight -> out [n, K] (the embedding lookup). */
void bp_dequant_rows(const uint8_t *w, int type, int64_t row_bytes, int64_t K, const int64_t *ids, int64_t n,
                     float *out) {
    const block_type *t = bp_block_type(type);
    if (!t) return;
    for (int64_t i = 0; i < n; i++) t->dequant(w + ids[i] * row_bytes, K, out + i * K);
}
