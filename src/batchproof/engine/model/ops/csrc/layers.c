/* One decode step's transformer layers in one call: the same kernels the per-op path calls
 * from Python (norm, matmul, RoPE, attention, the gated activation), in the same order on
 * the same values, so the results are the same bits; what goes is the Python between them
 * (ten to twenty calls, their tensors and checks, per layer per step).
 *
 * Every layout transformer.py runs: llama and qwen2 (fused QKV, bias optional, SiLU), qwen3
 * (Q/K normalised per head before RoPE) and gemma3 (also the attention and MLP outputs
 * normalised before their residual adds, GELU-tanh, a sliding window and RoPE tables of their
 * own on the local layers). The caller describes each layer once (bp_layer in kernels.h:
 * weight pointers and types, optional norms, RoPE tables, window, this layer's slice of the
 * KV cache) and passes the residual stream x, which is updated in place.
 *
 * And the mixtures of experts (qwen3moe, olmoe, mixtral): Q and K normalised whole (olmoe), and a
 * routed layer's MLP by moe.c.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "layers.h"

/* Scratch for one step: M rows of each intermediate the per-op path allocates as a tensor. */
typedef struct {
    float *h, *qkv, *q, *attn, *out, *gate_up, *act;
    int64_t *lengths;
} scratch;

void bp_weight_linear(const bp_shape *s, const bp_weight *w, const float *x, const float *b, float *y, int64_t M,
                      int64_t K, int accumulate, int num_threads) {
    int64_t N = 0;
    for (int p = 0; p < w->num_parts; p++) N += w->rows[p];
    if (w->num_parts == 1 && w->types[0] == 0) {
        bp_linear_f32(x, (const float *)w->data[0], b, y, M, N, K, accumulate, num_threads);
        return;
    }
    int64_t offset = 0;
    for (int p = 0; p < w->num_parts; p++) {
        (s->numerics == BP_NUMERICS_INT8 ? bp_linear_q_int8 : bp_linear_q)(x, w->data[p], w->types[p], w->row_bytes[p], b ? b + offset : NULL, y + offset, N, M,
                    w->rows[p], K, accumulate, num_threads);
        offset += w->rows[p];
    }
}

/* x += in @ w^T, or x = x + post_norm(in @ w^T) where the model has a post-norm (gemma3):
 * as transformer.py's _add, the product into its own rows, normalised, then one add each. */
static void add_output(const bp_shape *s, const bp_weight *w, const float *post_norm, const float *in, int64_t K,
                       float *x, float *out, int64_t M, int num_threads) {
    if (!post_norm) {
        bp_weight_linear(s, w, in, NULL, x, M, K, 1, num_threads);
        return;
    }
    bp_weight_linear(s, w, in, NULL, out, M, K, 0, num_threads);
    bp_rms_norm_f32(out, post_norm, out, M, s->dim, s->eps); /* in place: each row's scale comes first */
    for (int64_t i = 0; i < M * s->dim; i++) x[i] = x[i] + out[i];
}

/* Q, K, V for each row from the normalised stream t->h: per-head Q/K norms (qwen3, gemma3),
 * RoPE on this layer's tables, then Q to t->q and K, V into the cache at each row's position. */
static void qkv(const bp_shape *s, const bp_layer *L, scratch *t, int64_t M, const int64_t *positions,
                const int64_t *slots, int num_threads) {
    int64_t D = s->head_dim, q_dim = s->num_heads * D, kv_dim = s->num_kv_heads * D;
    int64_t width = q_dim + 2 * kv_dim;
    bp_weight_linear(s, &L->wqkv, t->h, L->bqkv, t->qkv, M, s->dim, 0, num_threads);
    for (int64_t r = 0; L->q_norm_full && r < M; r++) { /* olmoe: Q and K each one row of the norm */
        float *row = t->qkv + r * width;
        bp_rms_norm_f32(row, L->q_norm_full, row, 1, q_dim, s->eps);
        bp_rms_norm_f32(row + q_dim, L->k_norm_full, row + q_dim, 1, kv_dim, s->eps);
    }
    for (int64_t r = 0; L->q_norm && r < M; r++) { /* each head a row of the norm kernel */
        float *row = t->qkv + r * width;
        bp_rms_norm_f32(row, L->q_norm, row, s->num_heads, D, s->eps);
        bp_rms_norm_f32(row + q_dim, L->k_norm, row + q_dim, s->num_kv_heads, D, s->eps);
    }
    bp_rope_f32(t->qkv, M, width, s->num_heads + s->num_kv_heads, D, s->rope_dim, positions, L->cos_table,
                L->sin_table, s->rope_style);
    for (int64_t r = 0; r < M; r++) {
        memcpy(t->q + r * q_dim, t->qkv + r * width, (size_t)q_dim * 4);
        for (int64_t kh = 0; kh < s->num_kv_heads; kh++) {
            int64_t at = ((slots[r] * s->num_kv_heads + kh) * s->max_len + positions[r]) * D;
            memcpy(L->k_cache + at, t->qkv + r * width + q_dim + kh * D, (size_t)D * 4);
            memcpy(L->v_cache + at, t->qkv + r * width + q_dim + kv_dim + kh * D, (size_t)D * 4);
        }
    }
}

static void layer(const bp_shape *s, const bp_layer *L, scratch *t, float *x, int64_t M, const int64_t *positions,
                  const int64_t *slots, int64_t *routes, int num_threads) {
    int64_t q_dim = s->num_heads * s->head_dim;
    bp_rms_norm_f32(x, L->attn_norm, t->h, M, s->dim, s->eps);
    qkv(s, L, t, M, positions, slots, num_threads);
    bp_decode_attention_f32(t->q, L->k_cache, L->v_cache, t->attn, slots, t->lengths, M, s->num_heads,
                            s->num_kv_heads, s->head_dim, s->max_len, L->window, s->scale, num_threads);
    add_output(s, &L->wo, L->post_attn_norm, t->attn, q_dim, x, t->out, M, num_threads);
    bp_rms_norm_f32(x, L->ffn_norm, t->h, M, s->dim, s->eps);
    if (L->moe) { /* as transformer.py's _mlp: x + the experts' weighted sum, no post-norm */
        bp_moe_mlp(s, L->moe, t->h, t->out, M, routes, num_threads);
        for (int64_t i = 0; i < M * s->dim; i++) x[i] = x[i] + t->out[i];
        return;
    }
    bp_weight_linear(s, &L->w_gate_up, t->h, NULL, t->gate_up, M, s->dim, 0, num_threads);
    if (s->mlp_act == BP_ACT_GELU_TANH)
        bp_gelu_tanh_mul_f32(t->gate_up, t->act, M, s->ffn_dim, num_threads);
    else
        bp_silu_mul_f32(t->gate_up, t->act, M, s->ffn_dim, num_threads);
    add_output(s, &L->w_down, L->post_ffn_norm, t->act, s->ffn_dim, x, t->out, M, num_threads);
}

void bp_decode_layers(const bp_shape *s, const bp_layer *layers, int64_t num_layers, float *x, int64_t M,
                      const int64_t *positions, const int64_t *slots, int64_t *routes, int num_threads) {
    int64_t q_dim = s->num_heads * s->head_dim, width = q_dim + 2 * s->num_kv_heads * s->head_dim;
    size_t rows = (size_t)M * 4;
    scratch t = {
        .h = malloc(rows * s->dim), .qkv = malloc(rows * width), .q = malloc(rows * q_dim),
        .attn = malloc(rows * q_dim), .out = malloc(rows * s->dim), .gate_up = malloc(rows * 2 * s->ffn_dim),
        .act = malloc(rows * s->ffn_dim), .lengths = malloc((size_t)M * 8),
    };
    for (int64_t r = 0; r < M; r++) t.lengths[r] = positions[r] + 1;
    for (int64_t i = 0; i < num_layers; i++) {
        const bp_moe *moe = layers[i].moe;
        layer(s, layers + i, &t, x, M, positions, slots, routes, num_threads);
        if (routes && moe) routes += M * moe->num_used; /* the next routed layer's rows */
    }
    free(t.h); free(t.qkv); free(t.q); free(t.attn); free(t.out); free(t.gate_up); free(t.act); free(t.lengths);
}
