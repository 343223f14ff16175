/* GGUF blocks -> float32 weights, one function per block type and one table of the types
 * (quant.h): the embedding lookup, and the tiles of weights that quant_linear.c multiplies.
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

#ifdef BP_X86
#include <immintrin.h>

/* f16() with F16C's one instruction: the same float for every half but a NaN, whose payload
 * the instruction may quieten, so a NaN takes f16()'s way. The unpacking loops spent more
 * time converting each block's scales bit by bit than unpacking its 32 weights. */
__attribute__((target("f16c")))
static inline float f16_fast(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) return f16(p);
    return _cvtsh_ss(h);
}
#endif

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
 * alias anything), and the loops stay scalar. Cloned for AVX2 and the baseline; IEEE
 * multiplies and adds give the same bits in either (nothing is fused: -ffp-contract=off). */
#define CLONED __attribute__((target_clones("avx2", "default")))

CLONED static void dequant_f32(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    memcpy(dst, src, (size_t)K * 4);
}

CLONED static void dequant_f16(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    for (int64_t k = 0; k < K; k++) dst[k] = f16(src + 2 * k);
}

CLONED static void dequant_bf16(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    for (int64_t k = 0; k < K; k++) {
        uint32_t bits = (uint32_t)(src[2 * k] | (src[2 * k + 1] << 8)) << 16;
        memcpy(dst + k, &bits, 4);
    }
}

/* The Q4 and Q5 unpackers below are noclone: one copy for both values of has_min, as when
 * one function served every type (GCC's copies for a constant has_min ran Q5_0 ~5% slower). */
typedef void (*unpack32_fn)(const uint8_t *, int64_t, int, float *);

#ifdef BP_X86
/* Q4_0 / Q4_1 with AVX2: the same operations as the scalar loop below (the nibble, less 8
 * for Q4_0, converted, times d, plus m for Q4_1), eight at a time. */
__attribute__((target("avx2,f16c"), noclone))
static void dequant_q4_avx2(const uint8_t *src, int64_t num_blocks, int has_min, float *dst) {
    /* Unpack the nibbles first, then scale 32 at a time: two simple loops vectorize, one
     * mixed loop did not. */
    const int bytes = has_min ? 20 : 18;
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m256i eight = _mm256_set1_epi32(8);
    for (int64_t b = 0; b < num_blocks; b++, src += bytes, dst += 32) {
        const __m256 d = _mm256_set1_ps(f16_fast(src)), m = _mm256_set1_ps(has_min ? f16_fast(src + 2) : 0.0f);
        const __m128i qs = _mm_loadu_si128((const __m128i *)(src + (has_min ? 4 : 2)));
        const __m128i nibbles[2] = {_mm_and_si128(qs, low), _mm_and_si128(_mm_srli_epi16(qs, 4), low)};
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 2; e++) {
                __m256i q = _mm256_cvtepu8_epi32(e ? _mm_srli_si128(nibbles[h], 8) : nibbles[h]);
                __m256 w;
                if (has_min) {
                    w = _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(q)), m);
                } else {
                    w = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, eight)));
                }
                _mm256_storeu_ps(dst + 16 * h + 8 * e, w);
            }
    }
}
#endif

/* Q4_0 / Q4_1 (has_min): the AVX2 unpacker, or the portable loops. */
static inline void dequant_q4(const uint8_t *restrict src, int64_t K, const int has_min, float *restrict dst) {
    unpack32_fn unpack = BP_PICK(dequant_q4_avx2, dequant_q4_avx2, NULL);
    if (unpack) {
        unpack(src, K / 32, has_min, dst);
        return;
    }
    /* Unpack the nibbles first, then scale 32 at a time: two simple loops vectorize, one
     * mixed loop did not. */
    const int bytes = has_min ? 20 : 18;
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

CLONED static void dequant_q4_0(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    dequant_q4(src, K, 0, dst);
}
CLONED static void dequant_q4_1(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    dequant_q4(src, K, 1, dst);
}

#ifdef BP_X86
/* Q5_0 / Q5_1 with AVX2: the nibble with its fifth bit from qh, less 16 for Q5_0, converted,
 * times d, plus m for Q5_1: the scalar loop's operations, eight at a time (the Q5 matmuls of
 * Gemma's layers spent most of their time unpacking bits one by one). */
__attribute__((target("avx2,f16c"), noclone))
static void dequant_q5_avx2(const uint8_t *src, int64_t num_blocks, int has_min, float *dst) {
    const int bytes = has_min ? 24 : 22;
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m256i one = _mm256_set1_epi32(1), sixteen = _mm256_set1_epi32(16);
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t b = 0; b < num_blocks; b++, src += bytes, dst += 32) {
        const __m256 d = _mm256_set1_ps(f16_fast(src)), m = _mm256_set1_ps(has_min ? f16_fast(src + 2) : 0.0f);
        const __m256i qh = _mm256_set1_epi32((int)u32le(src + (has_min ? 4 : 2)));
        const __m128i qs = _mm_loadu_si128((const __m128i *)(src + (has_min ? 8 : 6)));
        const __m128i nibbles[2] = {_mm_and_si128(qs, low), _mm_and_si128(_mm_srli_epi16(qs, 4), low)};
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 2; e++) {
                const int first = 16 * h + 8 * e; /* the element index, and its bit in qh */
                __m256i q = _mm256_cvtepu8_epi32(e ? _mm_srli_si128(nibbles[h], 8) : nibbles[h]);
                __m256i bit = _mm256_and_si256(_mm256_srlv_epi32(qh, _mm256_add_epi32(lanes, _mm256_set1_epi32(first))),
                                               one);
                q = _mm256_or_si256(q, _mm256_slli_epi32(bit, 4));
                __m256 w;
                if (has_min) {
                    w = _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(q)), m);
                } else {
                    w = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, sixteen)));
                }
                _mm256_storeu_ps(dst + first, w);
            }
    }
}
#endif

/* Q5_0 / Q5_1 (has_min): the AVX2 unpacker, or the portable loops. */
static inline void dequant_q5(const uint8_t *restrict src, int64_t K, const int has_min, float *restrict dst) {
    unpack32_fn unpack = BP_PICK(dequant_q5_avx2, dequant_q5_avx2, NULL);
    if (unpack) {
        unpack(src, K / 32, has_min, dst);
        return;
    }
    const int bytes = has_min ? 24 : 22;
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

CLONED static void dequant_q5_0(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    dequant_q5(src, K, 0, dst);
}
CLONED static void dequant_q5_1(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    dequant_q5(src, K, 1, dst);
}

#ifdef BP_X86
/* Q8_0 with AVX2: each signed byte converted, times d, as the scalar loop, eight at a time. */
__attribute__((target("avx2,f16c")))
static void dequant_q8_avx2(const uint8_t *src, int64_t num_blocks, float *dst) {
    for (int64_t b = 0; b < num_blocks; b++, src += 34, dst += 32) {
        const __m256 d = _mm256_set1_ps(f16_fast(src));
        for (int e = 0; e < 4; e++) {
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(src + 2 + 8 * e)));
            _mm256_storeu_ps(dst + 8 * e, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
    }
}
#endif

CLONED static void dequant_q8_0(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    void (*unpack)(const uint8_t *, int64_t, float *) = BP_PICK(dequant_q8_avx2, dequant_q8_avx2, NULL);
    if (unpack) {
        unpack(src, K / 32, dst);
        return;
    }
    for (int64_t b = 0; b < K / 32; b++, src += 34, dst += 32) {
        const float d = f16(src);
        const int8_t *restrict qs = (const int8_t *)(src + 2);
        for (int j = 0; j < 32; j++) dst[j] = (float)qs[j] * d;
    }
}

/* Q4_K / Q5_K (five): 8 sub-blocks of 32, each with its 6-bit scale and min. */
static inline void dequant_k4(const uint8_t *restrict src, int64_t K, const int five, float *restrict dst) {
    const int64_t bytes = five ? 176 : 144;
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

CLONED static void dequant_q4_k(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    dequant_k4(src, K, 0, dst);
}
CLONED static void dequant_q5_k(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    dequant_k4(src, K, 1, dst);
}

CLONED static void dequant_q6_k(const uint8_t *restrict src, int64_t K, float *restrict dst) {
    for (int64_t b = 0; b < K / 256; b++, src += 210, dst += 256) {
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

/* ---------------- the table of block types ---------------- */

/* Indexed by GGML type id; a type we do not run has no dequant. */
static const block_type BLOCK_TYPES[] = {
    [T_F32] = {4, 1, dequant_f32},       [T_F16] = {2, 1, dequant_f16},       [T_BF16] = {2, 1, dequant_bf16},
    [T_Q4_0] = {18, 32, dequant_q4_0},   [T_Q4_1] = {20, 32, dequant_q4_1},   [T_Q5_0] = {22, 32, dequant_q5_0},
    [T_Q5_1] = {24, 32, dequant_q5_1},   [T_Q8_0] = {34, 32, dequant_q8_0},   [T_Q4_K] = {144, 256, dequant_q4_k},
    [T_Q5_K] = {176, 256, dequant_q5_k}, [T_Q6_K] = {210, 256, dequant_q6_k},
};

const block_type *bp_block_type(int type) {
    if (type < 0 || type >= (int)(sizeof BLOCK_TYPES / sizeof *BLOCK_TYPES) || !BLOCK_TYPES[type].dequant) return NULL;
    return &BLOCK_TYPES[type];
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
