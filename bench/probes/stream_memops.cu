// Stream memory operations against a resident kernel: how fast can a CUDA stream and a persistent
// kernel hand control back and forth through a word in mapped host memory or in device memory?
// Informs where pptm keeps its signal words (runtime/src/gpu/signals.rs). Built and run on a GPU
// host:  nvcc -O2 -arch=sm_90 -o /tmp/memops bench/probes/stream_memops.cu -lcuda && /tmp/memops
#include <cstdio>
#include <cstdint>
#include <chrono>
#include <cuda.h>
#include <cuda_runtime.h>

#define CK(x) do { auto r = (x); if (r != 0) { printf("%s failed: %d (line %d)\n", #x, (int)r, __LINE__); return 1; } } while (0)

// One block: round i publishes sig = i, then waits for gate >= i.
__global__ void partner(volatile unsigned long long* sig, volatile unsigned long long* gate, int rounds, int sys_fence) {
    if (threadIdx.x != 0) return;
    for (unsigned long long i = 1; i <= (unsigned long long)rounds; ++i) {
        if (sys_fence) __threadfence_system();
        *sig = i;
        while (*gate < i) {}
    }
}

int run(bool host_words, int rounds) {
    unsigned long long *sig, *gate;
    if (host_words) {
        CK(cudaHostAlloc(&sig, 64, cudaHostAllocMapped | cudaHostAllocPortable));
        CK(cudaHostAlloc(&gate, 64, cudaHostAllocMapped | cudaHostAllocPortable));
        *sig = 0; *gate = 0;
    } else {
        CK(cudaMalloc(&sig, 64)); CK(cudaMalloc(&gate, 64));
        CK(cudaMemset(sig, 0, 64)); CK(cudaMemset(gate, 0, 64));
    }
    CK(cudaDeviceSynchronize());
    cudaStream_t k, s;
    CK(cudaStreamCreateWithFlags(&k, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned long long *dsig = sig, *dgate = gate;
    if (host_words) { CK(cudaHostGetDevicePointer(&dsig, sig, 0)); CK(cudaHostGetDevicePointer(&dgate, gate, 0)); }
    auto t0 = std::chrono::steady_clock::now();
    partner<<<1, 32, 0, k>>>(dsig, dgate, rounds, host_words ? 1 : 0);
    for (int i = 1; i <= rounds; ++i) {
        CK(cuStreamWaitValue64((CUstream)s, (CUdeviceptr)dsig, i, CU_STREAM_WAIT_VALUE_GEQ));
        CK(cuStreamWriteValue64((CUstream)s, (CUdeviceptr)dgate, i, 0));
    }
    auto t1 = std::chrono::steady_clock::now();
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamSynchronize(k));
    auto t2 = std::chrono::steady_clock::now();
    double enq = std::chrono::duration<double, std::micro>(t1 - t0).count() / rounds;
    double all = std::chrono::duration<double, std::micro>(t2 - t0).count() / rounds;
    printf("words in %-12s %d round trips: %.2f us each (host enqueue %.2f us a round: two memops)\n",
           host_words ? "host memory" : "device memory", rounds, all, enq);
    return 0;
}

int main() {
    CK(cudaFree(0));
    cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0));
    printf("%s\n", p.name);
    for (int rep = 0; rep < 2; ++rep) {
        if (run(true, 20000)) return 1;
        if (run(false, 20000)) return 1;
    }
    // The host's cost of the calls pptm makes per stream operation.
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned long long* w; CK(cudaHostAlloc(&w, 64, cudaHostAllocMapped)); *w = 1;
    unsigned long long* dw; CK(cudaHostGetDevicePointer(&dw, w, 0));
    cudaEvent_t e; CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const int n = 20000;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) CK(cuStreamWriteValue64((CUstream)s, (CUdeviceptr)dw, 1, 0));
    auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) CK(cudaEventRecord(e, s));
    auto t2 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) CK(cuStreamWaitValue64((CUstream)s, (CUdeviceptr)dw, 1, CU_STREAM_WAIT_VALUE_GEQ));
    auto t3 = std::chrono::steady_clock::now();
    CK(cudaStreamSynchronize(s));
    auto us = [&](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count() / n; };
    printf("host cost of one call: cuStreamWriteValue64 %.2f us, cuEventRecord %.2f us, cuStreamWaitValue64 %.2f us\n",
           us(t0, t1), us(t1, t2), us(t2, t3));
    return 0;
}
