/* The exp every path uses: SiLU and GELU (elementwise.c), the attention softmax
 * (attention.c) and the logprob normaliser (logprobs.c). Inline, so each of them keeps it in
 * its loop; tests/engine/test_exp_digest.py holds its bits to the numerics version.
 *
 * Cephes' expf polynomial, clamped to float's range: n = round(x log2 e), r = x - n ln 2 in
 * two parts, e^r by the polynomial, times 2^n. Every operation rounds on its own (nothing
 * fused), and the vector versions run the same operations lane by lane. torch would run
 * the tail of a range in scalar code (glibc expf) and the rest in vector code (another
 * exp), so an element's bits would depend on where the row count puts the range ends;
 * libm's expf alone would still differ between hosts' libm builds and CPU variants. */
#ifndef BP_EXP_POLY_H
#define BP_EXP_POLY_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#ifdef BP_X86
#include <immintrin.h>
#endif

#define EXP_HI 88.3762626647949f
#define EXP_LO -88.3762626647949f
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO -2.12194440e-4f

/* 2^e, exactly, for a normal exponent e. */
static inline float pow2i(int e) {
    uint32_t bits = (uint32_t)(e + 127) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float exp_poly(float x) {
    x = x > EXP_LO ? x : EXP_LO; /* as max_ps then min_ps: NaN becomes EXP_LO */
    x = x < EXP_HI ? x : EXP_HI;
    float n = nearbyintf(x * LOG2E);
    float r = (x - n * LN2_HI) - n * LN2_LO;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = (p * (r * r) + r) + 1.0f;
    /* 2^n as two halves, so that n from -128 to 128 stays within the exponent's range;
     * >> is arithmetic (floor), as srai is */
    int ni = (int)n, half = ni >> 1;
    return (p * pow2i(half)) * pow2i(ni - half);
}

#ifdef BP_X86
/* exp_poly, eight lanes at a time. */
__attribute__((target("avx2,fma")))
static inline __m256 exp_poly_avx2(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(LN2_HI))),
                             _mm256_mul_ps(n, _mm256_set1_ps(LN2_LO)));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
    __m256i ni = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(ni, 1), rest = _mm256_sub_epi32(ni, half);
    __m256i bias = _mm256_set1_epi32(127);
    __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
    __m256 b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, a), b);
}
#endif
#endif
