/* What a step reads from its logits: each row's greedy choice, and its logprob normaliser
 * with its top k in one pass (the max, then exp(x - max) through exp_poly summed in the
 * 8-lane layout, then a log from IEEE double operations alone), one row at a time.
 */
#include <math.h>
#include <stdint.h>

#include "exp_poly.h"
#include "lanes.h"

/* ---------------- the greedy choice ---------------- */

/* Each row's first maximum (the lowest id among ties), NaN never chosen: ids[r] = -1 when
 * no entry beats -inf. A comparison, no arithmetic, so no bits to keep; one pass in C
 * instead of torch's where, isnan and max over the vocabulary (0.4 ms a step alone). */
void bp_first_max_f32(const float *logits, int64_t B, int64_t V, int64_t *ids) {
    for (int64_t r = 0; r < B; r++) {
        const float *row = logits + r * V;
        float best = -INFINITY;
        int64_t at = -1;
        for (int64_t j = 0; j < V; j++)
            if (row[j] > best) { /* false for NaN, and for a tie: the first stays */
                best = row[j];
                at = j;
            }
        ids[r] = at;
    }
}

/* ---------------- logprobs: each row's normaliser and top k, in one pass ---------------- */

/* sum_i exp(x[i] - shift) over the entries above -inf (NaN and -inf add nothing), in the
 * 8-lane layout (lane i mod 8, then sum8's tree). The vector code adds +0.0 for the
 * entries left out and for its padded tail; the sums are never -0 (every term is >= +0),
 * so those adds change no bit and the portable loop can skip them. */
static float row_exp_sum_scalar(const float *x, int64_t V, float shift) {
    float lane[8] = {0};
    for (int64_t i = 0; i < V; i++)
        if (x[i] > -INFINITY) lane[i & 7] += exp_poly(x[i] - shift);
    return sum8(lane);
}

#ifdef BP_X86
__attribute__((target("avx2,fma")))
static float row_exp_sum_avx2(const float *x, int64_t V, float shift) {
    __m256 acc = _mm256_setzero_ps(), s = _mm256_set1_ps(shift), ninf = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= V; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        acc = _mm256_add_ps(acc, _mm256_and_ps(_mm256_cmp_ps(v, ninf, _CMP_GT_OQ), exp_poly_avx2(_mm256_sub_ps(v, s))));
    }
    if (i < V) { /* the tail's missing lanes as -inf, which add nothing */
        __m256i mask = tail_mask_avx2(i, V);
        __m256 v = _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + i, mask), _mm256_castsi256_ps(mask));
        acc = _mm256_add_ps(acc, _mm256_and_ps(_mm256_cmp_ps(v, ninf, _CMP_GT_OQ), exp_poly_avx2(_mm256_sub_ps(v, s))));
    }
    return hsum_avx2(acc);
}
#endif

typedef float (*exp_sum_fn)(const float *, int64_t, float);

/* The row's total mass: a row holding +inf has all of it on its +inf entries, one each. */
static float row_exp_sum(const float *x, int64_t V, float shift, int has_inf) {
    if (has_inf) {
        int64_t n = 0;
        for (int64_t i = 0; i < V; i++) n += x[i] == INFINITY;
        return (float)n;
    }
    exp_sum_fn exp_sum = BP_PICK(row_exp_sum_avx2, row_exp_sum_avx2, row_exp_sum_scalar);
    return exp_sum(x, V, shift);
}

/* log(x) of a total x >= 0 from IEEE double operations alone, not libm's logf, whose last
 * bit depends on the host's libm and the variant it picks for the CPU: x = m 2^e with m in
 * [sqrt(1/2), sqrt(2)), log m = 2 atanh(s) with s = (m - 1) / (m + 1), |s| < 0.172, whose
 * series to s^23 / 23 is exact to double's rounding; then one rounding to float. */
static float log_fixed(float x) {
    if (x == 0.0f) return -INFINITY;
    int e;
    double m = frexp((double)x, &e); /* exact: m in [0.5, 1) */
    if (m < 0.70710678118654752440) {
        m *= 2.0;
        e -= 1;
    }
    double s = (m - 1.0) / (m + 1.0), s2 = s * s, series = 1.0 / 23.0;
    for (int k = 21; k >= 1; k -= 2) series = series * s2 + 1.0 / (double)k;
    return (float)((2.0 * s) * series + (double)e * 0.69314718055994530942);
}

/* Per row of [B, V] logits: the best k ids (NaN never ranked; ties to the lower id, since
 * ids are visited in order and only a strictly better value displaces a kept one), and
 * (max, log_total) with logprob = (term - shift) - log_total, shift the max (0 if it is
 * not finite), term the logit, or for a row holding +inf: 0 for its +inf entries and
 * -inf for the rest. */
void bp_top_k_logprobs_f32(const float *logits, int64_t B, int64_t V, int64_t k, int64_t *ids, float *values,
                           float *row_max, float *log_total, int64_t *counts) {
    for (int64_t b = 0; b < B; b++) {
        const float *x = logits + b * V;
        int64_t *row_ids = ids + b * k;
        float *row_values = values + b * k;
        int64_t kept = 0, finite_or_inf = 0;
        float best = -INFINITY;
        for (int64_t i = 0; i < V; i++) {
            float v = x[i];
            if (v != v) continue; /* NaN */
            finite_or_inf++;
            if (v > best) best = v;
            if (k == 0 || (kept == k && !(v > row_values[k - 1]))) continue;
            int64_t j = kept < k ? kept++ : k - 1; /* insert v, keeping the list best first */
            while (j > 0 && v > row_values[j - 1]) {
                row_values[j] = row_values[j - 1];
                row_ids[j] = row_ids[j - 1];
                j--;
            }
            row_values[j] = v;
            row_ids[j] = i;
        }
        counts[b] = kept;
        for (int64_t j = kept; j < k; j++) {
            row_ids[j] = 0;
            row_values[j] = NAN;
        }
        int has_inf = best == INFINITY;
        float row_shift = has_inf || !(best > -INFINITY) ? 0.0f : best;
        row_max[b] = best;
        log_total[b] = finite_or_inf ? log_fixed(row_exp_sum(x, V, row_shift, has_inf)) : -INFINITY;
    }
}
