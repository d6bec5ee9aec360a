// pptm fusion patterns: the loops that codegen instantiates for a run of fused stages.
//
// Codegen emits, per chain, a small functor that computes every elementwise stage for one element
// (the fused body: intermediates stay in registers) and picks one of these patterns:
//   * pptm_map_reduce: elementwise body, then a reduction that ends the pass. Each block reduces its
//     share in f64; the manifold's last-arriving block combines the per-block partials. No grid
//     barrier.
//   * pptm_map_store: elementwise body whose result is a vector written to an output buffer.
//   * pptm_matrix_rows: elementwise body, then a reduction of each row of the matrix it makes.
// Both walk the grid-stride range with 16-byte loads when every pointer is 16-byte aligned, keeping
// about PPTM_LOADS_IN_FLIGHT independent 16-byte loads in flight per thread whatever the number of
// inputs, then finish the tail element by element.
//
// One manifold hosts every variant of its domain, so its register budget is set by the heaviest
// one: unrolling by a fixed count per input would let a three-input chain push every variant's
// occupancy down. Bounding the loads in flight keeps them alike.
#ifndef PPTM_FUSE_CUH
#define PPTM_FUSE_CUH

#include "pptm/device.cuh"

#ifndef PPTM_LOADS_IN_FLIGHT
#define PPTM_LOADS_IN_FLIGHT 8
#endif

// Grid-stride iterations unrolled for a pass over NIN inputs.
template <int NIN>
struct pptm_unroll {
    static constexpr int value = PPTM_LOADS_IN_FLIGHT / NIN > 0 ? PPTM_LOADS_IN_FLIGHT / NIN : 1;
};

template <int NIN>
__device__ __forceinline__ bool pptm_all_aligned16(const float* const (&in)[NIN]) {
    bool ok = true;
#pragma unroll
    for (int k = 0; k < NIN; ++k) ok = ok && pptm_aligned16(in[k]);
    return ok;
}

// Applies f to the four lanes of one 16-byte chunk per input, folding the results with R.
template <int NIN, class R, class F>
__device__ __forceinline__ double pptm_fold4(const pptm_f4 (&v)[NIN], const F& f, double acc) {
    float x[NIN];
#pragma unroll
    for (int k = 0; k < NIN; ++k) x[k] = v[k].x;
    acc = R::combine(acc, (double)f(x));
#pragma unroll
    for (int k = 0; k < NIN; ++k) x[k] = v[k].y;
    acc = R::combine(acc, (double)f(x));
#pragma unroll
    for (int k = 0; k < NIN; ++k) x[k] = v[k].z;
    acc = R::combine(acc, (double)f(x));
#pragma unroll
    for (int k = 0; k < NIN; ++k) x[k] = v[k].w;
    acc = R::combine(acc, (double)f(x));
    return acc;
}

// Fused elementwise body + reduction over n elements. Returns the block's partial in thread 0.
template <int NIN, class R, class F>
__device__ __forceinline__ double pptm_map_reduce(const float* const (&in)[NIN], uint64_t n, const F& f,
                                                  const pptm_block_ctx& b) {
    constexpr int PPTM_UNROLL = pptm_unroll<NIN>::value;
    double acc[PPTM_UNROLL];
#pragma unroll
    for (int u = 0; u < PPTM_UNROLL; ++u) acc[u] = R::identity();
    PPTM_CLK(1);
    const uint64_t stride = (uint64_t)b.nblocks * PPTM_BLOCK_THREADS;
    const uint64_t tid = (uint64_t)b.block * PPTM_BLOCK_THREADS + threadIdx.x;
    uint64_t head = 0;
    if (pptm_all_aligned16<NIN>(in)) {
        const uint64_t n4 = n / 4;
        uint64_t i = tid;
        for (; i + (PPTM_UNROLL - 1) * stride < n4; i += PPTM_UNROLL * stride) {
            pptm_f4 v[PPTM_UNROLL][NIN];
#pragma unroll
            for (int u = 0; u < PPTM_UNROLL; ++u)
#pragma unroll
                for (int k = 0; k < NIN; ++k) v[u][k] = pptm_ld_cg_f4(in[k] + 4 * (i + u * stride));
#pragma unroll
            for (int u = 0; u < PPTM_UNROLL; ++u) acc[u] = pptm_fold4<NIN, R>(v[u], f, acc[u]);
        }
        // What is left (fewer than PPTM_UNROLL chunks), two at a time: both loads go out before
        // either is used, so a thread with two chunks (a 4096-term item on one block) waits for
        // one round trip, not two.
        if (PPTM_UNROLL > 2 && i + stride < n4) {
            pptm_f4 v[2][NIN];
#pragma unroll
            for (int u = 0; u < 2; ++u)
#pragma unroll
                for (int k = 0; k < NIN; ++k) v[u][k] = pptm_ld_cg_f4(in[k] + 4 * (i + u * stride));
#pragma unroll
            for (int u = 0; u < 2; ++u) acc[u] = pptm_fold4<NIN, R>(v[u], f, acc[u]);
            i += 2 * stride;
        }
        for (; i < n4; i += stride) {
            pptm_f4 v[NIN];
#pragma unroll
            for (int k = 0; k < NIN; ++k) v[k] = pptm_ld_cg_f4(in[k] + 4 * i);
            acc[0] = pptm_fold4<NIN, R>(v, f, acc[0]);
        }
        head = n4 * 4;
    }
    for (uint64_t i = head + tid; i < n; i += stride) {
        float x[NIN];
#pragma unroll
        for (int k = 0; k < NIN; ++k) x[k] = pptm_ld_cg_f32(in[k] + i);
        acc[0] = R::combine(acc[0], (double)f(x));
    }
#pragma unroll
    for (int u = 1; u < PPTM_UNROLL; ++u) acc[0] = R::combine(acc[0], acc[u]);
    PPTM_CLK(4);
    const double partial = pptm_block_reduce<R>(acc[0], b.red_smem);
    PPTM_CLK(5);
    return partial;
}

// Applies f to the four lanes of one 16-byte chunk per input.
template <int NIN, class F>
__device__ __forceinline__ pptm_f4 pptm_apply4(const pptm_f4 (&v)[NIN], const F& f) {
    float x[NIN];
    pptm_f4 r;
#pragma unroll
    for (int k = 0; k < NIN; ++k) x[k] = v[k].x;
    r.x = f(x);
#pragma unroll
    for (int k = 0; k < NIN; ++k) x[k] = v[k].y;
    r.y = f(x);
#pragma unroll
    for (int k = 0; k < NIN; ++k) x[k] = v[k].z;
    r.z = f(x);
#pragma unroll
    for (int k = 0; k < NIN; ++k) x[k] = v[k].w;
    r.w = f(x);
    return r;
}

// Fused elementwise body over n elements, stored to `out`.
template <int NIN, class F>
__device__ __forceinline__ void pptm_map_store(const float* const (&in)[NIN], float* out, uint64_t n, const F& f,
                                               const pptm_block_ctx& b) {
    const uint64_t stride = (uint64_t)b.nblocks * PPTM_BLOCK_THREADS;
    const uint64_t tid = (uint64_t)b.block * PPTM_BLOCK_THREADS + threadIdx.x;
    uint64_t head = 0;
    if (pptm_all_aligned16<NIN>(in) && pptm_aligned16(out)) {
        const uint64_t n4 = n / 4;
        uint64_t i = tid;
        // Two chunks at a time (where that keeps PPTM_LOADS_IN_FLIGHT): both loads go out before
        // either result is stored, so a thread with two chunks (a 4096-element item on one block)
        // waits for one memory round trip, not two. (Storing chunk i before loading chunk
        // i + stride would be no safer: each element is read and written by one thread, and an
        // output that overlaps an input other than element for element races between threads
        // either way.)
        constexpr int U = pptm_unroll<NIN>::value >= 2 ? 2 : 1;
        for (; i + (U - 1) * stride < n4; i += U * stride) {
            pptm_f4 v[U][NIN];
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int k = 0; k < NIN; ++k) v[u][k] = pptm_ld_cg_f4(in[k] + 4 * (i + u * stride));
#pragma unroll
            for (int u = 0; u < U; ++u) pptm_st_cs_f4(out + 4 * (i + u * stride), pptm_apply4<NIN>(v[u], f));
        }
        if (i < n4) {
            pptm_f4 v[NIN];
#pragma unroll
            for (int k = 0; k < NIN; ++k) v[k] = pptm_ld_cg_f4(in[k] + 4 * i);
            pptm_st_cs_f4(out + 4 * i, pptm_apply4<NIN>(v, f));
        }
        head = n4 * 4;
    }
    for (uint64_t i = head + tid; i < n; i += stride) {
        float x[NIN];
#pragma unroll
        for (int k = 0; k < NIN; ++k) x[k] = pptm_ld_cg_f32(in[k] + i);
        out[i] = f(x);
    }
}

// Combines the per-block partials of the finished item, in the last-arriving block. All threads of
// the block call it; the result is valid in thread 0.
//
// Small items are the latency-bound ones, so their combine is kept short: one block's partial is
// taken as it is (`partials` may then point to shared memory, see pptm_compute_loop), and up to 32
// partials are folded by warp 0 alone, with no block barrier.
template <class R>
__device__ __forceinline__ double pptm_combine_partials(const double* partials, uint32_t nblocks, double* smem) {
    if (nblocks == 1) return *partials;
    if (nblocks <= 32) {
        double v = R::identity();
        if (threadIdx.x < 32) {
            if (threadIdx.x < nblocks) v = pptm_ld_cg_f64(partials + threadIdx.x);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v = R::combine(v, __shfl_down_sync(0xffffffffu, v, o));
        }
        return v;
    }
    double acc = R::identity();
    for (uint32_t i = threadIdx.x; i < nblocks; i += PPTM_BLOCK_THREADS) acc = R::combine(acc, pptm_ld_cg_f64(partials + i));
    return pptm_block_reduce<R>(acc, smem);
}

// A row-wise reduction over row-major matrices of `rows` rows and `cols` columns, with the
// elementwise stages before it fused in: row i's value is RR::finish of RR folding f(x) over its
// columns j, x being the NIN inputs' elements at i * cols + j, with `cols` as the count; epi(i, v)
// turns it into the chain's value for the row, which is stored to out[i] (unless out is nullptr)
// and folded into the block's partial with the chain's reducer R (pptm_no_reducer when the chain
// has none). Returns the block's partial (thread 0).
//
// One warp per row, rows spread grid-stride over (block, warp), so any block count is correct.
// Lanes take consecutive elements, 16 bytes at a time where every row of every input starts
// 16-byte aligned (aligned pointers, cols a multiple of 4) with as many loads in flight as
// pptm_map_reduce keeps, one at a time otherwise, and fold in f64 as it does. The warp then merges its
// lanes' values and lane 0 finishes the row. Rows much shorter than 32 (or 128) elements leave
// lanes idle; rows of any length are correct.
template <int NIN, class R, class RR, class F, class Epi>
__device__ __forceinline__ double pptm_matrix_rows(const float* const (&in)[NIN], uint64_t rows, uint64_t cols,
                                                   const F& f, const Epi& epi, float* out, const pptm_block_ctx& b) {
    constexpr int U = pptm_unroll<NIN>::value;
    constexpr unsigned warps = PPTM_BLOCK_THREADS / 32;
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const bool vec = pptm_all_aligned16<NIN>(in) && cols % 4 == 0;
    double acc = R::identity();
    for (uint64_t i = (uint64_t)b.block * warps + warp; i < rows; i += (uint64_t)b.nblocks * warps) {
        pptm_tick(b);
        const uint64_t base = i * cols;
        double row = RR::identity();
        if (vec) {
            const uint64_t base4 = base / 4, cols4 = cols / 4;
            uint64_t j = lane;
            for (; j + (U - 1) * 32u < cols4; j += U * 32u) {
                pptm_f4 v[U][NIN];
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int k = 0; k < NIN; ++k) v[u][k] = pptm_ld_cg_f4(in[k] + 4 * (base4 + j + u * 32u));
#pragma unroll
                for (int u = 0; u < U; ++u) row = pptm_fold4<NIN, RR>(v[u], f, row);
            }
            for (; j < cols4; j += 32u) {
                pptm_f4 v[NIN];
#pragma unroll
                for (int k = 0; k < NIN; ++k) v[k] = pptm_ld_cg_f4(in[k] + 4 * (base4 + j));
                row = pptm_fold4<NIN, RR>(v, f, row);
            }
        } else {
            // U scalar loads an input in flight: four times as many, unrolled, made the PTX of a
            // chain with a costly combine (a log-sum-exp) about 1 MB larger.
            constexpr int S = U;
            uint64_t j = lane;
            for (; j + (S - 1) * 32u < cols; j += S * 32u) {
                float x[S][NIN];
#pragma unroll
                for (int u = 0; u < S; ++u)
#pragma unroll
                    for (int k = 0; k < NIN; ++k) x[u][k] = pptm_ld_cg_f32(in[k] + base + j + u * 32u);
#pragma unroll
                for (int u = 0; u < S; ++u) row = RR::combine(row, (double)f(x[u]));
            }
            for (; j < cols; j += 32u) {
                float x[NIN];
#pragma unroll
                for (int k = 0; k < NIN; ++k) x[k] = pptm_ld_cg_f32(in[k] + base + j);
                row = RR::combine(row, (double)f(x));
            }
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) row = RR::combine(row, __shfl_xor_sync(0xffffffffu, row, offset));
        if (lane == 0) {
            const float v[1] = {(float)RR::finish(row, cols)};
            const float y = epi(i, v);
            if (out != nullptr) out[i] = y;
            acc = R::combine(acc, (double)y);
        }
    }
    return pptm_block_partial<R>(acc, b.red_smem);
}

// Trivial functors for the unfused mode, where each stage is its own pass over stored values.
struct pptm_take_first {
    __device__ __forceinline__ float operator()(const float (&x)[1]) const { return x[0]; }
};
struct pptm_load_at {
    const float* p;
    __device__ __forceinline__ float operator()(uint64_t j) const { return pptm_ld_cg_f32(p + j); }
};
// The epilogue of a row-wise stage run alone: the row's value as it is (checked to be finite for a
// stage declared `finite`).
template <bool CHECK_FINITE>
struct pptm_pass_row {
    __device__ __forceinline__ float operator()(uint64_t, const float (&v)[1]) const {
        if (CHECK_FINITE) pptm_check_finite(v[0]);
        return v[0];
    }
};
struct pptm_pass_acc {
    // The split form a GEMV pattern may use to issue an epilogue's loads early: none here.
    static constexpr uint32_t loads = 1;
    __device__ __forceinline__ void load(uint64_t, float (&x)[1]) const { x[0] = 0.0f; }
    __device__ __forceinline__ float apply(uint64_t, float acc, const float (&)[1]) const { return acc; }
    __device__ __forceinline__ float operator()(uint64_t, float acc) const { return acc; }
    __device__ __forceinline__ float operator()(uint64_t, uint64_t, float acc) const { return acc; }
    // The split form a matmul pattern may use to load column values once: none here.
    static constexpr uint32_t col_loads = 1;
    __device__ __forceinline__ void cols(uint64_t, float (&c)[1]) const { c[0] = 0.0f; }
    __device__ __forceinline__ float operator()(uint64_t, uint64_t, float acc, const float (&)[1]) const { return acc; }
};

// pptm_map_each: an elementwise pass that is much work per element (a state of several values,
// interleaved; a table read at computed coordinates; a long run of steps, `repeat = k`): one
// element per thread at a time, and the body f(i) loads, computes and stores element i itself,
// returning the value R folds (anything for pptm_no_reducer). No vector loads: what bounds it is
// the work, not the bytes.
//
// Each block takes an equal run of consecutive elements (a whole number of warps): 18,030
// elements on 132 blocks are 160 a block, every SM busy, rather than 512 a block on 36 of them.
// Consecutive elements stay in one warp, so neighbours' table reads share cache lines. Thread 0
// reports progress once a round (pptm_tick), so an item that takes longer than the watchdog's
// deadline is not taken for a hang while its rounds finish.
//
// L > 1 (an op's `lanes = L`, ChainIr::lanes): L consecutive threads of a warp share each
// element. f(i) runs on each of them; the op's `lanes(a..b)` loops split their iterations among
// them and sum what they accumulate, so every lane returns the element's value, and lane 0 alone
// stores it (the body's job) and gives it to R.
template <class R, unsigned int L = 1, class F>
__device__ __forceinline__ double pptm_map_each(uint64_t n, const F& f, const pptm_block_ctx& b) {
    static_assert(L >= 1 && L <= 32 && (L & (L - 1)) == 0 && PPTM_BLOCK_THREADS % L == 0, "lanes: a power of two up to 32");
    double acc = R::identity();
    const uint64_t per = ((n + b.nblocks - 1) / b.nblocks + 31) / 32 * 32;
    const uint64_t lo = (uint64_t)b.block * per;
    const uint64_t hi = lo + per < n ? lo + per : n;
    for (uint64_t i = lo + threadIdx.x / L; i < hi; i += PPTM_BLOCK_THREADS / L) {
        // Progress for the watchdog once a round of elements: a round of a heavy op (a χ² over
        // thousands of pixels an element) can take milliseconds, an item of rounds seconds.
        pptm_tick(b);
        const double v = (double)f(i);
        if (L == 1 || threadIdx.x % L == 0) acc = R::combine(acc, v);
    }
    return pptm_block_partial<R>(acc, b.red_smem);
}

#endif  // PPTM_FUSE_CUH
