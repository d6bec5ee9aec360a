// Op family: nearest-neighbour statistics over point sets (distance_kth, KSG transfer entropy).
// CPU references and fusion classes: spec/src/ops/neighbours.rs.
//
// The pairwise ops are "distance" types and the row reductions "row" types that
// pptm_pairwise_rows (pptm/pattern/pairwise.cuh) instantiates:
//   distance: W (values per pair); features() (coordinates per point, all subspaces);
//             feature(j, c) (coordinate c of point j, from global memory);
//             pair(fi, fj, stride, d[W]) (point i's coordinates fi[c], point j's at fj[c * stride]).
//   row:      OUT (values per point); State; init(State&, i); push(State&, d[W]);
//             finish(State&, out[OUT]) (warp-collective: merges the lanes' states).
// Distances are |a - b| of f32 coordinates in f32, maximised exactly: the CPU reference computes
// the same bits, so counts at the radius agree.
#ifndef PPTM_OPS_NEIGHBOURS_CUH
#define PPTM_OPS_NEIGHBOURS_CUH

#include "pptm/device.cuh"
#include "pptm/pattern/pairwise.cuh"

#ifndef PPTM_MAX_K
#error "PPTM_MAX_K must be defined by the generated translation unit"
#endif

// Chebyshev distance over the d coordinates starting at fi[0] / fj[0].
__device__ __forceinline__ float pptm_chebyshev_span(const float* fi, const float* fj, uint32_t stride, uint32_t d) {
    float m = 0.0f;
    for (uint32_t c = 0; c < d; ++c) m = fmaxf(m, fabsf(fi[c] - fj[c * stride]));
    return m;
}

// ChebyshevDistance: max-norm distance between rows of x (n x d).
struct pptm_op_chebyshev {
    static constexpr int W = 1;
    const float* x;
    uint32_t d;
    __device__ __forceinline__ uint32_t features() const { return d; }
    __device__ __forceinline__ float feature(uint64_t j, uint32_t c) const { return pptm_ld_cg_f32(x + j * d + c); }
    __device__ __forceinline__ void pair(const float* fi, const float* fj, uint32_t stride, float (&out)[W]) const {
        out[0] = pptm_chebyshev_span(fi, fj, stride, d);
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
    __device__ __forceinline__ float feature(uint64_t j, uint32_t c) const {
        if (c < dx) return pptm_ld_cg_f32(x + j * dx + c);
        c -= dx;
        if (c < dy) return pptm_ld_cg_f32(y + j * dy + c);
        return pptm_ld_cg_f32(z + j * dz + (c - dy));
    }
    __device__ __forceinline__ void pair(const float* fi, const float* fj, uint32_t stride, float (&out)[W]) const {
        const float ddx = pptm_chebyshev_span(fi, fj, stride, dx);
        const float ddy = pptm_chebyshev_span(fi + dx, fj + dx * stride, stride, dy);
        const float ddz = pptm_chebyshev_span(fi + dx + dy, fj + (dx + dy) * stride, stride, dz);
        out[0] = fmaxf(ddx, ddz);
        out[1] = fmaxf(ddy, ddz);
        out[2] = ddz;
    }
};

// KthSmallest: each lane keeps its k smallest distances in registers (k <= PPTM_MAX_K), sorted
// ascending in the last k slots of `top` (the others hold +inf and are never touched), so the bar
// a new distance must beat is always top[PPTM_MAX_K - 1]. Every index is a compile-time constant
// after unrolling: a runtime index (top[k - 1]) would move the array to local memory. The warp then
// pops the smallest value k times (lowest lane first on ties), so tied distances count once each.
struct pptm_op_kth_smallest {
    static constexpr int OUT = 1;
    uint32_t k;
    struct State {
        float top[PPTM_MAX_K];
    };
    __device__ __forceinline__ void init(State& s, uint64_t) const {
#pragma unroll
        for (int t = 0; t < PPTM_MAX_K; ++t) s.top[t] = __int_as_float(0x7f800000);
    }
    __device__ __forceinline__ void push(State& s, const float (&d)[1]) const {
        if (!(d[0] < s.top[PPTM_MAX_K - 1])) return;
        const int first = PPTM_MAX_K - (int)k;
        float carry = d[0];
#pragma unroll
        for (int t = 0; t < PPTM_MAX_K; ++t) {
            if (t >= first) {
                const float lo = fminf(s.top[t], carry);
                carry = fmaxf(s.top[t], carry);
                s.top[t] = lo;
            }
        }
    }
    __device__ __forceinline__ void finish(State& s, float (&out)[1]) const {
        const unsigned lane = threadIdx.x & 31u;
        float v = 0.0f;
        for (uint32_t r = 0; r < k; ++r) {
            float head = s.top[0];
#pragma unroll
            for (int t = 1; t < PPTM_MAX_K; ++t) head = fminf(head, s.top[t]);
            // The warp's smallest head, lowest lane first on ties.
            v = head;
            unsigned who = lane;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, v, o);
                const unsigned ow = __shfl_xor_sync(0xffffffffu, who, o);
                if (ov < v || (ov == v && ow < who)) {
                    v = ov;
                    who = ow;
                }
            }
            if (who == lane) {
                bool popped = false;
#pragma unroll
                for (int t = 0; t < PPTM_MAX_K; ++t) {
                    if (!popped && s.top[t] == head) {
                        s.top[t] = __int_as_float(0x7f800000);
                        popped = true;
                    }
                }
            }
        }
        out[0] = v;
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
    __device__ __forceinline__ void push(State& s, const float (&d)[C]) const {
#pragma unroll
        for (int c = 0; c < C; ++c) s.count[c] += d[c] < s.eps ? 1u : 0u;
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

#endif  // PPTM_OPS_NEIGHBOURS_CUH
