/* The machine's limits, for the bench's roofline (the engine never calls them): the float32
 * FMA peak and the integer-dot peak (each a plain loop on independent accumulators, so no
 * operation waits on another's result, and no memory traffic, on every thread), and the read
 * bandwidth (a sum over a buffer far beyond the caches). `batchproof bench` divides the
 * operations a peak reports by the time the call took, so the limits are this machine's,
 * measured in the same run. */
#include <stdlib.h>
#include <time.h>

#include "kernels.h"
#include "quant_int8.h" /* bp_isa_vnni: which spelling the int8 tiles use at the AVX-512 level */

#define CHUNK 4096 /* iterations between clock reads */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#ifdef BP_X86
#include <immintrin.h>

/* 12 chains of 8 lanes: enough in flight for two FMA units of latency 4-5. */
__attribute__((target("avx2,fma"))) static double fma_avx2(double seconds) {
    __m256 acc[12];
    const __m256 mul = _mm256_set1_ps(0.999999f), add = _mm256_set1_ps(1e-6f);
    for (int j = 0; j < 12; j++) acc[j] = _mm256_set1_ps(1.0f + (float)j);
    double flops = 0, start = now();
    while (now() - start < seconds) {
        for (int i = 0; i < CHUNK; i++)
            for (int j = 0; j < 12; j++) acc[j] = _mm256_fmadd_ps(acc[j], mul, add);
        flops += (double)CHUNK * 12 * 8 * 2;
    }
    __m256 sum = acc[0];
    for (int j = 1; j < 12; j++) sum = _mm256_add_ps(sum, acc[j]);
    volatile float sink = _mm256_cvtss_f32(sum); /* the chains must be computed */
    (void)sink;
    return flops;
}

/* 16 chains of 16 lanes. */
__attribute__((target("avx512f"))) static double fma_avx512(double seconds) {
    __m512 acc[16];
    const __m512 mul = _mm512_set1_ps(0.999999f), add = _mm512_set1_ps(1e-6f);
    for (int j = 0; j < 16; j++) acc[j] = _mm512_set1_ps(1.0f + (float)j);
    double flops = 0, start = now();
    while (now() - start < seconds) {
        for (int i = 0; i < CHUNK; i++)
            for (int j = 0; j < 16; j++) acc[j] = _mm512_fmadd_ps(acc[j], mul, add);
        flops += (double)CHUNK * 16 * 16 * 2;
    }
    __m512 sum = acc[0];
    for (int j = 1; j < 16; j++) sum = _mm512_add_ps(sum, acc[j]);
    volatile float sink = _mm512_reduce_add_ps(sum);
    (void)sink;
    return flops;
}
#endif

/* Portable: 8 scalar chains of multiply-adds (two operations each). */
static double fma_portable(double seconds) {
    float acc[8];
    for (int j = 0; j < 8; j++) acc[j] = 1.0f + (float)j;
    double flops = 0, start = now();
    while (now() - start < seconds) {
        for (int i = 0; i < CHUNK; i++)
            for (int j = 0; j < 8; j++) acc[j] = acc[j] * 0.999999f + 1e-6f;
        flops += (double)CHUNK * 8 * 2;
    }
    volatile float sink = acc[0] + acc[7];
    (void)sink;
    return flops;
}

double bp_fma_peak(double seconds, int num_threads) {
    double (*loop)(double) = BP_PICK(fma_avx512, fma_avx2, fma_portable);
    double flops = 0;
#pragma omp parallel for reduction(+ : flops) num_threads(num_threads)
    for (int t = 0; t < num_threads; t++) flops += loop(seconds);
    return flops;
}

/* ---------------- the integer-dot peak: the int8 numerics' inner operation ---------------- */

/* Unsigned by signed bytes, four products into each int32 lane, as the int8 tiles do. Each
 * chain feeds its accumulator back as the next step's bytes, so the compiler can hoist
 * nothing; the values wrap and saturate freely (only the time counts). */
#ifdef BP_X86
/* vpdpbusd (quant_int8_avx512.c): 64 multiply-adds an instruction; 16 chains for two units
 * of latency 5. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double idot_vnni(double seconds) {
    __m512i acc[16];
    const __m512i b = _mm512_set1_epi8(-3);
    for (int j = 0; j < 16; j++) acc[j] = _mm512_set1_epi8((char)(j + 1));
    double ops = 0, start = now();
    while (now() - start < seconds) {
        for (int i = 0; i < CHUNK; i++)
            for (int j = 0; j < 16; j++) acc[j] = _mm512_dpbusd_epi32(acc[j], acc[j], b);
        ops += (double)CHUNK * 16 * 64 * 2;
    }
    __m512i sum = acc[0];
    for (int j = 1; j < 16; j++) sum = _mm512_add_epi32(sum, acc[j]);
    volatile int sink = _mm512_reduce_add_epi32(sum);
    (void)sink;
    return ops;
}

/* The AVX2 tiles' spelling (quant_int8_avx2.c): two maddubs (u8 x s8 pairs into int16) added
 * in int16, one madd into int32 pairs, one add: 64 multiply-adds. 12 chains (16 registers). */
__attribute__((target("avx2"))) static double idot_avx2(double seconds) {
    __m256i acc[12];
    const __m256i b = _mm256_set1_epi8(-3), c = _mm256_set1_epi8(5), ones = _mm256_set1_epi16(1);
    for (int j = 0; j < 12; j++) acc[j] = _mm256_set1_epi8((char)(j + 1));
    double ops = 0, start = now();
    while (now() - start < seconds) {
        for (int i = 0; i < CHUNK; i++)
            for (int j = 0; j < 12; j++) {
                const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(acc[j], b), _mm256_maddubs_epi16(acc[j], c));
                acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(s16, ones));
            }
        ops += (double)CHUNK * 12 * 64 * 2;
    }
    __m256i sum = acc[0];
    for (int j = 1; j < 12; j++) sum = _mm256_add_epi32(sum, acc[j]);
    volatile int sink = _mm256_extract_epi32(sum, 0);
    (void)sink;
    return ops;
}
#endif

/* Portable (quant_int8.c's scalar integer sums): 8 chains of int8 x int8 into int32. Unsigned
 * arithmetic, so a wrap is defined. */
static double idot_portable(double seconds) {
    uint32_t acc[8];
    for (int j = 0; j < 8; j++) acc[j] = (uint32_t)j + 1;
    double ops = 0, start = now();
    while (now() - start < seconds) {
        for (int i = 0; i < CHUNK; i++)
            for (int j = 0; j < 8; j++) acc[j] += (uint32_t)((int32_t)(int8_t)acc[j] * -3);
        ops += (double)CHUNK * 8 * 2;
    }
    volatile uint32_t sink = acc[0] + acc[7];
    (void)sink;
    return ops;
}

double bp_int_dot_peak(double seconds, int num_threads) {
    double (*loop)(double) = BP_PICK(bp_isa_vnni() ? idot_vnni : idot_avx2, idot_avx2, idot_portable);
    double ops = 0;
#pragma omp parallel for reduction(+ : ops) num_threads(num_threads)
    for (int t = 0; t < num_threads; t++) ops += loop(seconds);
    return ops;
}

/* ---------------- the read bandwidth ---------------- */

/* A sum of 64-bit words: integers, so the compiler may vectorize it (float additions keep
 * their order, one chain bound by the adder's latency rather than by memory). */
static uint64_t sum_words(const uint64_t *w, int64_t n) {
    uint64_t sum = 0;
    for (int64_t i = 0; i < n; i++) sum += w[i];
    return sum;
}

double bp_read_bandwidth(int64_t num_bytes, int num_threads, int num_runs) {
    const int64_t n = num_bytes / (int64_t)sizeof(uint64_t);
    uint64_t *w = n > 0 ? malloc((size_t)n * sizeof(uint64_t)) : NULL;
    if (w == NULL) return 0;
    /* Each thread writes the share it later reads: its pages are placed near it, and are real
     * pages, not the shared zero page a never-written buffer reads. */
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t i = 0; i < n; i++) w[i] = (uint64_t)i;
    double best = 0;
    uint64_t total = 0;
    for (int r = 0; r < num_runs; r++) {
        const double start = now();
#pragma omp parallel for schedule(static) reduction(+ : total) num_threads(num_threads)
        for (int t = 0; t < num_threads; t++) {
            const int64_t lo = n * t / num_threads, hi = n * (t + 1) / num_threads;
            total += sum_words(w + lo, hi - lo);
        }
        const double rate = (double)n * sizeof(uint64_t) / (now() - start);
        if (rate > best) best = rate;
    }
    volatile uint64_t sink = total; /* the sums must be read */
    (void)sink;
    free(w);
    return best;
}
