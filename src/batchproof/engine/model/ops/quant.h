/* What quant_dequant.c and quant_linear.c share: GGML's type ids, the exact half -> float,
 * and the table of block types (each one's bytes, weights, and the function that turns a row
 * of its blocks into the floats gguf.quants computes). Not part of the interface (kernels.h). */
#ifndef BP_QUANT_H
#define BP_QUANT_H
#include <stdint.h>
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

/* One row of K weights -> K floats, each computed as gguf.quants computes it. */
typedef void (*dequant_fn)(const uint8_t *restrict src, int64_t K, float *restrict dst);

typedef struct {
    int64_t block_bytes, block_elems; /* a block's bytes, and how many weights it holds */
    dequant_fn dequant;
} block_type;

/* The type's entry (quant_dequant.c), or NULL for a type we do not run. */
BP_INTERNAL const block_type *bp_block_type(int type);
#endif
