// Op family: divergences between distributions. Each op here is elementwise; its CPU reference and
// fusion class live beside its catalog entry in spec/src/ops/.
#ifndef PPTM_OPS_DIVERGENCE_CUH
#define PPTM_OPS_DIVERGENCE_CUH

#include "pptm/device.cuh"

// One term of the Kullback-Leibler divergence: q ln(q / p), with 0 ln 0 = 0 (and 0 ln(0/0) = 0).
// p = 0 < q gives +inf, as the definition does; q = p gives exactly 0.
//
// Accuracy. ln q - ln p cancels where q and p are close: each log carries an absolute error near
// ulp(ln x), so a single term came out 2e-5 off relative to itself (a random n = 1 test on an
// H200), and the KL of two nearly equal distributions, a sum of such terms, lost three digits. So
// the term takes ln(q / p) whole:
//   * within 1/16 of each other (|s| < 1/16, s = (q - p) / (q + p)): 2 atanh(s) by its series.
//     q - p is exact there, s carries the reciprocal's 1 ulp, and four terms leave out less than
//     s^8 / 9 < 1e-10 of the sum;
//   * elsewhere: ln of the ratio q * (1 / p), whose rounding (a few 1e-7) is small against
//     |ln(q / p)| > 1/8, so within about 3e-6;
//   * where the ratio or a reciprocal would leave the normal range (subnormal or huge inputs):
//     ln q - ln p, as before. Negative inputs give NaN there, as the reference does.
// Reciprocals are rcp.approx: an IEEE division cost kl_complexity at 2^26 a third of its bandwidth
// on an H200 (its slow path is a call, and the streaming loop spilled around it).
__device__ __forceinline__ float pptm_rcp_approx(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ float pptm_op_kl_divergence(float q, float p) {
    if (q == 0.0f) return 0.0f;
    const float d = q - p, sum = q + p;
    if (p > 0.0f && sum > 0x1p-100f && sum < 0x1p100f && fabsf(d) < 0.0625f * sum) {
        const float s = d * pptm_rcp_approx(sum), s2 = s * s;
        const float series = fmaf(s2, fmaf(s2, fmaf(s2, 0.14285715f, 0.2f), 0.33333334f), 1.0f);
        return q * (2.0f * s * series);
    }
    const float r = q * pptm_rcp_approx(p);
    if (p >= 0x1p-126f && r >= 0x1p-126f && r < 0x1p127f) return q * pptm_ln(r);
    return q * (pptm_ln(q) - pptm_ln(p));
}

#endif  // PPTM_OPS_DIVERGENCE_CUH
