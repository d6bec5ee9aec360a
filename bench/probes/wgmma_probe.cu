// Stand-alone probe of pattern/wgmma.cuh (the Hopper TMA + wgmma matmul), for GPU hosts without
// Rust:
//
//     nvcc -O3 -std=c++17 -arch=sm_90a -I kernels -o wgmma_probe bench/probes/wgmma_probe.cu -lcuda -lcublas
//     ./wgmma_probe [reps]
//
// One block an SM, grid-stride over tiles as in a manifold; out = gelu(A W + bias) with bf16 A and
// W. Checks sampled outputs of several shapes (odd ones included) against an f64 reference on the
// same bf16 operands, then times 64 x 256 x 256, 1024^3 and 8192^3 against cuBLAS's bf16 GEMM
// alone (f32 output) with CUDA events: median of `reps` runs after warm-up.
#define PPTM_BLOCK_THREADS 512
#define PPTM_DYNAMIC_SMEM_BYTES (226 * 1024)
#define PPTM_WGMMA_FROM 1
#define PPTM_HOPPER_TENSOR 1
#include "pptm/abi.h"
#include "pptm/device.cuh"
#include "pptm/pattern/wgmma.cuh"

#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                        \
        }                                                                                        \
    } while (0)

#define CU(x)                                                                       \
    do {                                                                            \
        CUresult r_ = (x);                                                          \
        if (r_ != CUDA_SUCCESS) {                                                   \
            const char* m_ = "?";                                                   \
            cuGetErrorString(r_, &m_);                                              \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, m_);     \
            std::exit(1);                                                           \
        }                                                                           \
    } while (0)




struct ProbeEpi {
    const float* bias;
    __device__ __forceinline__ float operator()(uint64_t, uint64_t j, float acc) const {
        const float x = acc + bias[j];
        return 0.5f * x * (1.0f + erff(x * 0.70710678f));
    }
};

__global__ void __launch_bounds__(PPTM_BLOCK_THREADS, 1)
    probe(const pptm_bf16* A, const pptm_bf16* W, const float* bias, float* out, uint64_t m, uint64_t k, uint64_t n) {
#ifdef PPTM_WGMMA
    const pptm_block_ctx b{blockIdx.x, gridDim.x, nullptr};
    pptm_matmul_wgmma<pptm_bf16>(A, W, m, k, n, ProbeEpi{bias}, out, b);
#endif
}

static uint16_t to_bf16(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static double from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

static void encode_template(CUtensorMap* map, void* any, uint32_t box_rows) {
    const cuuint64_t dims[2] = {64, box_rows};
    const cuuint64_t strides[1] = {128};
    const cuuint32_t box[2] = {64, box_rows};
    const cuuint32_t estr[2] = {1, 1};
    CU(cuTensorMapEncodeTiled(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, any, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

struct Case {
    uint64_t m, k, n;
};

int main(int argc, char** argv) {
    const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
    CK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    CK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, PPTM_DYNAMIC_SMEM_BYTES));
    const int grid = prop.multiProcessorCount;

    const uint64_t cap = 8192ull * 8192;
    uint16_t *dA, *dW;
    float *dbias, *dout;
    CK(cudaMalloc(&dA, cap * 2));
    CK(cudaMalloc(&dW, cap * 2));
    CK(cudaMalloc(&dbias, 8192 * 4));
    CK(cudaMalloc(&dout, cap * 4));
    {
        CUtensorMap t[4];
        encode_template(&t[0], dA, 128);
        encode_template(&t[1], dW, 64);
        t[2] = t[0];
        t[3] = t[1];
        CK(cudaMemcpyToSymbol(pptm_tmap_template, t, sizeof(t)));
    }
    std::mt19937_64 rng(42);
    std::uniform_real_distribution<float> U(-1.0f, 1.0f);
    std::vector<uint16_t> hA(cap), hW(cap);
    std::vector<float> hb(8192);
    for (auto& x : hA) x = to_bf16(U(rng));
    for (auto& x : hW) x = to_bf16(U(rng));
    for (auto& x : hb) x = U(rng);
    CK(cudaMemcpy(dbias, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));

    const Case cases[] = {{1, 8, 8},      {17, 64, 64},       {7, 8, 264},        {64, 256, 256}, {127, 72, 264},
                          {1000, 1000, 1000}, {1024, 1024, 1024}, {129, 4096, 520}, {4096, 4096, 4096}, {8192, 8192, 8192}};
    bool all_ok = true;
    for (const Case& c : cases) {
        // Operands packed for this shape (row-major m x k and k x n).
        CK(cudaMemcpy(dA, hA.data(), c.m * c.k * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dW, hW.data(), c.k * c.n * 2, cudaMemcpyHostToDevice));
        CK(cudaMemset(dout, 0xff, c.m * c.n * 4));  // NaN poison
        probe<<<grid, PPTM_BLOCK_THREADS, PPTM_DYNAMIC_SMEM_BYTES>>>((const pptm_bf16*)dA, (const pptm_bf16*)dW, dbias, dout, c.m, c.k,
                                                                    c.n);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        std::vector<float> h(c.m * c.n);
        CK(cudaMemcpy(h.data(), dout, h.size() * 4, cudaMemcpyDeviceToHost));
        const uint64_t total = c.m * c.n;
        const uint64_t samples = std::min<uint64_t>(total, 4096);
        double worst = 0;
        uint64_t bad = 0, poisoned = 0;
        for (uint64_t s = 0; s < samples; ++s) {
            const uint64_t idx = samples == total ? s : (s * 2654435761ull + 17) % total;
            const uint64_t i = idx / c.n, j = idx % c.n;
            double acc = 0, mag = 0;
            for (uint64_t p = 0; p < c.k; ++p) {
                const double t = from_bf16(hA[i * c.k + p]) * from_bf16(hW[p * c.n + j]);
                acc += t;
                mag += std::fabs(t);
            }
            const double x = acc + hb[j];
            const double want = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
            const double got = h[idx];
            if (std::isnan(got)) ++poisoned;
            const double err = std::fabs(got - want) / (mag + std::fabs(hb[j]) + 1e-30);
            worst = std::max(worst, std::isnan(err) ? 1e30 : err);
            if (!(err <= 1e-5)) ++bad;
        }
        // Every element written: none still poisoned.
        uint64_t nan_all = 0;
        for (float v : h) nan_all += std::isnan(v);
        const bool ok = bad == 0 && nan_all == 0;
        all_ok &= ok;
        std::printf("check %5llu x %5llu x %5llu: %s (worst %.2e of the terms' magnitude, %llu of %llu samples bad, %llu unwritten)\n",
                    (unsigned long long)c.m, (unsigned long long)c.k, (unsigned long long)c.n, ok ? "ok" : "WRONG", worst,
                    (unsigned long long)bad, (unsigned long long)samples, (unsigned long long)nan_all);
    }

    cublasHandle_t handle;
    cublasCreate(&handle);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const Case timed[] = {{64, 256, 256}, {1024, 1024, 1024}, {4096, 4096, 4096}, {8192, 8192, 8192}};
    for (const Case& c : timed) {
        auto median = [&](auto&& launch) {
            for (int r = 0; r < 3; ++r) launch();
            std::vector<float> t;
            for (int r = 0; r < reps; ++r) {
                CK(cudaEventRecord(e0));
                launch();
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                t.push_back(ms * 1000.0f);
            }
            std::sort(t.begin(), t.end());
            return t[t.size() / 2];
        };
        const float ours = median([&] {
            probe<<<grid, PPTM_BLOCK_THREADS, PPTM_DYNAMIC_SMEM_BYTES>>>((const pptm_bf16*)dA, (const pptm_bf16*)dW, dbias, dout, c.m, c.k,
                                                                        c.n);
        });
        const float alpha = 1.0f, beta = 0.0f;
        // Row-major out (m x n) = A W is column-major out^T = W^T A^T: cuBLAS gets (n x k) W, (k x m) A.
        const float theirs = median([&] {
            cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, (int)c.n, (int)c.m, (int)c.k, &alpha, dW, CUDA_R_16BF, (int)c.n, dA,
                         CUDA_R_16BF, (int)c.k, &beta, dout, CUDA_R_32F, (int)c.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        });
        const double flop = 2.0 * c.m * c.n * c.k;
        std::printf("time %5llu x %5llu x %5llu: wgmma+bias+gelu %9.1f us (%6.1f TFLOP/s), cuBLAS GEMM alone %9.1f us (%6.1f TFLOP/s), ratio %.3f\n",
                    (unsigned long long)c.m, (unsigned long long)c.k, (unsigned long long)c.n, ours, flop / ours * 1e-6, theirs,
                    flop / theirs * 1e-6, theirs / ours);
    }
    std::printf(all_ok ? "ALL CHECKS OK\n" : "SOME CHECKS FAILED\n");
    return all_ok ? 0 : 1;
}
