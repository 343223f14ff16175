/* What the kernel files share of the one fixed-order sum: 8 lanes, lane l fusing the terms
 * k = l mod 8 in increasing k, a zero-padded tail, then the tree of sum8. Here are that
 * tree (and its vector twin), the tail mask, the dot product every score and norm uses
 * (matmul.c), and the matmul tile, which quant_linear.c feeds with weights it has just
 * dequantized: so a quantized matmul adds the same terms in the same order as the float32
 * one over the dequantized weights, the same bits. Not part of the interface (kernels.h). */
#ifndef BP_LANES_H
#define BP_LANES_H
#include <stdint.h>

#include "kernels.h"

#ifdef BP_X86
#include <immintrin.h>
#endif

/* Eight lanes into one: lane l with lane l + 4, then the pairs (0, 2) and (1, 3) of those,
 * then the last two. hsum_avx2 is this tree in vector registers. */
static inline float sum8(const float lane[8]) {
    float t0 = lane[0] + lane[4], t1 = lane[1] + lane[5], t2 = lane[2] + lane[6], t3 = lane[3] + lane[7];
    return (t0 + t2) + (t1 + t3);
}

#ifdef BP_X86
/* sum8's tree in vector registers: adding the halves gives lane l plus lane l + 4, movehl
 * adds the pairs (0, 2) and (1, 3), the shuffle adds the last two. */
__attribute__((target("avx2,fma")))
static inline float hsum_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* hsum_avx2 of four accumulators at once: lane l plus lane l + 4 in each, then the pairs
 * (0, 2) and (1, 3) of all four side by side, then their last add: each sum is its own
 * sum8 tree, the same operands in the same order, so the same bits as four hsum_avx2. */
__attribute__((target("avx2,fma")))
static inline __m128 hsum4_avx2(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m128 ta = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 tb = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    __m128 tc = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    __m128 td = _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
    __m128 ab = _mm_add_ps(_mm_unpacklo_ps(ta, tb), _mm_unpackhi_ps(ta, tb)); /* a02 b02 a13 b13 */
    __m128 cd = _mm_add_ps(_mm_unpacklo_ps(tc, td), _mm_unpackhi_ps(tc, td));
    return _mm_add_ps(_mm_movelh_ps(ab, cd), _mm_movehl_ps(cd, ab));
}

/* Lanes k..k+7 of a row of n: all-ones where k + lane < n (the row's tail is masked). */
__attribute__((target("avx2,fma")))
static inline __m256i tail_mask_avx2(int64_t k, int64_t n) {
    int left = (int)(n - k < 8 ? n - k : 8);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

/* sum_k a[k] * b[k] in the 8-lane layout (matmul.c); the AVX2 one in one register. */
typedef float (*dot_fn)(const float *, const float *, int64_t);
BP_INTERNAL float bp_dot8_scalar(const float *a, const float *b, int64_t K);
#ifdef BP_X86
BP_INTERNAL __attribute__((target("avx2,fma"))) float bp_dot8_avx2(const float *a, const float *b, int64_t K);
#endif

/* ---------------- the matmul tile (matmul.c) ---------------- */

#define MT 4 /* rows of x per tile */
#define NT 4 /* rows of w (outputs) per tile, at most */
/* With several rows of x, 4 x 4 accumulators fill AVX2's 16 registers and the operands
 * spill; 4 x 3 fit (a c=16 step's matmuls ran ~30% faster). A decode step of one or two
 * rows keeps 4 outputs a tile, reading each x once for four. The shape changes no bit:
 * each output is still its own sum in its own order. */
#define NT_BATCH 3

/* AVX-512 runs two or more rows through the pair tile below, 4 outputs a tile. */
static inline int bp_tile_width(int64_t M) { return M <= 2 || bp_isa_level() >= BP_ISA_AVX512 ? NT : NT_BATCH; }

typedef void (*tile_fn)(const float *, const float *, float *, int64_t, int64_t, int, int, const float *);

/* The tile of the instruction set in use (AVX-512, AVX2 or portable C): each adds the
 * same terms in the same order, so all give the same bits. */
BP_INTERNAL tile_fn bp_pick_tile(void);

/* ---------------- AVX-512: rows of x two a register (matmul.c) ----------------
 *
 * With many rows of x (a batch's decode step, a prompt) x is packed once per matmul, rows 2p
 * and 2p + 1 side by side by 8 (bp_pack_pairs), so that one 16-lane load holds two rows'
 * chunk; a tile of PT_ROWS rows against NT weight rows then keeps 16 accumulators of two
 * outputs each, with one load per pair and one broadcast per weight row per 8 k (where the
 * 8-lane tile took a load per row and per weight row for half as many FMAs). Each half is
 * still one output's 8-lane sum in the one order: the same bits. */
#define PT_ROWS 8

/* Floats of one packed pair: K rounded up to 8, twice. */
static inline int64_t bp_pair_stride(int64_t K) { return (K + 7) / 8 * 16; }

/* Room for x [M, K] in pairs: (M + 1) / 2 of bp_pair_stride(K) floats. The caller frees it. */
BP_INTERNAL float *bp_pairs_alloc(int64_t M, int64_t K);

/* x [M, K] into xp (bp_pairs_alloc's): pair p's chunk c holds row 2p's x[8c..8c+7], then row
 * 2p + 1's; zeros past K (as the 8-lane tail's masked loads read) and for the missing row of an
 * odd M. Called by every thread of a parallel region (a worksharing loop: each packs a share,
 * then the loop's barrier), before any tile reads xp: packed by one thread while the other spun
 * in OpenMP's pool, the copy ran several times slower on 2 cores (quant_int8_linear.c). */
BP_INTERNAL void bp_pack_pairs(const float *x, int64_t M, int64_t K, float *xp);

/* sums[i * NT + j] = row i of the mt (<= PT_ROWS) rows whose pairs start at xp against weight
 * row j of nt (<= NT), rows K apart; next_w: weights to prefetch (as tile_fn's); NULL below
 * AVX-512. */
typedef void (*pair_tile_fn)(const float *xp, const float *w, float *sums, int64_t K, int mt, int nt,
                             const float *next_w);
BP_INTERNAL pair_tile_fn bp_pick_pair_tile(void);

/* sums[i * lds + j] (+ b[n + j]) into y[(m + i) * ldy + n + j], added to what is there with
 * accumulate (the residual add: one rounding per add, as torch's `y + linear(x)`). */
static inline void bp_store_tile(const float *sums, int lds, const float *b, float *y, int64_t m, int64_t n,
                                 int mt, int nt, int64_t ldy, int accumulate) {
    /* a loop per case, each plain enough to vectorize: one element's operations and their order
     * are the same in every case (the bias added to the sum, then the sum to what is there) */
    for (int i = 0; i < mt; i++) {
        const float *s = sums + i * lds;
        float *out = y + (m + i) * ldy + n;
        if (b && accumulate)
            for (int j = 0; j < nt; j++) out[j] = out[j] + (s[j] + b[n + j]);
        else if (b)
            for (int j = 0; j < nt; j++) out[j] = s[j] + b[n + j];
        else if (accumulate)
            for (int j = 0; j < nt; j++) out[j] = out[j] + s[j];
        else
            for (int j = 0; j < nt; j++) out[j] = s[j];
    }
}
#endif
