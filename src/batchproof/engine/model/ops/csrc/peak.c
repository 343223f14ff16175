/* The machine's float32 FMA peak, for the bench's roofline (the engine never calls it): a
 * plain FMA loop on independent accumulators, so no FMA waits on another's result, and no
 * memory traffic, on every thread. `batchproof bench` divides the operations it reports by
 * the time the call took, so the peak is this machine's, measured in the same run. */
#include <time.h>

#include "kernels.h"

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
