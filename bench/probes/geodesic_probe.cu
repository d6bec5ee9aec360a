// Stand-alone probe of the geodesics example's RK4 step (examples/geodesics.rs): what bounds a
// step, measured on plain kernels outside the manifold. For GPU hosts without Rust:
//
//     nvcc -O3 -std=c++17 -arch=sm_90 -o geodesic_probe bench/probes/geodesic_probe.cu
//     ./geodesic_probe [steps] [reps]
//
// Variants, each 18,030 geodesics x `steps` RK4 steps on a 2000 x 601 f32 Γ table, one geodesic a
// thread, 128 threads a block:
//   u64        the table helpers as pptm's op helpers were (64-bit index arithmetic);
//   u32        32-bit index arithmetic, floor and conversion in one instruction;
//   u32+pf     u32, and a prefetch to L1 of the cells the next step will read;
//   flat       u32 on a table of one row repeated (every read an L1 hit): the arithmetic alone;
//   u32/bN     u32 at N threads a block;
//   */runs     as the manifold runs it (512-thread blocks, 64 registers, an equal run a block);
//   resident   2 blocks an SM as a manifold's grid, the first n/128 working (where they land);
//   +spin      the others polling a device flag meanwhile, as idle manifold blocks poll.
// It prints the median and p99 of cudaEvent time over `reps` runs, and each variant's largest
// difference from the u64 variant's end states.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                        \
        }                                                                                        \
    } while (0)

constexpr int ROWS = 2000, COLS = 601;

enum Index { U64, U32, U32_PREFETCH };

template <Index I>
__device__ __forceinline__ float bilinear(const float* __restrict__ t, unsigned rows, unsigned cols, float x, float y) {
    const float xm = (float)(rows - 1), ym = (float)(cols - 1);
    x = fminf(fmaxf(x, 0.f), xm);
    y = fminf(fmaxf(y, 0.f), ym);
    if (I == U64) {
        const float fx = floorf(x), fy = floorf(y);
        const unsigned long long i0 = (unsigned long long)fx, j0 = (unsigned long long)fy;
        const unsigned long long i1 = i0 + 1ull < rows ? i0 + 1ull : i0, j1 = j0 + 1ull < cols ? j0 + 1ull : j0;
        const float tx = x - fx, ty = y - fy;
        const float v00 = __ldg(t + i0 * cols + j0), v01 = __ldg(t + i0 * cols + j1);
        const float v10 = __ldg(t + i1 * cols + j0), v11 = __ldg(t + i1 * cols + j1);
        const float a = v00 + ty * (v01 - v00), b = v10 + ty * (v11 - v10);
        return a + tx * (b - a);
    } else {
        const unsigned i0 = __float2uint_rd(x), j0 = __float2uint_rd(y);
        const float fx = (float)i0, fy = (float)j0;
        const unsigned di = i0 + 1u < rows ? cols : 0u, dj = j0 + 1u < cols ? 1u : 0u;
        const float tx = x - fx, ty = y - fy;
        const float* p = t + (i0 * cols + j0);
        const float v00 = __ldg(p), v01 = __ldg(p + dj);
        const float v10 = __ldg(p + di), v11 = __ldg(p + di + dj);
        const float a = v00 + ty * (v01 - v00), b = v10 + ty * (v11 - v10);
        return a + tx * (b - a);
    }
}

__device__ __forceinline__ void prefetch_l1(const float* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

template <Index I>
__device__ __forceinline__ void integrate(const float* __restrict__ s0, const float* __restrict__ col,
                                          const float* __restrict__ alpha, const float* __restrict__ gamma,
                                          unsigned rows, unsigned cols, float dt, int steps,
                                          float* __restrict__ out, int g) {
    float c = s0[3 * g], v = s0[3 * g + 1], A = s0[3 * g + 2];
    const float y = col[g], al = alpha[g];
    const float h = dt, to_row = 0.5f * ((float)rows - 1.f), w = h / 6.f;
#pragma unroll 4
    for (int k = 0; k < steps; ++k) {
        if (I == U32_PREFETCH) {
            const float xn = fminf(fmaxf((c + h * v + 1.f) * to_row, 0.f), (float)(rows - 1));
            const unsigned i = __float2uint_rd(xn), j = __float2uint_rd(y);
            const float* p = gamma + (i * cols + j);
            prefetch_l1(p);
            if (i + 1u < rows) prefetch_l1(p + cols);
        }
        const float g1 = bilinear<I>(gamma, rows, cols, (c + 1.f) * to_row, y);
        const float k1c = v, k1v = -g1 * v * v, k1a = al * tanhf(c) * v;
        const float c2 = c + 0.5f * h * k1c, v2 = v + 0.5f * h * k1v;
        const float g2 = bilinear<I>(gamma, rows, cols, (c2 + 1.f) * to_row, y);
        const float k2c = v2, k2v = -g2 * v2 * v2, k2a = al * tanhf(c2) * v2;
        const float c3 = c + 0.5f * h * k2c, v3 = v + 0.5f * h * k2v;
        const float g3 = bilinear<I>(gamma, rows, cols, (c3 + 1.f) * to_row, y);
        const float k3c = v3, k3v = -g3 * v3 * v3, k3a = al * tanhf(c3) * v3;
        const float c4 = c + h * k3c, v4 = v + h * k3v;
        const float g4 = bilinear<I>(gamma, rows, cols, (c4 + 1.f) * to_row, y);
        const float k4c = v4, k4v = -g4 * v4 * v4, k4a = al * tanhf(c4) * v4;
        c = c + w * (k1c + 2.f * k2c + 2.f * k3c + k4c);
        v = v + w * (k1v + 2.f * k2v + 2.f * k3v + k4v);
        A = A + w * (k1a + 2.f * k2a + 2.f * k3a + k4a);
    }
    out[3 * g] = c;
    out[3 * g + 1] = v;
    out[3 * g + 2] = A;
}

template <Index I>
__global__ void rk4(const float* __restrict__ s0, const float* __restrict__ col, const float* __restrict__ alpha,
                    const float* __restrict__ gamma, unsigned rows, unsigned cols, float dt, int steps,
                    float* __restrict__ out, int n) {
    const int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g < n) integrate<I>(s0, col, alpha, gamma, rows, cols, dt, steps, out, g);
}

// As the manifold runs it: 512-thread blocks, at most 64 registers a thread, each block an equal
// run of consecutive elements rounded to whole warps (kernels/pptm/fuse.cuh, pptm_map_each).
template <Index I>
__global__ void __launch_bounds__(512, 2) rk4_runs(const float* __restrict__ s0, const float* __restrict__ col,
                                                   const float* __restrict__ alpha, const float* __restrict__ gamma,
                                                   unsigned rows, unsigned cols, float dt, int steps,
                                                   float* __restrict__ out, int n) {
    const int per = ((n + gridDim.x - 1) / gridDim.x + 31) / 32 * 32;
    const int lo = blockIdx.x * per, hi = min(lo + per, n);
    for (int g = lo + threadIdx.x; g < hi; g += blockDim.x)
        integrate<I>(s0, col, alpha, gamma, rows, cols, dt, steps, out, g);
}

// As a manifold of 2 blocks an SM runs it: `work` of the grid's blocks take an equal run each;
// the others poll a device flag (as idle manifold blocks poll the queue) until the last working
// block sets it, or leave at once (spin = 0). Each block records its SM.
template <Index I>
__global__ void __launch_bounds__(512, 2) rk4_resident(const float* __restrict__ s0, const float* __restrict__ col,
                                                       const float* __restrict__ alpha, const float* __restrict__ gamma,
                                                       unsigned rows, unsigned cols, float dt, int steps,
                                                       float* __restrict__ out, int n, int work, int spin,
                                                       unsigned* done, unsigned* smid) {
    if (threadIdx.x == 0) {
        unsigned id;
        asm("mov.u32 %0, %%smid;" : "=r"(id));
        smid[blockIdx.x] = id;
    }
    if ((int)blockIdx.x >= work) {
        if (spin)
            while (*(volatile unsigned*)done < (unsigned)work) __nanosleep(500);
        return;
    }
    const int per = ((n + work - 1) / work + 31) / 32 * 32;
    const int lo = blockIdx.x * per, hi = min(lo + per, n);
    for (int g = lo + threadIdx.x; g < hi; g += blockDim.x)
        integrate<I>(s0, col, alpha, gamma, rows, cols, dt, steps, out, g);
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(done, 1u);
}

int main(int argc, char** argv) {
    const int steps = argc > 1 ? std::atoi(argv[1]) : 1000;
    const int reps = argc > 2 ? std::atoi(argv[2]) : 50;
    std::vector<float> gamma((size_t)ROWS * COLS), flat((size_t)ROWS * COLS), s0, col, alpha;
    for (int i = 0; i < ROWS; ++i) {
        const double c = -1.0 + 2.0 * i / (ROWS - 1);
        for (int j = 0; j < COLS; ++j) {
            const double lam = (double)j / (COLS - 1), ph = 3 * c + 2 * M_PI * lam;
            gamma[(size_t)i * COLS + j] = (float)(0.5 * (0.6 * c + 0.6 * std::cos(ph)) / (1 + 0.3 * c * c + 0.2 * std::sin(ph)));
            flat[(size_t)i * COLS + j] = gamma[j];
        }
    }
    const double levels[6] = {-0.75, -0.45, -0.15, 0.15, 0.45, 0.75};
    for (int a = 0; a < 6; ++a)
        for (int b = 0; b < 6; ++b) {
            if (a == b) continue;
            for (int j = 0; j < COLS; ++j) {
                const double lam = (double)j / (COLS - 1);
                col.push_back((float)j);
                alpha.push_back((float)std::exp(-std::pow((lam - 0.5) / 0.2, 2)));
                s0.push_back((float)levels[a]);
                s0.push_back((float)(levels[b] - levels[a]));
                s0.push_back(0.f);
            }
        }
    const int n = (int)col.size();
    float *d_s0, *d_col, *d_alpha, *d_gamma, *d_flat, *d_out;
    CK(cudaMalloc(&d_s0, s0.size() * 4));
    CK(cudaMalloc(&d_col, n * 4));
    CK(cudaMalloc(&d_alpha, n * 4));
    CK(cudaMalloc(&d_gamma, gamma.size() * 4));
    CK(cudaMalloc(&d_flat, flat.size() * 4));
    CK(cudaMalloc(&d_out, s0.size() * 4));
    CK(cudaMemcpy(d_s0, s0.data(), s0.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_col, col.data(), n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_alpha, alpha.data(), n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_gamma, gamma.data(), gamma.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_flat, flat.data(), flat.size() * 4, cudaMemcpyHostToDevice));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s, %d SMs; %d geodesics x %d steps, %d reps\n", prop.name, prop.multiProcessorCount, n, steps, reps);

    std::vector<float> ref(s0.size()), got(s0.size());
    const float dt = 1.f / steps;
    auto run = [&](const char* name, auto kernel, const float* table, int block, int grid = 0) {
        if (grid == 0) grid = (n + block - 1) / block;
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        std::vector<float> ms;
        for (int r = 0; r < reps + 3; ++r) {
            CK(cudaMemset(d_out, 0xff, s0.size() * 4));
            CK(cudaEventRecord(a));
            kernel<<<grid, block>>>(d_s0, d_col, d_alpha, table, ROWS, COLS, dt, steps, d_out, n);
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float t;
            CK(cudaEventElapsedTime(&t, a, b));
            if (r >= 3) ms.push_back(t * 1000.f);
        }
        CK(cudaGetLastError());
        std::sort(ms.begin(), ms.end());
        CK(cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost));
        double diff = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            const double d = std::fabs((double)got[i] - ref[i]);
            diff = std::isnan(d) ? INFINITY : std::max(diff, d);
        }
        std::printf("%-10s grid %4d block %4d: median %8.1f us  p99 %8.1f us  %5.1f ns/step  max |diff| vs u64 %.2e\n", name,
                    grid, block, ms[ms.size() / 2], ms[std::min(ms.size() - 1, ms.size() * 99 / 100)],
                    ms[ms.size() / 2] * 1000.0 / steps, diff);
        return got;
    };
    ref = run("u64", rk4<U64>, d_gamma, 128);
    run("u64", rk4<U64>, d_gamma, 128);
    run("u32", rk4<U32>, d_gamma, 128);
    run("u32+pf", rk4<U32_PREFETCH>, d_gamma, 128);
    run("flat", rk4<U32>, d_flat, 128);
    for (int b : {32, 64, 256})
        run("u32", rk4<U32>, d_gamma, b);
    const int sms = prop.multiProcessorCount;
    run("u64/runs", rk4_runs<U64>, d_gamma, 512, sms);
    run("u32/runs", rk4_runs<U32>, d_gamma, 512, sms);
    run("u32/runs", rk4_runs<U32>, d_gamma, 512, (n + 127) / 128);
    // A grid of 2 blocks an SM, as a manifold, of which the first (n + 127) / 128 work.
    unsigned *done, *smid;
    CK(cudaMalloc(&done, 4));
    CK(cudaMalloc(&smid, 4 * 2 * sms));
    const int work = (n + 127) / 128;
    for (int spin : {0, 1}) {
        auto k = [&](const float* a, const float* b, const float* c, const float* t, unsigned r, unsigned co,
                     float d, int st, float* o, int nn) {
            cudaMemsetAsync(done, 0, 4);
            rk4_resident<U32><<<2 * sms, 512>>>(a, b, c, t, r, co, d, st, o, nn, work, spin, done, smid);
        };
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        std::vector<float> ms;
        for (int r = 0; r < reps + 3; ++r) {
            CK(cudaMemset(d_out, 0xff, s0.size() * 4));
            CK(cudaEventRecord(a));
            k(d_s0, d_col, d_alpha, d_gamma, ROWS, COLS, dt, steps, d_out, n);
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float t;
            CK(cudaEventElapsedTime(&t, a, b));
            if (r >= 3) ms.push_back(t * 1000.f);
        }
        CK(cudaGetLastError());
        std::sort(ms.begin(), ms.end());
        std::vector<unsigned> ids(2 * sms);
        CK(cudaMemcpy(ids.data(), smid, 4 * ids.size(), cudaMemcpyDeviceToHost));
        std::vector<int> per_sm(256, 0);
        for (int i = 0; i < work; ++i) per_sm[ids[i] % 256]++;
        int used = 0, twice = 0;
        for (int c : per_sm) used += c > 0, twice += c > 1;
        std::printf("resident%s grid %4d (%d working on %d SMs, %d with two): median %8.1f us  p99 %8.1f us\n",
                    spin ? "+spin" : "     ", 2 * sms, work, used, twice, ms[ms.size() / 2],
                    ms[std::min(ms.size() - 1, ms.size() * 99 / 100)]);
    }
    return 0;
}
