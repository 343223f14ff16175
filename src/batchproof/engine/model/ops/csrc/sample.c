/* The arithmetic torch used to own on the token path (issue 61), now in one fixed order that
 * every host computes alike: a sampled request's distribution and its draw, and the RoPE
 * tables. Portable C, but for one AVX2 twin: the row's exp terms, exp_poly lane by lane as the
 * normaliser's (exp_poly.h: the same operations, so the same bits). At Gemma 3's 262,144 ids a
 * scalar draw took 5.7 ms a row on a Zen 2 core, half a decode step, and as long again in top_p's
 * frexpf calls. Every sum stays a double added in id order. The build's -ffp-contract=off keeps
 * every + and * rounding on its own. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exp_poly.h"
#include "fixed_math.h"
#include "kernels.h"

/* ---------------- the sampled choice ---------------- */

typedef struct {
    float value;
    int64_t id;
} entry;

/* Best first; among equals the lower id first (the order every rule below reads). */
static int best_first(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->value != y->value) return x->value > y->value ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The k-th largest of v[0..n), 1 <= k <= n, by comparisons alone (so any selection order gives
 * the same value): Hoare's quickselect on a scratch copy, middle-element pivots. */
static float kth_largest(const float *v, int64_t n, int64_t k, float *scratch) {
    memcpy(scratch, v, (size_t)n * sizeof(float));
    int64_t lo = 0, hi = n - 1, want = k - 1; /* index in descending order */
    while (lo < hi) {
        float pivot = scratch[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (scratch[i] > pivot) i++;
            while (scratch[j] < pivot) j--;
            if (i <= j) {
                float t = scratch[i];
                scratch[i++] = scratch[j];
                scratch[j--] = t;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return pivot;
    }
    return scratch[want];
}

/* Entries per power of two of e (e in (0, 1]: bucket b holds 2^-b <= e < 2^(1-b); the last one
 * everything smaller): what lets top_p sort only the entries that can be kept. */
#define NUM_BUCKETS 160

static int bucket_of(float e) {
    uint32_t bits;
    memcpy(&bits, &e, sizeof bits);
    int biased = (int)((bits >> 23) & 0xff), ex;
    if (biased) ex = biased - 126; /* a normal e = 1.f 2^(biased - 127) = 0.1f 2^(biased - 126) */
    else frexpf(e, &ex);           /* e = m 2^ex, 0.5 <= m < 1; a subnormal, read by libm (rare) */
    int b = 1 - ex;
    return b < NUM_BUCKETS - 1 ? b : NUM_BUCKETS - 1;
}

/* top_p's rule (bp_sample_f32) on e, in place: in best-first order, an entry goes once the mass
 * before it (double, that order) is >= bound. The order's head is all that can be kept, so only
 * the entries of the largest buckets whose mass passes the bound (with room for the order of
 * summing, 1e-9 of it) are sorted: every entry below them is smaller than every entry in them,
 * and the mass before the first of those, whatever order sums it, is past the bound, so they all
 * go, exactly as a sort of the whole row would decide. -1 if memory ran out. */
static int top_p_cut(float *e, int64_t V, double bound) {
    double mass[NUM_BUCKETS] = {0};
    uint8_t *bucket = malloc((size_t)V); /* each entry's, found once (three passes read it) */
    if (!bucket) return -1;
    for (int64_t i = 0; i < V; i++)
        if (e[i] > 0.0f) mass[bucket[i] = (uint8_t)bucket_of(e[i])] += (double)e[i];
    int last = NUM_BUCKETS - 1;
    double head = 0.0;
    for (int b = 0; b < NUM_BUCKETS; b++) {
        head += mass[b];
        if (head >= bound * (1.0 + 1e-9) + 1e-300) {
            last = b;
            break;
        }
    }
    int64_t n = 0;
    for (int64_t i = 0; i < V; i++) n += e[i] > 0.0f && bucket[i] <= last;
    entry *order = malloc((size_t)(n > 0 ? n : 1) * sizeof(entry));
    if (!order) {
        free(bucket);
        return -1;
    }
    for (int64_t i = 0, j = 0; i < V; i++) {
        if (e[i] > 0.0f && bucket[i] <= last) order[j++] = (entry){e[i], i};
        else if (last < NUM_BUCKETS - 1) e[i] = 0.0f; /* below the head: past the bound */
    }
    qsort(order, (size_t)n, sizeof(entry), best_first);
    double before = 0.0;
    for (int64_t j = 0; j < n; j++) {
        if (j > 0 && before >= bound) e[order[j].id] = 0.0f;
        before += (double)order[j].value;
    }
    free(order);
    free(bucket);
    return 0;
}

/* e[i] = exp_poly(s[i]) where s[i] is above -inf, else 0. */
static void exp_terms_scalar(const float *s, float *e, int64_t V) {
    for (int64_t i = 0; i < V; i++) e[i] = s[i] == -INFINITY ? 0.0f : exp_poly(s[i]);
}

#ifdef BP_X86
__attribute__((target("avx2,fma")))
static void exp_terms_avx2(const float *s, float *e, int64_t V) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= V; i += 8) {
        __m256 v = _mm256_loadu_ps(s + i); /* NEQ_UQ: a NaN keeps its exp_poly, as the scalar != does */
        _mm256_storeu_ps(e + i, _mm256_and_ps(_mm256_cmp_ps(v, ninf, _CMP_NEQ_UQ), exp_poly_avx2(v)));
    }
    exp_terms_scalar(s + i, e + i, V - i);
}
#endif

/* One row's sampled choice (docs/numerics.md, "A seeded draw"). `usable`: the row after
 * penalties and bans, NaN already -inf, its maximum finite. In this order, each step on the
 * entries the one before kept:
 *   s = (x - max) / temperature          float32, one rounding each (temperature as float32;
 *                                        top_p and min_p are doubles, as the request gave them)
 *   top_k: drop s < the k-th largest s   (ties at the k-th stay)
 *   e = exp_poly(s) for kept entries     the kernels' exp; dropped ones are 0
 *   top_p: in best-first order (ties to the lower id), drop an entry once the mass before it,
 *          summed in double in that order, is >= top_p times the total (summed in double in id
 *          order); the best entry always stays
 *   min_p: drop e < min_p, in double (e / total < min_p * max e / total, max e = exp_poly(0) = 1)
 *   draw:  target = u * (the kept total, in double in id order); the first kept id whose running
 *          sum (double, id order) passes it; the last kept id if rounding leaves none.
 * `processed` (when not NULL) gets s for the kept entries and -inf elsewhere: its log-softmax is
 * the distribution drawn from. Returns the id, or -1 if memory ran out. */
int64_t bp_sample_f32(const float *usable, int64_t V, float temperature, int64_t top_k, double top_p, double min_p,
                      double u, float *processed) {
    float *s = malloc((size_t)V * sizeof(float));
    float *e = malloc((size_t)V * sizeof(float));
    if (!s || !e) {
        free(s);
        free(e);
        return -1;
    }
    float best = -INFINITY;
    for (int64_t i = 0; i < V; i++) best = usable[i] > best ? usable[i] : best;
    for (int64_t i = 0; i < V; i++) s[i] = (usable[i] - best) / temperature;
    if (top_k > 0 && top_k < V) {
        float kth = kth_largest(s, V, top_k, e); /* e as scratch before it holds anything */
        for (int64_t i = 0; i < V; i++) s[i] = s[i] < kth ? -INFINITY : s[i];
    }
    void (*exp_terms)(const float *, float *, int64_t) = BP_PICK(exp_terms_avx2, exp_terms_avx2, exp_terms_scalar);
    exp_terms(s, e, V);
    double total = 0.0;
    for (int64_t i = 0; i < V; i++) total += (double)e[i];
    if (top_p < 1.0 && top_p_cut(e, V, top_p * total) < 0) {
        free(s);
        free(e);
        return -1;
    }
    if (min_p > 0.0)
        for (int64_t i = 0; i < V; i++) e[i] = (double)e[i] < min_p ? 0.0f : e[i];
    double kept = total; /* nothing dropped: the same terms in the same order */
    if (top_p < 1.0 || min_p > 0.0) {
        kept = 0.0;
        for (int64_t i = 0; i < V; i++) kept += (double)e[i];
    }
    double target = u * kept, running = 0.0;
    int64_t chosen = -1, last = -1;
    for (int64_t i = 0; i < V; i++) {
        if (e[i] == 0.0f) continue;
        last = i;
        running += (double)e[i];
        if (running > target) {
            chosen = i;
            break;
        }
    }
    if (chosen < 0) chosen = last;
    if (processed)
        for (int64_t i = 0; i < V; i++) processed[i] = e[i] > 0.0f ? s[i] : -INFINITY;
    free(s);
    free(e);
    return chosen;
}

/* ---------------- the RoPE tables ---------------- */

/* cos and sin [max_len, rope_dim / 2] of position p times frequency i, as Hugging Face forms
 * them in float32 (exponent 2i / rope_dim, inv_freq = 1 / base^exponent, then / freq_factors[i]
 * and / linear_factor, angle = p * inv_freq: each one float32 rounding), with base^exponent,
 * cos and sin evaluated in double by fixed_math.h and rounded once to float32. */
void bp_rope_tables(int64_t rope_dim, double base, int64_t max_len, const float *freq_factors, float linear_factor,
                    float *cos_out, float *sin_out) {
    int64_t half = rope_dim / 2;
    double log_base = fx_log(base);
    for (int64_t i = 0; i < half; i++) {
        float exponent = (float)(2 * i) / (float)rope_dim;
        float power = (float)fx_exp((double)exponent * log_base);
        float inv_freq = 1.0f / power;
        if (freq_factors) inv_freq = inv_freq / freq_factors[i];
        if (linear_factor != 1.0f) inv_freq = inv_freq / linear_factor;
        for (int64_t p = 0; p < max_len; p++) {
            float angle = (float)p * inv_freq;
            double s, c;
            fx_sincos((double)angle, &s, &c);
            cos_out[p * half + i] = (float)c;
            sin_out[p * half + i] = (float)s;
        }
    }
}
