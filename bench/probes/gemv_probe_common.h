// What the stand-alone GEMV probes (gemv_probe.cu, gemv_bulk_probe.cu, gemv_stream_probe.cu)
// share: the defines a generated translation unit would set, pptm's device headers with the
// linear and tensor-core patterns, a CUDA error check, and the plain prologue and epilogue
// functors of y = A x.
#pragma once
#define PPTM_BLOCK_THREADS 512
#define PPTM_MAX_K 16
#define PPTM_PAIR_MAX_FEATURES 128
#define PPTM_MATMUL_SMALL_BELOW 64
#define PPTM_MATMUL_DIRECT_ROWS 8
#define PPTM_MATMUL_DIRECT_COLS 16
#define PPTM_MATMUL_DIRECT_MAX_TILES 256
#define PPTM_MMA_LARGE_FROM 128
#define PPTM_WGMMA_FROM 16777216
#define PPTM_DYNAMIC_SMEM_BYTES 231424
#define PPTM_GUARD_SAMPLES 16
#define PPTM_GEMV_N_SHORT_BELOW 8192
#define PPTM_GEMV_MMA_ROWS 16
#define PPTM_GEMV_T_NARROW_BELOW 4096
#define PPTM_GEMV_T_NARROW_COLS 8
#include "pptm/abi.h"
#include "pptm/device.cuh"
#include "pptm/pattern/linear.cuh"
#include "pptm/pattern/mma.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                        \
        }                                                                                        \
    } while (0)

struct ProbePro {
    const float* x;
    __device__ __forceinline__ float operator()(uint64_t j) const { return pptm_ld_cg_f32(x + j); }
};
struct ProbeEpi {
    __device__ __forceinline__ float operator()(uint64_t, float acc) const { return acc; }
};
