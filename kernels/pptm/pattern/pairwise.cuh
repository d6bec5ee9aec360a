// The pairwise pattern: a value for every pair of points, reduced per point, never stored.
//
// One warp per point i. The block's PPTM_WARPS points share tiles of the other points, copied into
// shared memory (double-buffered) coordinate-major (tile[c * stride + jj]), so each coordinate read by a warp's 32
// lanes hits 32 consecutive words, and every point is read from L2 once per block rather than once
// per warp. Each lane folds its share of the pairs into a row state; the warp merges the lanes'
// states, the epilogue runs on the point's value, and the result is stored and/or folded into the
// block's partial. Points are spread grid-stride over (block, warp), so any block count is correct.
//
// Contract of the distance and row types: pptm/ops/neighbours.cuh.
#ifndef PPTM_PATTERN_PAIRWISE_CUH
#define PPTM_PATTERN_PAIRWISE_CUH

#include "pptm/device.cuh"

#ifndef PPTM_PAIR_MAX_FEATURES
#error "PPTM_PAIR_MAX_FEATURES must be defined by the generated translation unit"
#endif

// Most points a tile holds. A tile is a whole number of candidate steps (PPTM_PAIR_ILP * 32 points)
// where it can be: 1024 or 4096 points make one or four tiles, and no step is spent on a last
// point or two (tiles of 1023 made 1024 points two tiles; tiles of 1025 gave every tile a ninth
// step of one candidate, 13% slower at 16384 points on an H200).
#define PPTM_PAIR_TILE_POINTS 1024u
// Floats of shared memory a tile of other points may use: a full tile of four coordinates a point
// with its odd pitch (about 16 KiB).
#define PPTM_PAIR_TILE_FLOATS (4u * (PPTM_PAIR_TILE_POINTS + 1u))

// Candidates each lane computes at once.
#define PPTM_PAIR_ILP 8

// Floats between the two tile buffers: a tile padded by one step of candidates (reads past `count`
// are computed and dropped).
#define PPTM_PAIR_TILE_PITCH (PPTM_PAIR_TILE_FLOATS + PPTM_PAIR_ILP * 32u)

// Shared scratch for every pairwise pattern of the translation unit: two tiles of other points (one
// computed on while the next is copied in), then each warp's own point. A __shared__ array in the
// template would be one per instantiation (per chain) and two chains would already pass 48 KiB.
// Every write follows a barrier after the last read of the previous item.
__device__ __forceinline__ float* pptm_pairwise_smem() {
    __shared__ float scratch[2 * PPTM_PAIR_TILE_PITCH + PPTM_WARPS * PPTM_PAIR_MAX_FEATURES];
    return scratch;
}

template <class R, class Dist, class Row, class Epi>
__device__ __forceinline__ double pptm_pairwise_rows(uint64_t n, const Dist& dist, const Row& row, const Epi& epi,
                                                     float* out, const pptm_block_ctx& b) {
    float* const tiles = pptm_pairwise_smem();
    float* const own = tiles + 2 * PPTM_PAIR_TILE_PITCH;
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const uint32_t features = dist.features();  // <= PPTM_PAIR_MAX_FEATURES (checked at submission)
    // Points per tile (cap) and the pitch of a coordinate's row (stride): odd, so the
    // coordinate-major stores of consecutive threads spread over banks.
    uint32_t cap = min(PPTM_PAIR_TILE_FLOATS / (features > 0 ? features : 1u) - 1u, PPTM_PAIR_TILE_POINTS);
    if (cap >= PPTM_PAIR_ILP * 32u) cap -= cap % (PPTM_PAIR_ILP * 32u);
    const uint32_t stride = cap | 1u;
    float* mine = own + warp * PPTM_PAIR_MAX_FEATURES;

    // Tiles are double-buffered: the next tile is copied into the other buffer asynchronously
    // (cp.async, no registers held) while the warps compute on this one, so the copies' latency
    // hides behind the pairs instead of standing between two barriers. Element idx of a tile is
    // coordinate idx % features of point idx / features (consecutive threads read consecutive
    // words), the quotient by a float reciprocal: exact while idx < 2^16 (the error, under
    // 2^-7 / features, stays below the 0.5 / features that separates (idx + 0.5) / features from
    // an integer), where the integer division cost some 20 instructions an element.
    const float inv_features = 1.0f / (float)(features > 0 ? features : 1u);
    uint32_t issued = 0;  // tiles whose copies were issued; tile t goes to buffer t % 2
    auto issue = [&](uint64_t j0) {
        float* const buf = tiles + (issued & 1u) * PPTM_PAIR_TILE_PITCH;
        const uint32_t total = (uint32_t)min((uint64_t)cap, n - j0) * features;
        for (uint32_t idx = threadIdx.x; idx < total; idx += PPTM_BLOCK_THREADS) {
            const uint32_t q = (uint32_t)(((float)idx + 0.5f) * inv_features);
            const uint32_t c = idx - q * features;
            pptm_cp_async_4(buf + c * stride + q, dist.feature_at(j0 + q, c));
        }
        pptm_cp_async_commit();
        ++issued;
    };

    double acc = R::identity();
    const uint64_t per_round = (uint64_t)b.nblocks * PPTM_WARPS;
    const uint64_t rounds = (n + per_round - 1) / per_round;
    if (rounds > 0) issue(0);
    uint32_t consumed = 0;
    for (uint64_t r = 0; r < rounds; ++r) {
        const uint64_t i = (r * b.nblocks + b.block) * PPTM_WARPS + warp;
        const bool active = i < n;
        for (uint32_t c = lane; c < features; c += 32) mine[c] = active ? dist.feature(i, c) : 0.0f;
        typename Row::State state;
        if (active) row.init(state, i);
        for (uint64_t j0 = 0; j0 < n; j0 += cap) {
            const uint32_t count = (uint32_t)min((uint64_t)cap, n - j0);
            // The next tile (this round's next, or the next round's first) into the other buffer,
            // whose last reader finished before the barrier that ended the previous tile.
            const uint64_t next = j0 + cap < n ? j0 + cap : (r + 1 < rounds ? 0 : n);
            if (next < n) {
                issue(next);
                pptm_cp_async_wait_group<1>();  // this thread's copies of this tile
            } else {
                pptm_cp_async_wait_group<0>();
            }
            __syncthreads();  // every thread's copies of this tile (and `mine`, on the first)
            const float* const tile = tiles + (consumed & 1u) * PPTM_PAIR_TILE_PITCH;
            ++consumed;
            if (active) {
                // PPTM_PAIR_ILP candidates per lane per step (32 apart), computed together:
                // independent chains keep a warp busy where one distance at a time would wait on
                // each load. The loop is warp-uniform: the row type pushes warp-collectively.
                // The tile index of point i, or one no candidate has: 32-bit compares below.
                const uint32_t self = i >= j0 && i - j0 < count ? (uint32_t)(i - j0) : 0xffffffffu;
                for (uint32_t base = 0; base < count; base += PPTM_PAIR_ILP * 32) {
                    const uint32_t jj = base + lane;
                    float d[PPTM_PAIR_ILP][Dist::W];
                    bool valid[PPTM_PAIR_ILP];
                    dist.template pairs<PPTM_PAIR_ILP>(mine, tile + jj, stride, d);
#pragma unroll
                    for (int u = 0; u < PPTM_PAIR_ILP; ++u) {
                        const uint32_t j = jj + u * 32;
                        valid[u] = j < count && j != self;
                    }
                    row.push(state, d, valid);
                }
            }
            __syncthreads();  // this tile is consumed: the next issue may overwrite its buffer
        }
        if (active) {
            float v[Row::OUT];
            row.finish(state, v);
            if (lane == 0) {
                const float y = epi(i, v);
                if (out != nullptr) out[i] = y;
                acc = R::combine(acc, (double)y);
            }
        }
        __syncthreads();  // `mine` is rewritten next round
    }
    return pptm_block_partial<R>(acc, b.red_smem);
}

// Unfused mode, pairwise stage: every pair's W values stored at pairs[(i * n + j) * W + c] (the
// diagonal too, unused).
template <class Dist>
__device__ __forceinline__ void pptm_pairwise_store(uint64_t n, const Dist& dist, float* pairs, const pptm_block_ctx& b) {
    const uint64_t stride = (uint64_t)b.nblocks * PPTM_BLOCK_THREADS;
    for (uint64_t p = (uint64_t)b.block * PPTM_BLOCK_THREADS + threadIdx.x; p < n * n; p += stride) {
        float v[Dist::W];
        dist.pair_direct(p / n, p % n, v);
#pragma unroll
        for (int c = 0; c < Dist::W; ++c) pairs[p * Dist::W + c] = v[c];
    }
}

// Unfused mode, row-reduction stage: one warp per point reduces its stored row (j != i) and writes
// Row::OUT values per point (each checked to be finite for a stage declared `finite`).
template <int W, class Row, bool CHECK_FINITE = false>
__device__ __forceinline__ void pptm_rows_stored(uint64_t n, const float* pairs, const Row& row, float* out,
                                                 const pptm_block_ctx& b) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    for (uint64_t i = (uint64_t)b.block * PPTM_WARPS + warp; i < n; i += (uint64_t)b.nblocks * PPTM_WARPS) {
        pptm_tick(b);
        typename Row::State state;
        row.init(state, i);
        for (uint64_t base = 0; base < n; base += 32) {
            const uint64_t j = base + lane;
            const bool valid[1] = {j < n && j != i};
            float v[1][W];
#pragma unroll
            for (int c = 0; c < W; ++c) v[0][c] = valid[0] ? pptm_ld_cg_f32(pairs + (i * n + j) * W + c) : 0.0f;
            row.push(state, v, valid);
        }
        float v[Row::OUT];
        row.finish(state, v);
        if (lane == 0)
#pragma unroll
            for (int c = 0; c < Row::OUT; ++c) {
                if (CHECK_FINITE) pptm_check_finite(v[c]);
                out[i * Row::OUT + c] = v[c];
            }
    }
}

// Any reducer R as a row type (the contract in pptm/ops/neighbours.cuh): a reduction stage after a
// pairwise op folds each point's row of values (one a pair) with R, in f64 as the chain-wide
// reductions do, and finishes with R::finish over the row's n - 1 values. Built-in and
// #[pptm::op(reduction)] reducers alike; the CPU reference folds the row in j order.
template <class R>
struct pptm_row_fold {
    static constexpr int OUT = 1;
    struct State {
        double acc;
        uint32_t count;
    };
    __device__ __forceinline__ void init(State& s, uint64_t) const {
        s.acc = R::identity();
        s.count = 0;
    }
    template <int U>
    __device__ __forceinline__ void push(State& s, const float (&d)[U][1], const bool (&valid)[U]) const {
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (valid[u]) {
                s.acc = R::combine(s.acc, (double)d[u][0]);
                ++s.count;
            }
    }
    __device__ __forceinline__ void finish(State& s, float (&out)[1]) const {
        double acc = s.acc;
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) acc = R::combine(acc, __shfl_xor_sync(0xffffffffu, acc, offset));
        const uint32_t count = __reduce_add_sync(0xffffffffu, s.count);
        out[0] = (float)R::finish(acc, (uint64_t)count);
    }
};

#endif  // PPTM_PATTERN_PAIRWISE_CUH
