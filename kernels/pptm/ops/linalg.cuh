// Op family: linear algebra and activations. The elementwise ops are device functions here; the
// output-fusable ops are patterns in pptm/pattern/linear.cuh that codegen instantiates with the
// chain's prologue and epilogue:
//   Gemv   -> pptm_gemv_n  (A x; A f32, or bf16/fp16/E4M3 widened to f32 as it is loaded)
//             pptm_gemv_n_mma (pptm/pattern/mma.cuh: a bf16 or E4M3 A on tensor cores)
//   GemvT  -> pptm_gemv_t  (A^T x; A as pptm_gemv_n's)
//   Matmul -> pptm_matmul  (A W, f32 on CUDA cores)
//             pptm_matmul_mma<pptm_bf16 | pptm_f16> (pptm/pattern/mma.cuh: bf16/fp16 operands on
//             tensor cores, for a stage with tensor_eligible = true)
//   BatchedMatmul -> pptm_matmul_batched (pptm/pattern/linear.cuh: batch products A[s] W[s], f32)
//             pptm_matmul_mma_batched<pptm_bf16 | pptm_f16> (pptm/pattern/mma.cuh: tensor cores)
// CPU references and fusion classes: spec/src/ops/linalg.rs.
#ifndef PPTM_OPS_LINALG_CUH
#define PPTM_OPS_LINALG_CUH

#include "pptm/device.cuh"
#include "pptm/pattern/linear.cuh"
#include "pptm/pattern/mma.cuh"

// Axpby: alpha x + beta y.
__device__ __forceinline__ float pptm_op_axpby(float x, float y, float alpha, float beta) { return alpha * x + beta * y; }
__device__ __forceinline__ double pptm_op_axpby(double x, double y, double alpha, double beta) { return alpha * x + beta * y; }

// BeliefUpdate: mu + lr g.
__device__ __forceinline__ float pptm_op_belief_update(float g, float mu, float lr) { return mu + lr * g; }
__device__ __forceinline__ double pptm_op_belief_update(double g, double mu, double lr) { return mu + lr * g; }

// Square: x^2.
__device__ __forceinline__ float pptm_op_square(float x) { return x * x; }
__device__ __forceinline__ double pptm_op_square(double x) { return x * x; }

// AddBias: x + b (b is the column's bias; codegen indexes it by column).
__device__ __forceinline__ float pptm_op_add_bias(float x, float b) { return x + b; }
__device__ __forceinline__ double pptm_op_add_bias(double x, double b) { return x + b; }

// Relu: max(x, 0); NaN stays NaN, as the reference's f64::max(NaN, 0) = 0 would not: inputs here
// are finite products, and fmaxf(NaN, 0) = 0 matches f64::max anyway.
__device__ __forceinline__ float pptm_op_relu(float x) { return fmaxf(x, 0.0f); }
__device__ __forceinline__ double pptm_op_relu(double x) { return fmax(x, 0.0); }

// Sigmoid: 1 / (1 + e^-x), with the accurate expf (the 1e-4 bar rules out __expf near 0 outputs).
__device__ __forceinline__ float pptm_op_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ double pptm_op_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

// Tanh.
__device__ __forceinline__ float pptm_op_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double pptm_op_tanh(double x) { return tanh(x); }

// Gelu, exact (erf) form, as PyTorch's default.
__device__ __forceinline__ float pptm_op_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f)); }
__device__ __forceinline__ double pptm_op_gelu(double x) { return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440)); }

#endif  // PPTM_OPS_LINALG_CUH
