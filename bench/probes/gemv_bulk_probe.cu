// Probe: does an f32 GEMV stream A faster through bulk copies into shared memory than through
// registers? For GPU hosts without Rust:
//
//     nvcc -O3 -std=c++17 -arch=sm_90a -I kernels -o gemv_bulk_probe bench/probes/gemv_bulk_probe.cu
//     ./gemv_bulk_probe [reps] [m] [n]
//
// y = A x, A f32 row-major m x n, 512 threads a block, rows in groups of 64 (4 a warp), x staged in
// shared memory 2048 values at a time as pattern/linear.cuh's pptm_gemv_n does. Variants:
//   * pattern, 1 or 2 blocks an SM: pptm_gemv_n itself (each lane keeps 4 16-byte loads in flight,
//     drained at every 2048 values of a row);
//   * bulk<S, SEG>, 1 block an SM: each warp's lane 0 copies the warp's row segments (SEG floats)
//     into a ring of S slots of the warp's own with cp.async.bulk (an mbarrier a slot), S - 1
//     ahead of the one the warp multiplies, so the loads in flight never drain and hold no
//     registers;
//   * copy: a plain read of A (sum of its values), the bandwidth roof of this access.
// Every variant is checked against an f64 reference (1e-4 of the terms' magnitude), then timed by
// CUDA events (median and p99 of `reps`).
#include "gemv_probe_common.h"

template <int PER_SM>
__global__ void __launch_bounds__(PPTM_BLOCK_THREADS, PER_SM) pattern_kernel(const float* A, const float* x, float* out, uint64_t m, uint64_t n) {
    __shared__ double red[PPTM_WARPS];
    if (threadIdx.x == 0) pptm_beat_word = nullptr;
    __syncthreads();
    const pptm_block_ctx b{blockIdx.x, gridDim.x, red};
    pptm_gemv_n<pptm_no_reducer>(A, m, n, ProbePro{x}, ProbeEpi{}, out, b);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void bar_init(uint32_t bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
    for (;;) {
        uint32_t done;
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
        if (done) return;
    }
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global src to shared dst,
// completing on `bar`.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src),
                 "r"(bytes), "r"(bar)
                 : "memory");
}

constexpr uint32_t CH = 2048;  // x values staged at a time

// Bytes of dynamic shared memory bulk<S, SEG> needs: x's two chunks, the rings, the barriers.
template <int S, int SEG>
constexpr size_t bulk_smem() {
    return 2 * CH * 4 + (size_t)PPTM_WARPS * S * SEG * 4 + (size_t)PPTM_WARPS * S * 8;
}

// n a multiple of 4 and A 16-byte aligned (every row segment a whole number of 16-byte pieces).
template <int S, int SEG>
__global__ void __launch_bounds__(PPTM_BLOCK_THREADS, 1) bulk_kernel(const float* A, const float* x, float* out, uint64_t m, uint64_t n) {
    static_assert(CH % SEG == 0 && SEG % 128 == 0, "segments tile a chunk, 4 floats a lane");
    extern __shared__ __align__(128) uint8_t smem[];
    float* const xs = reinterpret_cast<float*>(smem);
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    float* const ring = xs + 2 * CH + (size_t)warp * S * SEG;
    uint64_t* const bars = reinterpret_cast<uint64_t*>(xs + 2 * CH + (size_t)PPTM_WARPS * S * SEG) + warp * S;
    if (lane == 0) {
        for (int s = 0; s < S; ++s) bar_init(smem_u32(bars + s));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    constexpr uint32_t SPC = CH / SEG;  // segments a row has in a full chunk
    const uint64_t chunks = (n + CH - 1) / CH;
    const uint64_t per_group = chunks * 4 * SPC;  // a warp's segment slots a group (some empty)
    const uint64_t groups = (m + 63) / 64;
    const uint64_t mine = blockIdx.x < groups ? (groups - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    const uint64_t total = mine * per_group;
    // The producer's cursor (lane 0): segment `at` of this warp's sequence is group pg's chunk pc,
    // row pr (of the warp's four), segment ps of the row's chunk; empty past m or n.
    uint64_t at = 0, pg = blockIdx.x, pc = 0;
    uint32_t pr = 0, ps = 0;
    auto issue_next = [&]() {
        const uint64_t row = pg * 64 + warp * 4 + pr, col = pc * CH + (uint64_t)ps * SEG;
        if (row < m && col < n) {
            const uint32_t slot = (uint32_t)(at % S);
            const uint32_t bytes = (uint32_t)(min((uint64_t)SEG, n - col) * 4);
            bulk_copy(smem_u32(ring + slot * SEG), A + row * n + col, bytes, smem_u32(bars + slot));
        }
        ++at;
        if (++ps == SPC) {
            ps = 0;
            if (++pr == 4) {
                pr = 0;
                if (++pc == chunks) {
                    pc = 0;
                    pg += gridDim.x;
                }
            }
        }
    };
    if (lane == 0)
        while (at < (uint64_t)(S - 1) && at < total) issue_next();
    uint64_t p = 0;      // the next segment this warp multiplies
    uint32_t phase = 0;  // bit s: the parity of slot s's next completion (empty segments use none)
    for (uint64_t g = blockIdx.x; g < groups; g += gridDim.x) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        uint32_t buf = 0;
        __syncthreads();
        for (uint64_t c0 = 0; c0 < n; c0 += CH) {
            float* const xc = xs + buf * CH;
            for (uint32_t f = threadIdx.x; f < CH; f += PPTM_BLOCK_THREADS) xc[f] = c0 + f < n ? pptm_ld_cg_f32(x + c0 + f) : 0.0f;
            __syncthreads();
            for (uint32_t r = 0; r < 4; ++r) {
                for (uint32_t s = 0; s < SPC; ++s, ++p) {
                    if (lane == 0 && at < total) issue_next();  // segment p + S - 1
                    const uint64_t row = g * 64 + warp * 4 + r, col = c0 + (uint64_t)s * SEG;
                    if (row >= m || col >= n) continue;  // warp-uniform
                    const uint32_t slot = (uint32_t)(p % S);
                    bar_wait(smem_u32(bars + slot), (phase >> slot) & 1u);
                    phase ^= 1u << slot;
                    const uint32_t len = (uint32_t)min((uint64_t)SEG, n - col);
                    const pptm_f4* a4 = reinterpret_cast<const pptm_f4*>(ring + slot * SEG);
                    const pptm_f4* x4 = reinterpret_cast<const pptm_f4*>(xc + s * SEG);
                    float d = 0.0f;
#pragma unroll
                    for (uint32_t k = 0; k < SEG / 128; ++k) {
                        const uint32_t q = lane + 32 * k;
                        if (4 * q < len) d += pptm_dot4(a4[q], x4[q]);
                    }
                    acc[r] += d;
                    __syncwarp();  // every lane has read the slot before lane 0 refills it
                }
            }
            buf ^= 1u;
        }
#pragma unroll
        for (uint32_t r = 0; r < 4; ++r) {
            const float sum = pptm_warp_sum(acc[r]);
            const uint64_t i = g * 64 + warp * 4 + r;
            if (lane == 0 && i < m) out[i] = sum;
        }
    }
}

// A plain streaming read of A (16-byte loads, 4 in flight a thread, grid-stride), summed so it is
// not optimized away: the roof of what a GEMV must read.
__global__ void __launch_bounds__(PPTM_BLOCK_THREADS, 2) read_kernel(const float* A, uint64_t count4, float* out) {
    const pptm_f4* a = reinterpret_cast<const pptm_f4*>(A);
    float s = 0.0f;
    const uint64_t stride = (uint64_t)gridDim.x * PPTM_BLOCK_THREADS;
    uint64_t i = (uint64_t)blockIdx.x * PPTM_BLOCK_THREADS + threadIdx.x;
    for (; i + 3 * stride < count4; i += 4 * stride) {
        pptm_f4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = pptm_ld_cg_f4(reinterpret_cast<const float*>(a + i + u * stride));
#pragma unroll
        for (int u = 0; u < 4; ++u) s += v[u].x + v[u].y + v[u].z + v[u].w;
    }
    for (; i < count4; i += stride) {
        const pptm_f4 v = pptm_ld_cg_f4(reinterpret_cast<const float*>(a + i));
        s += v.x + v.y + v.z + v.w;
    }
    if (s == 12345.678f) out[0] = s;  // never, as far as the compiler knows
}

struct Case {
    uint64_t m, n;
    std::vector<double> ref, mag;
    float *dA, *dx, *dy;
    Case(uint64_t m_, uint64_t n_) : m(m_), n(n_), ref(m_), mag(m_) {
        std::mt19937_64 rng(42);
        std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
        std::vector<float> a(m * n), x(n);
        for (auto& v : x) v = uni(rng);
        for (auto& v : a) v = uni(rng);
        for (uint64_t i = 0; i < m; ++i) {
            double s = 0.0, g = 0.0;
            for (uint64_t j = 0; j < n; ++j) {
                s += (double)a[i * n + j] * x[j];
                g += std::fabs((double)a[i * n + j] * x[j]);
            }
            ref[i] = s;
            mag[i] = g;
        }
        CK(cudaMalloc(&dA, m * n * 4));
        CK(cudaMalloc(&dx, n * 4));
        CK(cudaMalloc(&dy, m * 4));
        CK(cudaMemcpy(dA, a.data(), m * n * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice));
    }
};

template <class Launch>
static void timed(const char* label, Case& c, int reps, bool check, Launch launch) {
    CK(cudaMemset(c.dy, 0xff, c.m * 4));  // NaN poison
    launch();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    double worst = 0.0;
    if (check) {
        std::vector<float> y(c.m);
        CK(cudaMemcpy(y.data(), c.dy, c.m * 4, cudaMemcpyDeviceToHost));
        for (uint64_t i = 0; i < c.m; ++i) {
            const double err = std::fabs((double)y[i] - c.ref[i]) / std::max(c.mag[i], 1e-30);
            if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
        }
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int w = 0; w < 10; ++w) launch();
    std::vector<float> t(reps);
    for (int r = 0; r < reps; ++r) {
        CK(cudaEventRecord(e0));
        launch();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[r], e0, e1));
    }
    std::sort(t.begin(), t.end());
    const double med = t[reps / 2] * 1e3, p99 = t[std::min(reps - 1, reps * 99 / 100)] * 1e3;
    std::printf("%-22s %6llu x %-6llu  median %8.1f us  p99 %8.1f us  %5.2f TB/s", label, (unsigned long long)c.m,
                (unsigned long long)c.n, med, p99, (double)c.m * c.n * 4 / (med * 1e-6) / 1e12);
    if (check) std::printf("  max rel err %.1e%s", worst, worst <= 1e-4 ? "" : "  FAIL");
    std::printf("\n");
    std::fflush(stdout);
}

template <int S, int SEG>
static void bulk(Case& c, int reps, int sms) {
    constexpr size_t bytes = bulk_smem<S, SEG>();
    CK(cudaFuncSetAttribute(bulk_kernel<S, SEG>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    char label[64];
    std::snprintf(label, sizeof label, "bulk S=%d SEG=%d (%zuK)", S, SEG, bytes / 1024);
    timed(label, c, reps, true, [&] { bulk_kernel<S, SEG><<<sms, PPTM_BLOCK_THREADS, bytes>>>(c.dA, c.dx, c.dy, c.m, c.n); });
}

int main(int argc, char** argv) {
    const int reps = argc > 1 ? std::atoi(argv[1]) : 100;
    const uint64_t m = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 16384;
    const uint64_t n = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 16384;
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    std::printf("%s, %d SMs\n", prop.name, sms);
    Case c(m, n);
    timed("read A (roof)", c, reps, false, [&] { read_kernel<<<2 * sms, PPTM_BLOCK_THREADS>>>(c.dA, m * n / 4, c.dy); });
    timed("pattern, 1 block/SM", c, reps, true, [&] { pattern_kernel<1><<<sms, PPTM_BLOCK_THREADS>>>(c.dA, c.dx, c.dy, m, n); });
    timed("pattern, 2 blocks/SM", c, reps, true, [&] { pattern_kernel<2><<<2 * sms, PPTM_BLOCK_THREADS>>>(c.dA, c.dx, c.dy, m, n); });
    bulk<2, 256>(c, reps, sms);
    bulk<3, 256>(c, reps, sms);
    bulk<4, 256>(c, reps, sms);
    bulk<2, 512>(c, reps, sms);
    bulk<3, 512>(c, reps, sms);
    bulk<4, 512>(c, reps, sms);
    bulk<2, 1024>(c, reps, sms);
    bulk<3, 1024>(c, reps, sms);
    return 0;
}
