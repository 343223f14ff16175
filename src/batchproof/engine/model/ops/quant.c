/* Matmuls on weights kept in their GGUF block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q4_K, Q5_K, Q6_K, F16, BF16, F32): the file's bytes stay in memory (memory-mapped),
 * never expanded to float32.
 *
 * Exactness: each block is dequantized with the very float operations gguf.quants uses
 * (d * q, d * q + m, (d * sc) * q - dmin * m, ...; one rounding each, never fused: this
 * file is built with -ffp-contract=off), so every weight is the same float32 that the
 * float32 path holds. Those weights then go through the float32 kernel's own tile
 * (kernels.c), which adds each output's terms in one fixed order. A quantized matmul
 * therefore gives bitwise the float32 path's result, at any row count, and on any host:
 * a dequantized weight is the same float whichever path (AVX2 or portable) unpacked it.
 *
 * Speed: a thread dequantizes a tile of weight rows into a small buffer that stays in L1/L2 and
 * runs every row tile of x against it, so a decode step reads each quantized byte once
 * (98 MB a step for the default model instead of 540) and a prefill dequantizes each
 * weight once for all the prompt's rows.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

/* GGML type ids, as GGUF stores them. */
enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30,
};

/* IEEE half -> float, exact for every value (subnormals, infinities, NaN). */
static inline float f16(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else { /* subnormal half: normalise */
        exp = 113;
        while (!(mant & 0x400)) { mant <<= 1; exp--; }
        bits = sign | (exp << 23) | ((mant & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint32_t u32le(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

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

/* The bytes of one block, and how many weights it holds. */
int64_t bp_block_bytes(int type) {
    switch (type) {
    case T_F32: return 4;
    case T_F16: case T_BF16: return 2;
    case T_Q4_0: return 18;
    case T_Q4_1: return 20;
    case T_Q5_0: return 22;
    case T_Q5_1: return 24;
    case T_Q8_0: return 34;
    case T_Q4_K: return 144;
    case T_Q5_K: return 176;
    case T_Q6_K: return 210;
    }
    return 0; /* not a type we run */
}

int64_t bp_block_elems(int type) {
    switch (type) {
    case T_F32: case T_F16: case T_BF16: return 1;
    case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q5_1: case T_Q8_0: return 32;
    case T_Q4_K: case T_Q5_K: case T_Q6_K: return 256;
    }
    return 0;
}

#if defined(__x86_64__) || defined(_M_X64)
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

/* Q4_0 / Q4_1 with AVX2: the same operations as the scalar loop below (the nibble, less 8
 * for Q4_0, converted, times d, plus m for Q4_1), eight at a time. */
__attribute__((target("avx2,f16c")))
static void dequant_q4_avx2(const uint8_t *src, int64_t num_blocks, int has_min, float *dst) {
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

/* Q5_0 / Q5_1 with AVX2: the nibble with its fifth bit from qh, less 16 for Q5_0, converted,
 * times d, plus m for Q5_1: the scalar loop's operations, eight at a time (the Q5 matmuls of
 * Gemma's layers spent most of their time unpacking bits one by one). */
__attribute__((target("avx2,f16c")))
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

/* ---- up to four rows of x: blocks dequantized in registers, straight into the FMAs ----
 *
 * A decode step of a few sequences multiplies a few rows, so dequantizing a tile into a buffer and
 * reading it back (the path below) costs a store and a load per weight besides the
 * unpacking, for one to four FMAs. Here each block's 32 weights are unpacked into four
 * registers and used at once. The weights are the same floats: d * q is exact in float32
 * (an f16 scale has 11 significant bits, q at most 8), so fma(d, q, m) rounds d * q + m
 * once, as d * q + m does; and each output's accumulator still takes its terms 8 at a
 * time in increasing k, then the tree of sum8: the float tile's sum, bit for bit.
 *
 * An f16 scale comes from a table built with f16() (so a NaN keeps its payload), which
 * costs two loads where the conversion cost a dozen instructions per block. */
static float f16_table[65536];

__attribute__((constructor)) static void fill_f16_table(void) {
    for (uint32_t h = 0; h < 65536; h++) {
        const uint8_t bytes[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
        f16_table[h] = f16(bytes);
    }
}

static inline const float *f16_at(const uint8_t *p) { return f16_table + (p[0] | (p[1] << 8)); }

#define PREFETCH_TILES 1
/* Outputs per tile by rows of x (at most FUSED_ROWS): with one row, 8 accumulators hide the
 * FMA latency; with more, rows x outputs accumulators must leave registers for the
 * unpacking (4 x 3 spilled some, and ran ~5% slower than 4 x 2). Past 4 rows, unpacking a tile
 * once into a buffer for all of them is faster (16 rows: 3.3 against 4.1 ms a row for the
 * default model's matmuls). */
#define QW 8
#define FUSED_ROWS 4
static inline int fused_width(int64_t M) { return M == 1 ? QW : M == 2 ? QW / 2 : 2; }

/* Weights 8c..8c+7 of a Q4_0 / Q4_1 / Q8_0 block as floats (d, m: its scales, broadcast). */
static inline __attribute__((always_inline, target("avx2,fma")))
__m256 block_chunk(const uint8_t *blk, const int type, const int c, __m256 d, __m256 m) {
    if (type == T_Q8_0)
        return _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * c)))), d);
    /* bytes 0..7 (c = 0, 2) or 8..15 (c = 1, 3); low nibbles are weights 0..15, high ones 16..31 */
    const uint8_t *qs = blk + (type == T_Q4_1 ? 4 : 2);
    __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * (c & 1))));
    q = c < 2 ? _mm256_and_si256(q, _mm256_set1_epi32(0x0F)) : _mm256_srli_epi32(q, 4);
    return type == T_Q4_1 ? _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), m)
                          : _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(8))));
}

/* One tile: mt rows of x against nt weight rows, each output's accumulator taking its terms
 * 8 at a time in increasing k. x is `mt` rows interleaved by 8 (x[(k / 8 * mt + i) * 8 +
 * k % 8]; one row is just the row), so one pointer reaches every row; ACC_ROWS x ACC_COLS
 * bounds the accumulators, sized to each caller (a bigger array kept them in memory). */
#define QTILE_BODY(NAME, ACC_ROWS, ACC_COLS)                                                                 \
    static inline __attribute__((always_inline, target("avx2,fma"))) void NAME(                              \
        const float *x, const uint8_t *w, int64_t row_bytes, const int type, float *sums, int64_t K,         \
        const int mt, const int nt, const uint8_t *prefetch) {                                               \
        __m256 acc[ACC_ROWS][ACC_COLS];                                                                      \
        for (int i = 0; i < mt; i++)                                                                         \
            for (int j = 0; j < nt; j++) acc[i][j] = _mm256_setzero_ps();                                    \
        const int bytes = type == T_Q4_1 ? 20 : type == T_Q4_0 ? 18 : 34;                                    \
        for (int64_t b = 0; b < K / 32; b++) {                                                               \
            const float *xb = x + 32 * mt * b;                                                               \
            _Pragma("GCC unroll 8") /* fully: the accumulators must stay in registers */                     \
            for (int j = 0; j < nt; j++) {                                                                   \
                const uint8_t *blk = w + j * row_bytes + b * bytes;                                          \
                /* The tile after next, a line per block and row: this tile's rows are read side by      \
                 * side, which the hardware prefetcher follows badly (a prefetch never faults). */        \
                _mm_prefetch((const char *)(prefetch + (b * nt + j) * 64), _MM_HINT_T0);                     \
                const __m256 d = _mm256_broadcast_ss(f16_at(blk));                                           \
                const __m256 m = type == T_Q4_1 ? _mm256_broadcast_ss(f16_at(blk + 2)) : d;                  \
                _Pragma("GCC unroll 4")                                                                      \
                for (int c = 0; c < 4; c++) {                                                                \
                    const __m256 wc = block_chunk(blk, type, c, d, m);                                       \
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
    else if (mt == 2 && nt == QW / 2) qtile_narrow(x, w, row_bytes, TYPE, sums, K, 2, QW / 2, prefetch); \
    else if (mt <= 2) qtile_narrow(x, w, row_bytes, TYPE, sums, K, mt, nt, prefetch);              \
    else if (mt == 3 && nt == 2) qtile_wide(x, w, row_bytes, TYPE, sums, K, 3, 2, prefetch);       \
    else if (mt == 4 && nt == 2) qtile_wide(x, w, row_bytes, TYPE, sums, K, 4, 2, prefetch);       \
    else qtile_wide(x, w, row_bytes, TYPE, sums, K, mt, nt, prefetch)

#define QTILE_FN(NAME, TARGET)                                                                              \
    __attribute__((target(TARGET))) static void NAME(const float *x, const uint8_t *w, int64_t row_bytes, \
                                                     int type, float *sums, int64_t K, int mt, int nt,     \
                                                     const uint8_t *prefetch) {                            \
        switch (type) {                                                                                     \
        case T_Q4_0: QTILE_DISPATCH(T_Q4_0); return;                                                        \
        case T_Q4_1: QTILE_DISPATCH(T_Q4_1); return;                                                        \
        default: QTILE_DISPATCH(T_Q8_0); return;                                                            \
        }                                                                                                   \
    }

QTILE_FN(qtile_avx2, "avx2,fma")
/* AVX-512 hosts run the same 8-lane code, with 32 registers. */
QTILE_FN(qtile_avx512, "avx2,fma,avx512f,avx512vl")

/* y[:, 0:N] (+)= x @ w^T (+ b) for M <= FUSED_ROWS rows and a Q4_0 / Q4_1 / Q8_0 weight. */
static void linear_q_fused(const float *x, const uint8_t *w, int type, int64_t row_bytes, const float *b, float *y,
                           int64_t ldy, int64_t M, int64_t N, int64_t K, int accumulate, int num_threads) {
    void (*tile)(const float *, const uint8_t *, int64_t, int, float *, int64_t, int, int, const uint8_t *) =
        bp_isa_level() >= 2 ? qtile_avx512 : qtile_avx2;
    const int width = fused_width(M);
    const int64_t num_tiles = (N + width - 1) / width;
    float *packed = NULL;
    if (M > 1) { /* the rows interleaved by 8 (the tile reads them through one pointer) */
        packed = aligned_alloc(64, (size_t)(M * K * 4 + 63) / 64 * 64);
        for (int64_t k8 = 0; k8 < K / 8; k8++)
            for (int64_t i = 0; i < M; i++) memcpy(packed + (k8 * M + i) * 8, x + i * K + k8 * 8, 32);
        x = packed;
    }
    /* Threads split outputs, never K: each output is summed by exactly one thread. */
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t t = 0; t < num_tiles; t++) {
        const int64_t n = t * width;
        const int nt = (int)(N - n < width ? N - n : width);
        float sums[FUSED_ROWS * QW];
        const int64_t next = n + PREFETCH_TILES * width < N ? n + PREFETCH_TILES * width : n;
        tile(x, w + n * row_bytes, row_bytes, type, sums, K, (int)M, nt, w + next * row_bytes);
        bp_store_tile(sums, QW, b, y, 0, n, (int)M, nt, ldy, accumulate);
    }
    free(packed);
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

/* One row of K weights -> K floats, each computed as gguf.quants computes it.
 *
 * `restrict` matters: without it a store to dst (float) may alias the quants (bytes may
 * alias anything), and the loops stay scalar. Cloned for AVX2 and the baseline; IEEE
 * multiplies and adds give the same bits in either (nothing is fused: -ffp-contract=off). */
__attribute__((target_clones("avx2", "default")))
static void dequant_row(const uint8_t *restrict src, int type, int64_t K, float *restrict dst) {
    switch (type) {
    case T_F32:
        memcpy(dst, src, (size_t)K * 4);
        return;
    case T_F16:
        for (int64_t k = 0; k < K; k++) dst[k] = f16(src + 2 * k);
        return;
    case T_BF16:
        for (int64_t k = 0; k < K; k++) {
            uint32_t bits = (uint32_t)(src[2 * k] | (src[2 * k + 1] << 8)) << 16;
            memcpy(dst + k, &bits, 4);
        }
        return;
    case T_Q4_0:
    case T_Q4_1: {
#if defined(__x86_64__) || defined(_M_X64)
        if (bp_isa_level() >= 1) {
            dequant_q4_avx2(src, K / 32, type == T_Q4_1, dst);
            return;
        }
#endif
        /* Unpack the nibbles first, then scale 32 at a time: two simple loops vectorize, one
         * mixed loop did not. */
        const int has_min = type == T_Q4_1, bytes = has_min ? 20 : 18;
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
        return;
    }
    case T_Q5_0:
    case T_Q5_1: {
#if defined(__x86_64__) || defined(_M_X64)
        if (bp_isa_level() >= 1) {
            dequant_q5_avx2(src, K / 32, type == T_Q5_1, dst);
            return;
        }
#endif
        const int has_min = type == T_Q5_1, bytes = has_min ? 24 : 22;
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
        return;
    }
    case T_Q8_0:
#if defined(__x86_64__) || defined(_M_X64)
        if (bp_isa_level() >= 1) {
            dequant_q8_avx2(src, K / 32, dst);
            return;
        }
#endif
        for (int64_t b = 0; b < K / 32; b++, src += 34, dst += 32) {
            const float d = f16(src);
            const int8_t *restrict qs = (const int8_t *)(src + 2);
            for (int j = 0; j < 32; j++) dst[j] = (float)qs[j] * d;
        }
        return;
    case T_Q4_K:
    case T_Q5_K: {
        const int five = type == T_Q5_K;
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
        return;
    }
    case T_Q6_K:
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
        return;
    }
}

/* Rows ids[0..n) of a [rows, K] weight -> out [n, K] (the embedding lookup). */
void bp_dequant_rows(const uint8_t *w, int type, int64_t row_bytes, int64_t K, const int64_t *ids, int64_t n,
                     float *out) {
    for (int64_t i = 0; i < n; i++) dequant_row(w + ids[i] * row_bytes, type, K, out + i * K);
}

/* y[:, 0:N] = x @ w^T (+ b), or += with accumulate; y's rows are ldy floats apart, so
 * several weights (Q, K and V of different types) can fill one fused output. */
void bp_linear_q(const float *x, const uint8_t *w, int type, int64_t row_bytes, const float *b, float *y,
                 int64_t ldy, int64_t M, int64_t N, int64_t K, int accumulate, int num_threads) {
#if defined(__x86_64__) || defined(_M_X64)
    if (M <= FUSED_ROWS && bp_isa_level() >= 1 && (type == T_Q4_0 || type == T_Q4_1 || type == T_Q8_0)) {
        linear_q_fused(x, w, type, row_bytes, b, y, ldy, M, N, K, accumulate, num_threads);
        return;
    }
#endif
    tile_fn tile = bp_pick_tile();
    const int width = bp_tile_width(M);
    int64_t num_tiles = (N + width - 1) / width;
#pragma omp parallel num_threads(num_threads)
    {
        float *buf = aligned_alloc(64, (size_t)((NT * K * 4 + 63) / 64 * 64));
        float sums[MT * NT];
        /* Threads split outputs, never K: each output is summed by exactly one thread. */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < num_tiles; t++) {
            int64_t n = t * width;
            int nt = (int)(N - n < width ? N - n : width);
            if (t + 1 < num_tiles) /* the next tile's bytes, on their way to L2 meanwhile */
                for (int64_t off = 0; off < width * row_bytes && (n + width) * row_bytes + off < N * row_bytes;
                     off += 64)
                    __builtin_prefetch(w + (n + width) * row_bytes + off, 0, 2);
            for (int j = 0; j < nt; j++) dequant_row(w + (n + j) * row_bytes, type, K, buf + j * K);
            for (int64_t m = 0; m < M; m += MT) {
                int mt = (int)(M - m < MT ? M - m : MT);
                tile(x + m * K, buf, sums, K, NT, mt, nt, buf);
                bp_store_tile(sums, NT, b, y, m, n, mt, nt, ldy, accumulate);
            }
        }
        free(buf);
    }
}
