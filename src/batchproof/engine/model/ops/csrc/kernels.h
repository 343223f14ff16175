/* The kernels' one interface: every function the library exports (kernels.py binds each,
 * abi.py declares their signatures and mirrors the structs; tests/engine/
 * test_kernels_abi.py holds those to this file), and the one way a C file picks its
 * instruction-set path. What the C files share of the arithmetic is in lanes.h,
 * exp_poly.h and quant.h.
 *
 * Why hand-written: BLAS libraries pick a different kernel, blocking and thread split
 * for each row count, so a row's sum depends on how many rows share the call (MKL here
 * changes results between 1, 2, 3 and 4 rows). In these kernels every output element
 * is one vector accumulator walking K in order, reduced across lanes in one fixed
 * sequence, computed by one thread; the row count, the row's position, the other rows
 * and the thread count only decide which register or thread does the work, never the
 * arithmetic.
 */
#ifndef BP_KERNELS_H
#define BP_KERNELS_H
#include <stdint.h>

/* ---------------- instruction set: speed only, never bits (isa.c) ---------------- */

#if defined(__x86_64__) || defined(_M_X64)
#define BP_X86 1
#endif
#if defined(__aarch64__)
#define BP_ARM 1
#endif

#define BP_ISA_PORTABLE 0
#define BP_ISA_AVX2 1   /* AVX2 + FMA + F16C */
#define BP_ISA_AVX512 2 /* AVX2's, and AVX512F + VL + DQ + BW: two 8-lane sums a register */
/* aarch64's one vector level, 1 as AVX2 on x86: Advanced SIMD (NEON), in every ARMv8-A core. Only
 * the register path's tiles have a NEON twin (quant_tiles_neon.c, asked by quant_tiles_pick.c);
 * BP_PICK stays portable there, so every other kernel runs its portable C at either level. */
#define BP_ISA_NEON 1

/* The level in use: the CPU's, at most the cap (tests lower it to run every path here). */
int bp_isa_level(void);
void bp_cap_isa_level(int cap);
void bp_allow_vnni(int allow); /* tests: the int8 tiles of an AVX-512 CPU without VNNI */
void bp_prefer_pairs(int prefer); /* tests: the AVX-512 one-row tile pairing rows: 1 on, 0 off, -1 auto */
/* The name of the arithmetic: builds that report one version give the same bits. */
const char *bp_numerics_version(void);

/* The one way a kernel picks its path: the AVX-512, AVX2 or portable choice for the level
 * in use (bp_isa_level, asked once). Off x86 it is the portable one and the vector names
 * are never seen, so they need exist only under BP_X86. Every choice gives the same bits.
 * (Not target_clones: a clone's resolver asks the CPU, never the cap, so a test could not
 * run the portable code on a vector CPU.) A kernel with a twin per instruction set keeps
 * each in its own file, name_avx512.c, name_avx2.c (quant_tiles*, quant_dequant*). */
#ifdef BP_X86
#define BP_PICK(avx512, avx2, portable)                                                          \
    ({                                                                                           \
        const int bp_level_ = bp_isa_level();                                                    \
        bp_level_ >= BP_ISA_AVX512 ? (avx512) : bp_level_ >= BP_ISA_AVX2 ? (avx2) : (portable); \
    })
#else
#define BP_PICK(avx512, avx2, portable) (portable)
#endif

/* What one C file defines for another: kept out of the library's exported symbols, so
 * those are exactly the functions declared here. */
#define BP_INTERNAL __attribute__((visibility("hidden")))

/* ---------------- linear: y[m, n] (+)= sum_k x[m, k] * w[n, k] (+ b[n]) ---------------- */

/* matmul.c: float32 weights [N, K]. */
void bp_linear_f32(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t N, int64_t K,
                   int accumulate, int num_threads);
/* quant_linear.c: weights in GGUF blocks of GGML type `type`, rows row_bytes apart; y's
 * rows ldy floats apart (several weights can fill one fused output). */
void bp_linear_q(const float *x, const uint8_t *w, int type, int64_t row_bytes, const float *b, float *y,
                 int64_t ldy, int64_t M, int64_t N, int64_t K, int accumulate, int num_threads);
/* quant_dequant.c: rows ids[0..n) of a [rows, K] weight -> out [n, K] (the embedding lookup),
 * and a type's block: its bytes and weights (0 for a type we do not run). */
void bp_dequant_rows(const uint8_t *w, int type, int64_t row_bytes, int64_t K, const int64_t *ids, int64_t n,
                     float *out);
int64_t bp_block_bytes(int type);
/* quant_int8.c: bp_linear_q's arguments, in the int8 numerics (int8 activations per row and
 * block of 32, integer block dots, one fixed float order across blocks: quant_int8.h), w in
 * its layout (bp_int8_repack); F16, BF16 and F32 weights, never repacked, run bp_linear_q. */
void bp_linear_q_int8(const float *x, const uint8_t *w, int type, int64_t row_bytes, const float *b, float *y,
                      int64_t ldy, int64_t M, int64_t N, int64_t K, int accumulate, int num_threads);
/* The int8 numerics' weight layout (8 rows interleaved, scales formed once): its bytes for
 * `rows` rows of K (0 for a type it does not run), and the repack from GGUF blocks into it. */
int64_t bp_int8_packed_bytes(int type, int64_t rows, int64_t K);
void bp_int8_repack(const uint8_t *src, int type, int64_t row_bytes, int64_t rows, int64_t K, uint8_t *dst);
/* Rows ids[0..n) of a weight in that layout -> out [n, K], bp_dequant_rows' floats (the embedding lookup). */
void bp_int8_dequant_rows(const uint8_t *w, int type, int64_t K, const int64_t *ids, int64_t n, float *out);
int64_t bp_block_elems(int type);

/* ---------------- per row (elementwise.c) ---------------- */

void bp_rms_norm_f32(const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps);
void bp_rope_f32(float *x, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_dim, int64_t rope_dim,
                 const int64_t *positions, const float *cos_table, const float *sin_table, int style);
void bp_silu_mul_f32(const float *gate_up, float *y, int64_t rows, int64_t ffn, int num_threads);
void bp_gelu_tanh_mul_f32(const float *gate_up, float *y, int64_t rows, int64_t ffn, int num_threads);

/* ---------------- logprobs and the greedy choice (logprobs.c) ---------------- */

void bp_first_max_f32(const float *logits, int64_t B, int64_t V, int64_t *ids);
void bp_top_k_logprobs_f32(const float *logits, int64_t B, int64_t V, int64_t k, int64_t *ids, float *values,
                           float *row_max, float *log_total, int64_t *counts);
/* Each row's logprob outside its first num_shown[b] of k ids (0.0 when none); returns 0, or -1 out of memory. */
int bp_tail_logprobs_f32(const float *logits, int64_t B, int64_t V, const float *row_max, const float *log_total,
                         const int64_t *ids, int64_t k, const int64_t *num_shown, float *tails);

/* ---------------- a sampled choice and the RoPE tables (sample.c) ---------------- */

int64_t bp_sample_f32(const float *usable, int64_t V, float temperature, int64_t top_k, double top_p, double min_p,
                      double u, float *processed);
void bp_rope_tables(int64_t rope_dim, double base, int64_t max_len, const float *freq_factors, float linear_factor,
                    float *cos_out, float *sin_out);

/* ---------------- attention (attention.c) ---------------- */

void bp_decode_attention_f32(const float *q, const float *k_cache, const float *v_cache, float *out,
                             const int64_t *slots, const int64_t *lengths, int64_t B, int64_t H, int64_t KVH,
                             int64_t D, int64_t max_len, int64_t window, float scale, int num_threads);
void bp_prompt_attention_f32(const float *q, const float *k_cache, const float *v_cache, float *out, int64_t slot,
                             int64_t start, int64_t n, int64_t H, int64_t KVH, int64_t D, int64_t max_len,
                             int64_t window, float scale, int num_threads);

/* ---------------- one decode step's layers in one call (layers.c, moe.c) ---------------- */

#define BP_MAX_PARTS 4

/* A matmul weight: up to BP_MAX_PARTS tensors side by side (Q, K, V may differ in type). */
typedef struct {
    int32_t num_parts;
    int32_t types[BP_MAX_PARTS]; /* GGML type ids; a single F32 part runs the float32 kernel */
    const uint8_t *data[BP_MAX_PARTS];
    int64_t rows[BP_MAX_PARTS];
    int64_t row_bytes[BP_MAX_PARTS];
} bp_weight;

/* An MoE layer's router and experts (moe.c): the router a float32 [experts, dim] weight, each
 * expert's fused [gate | up] and its down; each token takes the softmax over every expert,
 * keeps the best num_used (ties to the lower id), rescaled to sum to 1 where topk_normalised. */
typedef struct {
    bp_weight router;
    const bp_weight *gate_up, *down; /* [num_experts] each */
    int64_t num_experts, num_used, ffn; /* ffn: one expert's */
    int32_t topk_normalised;
} bp_moe;

typedef struct {
    const float *attn_norm, *ffn_norm, *bqkv; /* bqkv may be NULL */
    const float *q_norm, *k_norm;             /* [head_dim], both or neither (qwen3, gemma3) */
    const float *post_attn_norm, *post_ffn_norm; /* [dim] on each output before its add, or NULL (gemma3) */
    bp_weight wqkv, wo, w_gate_up, w_down;
    const float *cos_table, *sin_table; /* this layer's RoPE, [max_len, rope_dim / 2] */
    int64_t window;                     /* sliding window, 0: none */
    float *k_cache, *v_cache;           /* this layer's [slots, kv_heads, max_len, head_dim] */
    const float *q_norm_full, *k_norm_full; /* [q_dim], [kv_dim]: Q and K normalised whole (olmoe), or NULL */
    const bp_moe *moe; /* a routed layer's experts (w_gate_up and w_down unused), or NULL */
} bp_layer;

#define BP_ACT_SILU 0
#define BP_ACT_GELU_TANH 1

/* The numerics a matmul runs (chosen once, at start): float32 weights times float32
 * activations, bitwise the dequantized float32 product (quant_linear.c); or int8 activations
 * times the weights' own quants, integer block dots (quant_int8.c). Both batch-invariant. */
#define BP_NUMERICS_F32 0
#define BP_NUMERICS_INT8 1

typedef struct {
    int64_t dim, ffn_dim, num_heads, num_kv_heads, head_dim, rope_dim, max_len;
    int32_t rope_style, mlp_act; /* mlp_act: BP_ACT_* */
    float eps, scale;
    int32_t numerics; /* BP_NUMERICS_*: which matmul every quantized weight runs */
} bp_shape;

/* routes: NULL, or room for each routed layer's experts [routed layers, M, k] (int64, each row's
 * in increasing id, the layers in order): the routing receipt's rows (moe/receipt.py). */
void bp_decode_layers(const bp_shape *s, const bp_layer *layers, int64_t num_layers, float *x, int64_t M,
                      const int64_t *positions, const int64_t *slots, int64_t *routes, int num_threads);

/* ---------------- the machine's limits, for the bench (peak.c) ---------------- */

/* `seconds` of independent FMAs on each of num_threads threads -> the floating-point
 * operations done (the caller times the call). */
double bp_fma_peak(double seconds, int num_threads);
/* Likewise for the int8 numerics' integer dot (u8 x s8 into int32, as its tiles spell it at
 * the level in use) -> the integer operations done, 2 a multiply-add. */
double bp_int_dot_peak(double seconds, int num_threads);
/* A buffer of num_bytes written, then summed num_runs times on num_threads threads -> the
 * best run's bytes read a second (0 where the buffer cannot be allocated). */
double bp_read_bandwidth(int64_t num_bytes, int num_threads, int num_runs);

/* ---------------- the structs' layout as compiled (module.c) ---------------- */

/* Struct `which`: its size, and field `field`'s name and byte offset (NULL and -1 past
 * the last; -1 for no such struct), so that Python checks its mirrors at every load. */
#define BP_ABI_WEIGHT 0
#define BP_ABI_LAYER 1
#define BP_ABI_SHAPE 2
#define BP_ABI_MOE 3
int64_t bp_abi_sizeof(int which);
const char *bp_abi_field(int which, int field);
int64_t bp_abi_offset(int which, int field);

#endif
