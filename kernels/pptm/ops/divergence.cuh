// Op family: divergences between distributions. Each op here is elementwise; its CPU reference and
// fusion class live beside its catalog entry in spec/src/ops/.
#ifndef PPTM_OPS_DIVERGENCE_CUH
#define PPTM_OPS_DIVERGENCE_CUH

#include "pptm/device.cuh"

// One term of the Kullback-Leibler divergence: q (ln q - ln p), with 0 ln 0 = 0 (and 0 ln(0/0) = 0).
// p = 0 < q gives +inf, as the definition does; q = p gives exactly 0 (pptm_ln rounds each log on
// its own, so the subtraction is not contracted into an FMA with a different rounding).
__device__ __forceinline__ float pptm_op_kl_divergence(float q, float p) {
    return q == 0.0f ? 0.0f : q * (pptm_ln(q) - pptm_ln(p));
}

#endif  // PPTM_OPS_DIVERGENCE_CUH
