/* The int8 numerics' matmul (--numerics int8): each row of x quantized to int8 per block of 32
 * on its own, integer block dots against the weight's own quants, one fixed float order across
 * blocks (quant_int8.h defines it); and its portable twin, the definition spelled out in C.
 *
 * Why: the float32 path unpacks every weight to a float and multiplies it with float32
 * activations, about four instructions per weight before the FMA. Integer products of int8
 * activations and the weights' 4-8 bit quants take one instruction per 16-32 weights, and
 * integer sums are exact in any order, so the speed costs no invariance: a row's result
 * depends on that row and the weights only, never on the batch, the threads or the CPU.
 * It is a different arithmetic from the float32 path (an approximation of the same product):
 * its own numerics id, never mixed with the float path's replicas.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lanes.h"
#include "quant_int8.h"

/* ---------------- the portable twin ---------------- */

/* Step 1 for one block: see quant_int8.h. */
static void quantize_block(const float *x, int8_t *q, float *d, float *sx, int32_t *sum) {
    uint32_t amax_bits = 0;
    for (int k = 0; k < QB; k++) {
        uint32_t bits;
        memcpy(&bits, x + k, 4);
        bits &= 0x7FFFFFFFu;
        if (bits > amax_bits) amax_bits = bits;
    }
    int32_t s[2] = {0, 0};
    if (amax_bits >= 0x7F800000u || amax_bits < TINY_BITS) { /* infinity or NaN: NaN scale; ~zeros: 0 */
        memset(q, 0, QB);
        *d = amax_bits < TINY_BITS ? 0.0f : NAN;
    } else {
        float amax;
        memcpy(&amax, &amax_bits, 4);
        const float id = 127.0f / amax;
        *d = amax / 127.0f;
        for (int k = 0; k < QB; k++) {
            float v = nearbyintf(x[k] * id); /* round half to even, the vector cvtps' mode */
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            q[k] = (int8_t)v;
            s[k >= 16] += q[k];
        }
    }
    sum[0] = s[0] + s[1];
    sum[1] = s[0];
    sum[2] = s[1];
    *sx = *d * (float)sum[0];
}

void bp_quantize_x_portable(const float *x, int64_t M, int64_t K, qx_rows *qx) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t b = 0; b < qx->nb; b++) {
            const int64_t at = i * qx->nb + b;
            quantize_block(x + i * K + b * QB, qx->q + i * K + b * QB, qx->d + at, qx->sx + at, qx->sum + 3 * at);
        }
}

/* Group g (32 weights) of a block as the integers step 2 multiplies: q - zero for Q4_0, Q5_0,
 * Q8_0 and Q6_K, q for the types with a min; Q6_K's two scales into sc[0..1]. */
static void unpack_group(const uint8_t *blk, int type, int g, int32_t *w, int32_t *sc) {
    switch (type) {
    case T_Q4_0: case T_Q4_1: {
        const uint8_t *qs = blk + (type == T_Q4_1 ? 4 : 2);
        const int zero = type == T_Q4_0 ? 8 : 0;
        for (int j = 0; j < 16; j++) { w[j] = (qs[j] & 0xF) - zero; w[j + 16] = (qs[j] >> 4) - zero; }
        break;
    }
    case T_Q5_0: case T_Q5_1: {
        const uint8_t *qs = blk + (type == T_Q5_1 ? 8 : 6);
        const uint32_t qh = u32le(blk + (type == T_Q5_1 ? 4 : 2));
        const int zero = type == T_Q5_0 ? 16 : 0;
        for (int j = 0; j < 16; j++) {
            w[j] = ((qs[j] & 0xF) | (int)((qh >> j) & 1) << 4) - zero;
            w[j + 16] = ((qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4) - zero;
        }
        break;
    }
    case T_Q8_0:
        for (int j = 0; j < 32; j++) w[j] = (int8_t)blk[2 + j];
        break;
    case T_Q4_K: case T_Q5_K: { /* group g: nibble g % 2 of bytes 32 * (g / 2).. ; Q5_K: bit g of qh */
        const uint8_t *qs = blk + (type == T_Q5_K ? 48 : 16) + 32 * (g >> 1);
        for (int j = 0; j < 32; j++) {
            w[j] = (qs[j] >> (4 * (g & 1))) & 0xF;
            if (type == T_Q5_K) w[j] |= ((blk[16 + j] >> g) & 1) << 4;
        }
        break;
    }
    case T_Q6_K: { /* group g = 4 * half + quarter: nibble quarter / 2 of ql, bits 2 * quarter of qh */
        const int half = g >> 2, quarter = g & 3;
        const uint8_t *ql = blk + 64 * half + 32 * (quarter & 1), *qh = blk + 128 + 32 * half;
        for (int j = 0; j < 32; j++)
            w[j] = (((ql[j] >> (4 * (quarter >> 1))) & 0xF) | ((qh[j] >> (2 * quarter)) & 3) << 4) - 32;
        sc[0] = (int8_t)blk[192 + 2 * g];
        sc[1] = (int8_t)blk[192 + 2 * g + 1];
        break;
    }
    }
}

/* ---------------- the layout: 8 rows interleaved (quant_int8.h) ---------------- */

int64_t bp_int8_packed_bytes(int type, int64_t rows, int64_t K) {
    if (!bp_itile_portable(type) || K % (QB * int8_groups(type))) return 0;
    return (rows + IW - 1) / IW * (K / QB / int8_groups(type)) * int8_sb_bytes(type);
}

/* Rows of a weight in its GGUF blocks -> the records (zero rows pad the last tile). */
void bp_int8_repack(const uint8_t *src, int type, int64_t row_bytes, int64_t rows, int64_t K, uint8_t *dst) {
    const int64_t nb = K / QB, tile_bytes = nb / int8_groups(type) * int8_sb_bytes(type);
    const int groups = int8_groups(type), bytes = (int)block_bytes(type), gh = (int)int8_group_header(type);
    const int zero = type == T_Q4_0 ? 8 : type == T_Q5_0 ? 16 : type == T_Q6_K ? 32 : 0;
    memset(dst, 0, (size_t)bp_int8_packed_bytes(type, rows, K));
    for (int64_t n = 0; n < rows; n++) {
        const int j = (int)(n % IW);
        uint8_t *tile = dst + n / IW * tile_bytes;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = src + n * row_bytes + b / groups * bytes;
            const int g = (int)(b % groups);
            uint8_t *sb = tile + int8_sb_at(type, b), *rec = tile + int8_group_at(type, b);
            int32_t q[QB], sc[2] = {1, 1};
            unpack_group(blk, type, g, q, sc);
            if (type == T_Q4_K || type == T_Q5_K) { /* header: d, dmin; record: the 6-bit sc and m */
                memcpy(sb + 2 * j, blk, 2);
                memcpy(sb + 16 + 2 * j, blk + 2, 2);
                int s6, m6;
                int8_scale_min_k4(g, blk + 4, &s6, &m6);
                rec[j] = (uint8_t)s6;
                rec[8 + j] = (uint8_t)m6;
            } else if (type == T_Q6_K) {
                memcpy(sb + 2 * j, blk + 208, 2);
                rec[2 * j] = (uint8_t)(int8_t)sc[0];
                rec[2 * j + 1] = (uint8_t)(int8_t)sc[1];
            } else {
                memcpy(rec + 2 * j, blk, 2);
                if (int8_has_min(type)) memcpy(rec + 16 + 2 * j, blk + 2, 2);
            }
            uint8_t *qs = rec + gh + 4 * j;
            for (int k = 0; k < QB; k++) {
                const int v = q[k] + (type == T_Q8_0 ? 0 : zero); /* unsigned but Q8_0 */
                const int c = k / 8, e = k % 4, upper = k % 8 >= 4;
                if (!int8_nibbles(type)) {
                    qs[k / 4 * 32 + e] = (uint8_t)v;
                    continue;
                }
                qs[c * 32 + e] |= (uint8_t)((v & 0xF) << (upper ? 4 : 0));
                if (int8_plane_bits(type) == 1) qs[128 + e] |= (uint8_t)((v >> 4 & 1) << (2 * c + upper));
                if (int8_plane_bits(type) == 2)
                    qs[128 + 32 * (c / 2) + e] |= (uint8_t)((v >> 4 & 3) << (4 * (c % 2) + 2 * upper));
            }
        }
    }
}

/* Weight k of row j in a record's quants, less its zero (step 2's integer). */
static inline int32_t packed_quant(const uint8_t *qs, int type, int j, int k) {
    if (!int8_nibbles(type)) return (int8_t)qs[k / 4 * 32 + 4 * j + k % 4];
    const int c = k / 8, e = k % 4, upper = k % 8 >= 4;
    int v = qs[c * 32 + 4 * j + e] >> (upper ? 4 : 0) & 0xF;
    if (int8_plane_bits(type) == 1) v |= (qs[128 + 4 * j + e] >> (2 * c + upper) & 1) << 4;
    if (int8_plane_bits(type) == 2) v |= (qs[128 + 32 * (c / 2) + 4 * j + e] >> (4 * (c % 2) + 2 * upper) & 3) << 4;
    return v - (type == T_Q4_0 ? 8 : type == T_Q5_0 ? 16 : type == T_Q6_K ? 32 : 0);
}

/* Row j's dw and mw for block b from the headers: step 3's floats, formed as the definition says. */
static inline void packed_scales(const uint8_t *sb, const uint8_t *rec, int type, int j, float *dw, float *mw) {
    *mw = 0.0f;
    if (type == T_Q4_K || type == T_Q5_K) {
        *dw = f16(sb + 2 * j) * (float)rec[j];
        *mw = -(f16(sb + 16 + 2 * j) * (float)rec[8 + j]);
    } else if (type == T_Q6_K) {
        *dw = f16(sb + 2 * j);
    } else {
        *dw = f16(rec + 2 * j);
        if (int8_has_min(type)) *mw = f16(rec + 16 + 2 * j);
    }
}

/* Rows ids[0..n) of a weight in this layout -> out [n, K]: each weight the float quant_dequant.c
 * computes from the file's block (d * (q - zero), d * q + m, (d * sc) * q - dmin * m, ...), from
 * the same scales and quants (the embedding lookup of a table also multiplied in this layout: a
 * tied LM head is held once). */
void bp_int8_dequant_rows(const uint8_t *w, int type, int64_t K, const int64_t *ids, int64_t n, float *out) {
    const int64_t nb = K / QB, tile_bytes = nb / int8_groups(type) * int8_sb_bytes(type), gh = int8_group_header(type);
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *tile = w + ids[r] / IW * tile_bytes;
        const int j = (int)(ids[r] % IW);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *sb = tile + int8_sb_at(type, b), *rec = tile + int8_group_at(type, b);
            float dw, mw, *dst = out + r * K + b * QB;
            packed_scales(sb, rec, type, j, &dw, &mw);
            int32_t sc[2] = {1, 1};
            if (type == T_Q6_K) { sc[0] = (int8_t)rec[2 * j]; sc[1] = (int8_t)rec[2 * j + 1]; }
            for (int k = 0; k < QB; k++) {
                const float q = (float)packed_quant(rec + gh, type, j, k);
                if (type == T_Q6_K) dst[k] = (dw * (float)sc[k >= 16]) * q;
                else if (int8_has_min(type)) dst[k] = dw * q + mw; /* K-quants: d1 * q - m1 (mw = -m1) */
                else dst[k] = dw * q;
            }
        }
    }
}

static void itile_portable(const qx_rows *x, int64_t m0, int mt, const uint8_t *w, float *sums, int type) {
    const int64_t gh = int8_group_header(type);
    const int has_min = int8_has_min(type);
    for (int i = 0; i < mt; i++)
        for (int j = 0; j < IW; j++) sums[i * IW + j] = 0.0f;
    for (int64_t b = 0; b < x->nb; b++) {
        const uint8_t *sb = w + int8_sb_at(type, b), *rec = w + int8_group_at(type, b);
        for (int j = 0; j < IW; j++) {
            float dw, mw;
            int32_t sc[2] = {1, 1};
            packed_scales(sb, rec, type, j, &dw, &mw);
            if (type == T_Q6_K) { sc[0] = (int8_t)rec[2 * j]; sc[1] = (int8_t)rec[2 * j + 1]; }
            int32_t q[QB];
            for (int k = 0; k < QB; k++) q[k] = packed_quant(rec + gh, type, j, k);
            for (int i = 0; i < mt; i++) {
                const int64_t at = (m0 + i) * x->nb + b;
                const int8_t *qx = x->q + (m0 + i) * x->K + b * QB;
                int32_t lo = 0, hi = 0;
                for (int k = 0; k < 16; k++) { lo += q[k] * qx[k]; hi += q[k + 16] * qx[k + 16]; }
                const int32_t isum = sc[0] * lo + sc[1] * hi;
                float acc = fmaf(dw * x->d[at], (float)isum, sums[i * IW + j]);
                if (has_min) acc = fmaf(mw, x->sx[at], acc);
                sums[i * IW + j] = acc;
            }
        }
    }
}

#define ITILE_FN(NAME, TYPE)                                                                           \
    static void NAME(const qx_rows *x, int64_t m0, int mt, const uint8_t *w, float *sums) {            \
        itile_portable(x, m0, mt, w, sums, TYPE);                                                      \
    }
/* Every quantized type's tile (quant.h's BP_QUANT_TYPES), q4_0_portable and so on, and the
 * picker's switch among them. */
#define BP_TWIN_FN(name) name##_portable
#define ITILE_PORTABLE(id, name, bytes, elems) ITILE_FN(BP_TWIN_FN(name), id)
BP_QUANT_TYPES(ITILE_PORTABLE)

itile_fn bp_itile_portable(int type) {
    switch (type) {
    BP_QUANT_TYPES(BP_QUANT_CASE)
    default: return NULL; /* F16, BF16, F32: float weights stay on the float path */
    }
}
#undef BP_TWIN_FN
