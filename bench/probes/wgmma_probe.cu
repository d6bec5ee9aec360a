// Stand-alone probe of pattern/wgmma.cuh (the Hopper TMA + wgmma matmul), for GPU hosts without
// Rust:
//
//     nvcc -O3 -std=c++17 -arch=sm_90a -I kernels -o wgmma_probe bench/probes/wgmma_probe.cu -lcuda -lcublas
//     ./wgmma_probe [reps] [batched [case]]
//
// One block an SM, grid-stride over tiles as in a manifold; out = gelu(A W + bias) with bf16 A and
// W. Checks sampled outputs of several shapes (odd ones included) against an f64 reference on the
// same bf16 operands, then times 64 x 256 x 256, 1024^3 and 8192^3 against cuBLAS's bf16 GEMM
// alone (f32 output) with CUDA events: median of `reps` runs after warm-up. Then batched products
// (pptm_matmul_wgmma_batched, its choice of tile and each tile forced) against cuBLAS's strided
// batched GEMM alone. -DPROBE_IDENTITY drops the GELU, -DPROBE_NOSTORE the whole epilogue (for
// seeing what the epilogue costs; the batched checks are then skipped).
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




// As the generated epilogues: `cols` loads the column values (the bias) the pattern hands back.
struct ProbeEpi {
    const float* bias;
    static constexpr uint32_t col_loads = 1;
    __device__ __forceinline__ void cols(uint64_t j, float (&c)[1]) const { c[0] = pptm_ld_cg_f32(bias + j); }
    __device__ __forceinline__ float operator()(uint64_t, uint64_t, float acc, const float (&c)[1]) const {
        const float x = acc + c[0];
#ifdef PROBE_IDENTITY
        return x;  // experiment: the epilogue without GELU
#else
        return 0.5f * x * (1.0f + erff(x * 0.70710678f));
#endif
    }
};

// TILE 0: the pattern's choice (pptm_matmul_wgmma); 256, 129, 128 or 64: that tile forced (256 x
// 192, 256 x 128, 128 x 128, or 128 x 64 with k split in the block).
template <int TILE>
__global__ void __launch_bounds__(PPTM_BLOCK_THREADS, 1)
    probe(const pptm_bf16* A, const pptm_bf16* W, const float* bias, float* out, uint64_t m, uint64_t k, uint64_t n) {
#ifdef PPTM_WGMMA
    const pptm_block_ctx b{blockIdx.x, gridDim.x, nullptr};
    if (TILE == 256)
        pptm_matmul_wgmma_tiled<pptm_bf16, 256, 192>(A, W, m, k, n, ProbeEpi{bias}, out, b);
    else if (TILE == 129)
        pptm_matmul_wgmma_tiled<pptm_bf16, 256, 128>(A, W, m, k, n, ProbeEpi{bias}, out, b);
    else if (TILE == 128)
        pptm_matmul_wgmma_tiled<pptm_bf16, 128, 128>(A, W, m, k, n, ProbeEpi{bias}, out, b);
    else if (TILE == 64)
        pptm_matmul_wgmma_tiled<pptm_bf16, 128, 64, false, 2>(A, W, m, k, n, ProbeEpi{bias}, out, b);
    else
        pptm_matmul_wgmma<pptm_bf16>(A, W, m, k, n, ProbeEpi{bias}, out, b);
#endif
}

template <int TILE>
static void launch(int grid, const void* A, const void* W, const float* bias, float* out, uint64_t m, uint64_t k, uint64_t n) {
    probe<TILE><<<grid, PPTM_BLOCK_THREADS, PPTM_DYNAMIC_SMEM_BYTES>>>((const pptm_bf16*)A, (const pptm_bf16*)W, bias, out, m, k, n);
}

// The TILEs probe() takes, and one launch by a runtime value of it.
static const int kTiles[] = {0, 64, 128, 129, 256};
static void launch_tile(int tile, int grid, const void* A, const void* W, const float* bias, float* out, uint64_t m, uint64_t k,
                        uint64_t n) {
    switch (tile) {
        case 64: launch<64>(grid, A, W, bias, out, m, k, n); break;
        case 128: launch<128>(grid, A, W, bias, out, m, k, n); break;
        case 129: launch<129>(grid, A, W, bias, out, m, k, n); break;
        case 256: launch<256>(grid, A, W, bias, out, m, k, n); break;
        default: launch<0>(grid, A, W, bias, out, m, k, n); break;
    }
}

// `batch` products stacked (pptm_matmul_wgmma_batched). TILE 0: the pattern's choice; 128 or 256:
// that tile forced (128 x 128 or 256 x 192).
template <int TILE>
__global__ void __launch_bounds__(PPTM_BLOCK_THREADS, 1) probe_batched(const pptm_bf16* A, const pptm_bf16* W, const float* bias, float* out,
                                                                       uint64_t batch, uint64_t m, uint64_t k, uint64_t n) {
#ifdef PPTM_WGMMA
    const pptm_block_ctx b{blockIdx.x, gridDim.x, nullptr};
#ifdef PROBE_NOSTORE
    out = nullptr;  // experiment: no epilogue at all
#endif
    if (TILE == 128)
        pptm_matmul_wgmma_tiled<pptm_bf16, 128, 128, true>(A, W, m, k, n, ProbeEpi{bias}, out, b, (uint32_t)batch);
    else if (TILE == 256)
        pptm_matmul_wgmma_tiled<pptm_bf16, 256, 192, true>(A, W, m, k, n, ProbeEpi{bias}, out, b, (uint32_t)batch);
    else if (TILE == 129)
        pptm_matmul_wgmma_tiled<pptm_bf16, 256, 128, true>(A, W, m, k, n, ProbeEpi{bias}, out, b, (uint32_t)batch);
    else
        pptm_matmul_wgmma_batched<pptm_bf16>(batch, A, W, m, k, n, ProbeEpi{bias}, out, b);
#endif
}

template <int TILE>
static void launch_batched(int grid, const void* A, const void* W, const float* bias, float* out, uint64_t batch, uint64_t m, uint64_t k,
                           uint64_t n) {
    probe_batched<TILE><<<grid, PPTM_BLOCK_THREADS, PPTM_DYNAMIC_SMEM_BYTES>>>((const pptm_bf16*)A, (const pptm_bf16*)W, bias, out, batch, m, k,
                                                                               n);
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
    // "batched": only the batched checks and timings; then, if given, only the batched case of
    // that index (for a profiler).
    const bool only_batched = argc > 2 && std::strcmp(argv[2], "batched") == 0;
    const int only_case = argc > 3 ? std::atoi(argv[3]) : -1;
    CK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    CK(cudaFuncSetAttribute(probe<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, PPTM_DYNAMIC_SMEM_BYTES));
    CK(cudaFuncSetAttribute(probe<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, PPTM_DYNAMIC_SMEM_BYTES));
    CK(cudaFuncSetAttribute(probe<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, PPTM_DYNAMIC_SMEM_BYTES));
    CK(cudaFuncSetAttribute(probe<129>, cudaFuncAttributeMaxDynamicSharedMemorySize, PPTM_DYNAMIC_SMEM_BYTES));
    CK(cudaFuncSetAttribute(probe<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, PPTM_DYNAMIC_SMEM_BYTES));
    CK(cudaFuncSetAttribute(probe_batched<129>, cudaFuncAttributeMaxDynamicSharedMemorySize, PPTM_DYNAMIC_SMEM_BYTES));
    CK(cudaFuncSetAttribute(probe_batched<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, PPTM_DYNAMIC_SMEM_BYTES));
    CK(cudaFuncSetAttribute(probe_batched<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, PPTM_DYNAMIC_SMEM_BYTES));
    CK(cudaFuncSetAttribute(probe_batched<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, PPTM_DYNAMIC_SMEM_BYTES));
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
                          {1000, 1000, 1000}, {1024, 1024, 1024}, {129, 4096, 520}, {300, 1000, 72}, {1000, 520, 200},
                          {4096, 4096, 4096}, {8192, 8192, 8192}};
    bool all_ok = true;
    for (const Case& c : cases) {
      if (only_batched) break;
      // Operands packed for this shape (row-major m x k and k x n).
      CK(cudaMemcpy(dA, hA.data(), c.m * c.k * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dW, hW.data(), c.k * c.n * 2, cudaMemcpyHostToDevice));
      for (const int tile : kTiles) {
        CK(cudaMemset(dout, 0xff, c.m * c.n * 4));  // NaN poison
        launch_tile(tile, grid, dA, dW, dbias, dout, c.m, c.k, c.n);
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
        std::printf("check tile %3d %5llu x %5llu x %5llu: %s (worst %.2e of the terms' magnitude, %llu of %llu samples bad, %llu unwritten)\n",
                    tile, (unsigned long long)c.m, (unsigned long long)c.k, (unsigned long long)c.n, ok ? "ok" : "WRONG", worst,
                    (unsigned long long)bad, (unsigned long long)samples, (unsigned long long)nan_all);
      }
    }

    cublasHandle_t handle;
    cublasCreate(&handle);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const Case timed[] = {{64, 256, 256},     {256, 256, 256},    {512, 512, 512},    {1000, 1000, 1000}, {1024, 1024, 1024},
                          {1024, 4096, 1024}, {1536, 1536, 1536}, {2048, 2048, 2048}, {2048, 8192, 2048},
                          {3072, 3072, 3072}, {4096, 4096, 4096}, {8192, 8192, 8192}};
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
    for (const Case& c : timed) {
        if (only_batched) break;
        const float ours = median([&] { launch<0>(grid, dA, dW, dbias, dout, c.m, c.k, c.n); });
        const float t64 = median([&] { launch<64>(grid, dA, dW, dbias, dout, c.m, c.k, c.n); });
        const float t128 = median([&] { launch<128>(grid, dA, dW, dbias, dout, c.m, c.k, c.n); });
        const float t256 = median([&] { launch<256>(grid, dA, dW, dbias, dout, c.m, c.k, c.n); });
        const float t129 = median([&] { launch<129>(grid, dA, dW, dbias, dout, c.m, c.k, c.n); });
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
        std::printf("     forced tiles: 128x64 split-k %9.1f us, 128x128 %9.1f us, 256x128 %9.1f us, 256x192 %9.1f us\n", t64, t128, t129,
                    t256);
    }

    // Batched products: A batch x m x k, W batch x k x n, out batch x m x n, stacked row-major.
    struct BatchCase {
        uint64_t batch, m, k, n;
        bool timed;
    };
    const BatchCase batches[] = {{3, 128, 64, 128, false},   {5, 200, 128, 136, false},  {2, 300, 192, 264, false},
                                 {256, 128, 128, 128, true}, {128, 256, 256, 256, true}, {64, 512, 512, 512, true},
                                 {16, 1024, 1024, 1024, true}};
    for (const BatchCase& c : batches) {
        if (only_case >= 0 && &c != &batches[only_case]) continue;
        const uint64_t sa = c.m * c.k, sw = c.k * c.n, so = c.m * c.n;
        CK(cudaMemcpy(dA, hA.data(), c.batch * sa * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dW, hW.data(), c.batch * sw * 2, cudaMemcpyHostToDevice));
        auto check = [&](const char* name, auto&& launch) {
            CK(cudaMemset(dout, 0xff, c.batch * so * 4));
            launch();
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            std::vector<float> h(c.batch * so);
            CK(cudaMemcpy(h.data(), dout, h.size() * 4, cudaMemcpyDeviceToHost));
            const uint64_t total = h.size(), samples = std::min<uint64_t>(total, 4096);
            double worst = 0;
            uint64_t bad = 0, nan_all = 0;
            for (uint64_t s = 0; s < samples; ++s) {
                const uint64_t idx = samples == total ? s : (s * 2654435761ull + 17) % total;
                const uint64_t q = idx / so, i = idx % so / c.n, j = idx % c.n;
                double acc = 0, mag = 0;
                for (uint64_t p = 0; p < c.k; ++p) {
                    const double t = from_bf16(hA[q * sa + i * c.k + p]) * from_bf16(hW[q * sw + p * c.n + j]);
                    acc += t;
                    mag += std::fabs(t);
                }
                const double x = acc + hb[j];
#ifdef PROBE_IDENTITY
                const double want = x;
#else
                const double want = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
#endif
                const double err = std::fabs(h[idx] - want) / (mag + std::fabs(hb[j]) + 1e-30);
                worst = std::max(worst, std::isnan(err) ? 1e30 : err);
                if (!(err <= 1e-5)) ++bad;
            }
            for (float v : h) nan_all += std::isnan(v);
#ifdef PROBE_NOSTORE
            (void)name;
            return;
#endif
            const bool ok = bad == 0 && nan_all == 0;
            all_ok &= ok;
            std::printf("check %s %4llu x %4llu x %4llu x %4llu: %s (worst %.2e, %llu bad, %llu unwritten)\n", name,
                        (unsigned long long)c.batch, (unsigned long long)c.m, (unsigned long long)c.k, (unsigned long long)c.n,
                        ok ? "ok" : "WRONG", worst, (unsigned long long)bad, (unsigned long long)nan_all);
        };
        const auto chosen = [&] { launch_batched<0>(grid, dA, dW, dbias, dout, c.batch, c.m, c.k, c.n); };
        const auto small = [&] { launch_batched<128>(grid, dA, dW, dbias, dout, c.batch, c.m, c.k, c.n); };
        const auto large = [&] { launch_batched<256>(grid, dA, dW, dbias, dout, c.batch, c.m, c.k, c.n); };
        const auto wide = [&] { launch_batched<129>(grid, dA, dW, dbias, dout, c.batch, c.m, c.k, c.n); };
        check("chosen", chosen);
        check("128x128", small);
        check("256x192", large);
        check("256x128", wide);
        if (!c.timed) continue;
        const float alpha = 1.0f, beta = 0.0f;
        const auto blas = [&] {
            cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, (int)c.n, (int)c.m, (int)c.k, &alpha, dW, CUDA_R_16BF, (int)c.n,
                                       (long long)sw, dA, CUDA_R_16BF, (int)c.k, (long long)sa, &beta, dout, CUDA_R_32F, (int)c.n,
                                       (long long)so, (int)c.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        };
        // Chosen is timed first and again last: the first timing follows the host's checks, during
        // which the GPU idles (and its clocks may fall).
        const float t0 = median(chosen), t1 = median(small), t2 = median(large), tw = median(wide), tb = median(blas), t3 = median(chosen);
        const double flop = 2.0 * c.batch * c.m * c.n * c.k;
        std::printf("time batched %4llu x %4llu x %4llu x %4llu: chosen %7.1f us, 128x128 %7.1f, 256x192 %7.1f, cuBLAS strided GEMM alone "
                    "%7.1f (%.0f TFLOP/s; ours best %.0f), ratio %.3f; chosen again %7.1f\n",
                    (unsigned long long)c.batch, (unsigned long long)c.m, (unsigned long long)c.k, (unsigned long long)c.n, t0, t1, t2,
                    tb, flop / tb * 1e-6, flop / std::min(t1, t2) * 1e-6, tb / t0, t3);
        std::printf("     forced 256x128 %7.1f us\n", tw);
    }
    std::printf(all_ok ? "ALL CHECKS OK\n" : "SOME CHECKS FAILED\n");
    return all_ok ? 0 : 1;
}
