// pptm fusion patterns for linear algebra: the loops codegen instantiates for a chain whose core is
// a matrix product, with the elementwise stages before and after it fused in.
//
//   * pptm_gemv_n:  y_i = epi(i, sum_j A[i, j] * pro(j)),  i < m  (A x, A row-major m x n).
//   * pptm_gemv_t:  y_j = epi(j, sum_i A[i, j] * pro(i)),  j < n  (A^T x, same A).
//   * pptm_matmul:  out[i, j] = epi(i, j, sum_p A[i, p] * W[p, j])  (A m x k, W k x n, row-major).
//
// Functor contract (codegen emits them; the patterns take them by const reference):
//   * pro(j) -> float: element j of the fused input vector. It loads from user buffers itself, with
//     pptm_ld_cg_*; the patterns call it only for j in range, possibly more than once per j.
//   * epi(i, acc) / epi(i, j, acc) -> float: the chain's value for an output element, given the f32
//     dot product; called exactly once per output element, by one thread.
// The gemv patterns fold every y into a per-thread f64 accumulator with the reducer R and return
// the block's partial (valid in thread 0), like pptm_map_reduce; `out` may be nullptr when the chain
// only reduces. With R = pptm_no_reducer they skip the block reduction and return 0.
//
// Every thread of the block calls a pattern, with the same arguments; work is split over blocks
// grid-stride, so any b.nblocks >= 1 is correct (the host's request is only a hint). Barriers inside
// sit in block-uniform loops. A, W and everything pro/epi read go through L2 (pptm_ld_cg_*): the
// manifold is persistent and an L1 line from an earlier item must never be read. 16-byte loads are
// used only where every row start is 16-byte aligned (aligned base and a row length that is a
// multiple of 4); otherwise a scalar path with the same results.
//
// Dot products accumulate in f32 in short runs (a few terms per partial, partials summed
// pairwise; no running sum sees more than about n / 64 additions), well inside the 1e-4 bar.
//
// Shared memory: one static 16 KiB scratch shared by all three patterns and every instantiation
// (pptm_linear_smem), plus b.red_smem for the block reduction.
#ifndef PPTM_PATTERN_LINEAR_CUH
#define PPTM_PATTERN_LINEAR_CUH

#include "pptm/device.cuh"

// Shared scratch for every linear pattern of the translation unit. A __shared__ array declared in
// a pattern would be one array per instantiation (per chain), and a domain with a few chains would
// run past the 48 KiB of static shared memory; one area, reused, costs 16 KiB whatever the chains.
// Each pattern writes it only after a barrier that follows every earlier read of it (its own
// previous tile, or a previous pattern's last).
#define PPTM_LINEAR_SMEM_FLOATS 4096

__device__ __forceinline__ float* pptm_linear_smem() {
    __shared__ __align__(16) float scratch[PPTM_LINEAR_SMEM_FLOATS];
    return scratch;
}

__device__ __forceinline__ float pptm_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float pptm_dot4(const pptm_f4& a, const pptm_f4& x) {
    return fmaf(a.x, x.x, a.y * x.y) + fmaf(a.z, x.z, a.w * x.w);
}

// ---- gemv_n: y = epi(A pro) ---------------------------------------------------------------------
//
// A block takes a group of PPTM_GEMV_N_ROWS rows (64, the count the host sizes its request by):
// each warp owns 4 whole rows, and its lanes stride along them, so A streams in fully coalesced
// 512-byte warp loads. pro is evaluated once per group, not once per row: the block stages x in
// shared memory, PPTM_GEMV_N_CHUNK elements at a time, double-buffered so that one barrier per
// chunk suffices and the next chunk's pro loads are in flight while the current chunk streams.

#define PPTM_GEMV_N_ROWS_PER_WARP 4
#define PPTM_GEMV_N_ROWS (PPTM_WARPS * PPTM_GEMV_N_ROWS_PER_WARP)
#define PPTM_GEMV_N_CHUNK 2048
// Independent 16-byte loads in flight per lane on the aligned path (scalar path: twice as many
// 4-byte loads).
#ifndef PPTM_GEMV_N_UNROLL
#define PPTM_GEMV_N_UNROLL 4
#endif

static_assert(PPTM_GEMV_N_CHUNK % PPTM_BLOCK_THREADS == 0, "gemv_n: a chunk is filled in whole rounds");
static_assert(PPTM_GEMV_N_CHUNK % (4 * 32 * PPTM_GEMV_N_UNROLL) == 0, "gemv_n: full chunks need no tail");

// pro for this thread's elements of the chunk starting at c0 (0 past the end of x).
template <class Pro>
__device__ __forceinline__ void pptm_gemv_n_stage(const Pro& pro, uint64_t n, uint64_t c0,
                                                  float (&xr)[PPTM_GEMV_N_CHUNK / PPTM_BLOCK_THREADS]) {
#pragma unroll
    for (int f = 0; f < PPTM_GEMV_N_CHUNK / PPTM_BLOCK_THREADS; ++f) {
        const uint64_t j = c0 + threadIdx.x + (uint64_t)f * PPTM_BLOCK_THREADS;
        xr[f] = j < n ? pro(j) : 0.0f;
    }
}

// One lane's share of a row segment times the staged chunk; `a` and `xs` are 16-byte aligned and
// the segment holds len4 float4s.
__device__ __forceinline__ float pptm_gemv_n_dot_vec(const float* a, const float* xs, uint32_t len4, uint32_t lane) {
    constexpr uint32_t U = PPTM_GEMV_N_UNROLL;
    const pptm_f4* x4 = reinterpret_cast<const pptm_f4*>(xs);
    float p[U];
#pragma unroll
    for (uint32_t u = 0; u < U; ++u) p[u] = 0.0f;
    uint32_t q = lane;
#pragma unroll 1
    for (; q + 32 * (U - 1) < len4; q += 32 * U) {
        pptm_f4 v[U];
#pragma unroll
        for (uint32_t u = 0; u < U; ++u) v[u] = pptm_ld_cg_f4(a + 4 * (uint64_t)(q + 32 * u));
#pragma unroll
        for (uint32_t u = 0; u < U; ++u) p[u] += pptm_dot4(v[u], x4[q + 32 * u]);
    }
#pragma unroll 1
    for (; q < len4; q += 32) p[0] += pptm_dot4(pptm_ld_cg_f4(a + 4 * (uint64_t)q), x4[q]);
#pragma unroll
    for (uint32_t h = U / 2; h > 0; h /= 2)
#pragma unroll
        for (uint32_t u = 0; u < h; ++u) p[u] += p[u + h];
    return p[0];
}

// The same for any alignment: lanes stride element by element (still coalesced).
__device__ __forceinline__ float pptm_gemv_n_dot_scalar(const float* a, const float* xs, uint32_t len, uint32_t lane) {
    constexpr uint32_t U = 2 * PPTM_GEMV_N_UNROLL;
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint32_t j = lane;
#pragma unroll 1
    for (; j + 32 * (U - 1) < len; j += 32 * U) {
        float v[U];
#pragma unroll
        for (uint32_t u = 0; u < U; ++u) v[u] = pptm_ld_cg_f32(a + j + 32 * u);
#pragma unroll
        for (uint32_t u = 0; u < U; ++u) p[u & 3] = fmaf(v[u], xs[j + 32 * u], p[u & 3]);
    }
#pragma unroll 1
    for (; j < len; j += 32) p[0] = fmaf(pptm_ld_cg_f32(a + j), xs[j], p[0]);
    return (p[0] + p[1]) + (p[2] + p[3]);
}

template <class R, class Pro, class Epi>
__device__ __forceinline__ double pptm_gemv_n(const float* A, uint64_t m, uint64_t n, const Pro& pro, const Epi& epi,
                                              float* out, const pptm_block_ctx& b) {
    constexpr uint32_t RPW = PPTM_GEMV_N_ROWS_PER_WARP, CH = PPTM_GEMV_N_CHUNK;
    static_assert(2 * CH <= PPTM_LINEAR_SMEM_FLOATS, "gemv_n: two chunks of x fit the scratch");
    float* const xs = pptm_linear_smem();
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    // Row i starts at A + i * n: every row start is aligned iff A is and n % 4 == 0; chunk starts
    // are multiples of CH, so every chunk of a row is aligned too.
    const bool vec = pptm_aligned16(A) && n % 4 == 0;
    const uint64_t groups = m / PPTM_GEMV_N_ROWS + (m % PPTM_GEMV_N_ROWS != 0);
    double red = R::identity();
    for (uint64_t g = b.block; g < groups; g += b.nblocks) {
        const uint64_t row0 = g * PPTM_GEMV_N_ROWS + warp * RPW;
        // Row row0 + r's running sum lives in lane r: one register however many rows a warp owns.
        float acc = 0.0f;
        float xr[CH / PPTM_BLOCK_THREADS];
        // Every reader of the scratch before this group (this call's or an earlier pattern's) is done.
        __syncthreads();
        if (n > 0) pptm_gemv_n_stage(pro, n, 0, xr);
        uint32_t buf = 0;
        for (uint64_t c0 = 0; c0 < n; c0 += CH) {
            // This buffer was last read for chunk c0 - 2 CH, finished before the barrier of c0 - CH.
            float* const xc = xs + buf * CH;
#pragma unroll
            for (uint32_t f = 0; f < CH / PPTM_BLOCK_THREADS; ++f) xc[threadIdx.x + f * PPTM_BLOCK_THREADS] = xr[f];
            __syncthreads();
            if (n - c0 > CH) pptm_gemv_n_stage(pro, n, c0 + CH, xr);
            const uint32_t len = (uint32_t)min((uint64_t)CH, n - c0);
#pragma unroll 1
            for (uint32_t r = 0; r < RPW; ++r) {
                const uint64_t i = row0 + r;
                if (i >= m) break;  // warp-uniform
                const float* a = A + i * n + c0;
                const float d = vec ? pptm_gemv_n_dot_vec(a, xc, len / 4, lane) : pptm_gemv_n_dot_scalar(a, xc, len, lane);
                const float s = pptm_warp_sum(d);
                if (lane == r) acc += s;
            }
            buf ^= 1u;
        }
        const uint64_t i = row0 + lane;
        if (lane < RPW && i < m) {
            const float y = epi(i, acc);
            if (out != nullptr) out[i] = y;
            red = R::combine(red, (double)y);
        }
    }
    return pptm_block_partial<R>(red, b.red_smem);
}

// ---- gemv_t: y = epi(A^T pro) -------------------------------------------------------------------
//
// A block takes a tile of PPTM_GEMV_T_COLS consecutive columns (the count the host sizes its
// request by); each warp reads whole 512-byte row segments of the tile (a lane: 4 columns) and the
// 16 warps split the rows. The per-warp column sums meet in shared memory, summed in a fixed order,
// so y is deterministic for a given grid. pro(i) is evaluated once per (tile, row): one broadcast
// load per 512 bytes of A.

#define PPTM_GEMV_T_COLS 128
// Rows in flight per warp (each one 16-byte load per lane on the aligned path, four 4-byte loads
// otherwise).
#ifndef PPTM_GEMV_T_UNROLL
#define PPTM_GEMV_T_UNROLL 4
#endif

static_assert(PPTM_GEMV_T_COLS == 4 * 32, "gemv_t: a lane owns 4 columns of the tile");
static_assert((PPTM_GEMV_T_UNROLL & (PPTM_GEMV_T_UNROLL - 1)) == 0, "gemv_t: unroll is a power of two");

template <class R, class Pro, class Epi>
__device__ __forceinline__ double pptm_gemv_t(const float* A, uint64_t m, uint64_t n, const Pro& pro, const Epi& epi,
                                              float* out, const pptm_block_ctx& b) {
    constexpr uint32_t U = PPTM_GEMV_T_UNROLL, TW = PPTM_GEMV_T_COLS;
    static_assert(PPTM_WARPS * TW <= PPTM_LINEAR_SMEM_FLOATS, "gemv_t: the warps' column sums fit the scratch");
    float(*const part)[TW] = reinterpret_cast<float(*)[TW]>(pptm_linear_smem());
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const bool vec = pptm_aligned16(A) && n % 4 == 0;
    const uint64_t tiles = n / TW + (n % TW != 0);
    double red = R::identity();
    for (uint64_t t = b.block; t < tiles; t += b.nblocks) {
        const uint64_t c0 = t * TW;
        // Every reader of the scratch before this tile (this call's or an earlier pattern's) is done.
        __syncthreads();
        // s[e]: this warp's sum for one of the lane's 4 columns (which ones depends on the path).
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (vec) {
            // Lane columns c0 + 4 lane .. + 3: all in range or all out, as n % 4 == 0.
            const uint64_t col = c0 + 4 * lane;
            if (col < n) {
                const float* a = A + col;
                uint64_t i = warp;
#pragma unroll 1
                for (; i + (uint64_t)PPTM_WARPS * (U - 1) < m; i += (uint64_t)PPTM_WARPS * U) {
                    pptm_f4 v[U];
                    float x[U];
#pragma unroll
                    for (uint32_t u = 0; u < U; ++u) v[u] = pptm_ld_cg_f4(a + (i + PPTM_WARPS * u) * n);
#pragma unroll
                    for (uint32_t u = 0; u < U; ++u) x[u] = pro(i + PPTM_WARPS * u);
                    // Products summed pairwise before they reach the running sums: short runs.
                    float px[U], py[U], pz[U], pw[U];
#pragma unroll
                    for (uint32_t u = 0; u < U; ++u) {
                        px[u] = v[u].x * x[u];
                        py[u] = v[u].y * x[u];
                        pz[u] = v[u].z * x[u];
                        pw[u] = v[u].w * x[u];
                    }
#pragma unroll
                    for (uint32_t h = U / 2; h > 0; h /= 2)
#pragma unroll
                        for (uint32_t u = 0; u < h; ++u) {
                            px[u] += px[u + h];
                            py[u] += py[u + h];
                            pz[u] += pz[u + h];
                            pw[u] += pw[u + h];
                        }
                    s[0] += px[0];
                    s[1] += py[0];
                    s[2] += pz[0];
                    s[3] += pw[0];
                }
#pragma unroll 1
                for (; i < m; i += PPTM_WARPS) {
                    const pptm_f4 v = pptm_ld_cg_f4(a + i * n);
                    const float x = pro(i);
                    s[0] = fmaf(v.x, x, s[0]);
                    s[1] = fmaf(v.y, x, s[1]);
                    s[2] = fmaf(v.z, x, s[2]);
                    s[3] = fmaf(v.w, x, s[3]);
                }
            }
            pptm_f4 w;
            w.x = s[0];
            w.y = s[1];
            w.z = s[2];
            w.w = s[3];
            *reinterpret_cast<pptm_f4*>(&part[warp][4 * lane]) = w;
        } else {
            // Lane columns c0 + lane + 32 e: each 4-byte load instruction covers 128 contiguous bytes.
            const uint64_t col = c0 + lane;
            bool in[4];
#pragma unroll
            for (uint32_t e = 0; e < 4; ++e) in[e] = col + 32 * e < n;
            if (in[0]) {
                const float* a = A + col;
                uint64_t i = warp;
#pragma unroll 1
                for (; i + (uint64_t)PPTM_WARPS * (U - 1) < m; i += (uint64_t)PPTM_WARPS * U) {
                    float v[U][4];
                    float x[U];
#pragma unroll
                    for (uint32_t u = 0; u < U; ++u)
#pragma unroll
                        for (uint32_t e = 0; e < 4; ++e)
                            v[u][e] = in[e] ? pptm_ld_cg_f32(a + (i + PPTM_WARPS * u) * n + 32 * e) : 0.0f;
#pragma unroll
                    for (uint32_t u = 0; u < U; ++u) x[u] = pro(i + PPTM_WARPS * u);
#pragma unroll
                    for (uint32_t e = 0; e < 4; ++e) {
                        float p[U];
#pragma unroll
                        for (uint32_t u = 0; u < U; ++u) p[u] = v[u][e] * x[u];
#pragma unroll
                        for (uint32_t h = U / 2; h > 0; h /= 2)
#pragma unroll
                            for (uint32_t u = 0; u < h; ++u) p[u] += p[u + h];
                        s[e] += p[0];
                    }
                }
#pragma unroll 1
                for (; i < m; i += PPTM_WARPS) {
                    const float x = pro(i);
#pragma unroll
                    for (uint32_t e = 0; e < 4; ++e)
                        if (in[e]) s[e] = fmaf(pptm_ld_cg_f32(a + i * n + 32 * e), x, s[e]);
                }
            }
#pragma unroll
            for (uint32_t e = 0; e < 4; ++e) part[warp][lane + 32 * e] = s[e];
        }
        __syncthreads();
        if (threadIdx.x < TW) {
            // Both paths keep column c0 + k in part[.][k]; thread k takes it, so the epilogue's
            // loads and stores stay coalesced.
            const uint64_t col = c0 + threadIdx.x;
            if (col < n) {
                float h0 = 0.0f, h1 = 0.0f;
#pragma unroll
                for (uint32_t w = 0; w < PPTM_WARPS; w += 2) {
                    h0 += part[w][threadIdx.x];
                    h1 += part[w + 1][threadIdx.x];
                }
                const float y = epi(col, h0 + h1);
                if (out != nullptr) out[col] = y;
                red = R::combine(red, (double)y);
            }
        }
    }
    return pptm_block_partial<R>(red, b.red_smem);
}

// ---- matmul: out = epi(A W) ---------------------------------------------------------------------
//
// CUDA-core f32 tiling. A block computes a 64 x 64 tile of out, each thread a 2 x 4 micro-tile
// (rows 2 ty, 2 ty + 1; columns 4 tx .. 4 tx + 3). K advances in steps of 16: half the block stages
// the 64 x 16 slice of A, the other half the 16 x 64 slice of W, one 16-byte load (or four 4-byte
// loads) per thread, zero outside the matrices, so any m, k, n works. The next slice's loads are
// issued before the current one is multiplied and land in registers; they go to shared memory after
// the barrier that ends the multiply.

#define PPTM_MATMUL_TILE 64
#define PPTM_MATMUL_TK 16
// A's slice is stored row-major with rows padded to 20 floats: 16-byte aligned rows, and the two
// rows a warp reads at once (2 apart) fall 8 banks apart.
#define PPTM_MATMUL_AS (PPTM_MATMUL_TK + 4)

static_assert(PPTM_BLOCK_THREADS == 512, "matmul: 512 threads, a 2 x 4 micro-tile each, cover 64 x 64");

template <class Epi>
__device__ __forceinline__ void pptm_matmul(const float* A, const float* W, uint64_t m, uint64_t k, uint64_t n,
                                            const Epi& epi, float* out, const pptm_block_ctx& b) {
    constexpr uint32_t T = PPTM_MATMUL_TILE, TK = PPTM_MATMUL_TK;
    static_assert(T * PPTM_MATMUL_AS + TK * T <= PPTM_LINEAR_SMEM_FLOATS, "matmul: both slices fit the scratch");
    float(*const as)[PPTM_MATMUL_AS] = reinterpret_cast<float(*)[PPTM_MATMUL_AS]>(pptm_linear_smem());
    float(*const ws)[T] = reinterpret_cast<float(*)[T]>(pptm_linear_smem() + T * PPTM_MATMUL_AS);
    const uint32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    // Warps 0-7 stage A, warps 8-15 stage W: the split is warp-uniform.
    const bool stages_a = threadIdx.x < PPTM_BLOCK_THREADS / 2;
    const uint32_t st = threadIdx.x % (PPTM_BLOCK_THREADS / 2);
    const bool vec_a = pptm_aligned16(A) && k % 4 == 0;
    const bool vec_w = pptm_aligned16(W) && n % 4 == 0;
    const bool vec_out = out != nullptr && pptm_aligned16(out) && n % 4 == 0;
    const uint64_t tiles_n = n / T + (n % T != 0);
    const uint64_t tiles = (m / T + (m % T != 0)) * tiles_n;
    const uint64_t ktiles = k / TK + (k % TK != 0);
    for (uint64_t tile = b.block; tile < tiles; tile += b.nblocks) {
        const uint64_t i0 = tile / tiles_n * T, j0 = tile % tiles_n * T;
        float acc[2][4];
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;
        // This thread's part of the slice at k0, in the order it is stored below.
        float sv[4];
        auto load = [&](uint64_t k0) {
            if (stages_a) {
                if (vec_a) {
                    // Row st / 4, columns k0 + 4 (st % 4) .. + 3: all in range or none (k % 4 == 0).
                    const uint64_t i = i0 + st / 4, p = k0 + 4 * (st % 4);
                    pptm_f4 v = {0.0f, 0.0f, 0.0f, 0.0f};
                    if (i < m && p < k) v = pptm_ld_cg_f4(A + i * k + p);
                    sv[0] = v.x;
                    sv[1] = v.y;
                    sv[2] = v.z;
                    sv[3] = v.w;
                } else {
#pragma unroll
                    for (uint32_t e = 0; e < 4; ++e) {
                        const uint32_t idx = st + e * (PPTM_BLOCK_THREADS / 2);
                        const uint64_t i = i0 + idx / TK, p = k0 + idx % TK;
                        sv[e] = i < m && p < k ? pptm_ld_cg_f32(A + i * k + p) : 0.0f;
                    }
                }
            } else {
                if (vec_w) {
                    // Row k0 + st / 16, columns j0 + 4 (st % 16) .. + 3: all in range or none.
                    const uint64_t p = k0 + st / 16, j = j0 + 4 * (st % 16);
                    pptm_f4 v = {0.0f, 0.0f, 0.0f, 0.0f};
                    if (p < k && j < n) v = pptm_ld_cg_f4(W + p * n + j);
                    sv[0] = v.x;
                    sv[1] = v.y;
                    sv[2] = v.z;
                    sv[3] = v.w;
                } else {
#pragma unroll
                    for (uint32_t e = 0; e < 4; ++e) {
                        const uint32_t idx = st + e * (PPTM_BLOCK_THREADS / 2);
                        const uint64_t p = k0 + idx / T, j = j0 + idx % T;
                        sv[e] = p < k && j < n ? pptm_ld_cg_f32(W + p * n + j) : 0.0f;
                    }
                }
            }
        };
        if (ktiles > 0) load(0);
        for (uint64_t kt = 0; kt < ktiles; ++kt) {
            // Every reader of the scratch before this slice (the previous slice's multiply, or an
            // earlier pattern) is done.
            __syncthreads();
            if (stages_a) {
                if (vec_a) {
                    pptm_f4 v;
                    v.x = sv[0];
                    v.y = sv[1];
                    v.z = sv[2];
                    v.w = sv[3];
                    *reinterpret_cast<pptm_f4*>(&as[st / 4][4 * (st % 4)]) = v;
                } else {
#pragma unroll
                    for (uint32_t e = 0; e < 4; ++e) {
                        const uint32_t idx = st + e * (PPTM_BLOCK_THREADS / 2);
                        as[idx / TK][idx % TK] = sv[e];
                    }
                }
            } else {
                if (vec_w) {
                    pptm_f4 v;
                    v.x = sv[0];
                    v.y = sv[1];
                    v.z = sv[2];
                    v.w = sv[3];
                    *reinterpret_cast<pptm_f4*>(&ws[st / 16][4 * (st % 16)]) = v;
                } else {
#pragma unroll
                    for (uint32_t e = 0; e < 4; ++e) {
                        const uint32_t idx = st + e * (PPTM_BLOCK_THREADS / 2);
                        ws[idx / T][idx % T] = sv[e];
                    }
                }
            }
            __syncthreads();
            if (kt + 1 < ktiles) load((kt + 1) * TK);
#pragma unroll
            for (uint32_t p = 0; p < TK; p += 4) {
                const pptm_f4 a0 = *reinterpret_cast<const pptm_f4*>(&as[2 * ty][p]);
                const pptm_f4 a1 = *reinterpret_cast<const pptm_f4*>(&as[2 * ty + 1][p]);
                const float a0v[4] = {a0.x, a0.y, a0.z, a0.w}, a1v[4] = {a1.x, a1.y, a1.z, a1.w};
#pragma unroll
                for (uint32_t e = 0; e < 4; ++e) {
                    const pptm_f4 w = *reinterpret_cast<const pptm_f4*>(&ws[p + e][4 * tx]);
                    acc[0][0] = fmaf(a0v[e], w.x, acc[0][0]);
                    acc[0][1] = fmaf(a0v[e], w.y, acc[0][1]);
                    acc[0][2] = fmaf(a0v[e], w.z, acc[0][2]);
                    acc[0][3] = fmaf(a0v[e], w.w, acc[0][3]);
                    acc[1][0] = fmaf(a1v[e], w.x, acc[1][0]);
                    acc[1][1] = fmaf(a1v[e], w.y, acc[1][1]);
                    acc[1][2] = fmaf(a1v[e], w.z, acc[1][2]);
                    acc[1][3] = fmaf(a1v[e], w.w, acc[1][3]);
                }
            }
        }
        if (out != nullptr) {
            const uint64_t j = j0 + 4 * tx;
#pragma unroll
            for (uint32_t r = 0; r < 2; ++r) {
                const uint64_t i = i0 + 2 * ty + r;
                if (i >= m) continue;
                if (vec_out && j < n) {
                    // n % 4 == 0: columns j .. j + 3 are all in range.
                    pptm_f4 v;
                    v.x = epi(i, j, acc[r][0]);
                    v.y = epi(i, j + 1, acc[r][1]);
                    v.z = epi(i, j + 2, acc[r][2]);
                    v.w = epi(i, j + 3, acc[r][3]);
                    *reinterpret_cast<pptm_f4*>(out + i * n + j) = v;
                } else {
#pragma unroll
                    for (uint32_t c = 0; c < 4; ++c)
                        if (j + c < n) out[i * n + j + c] = epi(i, j + c, acc[r][c]);
                }
            }
        }
    }
}

#endif  // PPTM_PATTERN_LINEAR_CUH
