// pptm device helpers: memory ordering, loads that bypass L1, block reductions.
//
// Everything a manifold shares across blocks or with the host goes through these helpers, so the
// memory-ordering story is in one place:
//   * host-shared words (SQ, CQ in mapped host memory): ld.relaxed.sys / st.release.sys;
//   * grid-shared words (stage ring, counters, partials): ld.acquire.gpu / st.release.gpu /
//     atom.acq_rel.gpu, and reads of data other blocks wrote go through ld.global.cg (L2), never
//     through a possibly stale L1 line;
//   * user buffers are read with ld.global.cg too: a persistent kernel outlives many host uploads,
//     and an L1 line cached by an earlier item must never satisfy a later item's load.
#ifndef PPTM_DEVICE_CUH
#define PPTM_DEVICE_CUH

#include "pptm/abi.h"

#ifndef PPTM_BLOCK_THREADS
#error "PPTM_BLOCK_THREADS must be defined by the generated translation unit"
#endif
#define PPTM_WARPS (PPTM_BLOCK_THREADS / 32)

#if defined(__CUDACC_RTC__)
typedef unsigned char uint8_t;
typedef int int32_t;
#endif

// ---- Hopper tensor-core domains -----------------------------------------------------------------

// A domain with a tensor-core stage on bf16/fp16 buffers (codegen defines PPTM_HOPPER_TENSOR) runs,
// when compiled for compute_90a, pattern/wgmma.cuh's TMA + wgmma path. Its kernels then run one
// 512-thread block an SM (128 registers a thread, not 64) with PPTM_DYNAMIC_SMEM_BYTES of dynamic
// shared memory, which the host sets when it finds the module's tensor-map templates
// (runtime/src/gpu/driver.rs); the linear patterns' scratch lives at its start.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && defined(PPTM_HOPPER_TENSOR)
#define PPTM_WGMMA 1
#define PPTM_MIN_BLOCKS_PER_SM 1
// A variant that may run wgmma is inlined into the kernel: ptxas serializes every wgmma (waits for
// each before issuing the next) when the pipeline crosses a function boundary.
#define PPTM_WGMMA_RUN_INLINE __forceinline__
__device__ __forceinline__ uint8_t* pptm_dynamic_smem() {
    extern __shared__ __align__(1024) uint8_t pptm_dsmem[];
    return pptm_dsmem;
}
#elif defined(PPTM_WIDE_REGISTERS)
// A domain of heavy elementwise passes only (codegen's `wide_registers`): one block an SM, 128
// registers a thread, so that an op's own loop keeps its sums in registers.
#define PPTM_MIN_BLOCKS_PER_SM 1
#define PPTM_WGMMA_RUN_INLINE __noinline__
#else
#define PPTM_MIN_BLOCKS_PER_SM 2
#define PPTM_WGMMA_RUN_INLINE __noinline__
#endif

// ---- memory ordering -------------------------------------------------------------------------

__device__ __forceinline__ uint64_t pptm_ld_acquire_gpu(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// Two adjacent words (16-byte aligned) in one acquire: a warp whose lanes point at different pairs
// polls up to 32 pairs with a single acquire, so one L2 round trip per poll (each acquire is
// followed by an L1 invalidation, and a second acquire waits for the first's data).
__device__ __forceinline__ void pptm_ld_acquire_gpu_v2(const uint64_t* p, uint64_t& a, uint64_t& b) {
    asm volatile("ld.acquire.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}

__device__ __forceinline__ void pptm_st_release_gpu(uint64_t* p, uint64_t v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t pptm_ld_relaxed_gpu(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void pptm_st_relaxed_gpu(uint64_t* p, uint64_t v) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t pptm_ld_acquire_sys(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ uint64_t pptm_ld_relaxed_sys(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void pptm_st_relaxed_sys(uint64_t* p, uint64_t v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void pptm_st_release_sys(uint64_t* p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t pptm_atom_add_acq_rel_gpu(uint64_t* p, uint64_t v) {
    uint64_t old;
    asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    return old;
}

__device__ __forceinline__ void pptm_fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void pptm_fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
// Sequentially consistent: of two such fences, one is ordered before the other, so a store before
// one and a load after the other cannot both miss each other (the completion sweep, manifold.cuh).
__device__ __forceinline__ void pptm_fence_sc_gpu() { asm volatile("fence.sc.gpu;" ::: "memory"); }

__device__ __forceinline__ void pptm_sleep(uint32_t ns) {
    if (ns != 0) asm volatile("nanosleep.u32 %0;" ::"r"(ns));
}

// ---- 16-bit floating-point storage types -------------------------------------------------------

// The element types of bf16 and fp16 buffers (the matrix operands of a tensor-core stage), as raw
// bits: the tensor-core pattern moves them in pairs and 16-byte pieces and never converts them one
// by one, so it needs no cuda_bf16.h / cuda_fp16.h.
struct pptm_bf16 {
    uint16_t bits;
};
struct pptm_f16 {
    uint16_t bits;
};
// OCP fp8 E4M3 (fp8 matrix operands), likewise raw bits; the pattern widens them to fp16.
struct pptm_e4m3 {
    uint8_t bits;
};

// ---- loads and stores that bypass L1 -----------------------------------------------------------

struct __align__(16) pptm_f4 {
    float x, y, z, w;
};

__device__ __forceinline__ pptm_f4 pptm_ld_cg_f4(const float* p) {
    pptm_f4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ float pptm_ld_cg_f32(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t pptm_ld_cg_u32(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ double pptm_ld_cg_f64(const double* p) {
    double v;
    asm volatile("ld.global.cg.f64 %0, [%1];" : "=d"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ void pptm_st_cs_f4(float* p, pptm_f4 v) {
    asm volatile("st.global.cs.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
}

__device__ __forceinline__ uint16_t pptm_ld_cg_u16(const uint16_t* p) {
    uint16_t v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t pptm_ld_cg_u8(const uint8_t* p) {
    uint16_t v;
    asm volatile("ld.global.cg.u8 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ bool pptm_aligned16(const void* p) { return (reinterpret_cast<uint64_t>(p) & 15u) == 0; }
__device__ __forceinline__ bool pptm_aligned4(const void* p) { return (reinterpret_cast<uint64_t>(p) & 3u) == 0; }

// ---- narrow storage widened to f32 -------------------------------------------------------------

// An OCP E4M3 value (sign, 4 exponent bits biased by 7, 3 significand bits; no infinities,
// S.1111.111 NaN) as f32, exactly (fp16 holds every such value too).
__device__ __forceinline__ float pptm_e4m3_to_f32(uint32_t v) {
    const uint32_t e = (v >> 3) & 15u, m = v & 7u;
    const float mag = e == 15u && m == 7u ? __int_as_float(0x7fc00000)
                      : e == 0u          ? (float)m * 0.001953125f  // m 2^-9
                                         : __uint_as_float(((e + 120u) << 23) | (m << 20));
    return (v & 0x80u) ? -mag : mag;
}

// Two E4M3 values (the low two bytes of v, the first in the lower byte) as f32, exactly. sm_89 and
// later convert a pair to fp16 in one instruction; compute_80 decodes each in software.
__device__ __forceinline__ void pptm_e4m3x2_to_f32(uint32_t v, float& lo, float& hi) {
#if __CUDA_ARCH__ >= 890
    asm("{ .reg .b16 p, a, b; .reg .b32 h; cvt.u16.u32 p, %2; cvt.rn.f16x2.e4m3x2 h, p; mov.b32 {a, b}, h;"
        " cvt.f32.f16 %0, a; cvt.f32.f16 %1, b; }"
        : "=f"(lo), "=f"(hi)
        : "r"(v));
#else
    lo = pptm_e4m3_to_f32(v & 0xffu);
    hi = pptm_e4m3_to_f32((v >> 8) & 0xffu);
#endif
}

// How the CUDA-core GEMVs read a matrix stored as E (f32, bf16, fp16 or E4M3) and compute in f32:
//   * PER_WORD elements fill a 32-bit word (the first in its low bits);
//   * widen(w, f) writes a word's elements to f[0 .. PER_WORD) as f32, exactly;
//   * load(p) reads one element through L2 and widens it.
// Every value of the narrow types is an f32 value, so the products are those of the stored values.
template <class E>
struct pptm_storage;

template <>
struct pptm_storage<float> {
    static constexpr uint32_t PER_WORD = 1;
    static __device__ __forceinline__ void widen(uint32_t w, float* f) { f[0] = __uint_as_float(w); }
    static __device__ __forceinline__ float load(const float* p) { return pptm_ld_cg_f32(p); }
};

template <>
struct pptm_storage<pptm_bf16> {
    static constexpr uint32_t PER_WORD = 2;
    // bf16 is the top half of an f32.
    static __device__ __forceinline__ void widen(uint32_t w, float* f) {
        f[0] = __uint_as_float(w << 16);
        f[1] = __uint_as_float(w & 0xffff0000u);
    }
    static __device__ __forceinline__ float load(const pptm_bf16* p) {
        return __uint_as_float((uint32_t)pptm_ld_cg_u16(&p->bits) << 16);
    }
};

template <>
struct pptm_storage<pptm_f16> {
    static constexpr uint32_t PER_WORD = 2;
    static __device__ __forceinline__ void widen(uint32_t w, float* f) {
        asm("{ .reg .b16 a, b; mov.b32 {a, b}, %2; cvt.f32.f16 %0, a; cvt.f32.f16 %1, b; }"
            : "=f"(f[0]), "=f"(f[1])
            : "r"(w));
    }
    static __device__ __forceinline__ float load(const pptm_f16* p) {
        float f;
        asm("{ .reg .b16 a; mov.b16 a, %1; cvt.f32.f16 %0, a; }" : "=f"(f) : "h"(pptm_ld_cg_u16(&p->bits)));
        return f;
    }
};

template <>
struct pptm_storage<pptm_e4m3> {
    static constexpr uint32_t PER_WORD = 4;
    static __device__ __forceinline__ void widen(uint32_t w, float* f) {
        pptm_e4m3x2_to_f32(w, f[0], f[1]);
        pptm_e4m3x2_to_f32(w >> 16, f[2], f[3]);
    }
    static __device__ __forceinline__ float load(const pptm_e4m3* p) { return pptm_e4m3_to_f32(pptm_ld_cg_u8(&p->bits)); }
};

// 16 bytes from shared memory as one ld.shared.v4. Opaque to NVVM on purpose: a plain vector load
// whose lanes are used apart from one another was split by NVRTC 13.0 into narrower loads in some
// compilations and not in others (`used_bytes_mask`), so the same source gave different PTX from
// one run to the next and codegen's check failed (pattern/linear.cuh's 128 x 128 tiles).
__device__ __forceinline__ pptm_f4 pptm_lds_f4(const float* smem) {
    pptm_f4 v;
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory");
    return v;
}

// ---- asynchronous copies to shared memory (sm_80+) ---------------------------------------------

// Copies 16 bytes from global (through L2, as ld.cg) to shared memory without holding registers:
// many are in flight per thread. `src_bytes` < 16 fills the rest with zeros; 0 reads nothing.
__device__ __forceinline__ void pptm_cp_async_16(void* smem, const void* gmem, uint32_t src_bytes) {
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
}

// Waits for this thread's asynchronous copies; a barrier then shows every thread's to the block.
__device__ __forceinline__ void pptm_cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Copies 4 bytes from global to shared memory asynchronously. Only the .ca form takes 4 bytes: it
// may leave the line in L1, which is coherent enough here: every block acquires (an item's slot,
// a plan's wait) before it reads what another block wrote, and an acquire invalidates L1.
__device__ __forceinline__ void pptm_cp_async_4(void* smem, const void* gmem) {
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(gmem) : "memory");
}

// pptm_cp_async_4 that stores a zero instead where `src_bytes` is 0 (then reads nothing).
__device__ __forceinline__ void pptm_cp_async_4(void* smem, const void* gmem, uint32_t src_bytes) {
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
}

// Closes this thread's asynchronous copies issued since the last commit into a group.
__device__ __forceinline__ void pptm_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Waits until at most N of this thread's committed groups are still in flight (the newest).
template <int N>
__device__ __forceinline__ void pptm_cp_async_wait_group() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ---- fast math with defined edge cases --------------------------------------------------------

// Natural log through lg2.approx (subnormal inputs supported; no .ftz): about 2^-22 absolute error
// on [0.5, 2], ln(0) = -inf, ln(x < 0) = NaN, as logf. The final product is rounded on its own
// (__fmul_rn), so ln(a) - ln(b) is exactly 0 when a == b.
__device__ __forceinline__ float pptm_ln(float x) {
    float y;
    asm("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return __fmul_rn(y, 0.69314718055994530942f);
}

// ---- tagged words (see pptm/abi.h) ----------------------------------------------------------

// The tag of item `seq` in a ring of 1 << log2 slots: never 0, different on each lap.
__device__ __forceinline__ uint32_t pptm_tag(uint64_t seq, uint32_t log2) {
    return (uint32_t)((seq >> log2) % 0xFFFFFFFFull) + 1u;
}

__device__ __forceinline__ uint64_t pptm_tagged(uint32_t payload, uint32_t tag) { return ((uint64_t)payload << 32) | tag; }

// ---- reductions ------------------------------------------------------------------------------

// A reducer combines f32 terms into an f64 accumulator: blocks accumulate in f64 so the chain
// stays within the 1e-5 relative bar at 2^26 terms, and the cost hides under memory time.
// `finish` turns the combined accumulator of n terms into the result (the mean divides by n).
// The reduction ops' reducers are generated from their Rust combine functions (pptm/ops/subset.cuh,
// from spec/src/ops/subset.rs); the largest-value reducer here serves codegen's own checks.
struct pptm_max_reducer {
    __device__ __forceinline__ static double identity() { return -__longlong_as_double(0x7ff0000000000000ll); }
    // fmax ignores a NaN operand, like f64::max on the CPU.
    __device__ __forceinline__ static double combine(double a, double b) { return fmax(a, b); }
    __device__ __forceinline__ static double finish(double total, uint64_t) { return total; }
};

// A reducer for chains that store their output and reduce nothing: patterns skip the block
// reduction for it (see pptm_block_partial).
struct pptm_no_reducer {
    static constexpr bool reduces = false;
    __device__ __forceinline__ static double identity() { return 0.0; }
    __device__ __forceinline__ static double combine(double a, double) { return a; }
    __device__ __forceinline__ static double finish(double total, uint64_t) { return total; }
};

// Whether R produces a value: true unless R declares `reduces = false`.
template <class R, class = void>
struct pptm_reducer_reduces {
    static constexpr bool value = true;
};
template <class R>
struct pptm_reducer_reduces<R, decltype((void)R::reduces)> {
    static constexpr bool value = R::reduces;
};

// Nanoseconds on the GPU's global timer: comparable across SMs (unlike clock64). Its resolution
// depends on the GPU (tens of ns to 1 µs), so short intervals are averaged over many items.
__device__ __forceinline__ uint64_t pptm_globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Reduces one value per thread over the block; the result is valid in thread 0. `smem` holds
// PPTM_WARPS doubles. Fixed order, so the result is deterministic for a given grid.
template <class R>
__device__ __forceinline__ double pptm_block_reduce(double v, double* smem) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = R::combine(v, __shfl_down_sync(0xffffffffu, v, o));
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < PPTM_WARPS ? smem[lane] : R::identity();
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = R::combine(v, __shfl_down_sync(0xffffffffu, v, o));
    }
    __syncthreads();  // smem may be reused right after
    return v;
}

// The block's partial of a pattern that folded its outputs into `acc` with R (valid in thread 0);
// nothing to reduce for pptm_no_reducer.
template <class R>
__device__ __forceinline__ double pptm_block_partial(double acc, double* smem) {
    if constexpr (pptm_reducer_reduces<R>::value)
        return pptm_block_reduce<R>(acc, smem);
    else
        return 0.0;
}

// Where a block is within the grid for the item at hand (blocks are numbered by blockIdx.x).
struct pptm_block_ctx {
    uint32_t block;
    uint32_t nblocks;
    double* red_smem;  // PPTM_WARPS doubles of shared memory
};

// Phase trace for bench/probes/manifold_probe.cu (never in generated code): %globaltimer at each
// step of item seq, by the block that takes the step, in pptm_trace[seq % STAGE_SLOTS]; the probe
// names the slots.
#ifdef PPTM_PHASE_TRACE
#define PPTM_TRACE_SLOTS 16
__device__ unsigned long long pptm_trace[PPTM_STAGE_SLOTS][PPTM_TRACE_SLOTS];
#define PPTM_TRACE(seq, i, v) (pptm_trace[(seq) % PPTM_STAGE_SLOTS][i] = (v))
#define PPTM_TRACE_MAX(seq, i, v) atomicMax(&pptm_trace[(seq) % PPTM_STAGE_SLOTS][i], (unsigned long long)(v))
// Finer steps inside block 0's share, in SM clock cycles (clock64: comparable within one block
// only, but far finer than %globaltimer): pptm_clk_trace[seq % STAGE_SLOTS][i], written by thread
// 0 of block 0 through pptm_clk_row (null in every other block).
#define PPTM_CLK_SLOTS 10
__device__ unsigned long long pptm_clk_trace[PPTM_STAGE_SLOTS][PPTM_CLK_SLOTS];
__shared__ unsigned long long* pptm_clk_row;
#define PPTM_CLK(i)                                                     \
    do {                                                                \
        if (threadIdx.x == 0 && pptm_clk_row != nullptr) pptm_clk_row[i] = clock64(); \
    } while (0)
#else
#define PPTM_TRACE(seq, i, v) ((void)0)
#define PPTM_TRACE_MAX(seq, i, v) ((void)0)
#define PPTM_CLK(i) ((void)0)
#endif

// Where this block reports progress: in the manifold, its own word of the manifold's state; in a
// launched kernel, the launch's `progress` word in mapped host memory. Kept in shared memory rather
// than in pptm_block_ctx: the context is live across every pattern's loops, and one more pointer in
// it cost the linear-algebra manifold spills.
__shared__ uint64_t* pptm_beat_word;
// PPTM_BEAT_DEVICE in the manifold (every tick, to device memory); in a launched kernel, when this
// block last wrote the host's word.
__shared__ uint64_t pptm_beat_last;
#define PPTM_BEAT_DEVICE (~0ull)
// A launched kernel's blocks write the host's progress word at most this often (ns): stores over
// PCIe from every block on every tile would cost, and the watchdog's deadline is 100 ms.
#define PPTM_BEAT_HOST_EVERY_NS 1000000ull

// Progress inside an item: patterns call this once a tile (a unit of work that takes well under a
// millisecond), so the host's watchdog tells a long item from a hung one. One relaxed store from
// thread 0: in the manifold to a word only this block writes (no contention, nothing waits on it);
// in a launched kernel to mapped host memory, at most once a millisecond.
__device__ __forceinline__ void pptm_tick(const pptm_block_ctx&) {
    if (threadIdx.x == 0) {
        uint64_t* const w = pptm_beat_word;
        if (w != nullptr) {
            const uint64_t now = pptm_globaltimer();
            if (pptm_beat_last == PPTM_BEAT_DEVICE) {
                pptm_st_relaxed_gpu(w, now);
            } else if (now - pptm_beat_last >= PPTM_BEAT_HOST_EVERY_NS) {
                pptm_st_relaxed_sys(w, now);
                pptm_beat_last = now;
            }
        }
    }
}

// Meeting points inside an item: every block of the item waits there until all have arrived, so a
// pattern can run in phases (a bf16x3 product splits its operands into working memory, then
// multiplies them). The blocks meet on the item's arrival counter (the manifold's per-item word, or
// a plan step's), whose count the final arrival then expects (nblocks per meeting, plus the
// arrivals): pptm_meets counts this block's meetings for that, and the arrival clears it. The word
// is null where blocks cannot meet: a launched kernel's blocks need not all be resident at once,
// so a pattern that would meet takes a path without (pptm_can_meet). Kept in shared memory, as
// pptm_beat_word is, rather than in pptm_block_ctx. Thread 0 sets and reads them.
__shared__ uint64_t* pptm_meet_word;
__shared__ const uint64_t* pptm_abort_word;  // the manifold's abort flag: a meeting stops waiting
__shared__ uint32_t pptm_meets;

__device__ __forceinline__ bool pptm_can_meet(const pptm_block_ctx& b) { return b.nblocks == 1 || pptm_meet_word != nullptr; }

// Every block of the item (b.nblocks) has reached this point, and what any thread of any of them
// stored before it is visible to every thread after it, to the tensor memory accelerator's copies
// too (the proxy fences: the blocks wrote with ordinary stores, TMA reads through the async proxy).
// Every thread of every block of the item calls it, the same number of times.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PPTM_FENCE_PROXY_ASYNC_GLOBAL() asm volatile("fence.proxy.async.global;" ::: "memory")
#else
#define PPTM_FENCE_PROXY_ASYNC_GLOBAL() ((void)0)
#endif
__device__ __forceinline__ void pptm_item_meet(const pptm_block_ctx& b) {
    PPTM_FENCE_PROXY_ASYNC_GLOBAL();
    __syncthreads();
    if (b.nblocks > 1 && threadIdx.x == 0) {
        uint64_t* const w = pptm_meet_word;
        const uint64_t target = (uint64_t)(++pptm_meets) * b.nblocks;
        pptm_atom_add_acq_rel_gpu(w, 1ull);
        for (uint32_t polls = 1; (uint32_t)pptm_ld_acquire_gpu(w) < target; ++polls) {
            if (pptm_abort_word != nullptr && pptm_ld_relaxed_gpu(pptm_abort_word) != 0) break;
            if ((polls & 1023u) == 0) pptm_tick(b);
        }
        PPTM_FENCE_PROXY_ASYNC_GLOBAL();
    }
    __syncthreads();
}

// Set when a stage declared `finite = true` computed a NaN or an infinity in this block's share of
// the current item. Any thread may set it (an atomic OR); thread 0 reads and clears it after a
// barrier, and the item's blocks combine theirs as they arrive (manifold.cuh).
__shared__ uint32_t pptm_nonfinite;

// Checks a value every thread computes for its own elements.
__device__ __forceinline__ void pptm_check_finite(float v) {
    if (!isfinite(v)) atomicOr(&pptm_nonfinite, 1u);  // atomic: many threads may flag at once
}
__device__ __forceinline__ void pptm_check_finite(double v) {
    if (!isfinite(v)) atomicOr(&pptm_nonfinite, 1u);
}

// Checks a value only thread 0 holds: a reduction's result and the stages after it (the other
// threads carry leftovers of the block reduction there).
__device__ __forceinline__ void pptm_check_finite_thread0(double v) {
    if (threadIdx.x == 0 && !isfinite(v)) pptm_nonfinite = 1u;
}

// The product paths (PPTM_PATH_*) this block's share of the current item ran. Thread 0 sets and
// clears it; the choice of path is the same in every block of an item (abi.h), so the last block
// to finish reports its own.
__shared__ uint32_t pptm_paths;

// Records that this block's product dispatch chose `path`.
__device__ __forceinline__ void pptm_took_path(uint32_t path) {
    if (threadIdx.x == 0) pptm_paths |= path;
}

// ---- matmul epilogues -----------------------------------------------------------------------------

// Column j's values of a matmul epilogue (what it reads by column, a bias; pattern/linear.cuh's
// contract) into c, or zeros for a column past n, which is never stored.
template <class Epi>
__device__ __forceinline__ void pptm_epi_cols(const Epi& epi, uint64_t j, uint64_t n, float (&c)[Epi::col_loads]) {
    if (j < n) {
        epi.cols(j, c);
    } else {
#pragma unroll
        for (uint32_t x = 0; x < Epi::col_loads; ++x) c[x] = 0.0f;
    }
}

#endif  // PPTM_DEVICE_CUH
