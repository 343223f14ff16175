/* The register path's AVX-512 twin (quant.h): quant_tiles_body.h's 8-lane code with 32 registers,
 * and 16-lane registers holding two weight rows (one row of x) or two rows of x (a batch's
 * decode step: bp_pick_xtile).
 *
 * One row of x against a full tile of QW weight rows: rows 2p and 2p + 1 share a 16-lane
 * register, row 2p in its lower half, each half that row's 8-lane accumulator taking the
 * same terms in the same order as the 8-lane code (16 lanes of one row would sum other
 * terms together). A CPU with 512-bit units then unpacks, converts, scales and accumulates
 * two rows' weights an instruction (Zen 5: a decode step's Q4_1 matmuls ran ~1.4x faster).
 * Each weight is the same float: the same integer, the same scale, the same operation. */
#include "quant_tiles_body.h"

#ifdef BP_X86
#define ZTARGET "avx2,fma,f16c,avx512f,avx512vl,avx512dq,avx512bw"
#define ZINLINE static inline __attribute__((always_inline, target(ZTARGET)))

ZINLINE __m512 pair_ps(__m256 lo, __m256 hi) { return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1); }

/* Rows a and b's d and m (as chunk_weights takes them), a's in the lower half. Scales kept
 * in the block convert with F16C, exact for every half (subnormals included; a signalling
 * NaN comes out quiet, as the first multiply or FMA makes it on the 8-lane path). */
ZINLINE void pair_scales(const uint8_t *ba, const uint8_t *bb, const int type, const int g, const float *sa,
                         const float *sb, __m512 *d, __m512 *m) {
    if (is_k_quant(type)) {
        __m256 da, ma, db, mb;
        group_scales(ba, type, g, sa, &da, &ma);
        group_scales(bb, type, g, sb, &db, &mb);
        *d = pair_ps(da, db);
        *m = pair_ps(ma, mb);
        return;
    }
    /* d (and Q4_1 / Q5_1's m) are a block's first 4 bytes: halves [d_a, m_a, d_b, m_b] */
    const __m128 dm = _mm_cvtph_ps(_mm_set_epi32(0, 0, (int)u32le(bb), (int)u32le(ba)));
    const __m512 dm16 = _mm512_castps128_ps512(dm);
    *d = _mm512_permutexvar_ps(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), dm16);
    *m = type == T_Q4_1 || type == T_Q5_1
             ? _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), dm16)
             : *d;
}

/* chunk_weights for rows a (lower half) and b: weights 8c..8c+7 of the group of each. qa and
 * qb: Q4_0 / Q4_1's 16 quant bytes, or group_q's lo (and *_hi its hi) of the others. */
ZINLINE __m512 pair_chunk(const uint8_t *ba, const uint8_t *bb, const int type, const int c, __m512 d, __m512 m,
                          __m128i qa, __m128i qb, __m128i qa_hi, __m128i qb_hi) {
    if (type == T_Q8_0) {
        const __m128i q = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(ba + 2 + 8 * c)),
                                             _mm_loadl_epi64((const __m128i *)(bb + 2 + 8 * c)));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
    }
    if (type == T_Q4_0 || type == T_Q4_1) { /* bytes 0..7 (c = 0, 2) or 8..15 (c = 1, 3) of each */
        const __m128i bytes = c & 1 ? _mm_unpackhi_epi64(qa, qb) : _mm_unpacklo_epi64(qa, qb);
        __m512i q = _mm512_cvtepu8_epi32(bytes);
        q = c < 2 ? _mm512_and_si512(q, _mm512_set1_epi32(0x0F)) : _mm512_srli_epi32(q, 4);
        return type == T_Q4_1 ? _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(q), m)
                              : _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(8))));
    }
    const __m128i a = c < 2 ? qa : qa_hi, b = c < 2 ? qb : qb_hi;
    const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c & 1 ? _mm_unpackhi_epi64(a, b)
                                                                    : _mm_unpacklo_epi64(a, b)));
    switch (type) {
    case T_Q5_0: return _mm512_mul_ps(d, q);
    case T_Q6_K: return _mm512_mul_ps(c < 2 ? d : m, q);
    default: return _mm512_fmadd_ps(d, q, m);
    }
}

/* qtile_narrow's one-row full tile (mt = 1, nt = QW), two weight rows a register. */
ZINLINE void qtile_pairs(const float *x, const uint8_t *w, int64_t row_bytes, const int type, float *sums,
                         int64_t K, const uint8_t *prefetch) {
    __m512 acc[QW / 2];
    float kscale[QW][16];
    for (int p = 0; p < QW / 2; p++) acc[p] = _mm512_setzero_ps();
    const int bytes = block_bytes(type), groups = is_k_quant(type) ? 8 : 1;
    for (int64_t b = 0; b < K / 32; b++) {
        const int g = (int)(b % groups);
        const uint8_t *blocks = w + b / groups * bytes;
        if (groups > 1 && g == 0)
            for (int j = 0; j < QW; j++) k_scales(blocks + j * row_bytes, type, kscale[j]);
        __m512 xc[4]; /* x's chunk c in both halves, for every pair */
        for (int c = 0; c < 4; c++) xc[c] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + 32 * b + 8 * c));
        _Pragma("GCC unroll 4")
        for (int p = 0; p < QW / 2; p++) {
            const uint8_t *ba = blocks + 2 * p * row_bytes, *bb = ba + row_bytes;
            _mm_prefetch((const char *)(prefetch + (b * QW + 2 * p) * 64), _MM_HINT_T0);
            _mm_prefetch((const char *)(prefetch + (b * QW + 2 * p + 1) * 64), _MM_HINT_T0);
            __m512 d, m;
            pair_scales(ba, bb, type, g, kscale[2 * p], kscale[2 * p + 1], &d, &m);
            __m128i qa, qb, qa_hi = _mm_setzero_si128(), qb_hi = _mm_setzero_si128();
            if (type == T_Q4_0 || type == T_Q4_1) {
                qa = load16(ba + (type == T_Q4_1 ? 4 : 2));
                qb = load16(bb + (type == T_Q4_1 ? 4 : 2));
            } else {
                group_q(ba, type, g, &qa, &qa_hi);
                group_q(bb, type, g, &qb, &qb_hi);
            }
            _Pragma("GCC unroll 4")
            for (int c = 0; c < 4; c++)
                acc[p] = _mm512_fmadd_ps(xc[c], pair_chunk(ba, bb, type, c, d, m, qa, qb, qa_hi, qb_hi), acc[p]);
        }
    }
    for (int p = 0; p < QW / 2; p++) {
        sums[2 * p] = hsum_avx2(_mm512_castps512_ps256(acc[p]));
        sums[2 * p + 1] = hsum_avx2(_mm512_extractf32x8_ps(acc[p], 1));
    }
}

/* Up to XP_ROWS rows of x, packed in pairs (lanes.h), against nt <= XP_WIDTH weight rows:
 * each row's chunk of 8 weights (chunk_weights: the same floats) in both halves of a register,
 * one FMA per pair of rows of x. quant.h says why. */
ZINLINE void qtile_xpairs(const float *xp, int64_t stride, const uint8_t *w, int64_t row_bytes, const int type,
                          float *sums, int64_t K, const int pairs, const int mt, const int nt,
                          const uint8_t *prefetch) {
    __m512 acc[XP_ROWS / 2][XP_WIDTH];
    float kscale[XP_WIDTH][16];
    for (int p = 0; p < pairs; p++)
        for (int j = 0; j < nt; j++) acc[p][j] = _mm512_setzero_ps();
    const int bytes = block_bytes(type), groups = is_k_quant(type) ? 8 : 1;
    for (int64_t b = 0; b < K / 32; b++) {
        const int g = (int)(b % groups);
        const uint8_t *blocks = w + b / groups * bytes;
        if (groups > 1 && g == 0)
            for (int j = 0; j < nt; j++) k_scales(blocks + j * row_bytes, type, kscale[j]);
        __m256 d[XP_WIDTH], m[XP_WIDTH];
        __m128i lo[XP_WIDTH], hi[XP_WIDTH];
        for (int j = 0; j < nt; j++) {
            const uint8_t *blk = blocks + j * row_bytes;
            _mm_prefetch((const char *)(prefetch + (b * nt + j) * 64), _MM_HINT_T0);
            group_scales(blk, type, g, kscale[j], &d[j], &m[j]);
            group_q(blk, type, g, &lo[j], &hi[j]);
        }
        _Pragma("GCC unroll 4")
        for (int c = 0; c < 4; c++) {
            __m512 wz[XP_WIDTH];
            for (int j = 0; j < nt; j++) {
                const __m256 wc = chunk_weights(blocks + j * row_bytes, type, g, c, d[j], m[j], lo[j], hi[j], 0);
                wz[j] = pair_ps(wc, wc);
            }
            const float *xc = xp + 2 * (32 * b + 8 * c);
            for (int p = 0; p < pairs; p++) {
                const __m512 xv = _mm512_loadu_ps(xc + p * stride);
                for (int j = 0; j < nt; j++) acc[p][j] = _mm512_fmadd_ps(xv, wz[j], acc[p][j]);
            }
        }
    }
    for (int p = 0; p < pairs; p++)
        for (int j = 0; j < nt; j++) {
            sums[2 * p * QW + j] = hsum_avx2(_mm512_castps512_ps256(acc[p][j]));
            if (2 * p + 1 < mt) sums[(2 * p + 1) * QW + j] = hsum_avx2(_mm512_extractf32x8_ps(acc[p][j], 1));
        }
}

#define XTILE_FN(NAME, TYPE)                                                                                   \
    __attribute__((target(ZTARGET))) static void NAME(const float *xp, int64_t stride, const uint8_t *w,        \
                                                      int64_t row_bytes, float *sums, int64_t K, int mt, int nt, \
                                                      const uint8_t *prefetch) {                                \
        if (nt == XP_WIDTH) { /* constant pairs and width: the accumulators stay in registers */            \
            switch ((mt + 1) / 2) {                                                                             \
            case 4: qtile_xpairs(xp, stride, w, row_bytes, TYPE, sums, K, 4, mt, XP_WIDTH, prefetch); return;   \
            case 3: qtile_xpairs(xp, stride, w, row_bytes, TYPE, sums, K, 3, mt, XP_WIDTH, prefetch); return;   \
            case 2: qtile_xpairs(xp, stride, w, row_bytes, TYPE, sums, K, 2, mt, XP_WIDTH, prefetch); return;   \
            case 1: qtile_xpairs(xp, stride, w, row_bytes, TYPE, sums, K, 1, mt, XP_WIDTH, prefetch); return;   \
            }                                                                                                   \
        }                                                                                                       \
        qtile_xpairs(xp, stride, w, row_bytes, TYPE, sums, K, (mt + 1) / 2, mt, nt, prefetch);                  \
    }

QTILE_BODY(qtile_tall, TALL_ROWS, 2, 0) /* five to eight, in 32 registers (quant.h's TALL_ROWS) */

/* AVX-512 hosts: two weight rows a register for one row of x where that pays (bp_pairs_pay: not
 * on Zen 4, which splits 512-bit operations), else the 8-lane code with 32 registers. */
#define QTILE_FN_AVX512(NAME, TYPE)                                                                       \
    __attribute__((target(ZTARGET))) static void NAME(const float *x, const uint8_t *w, int64_t row_bytes, \
                                                      float *sums, int64_t K, int mt, int nt,               \
                                                      const uint8_t *prefetch) {                            \
        if (mt == 1 && nt == QW && bp_pairs_pay()) {                                                        \
            qtile_pairs(x, w, row_bytes, TYPE, sums, K, prefetch);                                          \
            return;                                                                                         \
        }                                                                                                   \
        if (mt > FUSED_ROWS) { /* bp_fused_rows: up to TALL_ROWS, 2 outputs a tile */                       \
            switch (nt == 2 ? mt : 0) {                                                                     \
            case 5: qtile_tall(x, w, row_bytes, TYPE, sums, K, 5, 2, prefetch); return;                     \
            case 6: qtile_tall(x, w, row_bytes, TYPE, sums, K, 6, 2, prefetch); return;                     \
            case 7: qtile_tall(x, w, row_bytes, TYPE, sums, K, 7, 2, prefetch); return;                     \
            case 8: qtile_tall(x, w, row_bytes, TYPE, sums, K, 8, 2, prefetch); return;                     \
            default: qtile_tall(x, w, row_bytes, TYPE, sums, K, mt, nt, prefetch); return;                  \
            }                                                                                               \
        }                                                                                                   \
        QTILE_DISPATCH(TYPE);                                                                               \
    }
/* Every quantized type's two tiles (quant.h's BP_QUANT_TYPES): q4_0_avx512 and q4_0_avx512_x, and
 * so on, and each picker's switch among them. */
#define TILES_AVX512(id, name, bytes, elems) QTILE_FN_AVX512(name##_avx512, id) XTILE_FN(name##_avx512_x, id)
BP_QUANT_TYPES(TILES_AVX512)

#define BP_TWIN_FN(name) name##_avx512
qtile_fn bp_qtile_avx512(int type) {
    switch (type) {
    BP_QUANT_TYPES(BP_QUANT_CASE)
    default: return NULL; /* F16, BF16, F32: the buffer (their weights need no unpacking) */
    }
}
#undef BP_TWIN_FN

#define BP_TWIN_FN(name) name##_avx512_x
xtile_fn bp_xtile_avx512(int type) {
    switch (type) {
    BP_QUANT_TYPES(BP_QUANT_CASE)
    default: return NULL;
    }
}
#undef BP_TWIN_FN
#endif
