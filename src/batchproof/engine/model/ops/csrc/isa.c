/* Which instruction set runs, and the name of the arithmetic they all share.
 *
 * Why the same bits on every x86 host: replicas of one server may run on machines with
 * AVX-512, with only AVX2, or on the portable build, and must give the same logits and
 * logprobs. So the instruction set only decides how fast an operation runs, never which
 * operations run: every reduction has one logical layout (8 lanes, lane l fusing the
 * terms k = l mod 8 in increasing k, a zero-padded tail, then the tree of sum8), every
 * elementwise function one sequence of IEEE operations (fused exactly where the vector
 * code fuses: the portable code calls fmaf there, and the build's -ffp-contract=off
 * keeps the compiler from fusing anything else), and nothing calls libm's expf or logf,
 * whose last bit depends on the host's libm and which of its variants the CPU selects.
 * NUMERICS_VERSION names this arithmetic; change it whenever any kernel's bits change.
 */
#include "kernels.h"

#ifdef BP_X86
#include <cpuid.h>
#endif
#ifdef BP_ARM
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20) /* the kernel's bit for the dot product (asm/hwcap.h) */
#endif
#endif

/* v2: the sampled choice, the distribution it draws from and the RoPE tables are ours (sample.c). */
#define NUMERICS_VERSION "fixed-order-w8-v2"

/* The server puts this into the identity of its numbers: replicas agree bit for bit
 * exactly when their kernels report the same version. */
const char *bp_numerics_version(void) { return NUMERICS_VERSION; }

/* ---------------- instruction set: speed only, never bits ---------------- */

static int isa_cap = BP_ISA_AVX512; /* lowered by tests, to run the AVX2 and portable paths here too */
static int vnni_allowed = 1;        /* likewise (bp_allow_vnni) */

static int detected_level = -1; /* the CPU's, found once (the matmuls ask per call) */

/* 2: AVX-512 F, VL, DQ and BW (16-lane registers holding two 8-lane sums where that pays, the
 * AVX2 code with 32 registers elsewhere; the int8 numerics' tiles also ask for VNNI,
 * bp_isa_vnni below), 1: AVX2 + FMA + F16C (on aarch64: NEON), 0: portable. Every level gives the
 * same bits; only the speed differs. */
int bp_isa_level(void) {
    if (detected_level < 0) {
        int level = BP_ISA_PORTABLE;
#ifdef BP_X86
        __builtin_cpu_init();
        const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
        if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw"))
            level = BP_ISA_AVX512;
        else if (avx2)
            level = BP_ISA_AVX2;
#elif defined(BP_ARM)
        level = BP_ISA_NEON; /* baseline on aarch64: nothing to ask the CPU */
#endif
        detected_level = level; /* threads racing here all write the same value */
    }
    return detected_level < isa_cap ? detected_level : isa_cap;
}

void bp_cap_isa_level(int cap) { isa_cap = cap; }

#ifdef BP_X86
static int detected_vnni = -1;

/* AVX-512 VNNI (vpdpbusd: the int8 numerics' integer dots, quant_int8_avx512.c), on top of the
 * AVX-512 level: a CPU may have that level without it. Declared in quant_int8.h; asked only
 * where BP_PICK has chosen the AVX-512 level, so the cap still decides. */
BP_INTERNAL int bp_isa_vnni(void) {
    if (detected_vnni < 0) {
        __builtin_cpu_init();
        detected_vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") ? 1 : 0;
    }
    return detected_vnni && vnni_allowed;
}
#endif

#ifdef BP_ARM
static int detected_dotprod = -1;

/* The Armv8.2 dot product (sdot: the int8 numerics' integer dots, quant_int8_neon.c), which an
 * ARMv8.0 core (Cortex-A53, A72) lacks: the kernel's HWCAP says. Declared in quant_int8.h. */
BP_INTERNAL int bp_isa_dotprod(void) {
    if (detected_dotprod < 0) detected_dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? 1 : 0;
    return detected_dotprod;
}
#endif

/* Whether a 16-lane register holding two weight rows pays for one row of x (quant_tiles_avx512.c):
 * where 512-bit operations run at full width (Zen 5, Intel's AVX-512 parts). AMD's family 25 with
 * AVX-512 (Zen 4) splits each into two 256-bit halves, and there that path ran one row of the
 * default model's matmuls 10% slower than the 8-lane code (5.50 against 4.97 ms, interleaved).
 * Tests force it either way (bp_prefer_pairs: 1 on, 0 off, -1 the CPU's), so both paths run on
 * any AVX-512 host; speed only, never bits. */
static int pairs_forced = -1;
static int pairs_pay = -1;

BP_INTERNAL int bp_pairs_pay(void) {
    if (pairs_forced >= 0) return pairs_forced;
    if (pairs_pay < 0) {
        int pay = 1;
#ifdef BP_X86
        unsigned eax, ebx, ecx, edx;
        if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) && ebx == 0x68747541u /* "Auth"enticAMD */ &&
            __get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
            const unsigned family = ((eax >> 8) & 0xF) + ((eax >> 8 & 0xF) == 0xF ? (eax >> 20) & 0xFF : 0);
            pay = family != 0x19;
        }
#endif
        pairs_pay = pay; /* threads racing here all write the same value */
    }
    return pairs_pay;
}

void bp_prefer_pairs(int prefer) { pairs_forced = prefer; }

/* Tests turn VNNI off to run what an AVX-512 CPU without it runs (AVX-512 quantize, the AVX2
 * twin's tiles) on one that has it; like the cap, it changes the speed only. */
void bp_allow_vnni(int allow) { vnni_allowed = allow; }
