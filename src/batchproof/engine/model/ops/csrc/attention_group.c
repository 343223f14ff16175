/* Decode attention for the query heads of one KV group together (grouped-query attention:
 * SmolLM2's 3 heads a KV head, Gemma 3's and Llama 3's 4): each key and value vector is loaded
 * once for 2 or 3 heads, where attention.c's attend_avx2 loaded it once per head, and the loads,
 * not the FMAs, bounded that loop. A decode step of several rows spends a sixth of its time here,
 * and each row pays its own, so this is a row's cost.
 *
 * Every head's arithmetic is attend_avx2's, term for term: a key's score is one 8-lane FMA chain
 * over D, hsum4_avx2 (or bp_dot8_avx2 for the last L % 4 keys), times scale; the softmax of
 * softmax.h; an output lane one FMA chain over the keys in position order, times 1 / total.
 * Only which independent chains run side by side differs, so the bits are the same. */
#include "attention_group.h"
#include "lanes.h"
#include "softmax.h"

#ifdef BP_X86
#define GINLINE static inline __attribute__((always_inline, target("avx2,fma")))
#define GMAX 3 /* heads a call takes: 12 accumulators, NH q or score registers and one key in 16 */

/* scores[g * L + j] = (q_g . k_j) * scale for the NH heads, four keys at a time */
GINLINE void group_scores(const float *q, const float *keys, float *scores, int64_t L, int64_t D, float scale,
                          const int NH) {
    int64_t j = 0;
    for (; j + 4 <= L; j += 4) {
        __m256 a[GMAX][4];
        for (int g = 0; g < NH; g++)
            for (int i = 0; i < 4; i++) a[g][i] = _mm256_setzero_ps();
        const float *k0 = keys + j * D;
        for (int64_t d = 0; d < D; d += 8) {
            __m256 qv[GMAX];
            for (int g = 0; g < NH; g++) qv[g] = _mm256_loadu_ps(q + g * D + d);
            for (int i = 0; i < 4; i++) {
                const __m256 kv = _mm256_loadu_ps(k0 + i * D + d);
                for (int g = 0; g < NH; g++) a[g][i] = _mm256_fmadd_ps(qv[g], kv, a[g][i]);
            }
        }
        for (int g = 0; g < NH; g++)
            _mm_storeu_ps(scores + g * L + j, _mm_mul_ps(hsum4_avx2(a[g][0], a[g][1], a[g][2], a[g][3]),
                                                         _mm_set1_ps(scale)));
    }
    for (; j < L; j++)
        for (int g = 0; g < NH; g++) scores[g * L + j] = bp_dot8_avx2(q + g * D, keys + j * D, D) * scale;
}

/* o_g = (sum over keys in order of p_g[j] v_j) * inv[g], 32 lanes of every head at a time */
GINLINE void group_values(const float *p, const float *values, float *o, const float *inv, int64_t L, int64_t D,
                          const int NH) {
    for (int64_t d = 0; d < D; d += 32) {
        __m256 a[GMAX][4];
        for (int g = 0; g < NH; g++)
            for (int c = 0; c < 4; c++) a[g][c] = _mm256_setzero_ps();
        for (int64_t j = 0; j < L; j++) {
            __m256 pj[GMAX];
            for (int g = 0; g < NH; g++) pj[g] = _mm256_set1_ps(p[g * L + j]);
            const float *vr = values + j * D + d;
            for (int c = 0; c < 4; c++) {
                const __m256 v = _mm256_loadu_ps(vr + 8 * c);
                for (int g = 0; g < NH; g++) a[g][c] = _mm256_fmadd_ps(pj[g], v, a[g][c]);
            }
        }
        for (int g = 0; g < NH; g++)
            for (int c = 0; c < 4; c++)
                _mm256_storeu_ps(o + g * D + d + 8 * c, _mm256_mul_ps(a[g][c], _mm256_set1_ps(inv[g])));
    }
}

GINLINE void attend_group(const float *q, const float *keys, const float *values, float *o, float *scores,
                          int64_t L, int64_t D, float scale, const int NH) {
    float inv[GMAX];
    group_scores(q, keys, scores, L, D, scale, NH);
    for (int g = 0; g < NH; g++) {
        float *s = scores + g * L;
        exp_shifted_avx2(s, L, max_score_avx2(s, L));
        inv[g] = inverse_total(s, L);
    }
    group_values(scores, values, o, inv, L, D, NH);
}

/* Needs D % 64 == 0, as attend_avx2 (the caller checks). */
__attribute__((target("avx2,fma"))) void bp_attend_group_avx2(const float *q, const float *keys,
                                                               const float *values, float *o, float *scores,
                                                               int64_t L, int64_t D, float scale, int NH) {
    switch (NH) {
    case 3: attend_group(q, keys, values, o, scores, L, D, scale, 3); return;
    case 2: attend_group(q, keys, values, o, scores, L, D, scale, 2); return;
    default: attend_group(q, keys, values, o, scores, L, D, scale, 1); return;
    }
}
#endif
