// Op family: reductions that end a fused pass. Each maps to a reducer type from pptm/device.cuh
// (block level) and is finished by the manifold's last-arriving block (grid level).
#ifndef PPTM_OPS_REDUCE_CUH
#define PPTM_OPS_REDUCE_CUH

#include "pptm/device.cuh"

// SumReduction: sum of all terms, accumulated in f64.
typedef pptm_sum_reducer pptm_op_sum_reduction;

// MeanReduction: sum / n (NaN for n = 0).
typedef pptm_mean_reducer pptm_op_mean_reduction;

// MaxReduction: largest term (-inf for n = 0; NaN terms are ignored).
typedef pptm_max_reducer pptm_op_max_reduction;

#endif  // PPTM_OPS_REDUCE_CUH
