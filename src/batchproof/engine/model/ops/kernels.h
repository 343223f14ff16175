/* What kernels.c shares with quant.c: the matmul tile (one fixed-order sum per output)
 * and how a tile's sums are written out. quant.c feeds the same tile with weights it has
 * just dequantized, so a quantized matmul adds the same terms in the same order as the
 * float32 one over the dequantized weights: the same bits. */
#ifndef BP_KERNELS_H
#define BP_KERNELS_H
#include <stdint.h>

#define MT 4 /* rows of x per tile */
#define NT 4 /* rows of w (outputs) per tile, at most */
/* With several rows of x, 4 x 4 accumulators fill AVX2's 16 registers and the operands
 * spill; 4 x 3 fit (a c=16 step's matmuls ran ~30% faster). A decode step of one or two
 * rows keeps 4 outputs a tile, reading each x once for four. The shape changes no bit:
 * each output is still its own sum in its own order. */
#define NT_BATCH 3

static inline int bp_tile_width(int64_t M) { return M <= 2 ? NT : NT_BATCH; }

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

/* sum8's tree (kernels.c) in vector registers: adding the halves gives lane l plus lane
 * l + 4, movehl adds the pairs (0, 2) and (1, 3), the shuffle adds the last two. */
__attribute__((target("avx2,fma")))
static inline float hsum_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
#endif

typedef void (*tile_fn)(const float *, const float *, float *, int64_t, int64_t, int, int, const float *);

/* The tile of the instruction set in use (AVX-512, AVX2 or portable C): each adds the
 * same terms in the same order, so all give the same bits. */
tile_fn bp_pick_tile(void);

/* 2: AVX-512, 1: AVX2 + FMA + F16C, 0: portable (capped by bp_cap_isa_level in tests). */
int bp_isa_level(void);

/* sums[i * lds + j] (+ b[n + j]) into y[(m + i) * ldy + n + j], added to what is there with
 * accumulate (the residual add: one rounding per add, as torch's `y + linear(x)`). */
static inline void bp_store_tile(const float *sums, int lds, const float *b, float *y, int64_t m, int64_t n,
                                 int mt, int nt, int64_t ldy, int accumulate) {
    for (int i = 0; i < mt; i++)
        for (int j = 0; j < nt; j++) {
            float value = sums[i * lds + j];
            if (b) value += b[n + j];
            float *out = y + (m + i) * ldy + n + j;
            *out = accumulate ? *out + value : value;
        }
}


/* The per-op kernels, for the fused decode step (layers.c). */
void bp_linear_f32(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t N, int64_t K,
                   int accumulate, int num_threads);
void bp_linear_q(const float *x, const uint8_t *w, int type, int64_t row_bytes, const float *b, float *y,
                 int64_t ldy, int64_t M, int64_t N, int64_t K, int accumulate, int num_threads);
void bp_rms_norm_f32(const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps);
void bp_rope_f32(float *x, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_dim, int64_t rope_dim,
                 const int64_t *positions, const float *cos_table, const float *sin_table, int style);
void bp_silu_mul_f32(const float *gate_up, float *y, int64_t rows, int64_t ffn);
void bp_gelu_tanh_mul_f32(const float *gate_up, float *y, int64_t rows, int64_t ffn);
void bp_decode_attention_f32(const float *q, const float *k_cache, const float *v_cache, float *out,
                             const int64_t *slots, const int64_t *lengths, int64_t B, int64_t H, int64_t KVH,
                             int64_t D, int64_t max_len, int64_t window, float scale, int num_threads);
void bp_prompt_attention_f32(const float *q, const float *k_cache, const float *v_cache, float *out, int64_t slot,
                             int64_t start, int64_t n, int64_t H, int64_t KVH, int64_t D, int64_t max_len,
                             int64_t window, float scale, int num_threads);
#endif
