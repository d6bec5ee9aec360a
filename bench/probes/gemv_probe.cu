// Stand-alone probe of the CUDA-core GEMV (pattern/linear.cuh's pptm_gemv_n) for GPU hosts without
// Rust:
//
//     nvcc -O3 -std=c++17 -arch=sm_90a -I kernels -o gemv_probe bench/probes/gemv_probe.cu
//     ./gemv_probe [reps] [m] [n] [f32|bf16|fp16|e4m3|all] [blocks per SM]
//
// y = A x with A stored f32, bf16, fp16 or E4M3 and x f32, launched as a manifold runs (512
// threads, grid-stride over row groups), on two blocks an SM (what fits; a manifold with
// `Config::blocks_per_sm = 2`) or one (the runtime's default). Each variant's y is checked
// against an f64 reference on the same stored A, then timed with CUDA events (median and p99 of
// `reps` runs after warm-up) and reported as time and A's bytes per second, beside the tensor-core
// GEMV (pattern/mma.cuh) for bf16 and E4M3. Figures from an H100 are in linear.cuh's gemv_n notes.
#include "gemv_probe_common.h"

// ---- kernels ----------------------------------------------------------------------------------

enum Variant { PATTERN = 0, MMA = 1 };

template <class E, int VAR>
__global__ void __launch_bounds__(PPTM_BLOCK_THREADS, 2)
    gemv_kernel(const E* A, const float* x, float* out, uint64_t m, uint64_t n) {
    __shared__ double red[PPTM_WARPS];
    if (threadIdx.x == 0) pptm_beat_word = nullptr;
    __syncthreads();
    const pptm_block_ctx b{blockIdx.x, gridDim.x, red};
    const ProbePro pro{x};
    if constexpr (VAR == PATTERN)
        pptm_gemv_n<pptm_no_reducer>(A, m, n, pro, ProbeEpi{}, out, b);
    else
        pptm_gemv_n_mma<pptm_no_reducer>(A, m, n, pro, ProbeEpi{}, out, b);
}

// ---- host -------------------------------------------------------------------------------------

static float bits_to_f32(uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
static float f16_to_f32(uint16_t h) {
    const uint32_t s = (h >> 15) & 1u, e = (h >> 10) & 31u, m = h & 1023u;
    float mag = e == 0 ? std::ldexp((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp((float)(m | 1024u), (int)e - 25);
    return s ? -mag : mag;
}
static float e4m3_to_f32(uint8_t v) {
    const uint32_t e = (v >> 3) & 15u, m = v & 7u;
    float mag = (e == 15 && m == 7) ? NAN : e == 0 ? std::ldexp((float)m, -9) : std::ldexp((float)(m | 8u), (int)e - 10);
    return (v & 0x80u) ? -mag : mag;
}

// Stored values (bits) of a uniform(-1, 1) draw, and their f32 values.
template <class E>
struct Host;
template <>
struct Host<float> {
    static const char* name() { return "f32"; }
    static float value(float v, float& back) { back = v; return v; }
};
template <>
struct Host<pptm_bf16> {
    static const char* name() { return "bf16"; }
    static pptm_bf16 value(float v, float& back) {
        uint32_t b;
        std::memcpy(&b, &v, 4);
        const uint16_t h = (uint16_t)(b >> 16);
        back = bits_to_f32((uint32_t)h << 16);
        return pptm_bf16{h};
    }
};
template <>
struct Host<pptm_f16> {
    static const char* name() { return "fp16"; }
    static pptm_f16 value(float v, float& back) {
        // v in (-1, 1): round to a multiple of 2^-11 then encode (exact for |v| >= 2^-14; smaller kept 0).
        const float q = std::round(v * 2048.0f) / 2048.0f;
        uint16_t h = 0;
        if (q != 0.0f) {
            int e;
            const float fr = std::frexp(std::fabs(q), &e);  // q = fr 2^e, fr in [0.5, 1)
            const uint32_t mant = (uint32_t)std::lround(fr * 2048.0f) - 1024u;  // 10 bits
            h = (uint16_t)(((q < 0) << 15) | ((uint32_t)(e - 1 + 15) << 10) | mant);
        }
        back = f16_to_f32(h);
        return pptm_f16{h};
    }
};
template <>
struct Host<pptm_e4m3> {
    static const char* name() { return "e4m3"; }
    static pptm_e4m3 value(float v, float& back) {
        // Nearest of the 256 codes by search (slow but simple; the probe draws few distinct values).
        static float table[256];
        static bool init = false;
        if (!init) {
            for (int c = 0; c < 256; ++c) table[c] = e4m3_to_f32((uint8_t)c);
            init = true;
        }
        int best = 0;
        for (int c = 0; c < 256; ++c)
            if (!std::isnan(table[c]) && std::fabs(table[c] - v) < std::fabs(table[best] - v)) best = c;
        back = table[best];
        return pptm_e4m3{(uint8_t)best};
    }
};

// One type's A, x and reference, shared by every variant of the type.
template <class E>
struct Case {
    uint64_t m, n;
    std::vector<double> ref, mag;
    E* dA;
    float *dx, *dy;
    Case(uint64_t m_, uint64_t n_) : m(m_), n(n_), ref(m_), mag(m_) {
        std::mt19937_64 rng(42);
        std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
        // A pool of stored values keeps the fp8 encoder quick; the pattern does not care.
        std::vector<E> pool(4096), a(m * n);
        std::vector<float> poolv(4096), x(n);
        for (size_t i = 0; i < pool.size(); ++i) pool[i] = Host<E>::value(uni(rng), poolv[i]);
        for (auto& v : x) v = uni(rng);
        for (uint64_t i = 0; i < m; ++i) {
            double s = 0.0, g = 0.0;
            for (uint64_t j = 0; j < n; ++j) {
                const size_t k = rng() % pool.size();
                a[i * n + j] = pool[k];
                s += (double)poolv[k] * x[j];
                g += std::fabs((double)poolv[k] * x[j]);
            }
            ref[i] = s;
            mag[i] = g;
        }
        CK(cudaMalloc(&dA, m * n * sizeof(E)));
        CK(cudaMalloc(&dx, n * 4));
        CK(cudaMalloc(&dy, m * 4));
        CK(cudaMemcpy(dA, a.data(), m * n * sizeof(E), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice));
    }
    ~Case() {
        cudaFree(dA);
        cudaFree(dx);
        cudaFree(dy);
    }
};

template <int VAR, class E>
static void run(const char* label, Case<E>& c, int reps, int grid) {
    const uint64_t m = c.m, n = c.n;
    CK(cudaMemset(c.dy, 0xff, m * 4));  // NaN poison
    gemv_kernel<E, VAR><<<grid, PPTM_BLOCK_THREADS>>>(c.dA, c.dx, c.dy, m, n);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> y(m);
    CK(cudaMemcpy(y.data(), c.dy, m * 4, cudaMemcpyDeviceToHost));
    double worst = 0.0;
    for (uint64_t i = 0; i < m; ++i) {
        const double err = std::fabs((double)y[i] - c.ref[i]) / std::max(c.mag[i], 1e-30);
        if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int w = 0; w < 10; ++w) gemv_kernel<E, VAR><<<grid, PPTM_BLOCK_THREADS>>>(c.dA, c.dx, c.dy, m, n);
    std::vector<float> t(reps);
    for (int r = 0; r < reps; ++r) {
        CK(cudaEventRecord(e0));
        gemv_kernel<E, VAR><<<grid, PPTM_BLOCK_THREADS>>>(c.dA, c.dx, c.dy, m, n);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[r], e0, e1));
    }
    std::sort(t.begin(), t.end());
    const double med = t[reps / 2] * 1e3, p99 = t[std::min(reps - 1, reps * 99 / 100)] * 1e3;
    std::printf("%-5s %-10s %6llu x %-6llu  median %8.1f us  p99 %8.1f us  %5.2f TB/s  max rel err %.1e%s\n",
                Host<E>::name(), label, (unsigned long long)m, (unsigned long long)n, med, p99,
                (double)m * n * sizeof(E) / (med * 1e-6) / 1e12, worst, worst <= 1e-4 ? "" : "  FAIL");
    std::fflush(stdout);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
}

template <class E>
static void all(uint64_t m, uint64_t n, int reps, int grid) {
    Case<E> c(m, n);
    run<PATTERN>("gemv_n", c, reps, grid);
    if constexpr (!std::is_same<E, float>::value && !std::is_same<E, pptm_f16>::value)
        run<MMA>("mma", c, reps, grid);
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
    const int per_sm = argc > 5 ? std::max(1, std::min(2, std::atoi(argv[5]))) : 2;
    const int grid = per_sm * sms;
    std::printf("%s, %d SMs, grid %d x %d threads\n", prop.name, sms, grid, PPTM_BLOCK_THREADS);
    const char* only = argc > 4 ? argv[4] : "all";  // one type by name, or every type
    auto want = [&](const char* t) { return std::strcmp(only, "all") == 0 || std::strcmp(only, t) == 0; };
    if (want("fp16")) all<pptm_f16>(m, n, reps, grid);
    if (want("f32")) all<float>(m, n, reps, grid);
    if (want("bf16")) all<pptm_bf16>(m, n, reps, grid);
    if (want("e4m3")) all<pptm_e4m3>(m, n, reps, grid);
    return 0;
}
