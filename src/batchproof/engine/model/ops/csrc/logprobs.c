/* What a step reads from its logits: each row's greedy choice, and its logprob normaliser
 * with its top k in one pass (the max, then exp(x - max) through exp_poly summed in the
 * 8-lane layout, then a log from IEEE double operations alone), one row at a time.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exp_poly.h"
#include "fixed_math.h"
#include "lanes.h"

/* ---------------- the greedy choice ---------------- */

/* The first j at or after `from` with row[j] == value (value is in the row), by comparison alone. */
static int64_t first_equal_scalar(const float *row, int64_t from, int64_t V, float value) {
    for (int64_t j = from; j < V; j++)
        if (row[j] == value) return j;
    return -1;
}

/* A row's first maximum (the lowest id among ties), NaN never chosen: -1 when no entry beats
 * -inf. The portable loop keeps the first entry that beats every earlier one. */
static int64_t row_first_max_scalar(const float *row, int64_t V) {
    float best = -INFINITY;
    int64_t at = -1;
    for (int64_t j = 0; j < V; j++)
        if (row[j] > best) { /* false for NaN, and for a tie: the first stays */
            best = row[j];
            at = j;
        }
    return at;
}

#ifdef BP_X86
/* The same answer in two vector passes: the row's maximum over its non-NaN entries (max_ps
 * returns its second operand, the running max, when the entry is NaN), then the first entry
 * equal to it. Only comparisons, so no bits to keep: +0 and -0 compare equal, and the first
 * of them is the scalar loop's choice too (neither beats the other). Gemma 3's 16 rows of
 * 262,144 logits took 2.8 ms a step in the scalar loop. */
__attribute__((target("avx2")))
static int64_t first_equal_avx2(const float *row, int64_t V, float value) {
    const __m256 target = _mm256_set1_ps(value);
    int64_t j = 0;
    for (; j + 8 <= V; j += 8) {
        const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + j), target, _CMP_EQ_OQ));
        if (hits) return j + __builtin_ctz((unsigned)hits);
    }
    return first_equal_scalar(row, j, V, value);
}

__attribute__((target("avx2")))
static float row_max_avx2(const float *row, int64_t V) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int64_t j = 0;
    for (; j + 32 <= V; j += 32) { /* four running maxima, for the comparisons' latency */
        m0 = _mm256_max_ps(_mm256_loadu_ps(row + j), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(row + j + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(row + j + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(row + j + 24), m3);
    }
    float lane[8], best = -INFINITY;
    _mm256_storeu_ps(lane, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
    for (int l = 0; l < 8; l++) best = lane[l] > best ? lane[l] : best;
    for (; j < V; j++) best = row[j] > best ? row[j] : best;
    return best;
}

__attribute__((target("avx2")))
static int64_t row_first_max_avx2(const float *row, int64_t V) {
    const float best = row_max_avx2(row, V);
    return best > -INFINITY ? first_equal_avx2(row, V, best) : -1;
}
#endif

/* Each row's first maximum (row_first_max_scalar); a comparison, no arithmetic, so no bits
 * to keep; one pass in C instead of torch's where, isnan and max over the vocabulary. */
void bp_first_max_f32(const float *logits, int64_t B, int64_t V, int64_t *ids) {
    int64_t (*first_max)(const float *, int64_t) =
        BP_PICK(row_first_max_avx2, row_first_max_avx2, row_first_max_scalar);
    for (int64_t r = 0; r < B; r++) ids[r] = first_max(logits + r * V, V);
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

/* The scan of a row's entries from..V-1 into its top k (best first: NaN never ranked; ties to
 * the lower id, since ids are visited in order and only a strictly better value displaces a
 * kept one); returns how many are kept now. */
static int64_t top_k_scan_scalar(const float *x, int64_t from, int64_t V, int64_t k, int64_t kept,
                                 int64_t *row_ids, float *row_values) {
    for (int64_t i = from; i < V; i++) {
        const float v = x[i];
        if (v != v) continue; /* NaN */
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
    return kept;
}

/* The row's max (the first entry equal to it: the scalar loop's `v > best` keeps the first of
 * +0 and -0), its non-NaN count, and its top k, in one pass. */
typedef struct {
    float best;
    int64_t finite_or_inf, kept;
} row_scan;

static row_scan scan_row_scalar(const float *x, int64_t V, int64_t k, int64_t *row_ids, float *row_values) {
    row_scan r = {-INFINITY, 0, 0};
    for (int64_t i = 0; i < V; i++) {
        if (x[i] != x[i]) continue;
        r.finite_or_inf++;
        if (x[i] > r.best) r.best = x[i];
    }
    r.kept = top_k_scan_scalar(x, 0, V, k, 0, row_ids, row_values);
    return r;
}

#ifdef BP_X86
/* The same, 8 entries at a time: a block none of whose entries beats the k-th kept value (the
 * usual case, once k are kept) only updates the count and the running max; any other block goes
 * through the scalar insertion, entry by entry in order, so the list is the scalar loop's. The
 * scalar pass took ~0.3 ms of a 262,144-entry row. */
__attribute__((target("avx2")))
static row_scan scan_row_avx2(const float *x, int64_t V, int64_t k, int64_t *row_ids, float *row_values) {
    row_scan r = {-INFINITY, 0, 0};
    __m256 running = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= V; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        r.finite_or_inf += __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_ORD_Q)));
        running = _mm256_max_ps(v, running); /* a NaN entry keeps the running max */
        if (k == 0) continue;
        if (r.kept == k) {
            const __m256 last = _mm256_set1_ps(row_values[k - 1]);
            if (!_mm256_movemask_ps(_mm256_cmp_ps(v, last, _CMP_GT_OQ))) continue;
        }
        r.kept = top_k_scan_scalar(x, i, i + 8, k, r.kept, row_ids, row_values);
    }
    float lane[8];
    _mm256_storeu_ps(lane, running);
    for (int l = 0; l < 8; l++) r.best = lane[l] > r.best ? lane[l] : r.best;
    for (int64_t j = i; j < V; j++) {
        if (x[j] != x[j]) continue;
        r.finite_or_inf++;
        if (x[j] > r.best) r.best = x[j];
    }
    r.kept = top_k_scan_scalar(x, i, V, k, r.kept, row_ids, row_values);
    if (r.best == 0.0f) r.best = x[first_equal_avx2(x, V, 0.0f)]; /* the first zero's sign */
    return r;
}
#endif

/* Per row of [B, V] logits: the best k ids (top_k_scan_scalar's order), and (max, log_total)
 * with logprob = (term - shift) - log_total, shift the max (0 if it is not finite), term the
 * logit, or for a row holding +inf: 0 for its +inf entries and -inf for the rest. */
void bp_top_k_logprobs_f32(const float *logits, int64_t B, int64_t V, int64_t k, int64_t *ids, float *values,
                           float *row_max, float *log_total, int64_t *counts) {
    row_scan (*scan)(const float *, int64_t, int64_t, int64_t *, float *) =
        BP_PICK(scan_row_avx2, scan_row_avx2, scan_row_scalar);
    for (int64_t b = 0; b < B; b++) {
        const float *x = logits + b * V;
        int64_t *row_ids = ids + b * k;
        float *row_values = values + b * k;
        const row_scan r = scan(x, V, k, row_ids, row_values);
        counts[b] = r.kept;
        for (int64_t j = r.kept; j < k; j++) {
            row_ids[j] = 0;
            row_values[j] = NAN;
        }
        const int has_inf = r.best == INFINITY;
        const float row_shift = has_inf || !(r.best > -INFINITY) ? 0.0f : r.best;
        row_max[b] = r.best;
        log_total[b] = r.finite_or_inf ? log_fixed(row_exp_sum(x, V, row_shift, has_inf)) : -INFINITY;
    }
}

/* ---------------- the tail: each row's mass outside the ids it shows ---------------- */

/* row_exp_sum's terms, lanes and order, each lane and the tree in double: a float lane's ~6,000 adds over
 * SmolLM2's 49,152 logits drifted 1.2e-5 of a tail (shown 1 against entry 2 + shown 2); -inf adds +0.0. */
static double sum8_wide(const double l[8]) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }

static double row_exp_sum_wide_scalar(const float *x, int64_t V, float shift) {
    double lane[8] = {0};
    for (int64_t i = 0; i < V; i++)
        if (x[i] > -INFINITY) lane[i & 7] += (double)exp_poly(x[i] - shift);
    return sum8_wide(lane);
}

#ifdef BP_X86
__attribute__((target("avx2,fma")))
static double row_exp_sum_wide_avx2(const float *x, int64_t V, float shift) {
    __m256d low = _mm256_setzero_pd(), high = low; /* lanes 0-3, 4-7 */
    __m256 s = _mm256_set1_ps(shift), ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t i = 0; i < V; i += 8) {
        __m256i mask = tail_mask_avx2(i, V); /* all lanes but past the row's end */
        __m256 v = _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + i, mask), _mm256_castsi256_ps(mask));
        __m256 e = _mm256_and_ps(_mm256_cmp_ps(v, ninf, _CMP_GT_OQ), exp_poly_avx2(_mm256_sub_ps(v, s)));
        low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double lane[8];
    _mm256_storeu_pd(lane, low);
    _mm256_storeu_pd(lane + 4, high);
    return sum8_wide(lane);
}
#endif

/* Per row: fixed_math's log of the normaliser's terms, its first num_shown[b] ids' set to -inf in a copy (an id
 * named twice: one term gone), - log_total[b] in double (logs rounded first left a tail near 0 5e-7 off). */
int bp_tail_logprobs_f32(const float *logits, int64_t B, int64_t V, const float *row_max, const float *log_total,
                         const int64_t *ids, int64_t k, const int64_t *num_shown, float *tails) {
    double (*exp_sum)(const float *, int64_t, float) =
        BP_PICK(row_exp_sum_wide_avx2, row_exp_sum_wide_avx2, row_exp_sum_wide_scalar);
    float *rest = NULL;
    for (int64_t b = 0; b < B; b++) {
        if (num_shown[b] == 0) { /* the whole mass: 0 exactly, not a sum's rounding against log_total */
            tails[b] = 0.0f;
            continue;
        }
        if (rest == NULL && (rest = malloc((size_t)V * sizeof(float))) == NULL) return -1;
        memcpy(rest, logits + b * V, (size_t)V * sizeof(float));
        for (int64_t j = 0; j < num_shown[b] && j < k; j++) rest[ids[b * k + j]] = -INFINITY;
        const float best = row_max[b];
        double outside = best == INFINITY ? 0.0 : exp_sum(rest, V, best > -INFINITY ? best : 0.0f);
        for (int64_t i = 0; best == INFINITY && i < V; i++) outside += rest[i] == INFINITY; /* 1 each +inf */
        tails[b] = (float)((outside > 0.0 ? fx_log(outside) : -INFINITY) - (double)log_total[b]); /* 1 rounding */
    }
    free(rest);
    return 0;
}
