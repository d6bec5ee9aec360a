// The peers of a pptm pipeline of dependent small stages (examples/pipeline_handoff.rs): the same
// stages as plain CUDA, on one stream, each a kernel of one 512-thread block.
//   * elementwise: u <- 0.5 x + 0.25 c over 4096 elements (u and v taking turns);
//   * gemv: y <- A x, A 256 x 256 (a warp per row).
// Each at 8, 32 and 170 stages, timed on the host clock from the first launch to the end of a
// stream synchronisation (warm-up, then many repetitions: median and p99):
//   launches     one cudaLaunchKernel per stage
//   graph        the launches captured once into a CUDA graph, one cudaGraphLaunch per repetition
//   graph+PDL    the same with programmatic dependent launch: every kernel is launched with
//                cudaLaunchAttributeProgrammaticStreamSerialization, starts with griddepcontrol.wait
//                and lets its successor launch early (griddepcontrol.launch_dependents)
//   one kernel   all stages in one kernel with a block barrier between them (device time, by
//                CUDA events: the floor of any scheme that keeps stages apart)
// Built and run on a GPU host:
//   nvcc -O3 -arch=sm_90 -o /tmp/dependent_steps bench/probes/dependent_steps.cu && /tmp/dependent_steps
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t r = (x); if (r != cudaSuccess) { printf("%s failed: %s (line %d)\n", #x, cudaGetErrorString(r), __LINE__); exit(1); } } while (0)

constexpr int N = 4096, G = 256, THREADS = 512;

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ void blend_body(const float* x, const float* c, float* u) {
    for (int i = threadIdx.x; i < N; i += THREADS) u[i] = 0.5f * x[i] + 0.25f * c[i];
}
__device__ __forceinline__ void gemv_body(const float* a, const float* x, float* y) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int r = warp; r < G; r += THREADS / 32) {
        float s = 0.f;
        for (int j = lane; j < G; j += 32) s += a[r * G + j] * x[j];
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) y[r] = s;
    }
}

template <bool PDL>
__global__ void blend(const float* x, const float* c, float* u) {
    if (PDL) pdl_wait();
    blend_body(x, c, u);
    if (PDL) pdl_launch();
}
template <bool PDL>
__global__ void gemv(const float* a, const float* x, float* y) {
    if (PDL) pdl_wait();
    gemv_body(a, x, y);
    if (PDL) pdl_launch();
}
__global__ void blend_all(const float* x, const float* c, float* u, float* v, int stages) {
    for (int k = 0; k < stages; ++k) {
        blend_body(k == 0 ? x : (k % 2 ? u : v), c, k % 2 ? v : u);
        __syncthreads();
    }
}
__global__ void gemv_all(const float* a, const float* x, float* u, float* v, int stages) {
    for (int k = 0; k < stages; ++k) {
        gemv_body(a, k == 0 ? x : (k % 2 ? u : v), k % 2 ? v : u);
        __syncthreads();
    }
}

struct Bufs { float *x, *c, *u, *v, *a; };

template <bool PDL>
void launch(bool is_gemv, const Bufs& b, int k, cudaStream_t s) {
    const float* from = k == 0 ? b.x : (k % 2 ? b.u : b.v);
    float* to = k % 2 ? b.v : b.u;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(THREADS);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = PDL ? 1 : 0;
    if (is_gemv) CK(cudaLaunchKernelEx(&cfg, gemv<PDL>, (const float*)b.a, from, to));
    else CK(cudaLaunchKernelEx(&cfg, blend<PDL>, from, (const float*)b.c, to));
}

template <class F>
void timed(const char* what, int stages, F&& f, cudaStream_t s) {
    for (int i = 0; i < 50; ++i) f();
    CK(cudaStreamSynchronize(s));
    std::vector<double> t;
    for (int i = 0; i < 500; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        f();
        CK(cudaStreamSynchronize(s));
        t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    printf("%-34s %4d stages  median %9.2f us  p99 %9.2f us  (%.2f us a stage)\n", what, stages, t[t.size() / 2],
           t[t.size() * 99 / 100], t[t.size() / 2] / stages);
}

int main() {
    Bufs b;
    CK(cudaMalloc(&b.x, N * 4)); CK(cudaMalloc(&b.c, N * 4)); CK(cudaMalloc(&b.u, N * 4)); CK(cudaMalloc(&b.v, N * 4));
    CK(cudaMalloc(&b.a, G * G * 4));
    std::vector<float> h(G * G);
    for (size_t i = 0; i < h.size(); ++i) h[i] = (float)((i * 2654435761u) % 1000) / 1000.f - 0.5f;
    CK(cudaMemcpy(b.a, h.data(), G * G * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.x, h.data(), N * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.c, h.data() + N, N * 4, cudaMemcpyHostToDevice));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s: dependent stages of one %d-thread block\n", prop.name, THREADS);
    for (int is_gemv = 0; is_gemv < 2; ++is_gemv) {
        for (int stages : {8, 32, 170}) {
            char label[64];
            const char* kind = is_gemv ? "gemv 256x256" : "elementwise 4096";
            snprintf(label, sizeof label, "%s, launches", kind);
            timed(label, stages, [&] { for (int k = 0; k < stages; ++k) launch<false>(is_gemv, b, k, s); }, s);
            for (int pdl = 0; pdl < 2; ++pdl) {
                cudaGraph_t g;
                cudaGraphExec_t ge;
                CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
                for (int k = 0; k < stages; ++k) pdl ? launch<true>(is_gemv, b, k, s) : launch<false>(is_gemv, b, k, s);
                CK(cudaStreamEndCapture(s, &g));
                CK(cudaGraphInstantiate(&ge, g, 0));
                snprintf(label, sizeof label, "%s, %s", kind, pdl ? "graph+PDL" : "graph");
                timed(label, stages, [&] { CK(cudaGraphLaunch(ge, s)); }, s);
                CK(cudaGraphExecDestroy(ge));
                CK(cudaGraphDestroy(g));
            }
            // One kernel: device time by events.
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
            std::vector<float> dt;
            for (int i = 0; i < 300; ++i) {
                CK(cudaEventRecord(e0, s));
                if (is_gemv) gemv_all<<<1, THREADS, 0, s>>>(b.a, b.x, b.u, b.v, stages);
                else blend_all<<<1, THREADS, 0, s>>>(b.x, b.c, b.u, b.v, stages);
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (i >= 50) dt.push_back(ms * 1000.f);
            }
            std::sort(dt.begin(), dt.end());
            printf("%-34s %4d stages  median %9.2f us (device, events)       (%.2f us a stage)\n",
                   (std::string(kind) + ", one kernel").c_str(), stages, dt[dt.size() / 2], dt[dt.size() / 2] / stages);
        }
    }
    return 0;
}
