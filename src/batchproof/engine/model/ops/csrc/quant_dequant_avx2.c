/* quant_dequant.c's AVX2 twins of the Q4_x, Q5_x and Q8_0 rows (quant.h): the scalar loops'
 * operations, eight weights at a time, so the same floats (nothing is fused:
 * -ffp-contract=off; every product and sum rounds once, as there).
 */
#include <stdint.h>

#include "quant.h"

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

/* Q4_0 / Q4_1 with AVX2: the same operations as quant_dequant.c's scalar loop (the nibble, less 8
 * for Q4_0, converted, times d, plus m for Q4_1), eight at a time. */
__attribute__((target("avx2,f16c"), noclone))
void bp_dequant_q4_avx2(const uint8_t *src, int64_t num_blocks, int has_min, float *dst) {
    /* Unpack the nibbles first, then scale 32 at a time: two simple loops vectorize, one
     * mixed loop did not. */
    const int bytes = (int)(has_min ? block_bytes(T_Q4_1) : block_bytes(T_Q4_0));
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
__attribute__((target("avx2,f16c"), noclone))
void bp_dequant_q5_avx2(const uint8_t *src, int64_t num_blocks, int has_min, float *dst) {
    const int bytes = (int)(has_min ? block_bytes(T_Q5_1) : block_bytes(T_Q5_0));
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

/* Q8_0 with AVX2: each signed byte converted, times d, as the scalar loop, eight at a time. */
__attribute__((target("avx2,f16c")))
void bp_dequant_q8_avx2(const uint8_t *src, int64_t num_blocks, float *dst) {
    for (int64_t b = 0; b < num_blocks; b++, src += block_bytes(T_Q8_0), dst += 32) {
        const __m256 d = _mm256_set1_ps(f16_fast(src));
        for (int e = 0; e < 4; e++) {
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(src + 2 + 8 * e)));
            _mm256_storeu_ps(dst + 8 * e, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
    }
}
#endif
