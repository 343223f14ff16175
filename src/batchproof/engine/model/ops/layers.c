/* One decode step's transformer layers in one call: the same kernels the per-op path calls
 * from Python (norm, matmul, RoPE, attention, SiLU), in the same order on the same
 * values, so the results are the same bits; what goes is the Python between them (about
 * ten calls, their tensors and checks, per layer per step).
 *
 * For llama / qwen2 layouts (no per-head Q/K norm). The caller describes each layer once
 * (bp_layer in kernels.h: weight pointers and types, this layer's slice of the KV cache)
 * and passes the residual stream x, which is updated in place.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

static void linear(const bp_weight *w, const float *x, const float *b, float *y, int64_t M, int64_t K,
                   int accumulate, int num_threads) {
    int64_t N = 0;
    for (int p = 0; p < w->num_parts; p++) N += w->rows[p];
    if (w->num_parts == 1 && w->types[0] == 0) {
        bp_linear_f32(x, (const float *)w->data[0], b, y, M, N, K, accumulate, num_threads);
        return;
    }
    int64_t offset = 0;
    for (int p = 0; p < w->num_parts; p++) {
        bp_linear_q(x, w->data[p], w->types[p], w->row_bytes[p], b ? b + offset : NULL, y + offset, N, M,
                    w->rows[p], K, accumulate, num_threads);
        offset += w->rows[p];
    }
}

void bp_decode_layers(const bp_shape *s, const bp_layer *layers, int64_t num_layers, float *x, int64_t M,
                      const int64_t *positions, const int64_t *slots, int num_threads) {
    int64_t D = s->head_dim, q_dim = s->num_heads * D, kv_dim = s->num_kv_heads * D;
    int64_t width = q_dim + 2 * kv_dim;
    float *h = malloc((size_t)(M * s->dim) * 4), *qkv = malloc((size_t)(M * width) * 4);
    float *q = malloc((size_t)(M * q_dim) * 4), *attn = malloc((size_t)(M * q_dim) * 4);
    float *gate_up = malloc((size_t)(M * 2 * s->ffn_dim) * 4), *act = malloc((size_t)(M * s->ffn_dim) * 4);
    int64_t *lengths = malloc((size_t)M * 8);
    for (int64_t r = 0; r < M; r++) lengths[r] = positions[r] + 1;
    for (int64_t i = 0; i < num_layers; i++) {
        const bp_layer *L = layers + i;
        bp_rms_norm_f32(x, L->attn_norm, h, M, s->dim, s->eps);
        linear(&L->wqkv, h, L->bqkv, qkv, M, s->dim, 0, num_threads);
        bp_rope_f32(qkv, M, width, s->num_heads + s->num_kv_heads, D, s->rope_dim, positions, s->cos_table,
                    s->sin_table, s->rope_style);
        for (int64_t r = 0; r < M; r++) {
            memcpy(q + r * q_dim, qkv + r * width, (size_t)q_dim * 4);
            for (int64_t kh = 0; kh < s->num_kv_heads; kh++) {
                int64_t at = ((slots[r] * s->num_kv_heads + kh) * s->max_len + positions[r]) * D;
                memcpy(L->k_cache + at, qkv + r * width + q_dim + kh * D, (size_t)D * 4);
                memcpy(L->v_cache + at, qkv + r * width + q_dim + kv_dim + kh * D, (size_t)D * 4);
            }
        }
        bp_decode_attention_f32(q, L->k_cache, L->v_cache, attn, slots, lengths, M, s->num_heads,
                                s->num_kv_heads, D, s->max_len, 0, s->scale, num_threads);
        linear(&L->wo, attn, NULL, x, M, q_dim, 1, num_threads);
        bp_rms_norm_f32(x, L->ffn_norm, h, M, s->dim, s->eps);
        linear(&L->w_gate_up, h, NULL, gate_up, M, s->dim, 0, num_threads);
        bp_silu_mul_f32(gate_up, act, M, s->ffn_dim);
        linear(&L->w_down, act, NULL, x, M, s->ffn_dim, 1, num_threads);
    }
    free(h); free(qkv); free(q); free(attn); free(gate_up); free(act); free(lengths);
}
