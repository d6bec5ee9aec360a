// Op family: prediction errors and their precision-weighted accuracy (active inference). Each op
// here is elementwise; its CPU reference and fusion class live beside its catalog entry in
// spec/src/ops/prediction.rs.
#ifndef PPTM_OPS_PREDICTION_CUH
#define PPTM_OPS_PREDICTION_CUH

#include "pptm/device.cuh"

// Prediction error: obs - pred.
__device__ __forceinline__ float pptm_op_prediction_error(float obs, float pred) { return obs - pred; }
__device__ __forceinline__ double pptm_op_prediction_error(double obs, double pred) { return obs - pred; }

// Precision-weighted error: prec e.
__device__ __forceinline__ float pptm_op_precision_weight(float e, float prec) { return prec * e; }
__device__ __forceinline__ double pptm_op_precision_weight(double e, double prec) { return prec * e; }

// Precision-weighted accuracy of one error: -1/2 prec e^2.
__device__ __forceinline__ float pptm_op_accuracy(float e, float prec) { return -0.5f * prec * e * e; }
__device__ __forceinline__ double pptm_op_accuracy(double e, double prec) { return -0.5 * prec * e * e; }

#endif  // PPTM_OPS_PREDICTION_CUH
