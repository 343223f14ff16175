/* What one weight costs on this CPU, step by step, for a single-row decode's exact matmul
 * (quant_tiles.h): the FMA that uses the weight alone, then with the unpacking of its 4-bit
 * quant, its conversion to float, and the FMA that makes it d * q + m (Q4_1). Each loop keeps
 * 8 independent accumulators (latency hidden) and its operands in L1, so what it measures is
 * the CPU's instruction throughput, not memory.
 *
 *     gcc -O2 bench/unpack_cost.c -o /tmp/unpack_cost && /tmp/unpack_cost
 *
 * Not part of the package (no build or test runs it); it is the evidence behind the
 * single-stream limits in docs/batch-invariance.md ("Against llama.cpp"). */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define ACCS 8
#define ITERS 20000000L

static uint8_t quants[4096] __attribute__((aligned(64)));
static float xs[4096] __attribute__((aligned(64)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* 8 weights per accumulator per iteration: `weight` turns the 8 quants q (32-bit lanes) into
 * the floats the FMA multiplies by x. The empty asm keeps the loads inside the loop. */
#define LOOP(NAME, WEIGHT)                                                                          \
    __attribute__((noinline, target("avx2,fma"))) static float NAME(void) {                          \
        __m256 acc[ACCS];                                                                            \
        for (int i = 0; i < ACCS; i++) acc[i] = _mm256_setzero_ps();                                 \
        const __m256 d = _mm256_set1_ps(0.01f), m = _mm256_set1_ps(0.02f);                           \
        const uint8_t *p = quants;                                                                   \
        const float *xp = xs;                                                                        \
        for (long it = 0; it < ITERS; it++) {                                                        \
            _Pragma("GCC unroll 8") for (int i = 0; i < ACCS; i++) {                                 \
                const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * i))); \
                const __m256 w = (WEIGHT);                                                           \
                acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(xp + 8 * (i & 3)), w, acc[i]);              \
            }                                                                                        \
            __asm__ volatile("" : "+r"(p), "+r"(xp));                                                \
        }                                                                                            \
        __m256 s = acc[0];                                                                           \
        for (int i = 1; i < ACCS; i++) s = _mm256_add_ps(s, acc[i]);                                 \
        (void)d, (void)m;                                                                            \
        return s[0];                                                                                 \
    }

/* The FMA alone, its weight a register (no unpacking): the machine's FMA rate. */
__attribute__((noinline, target("avx2,fma"))) static float fma_only(void) {
    __m256 acc[ACCS];
    for (int i = 0; i < ACCS; i++) acc[i] = _mm256_setzero_ps();
    __m256 x = _mm256_loadu_ps(xs), w = _mm256_set1_ps(1.0001f);
    for (long it = 0; it < ITERS; it++) {
        _Pragma("GCC unroll 8") for (int i = 0; i < ACCS; i++) acc[i] = _mm256_fmadd_ps(x, w, acc[i]);
        __asm__ volatile("" : "+x"(x));
    }
    __m256 s = acc[0];
    for (int i = 1; i < ACCS; i++) s = _mm256_add_ps(s, acc[i]);
    return s[0];
}

LOOP(unpacked, _mm256_castsi256_ps(q))
LOOP(converted, _mm256_cvtepi32_ps(q))
LOOP(q4_1_weight, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), m))
LOOP(q4_1_unfused, _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(q)), m))

int main(void) {
    struct {
        const char *name;
        float (*run)(void);
    } steps[] = {
        {"FMA, weight in a register", fma_only},
        {"+ load and widen 8 quants", unpacked},
        {"+ convert to float", converted},
        {"+ fma(d, q, m): Q4_1's exact weight", q4_1_weight},
        {"  (the same as mul then add)", q4_1_unfused},
    };
    double base = 0;
    for (int round = 0; round < 2; round++) {
        printf("round %d: ns per 8 weights (one 8-lane FMA each), and against the FMA alone\n", round + 1);
        for (int i = 0; i < 5; i++) {
            double t = now();
            volatile float sink = steps[i].run();
            (void)sink;
            double per8 = (now() - t) / ((double)ITERS * ACCS) * 1e9;
            if (i == 0) base = per8;
            printf("  %-38s %6.3f ns  %5.2fx\n", steps[i].name, per8, per8 / base);
        }
    }
    return 0;
}
