// Op family: divergences between distributions. Each op here is elementwise; its CPU reference and
// fusion class live beside its catalog entry in spec/src/ops/.
#ifndef PPTM_OPS_DIVERGENCE_CUH
#define PPTM_OPS_DIVERGENCE_CUH

#include "pptm/device.cuh"

// One term of the Kullback-Leibler divergence: q (ln q - ln p), with 0 ln 0 = 0 (and 0 ln(0/0) = 0).
// p = 0 < q gives +inf, as the definition does; q = p gives exactly 0 (pptm_ln rounds each log on
// its own, so the subtraction is not contracted into an FMA with a different rounding).
//
// Where q and p are close the two logs cancel, and a term is only good to its logs' absolute error
// (about 2^-21 (1 + |ln x|) each): a single term with q / p = 1.0005
// was 2e-5 off relative to itself, and the KL of two nearly equal distributions keeps few digits.
// Taking ln(q / p) whole (2 atanh((q - p) / (q + p)) by its series near q = p, the log of the ratio
// elsewhere) fixed that, but cost kl_complexity at 2^26 a third of its bandwidth on an H200 (196 µs
// against 132): the streaming loop does not overlap a batch's arithmetic with the next batch's
// loads, so every instruction added per element adds to the time. Not done until the map pattern
// pipelines its loads (cp.async into shared memory).
__device__ __forceinline__ float pptm_op_kl_divergence(float q, float p) {
    return q == 0.0f ? 0.0f : q * (pptm_ln(q) - pptm_ln(p));
}

#endif  // PPTM_OPS_DIVERGENCE_CUH
