/* Matmuls on weights kept in their GGUF block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q4_K, Q5_K, Q6_K, F16, BF16, F32): the file's bytes stay in memory (memory-mapped),
 * never expanded to float32.
 *
 * Exactness: each block is dequantized with the very float operations gguf.quants uses
 * (d * q, d * q + m, (d * sc) * q - dmin * m, ...; one rounding each, never fused: this
 * file is built with -ffp-contract=off), so every weight is the same float32 that the
 * float32 path holds. Those weights then go through the float32 kernel's own tile
 * (kernels.c), which adds each output's terms in one fixed order. A quantized matmul
 * therefore gives bitwise the float32 path's result, at any row count.
 *
 * Speed: a thread dequantizes NT weight rows into a small buffer that stays in L1/L2 and
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

/* One row of K weights -> K floats, each computed as gguf.quants computes it. */
static void dequant_row(const uint8_t *src, int type, int64_t K, float *dst) {
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
        for (int64_t b = 0; b < K / 32; b++, src += 18, dst += 32) {
            float d = f16(src);
            const uint8_t *qs = src + 2;
            for (int j = 0; j < 16; j++) {
                dst[j] = d * (float)((int)(qs[j] & 0xF) - 8);
                dst[j + 16] = d * (float)((int)(qs[j] >> 4) - 8);
            }
        }
        return;
    case T_Q4_1:
        for (int64_t b = 0; b < K / 32; b++, src += 20, dst += 32) {
            float d = f16(src), m = f16(src + 2);
            const uint8_t *qs = src + 4;
            for (int j = 0; j < 16; j++) {
                dst[j] = d * (float)(qs[j] & 0xF) + m;
                dst[j + 16] = d * (float)(qs[j] >> 4) + m;
            }
        }
        return;
    case T_Q5_0:
        for (int64_t b = 0; b < K / 32; b++, src += 22, dst += 32) {
            float d = f16(src);
            uint32_t qh = u32le(src + 2);
            const uint8_t *qs = src + 6;
            for (int j = 0; j < 16; j++) {
                int lo = (qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
                int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
                dst[j] = d * (float)(lo - 16);
                dst[j + 16] = d * (float)(hi - 16);
            }
        }
        return;
    case T_Q5_1:
        for (int64_t b = 0; b < K / 32; b++, src += 24, dst += 32) {
            float d = f16(src), m = f16(src + 2);
            uint32_t qh = u32le(src + 4);
            const uint8_t *qs = src + 8;
            for (int j = 0; j < 16; j++) {
                int lo = (qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
                int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
                dst[j] = d * (float)lo + m;
                dst[j + 16] = d * (float)hi + m;
            }
        }
        return;
    case T_Q8_0:
        for (int64_t b = 0; b < K / 32; b++, src += 34, dst += 32) {
            float d = f16(src);
            const int8_t *qs = (const int8_t *)(src + 2);
            for (int j = 0; j < 32; j++) dst[j] = (float)qs[j] * d;
        }
        return;
    case T_Q4_K:
    case T_Q5_K: {
        int five = type == T_Q5_K;
        int64_t bytes = five ? 176 : 144;
        for (int64_t b = 0; b < K / 256; b++, src += bytes, dst += 256) {
            float d = f16(src), dmin = f16(src + 2);
            const uint8_t *scales = src + 4, *qh = src + 16, *qs = src + (five ? 48 : 16);
            for (int s = 0; s < 8; s++) { /* sub-block s: nibble s % 2 of bytes 32 * (s / 2).. */
                uint8_t sc, m;
                scale_min_k4(s, scales, &sc, &m);
                float ds = d * (float)sc, dm = dmin * (float)m;
                const uint8_t *q = qs + 32 * (s / 2);
                for (int j = 0; j < 32; j++) {
                    int v = (s & 1) ? q[j] >> 4 : q[j] & 0xF;
                    if (five) v |= ((qh[j] >> s) & 1) << 4;
                    dst[32 * s + j] = ds * (float)v - dm;
                }
            }
        }
        return;
    }
    case T_Q6_K:
        for (int64_t b = 0; b < K / 256; b++, src += 210, dst += 256) {
            const uint8_t *ql = src, *qh = src + 128;
            const int8_t *scales = (const int8_t *)(src + 192);
            float d = f16(src + 208);
            for (int e = 0; e < 256; e++) {
                int half = e / 128, within = e % 128;
                int lo = (ql[half * 64 + within % 64] >> (4 * (within / 64))) & 0xF;
                int hi = (qh[half * 32 + within % 32] >> (2 * (within / 32))) & 3;
                dst[e] = (d * (float)scales[e / 16]) * (float)((lo | (hi << 4)) - 32);
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
    tile_fn tile = bp_pick_tile();
    int64_t num_tiles = (N + NT - 1) / NT;
#pragma omp parallel num_threads(num_threads)
    {
        float *buf = aligned_alloc(64, (size_t)((NT * K * 4 + 63) / 64 * 64));
        float sums[MT * NT];
        /* Threads split outputs, never K: each output is summed by exactly one thread. */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < num_tiles; t++) {
            int64_t n = t * NT;
            int nt = (int)(N - n < NT ? N - n : NT);
            if (t + 1 < num_tiles) /* the next tile's bytes, on their way to L2 meanwhile */
                for (int64_t off = 0; off < NT * row_bytes && (n + NT) * row_bytes + off < N * row_bytes; off += 64)
                    __builtin_prefetch(w + (n + NT) * row_bytes + off, 0, 2);
            for (int j = 0; j < nt; j++) dequant_row(w + (n + j) * row_bytes, type, K, buf + j * K);
            for (int64_t m = 0; m < M; m += MT) {
                int mt = (int)(M - m < MT ? M - m : MT);
                tile(x + m * K, buf, sums, K, NT, mt, nt, buf);
                bp_store_tile(sums, b, y, m, n, mt, nt, ldy, accumulate);
            }
        }
        free(buf);
    }
}
