// Op family: divergences between distributions. Each op here is elementwise; its CPU reference and
// fusion class live beside its catalog entry in spec/src/ops/.
#ifndef PPTM_OPS_DIVERGENCE_CUH
#define PPTM_OPS_DIVERGENCE_CUH

#include "pptm/device.cuh"

// One term of the Kullback-Leibler divergence: q ln(q / p), with 0 ln 0 = 0 (and 0 ln(0/0) = 0).
// p = 0 < q gives +inf, as the definition does; q = p gives exactly 0.
//
// Where q and p are close, ln q - ln p cancels: each log carries an absolute error of about 1e-7, so
// a term with q / p = 1.0005 came out 2e-5 off relative to it (found by a random n = 1 test on an
// H200), and the KL of two nearly equal distributions, a sum of such terms, is worth little. There
// the term uses ln(q / p) = 2 atanh(s), s = (q - p) / (q + p): q - p is exact (q and p within a
// factor of 2 of each other), and for |s| < 1/32 three terms of the series are exact to f32
// rounding (the first one left out is below s^6 / 7 < 2e-10 of the sum). Elsewhere |ln(q / p)| >
// 1/16, and the logs' difference is within about 2e-6 of it. Negative inputs take the logs (NaN,
// as the reference's).
__device__ __forceinline__ float pptm_op_kl_divergence(float q, float p) {
    if (q == 0.0f) return 0.0f;
    const float s = (q - p) / (q + p);
    if (fabsf(s) < 0.03125f && p > 0.0f) {
        const float s2 = s * s;
        return q * (2.0f * s * fmaf(s2, fmaf(s2, 0.2f, 0.33333334f), 1.0f));
    }
    return q * (pptm_ln(q) - pptm_ln(p));
}

#endif  // PPTM_OPS_DIVERGENCE_CUH
