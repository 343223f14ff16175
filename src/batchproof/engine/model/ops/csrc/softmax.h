/* Attention's softmax, in three steps that every path takes in the same order, so a
 * head's weights are the same bits on any of them: attention.c's (one query head, or a prompt's
 * rows, at a time) and attention_group.c's (the heads of one KV group together) both run it.
 * Not part of the interface (kernels.h). */
#ifndef BP_SOFTMAX_H
#define BP_SOFTMAX_H
#include <math.h>
#include <stdint.h>

#include "exp_poly.h"
#include "lanes.h"

/* Softmax in three steps that every path shares: the largest score, each score's exp
 * less it (exp_poly, lane by lane), and 1 / their total, summed in key order. */
static inline float max_score(const float *s, int64_t L) {
    float top = -INFINITY;
    for (int64_t j = 0; j < L; j++)
        if (s[j] > top) top = s[j];
    return top;
}

static inline void exp_shifted_scalar(float *s, int64_t L, float shift) {
    for (int64_t j = 0; j < L; j++) s[j] = exp_poly(s[j] - shift);
}

static inline float inverse_total(const float *s, int64_t L) {
    float total = 0.0f;
    for (int64_t j = 0; j < L; j++) total += s[j];
    return 1.0f / total;
}

#ifdef BP_X86
__attribute__((target("avx2,fma")))
static inline void exp_shifted_avx2(float *s, int64_t L, float shift) {
    const __m256 sh = _mm256_set1_ps(shift);
    int64_t j = 0; /* masked only at the tail: a masked store costs several plain ones on some CPUs */
    for (; j + 8 <= L; j += 8) _mm256_storeu_ps(s + j, exp_poly_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), sh)));
    if (j < L) {
        __m256i mask = tail_mask_avx2(j, L);
        _mm256_maskstore_ps(s + j, mask, exp_poly_avx2(_mm256_sub_ps(_mm256_maskload_ps(s + j, mask), sh)));
    }
}

/* max_score's result: the running max is max_ps(s, top) lane by lane (s > top ? s : top,
 * as there, so a NaN score is passed over), then the lanes. Only a tie between +0 and -0
 * can pick a different zero, and s - (+0) and s - (-0) give every exp the same bits. */
__attribute__((target("avx2,fma")))
static inline float max_score_avx2(const float *s, int64_t L) {
    __m256 top8 = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= L; j += 8) top8 = _mm256_max_ps(_mm256_loadu_ps(s + j), top8);
    float lanes[8], top = -INFINITY;
    _mm256_storeu_ps(lanes, top8);
    for (int l = 0; l < 8; l++)
        if (lanes[l] > top) top = lanes[l];
    for (; j < L; j++)
        if (s[j] > top) top = s[j];
    return top;
}

#endif /* BP_X86 */
#endif
