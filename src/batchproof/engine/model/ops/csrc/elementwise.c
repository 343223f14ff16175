/* The per-row pieces around the matmuls: RMS norm, rotary embedding, and the gated
 * activations SiLU and GELU-tanh through exp_poly. Each element of each row by the same
 * sequence of IEEE operations on every path, so no row depends on the others or on the
 * instruction set.
 */
#include <math.h>
#include <stdint.h>

#include "exp_poly.h"
#include "lanes.h"

/* ---------------- small per-row pieces: norm and rotary embedding ---------------- */

/* y[r] = x[r] * (1 / sqrt(mean(x[r]^2) + eps)) * w, the sum of squares a dot8. */
void bp_rms_norm_f32(const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps) {
    dot_fn dot8 = BP_PICK(bp_dot8_avx2, bp_dot8_avx2, bp_dot8_scalar);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float scale = 1.0f / sqrtf(dot8(xr, xr, dim) / (float)dim + eps);
        for (int64_t d = 0; d < dim; d++) y[r * dim + d] = (xr[d] * scale) * w[d];
    }
}

/* In place on the first `heads` heads of each row (row_stride floats apart): rotate pairs
 * by position. style 0: pairs (2i, 2i+1) as llama GGUFs store Q/K; 1: pairs (i, i + half).
 * One C loop for every instruction set, each element's multiplies and adds unfused. */
void bp_rope_f32(float *x, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_dim, int64_t rope_dim,
                 const int64_t *positions, const float *cos_table, const float *sin_table, int style) {
    int64_t half = rope_dim / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos_table + positions[r] * half, *s = sin_table + positions[r] * half;
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + r * row_stride + h * head_dim;
            for (int64_t i = 0; i < half; i++) {
                int64_t ia = style == 0 ? 2 * i : i, ib = style == 0 ? 2 * i + 1 : i + half;
                float a = v[ia], b = v[ib];
                v[ia] = a * c[i] - b * s[i];
                v[ib] = style == 0 ? a * s[i] + b * c[i] : b * c[i] + a * s[i];
            }
        }
    }
}

/* ---------------- gated activations: silu(gate) * up, gelu_tanh(gate) * up ---------------- */

/* silu(g) u = (g / (1 + exp(0 - g))) u, for each row of [gate | up]. */
static void silu_mul_scalar(const float *g, const float *u, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = (g[i] / (1.0f + exp_poly(0.0f - g[i]))) * u[i];
}

#ifdef BP_X86
/* Eight elements; the loops below mask only their tail, since a masked store (vmaskmovps)
 * costs several plain ones on some CPUs (Zen 1: the SiLU of a decode step ran 1.5x slower). */
__attribute__((target("avx2,fma")))
static inline __m256 silu_mul8(__m256 gv, __m256 uv) {
    __m256 e = exp_poly_avx2(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    return _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), uv);
}

__attribute__((target("avx2,fma")))
static void silu_mul_avx2(const float *g, const float *u, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, silu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < n) {
        __m256i mask = tail_mask_avx2(i, n);
        _mm256_maskstore_ps(y + i, mask, silu_mul8(_mm256_maskload_ps(g + i, mask), _mm256_maskload_ps(u + i, mask)));
    }
}
#endif

/* gelu_tanh(gate) * up (Gemma's MLP), through the same exp as silu_mul: 0.5 x (1 + tanh(u))
 * is x / (1 + exp(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3), which needs no tanh and
 * loses nothing to cancellation near 0. */
#define GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

static void gelu_mul_scalar(const float *g, const float *u, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = g[i], inner = GELU_C * (x + GELU_A * ((x * x) * x));
        y[i] = (x / (1.0f + exp_poly(-2.0f * inner))) * u[i];
    }
}

#ifdef BP_X86
__attribute__((target("avx2,fma")))
static inline __m256 gelu_mul8(__m256 x, __m256 uv) {
    __m256 cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 inner = _mm256_mul_ps(_mm256_set1_ps(GELU_C), _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(GELU_A), cube)));
    __m256 e = exp_poly_avx2(_mm256_mul_ps(_mm256_set1_ps(-2.0f), inner));
    return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), uv);
}

__attribute__((target("avx2,fma")))
static void gelu_mul_avx2(const float *g, const float *u, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, gelu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < n) {
        __m256i mask = tail_mask_avx2(i, n);
        _mm256_maskstore_ps(y + i, mask, gelu_mul8(_mm256_maskload_ps(g + i, mask), _mm256_maskload_ps(u + i, mask)));
    }
}
#endif

typedef void (*gated_fn)(const float *, const float *, float *, int64_t);

/* Rows split between threads (a prefill's are hundreds; each element is computed alone, so
 * the split changes no bit); a decode step's few rows stay on one. */
#define GATED_PARALLEL_ELEMS 16384

static void gated_rows(gated_fn row_fn, const float *gate_up, float *y, int64_t rows, int64_t ffn, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * ffn >= GATED_PARALLEL_ELEMS)
    for (int64_t r = 0; r < rows; r++) row_fn(gate_up + r * 2 * ffn, gate_up + r * 2 * ffn + ffn, y + r * ffn, ffn);
}

void bp_silu_mul_f32(const float *gate_up, float *y, int64_t rows, int64_t ffn, int num_threads) {
    gated_rows(BP_PICK(silu_mul_avx2, silu_mul_avx2, silu_mul_scalar), gate_up, y, rows, ffn, num_threads);
}

void bp_gelu_tanh_mul_f32(const float *gate_up, float *y, int64_t rows, int64_t ffn, int num_threads) {
    gated_rows(BP_PICK(gelu_mul_avx2, gelu_mul_avx2, gelu_mul_scalar), gate_up, y, rows, ffn, num_threads);
}
