// pptm fusion patterns for linear algebra: the loops codegen instantiates for a chain whose core is
// a matrix product, with the elementwise stages before and after it fused in.
//
//   * pptm_gemv_n:  y_i = epi(i, sum_j A[i, j] * pro(j)),  i < m  (A x, A row-major m x n).
//   * pptm_gemv_t:  y_j = epi(j, sum_i A[i, j] * pro(i)),  j < n  (A^T x, same A).
//     A GEMV's A may be f32 or stored narrow (bf16, fp16, E4M3; pptm_storage in device.cuh): each
//     element is widened to f32 as it is loaded, and the sums are f32 as for an f32 A. A GEMV's
//     time is reading A, so a bf16 A halves it; the vector is not rounded.
//   * pptm_matmul:  out[i, j] = epi(i, j, sum_p A[i, p] * W[p, j])  (A m x k, W k x n, row-major).
//
// Functor contract (codegen emits them; the patterns take them by const reference):
//   * pro(j) -> float: element j of the fused input vector. It loads from user buffers itself, with
//     pptm_ld_cg_*; the patterns call it only for j in range, possibly more than once per j.
//   * epi(i, acc) / epi(i, j, acc) -> float: the chain's value for an output element, given the f32
//     dot product; called exactly once per output element, by one thread.
//   * A matmul epilogue also comes in two halves, for the tensor-core patterns: epi.cols(j, c)
//     loads the Epi::col_loads values it reads by column j (a bias), and epi(i, j, acc, c)
//     finishes from them, so a thread loads a column's values once for all the rows it stores
//     (pptm_epi_cols in device.cuh).
// The gemv patterns fold every y into a per-thread f64 accumulator with the reducer R and return
// the block's partial (valid in thread 0), like pptm_map_reduce; `out` may be nullptr when the chain
// only reduces. With R = pptm_no_reducer they skip the block reduction and return 0.
//
// Every thread of the block calls a pattern, with the same arguments; work is split over blocks
// grid-stride, so any b.nblocks >= 1 is correct (the host's request is only a hint). Barriers inside
// sit in block-uniform loops. A, W and everything pro/epi read go through L2 (pptm_ld_cg_*): the
// manifold is persistent and an L1 line from an earlier item must never be read. 16-byte loads are
// used only where every row start is 16-byte aligned (aligned base and a row length that is a
// multiple of 16 bytes); otherwise a scalar path with the same results.
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
// The f32 patterns here use PPTM_LINEAR_SMEM_FLOATS of it; a domain with a tensor-core stage
// allocates more (PPTM_LINEAR_SMEM_ALLOC_FLOATS, set by codegen), for pattern/mma.cuh's slices.
#define PPTM_LINEAR_SMEM_FLOATS 4096
#ifndef PPTM_LINEAR_SMEM_ALLOC_FLOATS
#define PPTM_LINEAR_SMEM_ALLOC_FLOATS PPTM_LINEAR_SMEM_FLOATS
#endif
static_assert(PPTM_LINEAR_SMEM_ALLOC_FLOATS >= PPTM_LINEAR_SMEM_FLOATS, "linear: the scratch holds the f32 patterns'");

__device__ __forceinline__ float* pptm_linear_smem() {
#ifdef PPTM_WGMMA
    static_assert(PPTM_LINEAR_SMEM_ALLOC_FLOATS * 4 <= PPTM_DYNAMIC_SMEM_BYTES, "linear: the scratch fits the dynamic shared memory");
    return reinterpret_cast<float*>(pptm_dynamic_smem());
#else
    __shared__ __align__(16) float scratch[PPTM_LINEAR_SMEM_ALLOC_FLOATS];
    return scratch;
#endif
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
// A block takes a group of rows: each warp owns PPTM_GEMV_N_ROWS_PER_WARP (4) whole rows, or one
// when m < PPTM_GEMV_N_SHORT_BELOW, and its lanes stride along them, so A streams in fully
// coalesced 512-byte warp loads. Four rows a warp stage x once per 64 rows; one row a warp gives
// four times the blocks, which a matrix of few rows needs to reach more than a handful of SMs (the
// host sizes its request by the same rule). pro is evaluated once per group, not once per row: the
// block stages x in shared memory, PPTM_GEMV_N_CHUNK elements at a time, double-buffered so that
// one barrier per chunk suffices and the next chunk's pro loads are in flight while the current
// chunk streams.
//
// An f32 A of many long rows takes the stream walk instead (pptm_gemv_n_stream, below): no staging.
// Two ways through a chunk, by A's element type:
//   * f32: a warp walks its rows one after the other, PPTM_GEMV_N_UNROLL 16-byte loads a lane in
//     flight, and sums each row's chunk across the warp before the next row.
//   * bf16, fp16, E4M3: a warp walks its rows together (pptm_gemv_n_dot_slots): at each 16-byte
//     piece a lane reads the staged x once and the piece of each of its four rows, keeps a partial
//     per row across the chunks, and the warp sums each row once a group. Row by row, a chunk is
//     only 4 KiB of an fp16 row, and the warp sum and the drained loads of every row and chunk
//     held an fp16 A to 2.57 TB/s on an H100 (16384^2, bench/probes/gemv_probe.cu), an E4M3 A to
//     1.64; together they read 2.87 and 2.44 TB/s. f32 keeps the row walk: the slot loop gains it
//     3% stand-alone, but inlined in the f32 domains' manifolds its registers cost the chains
//     beside it (KlComplexity at 2^26 went from 184 to 275 us, its spills from 8 bytes to 172).

#ifndef PPTM_GEMV_N_SHORT_BELOW
#error "PPTM_GEMV_N_SHORT_BELOW must be defined by the generated translation unit"
#endif
#define PPTM_GEMV_N_ROWS_PER_WARP 4
#define PPTM_GEMV_N_CHUNK 2048
// Independent 16-byte loads in flight per lane on the aligned f32 path (scalar path: twice as many
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

// Piece q of a row segment (16 bytes of E: V = 4 PER_WORD elements) times the staged x values it
// meets: four words, each widened to PER_WORD floats, in runs of four products.
template <class E>
__device__ __forceinline__ float pptm_gemv_n_dot_piece(const pptm_f4& v, const pptm_f4* x) {
    constexpr uint32_t PW = pptm_storage<E>::PER_WORD;
    const uint32_t w[4] = {__float_as_uint(v.x), __float_as_uint(v.y), __float_as_uint(v.z), __float_as_uint(v.w)};
    float d = 0.0f;
#pragma unroll
    for (uint32_t g = 0; g < PW; ++g) {
        float f[4];
#pragma unroll
        for (uint32_t k = 0; k < 4 / PW; ++k) pptm_storage<E>::widen(w[g * (4 / PW) + k], f + k * PW);
        const pptm_f4 a = {f[0], f[1], f[2], f[3]};
        const float t = pptm_dot4(a, x[g]);
        d = g == 0 ? t : d + t;
    }
    return d;
}

// One lane's share of a row segment times the staged chunk (the f32 row walk); `a` and `xs` are
// 16-byte aligned and the segment holds len16 pieces of 16 bytes.
template <class E>
__device__ __forceinline__ float pptm_gemv_n_dot_vec(const E* a, const float* xs, uint32_t len16, uint32_t lane) {
    constexpr uint32_t U = PPTM_GEMV_N_UNROLL, PW = pptm_storage<E>::PER_WORD, V = 4 * PW;
    const pptm_f4* x4 = reinterpret_cast<const pptm_f4*>(xs);
    auto piece = [&](uint32_t q) { return pptm_ld_cg_f4(reinterpret_cast<const float*>(a + V * (uint64_t)q)); };
    float p[U];
#pragma unroll
    for (uint32_t u = 0; u < U; ++u) p[u] = 0.0f;
    uint32_t q = lane;
#pragma unroll 1
    for (; q + 32 * (U - 1) < len16; q += 32 * U) {
        pptm_f4 v[U];
#pragma unroll
        for (uint32_t u = 0; u < U; ++u) v[u] = piece(q + 32 * u);
#pragma unroll
        for (uint32_t u = 0; u < U; ++u) p[u] += pptm_gemv_n_dot_piece<E>(v[u], x4 + PW * (q + 32 * u));
    }
    if (q < len16) {
        // Fewer than U loads a lane left: all issued at once, so a short row costs one round trip.
        pptm_f4 v[U];
#pragma unroll
        for (uint32_t u = 0; u < U; ++u)
            if (q + 32 * u < len16) v[u] = piece(q + 32 * u);
#pragma unroll
        for (uint32_t u = 0; u < U; ++u)
            if (q + 32 * u < len16) p[u] += pptm_gemv_n_dot_piece<E>(v[u], x4 + PW * (q + 32 * u));
    }
#pragma unroll
    for (uint32_t h = U / 2; h > 0; h /= 2)
#pragma unroll
        for (uint32_t u = 0; u < h; ++u) p[u] += p[u + h];
    return p[0];
}

// A warp's share of one chunk on the aligned narrow path: `slots` (up to four) runs of 16-byte
// pieces times the staged chunk `xs`, lane partials added to p[slot]. Slot r reads pieces q < qend
// at a + r step + V q and meets x piece r xq + q, while that is below len16 (the chunk's pieces).
// The warp's rows are its slots (step n, xq 0, qend len16: one staged x read serves every row), or,
// for one row a warp, the four quarters of its chunk (step V xq, xq = qend a quarter of the
// pieces). Either way a lane has four 16-byte loads in flight, and one loop serves both (a second
// instantiation cost the manifold's register allocation). `a` and `xs` are 16-byte aligned.
template <class E>
__device__ __forceinline__ void pptm_gemv_n_dot_slots(const E* a, uint64_t step, uint32_t xq, uint32_t qend, uint32_t slots,
                                                      uint32_t len16, const float* xs, uint32_t lane, float (&p)[4]) {
    constexpr uint32_t PW = pptm_storage<E>::PER_WORD, V = 4 * PW;
    const pptm_f4* x4 = reinterpret_cast<const pptm_f4*>(xs);
#pragma unroll 1
    for (uint32_t q = lane; q < qend; q += 32) {
        pptm_f4 v[4];
#pragma unroll
        for (uint32_t r = 0; r < 4; ++r)
            if (r < slots && r * xq + q < len16)
                v[r] = pptm_ld_cg_f4(reinterpret_cast<const float*>(a + r * step + V * (uint64_t)q));
        pptm_f4 x[PW];
#pragma unroll
        for (uint32_t r = 0; r < 4; ++r) {
            if (r < slots && r * xq + q < len16) {
                if (r == 0 || xq != 0)
#pragma unroll
                    for (uint32_t g = 0; g < PW; ++g) x[g] = x4[PW * (r * xq + q) + g];
                p[r] += pptm_gemv_n_dot_piece<E>(v[r], x);
            }
        }
    }
}

// The same for any alignment: lanes stride element by element (still coalesced).
template <class E>
__device__ __forceinline__ float pptm_gemv_n_dot_scalar(const E* a, const float* xs, uint32_t len, uint32_t lane) {
    constexpr uint32_t U = 2 * PPTM_GEMV_N_UNROLL;
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint32_t j = lane;
#pragma unroll 1
    for (; j + 32 * (U - 1) < len; j += 32 * U) {
        float v[U];
#pragma unroll
        for (uint32_t u = 0; u < U; ++u) v[u] = pptm_storage<E>::load(a + j + 32 * u);
#pragma unroll
        for (uint32_t u = 0; u < U; ++u) p[u & 3] = fmaf(v[u], xs[j + 32 * u], p[u & 3]);
    }
    if (j < len) {
        // Fewer than U loads a lane left: all issued at once.
        float v[U];
#pragma unroll
        for (uint32_t u = 0; u < U; ++u) v[u] = j + 32 * u < len ? pptm_storage<E>::load(a + j + 32 * u) : 0.0f;
#pragma unroll
        for (uint32_t u = 0; u < U; ++u)
            if (j + 32 * u < len) p[u & 3] = fmaf(v[u], xs[j + 32 * u], p[u & 3]);
    }
    return (p[0] + p[1]) + (p[2] + p[3]);
}

// The stream walk: an f32 A of many long rows (aligned, m >= PPTM_GEMV_N_SHORT_BELOW, n >=
// PPTM_GEMV_N_STREAM_FROM) times a vector that is a buffer read as it is (no prologue stages;
// 16-byte aligned). A warp walks its four rows together from end to end: at each 16-byte piece a
// lane reads the piece of x once (from L2) and the piece of every row, PPTM_GEMV_N_STREAM_UNROLL
// pieces a row in flight, partials kept per row and piece; each row is summed across the warp
// once. No shared memory and no barrier, so the loads never drain at a chunk's end as the staged
// walk's do. A computed prologue keeps the staged walk: evaluated an element at a time in every
// warp, its scalar loads read x's sectors four times over and doubled the L2 traffic (16384²:
// 450 us in the manifold against 338 staged, H200). bench/probes/gemv_stream_probe.cu, H200, 16384^2, stand-alone: 4.19
// TB/s on two blocks an SM against 3.81 for the staged walk, 4.24 on one block an SM (128
// registers, two pieces) against 3.93; a plain read of A 4.40. With fewer or shorter rows the
// staged walk is as fast or faster (4096^2: 27 against 29 us; 1024 x 8192: 19 against 38), so
// those keep it.
#ifndef PPTM_GEMV_N_STREAM_FROM
#define PPTM_GEMV_N_STREAM_FROM 4096
#endif
#ifndef PPTM_GEMV_N_STREAM_UNROLL
#define PPTM_GEMV_N_STREAM_UNROLL (PPTM_MIN_BLOCKS_PER_SM == 1 ? 2 : 1)
#endif

// Whether a prologue functor is a plain read of an f32 buffer (codegen gives it `plain()`, the
// buffer) rather than stages computed per element.
template <class P, class = void>
struct pptm_plain_pro {
    static constexpr bool value = false;
};
template <class P>
struct pptm_plain_pro<P, decltype((void)static_cast<const float*>(((const P*)nullptr)->plain()))> {
    static constexpr bool value = true;
};

template <class R, class Epi>
__device__ __forceinline__ double pptm_gemv_n_stream(const float* A, uint64_t m, uint64_t n, const float* xv, const Epi& epi,
                                                     float* out, const pptm_block_ctx& b) {
    constexpr uint32_t RPW = PPTM_GEMV_N_ROWS_PER_WARP, U = PPTM_GEMV_N_STREAM_UNROLL;
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const uint64_t group_rows = (uint64_t)PPTM_WARPS * RPW;
    const uint64_t groups = m / group_rows + (m % group_rows != 0);
    const uint64_t pieces = n / 4;
    double red = R::identity();
    for (uint64_t g = b.block; g < groups; g += b.nblocks) {
        pptm_tick(b);
        const uint64_t row0 = g * group_rows + warp * RPW;
        const uint32_t rows = row0 < m ? (uint32_t)min((uint64_t)RPW, m - row0) : 0u;  // warp-uniform
        float acc = 0.0f;  // row row0 + lane's dot product, in lane r < rows
        if (rows != 0) {
            // A warp's rows past m read its last row again (their sums are dropped).
            const float* a[RPW];
#pragma unroll
            for (uint32_t r = 0; r < RPW; ++r) a[r] = A + (row0 + min(r, rows - 1)) * n;
            float s[RPW][U];
#pragma unroll
            for (uint32_t r = 0; r < RPW; ++r)
#pragma unroll
                for (uint32_t u = 0; u < U; ++u) s[r][u] = 0.0f;
#pragma unroll 1
            for (uint64_t q = lane; q < pieces; q += 32 * U) {
                pptm_f4 x[U], v[RPW][U];
#pragma unroll
                for (uint32_t u = 0; u < U; ++u) {
                    const uint64_t p = q + 32 * u;
                    const bool in = p < pieces;
#pragma unroll
                    for (uint32_t r = 0; r < RPW; ++r) v[r][u] = in ? pptm_ld_cg_f4(a[r] + 4 * p) : pptm_f4{0.0f, 0.0f, 0.0f, 0.0f};
                    x[u] = in ? pptm_ld_cg_f4(xv + 4 * p) : pptm_f4{0.0f, 0.0f, 0.0f, 0.0f};
                }
#pragma unroll
                for (uint32_t u = 0; u < U; ++u)
#pragma unroll
                    for (uint32_t r = 0; r < RPW; ++r) s[r][u] += pptm_dot4(v[r][u], x[u]);
            }
#pragma unroll
            for (uint32_t r = 0; r < RPW; ++r) {
                float t = s[r][0];
#pragma unroll
                for (uint32_t u = 1; u < U; ++u) t += s[r][u];
                t = pptm_warp_sum(t);
                if (lane == r) acc = t;
            }
        }
        const uint64_t i = row0 + lane;
        if (lane < rows) {
            const float y = epi(i, acc);
            if (out != nullptr) out[i] = y;
            red = R::combine(red, (double)y);
        }
    }
    PPTM_CLK(5);
    return pptm_block_partial<R>(red, b.red_smem);
}

// A is f32, or stored in bf16, fp16 or E4M3 (a narrow-storage GEMV on CUDA cores: each element
// widened to f32 as it is loaded, the vector and the sums f32).
template <class R, class E, class Pro, class Epi>
__device__ __forceinline__ double pptm_gemv_n(const E* A, uint64_t m, uint64_t n, const Pro& pro, const Epi& epi,
                                              float* out, const pptm_block_ctx& b) {
    constexpr uint32_t CH = PPTM_GEMV_N_CHUNK, V = 4 * pptm_storage<E>::PER_WORD;
    constexpr bool rowwise = pptm_storage<E>::PER_WORD == 1;  // f32: the row walk
    static_assert(2 * CH <= PPTM_LINEAR_SMEM_FLOATS, "gemv_n: two chunks of x fit the scratch");
    static_assert(CH % V == 0, "gemv_n: chunks start on a 16-byte boundary of every aligned row");
    static_assert(PPTM_GEMV_N_ROWS_PER_WARP == 4, "gemv_n: the narrow path's slots are a warp's rows");
    float* const xs = pptm_linear_smem();
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    // Row i starts at A + i * n: every row start is aligned iff A is and n is a multiple of the V
    // elements of 16 bytes; chunk starts are multiples of CH, so every chunk of a row is aligned too.
    const bool vec = pptm_aligned16(A) && n % V == 0;
    const bool few = m < PPTM_GEMV_N_SHORT_BELOW;
    if constexpr (rowwise && pptm_plain_pro<Pro>::value) {
        if (vec && !few && n >= PPTM_GEMV_N_STREAM_FROM && pptm_aligned16(pro.plain()))
            return pptm_gemv_n_stream<R>(A, m, n, pro.plain(), epi, out, b);
    }
    const uint32_t rpw = few ? 1u : PPTM_GEMV_N_ROWS_PER_WARP;
    const uint64_t group_rows = (uint64_t)PPTM_WARPS * rpw;
    const uint64_t groups = m / group_rows + (m % group_rows != 0);
    double red = R::identity();
    for (uint64_t g = b.block; g < groups; g += b.nblocks) {
        pptm_tick(b);
        const uint64_t row0 = g * group_rows + warp * rpw;
        // Row row0 + r's running sum lives in lane r: one register however many rows a warp owns.
        float acc = 0.0f;
        // The narrow path's lane partials of the warp's slots, over every chunk.
        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const uint32_t rows = row0 < m ? (uint32_t)min((uint64_t)rpw, m - row0) : 0u;  // warp-uniform
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
            if constexpr (rowwise) {
#pragma unroll 1
                for (uint32_t r = 0; r < rpw; ++r) {
                    const uint64_t i = row0 + r;
                    if (i >= m) break;  // warp-uniform
                    const E* a = A + i * n + c0;
                    const float d = vec ? pptm_gemv_n_dot_vec(a, xc, len / V, lane) : pptm_gemv_n_dot_scalar(a, xc, len, lane);
                    const float s = pptm_warp_sum(d);
                    if (lane == r) acc += s;
                }
            } else {
                const E* a = A + row0 * n + c0;  // read only for rows > 0
                const uint32_t len16 = len / V;
                if (vec && few) {
                    const uint32_t quarter = (len16 + 3) / 4;
                    pptm_gemv_n_dot_slots(a, (uint64_t)V * quarter, quarter, quarter, rows == 0 ? 0u : 4u, len16, xc, lane, p);
                } else if (vec) {
                    pptm_gemv_n_dot_slots(a, n, 0u, len16, rows, len16, xc, lane, p);
                } else {
#pragma unroll 1
                    for (uint32_t r = 0; r < rows; ++r) {
                        const float d = pptm_gemv_n_dot_scalar(a + r * n, xc, len, lane);
#pragma unroll
                        for (uint32_t k = 0; k < 4; ++k) p[k] += k == r ? d : 0.0f;  // p[r], p kept in registers
                    }
                }
            }
            buf ^= 1u;
        }
        if constexpr (!rowwise) {
            // One row a warp: its quarters' partials (the scalar path left p[1..3] at 0).
            if (few) p[0] = (p[0] + p[1]) + (p[2] + p[3]);
#pragma unroll
            for (uint32_t r = 0; r < 4; ++r) {
                if (r >= rows) break;  // warp-uniform
                const float s = pptm_warp_sum(p[r]);
                if (lane == r) acc = s;
            }
        }
        const uint64_t i = row0 + lane;
        if (lane < rpw && i < m) {
            const float y = epi(i, acc);
            if (out != nullptr) out[i] = y;
            red = R::combine(red, (double)y);
        }
    }
    PPTM_CLK(5);
    return pptm_block_partial<R>(red, b.red_smem);
}

// ---- gemv_t: y = epi(A^T pro) -------------------------------------------------------------------
//
// A block takes a tile of consecutive columns, TC of them: 32 when n >= PPTM_GEMV_T_NARROW_BELOW,
// else PPTM_GEMV_T_NARROW_COLS (8); the host sizes its request by the same rule, whatever A's
// element type. For an f32 A, lane l owns column l % TC of the tile and row l / TC of each group
// of 32 / TC rows, so a warp load reads 32 / TC row segments of TC floats (128 or 32 bytes, whole
// sectors either way), and the 16 warps split the row groups. A narrow A (bf16, fp16: two columns
// a word; E4M3: four) is read a 32-bit word a lane, so a warp load covers two or four times the
// rows in the same bytes and instructions (a 32-column bf16 tile: two rows of 64 bytes). Narrow tiles give many blocks: a 256-column product spreads over 32 SMs, not 8, and
// a 256-row one is read in a single round of loads. The block stages pro for PPTM_GEMV_T_CHUNK rows
// in shared memory, one coalesced evaluation per row (evaluated in every lane, as a broadcast, it
// cost more load instructions than A itself); each warp keeps PPTM_GEMV_T_UNROLL (8) loads of A in
// flight (narrow tiles issue the first round before pro is staged, so the two latencies overlap). 16 loads in
// flight were slower at every size (4096 x 4096: 64 against 36 µs on an H200): their 64-bit
// addresses pushed the manifold past its 64 registers. The per-warp column sums meet in shared
// memory, summed in a fixed order, so y is deterministic for a given grid.

#ifndef PPTM_GEMV_T_NARROW_BELOW
#error "PPTM_GEMV_T_NARROW_BELOW must be defined by the generated translation unit"
#endif
#ifndef PPTM_GEMV_T_NARROW_COLS
#error "PPTM_GEMV_T_NARROW_COLS must be defined by the generated translation unit"
#endif
#define PPTM_GEMV_T_CHUNK 2048
#ifndef PPTM_GEMV_T_UNROLL
#define PPTM_GEMV_T_UNROLL 8
#endif

static_assert((PPTM_GEMV_T_UNROLL & (PPTM_GEMV_T_UNROLL - 1)) == 0, "gemv_t: unroll is a power of two");
static_assert(PPTM_GEMV_T_CHUNK % PPTM_BLOCK_THREADS == 0, "gemv_t: a chunk is staged in whole rounds");
static_assert(PPTM_GEMV_T_NARROW_COLS > 0 && PPTM_GEMV_T_NARROW_COLS <= 32 && 32 % PPTM_GEMV_T_NARROW_COLS == 0,
              "gemv_t: a narrow tile divides a warp");

// A's element at p as a word: with PW = 1 the element itself, widened to f32 (its bits); with PW > 1
// the PW elements of the 32-bit word at p, as stored.
template <class E, uint32_t PW>
__device__ __forceinline__ uint32_t pptm_gemv_t_load(const E* p) {
    if constexpr (PW == 1)
        return __float_as_uint(pptm_storage<E>::load(p));
    else
        return pptm_ld_cg_u32(reinterpret_cast<const uint32_t*>(p));
}

// Element i of such a word, as f32 (0 bits are 0.0 in every storage type).
template <class E, uint32_t PW>
__device__ __forceinline__ float pptm_gemv_t_elem(uint32_t w, uint32_t i) {
    if constexpr (PW == 1) {
        return __uint_as_float(w);
    } else {
        float f[PW];
        pptm_storage<E>::widen(w, f);
        return f[i];
    }
}

// One tile width's loop: TC columns a tile; each lane loads PW of them a row (one 32-bit word of a
// narrow A, or one element), so TC / PW lanes cover a row's segment and a warp load reads
// 32 PW / TC rows.
template <uint32_t TC, uint32_t PW, class R, class E, class Pro, class Epi>
__device__ __forceinline__ double pptm_gemv_t_tiled(const E* A, uint64_t m, uint64_t n, const Pro& pro, const Epi& epi,
                                                    float* out, const pptm_block_ctx& b) {
    constexpr uint32_t U = PPTM_GEMV_T_UNROLL, CH = PPTM_GEMV_T_CHUNK, TW = TC / PW, RPL = 32 / TW;
    // Narrow tiles serve small products, where a round trip saved shows: the first loads of A go
    // out before pro is staged. 32-column tiles keep the loads inside the loop: a build that held
    // them across the staging at every width ran 4096 x 4096 in 46 µs against 36 on an H200.
    constexpr bool EARLY = TC < 32;
    static_assert(TC <= 32 && 32 % TC == 0 && TC % PW == 0, "gemv_t: a tile's lanes divide a warp");
    static_assert(CH + PPTM_WARPS * 32 <= PPTM_LINEAR_SMEM_FLOATS, "gemv_t: staged pro and the column sums fit the scratch");
    float* const xs = pptm_linear_smem();
    float(*const part)[32] = reinterpret_cast<float(*)[32]>(pptm_linear_smem() + CH);
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const uint32_t sub = lane / TW;  // this lane's row within a warp load
    const uint64_t tiles = n / TC + (n % TC != 0);
    double red = R::identity();
    PPTM_CLK(1);
    for (uint64_t t = b.block; t < tiles; t += b.nblocks) {
        pptm_tick(b);
        // The first of the PW columns this lane loads, and the column it finishes (warp 0,
        // lane < TC): the same one when a lane loads one column.
        const uint64_t lcol = t * TC + (lane % TW) * PW, col = PW == 1 ? lcol : t * TC + lane;
        // PW > 1 only when n is a multiple of PW: a word's columns are all in range or all out.
        const bool in = lcol < n, out_in = PW == 1 ? in : col < n;
        // Narrow tiles issue the epilogue's loads for their column now, so their round trip
        // overlaps the dot products instead of following them (Epi::load / Epi::apply).
        float ex[Epi::loads];
        if (EARLY && warp == 0 && lane < TC && out_in) epi.load(col, ex);
        float s[PW];
#pragma unroll
        for (uint32_t i = 0; i < PW; ++i) s[i] = 0.0f;
        for (uint64_t c0 = 0; c0 < m; c0 += CH) {
            const uint32_t len = (uint32_t)min((uint64_t)CH, m - c0);
            const E* const a = A + c0 * n + lcol;
            // Row groups warp, warp + 16, ... of the chunk, U of them per round; a missing row of
            // the last round is predicated off.
            uint32_t p[U];
            auto load = [&](uint32_t g0) {
#pragma unroll
                for (uint32_t u = 0; u < U; ++u) {
                    const uint32_t r = (g0 + PPTM_WARPS * u) * RPL + sub;
                    p[u] = in && r < len ? pptm_gemv_t_load<E, PW>(a + (uint64_t)r * n) : 0u;
                }
            };
            if (EARLY) load(warp);
            // Every reader of the scratch before this chunk (this call's or an earlier pattern's)
            // is done.
            __syncthreads();
            PPTM_CLK(2);
            float xr[CH / PPTM_BLOCK_THREADS];
#pragma unroll
            for (uint32_t f = 0; f < CH / PPTM_BLOCK_THREADS; ++f) {
                const uint32_t r = threadIdx.x + f * PPTM_BLOCK_THREADS;
                xr[f] = r < len ? pro(c0 + r) : 0.0f;
            }
#pragma unroll
            for (uint32_t f = 0; f < CH / PPTM_BLOCK_THREADS; ++f) xs[threadIdx.x + f * PPTM_BLOCK_THREADS] = xr[f];
            __syncthreads();
            PPTM_CLK(3);
#pragma unroll 1
            for (uint32_t g0 = warp; g0 * RPL < len; g0 += PPTM_WARPS * U) {  // warp-uniform
                if (!EARLY || g0 != warp) load(g0);
#pragma unroll
                for (uint32_t i = 0; i < PW; ++i) {
                    float q[U];
#pragma unroll
                    for (uint32_t u = 0; u < U; ++u) {
                        const uint32_t r = (g0 + PPTM_WARPS * u) * RPL + sub;
                        q[u] = pptm_gemv_t_elem<E, PW>(p[u], i) * (r < len ? xs[r] : 0.0f);
                    }
                    // Products summed pairwise before they reach the running sum: short runs.
#pragma unroll
                    for (uint32_t h = U / 2; h > 0; h /= 2)
#pragma unroll
                        for (uint32_t u = 0; u < h; ++u) q[u] += q[u + h];
                    s[i] += q[0];
                }
            }
        }
        // The lanes that share a column add their rows' sums.
#pragma unroll
        for (uint32_t i = 0; i < PW; ++i)
#pragma unroll
            for (uint32_t o = TW; o < 32u; o <<= 1) s[i] += __shfl_xor_sync(0xffffffffu, s[i], o);
        // Warp 0 has read the previous tile's sums (when m == 0 no chunk barrier said so).
        if (m == 0) __syncthreads();
        if (sub == 0)
#pragma unroll
            for (uint32_t i = 0; i < PW; ++i) part[warp][lane * PW + i] = s[i];
        __syncthreads();
        PPTM_CLK(4);
        if (warp == 0 && lane < TC && out_in) {
            // Lane c takes column c of the tile: the epilogue's loads and stores stay coalesced.
            float h0 = 0.0f, h1 = 0.0f;
#pragma unroll
            for (uint32_t w = 0; w < PPTM_WARPS; w += 2) {
                h0 += part[w][lane];
                h1 += part[w + 1][lane];
            }
            float y;
            if constexpr (EARLY)
                y = epi.apply(col, h0 + h1, ex);
            else
                y = epi(col, h0 + h1);
            if (out != nullptr) out[col] = y;
            red = R::combine(red, (double)y);
        }
    }
    PPTM_CLK(5);
    return pptm_block_partial<R>(red, b.red_smem);
}

// A is f32, or stored in bf16, fp16 or E4M3 (widened to f32 as it is loaded). A narrow A whose rows
// all start on a 4-byte boundary (n a multiple of a word's elements) is read a word a lane.
template <class R, class E, class Pro, class Epi>
__device__ __forceinline__ double pptm_gemv_t(const E* A, uint64_t m, uint64_t n, const Pro& pro, const Epi& epi,
                                              float* out, const pptm_block_ctx& b) {
    constexpr uint32_t PW = pptm_storage<E>::PER_WORD, NC = PPTM_GEMV_T_NARROW_COLS;
    static_assert(NC % PW == 0, "gemv_t: a narrow tile holds whole words");
    if constexpr (PW > 1) {
        if (pptm_aligned4(A) && n % PW == 0) {
            if (n < PPTM_GEMV_T_NARROW_BELOW) return pptm_gemv_t_tiled<NC, PW, R>(A, m, n, pro, epi, out, b);
            return pptm_gemv_t_tiled<32, PW, R>(A, m, n, pro, epi, out, b);
        }
    }
    if (n < PPTM_GEMV_T_NARROW_BELOW) return pptm_gemv_t_tiled<NC, 1, R>(A, m, n, pro, epi, out, b);
    return pptm_gemv_t_tiled<32, 1, R>(A, m, n, pro, epi, out, b);
}

// ---- matmul: out = epi(A W) ---------------------------------------------------------------------
//
// CUDA-core f32 tiling. A block computes a T x T tile of out; each thread a 2 x 4 micro-tile (rows
// 2 ty, 2 ty + 1; columns 4 tx .. 4 tx + 3), which reads 6 shared-memory vectors per 32 FMAs. K
// advances in slices of TK = 1024 / T: half the block stages the T x TK slice of A, the other half
// the TK x T slice of W, one 16-byte load (or four 4-byte loads) per thread, zero outside the
// matrices, so any m, k, n works. The next slice's loads are issued before the current one is
// multiplied and land in registers; they go to shared memory after the barrier that ends the
// multiply.
//
// Two tile sizes. 64 x 64 (the 512 threads each one micro-tile) reuses each loaded value most and
// is the choice whenever there are enough tiles to fill the GPU. A mid-sized product has few of
// them (256 x 512 has 32): each block would walk all of k alone while most SMs idle, so below
// PPTM_MATMUL_SMALL_BELOW tiles of 64 the pattern uses 32 x 32 tiles, four times the blocks. (The
// smallest outputs take neither: see pptm_matmul_direct below.) A
// 32 x 32 tile is 128 micro-tiles, so the block splits each slice's k four ways between groups of
// 128 threads and adds the four partial tiles in shared memory at the end (micro-tiles of 1 x 2,
// one per thread, were bound by shared-memory bandwidth). The choice depends only on m and n, and
// the host's block request (ChainIr::stage_blocks) makes the same one.

#ifndef PPTM_MATMUL_SMALL_BELOW
#error "PPTM_MATMUL_SMALL_BELOW must be defined by the generated translation unit"
#endif

static_assert(PPTM_BLOCK_THREADS == 512, "matmul: 512 threads cover a tile; half stage A, half W");

// Whether an m x n product uses the small (32 x 32) tiles.
__device__ __forceinline__ bool pptm_matmul_small(uint64_t m, uint64_t n) {
    return (m / 64 + (m % 64 != 0)) * (n / 64 + (n % 64 != 0)) < (uint64_t)PPTM_MATMUL_SMALL_BELOW;
}

template <uint32_t T, class Epi>
__device__ __forceinline__ void pptm_matmul_tiled(const float* A, const float* W, uint64_t m, uint64_t k, uint64_t n,
                                                  const Epi& epi, float* out, const pptm_block_ctx& b) {
    constexpr uint32_t HALF = PPTM_BLOCK_THREADS / 2;
    // A slice and a W slice are 4 floats per staging thread each.
    constexpr uint32_t TK = 4 * HALF / T;
    // A's slice is stored row-major with rows padded by 4 floats: 16-byte aligned rows, and rows a
    // warp reads at once fall on different banks.
    constexpr uint32_t AS = TK + 4;
    constexpr uint32_t MR = 2, MC = 4, TX = T / MC;
    // Groups of threads that split each slice's k, and the threads of a group.
    constexpr uint32_t KG = MR * MC * PPTM_BLOCK_THREADS / (T * T), GT = PPTM_BLOCK_THREADS / KG;
    static_assert(T == 64 || T == 32, "matmul: 64 or 32 tiles");
    static_assert(TX * (T / MR) == GT && TK % (4 * KG) == 0, "matmul: each group's micro-tiles cover the tile");
    static_assert(GT % 32 == 0, "matmul: a k-group is whole warps");
    static_assert(TK % 4 == 0 && T % 4 == 0, "matmul: slices are staged in float4s");
    static_assert(T * AS + TK * T <= PPTM_LINEAR_SMEM_FLOATS, "matmul: both slices fit the scratch");
    static_assert(KG * T * T <= PPTM_LINEAR_SMEM_FLOATS, "matmul: the groups' partial tiles fit the scratch");
    float(*const as)[AS] = reinterpret_cast<float(*)[AS]>(pptm_linear_smem());
    float(*const ws)[T] = reinterpret_cast<float(*)[T]>(pptm_linear_smem() + T * AS);
    const uint32_t group = threadIdx.x / GT, tx = threadIdx.x % GT % TX, ty = threadIdx.x % GT / TX;
    // Warps 0-7 stage A, warps 8-15 stage W: the split is warp-uniform.
    const bool stages_a = threadIdx.x < HALF;
    const uint32_t st = threadIdx.x % HALF;
    const bool vec_a = pptm_aligned16(A) && k % 4 == 0;
    const bool vec_w = pptm_aligned16(W) && n % 4 == 0;
    const bool vec_out = out != nullptr && pptm_aligned16(out) && n % 4 == 0;
    const uint64_t tiles_n = n / T + (n % T != 0);
    const uint64_t tiles = (m / T + (m % T != 0)) * tiles_n;
    const uint64_t ktiles = k / TK + (k % TK != 0);
    for (uint64_t tile = b.block; tile < tiles; tile += b.nblocks) {
        pptm_tick(b);
        const uint64_t i0 = tile / tiles_n * T, j0 = tile % tiles_n * T;
        float acc[MR][MC];
#pragma unroll
        for (uint32_t r = 0; r < MR; ++r)
#pragma unroll
            for (uint32_t c = 0; c < MC; ++c) acc[r][c] = 0.0f;
        // This thread's part of the slice at k0, in the order it is stored below.
        float sv[4];
        auto load = [&](uint64_t k0) {
            if (stages_a) {
                if (vec_a) {
                    // Row st / (TK / 4), columns k0 + 4 (st % (TK / 4)) .. + 3: all in range or
                    // none (k % 4 == 0).
                    const uint64_t i = i0 + st / (TK / 4), p = k0 + 4 * (st % (TK / 4));
                    pptm_f4 v = {0.0f, 0.0f, 0.0f, 0.0f};
                    if (i < m && p < k) v = pptm_ld_cg_f4(A + i * k + p);
                    sv[0] = v.x;
                    sv[1] = v.y;
                    sv[2] = v.z;
                    sv[3] = v.w;
                } else {
#pragma unroll
                    for (uint32_t e = 0; e < 4; ++e) {
                        const uint32_t idx = st + e * HALF;
                        const uint64_t i = i0 + idx / TK, p = k0 + idx % TK;
                        sv[e] = i < m && p < k ? pptm_ld_cg_f32(A + i * k + p) : 0.0f;
                    }
                }
            } else {
                if (vec_w) {
                    // Row k0 + st / (T / 4), columns j0 + 4 (st % (T / 4)) .. + 3: all in range or
                    // none.
                    const uint64_t p = k0 + st / (T / 4), j = j0 + 4 * (st % (T / 4));
                    pptm_f4 v = {0.0f, 0.0f, 0.0f, 0.0f};
                    if (p < k && j < n) v = pptm_ld_cg_f4(W + p * n + j);
                    sv[0] = v.x;
                    sv[1] = v.y;
                    sv[2] = v.z;
                    sv[3] = v.w;
                } else {
#pragma unroll
                    for (uint32_t e = 0; e < 4; ++e) {
                        const uint32_t idx = st + e * HALF;
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
                    const pptm_f4 v = {sv[0], sv[1], sv[2], sv[3]};
                    *reinterpret_cast<pptm_f4*>(&as[st / (TK / 4)][4 * (st % (TK / 4))]) = v;
                } else {
#pragma unroll
                    for (uint32_t e = 0; e < 4; ++e) {
                        const uint32_t idx = st + e * HALF;
                        as[idx / TK][idx % TK] = sv[e];
                    }
                }
            } else {
                if (vec_w) {
                    const pptm_f4 v = {sv[0], sv[1], sv[2], sv[3]};
                    *reinterpret_cast<pptm_f4*>(&ws[st / (T / 4)][4 * (st % (T / 4))]) = v;
                } else {
#pragma unroll
                    for (uint32_t e = 0; e < 4; ++e) {
                        const uint32_t idx = st + e * HALF;
                        ws[idx / T][idx % T] = sv[e];
                    }
                }
            }
            __syncthreads();
            if (kt + 1 < ktiles) load((kt + 1) * TK);
#pragma unroll
            for (uint32_t q = 0; q < TK / KG; q += 4) {
                const uint32_t p = group * (TK / KG) + q;  // this group's share of the slice
                float av[MR][4];
#pragma unroll
                for (uint32_t r = 0; r < MR; ++r) {
                    const pptm_f4 a = *reinterpret_cast<const pptm_f4*>(&as[MR * ty + r][p]);
                    av[r][0] = a.x;
                    av[r][1] = a.y;
                    av[r][2] = a.z;
                    av[r][3] = a.w;
                }
#pragma unroll
                for (uint32_t e = 0; e < 4; ++e) {
                    const pptm_f4 v = *reinterpret_cast<const pptm_f4*>(&ws[p + e][4 * tx]);
                    const float w[MC] = {v.x, v.y, v.z, v.w};
#pragma unroll
                    for (uint32_t r = 0; r < MR; ++r)
#pragma unroll
                        for (uint32_t c = 0; c < MC; ++c) acc[r][c] = fmaf(av[r][e], w[c], acc[r][c]);
                }
            }
        }
        if constexpr (KG > 1) {
            // The groups' partial tiles meet in the scratch (every slice has been read: the
            // barrier); group 0 adds them, in group order, and runs the epilogue.
            float(*const red)[T][T] = reinterpret_cast<float(*)[T][T]>(pptm_linear_smem());
            __syncthreads();
            if (group > 0)
#pragma unroll
                for (uint32_t r = 0; r < MR; ++r)
                    *reinterpret_cast<pptm_f4*>(&red[group][MR * ty + r][MC * tx]) = {acc[r][0], acc[r][1], acc[r][2], acc[r][3]};
            __syncthreads();
            if (group > 0) continue;
#pragma unroll
            for (uint32_t g = 1; g < KG; ++g)
#pragma unroll
                for (uint32_t r = 0; r < MR; ++r) {
                    const pptm_f4 v = *reinterpret_cast<const pptm_f4*>(&red[g][MR * ty + r][MC * tx]);
                    acc[r][0] += v.x;
                    acc[r][1] += v.y;
                    acc[r][2] += v.z;
                    acc[r][3] += v.w;
                }
        }
        if (out != nullptr) {
            const uint64_t j = j0 + MC * tx;
#pragma unroll
            for (uint32_t r = 0; r < MR; ++r) {
                const uint64_t i = i0 + MR * ty + r;
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
                    for (uint32_t c = 0; c < MC; ++c)
                        if (j + c < n) out[i * n + j + c] = epi(i, j + c, acc[r][c]);
                }
            }
        }
    }
}

// ---- matmul of a large output: 128 x 128 tiles ---------------------------------------------------
//
// The 64 x 64 tiles above read 16 bytes of operands from L2 per 64 multiply-adds of the block, and
// each thread's 2 x 4 micro-tile reads 6 shared-memory vectors per 32 FMAs: at 4096^3 that held
// the product to about a third of cuBLAS's SGEMM. A product of at least PPTM_MATMUL_LARGE_FROM
// tiles of 128 (enough to give every block of a GPU one) takes 128 x 128 tiles instead: half the
// L2 traffic per multiply-add, and a 4 x 8 micro-tile per thread (rows 4 ty .. 4 ty + 3; columns
// 4 tx .. 4 tx + 3 and 64 + 4 tx .. 64 + 4 tx + 3), which reads 3 shared-memory vectors per 32 FMAs:
// one of A (stored k-major, so four rows of one k are one vector) and two of W. A warp's 32
// threads are 2 ty by 16 tx: its A vector is two addresses (a broadcast), its W vectors 256
// contiguous bytes each.
//
// k advances in slices of 8, double-buffered in the 16 KiB scratch (A 8 x 128 and W 8 x 128 a
// buffer) by asynchronous copies (cp.async: no registers hold them): while a slice is multiplied
// the next one lands in the other buffer, and one barrier a slice orders both. Half the block
// copies A, transposing as it goes (four 4-byte copies a thread, a row's four values to four
// k-rows), the other half W (one 16-byte copy a thread). Slices of 4 in four buffers (further
// ahead, twice the barriers) ran 15 to 20 % slower on an H200 (bench/probes/sgemm_probe.cu).
//
// Only 16-byte-aligned operands with k and n multiples of 4 take it (their rows are whole
// vectors), and k < 2^32, n < 2^28, so that the walk along k counts in 32 bits (registers: the
// tile runs at the 64 a thread of two blocks an SM); the others keep the 64 x 64 tiles. Zero
// outside the matrices, so any m works.
static_assert(PPTM_BLOCK_THREADS == 512, "matmul large: 512 threads, 32 x 16 micro-tiles of 4 x 8");
static_assert(2 * (8 * 128 + 8 * 128) <= PPTM_LINEAR_SMEM_FLOATS, "matmul large: two slices of A and W fit the scratch");

#ifndef PPTM_MATMUL_LARGE_FROM
#error "PPTM_MATMUL_LARGE_FROM must be defined by the generated translation unit"
#endif

// Whether an m x n product with these operands takes the 128 x 128 tiles.
__device__ __forceinline__ bool pptm_matmul_large(const float* A, const float* W, uint64_t m, uint64_t k, uint64_t n) {
    return (m / 128 + (m % 128 != 0)) * (n / 128 + (n % 128 != 0)) >= (uint64_t)PPTM_MATMUL_LARGE_FROM && pptm_aligned16(A) &&
           pptm_aligned16(W) && k % 4 == 0 && n % 4 == 0 && k < (1ull << 32) && n < (1ull << 28);
}

// A thread's sums of one 128 x 128 tile: rows 4 ty .. 4 ty + 3, columns 4 tx .. + 3 and 64 + 4 tx
// .. + 3 (tx = threadIdx.x % 16, ty = threadIdx.x / 16).
struct pptm_matmul_large_acc {
    float v[4][8];
};

// The tile at (i0, j0) summed over k.
__device__ __forceinline__ pptm_matmul_large_acc pptm_matmul_large_sums(const float* A, const float* W, uint64_t m, uint64_t k,
                                                                             uint64_t n, uint64_t i0, uint64_t j0) {
    constexpr uint32_t T = 128, TK = 8, STAGES = 2, BUF = 2 * T * TK;
    static_assert(STAGES * BUF <= PPTM_LINEAR_SMEM_FLOATS, "matmul large: the stages fit the scratch");
    // Buffer s: the A slice at s BUF (k-major: TK rows of T), the W slice after it (TK rows of T).
    float* const smem = pptm_linear_smem();
    const uint32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    // Threads 0 .. 255 copy A, the others W.
    const bool stages_a = threadIdx.x < 256;
    const uint32_t st = threadIdx.x % 256;
    // What this thread stages of the slice at k0: A row i0 + st / 2, k k0 + koff .. + 3 (koff = 4
    // (st % 2)), to four k-rows of the buffer; or W k-row k0 + koff (koff = st / 32), columns
    // j0 + 4 (st % 32) .. + 3. `dst`: its first float in a buffer; `src`: its first
    // source float at k0 = 0, moving `step` a slice; `inside`: whether its row (A) or columns (W)
    // are in the matrix. k % 4 == 0 and n % 4 == 0: a vector is all in range or all out.
    const uint32_t koff = stages_a ? 4 * (st % 2) : st / 32;
    const uint32_t dst = stages_a ? koff * T + st / 2 : T * TK + koff * T + 4 * (st % 32);
    const uint32_t k32 = (uint32_t)k, ktiles = k32 / TK + (k32 % TK != 0);
    const float* src;
    bool inside;
    uint32_t step;
    if (stages_a) {
        const uint64_t i = i0 + st / 2;
        inside = i < m;
        src = A + (inside ? i * k : 0) + koff;
        step = TK;
    } else {
        const uint64_t j = j0 + 4 * (st % 32);
        inside = j < n;
        src = W + koff * n + (inside ? j : 0);
        step = TK * (uint32_t)n;
    }
    // Issues the copies of the slice at k0 into buffer s (zeros outside the matrices), one group.
    auto stage = [&](uint32_t k0, uint32_t s) {
        const bool in = inside && k0 + koff < k32;
        const float* from = in ? src : A;
        float* to = smem + s * BUF + dst;
        if (stages_a) {
#pragma unroll
            for (uint32_t e = 0; e < 4; ++e) pptm_cp_async_4(to + e * T, from + e, in ? 4u : 0u);
        } else {
            pptm_cp_async_16(to, from, in ? 16u : 0u);
        }
        pptm_cp_async_commit();
        src += step;
    };
    pptm_matmul_large_acc acc;
#pragma unroll
    for (uint32_t r = 0; r < 4; ++r)
#pragma unroll
        for (uint32_t c = 0; c < 8; ++c) acc.v[r][c] = 0.0f;
    // Every reader of the scratch before this tile (the previous tile's last slice, or an earlier
    // pattern) is done before the first copy lands.
    __syncthreads();
    // Slices 0 .. STAGES - 2 in flight (a group each, empty past the end, so that the count of
    // groups in flight says which slice has landed).
#pragma unroll
    for (uint32_t q = 0; q + 1 < STAGES; ++q) {
        if (q < ktiles) {
            stage(q * TK, q);
        } else {
            pptm_cp_async_commit();
        }
    }
    for (uint32_t kt = 0; kt < ktiles; ++kt) {
        // Slice kt has landed (this thread's copies; the barrier shows everyone's), and every
        // reader of slice kt - 1's buffer is done: slice kt + STAGES - 1 may go there.
        pptm_cp_async_wait_group<STAGES - 2>();
        __syncthreads();
        if (kt + STAGES - 1 < ktiles) {
            stage((kt + STAGES - 1) * TK, (kt + STAGES - 1) % STAGES);
        } else {
            pptm_cp_async_commit();
        }
        const float* const as = smem + kt % STAGES * BUF;
        const float* const ws = as + T * TK;
#pragma unroll
        for (uint32_t p = 0; p < TK; ++p) {
            const pptm_f4 a = pptm_lds_f4(as + p * T + 4 * ty);
            const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (uint32_t h = 0; h < 2; ++h) {
                const pptm_f4 w = pptm_lds_f4(ws + p * T + 64 * h + 4 * tx);
                const float wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                for (uint32_t r = 0; r < 4; ++r)
#pragma unroll
                    for (uint32_t c = 0; c < 4; ++c) acc.v[r][4 * h + c] = fmaf(av[r], wv[c], acc.v[r][4 * h + c]);
            }
        }
    }
    return acc;
}

// Not inlined: a manifold's dispatch keeps values live around an inlined pattern, and at 64
// registers a thread they pushed this loop to 10 to 40 local loads and stores a slice (6 to 20 as a
// function of its own; none in a kernel of its own, bench/probes/sgemm_probe.cu).
template <class Epi>
__device__ __noinline__ void pptm_matmul_tiled_large(const float* A, const float* W, uint64_t m, uint64_t k, uint64_t n,
                                                        const Epi& epi, float* out, const pptm_block_ctx& b) {
    constexpr uint64_t T = 128;
    const uint32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const bool vec_out = out != nullptr && pptm_aligned16(out);
    const uint64_t tiles_n = n / T + (n % T != 0);
    const uint64_t tiles = (m / T + (m % T != 0)) * tiles_n;
    for (uint64_t tile = b.block; tile < tiles; tile += b.nblocks) {
        pptm_tick(b);
        const uint64_t i0 = tile / tiles_n * T, j0 = tile % tiles_n * T;
        const pptm_matmul_large_acc acc = pptm_matmul_large_sums(A, W, m, k, n, i0, j0);
        if (out == nullptr) continue;
#pragma unroll
        for (uint32_t r = 0; r < 4; ++r) {
            const uint64_t i = i0 + 4 * ty + r;
            if (i >= m) continue;
#pragma unroll
            for (uint32_t h = 0; h < 2; ++h) {
                const uint64_t j = j0 + 64 * h + 4 * tx;
                if (j >= n) continue;  // n % 4 == 0: columns j .. j + 3 are all in range
                if (vec_out) {
                    pptm_f4 v;
                    v.x = epi(i, j, acc.v[r][4 * h + 0]);
                    v.y = epi(i, j + 1, acc.v[r][4 * h + 1]);
                    v.z = epi(i, j + 2, acc.v[r][4 * h + 2]);
                    v.w = epi(i, j + 3, acc.v[r][4 * h + 3]);
                    *reinterpret_cast<pptm_f4*>(out + i * n + j) = v;
                } else {
#pragma unroll
                    for (uint32_t c = 0; c < 4; ++c) out[i * n + j + c] = epi(i, j + c, acc.v[r][4 * h + c]);
                }
            }
        }
    }
}

// ---- matmul of a small output: k split across warps -----------------------------------------------
//
// A product whose output is a few thousand values (64 x 256) has too few tiles for the patterns
// above to fill the GPU, and their slices of k, walked one after another with two barriers each,
// set its time: 64 x 256 x 256 took 10 µs on the device of an H200 in 32 x 32 tiles on 16 SMs.
// Here a block computes an 8 x 16 tile: lane l of every warp owns row l / 4 and columns
// 4 (l % 4) .. + 3 of it, the 16 warps split k, and their partial tiles are added in shared
// memory before the epilogue. 64 x 256 is 128 tiles, one per SM, and a k of up to 256 is one
// round trip to L2 (pptm_matmul_direct_staged): the same product takes 6.3 µs, 4.8 of which are
// the fixed cost any 128-block item pays. An m x n output of at most PPTM_MATMUL_DIRECT_MAX_TILES
// such tiles takes this path; the choice depends only on m and n, and the host's block request
// (ChainIr::stage_blocks) makes the same one.

#if !defined(PPTM_MATMUL_DIRECT_MAX_TILES) || !defined(PPTM_MATMUL_DIRECT_ROWS) || !defined(PPTM_MATMUL_DIRECT_COLS)
#error "PPTM_MATMUL_DIRECT_* must be defined by the generated translation unit"
#endif
static_assert(PPTM_MATMUL_DIRECT_ROWS * PPTM_MATMUL_DIRECT_COLS == 4 * 32, "matmul direct: a warp's lanes own the tile, 4 values each");
static_assert(PPTM_MATMUL_DIRECT_COLS % 4 == 0, "matmul direct: a lane owns 4 adjacent columns");
// Steps of k whose loads a lane issues together before using any (8 ran no faster when every W took this path).
#define PPTM_MATMUL_DIRECT_BATCH 4
static_assert(PPTM_WARPS * PPTM_MATMUL_DIRECT_ROWS * PPTM_MATMUL_DIRECT_COLS <= PPTM_LINEAR_SMEM_FLOATS,
              "matmul direct: every warp's partial tile fits the scratch");

__device__ __forceinline__ uint64_t pptm_matmul_direct_tiles(uint64_t m, uint64_t n) {
    return (m / PPTM_MATMUL_DIRECT_ROWS + (m % PPTM_MATMUL_DIRECT_ROWS != 0)) *
           (n / PPTM_MATMUL_DIRECT_COLS + (n % PPTM_MATMUL_DIRECT_COLS != 0));
}

// One lane's four sums over `steps` entries of a row of A (from `ap`) times the matching rows of W
// (from `wp`, a row every n floats), at columns o[0..3] of those rows: the path for a W whose rows
// are not 16-byte aligned (n % 4 != 0). Each step's loads go out in batches before any is used.
__device__ __forceinline__ pptm_f4 pptm_matmul_direct_unaligned(const float* ap, const float* wp, uint64_t n,
                                                                uint32_t steps, const uint32_t (&o)[4]) {
    pptm_f4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
    auto load_w = [&o](const float* row) {
        return pptm_f4{pptm_ld_cg_f32(row + o[0]), pptm_ld_cg_f32(row + o[1]), pptm_ld_cg_f32(row + o[2]), pptm_ld_cg_f32(row + o[3])};
    };
    auto fma4 = [&acc](float a, const pptm_f4& w) {
        acc.x = fmaf(a, w.x, acc.x);
        acc.y = fmaf(a, w.y, acc.y);
        acc.z = fmaf(a, w.z, acc.z);
        acc.w = fmaf(a, w.w, acc.w);
    };
    uint32_t s = 0;
    for (; s + PPTM_MATMUL_DIRECT_BATCH <= steps; s += PPTM_MATMUL_DIRECT_BATCH) {
        float a[PPTM_MATMUL_DIRECT_BATCH];
        pptm_f4 w[PPTM_MATMUL_DIRECT_BATCH];
#pragma unroll
        for (uint32_t e = 0; e < PPTM_MATMUL_DIRECT_BATCH; ++e) a[e] = pptm_ld_cg_f32(ap + e);
#pragma unroll
        for (uint32_t e = 0; e < PPTM_MATMUL_DIRECT_BATCH; ++e) w[e] = load_w(wp + e * n);
#pragma unroll
        for (uint32_t e = 0; e < PPTM_MATMUL_DIRECT_BATCH; ++e) fma4(a[e], w[e]);
        ap += PPTM_MATMUL_DIRECT_BATCH;
        wp += PPTM_MATMUL_DIRECT_BATCH * n;
    }
    for (; s < steps; ++s, ++ap, wp += n) fma4(pptm_ld_cg_f32(ap), load_w(wp));
    return acc;
}

// The same four sums when W's rows are 16-byte aligned (n % 4 == 0): k is taken in passes of
// PPTM_LINEAR_SMEM_FLOATS / C rows, whose C columns of W are copied to shared memory with
// cp.async while each lane loads its sixteenth of row i of A (its warp's share of the pass) into
// registers. Every load of a pass is in flight at once, so a pass costs one round trip to L2
// rather than one per batch of steps. Returns after a barrier: the scratch is free again.
__device__ __forceinline__ pptm_f4 pptm_matmul_direct_staged(const float* A, const float* W, uint64_t m, uint64_t k,
                                                             uint64_t n, uint64_t i, uint64_t tile_col) {
    constexpr uint32_t C = PPTM_MATMUL_DIRECT_COLS, CQ = C / 4;
    constexpr uint32_t P = PPTM_LINEAR_SMEM_FLOATS / C, S = P / PPTM_WARPS;  // rows a pass, a warp's share
    static_assert(P % PPTM_WARPS == 0 && S % 4 == 0, "matmul direct: a warp's share of a pass is whole quads");
    float(*const ws)[C] = reinterpret_cast<float(*)[C]>(pptm_linear_smem());
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float* const a_row = A + min(i, m - 1) * k;
    const bool vec_a = pptm_aligned16(A) && k % 4 == 0;
    pptm_f4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
    // Every reader of the scratch (an earlier tile's sums, or an earlier pattern) is done.
    __syncthreads();
    for (uint64_t k0 = 0; k0 < k; k0 += P) {
        // Rows k0 .. k0 + P - 1 of W, columns tile_col .. + C - 1, in 16-byte pieces; rows past k
        // and columns past n are zero (n % 4 == 0: a piece is all in range or all out).
        for (uint32_t c = threadIdx.x; c < P * CQ; c += PPTM_BLOCK_THREADS) {
            const uint64_t p = k0 + c / CQ, col = tile_col + 4 * (c % CQ);
            const bool in = p < k && col < n;
            pptm_cp_async_16(&ws[c / CQ][4 * (c % CQ)], in ? W + p * n + col : W, in ? 16u : 0u);
        }
        // This warp's rows of the pass, k0 + S warp ..: entries of A past k are zero.
        const uint64_t p0 = k0 + S * warp;
        float a[S];
        if (vec_a) {
#pragma unroll
            for (uint32_t q = 0; q < S / 4; ++q) {
                // k % 4 == 0: a quad is all in range or all out.
                const pptm_f4 v = p0 + 4 * q < k ? pptm_ld_cg_f4(a_row + p0 + 4 * q) : pptm_f4{0.0f, 0.0f, 0.0f, 0.0f};
                a[4 * q] = v.x;
                a[4 * q + 1] = v.y;
                a[4 * q + 2] = v.z;
                a[4 * q + 3] = v.w;
            }
        } else {
#pragma unroll
            for (uint32_t e = 0; e < S; ++e) a[e] = p0 + e < k ? pptm_ld_cg_f32(a_row + p0 + e) : 0.0f;
        }
        pptm_cp_async_wait_all();
        __syncthreads();
#pragma unroll
        for (uint32_t e = 0; e < S; ++e) {
            const pptm_f4 w = *reinterpret_cast<const pptm_f4*>(&ws[S * warp + e][4 * (lane % CQ)]);
            acc.x = fmaf(a[e], w.x, acc.x);
            acc.y = fmaf(a[e], w.y, acc.y);
            acc.z = fmaf(a[e], w.z, acc.z);
            acc.w = fmaf(a[e], w.w, acc.w);
        }
        __syncthreads();
    }
    return acc;
}

template <class Epi>
__device__ __forceinline__ void pptm_matmul_direct(const float* A, const float* W, uint64_t m, uint64_t k, uint64_t n,
                                                    const Epi& epi, float* out, const pptm_block_ctx& b) {
    constexpr uint32_t R = PPTM_MATMUL_DIRECT_ROWS, C = PPTM_MATMUL_DIRECT_COLS, CQ = C / 4, TV = R * C;
    float(*const red)[TV] = reinterpret_cast<float(*)[TV]>(pptm_linear_smem());
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bool vec_w = pptm_aligned16(W) && n % 4 == 0;
    // This warp's chunk of k: a sixteenth.
    const uint64_t chunk = (k + PPTM_WARPS - 1) / PPTM_WARPS;
    const uint64_t p_begin = min(k, warp * chunk), p_end = min(k, p_begin + chunk);
    // m x n has at most PPTM_MATMUL_DIRECT_MAX_TILES tiles, so 32-bit tile arithmetic is exact.
    const uint32_t tiles_n = (uint32_t)(n / C + (n % C != 0));
    const uint32_t tiles = (uint32_t)pptm_matmul_direct_tiles(m, n);
    for (uint32_t tile = b.block; tile < tiles; tile += b.nblocks) {
        pptm_tick(b);
        const uint64_t i = (uint64_t)(tile / tiles_n) * R + lane / CQ;
        const uint64_t j = (uint64_t)(tile % tiles_n) * C + 4 * (lane % CQ);
        pptm_f4 acc;
        if (vec_w) {
            acc = pptm_matmul_direct_staged(A, W, m, k, n, i, tile % tiles_n * C);
        } else {
            // Loads are never predicated, so a batch of them is in flight at once: a row or
            // column outside the matrix reads row m - 1 or column n - 1 instead, and its sums,
            // which only ever meet their own tile position, are not stored.
            const uint32_t o[4] = {(uint32_t)min(j, n - 1), (uint32_t)min(j + 1, n - 1), (uint32_t)min(j + 2, n - 1),
                                   (uint32_t)min(j + 3, n - 1)};
            acc = pptm_matmul_direct_unaligned(A + min(i, m - 1) * k + p_begin, W + p_begin * n, n,
                                               (uint32_t)(p_end - p_begin), o);  // at most k / 16 + 1 steps
        }
        // Every reader of the scratch (an earlier tile's sums, or an earlier pattern) is done.
        __syncthreads();
        *reinterpret_cast<pptm_f4*>(&red[warp][4 * lane]) = acc;
        __syncthreads();
        // Threads 0 .. TV - 1 add one output's partials in warp order and run the epilogue.
        if (out != nullptr && threadIdx.x < TV) {
            const uint32_t t = threadIdx.x;
            float s = 0.0f;
#pragma unroll
            for (uint32_t w = 0; w < PPTM_WARPS; ++w) s += red[w][t];
            // Value t is lane t / 4's column 4 (lane % CQ) + t % 4 of row lane / CQ.
            const uint32_t l = t / 4;
            const uint64_t oi = (uint64_t)(tile / tiles_n) * R + l / CQ;
            const uint64_t oj = (uint64_t)(tile % tiles_n) * C + 4 * (l % CQ) + t % 4;
            if (oi < m && oj < n) out[oi * n + oj] = epi(oi, oj, s);
        }
    }
}

// `large`: whether the 128 x 128 tiles may be taken (not in a batch, whose tiles are numbered by
// pptm_matmul_tiles, which knows only m and n).
template <class Epi>
__device__ __forceinline__ void pptm_matmul(const float* A, const float* W, uint64_t m, uint64_t k, uint64_t n,
                                            const Epi& epi, float* out, const pptm_block_ctx& b, bool large = true) {
    pptm_took_path(PPTM_PATH_CUDA_CORES);
    if (pptm_matmul_direct_tiles(m, n) <= (uint64_t)PPTM_MATMUL_DIRECT_MAX_TILES)
        pptm_matmul_direct(A, W, m, k, n, epi, out, b);
    else if (large && pptm_matmul_large(A, W, m, k, n))
        pptm_matmul_tiled_large(A, W, m, k, n, epi, out, b);
    else if (pptm_matmul_small(m, n))
        pptm_matmul_tiled<32>(A, W, m, k, n, epi, out, b);
    else
        pptm_matmul_tiled<64>(A, W, m, k, n, epi, out, b);
}

// ---- batched products: many independent products of one shape -----------------------------------
//
// out[s] = epi(A[s] W[s]) for s < batch, with A[s] (m x k), W[s] (k x n) and out[s] (m x n)
// stored one after another; the epilogue sees row s m + i of the stacked output, so a bias per
// column and elementwise stages index it as they index one product's. The tiles of all products
// are numbered as one item's: tile t of product s is tile s T + t (T tiles a product) and goes
// to block (s T + t) mod nblocks, so a batch of products too small to fill the GPU one by one
// (64 x 64 is one tile) fills it together. A block runs a product's pattern only when it owns
// one of its tiles, with its block index shifted to the first of them: the patterns walk their
// tiles grid-stride from b.block, which is then exactly the tiles this block owns.

// The epilogue of product s, from the stacked output's: row i of the product is row row0 + i.
template <class Epi>
struct pptm_epi_rows_from {
    const Epi& epi;
    uint64_t row0;
    __device__ __forceinline__ auto operator()(uint64_t i, uint64_t j, float acc) const { return epi(row0 + i, j, acc); }
};

// run(s, c) for every product s < batch of which this block owns a tile (`tiles` tiles a
// product), c being b with c.block this block's first tile of product s. Block-uniform: a block
// skips a product as a whole, so the patterns' barriers stay matched.
template <class Run>
__device__ __forceinline__ void pptm_for_each_product(uint64_t batch, uint64_t tiles, const pptm_block_ctx& b, const Run& run) {
    if (tiles == 0) return;
    const uint32_t nb = b.nblocks;
    const uint32_t step = (uint32_t)(tiles % nb);
    uint32_t first = 0;  // the block that takes tile 0 of product s: s T mod nblocks
    for (uint64_t s = 0; s < batch; ++s) {
        const uint32_t mine = b.block >= first ? b.block - first : b.block + nb - first;
        if (mine < tiles) {
            pptm_block_ctx c = b;
            c.block = mine;
            run(s, c);
        }
        first += step;
        if (first >= nb) first -= nb;
    }
}

// Tiles pptm_matmul takes for an m x n product of a batch (its choice of pattern, above, without the
// 128 x 128 tiles).
__device__ __forceinline__ uint64_t pptm_matmul_tiles(uint64_t m, uint64_t n) {
    const uint64_t direct = pptm_matmul_direct_tiles(m, n);
    if (direct <= (uint64_t)PPTM_MATMUL_DIRECT_MAX_TILES) return direct;
    const uint64_t t = pptm_matmul_small(m, n) ? 32 : 64;
    return (m / t + (m % t != 0)) * (n / t + (n % t != 0));
}

// Batched f32 products on CUDA cores.
template <class Epi>
__device__ __forceinline__ void pptm_matmul_batched(uint64_t batch, const float* A, const float* W, uint64_t m, uint64_t k,
                                                    uint64_t n, const Epi& epi, float* out, const pptm_block_ctx& b) {
    pptm_took_path(PPTM_PATH_CUDA_CORES);  // a block that owns no tile reports it too
    pptm_for_each_product(batch, pptm_matmul_tiles(m, n), b, [&](uint64_t s, const pptm_block_ctx& c) {
        pptm_matmul(A + s * m * k, W + s * k * n, m, k, n, pptm_epi_rows_from<Epi>{epi, s * m},
                    out == nullptr ? nullptr : out + s * m * n, c, false);
    });
}

#endif  // PPTM_PATTERN_LINEAR_CUH
