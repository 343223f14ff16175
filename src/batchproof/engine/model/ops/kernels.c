/* Batch-invariant CPU kernels for float32 decode: matmul, attention, and the small
 * per-row pieces (norm, rotary embedding) around them.
 *
 * Why hand-written: BLAS libraries pick a different kernel, blocking and thread split
 * for each row count, so a row's sum depends on how many rows share the call (MKL here
 * changes results between 1, 2, 3 and 4 rows). In these kernels every output element
 * is one vector accumulator walking K in order, reduced across lanes in one fixed
 * sequence, computed by one thread; the row count, the row's position, the other rows
 * and the thread count only decide which register or thread does the work, never the
 * arithmetic.
 *
 * Why an extension module that uses no Python API: the functions are called through
 * ctypes (kernels.py), but building them as `batchproof.engine.model.ops._kernels` lets
 * setuptools compile them with the system's C compiler at `pip install` and put the
 * shared library where importlib finds it, with no build system of our own. The empty
 * module below exists only so the file is a valid extension; a missing compiler leaves
 * the module out (optional=True) and the engine falls back to padded torch.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <Python.h>

#include "kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define BP_X86 1
#endif


/* ---------------- linear: y[m, n] (+)= sum_k x[m, k] * w[n, k] (+ b[n]) ---------------- */

/* One tile: mt rows of x against nt rows of w. The body is inlined with constant mt, nt
 * for full tiles (so the accumulators stay in registers) and with variable ones for the
 * edges; either way each output's terms are added in the same order. The next tile's
 * weights are prefetched into L2 while this one computes. */
#ifdef BP_X86
static inline __attribute__((always_inline, target("avx512f")))
void tile_avx512_body(const float *x, const float *w, float *y, int64_t K, int64_t N, const int mt, const int nt,
                      const float *next_w) {
    __m512 acc[MT][NT];
    for (int i = 0; i < mt; i++)
        for (int j = 0; j < nt; j++) acc[i][j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 wv[NT];
        for (int j = 0; j < nt; j++) {
            wv[j] = _mm512_loadu_ps(w + j * K + k);
            _mm_prefetch((const char *)(next_w + j * K + k), _MM_HINT_T1);
        }
        for (int i = 0; i < mt; i++) {
            __m512 xv = _mm512_loadu_ps(x + i * K + k);
            for (int j = 0; j < nt; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (k < K) {
        __mmask16 mask = (__mmask16)((1u << (K - k)) - 1u);
        __m512 wv[NT];
        for (int j = 0; j < nt; j++) wv[j] = _mm512_maskz_loadu_ps(mask, w + j * K + k);
        for (int i = 0; i < mt; i++) {
            __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * K + k);
            for (int j = 0; j < nt; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < mt; i++)
        for (int j = 0; j < nt; j++) y[i * N + j] = _mm512_reduce_add_ps(acc[i][j]);
}

__attribute__((target("avx512f")))
static void tile_avx512(const float *x, const float *w, float *y, int64_t K, int64_t N, int mt, int nt,
                        const float *next_w) {
    if (nt == NT) {
        switch (mt) {
        case 4: tile_avx512_body(x, w, y, K, N, 4, NT, next_w); return;
        case 3: tile_avx512_body(x, w, y, K, N, 3, NT, next_w); return;
        case 2: tile_avx512_body(x, w, y, K, N, 2, NT, next_w); return;
        case 1: tile_avx512_body(x, w, y, K, N, 1, NT, next_w); return;
        }
    }
    tile_avx512_body(x, w, y, K, N, mt, nt, next_w);
}

__attribute__((target("avx2,fma")))
static float hsum_avx2(__m256 v) {
    /* one fixed order: (lo + hi) halves, then pairs, then the last two */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline, target("avx2,fma")))
void tile_avx2_body(const float *x, const float *w, float *y, int64_t K, int64_t N, const int mt, const int nt,
                    const float *next_w) {
    __m256 acc[MT][NT];
    for (int i = 0; i < mt; i++)
        for (int j = 0; j < nt; j++) acc[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 wv[NT];
        for (int j = 0; j < nt; j++) {
            wv[j] = _mm256_loadu_ps(w + j * K + k);
            _mm_prefetch((const char *)(next_w + j * K + k), _MM_HINT_T1);
        }
        for (int i = 0; i < mt; i++) {
            __m256 xv = _mm256_loadu_ps(x + i * K + k);
            for (int j = 0; j < nt; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (k < K) {
        int32_t lanes[8];
        for (int l = 0; l < 8; l++) lanes[l] = (k + l < K) ? -1 : 0;
        __m256i mask = _mm256_loadu_si256((const __m256i *)lanes);
        __m256 wv[NT];
        for (int j = 0; j < nt; j++) wv[j] = _mm256_maskload_ps(w + j * K + k, mask);
        for (int i = 0; i < mt; i++) {
            __m256 xv = _mm256_maskload_ps(x + i * K + k, mask);
            for (int j = 0; j < nt; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < mt; i++)
        for (int j = 0; j < nt; j++) y[i * N + j] = hsum_avx2(acc[i][j]);
}

__attribute__((target("avx2,fma")))
static void tile_avx2(const float *x, const float *w, float *y, int64_t K, int64_t N, int mt, int nt,
                      const float *next_w) {
    if (nt == NT) {
        switch (mt) {
        case 4: tile_avx2_body(x, w, y, K, N, 4, NT, next_w); return;
        case 3: tile_avx2_body(x, w, y, K, N, 3, NT, next_w); return;
        case 2: tile_avx2_body(x, w, y, K, N, 2, NT, next_w); return;
        case 1: tile_avx2_body(x, w, y, K, N, 1, NT, next_w); return;
        }
    }
    tile_avx2_body(x, w, y, K, N, mt, nt, next_w);
}
#endif

/* Portable path: 8 interleaved partial sums per output, combined in a fixed order
 * (built with -ffp-contract=off, so no compiler decides to fuse some of them). */
static void tile_scalar(const float *x, const float *w, float *y, int64_t K, int64_t N, int mt, int nt,
                        const float *next_w) {
    (void)next_w;
    for (int i = 0; i < mt; i++)
        for (int j = 0; j < nt; j++) {
            float part[8] = {0};
            for (int64_t k = 0; k < K; k++) part[k & 7] += x[i * K + k] * w[j * K + k];
            y[i * N + j] = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
        }
}

static int isa_cap = 2; /* lowered by tests, to run the AVX2 and portable paths here too */

static int isa_level(void) {
    int level = 0;
#ifdef BP_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) level = 2;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        level = 1;
#endif
    return level < isa_cap ? level : isa_cap;
}

void bp_cap_isa_level(int cap) { isa_cap = cap; }

tile_fn bp_pick_tile(void) {
#ifdef BP_X86
    switch (isa_level()) {
    case 2: return tile_avx512;
    case 1: return tile_avx2;
    }
#endif
    return tile_scalar;
}

/* 2: AVX-512, 1: AVX2+FMA+F16C, 0: portable. Results are invariant within one level. */
int bp_isa_level(void) { return isa_level(); }

/* y = x @ w^T (+ b), or with accumulate, y += x @ w^T (+ b): the residual add done as
 * the output is written, one rounding per add as in torch's `y + linear(x)`. */
void bp_linear_f32(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t N, int64_t K,
                   int accumulate, int num_threads) {
    tile_fn tile = bp_pick_tile();
    int64_t num_tiles = (N + NT - 1) / NT;
    /* Threads split outputs, never K: each output is summed by exactly one thread. */
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t t = 0; t < num_tiles; t++) {
        int64_t n = t * NT;
        int nt = (int)(N - n < NT ? N - n : NT);
        const float *next_w = w + (t + 1 < num_tiles ? n + NT : n) * K;
        float sums[MT * NT];
        for (int64_t m = 0; m < M; m += MT) {
            int mt = (int)(M - m < MT ? M - m : MT);
            tile(x + m * K, w + n * K, sums, K, NT, mt, nt, m == 0 ? next_w : w + n * K);
            bp_store_tile(sums, b, y, m, n, mt, nt, N, accumulate);
        }
    }
}

/* ---------------- small per-row pieces: norm and rotary embedding ---------------- */

/* y[r] = x[r] * (1 / sqrt(mean(x[r]^2) + eps)) * w, the sum of squares in 8 fixed
 * interleaved partial sums. */
void bp_rms_norm_f32(const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float part[8] = {0};
        for (int64_t d = 0; d < dim; d++) part[d & 7] += xr[d] * xr[d];
        float total = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
        float scale = 1.0f / sqrtf(total / (float)dim + eps);
        for (int64_t d = 0; d < dim; d++) y[r * dim + d] = (xr[d] * scale) * w[d];
    }
}

/* In place on the first `heads` heads of each row (row_stride floats apart): rotate pairs
 * by position. style 0: pairs (2i, 2i+1) as llama GGUFs store Q/K; 1: pairs (i, i + half). */
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

/* silu(gate) * up for each row of [gate | up]. torch would run the tail of a range in
 * scalar code (glibc expf) and the rest in vector code (another exp), so an element's
 * bits would depend on where the row count puts the range ends; here every element goes
 * through the same code: one exp polynomial (Cephes' expf), masked at the end of a row. */
#define EXP_HI 88.3762626647949f
#define EXP_LO -88.3762626647949f
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO -2.12194440e-4f

static float exp_poly(float x) {
    x = x > EXP_HI ? EXP_HI : (x < EXP_LO ? EXP_LO : x);
    float n = nearbyintf(x * LOG2E);
    float r = (x - n * LN2_HI) - n * LN2_LO;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = (p * (r * r) + r) + 1.0f;
    return ldexpf(p, (int)n);
}

static void silu_mul_scalar(const float *g, const float *u, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = (g[i] / (1.0f + exp_poly(-g[i]))) * u[i];
}

#ifdef BP_X86
__attribute__((target("avx512f")))
static __m512 exp_poly_avx512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(LN2_HI))),
                             _mm512_mul_ps(n, _mm512_set1_ps(LN2_LO)));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

__attribute__((target("avx512f")))
static void silu_mul_avx512(const float *g, const float *u, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 mask = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512 gv = _mm512_maskz_loadu_ps(mask, g + i), uv = _mm512_maskz_loadu_ps(mask, u + i);
        __m512 e = exp_poly_avx512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        __m512 s = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_mask_storeu_ps(y + i, mask, _mm512_mul_ps(s, uv));
    }
}

/* The same polynomial eight lanes wide (AVX2 has no scalef: 2^n as two exact halves, so
 * that n down to -128 and up to 128 stays within the exponent's range). */
__attribute__((target("avx2,fma")))
static __m256 exp_poly_avx2(__m256 x) {
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

/* Lanes k..k+7 of a row of n: all-ones where k + lane < n (the row's tail is masked). */
__attribute__((target("avx2,fma")))
static __m256i tail_mask_avx2(int64_t k, int64_t n) {
    int left = (int)(n - k < 8 ? n - k : 8);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

__attribute__((target("avx2,fma")))
static void silu_mul_avx2(const float *g, const float *u, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        __m256i mask = tail_mask_avx2(i, n);
        __m256 gv = _mm256_maskload_ps(g + i, mask), uv = _mm256_maskload_ps(u + i, mask);
        __m256 e = exp_poly_avx2(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_maskstore_ps(y + i, mask, _mm256_mul_ps(s, uv));
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
        float x = g[i], inner = GELU_C * (x + GELU_A * (x * x * x));
        y[i] = (x / (1.0f + exp_poly(-2.0f * inner))) * u[i];
    }
}

#ifdef BP_X86
__attribute__((target("avx512f")))
static void gelu_mul_avx512(const float *g, const float *u, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 mask = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512 x = _mm512_maskz_loadu_ps(mask, g + i), uv = _mm512_maskz_loadu_ps(mask, u + i);
        __m512 cube = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
        __m512 inner = _mm512_mul_ps(_mm512_set1_ps(GELU_C),
                                     _mm512_add_ps(x, _mm512_mul_ps(_mm512_set1_ps(GELU_A), cube)));
        __m512 e = exp_poly_avx512(_mm512_mul_ps(_mm512_set1_ps(-2.0f), inner));
        __m512 s = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_mask_storeu_ps(y + i, mask, _mm512_mul_ps(s, uv));
    }
}
#endif

#ifdef BP_X86
__attribute__((target("avx2,fma")))
static void gelu_mul_avx2(const float *g, const float *u, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        __m256i mask = tail_mask_avx2(i, n);
        __m256 x = _mm256_maskload_ps(g + i, mask), uv = _mm256_maskload_ps(u + i, mask);
        __m256 cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        __m256 inner = _mm256_mul_ps(_mm256_set1_ps(GELU_C),
                                     _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(GELU_A), cube)));
        __m256 e = exp_poly_avx2(_mm256_mul_ps(_mm256_set1_ps(-2.0f), inner));
        __m256 s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_maskstore_ps(y + i, mask, _mm256_mul_ps(s, uv));
    }
}
#endif

void bp_gelu_tanh_mul_f32(const float *gate_up, float *y, int64_t rows, int64_t ffn) {
    void (*row_fn)(const float *, const float *, float *, int64_t) = gelu_mul_scalar;
#ifdef BP_X86
    if (isa_level() == 2) row_fn = gelu_mul_avx512;
    else if (isa_level() == 1) row_fn = gelu_mul_avx2;
#endif
    for (int64_t r = 0; r < rows; r++) row_fn(gate_up + r * 2 * ffn, gate_up + r * 2 * ffn + ffn, y + r * ffn, ffn);
}

void bp_silu_mul_f32(const float *gate_up, float *y, int64_t rows, int64_t ffn) {
    void (*row_fn)(const float *, const float *, float *, int64_t) = silu_mul_scalar;
#ifdef BP_X86
    if (isa_level() == 2) row_fn = silu_mul_avx512;
    else if (isa_level() == 1) row_fn = silu_mul_avx2;
#endif
    for (int64_t r = 0; r < rows; r++) row_fn(gate_up + r * 2 * ffn, gate_up + r * 2 * ffn + ffn, y + r * ffn, ffn);
}

/* ---------------- logprobs: each row's normaliser and top k, in one pass ---------------- */

/* Per row of [B, V] logits: the best k ids (NaN never ranked; ties to the lower id, since
 * ids are visited in order and only a strictly better value displaces a kept one), and
 * (max, log_total) with logprob = (term - shift) - log_total, shift the max (0 if it is
 * not finite), term the logit, or for a row holding +inf: 0 for its +inf entries and
 * -inf for the rest. The sum of
 * exp(term - shift) runs in one fixed order per row (16 lanes, one fixed reduction). */
static double row_exp_sum(const float *x, int64_t V, float shift, int has_inf);

#ifdef BP_X86
__attribute__((target("avx512f")))
static double row_exp_sum_avx512(const float *x, int64_t V, float shift) {
    __m512 acc = _mm512_setzero_ps(), s = _mm512_set1_ps(shift), ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < V; i += 16) {
        __mmask16 mask = V - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (V - i)) - 1u);
        __m512 v = _mm512_mask_loadu_ps(ninf, mask, x + i);
        /* NaN and -inf add nothing */
        __mmask16 live = _mm512_cmp_ps_mask(v, ninf, _CMP_GT_OQ) & mask;
        __m512 e = exp_poly_avx512(_mm512_sub_ps(v, s));
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(live, e));
    }
    return (double)_mm512_reduce_add_ps(acc);
}
#endif

#ifdef BP_X86
__attribute__((target("avx2,fma")))
static double row_exp_sum_avx2(const float *x, int64_t V, float shift) {
    __m256 acc = _mm256_setzero_ps(), s = _mm256_set1_ps(shift), ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t i = 0; i < V; i += 8) {
        __m256i mask = tail_mask_avx2(i, V);
        __m256 v = _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + i, mask), _mm256_castsi256_ps(mask));
        /* NaN and -inf add nothing */
        __m256 live = _mm256_cmp_ps(v, ninf, _CMP_GT_OQ);
        __m256 e = exp_poly_avx2(_mm256_sub_ps(v, s));
        acc = _mm256_add_ps(acc, _mm256_and_ps(live, e));
    }
    return (double)hsum_avx2(acc);
}
#endif

static double row_exp_sum(const float *x, int64_t V, float shift, int has_inf) {
    if (has_inf) {  /* only the +inf entries carry mass, one each */
        double n = 0;
        for (int64_t i = 0; i < V; i++) n += x[i] == INFINITY;
        return n;
    }
#ifdef BP_X86
    if (isa_level() == 2) return row_exp_sum_avx512(x, V, shift);
    if (isa_level() == 1) return row_exp_sum_avx2(x, V, shift);
#endif
    float part[8] = {0};
    for (int64_t i = 0; i < V; i++)
        if (x[i] > -INFINITY) part[i & 7] += exp_poly(x[i] - shift);
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

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
        log_total[b] = finite_or_inf ? logf((float)row_exp_sum(x, V, row_shift, has_inf)) : -INFINITY;
    }
}

/* ---------------- decode attention, one sequence at a time ---------------- */

/* One query head against its sequence's L keys: softmax(q.k * scale) @ v, every sum in
 * position order. scores has room for L floats. */
static void attend_scalar(const float *q, const float *keys, const float *values, float *o, float *scores,
                          int64_t L, int64_t D, float scale) {
    float max_score = -INFINITY;
    for (int64_t j = 0; j < L; j++) {
        float part[8] = {0};
        for (int64_t d = 0; d < D; d++) part[d & 7] += q[d] * keys[j * D + d];
        scores[j] = (((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]))) * scale;
        if (scores[j] > max_score) max_score = scores[j];
    }
    float total = 0.0f;
    for (int64_t j = 0; j < L; j++) {
        scores[j] = expf(scores[j] - max_score);
        total += scores[j];
    }
    for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
    for (int64_t j = 0; j < L; j++)
        for (int64_t d = 0; d < D; d++) o[d] += scores[j] * values[j * D + d];
    float inv = 1.0f / total;
    for (int64_t d = 0; d < D; d++) o[d] *= inv;
}

/* The vector versions below keep attend_scalar's structure but not its lanes: each key's
 * score is one vector accumulator over D, then one horizontal sum; each output lane is one
 * accumulator over the keys in position order. Four keys' scores, and several lanes of
 * the output, are in flight at once only to hide FMA latency: they are independent
 * chains, so the bits of every element are those of the one-at-a-time loop. */
#ifdef BP_X86
__attribute__((target("avx512f")))
static void attend_avx512(const float *q, const float *keys, const float *values, float *o, float *scores,
                          int64_t L, int64_t D, float scale) {
    if (D % 64 != 0) {
        attend_scalar(q, keys, values, o, scores, L, D, scale);
        return;
    }
    float max_score = -INFINITY;
    int64_t j = 0;
    for (; j + 4 <= L; j += 4) {
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
        const float *k0 = keys + j * D;
        for (int64_t d = 0; d < D; d += 16) {
            __m512 qv = _mm512_loadu_ps(q + d);
            a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + d), a0);
            a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + D + d), a1);
            a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + 2 * D + d), a2);
            a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + 3 * D + d), a3);
        }
        scores[j] = _mm512_reduce_add_ps(a0) * scale;
        scores[j + 1] = _mm512_reduce_add_ps(a1) * scale;
        scores[j + 2] = _mm512_reduce_add_ps(a2) * scale;
        scores[j + 3] = _mm512_reduce_add_ps(a3) * scale;
    }
    for (; j < L; j++) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d += 16)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(keys + j * D + d), acc);
        scores[j] = _mm512_reduce_add_ps(acc) * scale;
    }
    for (j = 0; j < L; j++)
        if (scores[j] > max_score) max_score = scores[j];
    float total = 0.0f;
    for (j = 0; j < L; j++) {
        scores[j] = expf(scores[j] - max_score);
        total += scores[j];
    }
    __m512 inv = _mm512_set1_ps(1.0f / total);
    for (int64_t d = 0; d < D; d += 64) {  /* four lanes' accumulators at a time */
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
        for (j = 0; j < L; j++) {
            __m512 p = _mm512_set1_ps(scores[j]);
            const float *vr = values + j * D + d;
            a0 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vr), a0);
            a1 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vr + 16), a1);
            a2 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vr + 32), a2);
            a3 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vr + 48), a3);
        }
        _mm512_storeu_ps(o + d, _mm512_mul_ps(a0, inv));
        _mm512_storeu_ps(o + d + 16, _mm512_mul_ps(a1, inv));
        _mm512_storeu_ps(o + d + 32, _mm512_mul_ps(a2, inv));
        _mm512_storeu_ps(o + d + 48, _mm512_mul_ps(a3, inv));
    }
}

__attribute__((target("avx2,fma")))
static void attend_avx2(const float *q, const float *keys, const float *values, float *o, float *scores,
                        int64_t L, int64_t D, float scale) {
    if (D % 64 != 0) {
        attend_scalar(q, keys, values, o, scores, L, D, scale);
        return;
    }
    float max_score = -INFINITY;
    int64_t j = 0;
    for (; j + 4 <= L; j += 4) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        const float *k0 = keys + j * D;
        for (int64_t d = 0; d < D; d += 8) {
            __m256 qv = _mm256_loadu_ps(q + d);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + D + d), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * D + d), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * D + d), a3);
        }
        scores[j] = hsum_avx2(a0) * scale;
        scores[j + 1] = hsum_avx2(a1) * scale;
        scores[j + 2] = hsum_avx2(a2) * scale;
        scores[j + 3] = hsum_avx2(a3) * scale;
    }
    for (; j < L; j++) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(keys + j * D + d), acc);
        scores[j] = hsum_avx2(acc) * scale;
    }
    for (j = 0; j < L; j++)
        if (scores[j] > max_score) max_score = scores[j];
    float total = 0.0f;
    for (j = 0; j < L; j++) {
        scores[j] = expf(scores[j] - max_score);
        total += scores[j];
    }
    __m256 inv = _mm256_set1_ps(1.0f / total);
    for (int64_t d = 0; d < D; d += 64) {  /* eight lanes' accumulators at a time */
        __m256 a[8];
        for (int c = 0; c < 8; c++) a[c] = _mm256_setzero_ps();
        for (j = 0; j < L; j++) {
            __m256 p = _mm256_set1_ps(scores[j]);
            const float *vr = values + j * D + d;
            for (int c = 0; c < 8; c++) a[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vr + 8 * c), a[c]);
        }
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(o + d + 8 * c, _mm256_mul_ps(a[c], inv));
    }
}
#endif

typedef void (*attend_fn)(const float *, const float *, const float *, float *, float *, int64_t, int64_t, float);

/* The first key a query of length L sees: with a sliding window W (0: none) the row at
 * position L - 1 attends keys max(0, L - W)..L - 1. */
static inline int64_t window_start(int64_t L, int64_t window) { return window > 0 && L > window ? L - window : 0; }

/* q: [B, H, D]; caches: [slots, KVH, max_len, D] for one layer; out: [B, H, D].
 * Row b attends to positions window_start..lengths[b]-1 of slot slots[b]: only its own
 * keys, in order, so its result never depends on the other rows. */
void bp_decode_attention_f32(const float *q, const float *k_cache, const float *v_cache, float *out,
                             const int64_t *slots, const int64_t *lengths, int64_t B, int64_t H, int64_t KVH,
                             int64_t D, int64_t max_len, int64_t window, float scale, int num_threads) {
    attend_fn attend = attend_scalar;
#ifdef BP_X86
    switch (isa_level()) {
    case 2: attend = attend_avx512; break;
    case 1: attend = attend_avx2; break;
    }
#endif
    int64_t group = H / KVH;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t bh = 0; bh < B * H; bh++) {
        int64_t b = bh / H, h = bh % H, lo = window_start(lengths[b], window), L = lengths[b] - lo;
        int64_t base = ((slots[b] * KVH + h / group) * max_len + lo) * D;
        float *scores = (float *)PyMem_RawMalloc((size_t)L * sizeof(float));
        attend(q + bh * D, k_cache + base, v_cache + base, out + bh * D, scores, L, D, scale);
        PyMem_RawFree(scores);
    }
}

/* ---------------- prompt attention: consecutive rows of one slot ---------------- */

#define PROMPT_ROWS 4

#ifdef BP_X86
/* R <= PROMPT_ROWS query rows of one head at consecutive positions; row r attends keys
 * 0..L0+r-1. Each key and value row is loaded once for all R rows (the reason this
 * exists: one row at a time reads every key R times), but every row's arithmetic is
 * attend_avx2's: a key's score is one accumulator over D then one horizontal sum, an
 * output lane one accumulator over the keys in order. So a prompt row has the bits of a
 * decode step at its position. Needs D % 16 == 0. */
__attribute__((target("avx2,fma")))
static void attend_rows_avx2(const float *q, int64_t q_stride, const float *keys, const float *values, float *o,
                             int64_t o_stride, float *scores, int R, int64_t L0, int64_t D, float scale) {
    int64_t S = L0 + R;  /* each row's stretch of `scores` */
    int64_t j = 0;
    for (; j < L0; j++) {  /* keys every row sees */
        __m256 acc[PROMPT_ROWS];
        for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) {
            __m256 kv = _mm256_loadu_ps(keys + j * D + d);
            for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * q_stride + d), kv, acc[r]);
        }
        for (int r = 0; r < R; r++) scores[r * S + j] = hsum_avx2(acc[r]) * scale;
    }
    for (int r = 1; r < R; r++)  /* the later rows' own last keys */
        for (j = L0; j < L0 + r; j++) {
            __m256 acc = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 8)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * q_stride + d), _mm256_loadu_ps(keys + j * D + d), acc);
            scores[r * S + j] = hsum_avx2(acc) * scale;
        }
    float inv[PROMPT_ROWS];
    for (int r = 0; r < R; r++) {
        float *sr = scores + r * S, max_score = -INFINITY, total = 0.0f;
        int64_t L = L0 + r;
        for (j = 0; j < L; j++)
            if (sr[j] > max_score) max_score = sr[j];
        for (j = 0; j < L; j++) {
            sr[j] = expf(sr[j] - max_score);
            total += sr[j];
        }
        inv[r] = 1.0f / total;
    }
    for (int64_t d = 0; d < D; d += 16) {
        __m256 a0[PROMPT_ROWS], a1[PROMPT_ROWS];
        for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_ps();
        for (j = 0; j < L0; j++) {
            __m256 v0 = _mm256_loadu_ps(values + j * D + d), v1 = _mm256_loadu_ps(values + j * D + d + 8);
            for (int r = 0; r < R; r++) {
                __m256 p = _mm256_set1_ps(scores[r * S + j]);
                a0[r] = _mm256_fmadd_ps(p, v0, a0[r]);
                a1[r] = _mm256_fmadd_ps(p, v1, a1[r]);
            }
        }
        for (int r = 0; r < R; r++) {
            for (j = L0; j < L0 + r; j++) {
                __m256 p = _mm256_set1_ps(scores[r * S + j]);
                a0[r] = _mm256_fmadd_ps(p, _mm256_loadu_ps(values + j * D + d), a0[r]);
                a1[r] = _mm256_fmadd_ps(p, _mm256_loadu_ps(values + j * D + d + 8), a1[r]);
            }
            __m256 iv = _mm256_set1_ps(inv[r]);
            _mm256_storeu_ps(o + r * o_stride + d, _mm256_mul_ps(a0[r], iv));
            _mm256_storeu_ps(o + r * o_stride + d + 8, _mm256_mul_ps(a1[r], iv));
        }
    }
}
#endif

/* q, out: [n, H, D] at positions start..start+n-1 of one slot, whose keys are already in
 * the cache; row i attends positions window_start..start+i. Equal, row for row, to
 * bp_decode_attention_f32 with lengths start+1..start+n and the same window. */
void bp_prompt_attention_f32(const float *q, const float *k_cache, const float *v_cache, float *out, int64_t slot,
                             int64_t start, int64_t n, int64_t H, int64_t KVH, int64_t D, int64_t max_len,
                             int64_t window, float scale, int num_threads) {
    attend_fn attend = attend_scalar;
    int rows_at_once = 0;
#ifdef BP_X86
    switch (isa_level()) {
    case 2: attend = attend_avx512; break;
    case 1: attend = attend_avx2; rows_at_once = D % 64 == 0; break;
    }
#endif
    int64_t group = H / KVH, blocks = (n + PROMPT_ROWS - 1) / PROMPT_ROWS;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t bh = 0; bh < blocks * H; bh++) {
        /* The last blocks hold the longest rows: hand them out first. */
        int64_t blk = blocks - 1 - bh / H, h = bh % H, r0 = blk * PROMPT_ROWS;
        int R = (int)(n - r0 < PROMPT_ROWS ? n - r0 : PROMPT_ROWS);
        int64_t L0 = start + r0 + 1;
        const float *keys = k_cache + (slot * KVH + h / group) * max_len * D;
        const float *values = v_cache + (slot * KVH + h / group) * max_len * D;
        float *scores = (float *)PyMem_RawMalloc((size_t)(L0 + R) * R * sizeof(float));
#ifdef BP_X86
        /* Rows that share key 0 share their loads; once the window cuts in, each row runs alone. */
        if (rows_at_once && window_start(L0 + R - 1, window) == 0) {
            attend_rows_avx2(q + (r0 * H + h) * D, H * D, keys, values, out + (r0 * H + h) * D, H * D, scores, R, L0,
                             D, scale);
            PyMem_RawFree(scores);
            continue;
        }
#endif
        for (int r = 0; r < R; r++) {
            int64_t lo = window_start(L0 + r, window);
            attend(q + ((r0 + r) * H + h) * D, keys + lo * D, values + lo * D, out + ((r0 + r) * H + h) * D, scores,
                   L0 + r - lo, D, scale);
        }
        PyMem_RawFree(scores);
    }
}

/* Importable as a module too, so setuptools can build it; all use goes through ctypes. */
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", "batch-invariant CPU kernels", -1, NULL};
PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
