// The pairwise pattern: a value for every pair of points, reduced per point, never stored.
//
// One warp per point i. The block's PPTM_WARPS points share tiles of the other points, staged in
// shared memory coordinate-major (tile[c * stride + jj]), so each coordinate read by a warp's 32
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

// Floats of shared memory a tile of other points may use (16 KiB).
#define PPTM_PAIR_TILE_FLOATS 4096u

// Shared scratch for every pairwise pattern of the translation unit: a tile of other points, then
// each warp's own point. A __shared__ array in the template would be one per instantiation (per
// chain) and two chains would already pass 48 KiB. Every write follows a barrier after the last
// read of the previous item.
__device__ __forceinline__ float* pptm_pairwise_smem() {
    __shared__ float scratch[PPTM_PAIR_TILE_FLOATS + PPTM_WARPS * PPTM_PAIR_MAX_FEATURES];
    return scratch;
}

template <class R, class Dist, class Row, class Epi>
__device__ __forceinline__ double pptm_pairwise_rows(uint64_t n, const Dist& dist, const Row& row, const Epi& epi,
                                                     float* out, const pptm_block_ctx& b) {
    float* const tile = pptm_pairwise_smem();
    float* const own = tile + PPTM_PAIR_TILE_FLOATS;
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const uint32_t features = dist.features();  // <= PPTM_PAIR_MAX_FEATURES (checked at submission)
    // Points per tile; odd, so the coordinate-major stores of consecutive threads spread over banks.
    uint32_t stride = PPTM_PAIR_TILE_FLOATS / (features > 0 ? features : 1u);
    if (stride > 1024u) stride = 1024u;
    stride -= (stride % 2u == 0u) ? 1u : 0u;
    float* mine = own + warp * PPTM_PAIR_MAX_FEATURES;

    double acc = R::identity();
    const uint64_t per_round = (uint64_t)b.nblocks * PPTM_WARPS;
    const uint64_t rounds = (n + per_round - 1) / per_round;
    for (uint64_t r = 0; r < rounds; ++r) {
        const uint64_t i = (r * b.nblocks + b.block) * PPTM_WARPS + warp;
        const bool active = i < n;
        for (uint32_t c = lane; c < features; c += 32) mine[c] = active ? dist.feature(i, c) : 0.0f;
        typename Row::State state;
        if (active) row.init(state, i);
        for (uint64_t j0 = 0; j0 < n; j0 += stride) {
            const uint32_t count = (uint32_t)min((uint64_t)stride, n - j0);
            __syncthreads();  // the previous tile is consumed (and `mine` written, on the first)
            for (uint32_t idx = threadIdx.x; idx < count * features; idx += PPTM_BLOCK_THREADS) {
                const uint32_t jj = idx / features, c = idx - jj * features;
                tile[c * stride + jj] = dist.feature(j0 + jj, c);
            }
            __syncthreads();
            if (active) {
                for (uint32_t jj = lane; jj < count; jj += 32) {
                    if (j0 + jj == i) continue;
                    float d[Dist::W];
                    dist.pair(mine, tile + jj, stride, d);
                    row.push(state, d);
                }
            }
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

#endif  // PPTM_PATTERN_PAIRWISE_CUH
