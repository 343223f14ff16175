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
 * Why the same bits on every x86 host: replicas of one server may run on machines with
 * AVX-512, with only AVX2, or on the portable build, and must give the same logits and
 * logprobs. So the instruction set only decides how fast an operation runs, never which
 * operations run: every reduction has one logical layout (8 lanes, lane l fusing the
 * terms k = l mod 8 in increasing k, a zero-padded tail, then the tree of sum8), every
 * elementwise function one sequence of IEEE operations (fused exactly where the vector
 * code fuses: the portable code calls fmaf there, and the build's -ffp-contract=off
 * keeps the compiler from fusing anything else), and nothing calls libm's expf or logf,
 * whose last bit depends on the host's libm and which of its variants the CPU selects.
 * NUMERICS_VERSION names this arithmetic; change it whenever any kernel's bits change.
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

#define NUMERICS_VERSION "fixed-order-w8-v1"

/* The server puts this into the identity of its numbers: replicas agree bit for bit
 * exactly when their kernels report the same version. */
const char *bp_numerics_version(void) { return NUMERICS_VERSION; }

/* ---------------- instruction set: speed only, never bits ---------------- */

static int isa_cap = 2; /* lowered by tests, to run the AVX2 and portable paths here too */

static int detected_level = -1; /* the CPU's, found once (the matmuls ask per call) */

static int isa_level(void) {
    if (detected_level < 0) {
        int level = 0;
#ifdef BP_X86
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) level = 2;
        else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
            level = 1;
#endif
        detected_level = level; /* threads racing here all write the same value */
    }
    return detected_level < isa_cap ? detected_level : isa_cap;
}

void bp_cap_isa_level(int cap) { isa_cap = cap; }

/* 2: AVX-512 (the AVX2 code, with 32 vector registers for the matmul tile), 1: AVX2 + FMA
 * + F16C, 0: portable. Every level gives the same bits; only the speed differs. */
int bp_isa_level(void) { return isa_level(); }

/* ---------------- the one fixed-order sum ---------------- */

/* Eight lanes into one: lane l with lane l + 4, then the pairs (0, 2) and (1, 3) of those,
 * then the last two. hsum_avx2 is this tree in vector registers. */
static inline float sum8(const float lane[8]) {
    float t0 = lane[0] + lane[4], t1 = lane[1] + lane[5], t2 = lane[2] + lane[6], t3 = lane[3] + lane[7];
    return (t0 + t2) + (t1 + t3);
}

/* sum_k a[k] * b[k] in the 8-lane layout. The tail is zero-padded as the vector code's
 * masked loads pad it: fma(0, 0, -0) is +0, so a padded lane's sign of zero depends on
 * the padding being there. Cloned for CPUs with FMA (but maybe no AVX2), where fmaf is
 * an instruction rather than a libm call: fmaf rounds once, exactly, either way. */
__attribute__((target_clones("fma", "default")))
static float dot8_scalar(const float *a, const float *b, int64_t K) {
    float lane[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8)
        for (int l = 0; l < 8; l++) lane[l] = fmaf(a[k + l], b[k + l], lane[l]);
    if (k < K)
        for (int l = 0; l < 8; l++) lane[l] = k + l < K ? fmaf(a[k + l], b[k + l], lane[l]) : fmaf(0.0f, 0.0f, lane[l]);
    return sum8(lane);
}

#ifdef BP_X86
/* Lanes k..k+7 of a row of n: all-ones where k + lane < n (the row's tail is masked). */
__attribute__((target("avx2,fma")))
static inline __m256i tail_mask_avx2(int64_t k, int64_t n) {
    int left = (int)(n - k < 8 ? n - k : 8);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* dot8_scalar in one register. */
__attribute__((target("avx2,fma")))
static float dot8_avx2(const float *a, const float *b, int64_t K) {
    __m256 acc = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
    if (k < K) {
        __m256i mask = tail_mask_avx2(k, K);
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + k, mask), _mm256_maskload_ps(b + k, mask), acc);
    }
    return hsum_avx2(acc);
}
#endif

typedef float (*dot_fn)(const float *, const float *, int64_t);

static dot_fn pick_dot8(void) {
#ifdef BP_X86
    if (isa_level() >= 1) return dot8_avx2;
#endif
    return dot8_scalar;
}


/* ---------------- linear: y[m, n] (+)= sum_k x[m, k] * w[n, k] (+ b[n]) ---------------- */

/* One tile: mt rows of x against nt rows of w, each output dot8's sum. The body is
 * inlined with constant mt, nt for full tiles (so the accumulators stay in registers) and
 * with variable ones for the edges; either way each output's terms are added in the same
 * order. The next tile's weights are prefetched into L2 while this one computes. */
#ifdef BP_X86
static inline __attribute__((always_inline, target("avx2,fma")))
void tile_ymm_body(const float *x, const float *w, float *y, int64_t K, int64_t N, const int mt, const int nt,
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
        __m256i mask = tail_mask_avx2(k, K);
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

/* Full tiles get the body inlined with constant mt and nt (accumulators in registers); the
 * edges get it with variable ones. A macro, since each ISA's function must inline it under
 * its own target attribute. */
#define TILE_YMM_DISPATCH                                                       \
    if (nt == NT && mt <= 2) {                                                  \
        if (mt == 2) tile_ymm_body(x, w, y, K, N, 2, NT, next_w);              \
        else tile_ymm_body(x, w, y, K, N, 1, NT, next_w);                      \
        return;                                                                 \
    }                                                                           \
    if (nt == NT_BATCH) {                                                       \
        switch (mt) {                                                           \
        case 4: tile_ymm_body(x, w, y, K, N, 4, NT_BATCH, next_w); return;      \
        case 3: tile_ymm_body(x, w, y, K, N, 3, NT_BATCH, next_w); return;      \
        case 2: tile_ymm_body(x, w, y, K, N, 2, NT_BATCH, next_w); return;      \
        case 1: tile_ymm_body(x, w, y, K, N, 1, NT_BATCH, next_w); return;      \
        }                                                                       \
    }                                                                           \
    tile_ymm_body(x, w, y, K, N, mt, nt, next_w)

__attribute__((target("avx2,fma")))
static void tile_avx2(const float *x, const float *w, float *y, int64_t K, int64_t N, int mt, int nt,
                      const float *next_w) {
    TILE_YMM_DISPATCH;
}

/* The same source compiled for AVX-512: still 8-lane (ymm) FMAs, since 16-lane
 * accumulators would sum other terms together, but with the 32 registers of AVX512VL the
 * 16 accumulators and their operands fit without spilling. */
__attribute__((target("avx2,fma,avx512f,avx512vl")))
static void tile_avx512(const float *x, const float *w, float *y, int64_t K, int64_t N, int mt, int nt,
                        const float *next_w) {
    TILE_YMM_DISPATCH;
}
#endif

static void tile_scalar(const float *x, const float *w, float *y, int64_t K, int64_t N, int mt, int nt,
                        const float *next_w) {
    (void)next_w;
    for (int i = 0; i < mt; i++)
        for (int j = 0; j < nt; j++) y[i * N + j] = dot8_scalar(x + i * K, w + j * K, K);
}

tile_fn bp_pick_tile(void) {
#ifdef BP_X86
    switch (isa_level()) {
    case 2: return tile_avx512;
    case 1: return tile_avx2;
    }
#endif
    return tile_scalar;
}

/* y = x @ w^T (+ b), or with accumulate, y += x @ w^T (+ b): the residual add done as
 * the output is written, one rounding per add as in torch's `y + linear(x)`. */
void bp_linear_f32(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t N, int64_t K,
                   int accumulate, int num_threads) {
    tile_fn tile = bp_pick_tile();
    const int width = bp_tile_width(M);
    int64_t num_tiles = (N + width - 1) / width;
    /* Threads split outputs, never K: each output is summed by exactly one thread. */
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t t = 0; t < num_tiles; t++) {
        int64_t n = t * width;
        int nt = (int)(N - n < width ? N - n : width);
        const float *next_w = w + (t + 1 < num_tiles ? n + width : n) * K;
        float sums[MT * NT];
        for (int64_t m = 0; m < M; m += MT) {
            int mt = (int)(M - m < MT ? M - m : MT);
            tile(x + m * K, w + n * K, sums, K, NT, mt, nt, m == 0 ? next_w : w + n * K);
            bp_store_tile(sums, NT, b, y, m, n, mt, nt, N, accumulate);
        }
    }
}

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

/* ---------------- small per-row pieces: norm and rotary embedding ---------------- */

/* y[r] = x[r] * (1 / sqrt(mean(x[r]^2) + eps)) * w, the sum of squares a dot8. */
void bp_rms_norm_f32(const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps) {
    dot_fn dot8 = pick_dot8();
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

/* ---------------- the exp every path uses: SiLU, GELU, softmax, the normaliser ---------------- */

/* Cephes' expf polynomial, clamped to float's range: n = round(x log2 e), r = x - n ln 2 in
 * two parts, e^r by the polynomial, times 2^n. Every operation rounds on its own (nothing
 * fused), and the vector versions run the same operations lane by lane. torch would run
 * the tail of a range in scalar code (glibc expf) and the rest in vector code (another
 * exp), so an element's bits would depend on where the row count puts the range ends;
 * libm's expf alone would still differ between hosts' libm builds and CPU variants. */
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

static float exp_poly(float x) {
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
#endif

/* ---------------- gated activations: silu(gate) * up, gelu_tanh(gate) * up ---------------- */

/* silu(g) u = (g / (1 + exp(0 - g))) u, for each row of [gate | up]. */
static void silu_mul_scalar(const float *g, const float *u, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = (g[i] / (1.0f + exp_poly(0.0f - g[i]))) * u[i];
}

#ifdef BP_X86
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
        float x = g[i], inner = GELU_C * (x + GELU_A * ((x * x) * x));
        y[i] = (x / (1.0f + exp_poly(-2.0f * inner))) * u[i];
    }
}

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

typedef void (*gated_fn)(const float *, const float *, float *, int64_t);

static void gated_rows(gated_fn row_fn, const float *gate_up, float *y, int64_t rows, int64_t ffn) {
    for (int64_t r = 0; r < rows; r++) row_fn(gate_up + r * 2 * ffn, gate_up + r * 2 * ffn + ffn, y + r * ffn, ffn);
}

void bp_silu_mul_f32(const float *gate_up, float *y, int64_t rows, int64_t ffn) {
    gated_fn row_fn = silu_mul_scalar;
#ifdef BP_X86
    if (isa_level() >= 1) row_fn = silu_mul_avx2;
#endif
    gated_rows(row_fn, gate_up, y, rows, ffn);
}

void bp_gelu_tanh_mul_f32(const float *gate_up, float *y, int64_t rows, int64_t ffn) {
    gated_fn row_fn = gelu_mul_scalar;
#ifdef BP_X86
    if (isa_level() >= 1) row_fn = gelu_mul_avx2;
#endif
    gated_rows(row_fn, gate_up, y, rows, ffn);
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
    for (int64_t i = 0; i < V; i += 8) {
        __m256i mask = tail_mask_avx2(i, V);
        __m256 v = _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + i, mask), _mm256_castsi256_ps(mask));
        __m256 live = _mm256_cmp_ps(v, ninf, _CMP_GT_OQ);
        __m256 e = exp_poly_avx2(_mm256_sub_ps(v, s));
        acc = _mm256_add_ps(acc, _mm256_and_ps(live, e));
    }
    return hsum_avx2(acc);
}
#endif

/* The row's total mass: a row holding +inf has all of it on its +inf entries, one each. */
static float row_exp_sum(const float *x, int64_t V, float shift, int has_inf) {
    if (has_inf) {
        int64_t n = 0;
        for (int64_t i = 0; i < V; i++) n += x[i] == INFINITY;
        return (float)n;
    }
#ifdef BP_X86
    if (isa_level() >= 1) return row_exp_sum_avx2(x, V, shift);
#endif
    return row_exp_sum_scalar(x, V, shift);
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

/* ---------------- decode attention, one sequence at a time ---------------- */

/* Softmax in three steps that every path shares: the largest score, each score's exp
 * less it (exp_poly, lane by lane), and 1 / their total, summed in key order. */
static float max_score(const float *s, int64_t L) {
    float top = -INFINITY;
    for (int64_t j = 0; j < L; j++)
        if (s[j] > top) top = s[j];
    return top;
}

static void exp_shifted_scalar(float *s, int64_t L, float shift) {
    for (int64_t j = 0; j < L; j++) s[j] = exp_poly(s[j] - shift);
}

static float inverse_total(const float *s, int64_t L) {
    float total = 0.0f;
    for (int64_t j = 0; j < L; j++) total += s[j];
    return 1.0f / total;
}

/* One query head against its sequence's L keys: softmax(q.k * scale) @ v. A key's score
 * is a dot8 over D; an output lane is one fused accumulator over the keys in position
 * order. scores has room for L floats. */
static void attend_scalar(const float *q, const float *keys, const float *values, float *o, float *scores,
                          int64_t L, int64_t D, float scale) {
    for (int64_t j = 0; j < L; j++) scores[j] = dot8_scalar(q, keys + j * D, D) * scale;
    exp_shifted_scalar(scores, L, max_score(scores, L));
    float inv = inverse_total(scores, L);
    for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
    for (int64_t j = 0; j < L; j++)
        for (int64_t d = 0; d < D; d++) o[d] = fmaf(scores[j], values[j * D + d], o[d]);
    for (int64_t d = 0; d < D; d++) o[d] *= inv;
}

/* The vector version below keeps attend_scalar's arithmetic. Four keys' scores, and
 * several lanes of the output, are in flight at once only to hide FMA latency: they are
 * independent chains, so the bits of every element are those of the one-at-a-time loop. */
#ifdef BP_X86
__attribute__((target("avx2,fma")))
static void exp_shifted_avx2(float *s, int64_t L, float shift) {
    for (int64_t j = 0; j < L; j += 8) {
        __m256i mask = tail_mask_avx2(j, L);
        __m256 v = _mm256_sub_ps(_mm256_maskload_ps(s + j, mask), _mm256_set1_ps(shift));
        _mm256_maskstore_ps(s + j, mask, exp_poly_avx2(v));
    }
}

/* Needs D % 64 == 0 (every head size here); attend_scalar, with the same bits, takes the rest. */
__attribute__((target("avx2,fma")))
static void attend_avx2(const float *q, const float *keys, const float *values, float *o, float *scores,
                        int64_t L, int64_t D, float scale) {
    if (D % 64 != 0) {
        attend_scalar(q, keys, values, o, scores, L, D, scale);
        return;
    }
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
    for (; j < L; j++) scores[j] = dot8_avx2(q, keys + j * D, D) * scale;
    exp_shifted_avx2(scores, L, max_score(scores, L));
    __m256 inv = _mm256_set1_ps(inverse_total(scores, L));
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
    if (isa_level() >= 1) attend = attend_avx2;
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
        for (j = L0; j < L0 + r; j++) scores[r * S + j] = dot8_avx2(q + r * q_stride, keys + j * D, D) * scale;
    float inv[PROMPT_ROWS];
    for (int r = 0; r < R; r++) {
        float *sr = scores + r * S;
        exp_shifted_avx2(sr, L0 + r, max_score(sr, L0 + r));
        inv[r] = inverse_total(sr, L0 + r);
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
    if (isa_level() >= 1) {
        attend = attend_avx2;
        rows_at_once = D % 64 == 0;
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
