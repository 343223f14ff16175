/* exp, log, sin and cos in double precision from IEEE operations alone (fdlibm's algorithms and
 * coefficients, Sun Microsystems, freely redistributable), for what is computed once per model
 * or per draw rather than per element in a hot loop: the RoPE tables (sample.c).
 *
 * Why not libm's: its last bits differ between glibc versions, between libm builds and CPU
 * variants (a vector libm on one host, a scalar one on another), and torch's own vectorised
 * cos/sin/pow differ by ISA. Every operation here is one rounded +, -, * or / (the build
 * passes -ffp-contract=off: nothing is fused), plus exact steps (nearbyint, frexp, ldexp), so
 * the bits are the same on any IEEE host: x86 at any level, ARM, a VM without AVX. Accuracy is
 * about 1 ulp of a double, far below the float32 the tables are rounded to; what matters is
 * that the answer is one answer. */
#ifndef BP_FIXED_MATH_H
#define BP_FIXED_MATH_H
#include <math.h>

#define FX_LN2_HI 6.93147180369123816490e-01 /* ln 2, its high 32 bits: k * FX_LN2_HI is exact */
#define FX_LN2_LO 1.90821492927058770002e-10
#define FX_INV_LN2 1.44269504088896338700e+00

/* e^x for |x| < 700: x = k ln 2 + r, |r| <= ln2 / 2; e^r by fdlibm's rational form. */
static inline double fx_exp(double x) {
    double k = nearbyint(x * FX_INV_LN2);
    double hi = x - k * FX_LN2_HI, lo = k * FX_LN2_LO;
    double r = hi - lo, t = r * r;
    double c = r - t * (1.66666666666666019037e-01 +
                        t * (-2.77777777770155933842e-03 +
                             t * (6.61375632143793436117e-05 +
                                  t * (-1.65339022054652515390e-06 + t * 4.13813679705723846039e-08))));
    double y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);
    return ldexp(y, (int)k);
}

/* ln x for a finite x > 0: x = 2^k (1 + f), sqrt(2)/2 <= 1 + f < sqrt(2). */
static inline double fx_log(double x) {
    int k;
    double m = frexp(x, &k); /* x = m 2^k, 0.5 <= m < 1 */
    if (m < 0.70710678118654752440) {
        m *= 2.0;
        k -= 1;
    }
    double f = m - 1.0, s = f / (2.0 + f), z = s * s, w = z * z;
    double t1 = w * (3.999999999940941908e-01 + w * (2.222219843214978396e-01 + w * 1.531383769920937332e-01));
    double t2 = z * (6.666666666666735130e-01 +
                     w * (2.857142874366239149e-01 + w * (1.818357216161805012e-01 + w * 1.479819860511658591e-01)));
    double r = t2 + t1, hfsq = 0.5 * f * f, dk = (double)k;
    return dk * FX_LN2_HI - ((hfsq - (s * (hfsq + r) + dk * FX_LN2_LO)) - f);
}

/* sin and cos of r, |r| <= pi/4 (fdlibm's kernels, without the tail term). */
static inline double fx_sin_kernel(double r) {
    double z = r * r, v = z * r;
    double p = 8.33333333332248946124e-03 +
               z * (-1.98412698298579493134e-04 +
                    z * (2.75573137070700676789e-06 + z * (-2.50507602534068634195e-08 + z * 1.58969099521155010221e-10)));
    return r + v * (-1.66666666666666324348e-01 + z * p);
}

static inline double fx_cos_kernel(double r) {
    double z = r * r;
    double p = z * (4.16666666666666019037e-02 +
                    z * (-1.38888888888741095749e-03 +
                         z * (2.48015872894767294178e-05 +
                              z * (-2.75573143513906633035e-07 +
                                   z * (2.08757232129817482790e-09 + z * -1.13596475577881948265e-11)))));
    double hz = 0.5 * z, w = 1.0 - hz;
    return w + (((1.0 - w) - hz) + z * p);
}

/* sin x and cos x for |x| < 2^19 (a position times a frequency <= 1): x = n pi/2 + r, the
 * reduction in three parts of pi/2 whose products with n (< 2^20) are exact. */
static inline void fx_sincos(double x, double *s, double *c) {
    double n = nearbyint(x * 6.36619772367581382433e-01);
    double r = ((x - n * 1.57079632673412561417e+00) - n * 6.07710050630396597660e-11) - n * 2.02226624871116645580e-21;
    double sr = fx_sin_kernel(r), cr = fx_cos_kernel(r);
    switch ((long long)n & 3) {
    case 0: *s = sr, *c = cr; break;
    case 1: *s = cr, *c = -sr; break;
    case 2: *s = -sr, *c = -cr; break;
    default: *s = -cr, *c = sr; break;
    }
}
#endif
