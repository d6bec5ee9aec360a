// Stand-alone probe: how close an f32 GEMV y = A x (A row-major m x n) comes to a plain read of A,
// and which way of walking A gets there. For GPU hosts without Rust:
//
//     nvcc -O3 -std=c++17 -arch=sm_90a -I kernels -o gemv_stream_probe bench/probes/gemv_stream_probe.cu
//     ./gemv_stream_probe [reps] [m] [n]
//
// Kernels, each launched as a manifold runs (512 threads, grid-stride over groups of 64 rows), on
// one and on two blocks an SM:
//   * read:    every element of A read once and summed (the roof: no x, no reductions);
//   * pattern: pptm_gemv_n as the chains run it (x staged in shared memory 2048 at a time, a
//              barrier a chunk, a warp's rows one after the other);
//   * stream:  a warp's four rows walked together over the whole row, x read straight from global
//              memory (through L1 or L2) at the same pieces for all four rows, U pieces of each row
//              a lane in flight; no shared memory, no barrier; each row summed across the warp once.
// Every y is checked against an f64 reference; times are CUDA-event medians and p99 of `reps`.
#include "gemv_probe_common.h"

__device__ __forceinline__ pptm_f4 ld_ca_f4(const float* p) {
    pptm_f4 v;
    asm volatile("ld.global.ca.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

template <int BPS>
__global__ void __launch_bounds__(PPTM_BLOCK_THREADS, BPS) read_kernel(const float* A, float* y, uint64_t m, uint64_t n) {
    const uint64_t n4 = m * n / 4;
    float s = 0.0f;
    constexpr int U = 8;
    for (uint64_t q = (uint64_t)blockIdx.x * PPTM_BLOCK_THREADS + threadIdx.x; q < n4;
         q += (uint64_t)gridDim.x * PPTM_BLOCK_THREADS * U) {
        pptm_f4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const uint64_t i = q + (uint64_t)u * gridDim.x * PPTM_BLOCK_THREADS;
            v[u] = i < n4 ? pptm_ld_cg_f4(A + 4 * i) : pptm_f4{0, 0, 0, 0};
        }
#pragma unroll
        for (int u = 0; u < U; ++u) s += (v[u].x + v[u].y) + (v[u].z + v[u].w);
    }
    if (s == 12345.678f) y[0] = s;  // keeps the loads
}

template <int BPS>
__global__ void __launch_bounds__(PPTM_BLOCK_THREADS, BPS) pattern_kernel(const float* A, const float* x, float* y, uint64_t m,
                                                                          uint64_t n) {
    __shared__ double red[PPTM_WARPS];
    if (threadIdx.x == 0) pptm_beat_word = nullptr;
    __syncthreads();
    const pptm_block_ctx b{blockIdx.x, gridDim.x, red};
    pptm_gemv_n<pptm_no_reducer>(A, m, n, ProbePro{x}, ProbeEpi{}, y, b);
}

// n % 4 == 0 and A 16-byte aligned (the probe's matrices are).
template <int BPS, int U, bool L1X>
__global__ void __launch_bounds__(PPTM_BLOCK_THREADS, BPS) stream_kernel(const float* A, const float* x, float* y, uint64_t m,
                                                                         uint64_t n) {
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const uint64_t n4 = n / 4, groups = (m + 63) / 64;
    for (uint64_t g = blockIdx.x; g < groups; g += gridDim.x) {
        const uint64_t row0 = g * 64 + warp * 4;
        if (row0 >= m) continue;  // warp-uniform
        const uint32_t rows = (uint32_t)min((uint64_t)4, m - row0);
        const float* a[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = A + (row0 + min((uint32_t)r, rows - 1)) * n;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (uint64_t q = lane; q < n4; q += 32 * U) {
            pptm_f4 xv[U], av[4][U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const uint64_t p = q + 32 * u;
                const bool in = p < n4;
                xv[u] = in ? (L1X ? ld_ca_f4(x + 4 * p) : pptm_ld_cg_f4(x + 4 * p)) : pptm_f4{0, 0, 0, 0};
#pragma unroll
                for (int r = 0; r < 4; ++r) av[r][u] = in ? pptm_ld_cg_f4(a[r] + 4 * p) : pptm_f4{0, 0, 0, 0};
            }
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int r = 0; r < 4; ++r) acc[r] += pptm_dot4(av[r][u], xv[u]);
        }
        float mine = 0.0f;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const float s = pptm_warp_sum(acc[r]);
            if (lane == (uint32_t)r) mine = s;
        }
        if (lane < rows) y[row0 + lane] = mine;
    }
}

template <class K>
static void time_it(const char* label, K launch, const float* dy, const std::vector<double>& ref, const std::vector<double>& mag,
                    uint64_t m, uint64_t n, int reps, bool check) {
    float* y = const_cast<float*>(dy);
    if (check) CK(cudaMemset(y, 0xff, m * 4));  // NaN poison
    launch();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    double worst = 0.0;
    if (check) {
        std::vector<float> h(m);
        CK(cudaMemcpy(h.data(), y, m * 4, cudaMemcpyDeviceToHost));
        for (uint64_t i = 0; i < m; ++i) {
            const double e = std::fabs((double)h[i] - ref[i]) / (mag[i] + 1e-30);
            worst = std::isnan(h[i]) ? INFINITY : std::max(worst, e);
        }
    }
    for (int i = 0; i < 3; ++i) launch();
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int i = 0; i < reps; ++i) {
        CK(cudaEventRecord(a));
        launch();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1e3f);
    }
    std::sort(t.begin(), t.end());
    const double med = t[t.size() / 2], p99 = t[std::min(t.size() - 1, t.size() * 99 / 100)];
    std::printf("%-28s %5llu x %-6llu %9.1f us (p99 %9.1f)  %5.2f TB/s  err %s%.1e\n", label, (unsigned long long)m,
                (unsigned long long)n, med, p99, (double)m * n * 4 / (med * 1e-6) / 1e12, check ? "" : "(unchecked) ",
                worst);
}

int main(int argc, char** argv) {
    const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
    std::vector<std::pair<uint64_t, uint64_t>> shapes;
    if (argc > 3)
        shapes.push_back({std::strtoull(argv[2], nullptr, 10), std::strtoull(argv[3], nullptr, 10)});
    else
        shapes = {{16384, 16384}, {4096, 4096}, {8192, 1024}, {1024, 8192}, {256, 256}};
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    std::printf("%s, %d SMs\n", prop.name, sms);
    for (const auto& shape : shapes) {
        const uint64_t m = shape.first, n = shape.second;
        std::mt19937_64 rng(7);
        std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
        std::vector<float> a(m * n), x(n);
        for (auto& v : a) v = uni(rng);
        for (auto& v : x) v = uni(rng);
        std::vector<double> ref(m), mag(m);
        for (uint64_t i = 0; i < m; ++i) {
            double s = 0, g = 0;
            for (uint64_t j = 0; j < n; ++j) {
                s += (double)a[i * n + j] * x[j];
                g += std::fabs((double)a[i * n + j] * x[j]);
            }
            ref[i] = s;
            mag[i] = g;
        }
        float *dA, *dx, *dy;
        CK(cudaMalloc(&dA, m * n * 4));
        CK(cudaMalloc(&dx, n * 4));
        CK(cudaMalloc(&dy, m * 4));
        CK(cudaMemcpy(dA, a.data(), m * n * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice));
        const int g1 = sms, g2 = 2 * sms;
#define RUN(label, grid, kernel, check) \
    time_it(label, [&] { kernel<<<grid, PPTM_BLOCK_THREADS>>>(dA, dx, dy, m, n); }, dy, ref, mag, m, n, reps, check)
        time_it("read A (1/SM)", [&] { read_kernel<1><<<g1, PPTM_BLOCK_THREADS>>>(dA, dy, m, n); }, dy, ref, mag, m, n, reps, false);
        time_it("read A (2/SM)", [&] { read_kernel<2><<<g2, PPTM_BLOCK_THREADS>>>(dA, dy, m, n); }, dy, ref, mag, m, n, reps, false);
        RUN("pattern (1/SM)", g1, pattern_kernel<1>, true);
        RUN("pattern (2/SM)", g2, pattern_kernel<2>, true);
        RUN("stream U1 x:L2 (2/SM)", g2, (stream_kernel<2, 1, false>), true);
        RUN("stream U1 x:L1 (2/SM)", g2, (stream_kernel<2, 1, true>), true);
        RUN("stream U2 x:L1 (2/SM)", g2, (stream_kernel<2, 2, true>), true);
        RUN("stream U2 x:L2 (2/SM)", g2, (stream_kernel<2, 2, false>), true);
        RUN("stream U2 x:L1 (1/SM)", g1, (stream_kernel<1, 2, true>), true);
        RUN("stream U4 x:L1 (1/SM)", g1, (stream_kernel<1, 4, true>), true);
        CK(cudaFree(dA));
        CK(cudaFree(dx));
        CK(cudaFree(dy));
    }
    return 0;
}
