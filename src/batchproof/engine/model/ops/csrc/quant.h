/* What the quantized kernels share (quant_dequant.c, quant_linear.c, quant_tiles*.c,
 * quant_int8*.c): GGML's type ids, the one table of types and their block sizes (from which
 * every per-type switch is generated), the exact half -> float, the table of block types
 * (each one's sizes and the function that turns a row of its blocks into the floats
 * gguf.quants computes), and the register tiles' instruction-set twins. Not part of the
 * interface (kernels.h). */
#ifndef BP_QUANT_H
#define BP_QUANT_H
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* GGML type ids, as GGUF stores them. */
enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30,
};

/* The one table of types: every type we run as X(id, name, a block's bytes, the weights it
 * holds), gguf's GGML_QUANT_SIZES (tests/engine/test_kernels_abi.py holds the two together).
 * BP_QUANT_TYPES, the types whose blocks are unpacked, is the one list of them: each twin that
 * has a function per quantized type (the register path's tiles, the int8 numerics' tiles)
 * defines its functions and writes its picker's switch by expanding it (BP_QUANT_CASE), so a new
 * quantized type is one line here, and the code that unpacks it. BP_FLOAT_TYPES need no
 * unpacking (the buffer, the float path). quant_dequant.c builds its table of types from
 * BLOCK_SIZES, both lists; the kernels ask block_bytes(). */
#define BP_FLOAT_TYPES(X) X(T_F32, f32, 4, 1) X(T_F16, f16, 2, 1) X(T_BF16, bf16, 2, 1)
#define BP_QUANT_TYPES(X)    \
    X(T_Q4_0, q4_0, 18, 32)   \
    X(T_Q4_1, q4_1, 20, 32)   \
    X(T_Q5_0, q5_0, 22, 32)   \
    X(T_Q5_1, q5_1, 24, 32)   \
    X(T_Q8_0, q8_0, 34, 32)   \
    X(T_Q4_K, q4_k, 144, 256) \
    X(T_Q5_K, q5_k, 176, 256) \
    X(T_Q6_K, q6_k, 210, 256)
#define BLOCK_SIZES(X) BP_FLOAT_TYPES(X) BP_QUANT_TYPES(X)

/* A picker's switch, generated: inside switch (type), BP_QUANT_TYPES(BP_QUANT_CASE) returns each
 * quantized type's function, named by the twin's BP_TWIN_FN(name) (e.g. q4_0_avx2). */
#define BP_QUANT_CASE(id, name, bytes, elems) \
    case id: return BP_TWIN_FN(name);

/* A block's bytes, 0 for a type we do not run: a constant wherever the type is one. */
static inline int64_t block_bytes(int type) {
    switch (type) {
#define BLOCK_BYTES_CASE(id, name, bytes, elems) case id: return bytes;
    BLOCK_SIZES(BLOCK_BYTES_CASE)
#undef BLOCK_BYTES_CASE
    default: return 0;
    }
}

/* IEEE half -> float, exact for every value (subnormals, infinities, NaN). */
static inline float f16(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else { /* subnormal half: normalise */
        exp = 113;
        while (!(mant & 0x400)) { mant <<= 1; exp--; }
        bits = sign | (exp << 23) | ((mant & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint32_t u32le(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* One row of K weights -> K floats, each computed as gguf.quants computes it. */
typedef void (*dequant_fn)(const uint8_t *restrict src, int64_t K, float *restrict dst);

typedef struct {
    int64_t block_bytes, block_elems; /* a block's bytes, and how many weights it holds */
    dequant_fn dequant;
} block_type;

/* The type's entry on the instruction set in use (quant_dequant.c), or NULL for a type we do
 * not run. */
BP_INTERNAL const block_type *bp_block_type(int type);

/* quant_dequant.c's AVX2 twins (quant_dequant_avx2.c): num_blocks blocks of Q4_0, or Q4_1 with
 * has_min; of Q5_0 or Q5_1; of Q8_0. */
#ifdef BP_X86
BP_INTERNAL __attribute__((target("avx2,f16c"), noclone)) void bp_dequant_q4_avx2(const uint8_t *src,
                                                                                 int64_t num_blocks, int has_min,
                                                                                 float *dst);
BP_INTERNAL __attribute__((target("avx2,f16c"), noclone)) void bp_dequant_q5_avx2(const uint8_t *src,
                                                                                 int64_t num_blocks, int has_min,
                                                                                 float *dst);
BP_INTERNAL __attribute__((target("avx2,f16c"))) void bp_dequant_q8_avx2(const uint8_t *src, int64_t num_blocks,
                                                                        float *dst);
#endif

/* ---- the register path (quant_tiles*.c): up to FUSED_ROWS rows of x, blocks unpacked in registers ----
 *
 * Outputs per tile by rows of x: with one row, QW accumulators hide the FMA latency; with
 * more, rows x outputs accumulators must leave registers for the unpacking (4 x 3 spilled
 * some, and ran ~5% slower than 4 x 2). Two rows take 4 outputs of Q4_0, Q4_1, Q8_0 (unpacked
 * 8 weights at a time) but 2 of the others, whose group of 32 unpacked quants also takes
 * registers (2 x 4 ran 10-15% slower for Gemma 3's Q5_0 and Q4_K). Five to eight rows take the
 * tall tile: with AVX2's 16 registers one output at a time (8 accumulators, quant_tiles_avx2.c),
 * with AVX-512's 32 two (below), or the pairs tile. Past 8 rows, unpacking a tile once into a
 * buffer for all of them is faster (16 rows: 3.3 against 4.1 ms a row for the default model's
 * matmuls through 4-row register tiles). The width and the tile change no bit: each output is its
 * own sum, its terms in the same order. */
#define QW 8
#define FUSED_ROWS 4
/* AVX2 hosts take up to TALL_ROWS rows on the register path (quant_tiles_avx2.c's qtile_tall1), and
 * so do AVX-512 hosts whose 512-bit operations are split in two (Zen 4: bp_pairs_pay is 0): with
 * 32 registers, 8 rows x 2 outputs keep their 16 accumulators and the unpacking in registers, one 8-lane FMA per row and weight chunk, where
 * the pairs tile (below) runs a 16-lane FMA (two halves' work on Zen 4) per pair of rows: 5 rows
 * cost as 6, and the unpacked chunk is copied to both halves. Measured on Zen 4 (the default
 * model's matmuls and Q8_0 LM head, bench/step_cost.py's shapes): 5, 6, 7, 8 rows took 0.82,
 * 0.92, 0.78, 0.87 of the pairs tile's time; a 5-row step costs 1.18 of a 4-row one, not 1.44. */
#define TALL_ROWS 8
static inline int fused_width(int type, int64_t M) {
    if (M == 1) return QW;
    return M == 2 && (type == T_Q4_0 || type == T_Q4_1 || type == T_Q8_0) ? QW / 2 : 2;
}

/* sums[i * QW + j] = row i of x (mt rows interleaved by 8) . weight row j (nt rows,
 * row_bytes apart) over K; prefetch: the next tile's bytes. */
typedef void (*qtile_fn)(const float *x, const uint8_t *w, int64_t row_bytes, float *sums, int64_t K, int mt, int nt,
                         const uint8_t *prefetch);

/* The tile for a weight of this type on the instruction set in use, or NULL: the portable
 * build, and types with nothing to unpack (F16, BF16, F32), go through the buffer. */
BP_INTERNAL qtile_fn bp_pick_qtile(int type);

/* A row of this type's weights unpacked as the register path unpacks them (the same floats as
 * the type's dequant, vectorized), or NULL: the type's dequant then fills the buffer. */
BP_INTERNAL dequant_fn bp_pick_unpack_row(int type);

/* ---- AVX-512, a batch's decode step (bp_fused_rows < M <= xp_max_rows): x packed in pairs ----
 *
 * With 32 registers, XP_ROWS rows of x (4 pairs, bp_pack_pairs) against XP_WIDTH weight rows
 * keep 16 accumulators, so each block is unpacked in registers once for 8 rows, where the
 * buffer stores and reloads every weight. Up to 8 rows that wins for every type (Zen 5: 1.1-1.3x
 * on the default model's and Gemma 3's matmuls, 2.4x on Q6_K); at 16 (two passes, two
 * unpackings) only where the buffer's unpacking is dear: Q8_0 (Gemma 3's 262,144-row LM head
 * 1.3x) and Q6_K (1.6x), while Q4_1, Q5_0 and Q4_K ran 0.87-0.96x. (8 pairs x 2 weight rows
 * read x from L2 twice as often and ran ~20% slower.) */
#define XP_ROWS 8
#define XP_WIDTH 4
static inline int xp_max_rows(int type) { return type == T_Q8_0 || type == T_Q6_K ? 16 : 8; }

/* sums[i * QW + j] = row i of the mt rows whose pairs start at xp (pairs `stride` floats
 * apart) against weight row j of nt, row_bytes apart; prefetch: the next tile's bytes. */
typedef void (*xtile_fn)(const float *xp, int64_t stride, const uint8_t *w, int64_t row_bytes, float *sums,
                         int64_t K, int mt, int nt, const uint8_t *prefetch);

/* The 16-row tile for this type, or NULL (below AVX-512, and for F16, BF16, F32). */
BP_INTERNAL xtile_fn bp_pick_xtile(int type);
/* Whether the AVX-512 one-row tile pairs two weight rows a register on this CPU (isa.c). */
BP_INTERNAL int bp_pairs_pay(void);
/* The most rows the register path takes for this type here: TALL_ROWS at the AVX2 level and on an
 * AVX-512 host where pairs do not pay, else FUSED_ROWS (quant_tiles_pick.c). */
BP_INTERNAL int bp_fused_rows(int type);

/* ---- the register path's twins: one name, a file per instruction set (ggml's way) ----
 *
 * Each picks by type among its own file's tiles (NULL for a type it has none for):
 * quant_tiles_avx2.c (AVX2 + FMA), quant_tiles_avx512.c; quant_tiles_pick.c chooses between them
 * with BP_PICK (bp_pick_*). No portable twin: the portable build goes through the buffer. */
#ifdef BP_X86
BP_INTERNAL qtile_fn bp_qtile_avx512(int type);
BP_INTERNAL qtile_fn bp_qtile_avx2(int type);
BP_INTERNAL dequant_fn bp_unpack_row_avx2(int type);
BP_INTERNAL xtile_fn bp_xtile_avx512(int type);
#endif
/* aarch64 (quant_tiles_neon.c): Q4_0, Q4_1, Q8_0, Q4_K and Q6_K's tiles at BP_ISA_NEON. */
#ifdef BP_ARM
BP_INTERNAL qtile_fn bp_qtile_neon(int type);
#endif
#endif
