// Host side of the manifold's queue protocol (kernels/pptm/abi.h) for the stand-alone probes
// (manifold_probe.cu, plan_probe.cu): mapped rings, a submit that writes a slot's tagged words, a
// wait that spins on a completion entry, and the launch of a manifold module on every SM.
#pragma once
#include "pptm/abi.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                        \
        }                                                                                        \
    } while (0)

#define CU(x)                                                                                    \
    do {                                                                                         \
        CUresult r_ = (x);                                                                       \
        if (r_ != CUDA_SUCCESS) {                                                                \
            const char* m_ = "?";                                                                \
            cuGetErrorString(r_, &m_);                                                           \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, m_);                  \
            std::exit(1);                                                                        \
        }                                                                                        \
    } while (0)

static constexpr uint32_t SLOTS = 64, SLOTS_LOG2 = 6;

struct Host {
    pptm_sq_slot* sq;
    pptm_cq_entry* cq;
    pptm_host_control* control;
    uint64_t next = 0;

    static uint32_t tag(uint64_t seq) { return (uint32_t)((seq >> SLOTS_LOG2) % 0xFFFFFFFFull + 1); }

    uint64_t submit(const pptm_desc& d) {
        const uint64_t seq = next++;
        const uint32_t* w = reinterpret_cast<const uint32_t*>(&d);
        uint64_t* slot = sq[seq & (SLOTS - 1)].words;
        for (uint32_t i = 0; i < PPTM_SQ_SLOT_WORDS; ++i)
            __atomic_store_n(&slot[i], ((uint64_t)w[i] << 32) | tag(seq), __ATOMIC_RELEASE);
        return seq;
    }
    // Spins until item seq's completion entry is whole; returns (status, value, device ns).
    void wait(uint64_t seq, uint32_t& status, double& value, uint32_t& ns) {
        uint64_t* e = cq[seq & (SLOTS - 1)].words;
        uint32_t p[PPTM_CQ_WORDS];
        for (;;) {
            bool all = true;
            for (uint32_t i = 0; i < PPTM_CQ_WORDS && all; ++i) {
                const uint64_t v = __atomic_load_n(&e[i], __ATOMIC_ACQUIRE);
                all = (uint32_t)v == tag(seq);
                p[i] = (uint32_t)(v >> 32);
            }
            if (all) break;
        }
        status = p[0];
        uint64_t bits = (uint64_t)p[2] | ((uint64_t)p[3] << 32);
        std::memcpy(&value, &bits, 8);
        ns = p[4];
    }
};

static double pct(std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(q * v.size()))];
}

static float* upload(const std::vector<float>& h) {
    float* d;
    CK(cudaMalloc(&d, h.size() * 4));
    CK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    return d;
}

static uint64_t ptr(const void* p) { return (uint64_t)(uintptr_t)p; }


// Rings, control words and device state, as the runtime sets them up; `launch` starts the manifold
// cooperatively on `grid` blocks (SMs + 1 when 0) and returns once its fetcher has started.
struct Manifold {
    Host h;
    pptm_manifold_params P{};
    CUfunction fn;
    cudaStream_t stream;
    int sms = 0, grid = 0;

    explicit Manifold(CUmodule mod) {
        CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        CU(cuModuleGetFunction(&fn, mod, "pptm_manifold"));
        int local = 0;
        CU(cuFuncGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn));
        CU(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, std::max(local, 1024)));
        const size_t bytes = SLOTS * sizeof(pptm_sq_slot) + SLOTS * sizeof(pptm_cq_entry) + sizeof(pptm_host_control);
        char* host;
        CK(cudaHostAlloc((void**)&host, bytes, cudaHostAllocMapped));
        std::memset(host, 0, bytes);
        char* dev;
        CK(cudaHostGetDevicePointer((void**)&dev, host, 0));
        h = Host{reinterpret_cast<pptm_sq_slot*>(host), reinterpret_cast<pptm_cq_entry*>(host + SLOTS * sizeof(pptm_sq_slot)),
                 reinterpret_cast<pptm_host_control*>(host + SLOTS * (sizeof(pptm_sq_slot) + sizeof(pptm_cq_entry)))};
        pptm_device_state* state;
        CK(cudaMalloc(&state, sizeof(pptm_device_state)));
        CK(cudaMemset(state, 0, sizeof(pptm_device_state)));
        P.sq = reinterpret_cast<pptm_sq_slot*>(dev);
        P.cq = reinterpret_cast<pptm_cq_entry*>(dev + SLOTS * sizeof(pptm_sq_slot));
        P.control = reinterpret_cast<pptm_host_control*>(dev + SLOTS * (sizeof(pptm_sq_slot) + sizeof(pptm_cq_entry)));
        P.state = state;
        P.queue_slots = SLOTS;
        P.queue_slots_log2 = SLOTS_LOG2;
        P.hot_polls = 4096;
        P.max_backoff_ns = 20000;
        P.fetch_pollers = 2;
        CK(cudaMalloc(&P.signal, sizeof(uint64_t)));  // the domain's signal word, written after each item
        CK(cudaMemset(P.signal, 0, sizeof(uint64_t)));
        CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    }

    void launch(int grid_override) {
        void* args[] = {&P};
        grid = grid_override > 0 ? grid_override : sms + 1;
        CU(cuLaunchCooperativeKernel(fn, grid, 1, 1, 512, 1, 1, 0, (CUstream)stream, args));
        while (__atomic_load_n(&h.control->started, __ATOMIC_ACQUIRE) == 0) {
        }
    }

    void shutdown() {
        pptm_desc stop{};
        stop.opcode = PPTM_OP_SHUTDOWN;
        stop.blocks = 0;
        uint32_t st, ns;
        double v;
        h.wait(h.submit(stop), st, v, ns);
        CK(cudaStreamSynchronize(stream));
    }
};
