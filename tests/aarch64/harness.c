/* The kernels' bits as digests, one line per case: `name sha256-of-the-output-bytes`.
 *
 * Built from the kernels' C files with setup.py's flags, natively and for aarch64
 * (test_qemu_digests.py runs the latter under qemu-aarch64): every build, at every
 * instruction-set level, must print the same lines. Inputs are fixed pseudo-random values
 * from an integer hash (never a C library's RNG), every float one the hash gives exactly.
 *
 * Usage: harness [level [pairs [vnni]]]: level caps the instruction set (bp_cap_isa_level:
 * 0 portable, 1 AVX2, 2 AVX-512), pairs is bp_prefer_pairs' argument (-1 the CPU's, 0, 1),
 * vnni bp_allow_vnni's (1, 0). Lines starting with '#' say which level ran; they are not
 * compared. On aarch64 level 1 is NEON (the register path's quantized tiles, quant_tiles_neon.c)
 * and 0 the portable code; every other kernel runs its portable code at both. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__aarch64__)
int bp_isa_dotprod(void); /* isa.c (hidden from the library's exports, linked here directly) */
#endif

/* ---------------- SHA-256 (FIPS 180-4), so a digest can be compared with hashlib's ---------------- */

typedef struct {
    uint32_t h[8];
    uint8_t buf[64];
    uint64_t len;
} sha256;

static const uint32_t SHA_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha_block(sha256 *s, const uint8_t *p) {
    uint32_t w[64], v[8];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(v, s->h, sizeof v);
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = v[7] + (ROR(v[4], 6) ^ ROR(v[4], 11) ^ ROR(v[4], 25)) + ((v[4] & v[5]) ^ (~v[4] & v[6])) +
                      SHA_K[i] + w[i];
        uint32_t t2 = (ROR(v[0], 2) ^ ROR(v[0], 13) ^ ROR(v[0], 22)) + ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
        memmove(v + 1, v, 7 * sizeof *v);
        v[4] += t1;
        v[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) s->h[i] += v[i];
}

static sha256 digest; /* the case being hashed */
static const char *digest_name;

static void begin(const char *name) {
    static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(digest.h, H0, sizeof H0);
    digest.len = 0;
    digest_name = name;
}

static void add(const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        digest.buf[digest.len % 64] = p[i];
        if (++digest.len % 64 == 0) sha_block(&digest, digest.buf);
    }
}

static int cases;

static void end(void) {
    uint64_t bits = digest.len * 8;
    uint8_t pad = 0x80, zero = 0, tail[8];
    add(&pad, 1);
    while (digest.len % 64 != 56) add(&zero, 1);
    for (int i = 0; i < 8; i++) tail[i] = (uint8_t)(bits >> (56 - 8 * i));
    add(tail, 8);
    printf("%s ", digest_name);
    for (int i = 0; i < 8; i++) printf("%08x", digest.h[i]);
    printf("\n");
    fflush(stdout);
    cases++;
}

/* One case's name, formatted. */
static char name_buf[64][128];
static int name_next;

static const char *named(const char *fmt, ...) {
    char *s = name_buf[name_next++ % 64];
    va_list args;
    va_start(args, fmt);
    vsnprintf(s, sizeof name_buf[0], fmt, args);
    va_end(args);
    return s;
}

/* ---------------- inputs: an integer hash, never a C library's RNG ---------------- */

static uint64_t mix(uint64_t x) { /* splitmix64's finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint32_t rnd(uint64_t seed, uint64_t i) { return (uint32_t)(mix(mix(seed) ^ i) >> 32); }

/* A float in [-1, 1), a multiple of 2^-23: exact, the same on every host. */
static float rnd_float(uint64_t seed, uint64_t i) {
    return (float)((int32_t)(rnd(seed, i) >> 8) - (1 << 23)) * (1.0f / (1 << 23));
}

static float *floats(int64_t n, uint64_t seed, float scale) {
    float *v = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = rnd_float(seed, (uint64_t)i) * scale;
    return v;
}

/* A float16's bits: a random sign and mantissa, exponent field in [lo, hi] (15 is 2^0). */
static uint16_t rnd_f16(uint64_t seed, uint64_t i, int lo, int hi) {
    uint32_t r = rnd(seed, i);
    return (uint16_t)((r & 0x8000) | ((uint32_t)(lo + (int)((r >> 16) % (uint32_t)(hi - lo + 1))) << 10) |
                      (r & 0x3FF));
}

/* ---------------- weights of every type: random quants, ordinary float16 scales ---------------- */

enum { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14,
       BF16 = 30 };

static const struct {
    int type;
    const char *name;
    int scales[2]; /* byte offsets of a block's float16 d (and min), -1: none */
} TYPES[] = {
    {F32, "f32", {-1, -1}},   {F16, "f16", {-1, -1}},   {BF16, "bf16", {-1, -1}}, {Q4_0, "q4_0", {0, -1}},
    {Q4_1, "q4_1", {0, 2}},   {Q5_0, "q5_0", {0, -1}},  {Q5_1, "q5_1", {0, 2}},   {Q8_0, "q8_0", {0, -1}},
    {Q4_K, "q4_k", {0, 2}},   {Q5_K, "q5_k", {0, 2}},   {Q6_K, "q6_k", {208, -1}},
};
#define NUM_TYPES (int)(sizeof TYPES / sizeof *TYPES)

static int64_t row_bytes_of(int type, int64_t K) { return K / bp_block_elems(type) * bp_block_bytes(type); }

/* [rows, row_bytes] of `type`: random quants, scales of about 0.001 to 0.03 (quant_blocks.py's). */
static uint8_t *weights(int t, int64_t rows, int64_t K, uint64_t seed) {
    const int type = TYPES[t].type;
    const int64_t rb = row_bytes_of(type, K), bb = bp_block_bytes(type), n = rows * rb;
    uint8_t *w = malloc((size_t)n);
    if (type == F32) {
        for (int64_t i = 0; i < rows * K; i++) ((float *)w)[i] = rnd_float(seed, (uint64_t)i);
    } else if (type == F16) {
        for (int64_t i = 0; i < rows * K; i++) ((uint16_t *)w)[i] = rnd_f16(seed, (uint64_t)i, 9, 14);
    } else if (type == BF16) {
        for (int64_t i = 0; i < rows * K; i++) {
            float f = rnd_float(seed, (uint64_t)i);
            uint32_t u;
            memcpy(&u, &f, 4);
            ((uint16_t *)w)[i] = (uint16_t)(u >> 16);
        }
    } else {
        for (int64_t i = 0; i < n; i++) w[i] = (uint8_t)rnd(seed, (uint64_t)i);
        for (int64_t b = 0; b < n / bb; b++)
            for (int s = 0; s < 2; s++)
                if (TYPES[t].scales[s] >= 0) {
                    uint16_t h = rnd_f16(seed + 1 + (uint64_t)s, (uint64_t)b, 5, 10);
                    memcpy(w + b * bb + TYPES[t].scales[s], &h, 2);
                }
    }
    return w;
}

/* The int8 numerics' layout of a quantized weight (NULL for a float type): kernels.py's _int8_part. */
static uint8_t *int8_packed(int type, const uint8_t *w, int64_t rows, int64_t K, int64_t *tile_bytes) {
    const int64_t size = bp_int8_packed_bytes(type, rows, K);
    if (!size) return NULL;
    uint8_t *p = malloc((size_t)size);
    bp_int8_repack(w, type, row_bytes_of(type, K), rows, K, p);
    *tile_bytes = size / ((rows + 7) / 8);
    return p;
}

static int type_index(int type) {
    for (int t = 0; t < NUM_TYPES; t++)
        if (TYPES[t].type == type) return t;
    abort();
}

/* ---------------- the cases ---------------- */

static const int64_t ROWS[] = {1, 2, 3, 4, 5, 8, 13, 20};
#define NUM_ROWS (int)(sizeof ROWS / sizeof *ROWS)

/* y [M, ldy] (+)= x [M, K] w^T (+ b), N of ldy columns: a bias on odd M, accumulating on M % 4 == 1
 * (y starts random), one thread on even M, two on odd: what every row count's path must agree on. */
static void linear_cases(void) {
    const int64_t K = 512, N = 37, ldy = N + 3;
    float *x = floats(20 * K, 11, 1.0f), *bias = floats(N, 12, 0.5f);
    for (int r = 0; r < NUM_ROWS; r++) { /* float32 weights, K with an 8-lane tail */
        const int64_t M = ROWS[r], Kf = 300;
        float *w = floats(N * Kf, 13, 0.25f), *y = floats(M * N, 14, 1.0f);
        bp_linear_f32(x, w, M % 2 ? bias : NULL, y, M, N, Kf, M % 4 == 1, (int)(M % 2) + 1);
        begin(named("linear_f32/m%ld", (long)M));
        add(y, (size_t)(M * N) * 4);
        end();
        free(w);
        free(y);
    }
    for (int t = 0; t < NUM_TYPES; t++) {
        const int type = TYPES[t].type;
        uint8_t *w = weights(t, N, K, 100 + (uint64_t)type);
        int64_t tile_bytes = 0;
        uint8_t *packed = int8_packed(type, w, N, K, &tile_bytes);
        if (packed) {
            begin(named("int8_repack/%s", TYPES[t].name));
            add(packed, (size_t)bp_int8_packed_bytes(type, N, K));
            end();
        }
        for (int numerics = 0; numerics < 2; numerics++) {
            for (int r = 0; r < NUM_ROWS; r++) {
                const int64_t M = ROWS[r];
                float *y = floats(M * ldy, 15, 1.0f);
                if (numerics == 0)
                    bp_linear_q(x, w, type, row_bytes_of(type, K), M % 2 ? bias : NULL, y, ldy, M, N, K, M % 4 == 1,
                                (int)(M % 2) + 1);
                else
                    bp_linear_q_int8(x, packed ? packed : w, type, packed ? tile_bytes : row_bytes_of(type, K),
                                     M % 2 ? bias : NULL, y, ldy, M, N, K, M % 4 == 1, (int)(M % 2) + 1);
                begin(named(numerics ? "linear_q_int8/%s/m%ld" : "linear_q/%s/m%ld", TYPES[t].name, (long)M));
                add(y, (size_t)(M * ldy) * 4);
                end();
                free(y);
            }
        }
        const int64_t ids[] = {0, 36, 5, 5, 17};
        float *rows = malloc(5 * K * sizeof(float));
        bp_dequant_rows(w, type, row_bytes_of(type, K), K, ids, 5, rows);
        begin(named("dequant_rows/%s", TYPES[t].name));
        add(rows, 5 * K * 4);
        end();
        if (packed) {
            bp_int8_dequant_rows(packed, type, K, ids, 5, rows);
            begin(named("int8_dequant_rows/%s", TYPES[t].name));
            add(rows, 5 * K * 4);
            end();
        }
        free(rows);
        free(packed);
        free(w);
    }
    free(x);
    free(bias);
}

static void per_row_cases(void) {
    static const struct {
        int64_t rows, dim;
        float eps;
    } NORMS[] = {{5, 576, 1e-5f}, {3, 640, 1e-6f}, {2, 13, 1e-6f}};
    for (int i = 0; i < 3; i++) {
        const int64_t n = NORMS[i].rows * NORMS[i].dim;
        float *x = floats(n, 20 + (uint64_t)i, 4.0f), *w = floats(NORMS[i].dim, 30 + (uint64_t)i, 2.0f);
        float *y = malloc((size_t)n * 4);
        bp_rms_norm_f32(x, w, y, NORMS[i].rows, NORMS[i].dim, NORMS[i].eps);
        begin(named("rms_norm/d%ld", (long)NORMS[i].dim));
        add(y, (size_t)n * 4);
        end();
        free(x);
        free(w);
        free(y);
    }
    /* gate_up [rows, 2 ffn] with an 8-lane tail, gates over [-16, 16) */
    const int64_t rows = 3, ffn = 1021;
    float *gu = floats(rows * 2 * ffn, 40, 16.0f), *y = malloc((size_t)(rows * ffn) * 4);
    bp_silu_mul_f32(gu, y, rows, ffn, 1);
    begin("silu_mul/random");
    add(y, (size_t)(rows * ffn) * 4);
    end();
    bp_gelu_tanh_mul_f32(gu, y, rows, ffn, 2);
    begin("gelu_tanh_mul/random");
    add(y, (size_t)(rows * ffn) * 4);
    end();
    free(gu);
    free(y);
}

/* test_exp_digest.py's inputs and digest (sha256 of silu's bits, then gelu's): 1,114,114 gates, [-88, 88]
 * in steps of 88 / 2^19, then [-8, 8] in steps of 2^-12, rows of 1021 zero-padded, the up half 1. */
static void exp_dense_case(void) {
    const int64_t coarse = (1 << 20) + 1, fine = (1 << 16) + 1, ffn = 1021;
    const int64_t count = coarse + fine, rows = (count + ffn - 1) / ffn;
    float *gu = calloc((size_t)(rows * 2 * ffn), 4), *silu = malloc((size_t)(rows * ffn) * 4);
    float *gelu = malloc((size_t)(rows * ffn) * 4);
    for (int64_t i = 0; i < rows * ffn; i++) {
        float g = i < coarse ? (float)((i - (1 << 19)) * 88) / 524288.0f
                  : i < count ? (float)(i - coarse - (1 << 15)) / 4096.0f : 0.0f;
        gu[i / ffn * 2 * ffn + i % ffn] = g;
        gu[i / ffn * 2 * ffn + ffn + i % ffn] = 1.0f;
    }
    bp_silu_mul_f32(gu, silu, rows, ffn, 1);
    bp_gelu_tanh_mul_f32(gu, gelu, rows, ffn, 1);
    begin("exp_dense/silu+gelu");
    add(silu, (size_t)(rows * ffn) * 4);
    add(gelu, (size_t)(rows * ffn) * 4);
    end();
    free(gu);
    free(silu);
    free(gelu);
}

/* The RoPE tables of the packaged models and the scalings the loader passes, and rotations by them. */
static void rope_cases(void) {
    float factors[64];
    for (int i = 0; i < 64; i++) /* Llama 3's shape: 1 for high frequencies, 8 for low, smooth between */
        factors[i] = i < 20 ? 1.0f : i >= 44 ? 8.0f : 1.0f + 7.0f * (float)(i - 20) / 24.0f;
    static const struct {
        const char *name;
        int64_t rope_dim;
        double base;
        int64_t max_len;
        int factors;
        float linear;
    } TABLES[] = { /* positions: as many as qemu computes in a few seconds (Gemma's global to 16k) */
        {"smollm2_64_1e5", 64, 100000.0, 8192, 0, 1.0f},
        {"gemma3_global_256_1e6", 256, 1000000.0, 16384, 0, 1.0f},
        {"gemma3_local_256_1e4", 256, 10000.0, 4096, 0, 1.0f},
        {"gemma3_4b_global_256_1e6_linear8", 256, 1000000.0, 4096, 0, 8.0f},
        {"llama3_128_5e5_factors", 128, 500000.0, 4096, 1, 1.0f},
    };
    for (int i = 0; i < 5; i++) {
        const int64_t n = TABLES[i].max_len * (TABLES[i].rope_dim / 2);
        float *c = malloc((size_t)n * 4), *s = malloc((size_t)n * 4);
        bp_rope_tables(TABLES[i].rope_dim, TABLES[i].base, TABLES[i].max_len, TABLES[i].factors ? factors : NULL,
                       TABLES[i].linear, c, s);
        begin(named("rope_tables/%s", TABLES[i].name));
        add(c, (size_t)n * 4);
        add(s, (size_t)n * 4);
        end();
        if (i == 0 || i == 2) { /* rotate 4 rows of 3 heads (stride past them), whole and half rotary dims */
            const int64_t head_dim = TABLES[i].rope_dim, stride = 3 * head_dim + 16;
            const int64_t positions[] = {0, 7, 31, 4095};
            for (int style = 0; style < 2; style++)
                for (int partial = 0; partial < 2; partial++) {
                    float *x = floats(4 * stride, 50 + (uint64_t)(2 * style + partial), 2.0f);
                    const int64_t rope_dim = partial ? head_dim / 2 : head_dim;
                    /* a partial rotary dim reads tables of its own width: these, the first rope_dim / 2 */
                    float *cp = c, *sp = s;
                    if (partial) {
                        cp = malloc((size_t)(TABLES[i].max_len * rope_dim / 2) * 4);
                        sp = malloc((size_t)(TABLES[i].max_len * rope_dim / 2) * 4);
                        for (int64_t p = 0; p < TABLES[i].max_len; p++)
                            for (int64_t j = 0; j < rope_dim / 2; j++) {
                                cp[p * rope_dim / 2 + j] = c[p * head_dim / 2 + j];
                                sp[p * rope_dim / 2 + j] = s[p * head_dim / 2 + j];
                            }
                    }
                    bp_rope_f32(x, 4, stride, 3, head_dim, rope_dim, positions, cp, sp, style);
                    char label[64];
                    snprintf(label, sizeof label, "d%ld/style%d/%s", (long)head_dim, style,
                             partial ? "partial" : "whole");
                    begin(named("rope/%s", label));
                    add(x, (size_t)(4 * stride) * 4);
                    end();
                    if (partial) {
                        free(cp);
                        free(sp);
                    }
                    free(x);
                }
        }
        free(c);
        free(s);
    }
}

/* Logit rows: random, with ties at the maximum, with NaNs and -inf, and with nothing above -inf. */
static float *logit_rows(int64_t B, int64_t V, uint64_t seed) {
    float *l = floats(B * V, seed, 16.0f);
    for (int64_t b = 0; b < B; b++) {
        float *row = l + b * V;
        if (b % 4 == 1) /* ties: the maximum at several ids, and a tied runner-up */
            for (int64_t j = 3; j < V; j += V / 7) row[j] = 20.0f, row[j + 1] = 19.5f;
        if (b % 4 == 2) /* NaNs (never chosen) and -inf */
            for (int64_t j = 0; j < V; j += 97) row[j] = j % 2 ? NAN : -INFINITY;
        if (b % 4 == 3) /* nothing beats -inf */
            for (int64_t j = 0; j < V; j++) row[j] = j % 5 ? -INFINITY : NAN;
    }
    return l;
}

static void logprob_cases(void) {
    static const struct {
        int64_t B, V, k;
    } SHAPES[] = {{4, 49152, 5}, {4, 1000, 20}, {1, 262144, 20}};
    for (int i = 0; i < 3; i++) {
        const int64_t B = SHAPES[i].B, V = SHAPES[i].V, k = SHAPES[i].k;
        float *l = logit_rows(B, V, 60 + (uint64_t)i);
        int64_t *ids = malloc((size_t)(B * k) * 8), *counts = malloc((size_t)B * 8), *first = malloc((size_t)B * 8);
        float *values = malloc((size_t)(B * k) * 4), *row_max = malloc((size_t)B * 4), *log_total = malloc((size_t)B * 4);
        bp_first_max_f32(l, B, V, first);
        begin(named("first_max/v%ld", (long)V));
        add(first, (size_t)B * 8);
        end();
        bp_top_k_logprobs_f32(l, B, V, k, ids, values, row_max, log_total, counts);
        begin(named("top_k_logprobs/v%ld_k%ld", (long)V, (long)k));
        add(ids, (size_t)(B * k) * 8);
        add(values, (size_t)(B * k) * 4);
        add(row_max, (size_t)B * 4);
        add(log_total, (size_t)B * 4);
        add(counts, (size_t)B * 8);
        end();
        free(l);
        free(ids);
        free(counts);
        free(first);
        free(values);
        free(row_max);
        free(log_total);
    }
}

/* bp_sample_f32 on a usable row (banned ids -inf, ties), several requests' parameters. */
static void sample_cases(void) {
    static const struct {
        float temperature;
        int64_t top_k;
        double top_p, min_p, u;
    } PARAMS[] = {
        {1.0f, 0, 1.0, 0.0, 0.3},      {0.7f, 50, 0.9, 0.0, 0.71},  {1.3f, 0, 0.95, 0.05, 0.999},
        {0.5f, 1, 1.0, 0.0, 0.5},      {1.0f, 0, 0.5, 0.1, 0.0},    {0.2f, 40, 0.8, 0.02, 0.123456789},
        {2.0f, 0, 0.999, 0.0, 0.9999}, {1.0f, 4096, 1.0, 0.0, 0.5},
    };
    const int64_t sizes[] = {4096, 262144};
    for (int v = 0; v < 2; v++) {
        const int64_t V = sizes[v];
        float *usable = floats(V, 70 + (uint64_t)v, 8.0f), *processed = malloc((size_t)V * 4);
        for (int64_t j = 0; j < V; j += 13) usable[j] = -INFINITY;
        for (int64_t j = 5; j < V; j += V / 5) usable[j] = 9.0f; /* ties at the maximum */
        for (int p = 0; p < (int)(sizeof PARAMS / sizeof *PARAMS); p++) {
            if (v == 1 && p % 2) continue; /* the large row: half the parameters */
            int64_t chosen = bp_sample_f32(usable, V, PARAMS[p].temperature, PARAMS[p].top_k, PARAMS[p].top_p,
                                           PARAMS[p].min_p, PARAMS[p].u, processed);
            char label[48];
            snprintf(label, sizeof label, "v%ld/p%d", (long)V, p);
            begin(named("sample/%s", label));
            add(&chosen, 8);
            add(processed, (size_t)V * 4);
            end();
        }
        free(usable);
        free(processed);
    }
}

/* Decode rows of different lengths and slots, windows 0 and 16; a prompt's rows from a start. */
static void attention_cases(void) {
    static const struct {
        int64_t H, KVH, D;
    } SHAPES[] = {{4, 2, 64}, {4, 1, 256}, {3, 3, 40}};
    const int64_t slots_n = 3, max_len = 48;
    for (int i = 0; i < 3; i++) {
        const int64_t H = SHAPES[i].H, KVH = SHAPES[i].KVH, D = SHAPES[i].D;
        const int64_t cache = slots_n * KVH * max_len * D;
        float *k = floats(cache, 80 + (uint64_t)i, 2.0f), *vc = floats(cache, 90 + (uint64_t)i, 1.0f);
        const float scale = D == 64 ? 0.125f : D == 256 ? 0.0625f : 0.15811388f;
        for (int window = 0; window <= 16; window += 16) {
            const int64_t B = 3, slots[] = {2, 0, 1}, lengths[] = {1, 48, 23};
            float *q = floats(B * H * D, 100 + (uint64_t)i, 2.0f), *out = malloc((size_t)(B * H * D) * 4);
            bp_decode_attention_f32(q, k, vc, out, slots, lengths, B, H, KVH, D, max_len, window, scale, 2);
            char label[48];
            snprintf(label, sizeof label, "h%ld_kv%ld_d%ld/w%d", (long)H, (long)KVH, (long)D, window);
            begin(named("decode_attention/%s", label));
            add(out, (size_t)(B * H * D) * 4);
            end();
            free(q);
            free(out);
            const int64_t n = 9, start = 5;
            q = floats(n * H * D, 110 + (uint64_t)i, 2.0f);
            out = malloc((size_t)(n * H * D) * 4);
            bp_prompt_attention_f32(q, k, vc, out, 1, start, n, H, KVH, D, max_len, window, scale, 2);
            begin(named("prompt_attention/%s", label));
            add(out, (size_t)(n * H * D) * 4);
            end();
            free(q);
            free(out);
        }
        free(k);
        free(vc);
    }
}

/* ---------------- the fused decode step: a llama-like and a gemma3-like pair of layers ---------------- */

typedef struct {
    uint8_t *blocks[BP_MAX_PARTS], *packed[BP_MAX_PARTS];
} owned;

/* A weight of parts (type, rows) over K, in blocks or (numerics int8) in the int8 layout. */
static bp_weight make_weight(owned *o, int numerics, int64_t K, int num_parts, const int *types,
                             const int64_t *rows, uint64_t seed) {
    bp_weight w = {.num_parts = num_parts};
    for (int p = 0; p < num_parts; p++) {
        o->blocks[p] = weights(type_index(types[p]), rows[p], K, seed + (uint64_t)p);
        o->packed[p] = NULL;
        int64_t tile_bytes = 0;
        if (numerics == BP_NUMERICS_INT8) o->packed[p] = int8_packed(types[p], o->blocks[p], rows[p], K, &tile_bytes);
        w.types[p] = types[p];
        w.data[p] = o->packed[p] ? o->packed[p] : o->blocks[p];
        w.rows[p] = rows[p];
        w.row_bytes[p] = o->packed[p] ? tile_bytes : row_bytes_of(types[p], K);
    }
    return w;
}

static void free_owned(owned *o, int num_parts) {
    for (int p = 0; p < num_parts; p++) {
        free(o->blocks[p]);
        free(o->packed[p]);
    }
}

/* A two-layer fused step's digest: its residual stream x (n floats), `extra`'s bytes (its routes,
 * or none), then each layer's K and V caches (`cache` floats each). */
static void digest_step(const char *name, const float *x, int64_t n, const void *extra, size_t extra_bytes,
                        float *const k_cache[2], float *const v_cache[2], int64_t cache) {
    begin(name);
    add(x, (size_t)n * 4);
    if (extra) add(extra, extra_bytes);
    for (int l = 0; l < 2; l++) {
        add(k_cache[l], (size_t)cache * 4);
        add(v_cache[l], (size_t)cache * 4);
    }
    end();
}

static void decode_layers_cases(void) {
    const int64_t dim = 256, ffn = 512, H = 4, KVH = 2, D = 64, max_len = 16, slots_n = 3, M = 3;
    const int64_t positions[] = {0, 4, 15}, slots[] = {1, 2, 0};
    float *cos_g, *sin_g, *cos_l, *sin_l;
    cos_g = malloc((size_t)(max_len * D / 2) * 4);
    sin_g = malloc((size_t)(max_len * D / 2) * 4);
    cos_l = malloc((size_t)(max_len * D / 2) * 4);
    sin_l = malloc((size_t)(max_len * D / 2) * 4);
    bp_rope_tables(D, 1000000.0, max_len, NULL, 1.0f, cos_g, sin_g);
    bp_rope_tables(D, 10000.0, max_len, NULL, 1.0f, cos_l, sin_l);
    for (int gemma = 0; gemma < 2; gemma++)
        for (int numerics = 0; numerics < 2; numerics++) {
            const int64_t cache = slots_n * KVH * max_len * D;
            bp_shape s = {.dim = dim, .ffn_dim = ffn, .num_heads = H, .num_kv_heads = KVH, .head_dim = D,
                          .rope_dim = D, .max_len = max_len, .rope_style = gemma, .mlp_act = gemma,
                          .eps = gemma ? 1e-6f : 1e-5f, .scale = 0.125f, .numerics = numerics};
            bp_layer layers[2];
            owned o[2][4];
            float *norms[2][6], *k_cache[2], *v_cache[2], *bqkv[2];
            const int qkv_parts = gemma ? 1 : 3, gu_parts = 2;
            for (int l = 0; l < 2; l++) {
                const uint64_t seed = 1000 + 100 * (uint64_t)(4 * gemma + 2 * l);
                const int qkv_types_llama[] = {Q4_K, Q4_K, Q6_K}, qkv_types_gemma[] = {Q8_0};
                const int64_t qkv_rows_llama[] = {H * D, KVH * D, KVH * D}, qkv_rows_gemma[] = {(H + 2 * KVH) * D};
                const int wo_type[] = {gemma ? Q5_0 : Q4_0}, gu_types[] = {gemma ? Q5_1 : Q5_K, gemma ? F16 : Q4_1};
                const int down_type[] = {gemma ? Q6_K : (l ? BF16 : Q8_0)};
                const int64_t wo_rows[] = {dim}, gu_rows[] = {ffn, ffn}, down_rows[] = {dim};
                layers[l] = (bp_layer){0};
                layers[l].wqkv = make_weight(&o[l][0], numerics, dim, qkv_parts, gemma ? qkv_types_gemma : qkv_types_llama,
                                             gemma ? qkv_rows_gemma : qkv_rows_llama, seed);
                layers[l].wo = make_weight(&o[l][1], numerics, H * D, 1, wo_type, wo_rows, seed + 10);
                layers[l].w_gate_up = make_weight(&o[l][2], numerics, dim, gu_parts, gu_types, gu_rows, seed + 20);
                layers[l].w_down = make_weight(&o[l][3], numerics, ffn, 1, down_type, down_rows, seed + 30);
                for (int j = 0; j < 6; j++) norms[l][j] = NULL;
                norms[l][0] = floats(dim, seed + 40, 2.0f);
                norms[l][1] = floats(dim, seed + 41, 2.0f);
                layers[l].attn_norm = norms[l][0];
                layers[l].ffn_norm = norms[l][1];
                bqkv[l] = NULL;
                if (gemma) {
                    norms[l][2] = floats(D, seed + 42, 2.0f);
                    norms[l][3] = floats(D, seed + 43, 2.0f);
                    norms[l][4] = floats(dim, seed + 44, 2.0f);
                    norms[l][5] = floats(dim, seed + 45, 2.0f);
                    layers[l].q_norm = norms[l][2];
                    layers[l].k_norm = norms[l][3];
                    layers[l].post_attn_norm = norms[l][4];
                    layers[l].post_ffn_norm = norms[l][5];
                } else {
                    bqkv[l] = floats((H + 2 * KVH) * D, seed + 46, 0.5f);
                    layers[l].bqkv = bqkv[l];
                }
                const int local = gemma && l == 0; /* gemma3: a sliding window and tables of its own */
                layers[l].cos_table = local ? cos_l : cos_g;
                layers[l].sin_table = local ? sin_l : sin_g;
                layers[l].window = local ? 4 : 0;
                k_cache[l] = floats(cache, seed + 50, 2.0f);
                v_cache[l] = floats(cache, seed + 51, 1.0f);
                layers[l].k_cache = k_cache[l];
                layers[l].v_cache = v_cache[l];
            }
            float *x = floats(M * dim, 1234, 1.0f);
            bp_decode_layers(&s, layers, 2, x, M, positions, slots, NULL, 2);
            char label[48];
            snprintf(label, sizeof label, "%s/%s", gemma ? "gemma3_like" : "llama_like", numerics ? "int8" : "f32");
            digest_step(named("decode_layers/%s", label), x, M * dim, NULL, 0, k_cache, v_cache, cache);
            free(x);
            for (int l = 0; l < 2; l++) {
                free_owned(&o[l][0], qkv_parts);
                free_owned(&o[l][1], 1);
                free_owned(&o[l][2], gu_parts);
                free_owned(&o[l][3], 1);
                for (int j = 0; j < 6; j++) free(norms[l][j]);
                free(bqkv[l]);
                free(k_cache[l]);
                free(v_cache[l]);
            }
        }
    free(cos_g);
    free(sin_g);
    free(cos_l);
    free(sin_l);
}

/* An OLMoE-like step (moe.c inside layers.c): two routed layers of 6 experts, 2 used a token (the
 * first not rescaled, the second rescaled), Q and K normalised whole, 3 rows of which two share an
 * expert or more; the router float32, the experts Q4_K / Q5_K (gate, up) and Q6_K (down). */
static void moe_layers_cases(void) {
    const int64_t dim = 256, ffn = 256, H = 4, KVH = 2, D = 64, max_len = 16, slots_n = 3, M = 3, E = 6;
    const int64_t positions[] = {3, 7, 15}, slots[] = {2, 0, 1};
    float *cos_t = malloc((size_t)(max_len * D / 2) * 4), *sin_t = malloc((size_t)(max_len * D / 2) * 4);
    bp_rope_tables(D, 10000.0, max_len, NULL, 1.0f, cos_t, sin_t);
    for (int numerics = 0; numerics < 2; numerics++) {
        const int64_t cache = slots_n * KVH * max_len * D;
        bp_shape s = {.dim = dim, .ffn_dim = 0, .num_heads = H, .num_kv_heads = KVH, .head_dim = D,
                      .rope_dim = D, .max_len = max_len, .rope_style = 1, .mlp_act = BP_ACT_SILU,
                      .eps = 1e-5f, .scale = 0.125f, .numerics = numerics};
        bp_layer layers[2];
        bp_moe moes[2];
        bp_weight gate_up[2][6], down[2][6];
        owned o[2][2], og[2][6], od[2][6];
        float *norms[2][4], *router[2], *k_cache[2], *v_cache[2];
        for (int l = 0; l < 2; l++) {
            const uint64_t seed = 5000 + 1000 * (uint64_t)l;
            const int qkv_types[] = {Q4_K, Q4_K, Q6_K}, wo_type[] = {Q4_K}, gu_types[] = {Q4_K, Q5_K},
                      down_type[] = {Q6_K};
            const int64_t qkv_rows[] = {H * D, KVH * D, KVH * D}, wo_rows[] = {dim}, gu_rows[] = {ffn, ffn},
                          down_rows[] = {dim};
            layers[l] = (bp_layer){0};
            layers[l].wqkv = make_weight(&o[l][0], numerics, dim, 3, qkv_types, qkv_rows, seed);
            layers[l].wo = make_weight(&o[l][1], numerics, H * D, 1, wo_type, wo_rows, seed + 10);
            for (int e = 0; e < E; e++) {
                gate_up[l][e] = make_weight(&og[l][e], numerics, dim, 2, gu_types, gu_rows, seed + 100 + 10 * (uint64_t)e);
                down[l][e] = make_weight(&od[l][e], numerics, ffn, 1, down_type, down_rows, seed + 105 + 10 * (uint64_t)e);
            }
            router[l] = floats(E * dim, seed + 20, 0.5f);
            moes[l] = (bp_moe){.router = {.num_parts = 1, .types = {F32}, .data = {(const uint8_t *)router[l]},
                                          .rows = {E}, .row_bytes = {dim * 4}},
                               .gate_up = gate_up[l], .down = down[l], .num_experts = E, .num_used = 2, .ffn = ffn,
                               .topk_normalised = l};
            layers[l].moe = &moes[l];
            norms[l][0] = floats(dim, seed + 40, 2.0f);
            norms[l][1] = floats(dim, seed + 41, 2.0f);
            norms[l][2] = floats(H * D, seed + 42, 2.0f);
            norms[l][3] = floats(KVH * D, seed + 43, 2.0f);
            layers[l].attn_norm = norms[l][0];
            layers[l].ffn_norm = norms[l][1];
            layers[l].q_norm_full = norms[l][2];
            layers[l].k_norm_full = norms[l][3];
            layers[l].cos_table = cos_t;
            layers[l].sin_table = sin_t;
            k_cache[l] = floats(cache, seed + 50, 2.0f);
            v_cache[l] = floats(cache, seed + 51, 1.0f);
            layers[l].k_cache = k_cache[l];
            layers[l].v_cache = v_cache[l];
        }
        float *x = floats(M * dim, 4321, 1.0f);
        int64_t routes[2 * M * 2];
        bp_decode_layers(&s, layers, 2, x, M, positions, slots, routes, 2);
        digest_step(named("decode_layers/olmoe_like/%s", numerics ? "int8" : "f32"), x, M * dim, routes, sizeof routes,
                    k_cache, v_cache, cache);
        free(x);
        for (int l = 0; l < 2; l++) {
            free_owned(&o[l][0], 3);
            free_owned(&o[l][1], 1);
            for (int e = 0; e < E; e++) {
                free_owned(&og[l][e], 2);
                free_owned(&od[l][e], 1);
            }
            for (int j = 0; j < 4; j++) free(norms[l][j]);
            free(router[l]);
            free(k_cache[l]);
            free(v_cache[l]);
        }
    }
    free(cos_t);
    free(sin_t);
}

int main(int argc, char **argv) {
    if (argc > 1) bp_cap_isa_level(atoi(argv[1]));
    if (argc > 2) bp_prefer_pairs(atoi(argv[2]));
    if (argc > 3) bp_allow_vnni(atoi(argv[3]));
#if defined(__x86_64__)
    const char *arch = "x86_64";
#elif defined(__aarch64__)
    const char *arch = "aarch64";
#else
    const char *arch = "other";
#endif
#if defined(__aarch64__)
    printf("# arch %s isa_level %d dotprod %d\n", arch, bp_isa_level(), bp_isa_dotprod());
#else
    printf("# arch %s isa_level %d\n", arch, bp_isa_level());
#endif
    printf("numerics_version %s\n", bp_numerics_version());
    linear_cases();
    per_row_cases();
    exp_dense_case();
    rope_cases();
    logprob_cases();
    sample_cases();
    attention_cases();
    decode_layers_cases();
    moe_layers_cases();
    printf("# cases %d\n", cases);
    return 0;
}
