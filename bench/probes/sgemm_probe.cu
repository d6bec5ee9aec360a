// Stand-alone probe of pattern/linear.cuh's f32 matmul on CUDA cores (pptm_matmul and its tiles),
// for GPU hosts without Rust:
//
//     nvcc -O3 -std=c++17 -arch=sm_90 -I kernels -o sgemm_probe bench/probes/sgemm_probe.cu -lcublas
//     ./sgemm_probe [reps]
//
// Two blocks an SM of 512 threads with at most 64 registers each (__launch_bounds__(512, 2)), as
// a manifold of a domain with matrix patterns runs them, grid-stride over tiles. out = gelu(A W +
// bias) in f32. Checks sampled outputs of several shapes (odd ones included; the output poisoned
// with NaN first) against an f64 reference, for the pattern's choice of tile and each tile forced,
// then times them against cuBLAS's SGEMM alone (TF32 off, as PyTorch's f32 matmul by default)
// with CUDA events: median of `reps` runs after warm-up.
#define PPTM_BLOCK_THREADS 512
#define PPTM_MAX_K 64
#define PPTM_PAIR_MAX_FEATURES 16
#define PPTM_MATMUL_SMALL_BELOW 64
#define PPTM_MATMUL_LARGE_FROM 128
#define PPTM_MATMUL_DIRECT_ROWS 8
#define PPTM_MATMUL_DIRECT_COLS 16
#define PPTM_MATMUL_DIRECT_MAX_TILES 256
#define PPTM_GEMV_N_SHORT_BELOW 8192
#define PPTM_GEMV_T_NARROW_BELOW 4096
#define PPTM_GEMV_T_NARROW_COLS 8
#include "pptm/abi.h"
#include "pptm/device.cuh"
#include "pptm/pattern/linear.cuh"

#ifndef PROBE_DEVICE_ONLY  // -DPROBE_DEVICE_ONLY -cubin: the kernels alone, to read their registers
#include <cublas_v2.h>
#endif
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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

// As a generated epilogue: the bias of the column, then GELU.
struct ProbeEpi {
    const float* bias;
    __device__ __forceinline__ float operator()(uint64_t, uint64_t j, float acc) const {
        const float x = acc + pptm_ld_cg_f32(bias + j);
        return 0.5f * x * (1.0f + erff(x * 0.70710678f));
    }
};

// TILE 0: the pattern's choice (pptm_matmul); 128, 64 or 32: that tile forced.
template <int TILE>
__global__ void __launch_bounds__(PPTM_BLOCK_THREADS, 2)
    probe(const float* A, const float* W, const float* bias, float* out, uint64_t m, uint64_t k, uint64_t n) {
    __shared__ double red[PPTM_BLOCK_THREADS / 32];
    const pptm_block_ctx b{blockIdx.x, gridDim.x, red};
    if (TILE == 128)
        pptm_matmul_tiled_large(A, W, m, k, n, ProbeEpi{bias}, out, b);
    else if (TILE == 64)
        pptm_matmul_tiled<64>(A, W, m, k, n, ProbeEpi{bias}, out, b);
    else if (TILE == 32)
        pptm_matmul_tiled<32>(A, W, m, k, n, ProbeEpi{bias}, out, b);
    else
        pptm_matmul(A, W, m, k, n, ProbeEpi{bias}, out, b);
}

static void launch(int tile, int grid, const float* A, const float* W, const float* bias, float* out, uint64_t m, uint64_t k, uint64_t n) {
    switch (tile) {
        case 128: probe<128><<<grid, PPTM_BLOCK_THREADS>>>(A, W, bias, out, m, k, n); break;
        case 64: probe<64><<<grid, PPTM_BLOCK_THREADS>>>(A, W, bias, out, m, k, n); break;
        case 32: probe<32><<<grid, PPTM_BLOCK_THREADS>>>(A, W, bias, out, m, k, n); break;
        default: probe<0><<<grid, PPTM_BLOCK_THREADS>>>(A, W, bias, out, m, k, n); break;
    }
}

#ifndef PROBE_DEVICE_ONLY
struct Case {
    uint64_t m, k, n;
};

int main(int argc, char** argv) {
    const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
    CK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    const int grid = 2 * prop.multiProcessorCount;

    const uint64_t cap = 4096ull * 4096;
    float *dA, *dW, *dbias, *dout;
    CK(cudaMalloc(&dA, cap * 4));
    CK(cudaMalloc(&dW, cap * 4));
    CK(cudaMalloc(&dbias, 8192 * 4));
    CK(cudaMalloc(&dout, cap * 4));
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> U(-1.0f, 1.0f);
    std::vector<float> hA(cap), hW(cap), hb(8192);
    for (auto& x : hA) x = U(rng);
    for (auto& x : hW) x = U(rng);
    for (auto& x : hb) x = U(rng);
    CK(cudaMemcpy(dbias, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));

    // Odd shapes (m not a multiple of 128, k and n multiples of 4 but not of 8 or 128), shapes the
    // large tiles refuse (n or k not a multiple of 4) and the bench's.
    const Case cases[] = {{1, 8, 8},          {7, 12, 20},          {1023, 1028, 1540}, {1000, 1000, 2052}, {1539, 260, 1540},
                          {2048, 2047, 2048}, {2049, 2048, 2047},   {1024, 1024, 1024}, {2048, 2048, 2048}, {4096, 4096, 4096}};
    const int tiles[] = {0, 128, 64, 32};
    bool all_ok = true;
    for (const Case& c : cases) {
        CK(cudaMemcpy(dA, hA.data(), c.m * c.k * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dW, hW.data(), c.k * c.n * 4, cudaMemcpyHostToDevice));
        for (const int tile : tiles) {
            // The forced large tiles need k and n multiples of 4 (the pattern's choice checks it).
            if (tile >= 128 && (c.k % 4 != 0 || c.n % 4 != 0)) continue;
            CK(cudaMemset(dout, 0xff, c.m * c.n * 4));  // NaN poison
            launch(tile, grid, dA, dW, dbias, dout, c.m, c.k, c.n);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            std::vector<float> h(c.m * c.n);
            CK(cudaMemcpy(h.data(), dout, h.size() * 4, cudaMemcpyDeviceToHost));
            const uint64_t total = c.m * c.n, samples = std::min<uint64_t>(total, 4096);
            double worst = 0;
            uint64_t bad = 0, nan_all = 0;
            for (uint64_t s = 0; s < samples; ++s) {
                const uint64_t idx = samples == total ? s : (s * 2654435761ull + 17) % total;
                const uint64_t i = idx / c.n, j = idx % c.n;
                double acc = 0, mag = 0;
                for (uint64_t p = 0; p < c.k; ++p) {
                    const double t = (double)hA[i * c.k + p] * hW[p * c.n + j];
                    acc += t;
                    mag += std::fabs(t);
                }
                const double x = acc + hb[j];
                const double want = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
                const double err = std::fabs(h[idx] - want) / (mag + std::fabs(hb[j]) + 1e-30);
                worst = std::max(worst, std::isnan(err) ? 1e30 : err);
                if (!(err <= 1e-5)) ++bad;
            }
            for (float v : h) nan_all += std::isnan(v);
            const bool ok = bad == 0 && nan_all == 0;
            all_ok &= ok;
            std::printf("check tile %3d %5llu x %5llu x %5llu: %s (worst %.2e of the terms' magnitude, %llu of %llu samples bad, %llu unwritten)\n",
                        tile, (unsigned long long)c.m, (unsigned long long)c.k, (unsigned long long)c.n, ok ? "ok" : "WRONG", worst,
                        (unsigned long long)bad, (unsigned long long)samples, (unsigned long long)nan_all);
        }
    }

    cublasHandle_t handle;
    cublasCreate(&handle);
    cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH);  // no TF32
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto median = [&](auto&& run) {
        for (int r = 0; r < 3; ++r) run();
        std::vector<float> t;
        for (int r = 0; r < reps; ++r) {
            CK(cudaEventRecord(e0));
            run();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            t.push_back(ms * 1000.0f);
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    };
    const Case timed[] = {{1024, 1024, 1024}, {1024, 4096, 1024}, {1536, 1536, 1536}, {2048, 2048, 2048}, {3072, 3072, 3072},
                          {4096, 4096, 4096}};
    // Two blocks an SM (the most a domain of matrix patterns allows), then one (a manifold's
    // default, Config::blocks_per_sm).
    for (const int per_sm : {2, 1}) {
        const int g = per_sm * prop.multiProcessorCount;
        for (const Case& c : timed) {
            float t[4];
            for (int q = 0; q < 4; ++q) t[q] = median([&] { launch(tiles[q], g, dA, dW, dbias, dout, c.m, c.k, c.n); });
            const float alpha = 1.0f, beta = 0.0f;
            // Row-major out (m x n) = A W is column-major out^T = W^T A^T.
            const float theirs = median([&] {
                cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, (int)c.n, (int)c.m, (int)c.k, &alpha, dW, (int)c.n, dA, (int)c.k, &beta,
                            dout, (int)c.n);
            });
            const double flop = 2.0 * c.m * c.n * c.k;
            std::printf("time, %d block(s) an SM, %5llu x %5llu x %5llu: pptm_matmul+bias+gelu %8.1f us (%5.1f TFLOP/s), cuBLAS SGEMM alone "
                        "%8.1f us (%5.1f TFLOP/s), ratio %.3f; forced 128: %8.1f, 64: %8.1f, 32: %8.1f us\n",
                        per_sm, (unsigned long long)c.m, (unsigned long long)c.k, (unsigned long long)c.n, t[0], flop / t[0] * 1e-6, theirs,
                        flop / theirs * 1e-6, theirs / t[0], t[1], t[2], t[3]);
        }
    }
    std::printf("%s\n", all_ok ? "all checks passed" : "SOME CHECKS FAILED");
    return all_ok ? 0 : 1;
}
#endif
