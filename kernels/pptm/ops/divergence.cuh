// Op family: divergences between distributions. Each op here is elementwise; its CPU reference and
// fusion class live beside its catalog entry in spec/src/ops/.
#ifndef PPTM_OPS_DIVERGENCE_CUH
#define PPTM_OPS_DIVERGENCE_CUH

#include "pptm/device.cuh"

// One term of the Kullback-Leibler divergence: q ln(q / p), with 0 ln 0 = 0 (and 0 ln(0/0) = 0).
// p = 0 < q gives +inf, as the definition does; q = p gives exactly 0.
//
// Accuracy. ln q - ln p cancels where q and p are close: each fast log carries an absolute error
// near 1e-7, so a term with q / p = 1.0005 came out 2e-5 off relative to itself (a random n = 1
// test on an H200). So the term takes the log of the ratio whole, with the ratio's rounding put
// back:
//   r = q / p rounded (q * rcp(p), a few ulp), e = q - r p (one fma: the remainder, exact or within
//   an ulp of it), and q ln(q / p) = q ln(r (1 + e / (r p))) = q ln r + e, to second order in e / q.
//   ln r, with u = r - 1 (exact where |u| < 1/16):
//   * |u| < 1/16: the series of ln(1 + u) to u^7 (what it leaves out is below 5e-10 of it);
//   * elsewhere: lg2.approx(r) ln 2, whose absolute error (about 2^-22) is below 3e-6 of
//     |ln r| > 1/16.
// So a term is within a few 1e-6 of itself wherever q and p are, and within a few 1e-7 where they
// are close.
// Where the reciprocal or the ratio is not a normal number (p = 0, subnormal or huge inputs, NaN,
// negative inputs), the term is the logs' difference instead: nothing cancels there; p = 0 < q
// gives +inf and negative inputs NaN, as the reference does.
//
// Cost. The streaming loop of kl_complexity is memory-bound only while a term costs about as few
// instructions as the two fast logs did (24 per term in the loop's SASS): CUDA's logf and a
// fallback computed for every term (56 per term, with no branch) ran kl_complexity at 2^26 in
// 174 us instead of 130 on an H200. This form keeps the common path to the reciprocal, one fast
// log, eight FMAs of the series and a select; the fallback is a branch no ordinary term takes.
__device__ __forceinline__ float pptm_rcp_approx(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// ln r for a normal positive r (the caller checks; subnormals are flushed).
__device__ __forceinline__ float pptm_ln_normal(float r) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(r));
    return y * 0.69314718055994530942f;
}

__device__ __forceinline__ float pptm_op_kl_divergence(float q, float p) {
    const float r = q * pptm_rcp_approx(p);
    // p in [2^-126, 2^126) (its reciprocal normal) and r in [2^-126, 2^127): one unsigned compare
    // each on the bits. Zero, negative and NaN inputs fall outside too.
    const bool normal = __float_as_uint(p) - 0x00800000u < 0x7e800000u - 0x00800000u &&
                        __float_as_uint(r) - 0x00800000u < 0x7f000000u - 0x00800000u;
    if (!normal) return q == 0.0f ? 0.0f : q * (pptm_ln(q) - pptm_ln(p));
    const float e = fmaf(-r, p, q);
    const float u = r - 1.0f;
    float s = fmaf(u, 0.14285715f, -0.16666667f);
    s = fmaf(u, s, 0.2f);
    s = fmaf(u, s, -0.25f);
    s = fmaf(u, s, 0.33333334f);
    s = fmaf(u, s, -0.5f);
    const float series = fmaf(s * u, u, u);
    const float ln_r = fabsf(u) < 0.0625f ? series : pptm_ln_normal(r);
    // q = p gives r = 1 + u with u the reciprocal's rounding, and q ln r + e = -q u^2 / 2 (the
    // remainder's second-order term, at most 1e-14 q): 0 exactly by a select. (q != 0 here: q = 0
    // makes r = 0, not normal.)
    return q == p ? 0.0f : fmaf(q, ln_r, e);
}

// The term in f64 (precision = "fp64"), as the CPU reference writes it: ln q - ln p of f32 inputs
// cancels to no worse than 1e-16 / |ln(q / p)| >= 1e-16 / 6e-8 of itself, where q != p.
__device__ __forceinline__ double pptm_op_kl_divergence(double q, double p) { return q == 0.0 ? 0.0 : q * (log(q) - log(p)); }

#endif  // PPTM_OPS_DIVERGENCE_CUH
