/* An MoE layer's MLP in one call, for the fused decode step (layers.c): the routing of
 * moe/routing.py and the weighted sum of moe/layer.py, the same kernels and the same float
 * operations in the same order, so the same bits as the op-by-op path; what goes is the Python
 * between them (the router's matmul, its top k and normaliser, the exp of the kept log-probs,
 * the rescaling and sort, then the experts' calls: ~20 calls a layer a step). The experts chosen
 * are written out where a request asked for its routing receipt.
 *
 * Rows routed to one expert share one matmul (its weights read once a step, not once a token),
 * which changes no bit: every linear computes each output row on its own (kernels.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "layers.h"

/* 1/i! for i = 10..0, as routing.py's _TAYLOR (each a correctly rounded quotient of exact doubles). */
static const double TAYLOR[11] = {1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0,
                                  1.0 / 120.0,     1.0 / 24.0,     1.0 / 6.0,     1.0 / 2.0,    1.0, 1.0};

/* routing.py's exp_fixed_scalar, operation for operation (nothing fused: -ffp-contract=off;
 * nearbyint ties to even as Python's round; ldexp is exact). */
static double exp_fixed(double v) {
    if (v != v) return v;
    v = v < -700.0 ? -700.0 : v > 700.0 ? 700.0 : v;
    const double k = nearbyint(v * 1.4426950408889634);
    const double r = (v - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
    double p = TAYLOR[0];
    for (int i = 1; i < 11; i++) p = p * r + TAYLOR[i];
    return ldexp(p, (int)k);
}

/* Each row's experts (increasing id) and weights from its router logits [M, E]: logprobs.c's
 * top k (best first, ties to the lower id) and normaliser; each kept log-prob as Normalizer.logprobs
 * forms it ((term - shift) - log_total in float32), exp_fixed in double, rounded to float32;
 * rescaled to sum to 1 (summed best first) where the architecture does; then sorted by id. */
static void route(const bp_moe *m, const float *logits, int64_t M, int64_t *ids, float *weights) {
    const int64_t E = m->num_experts, k = m->num_used;
    float *values = malloc((size_t)(M * k) * 4), *row_max = malloc((size_t)M * 4), *log_total = malloc((size_t)M * 4);
    int64_t *counts = malloc((size_t)M * 8);
    bp_top_k_logprobs_f32(logits, M, E, k, ids, values, row_max, log_total, counts);
    for (int64_t r = 0; r < M; r++) {
        int64_t *id = ids + r * k;
        float *w = weights + r * k;
        const float mx = row_max[r], shift = isfinite(mx) ? mx : 0.0f;
        for (int64_t j = 0; j < k; j++) {
            const float v = logits[r * E + id[j]], clean = isnan(v) ? -INFINITY : v;
            const float term = mx == INFINITY ? (clean == INFINITY ? 0.0f : -INFINITY) : clean;
            const float logprob = (term - shift) - log_total[r];
            w[j] = (float)exp_fixed((double)logprob);
        }
        if (m->topk_normalised) {
            float total = w[0];
            for (int64_t j = 1; j < k; j++) total = total + w[j];
            for (int64_t j = 0; j < k; j++) w[j] = w[j] / total;
        }
        for (int64_t j = 1; j < k; j++) { /* insertion sort by id: a row's ids are distinct */
            const int64_t e = id[j];
            const float we = w[j];
            int64_t i = j;
            for (; i > 0 && id[i - 1] > e; i--) {
                id[i] = id[i - 1];
                w[i] = w[i - 1];
            }
            id[i] = e;
            w[i] = we;
        }
    }
    free(values); free(row_max); free(log_total); free(counts);
}

/* out [M, dim] = for each row, sum over its slots j in order of weights[j] * expert ids[j](h):
 * each expert once, on the rows routed to it gathered (fused gate and up, the gated activation,
 * down), each result to its (row, slot); then the sum slot by slot as moe/layer.py forms it. */
static void experts(const bp_shape *s, const bp_moe *m, const int64_t *ids, const float *weights, const float *h,
                    float *out, int64_t M, int num_threads) {
    const int64_t dim = s->dim, ffn = m->ffn, k = m->num_used;
    float *outs = malloc((size_t)(M * k * dim) * 4), *rows = malloc((size_t)(M * dim) * 4);
    float *gu = malloc((size_t)(M * 2 * ffn) * 4), *a = malloc((size_t)(M * ffn) * 4);
    float *o = malloc((size_t)(M * dim) * 4);
    int64_t *pairs = malloc((size_t)(M * k) * 8);
    for (int64_t e = 0; e < m->num_experts; e++) {
        int64_t count = 0;
        for (int64_t p = 0; p < M * k; p++) {
            if (ids[p] != e) continue;
            memcpy(rows + count * dim, h + (p / k) * dim, (size_t)dim * 4);
            pairs[count++] = p;
        }
        if (!count) continue;
        bp_weight_linear(s, m->gate_up + e, rows, NULL, gu, count, dim, 0, num_threads);
        if (s->mlp_act == BP_ACT_GELU_TANH)
            bp_gelu_tanh_mul_f32(gu, a, count, ffn, num_threads);
        else
            bp_silu_mul_f32(gu, a, count, ffn, num_threads);
        bp_weight_linear(s, m->down + e, a, NULL, o, count, ffn, 0, num_threads);
        for (int64_t c = 0; c < count; c++) memcpy(outs + pairs[c] * dim, o + c * dim, (size_t)dim * 4);
    }
    for (int64_t r = 0; r < M; r++)
        for (int64_t j = 0; j < k; j++) {
            const float *src = outs + (r * k + j) * dim, w = weights[r * k + j];
            float *dst = out + r * dim;
            for (int64_t i = 0; i < dim; i++) {
                const float term = src[i] * w;
                dst[i] = j ? dst[i] + term : term;
            }
        }
    free(outs); free(rows); free(gu); free(a); free(o); free(pairs);
}

void bp_moe_mlp(const bp_shape *s, const bp_moe *m, const float *h, float *out, int64_t M, int64_t *routes,
                int num_threads) {
    const int64_t E = m->num_experts, k = m->num_used;
    float *logits = malloc((size_t)(M * E) * 4), *weights = malloc((size_t)(M * k) * 4);
    int64_t *ids = malloc((size_t)(M * k) * 8);
    bp_weight_linear(s, &m->router, h, NULL, logits, M, s->dim, 0, num_threads);
    route(m, logits, M, ids, weights);
    if (routes) memcpy(routes, ids, (size_t)(M * k) * 8);
    experts(s, m, ids, weights, h, out, M, num_threads);
    free(logits); free(weights); free(ids);
}
