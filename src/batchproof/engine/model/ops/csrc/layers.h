/* What the fused decode step's two files share (layers.c, moe.c), kept out of the library's
 * exported symbols. */
#ifndef BP_LAYERS_H
#define BP_LAYERS_H
#include "kernels.h"

/* y (+)= x @ w^T (+ b) for M rows of K: a single float32 part by the float32 kernel, quantized
 * parts side by side by the numerics s names (each part into its own columns of y). */
BP_INTERNAL void bp_weight_linear(const bp_shape *s, const bp_weight *w, const float *x, const float *b, float *y,
                                  int64_t M, int64_t K, int accumulate, int num_threads);

/* An MoE layer's MLP on M normalised rows h [M, dim] -> out [M, dim], the residual not added;
 * each row's experts (increasing id) into routes [M, num_used] unless it is NULL. */
BP_INTERNAL void bp_moe_mlp(const bp_shape *s, const bp_moe *m, const float *h, float *out, int64_t M,
                            int64_t *routes, int num_threads);

#endif
