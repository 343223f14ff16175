/* Attention over the KV cache, one query row and head at a time: a decode step's rows each
 * against their own sequence's keys, and a prompt's rows (four at a time sharing their key
 * loads) with the bits of a decode step at their positions. Softmax through exp_poly.
 */
#include <Python.h> /* PyMem_RawMalloc: the scores buffer, from Python's allocator (no API use) */
#include <math.h>
#include <stdint.h>

#include "attention_group.h"
#include "lanes.h"
#include "softmax.h"

/* ---------------- decode attention, one sequence at a time ---------------- */

/* One query head against its sequence's L keys: softmax(q.k * scale) @ v. A key's score
 * is a dot8 over D; an output lane is one fused accumulator over the keys in position
 * order. scores has room for L floats. */
static void attend_scalar(const float *q, const float *keys, const float *values, float *o, float *scores,
                          int64_t L, int64_t D, float scale) {
    for (int64_t j = 0; j < L; j++) scores[j] = bp_dot8_scalar(q, keys + j * D, D) * scale;
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
        _mm_storeu_ps(scores + j, _mm_mul_ps(hsum4_avx2(a0, a1, a2, a3), _mm_set1_ps(scale)));
    }
    for (; j < L; j++) scores[j] = bp_dot8_avx2(q, keys + j * D, D) * scale;
    exp_shifted_avx2(scores, L, max_score_avx2(scores, L));
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
    attend_fn attend = BP_PICK(attend_avx2, attend_avx2, attend_scalar);
    int64_t group = H / KVH;
    /* Heads of one KV group together where the vector path runs (attention_group.c: the same bits) */
    int NH = 1;
#ifdef BP_X86
    if (bp_isa_level() >= BP_ISA_AVX2 && D % 64 == 0) NH = group % 3 == 0 ? 3 : group % 2 == 0 ? 2 : 1;
#endif
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t item = 0; item < B * H / NH; item++) {
        int64_t bh = item * NH, b = bh / H, h = bh % H, lo = window_start(lengths[b], window), L = lengths[b] - lo;
        int64_t base = ((slots[b] * KVH + h / group) * max_len + lo) * D;
        float *scores = (float *)PyMem_RawMalloc((size_t)(L * NH) * sizeof(float));
#ifdef BP_X86
        if (NH > 1) bp_attend_group_avx2(q + bh * D, k_cache + base, v_cache + base, out + bh * D, scores, L, D,
                                         scale, NH);
        else
#endif
            attend(q + bh * D, k_cache + base, v_cache + base, out + bh * D, scores, L, D, scale);
        PyMem_RawFree(scores);
    }
}

/* ---------------- prompt attention: consecutive rows of one slot ---------------- */

#define PROMPT_ROWS 4

#ifdef BP_X86
/* R <= PROMPT_ROWS query rows of one head at consecutive positions; row r attends keys
 * 0..L0+r-1. Every row's arithmetic is attend_avx2's: a key's score is one accumulator over
 * D then one horizontal sum, times scale; the softmax's max, exps and total in key order;
 * an output lane one accumulator over the keys in order, times 1 / total. So a prompt row
 * has the bits of a decode step at its position. What differs is only which of those
 * independent sums run side by side (the reason this exists: on 2 shared cores the loop is
 * bound by floating-point uops and loads, not by latency):
 *   scores: 2 rows x 4 keys at a time, each key and query vector loaded once for the tile
 *     and four scores' horizontal sums done together (hsum4_avx2);
 *   totals: the rows' sums interleaved, key by key, so four add chains overlap;
 *   outputs: 2 rows x 32 lanes at a time, a score broadcast once per row and key.
 * Needs D % 32 == 0. Those three steps below, one function each; attend_rows_avx2 runs them. */
#define RINLINE static inline __attribute__((always_inline, target("avx2,fma")))

/* Scores of rows q0 and q1 (q1 == q0 for a lone row) against the 4 keys at k: one accumulator
 * per row and key over D, each key vector loaded once for both rows. s: row q0's 4 scores, and
 * (rows == 2) q1's S floats on. */
RINLINE void pair_scores4(const float *q0, const float *q1, const float *k, int64_t D, __m128 scale4, float *s,
                          int64_t S, int rows) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t d = 0; d < D; d += 8) {
        const __m256 x0 = _mm256_loadu_ps(q0 + d), x1 = _mm256_loadu_ps(q1 + d);
        __m256 kv = _mm256_loadu_ps(k + d);
        a0 = _mm256_fmadd_ps(x0, kv, a0), b0 = _mm256_fmadd_ps(x1, kv, b0);
        kv = _mm256_loadu_ps(k + D + d);
        a1 = _mm256_fmadd_ps(x0, kv, a1), b1 = _mm256_fmadd_ps(x1, kv, b1);
        kv = _mm256_loadu_ps(k + 2 * D + d);
        a2 = _mm256_fmadd_ps(x0, kv, a2), b2 = _mm256_fmadd_ps(x1, kv, b2);
        kv = _mm256_loadu_ps(k + 3 * D + d);
        a3 = _mm256_fmadd_ps(x0, kv, a3), b3 = _mm256_fmadd_ps(x1, kv, b3);
    }
    _mm_storeu_ps(s, _mm_mul_ps(hsum4_avx2(a0, a1, a2, a3), scale4));
    if (rows == 2) _mm_storeu_ps(s + S, _mm_mul_ps(hsum4_avx2(b0, b1, b2, b3), scale4));
}

/* The scores: scores[r * S + i] = (q_r . k_i) * scale for keys 0..L0+r-1, 2 rows x 4 keys at a
 * time, then each row's last few keys one at a time. */
RINLINE void rows_scores(const float *q, int64_t q_stride, const float *keys, float *scores, int R, int64_t L0,
                         int64_t D, float scale) {
    const int64_t S = L0 + R; /* each row's stretch of `scores` */
    const __m128 scale4 = _mm_set1_ps(scale);
    for (int r0 = 0; r0 < R; r0 += 2) {
        const int rows = R - r0 < 2 ? R - r0 : 2;
        const float *q0 = q + r0 * q_stride, *q1 = q + (r0 + rows - 1) * q_stride;
        int64_t j = 0;
        for (; j + 4 <= L0 + r0; j += 4) /* keys both rows see */
            pair_scores4(q0, q1, keys + j * D, D, scale4, scores + r0 * S + j, S, rows);
        for (int r = r0; r < r0 + rows; r++) /* the last few shared keys, and each row's own */
            for (int64_t i = j; i < L0 + r; i++)
                scores[r * S + i] = bp_dot8_avx2(q + r * q_stride, keys + i * D, D) * scale;
    }
}

/* The softmax: each row's max and exps (softmax.h), then the rows' totals in key order, side by
 * side, so four add chains overlap; inv[r] = 1 / row r's total. */
RINLINE void rows_softmax(float *scores, int R, int64_t L0, float *inv) {
    const int64_t S = L0 + R;
    float total[PROMPT_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int r = 0; r < R; r++) {
        float *sr = scores + r * S;
        exp_shifted_avx2(sr, L0 + r, max_score_avx2(sr, L0 + r));
    }
    for (int64_t j = 0; j < L0; j++) /* each row's total in key order; the rows side by side */
        for (int r = 0; r < R; r++) total[r] += scores[r * S + j];
    for (int r = 0; r < R; r++) {
        for (int64_t j = L0; j < L0 + r; j++) total[r] += scores[r * S + j];
        inv[r] = 1.0f / total[r];
    }
}

/* 32 lanes of one row's output: its 4 accumulators, times 1 / total. */
RINLINE void store_lanes32(float *out, __m256 a0, __m256 a1, __m256 a2, __m256 a3, float inv) {
    const __m256 iv = _mm256_set1_ps(inv);
    _mm256_storeu_ps(out, _mm256_mul_ps(a0, iv));
    _mm256_storeu_ps(out + 8, _mm256_mul_ps(a1, iv));
    _mm256_storeu_ps(out + 16, _mm256_mul_ps(a2, iv));
    _mm256_storeu_ps(out + 24, _mm256_mul_ps(a3, iv));
}

/* Lanes 0..31 at v (a value row's, D floats a key) of rows s0 and s1 (s1 == s0 for a lone row),
 * which share their first `shared` keys, s1 one more: each lane one accumulator over the keys in
 * order, a score broadcast once per row and key. out: row s0's, and row s1's o_stride on. */
RINLINE void pair_values32(const float *s0, const float *s1, const float *v, float *out, int64_t o_stride,
                           const float *inv, int rows, int64_t shared, int64_t D) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int64_t j = 0;
    for (; j < shared; j++, v += D) { /* keys both rows see */
        const __m256 p = _mm256_broadcast_ss(s0 + j), p1 = _mm256_broadcast_ss(s1 + j);
        __m256 vv = _mm256_loadu_ps(v);
        a0 = _mm256_fmadd_ps(p, vv, a0), b0 = _mm256_fmadd_ps(p1, vv, b0);
        vv = _mm256_loadu_ps(v + 8);
        a1 = _mm256_fmadd_ps(p, vv, a1), b1 = _mm256_fmadd_ps(p1, vv, b1);
        vv = _mm256_loadu_ps(v + 16);
        a2 = _mm256_fmadd_ps(p, vv, a2), b2 = _mm256_fmadd_ps(p1, vv, b2);
        vv = _mm256_loadu_ps(v + 24);
        a3 = _mm256_fmadd_ps(p, vv, a3), b3 = _mm256_fmadd_ps(p1, vv, b3);
    }
    store_lanes32(out, a0, a1, a2, a3, inv[0]);
    if (rows < 2) return;
    { /* the second row's own last key */
        const __m256 p = _mm256_broadcast_ss(s1 + j);
        b0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v), b0);
        b1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8), b1);
        b2 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 16), b2);
        b3 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 24), b3);
    }
    store_lanes32(out + o_stride, b0, b1, b2, b3, inv[1]);
}

/* The outputs: o_r = (sum over keys in order of p_r[j] v_j) * inv[r], 2 rows x 32 lanes at a time. */
RINLINE void rows_values(const float *scores, const float *values, float *o, int64_t o_stride, const float *inv,
                         int R, int64_t L0, int64_t D) {
    const int64_t S = L0 + R;
    for (int r0 = 0; r0 < R; r0 += 2) {
        const int rows = R - r0 < 2 ? R - r0 : 2;
        const float *s0 = scores + r0 * S, *s1 = scores + (r0 + rows - 1) * S;
        for (int64_t d = 0; d < D; d += 32)
            pair_values32(s0, s1, values + d, o + r0 * o_stride + d, o_stride, inv + r0, rows, L0 + r0, D);
    }
}

__attribute__((target("avx2,fma")))
static void attend_rows_avx2(const float *q, int64_t q_stride, const float *keys, const float *values, float *o,
                             int64_t o_stride, float *scores, int R, int64_t L0, int64_t D, float scale) {
    float inv[PROMPT_ROWS];
    rows_scores(q, q_stride, keys, scores, R, L0, D, scale);
    rows_softmax(scores, R, L0, inv);
    rows_values(scores, values, o, o_stride, inv, R, L0, D);
}
#endif

typedef void (*attend_rows_fn)(const float *, int64_t, const float *, const float *, float *, int64_t, float *, int,
                               int64_t, int64_t, float);

/* q, out: [n, H, D] at positions start..start+n-1 of one slot, whose keys are already in
 * the cache; row i attends positions window_start..start+i. Equal, row for row, to
 * bp_decode_attention_f32 with lengths start+1..start+n and the same window. */
void bp_prompt_attention_f32(const float *q, const float *k_cache, const float *v_cache, float *out, int64_t slot,
                             int64_t start, int64_t n, int64_t H, int64_t KVH, int64_t D, int64_t max_len,
                             int64_t window, float scale, int num_threads) {
    attend_fn attend = BP_PICK(attend_avx2, attend_avx2, attend_scalar);
    attend_rows_fn attend_rows = BP_PICK(attend_rows_avx2, attend_rows_avx2, NULL);
    if (D % 64 != 0) attend_rows = NULL; /* it keeps attend_avx2's arithmetic, which needs D % 64 == 0 */
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
        /* Rows that share key 0 share their loads; once the window cuts in, each row runs alone. */
        if (attend_rows && window_start(L0 + R - 1, window) == 0) {
            attend_rows(q + (r0 * H + h) * D, H * D, keys, values, out + (r0 * H + h) * D, H * D, scores, R, L0, D,
                        scale);
            PyMem_RawFree(scores);
            continue;
        }
        for (int r = 0; r < R; r++) {
            int64_t lo = window_start(L0 + r, window);
            attend(q + ((r0 + r) * H + h) * D, keys + lo * D, values + lo * D, out + ((r0 + r) * H + h) * D, scores,
                   L0 + r - lo, D, scale);
        }
        PyMem_RawFree(scores);
    }
}
