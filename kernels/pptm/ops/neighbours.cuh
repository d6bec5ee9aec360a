// Op family: nearest-neighbour statistics over point sets (distance_kth, KSG transfer entropy).
// CPU references and fusion classes: spec/src/ops/neighbours.rs.
//
// The pairwise ops are "distance" types and the row reductions "row" types that
// pptm_pairwise_rows (pptm/pattern/pairwise.cuh) instantiates:
//   distance: W (values per pair); features() (coordinates per point, all subspaces);
//             feature(j, c) (coordinate c of point j, from global memory) and feature_at(j, c)
//             (its address, which the pattern's tiles copy asynchronously);
//             pairs<U>(fi, fj, stride, d[U][W]) (point i's coordinates fi[c]; U candidates, the
//             u-th with coordinates at fj[u * 32 + c * stride]).
//   row:      OUT (values per point); State; init(State&, i);
//             push<U>(State&, d[U][W], valid[U]) (warp-collective: every lane of the warp calls it
//             with its U candidates, valid[u] false for a candidate that does not count);
//             finish(State&, out[OUT]) (warp-collective: merges the lanes' states; the result is
//             valid in lane 0).
// Dimensions are runtime values. Compiling small ones in (a switch over instantiations) halved the
// cost of a pair in a kernel of its own, but several inlined instantiations in one manifold made
// ptxas spill kilobytes; that waits for per-variant register budgets.
// Distances are |a - b| of f32 coordinates in f32, maximised exactly: the CPU reference computes
// the same bits, so counts at the radius agree.
#ifndef PPTM_OPS_NEIGHBOURS_CUH
#define PPTM_OPS_NEIGHBOURS_CUH

#include "pptm/device.cuh"
#include "pptm/pattern/pairwise.cuh"

#ifndef PPTM_MAX_K
#error "PPTM_MAX_K must be defined by the generated translation unit"
#endif

// Chebyshev distances over the d coordinates from fi[0] to U candidates (the u-th at
// fj[u * 32 + c * stride]), folded into m[u]: the U chains are independent.
template <int U>
__device__ __forceinline__ void pptm_chebyshev_span(const float* fi, const float* fj, uint32_t stride, uint32_t d,
                                                    float (&m)[U]) {
    for (uint32_t c = 0; c < d; ++c) {
        const float a = fi[c];
        const float* col = fj + c * stride;
#pragma unroll
        for (int u = 0; u < U; ++u) m[u] = fmaxf(m[u], fabsf(a - col[u * 32]));
    }
}

// ChebyshevDistance: max-norm distance between rows of x (n x d).
struct pptm_op_chebyshev {
    static constexpr int W = 1;
    const float* x;
    uint32_t d;
    __device__ __forceinline__ uint32_t features() const { return d; }
    __device__ __forceinline__ const float* feature_at(uint64_t j, uint32_t c) const { return x + j * d + c; }
    __device__ __forceinline__ float feature(uint64_t j, uint32_t c) const { return pptm_ld_cg_f32(feature_at(j, c)); }
    // One pair from global memory (the unfused mode).
    __device__ __forceinline__ void pair_direct(uint64_t i, uint64_t j, float (&out)[W]) const {
        float m = 0.0f;
        for (uint32_t c = 0; c < features(); ++c) m = fmaxf(m, fabsf(feature(i, c) - feature(j, c)));
        out[0] = m;
    }
    template <int U>
    __device__ __forceinline__ void pairs(const float* fi, const float* fj, uint32_t stride, float (&out)[U][W]) const {
        float m[U];
#pragma unroll
        for (int u = 0; u < U; ++u) m[u] = 0.0f;
        pptm_chebyshev_span<U>(fi, fj, stride, d, m);
#pragma unroll
        for (int u = 0; u < U; ++u) out[u][0] = m[u];
    }
};

// SubspaceDistances: per pair, the Chebyshev distances in the (x,z), (y,z) and (z) spaces. A
// point's coordinates are x's, then y's, then z's.
struct pptm_op_subspace_distances {
    static constexpr int W = 3;
    const float* x;
    const float* y;
    const float* z;
    uint32_t dx, dy, dz;
    __device__ __forceinline__ uint32_t features() const { return dx + dy + dz; }
    __device__ __forceinline__ const float* feature_at(uint64_t j, uint32_t c) const {
        if (c < dx) return x + j * dx + c;
        c -= dx;
        if (c < dy) return y + j * dy + c;
        return z + j * dz + (c - dy);
    }
    __device__ __forceinline__ float feature(uint64_t j, uint32_t c) const { return pptm_ld_cg_f32(feature_at(j, c)); }
    // One pair from global memory (the unfused mode).
    __device__ __forceinline__ void pair_direct(uint64_t i, uint64_t j, float (&out)[W]) const {
        float m[3] = {0.0f, 0.0f, 0.0f};
        const uint32_t ends[3] = {dx, dx + dy, features()};
        uint32_t c = 0;
        for (int s = 0; s < 3; ++s)
            for (; c < ends[s]; ++c) m[s] = fmaxf(m[s], fabsf(feature(i, c) - feature(j, c)));
        out[0] = fmaxf(m[0], m[2]);
        out[1] = fmaxf(m[1], m[2]);
        out[2] = m[2];
    }
    template <int U>
    __device__ __forceinline__ void pairs(const float* fi, const float* fj, uint32_t stride, float (&out)[U][W]) const {
        float mx[U], my[U], mz[U];
        if (dx == 1 && dy == 1 && dz == 1) {
            // One coordinate per subspace (scalar series, history 1: the common case): straight-line
            // code, no loop set-up per subspace. The branch is uniform across the grid.
            const float ax = fi[0], ay = fi[1], az = fi[2];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const float ddz = fabsf(az - fj[u * 32 + 2 * stride]);
                out[u][0] = fmaxf(fabsf(ax - fj[u * 32]), ddz);
                out[u][1] = fmaxf(fabsf(ay - fj[u * 32 + stride]), ddz);
                out[u][2] = ddz;
            }
            return;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) mx[u] = my[u] = mz[u] = 0.0f;
        const uint32_t ox = dx, oy = dx + dy;
        pptm_chebyshev_span<U>(fi, fj, stride, dx, mx);
        pptm_chebyshev_span<U>(fi + ox, fj + ox * stride, stride, dy, my);
        pptm_chebyshev_span<U>(fi + oy, fj + oy * stride, stride, dz, mz);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            out[u][0] = fmaxf(mx[u], mz[u]);
            out[u][1] = fmaxf(my[u], mz[u]);
            out[u][2] = mz[u];
        }
    }
};

// KthSmallest: the warp keeps the k smallest distances seen so far (k <= PPTM_MAX_K <= 32), sorted
// ascending one per lane (lane t holds the (t+1)-th; lanes from k on hold +inf), and the bar a
// candidate must beat, the k-th. A step's candidates are filtered against the bar with a ballot,
// and the few that pass are inserted one at a time by the whole warp (a shuffle and a select).
// With random order only about k ln(n / k) of a point's n candidates ever pass, where keeping a
// top-k per lane inserted 32 times as many, each a divergent k-slot insertion that the whole warp
// waited for. The first candidates (one per lane, the bar still +inf) are sorted by a warp bitonic
// sort instead of inserted. Equal distances are kept each (a tie is inserted after its equals), so
// the k-th counts multiplicity as the reference does.
static_assert(PPTM_MAX_K <= 32, "kth_smallest: the warp holds the k smallest one per lane");

struct pptm_op_kth_smallest {
    static constexpr int OUT = 1;
    uint32_t k;
    struct State {
        float top;   // this lane's entry of the sorted k smallest
        float bar;   // the k-th smallest so far (+inf while fewer than k were seen)
        bool fresh;  // no candidate seen yet
    };
    __device__ __forceinline__ void init(State& s, uint64_t) const {
        s.top = __int_as_float(0x7f800000);
        s.bar = __int_as_float(0x7f800000);
        s.fresh = true;
    }
    // Inserts v (the same in every lane) into the sorted entries and updates the bar.
    __device__ __forceinline__ void insert(State& s, float v) const {
        const unsigned lane = threadIdx.x & 31u;
        const float before = __shfl_up_sync(0xffffffffu, s.top, 1);
        if (lane < k && s.top > v) s.top = (lane == 0 || before <= v) ? v : before;
        s.bar = __shfl_sync(0xffffffffu, s.top, k - 1);
    }
    template <int U>
    __device__ __forceinline__ void push(State& s, const float (&d)[U][1], const bool (&valid)[U]) const {
        const unsigned lane = threadIdx.x & 31u;
        const bool seeded = s.fresh;
        if (seeded) {
            // Bitonic sort of the lanes' first candidates, ascending by lane.
            float v = valid[0] ? d[0][0] : __int_as_float(0x7f800000);
#pragma unroll
            for (unsigned size = 2; size <= 32; size <<= 1)
#pragma unroll
                for (unsigned j = size >> 1; j > 0; j >>= 1) {
                    const float o = __shfl_xor_sync(0xffffffffu, v, j);
                    const bool ascending = (lane & size) == 0 || size == 32;
                    v = (((lane & j) == 0) == ascending) ? fminf(v, o) : fmaxf(v, o);
                }
            s.top = lane < k ? v : __int_as_float(0x7f800000);
            s.bar = __shfl_sync(0xffffffffu, s.top, k - 1);
            s.fresh = false;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (u == 0 && seeded) continue;
            const float x = d[u][0];
            unsigned pass = __ballot_sync(0xffffffffu, valid[u] && x < s.bar);
            while (pass != 0) {
                insert(s, __shfl_sync(0xffffffffu, x, __ffs(pass) - 1));
                pass &= pass - 1;
                // The bar only falls: candidates that passed before may not any more.
                pass &= __ballot_sync(0xffffffffu, valid[u] && x < s.bar);
            }
        }
    }
    __device__ __forceinline__ void finish(State& s, float (&out)[1]) const {
        out[0] = __shfl_sync(0xffffffffu, s.top, k - 1);
    }
};

// RadiusCount: per channel, the other points strictly closer than eps[i].
template <int C>
struct pptm_op_radius_count {
    static constexpr int OUT = C;
    const float* eps;
    struct State {
        uint32_t count[C];
        float eps;
    };
    __device__ __forceinline__ void init(State& s, uint64_t i) const {
#pragma unroll
        for (int c = 0; c < C; ++c) s.count[c] = 0;
        s.eps = pptm_ld_cg_f32(eps + i);
    }
    template <int U>
    __device__ __forceinline__ void push(State& s, const float (&d)[U][C], const bool (&valid)[U]) const {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int c = 0; c < C; ++c) s.count[c] += valid[u] && d[u][c] < s.eps ? 1u : 0u;
    }
    __device__ __forceinline__ void finish(State& s, float (&out)[C]) const {
#pragma unroll
        for (int c = 0; c < C; ++c) out[c] = (float)__reduce_add_sync(0xffffffffu, s.count[c]);
    }
};

// Digamma psi(x) in f32: recurrence up to 6, then the asymptotic series; reflection below 0.
__device__ __forceinline__ float pptm_op_digamma(float x) {
    if (isnan(x) || (x <= 0.0f && x == floorf(x))) return __int_as_float(0x7fc00000);
    float acc = 0.0f;
    if (x < 0.0f) {
        // psi(1 - x) - psi(x) = pi cot(pi x)
        const float pi = 3.14159265358979323846f;
        acc = -pi / tanf(pi * x);
        x = 1.0f - x;
    }
    while (x < 6.0f) {
        acc -= 1.0f / x;
        x += 1.0f;
    }
    const float r = 1.0f / (x * x);
    return acc + logf(x) - 0.5f / x - r * (1.0f / 12.0f - r * (1.0f / 120.0f - r * (1.0f / 252.0f)));
}

// KsgDigamma: psi(n_z + 1) - psi(n_xz + 1) - psi(n_yz + 1).
__device__ __forceinline__ float pptm_op_ksg_digamma(float nxz, float nyz, float nz) {
    return pptm_op_digamma(nz + 1.0f) - pptm_op_digamma(nxz + 1.0f) - pptm_op_digamma(nyz + 1.0f);
}

// AddDigamma: x + psi(k).
__device__ __forceinline__ float pptm_op_add_digamma(float x, uint32_t k) { return x + pptm_op_digamma((float)k); }

// Digamma in f64 (precision = "fp64"): recurrence up to 10, then the asymptotic series to x^-10,
// as the CPU reference (pptm_spec::ops::digamma) computes it.
__device__ __forceinline__ double pptm_op_digamma(double x) {
    if (isnan(x) || (x <= 0.0 && x == floor(x))) return __longlong_as_double(0x7ff8000000000000ll);
    double acc = 0.0;
    if (x < 0.0) {
        const double pi = 3.14159265358979323846;
        acc = -pi / tan(pi * x);
        x = 1.0 - x;
    }
    while (x < 10.0) {
        acc -= 1.0 / x;
        x += 1.0;
    }
    const double r = 1.0 / (x * x);
    return acc + log(x) - 0.5 / x -
           r * (1.0 / 12.0 - r * (1.0 / 120.0 - r * (1.0 / 252.0 - r * (1.0 / 240.0 - r / 132.0))));
}
__device__ __forceinline__ double pptm_op_ksg_digamma(double nxz, double nyz, double nz) {
    return pptm_op_digamma(nz + 1.0) - pptm_op_digamma(nxz + 1.0) - pptm_op_digamma(nyz + 1.0);
}
__device__ __forceinline__ double pptm_op_add_digamma(double x, uint32_t k) { return x + pptm_op_digamma((double)k); }

#endif  // PPTM_OPS_NEIGHBOURS_CUH
