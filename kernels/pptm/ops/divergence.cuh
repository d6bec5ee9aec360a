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
//   r = q / p rounded (q * rcp(p), a few ulp), e = q - r p (one fma: the exact remainder, or
//   within an ulp of it), and q ln(q / p) = q ln(r (1 + e / (r p))) = q ln r + e, to second order
//   in e / q (below 1e-13).
// logf is CUDA's accurate log (within 1 ulp of ln r, relative, also where r is near 1), so a term
// is within a few 1e-7 of itself wherever q and p are.
//
// Cost: about 20 more instructions a term than the two fast logs. On an H100 (pptm-bench, device
// medians, 2026-11-24) kl_complexity went from 178 to 193 us at 2^26 terms (2.93 to 2.72 TB/s),
// 5.3 to 6.3 us at 2^20 and 2.1 to 2.7 us at 4096, where one block's threads walk eight terms
// each and the longer chain of dependent instructions per term shows. Software-pipelining the map
// loop's loads (each slot reloaded as soon as it was used) did not win it back (181 us with the
// fast logs, 196 with these), so the loop stays as it was. An earlier try, a series near q = p
// and the ratio's fast log elsewhere, cost about as much.
// Outside the range where the reciprocal and the ratio are normal numbers (p = 0, subnormal or
// huge inputs, NaN), the term falls back to the logs' difference: there |ln(q / p)| is far from 0
// and nothing cancels; p = 0 < q gives +inf and negative inputs NaN, as the reference does.
__device__ __forceinline__ float pptm_rcp_approx(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ float pptm_op_kl_divergence(float q, float p) {
    if (q == 0.0f) return 0.0f;
    const float r = q * pptm_rcp_approx(p);
    if (p >= 0x1p-126f && p <= 0x1p125f && r >= 0x1p-126f && r <= 0x1p127f) {
        if (q == p) return 0.0f;  // exactly, though rcp(p) may be an ulp off
        const float e = fmaf(-r, p, q);
        return fmaf(q, logf(r), e);
    }
    return q * (pptm_ln(q) - pptm_ln(p));
}

#endif  // PPTM_OPS_DIVERGENCE_CUH
