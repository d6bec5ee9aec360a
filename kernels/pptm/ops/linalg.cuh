// Op family: linear algebra and the activations the #[pptm::op] subset cannot write (AddBias,
// broadcast; GELU, which needs erf). The elementwise ops are device functions here; the
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

// AddBias: x + b (b is the column's bias; codegen indexes it by column).
__device__ __forceinline__ float pptm_op_add_bias(float x, float b) { return x + b; }
__device__ __forceinline__ double pptm_op_add_bias(double x, double b) { return x + b; }

// Gelu, exact (erf) form, as PyTorch's default.
__device__ __forceinline__ float pptm_op_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f)); }
__device__ __forceinline__ double pptm_op_gelu(double x) { return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440)); }

#endif  // PPTM_OPS_LINALG_CUH
