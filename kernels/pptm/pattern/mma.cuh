// pptm tensor-core pattern: out[i, j] = epi(i, j, sum_p A[i, p] * W[p, j]) with A (m x k) and
// W (k x n) row-major in bf16 or fp16, products accumulated in f32 by mma.sync (m16n8k16), and the
// chain's epilogue (bias, activation) applied to each f32 accumulator in registers before the
// store. Codegen instantiates it for a Matmul stage with `tensor_eligible = true` and precision
// "bf16" or "fp16" (the stage's matrix operands are then bf16/fp16 buffers; the output is f32).
//
// A block computes a BM x BN tile of out; its 16 warps form a 4 x 4 grid, each owning a
// (BM / 4) x (BN / 4) part of the tile as MT x NT mma tiles of 16 x 8. k advances in slices of BK:
// the BM x BK slice of A and the BK x BN slice of W are staged in shared memory with cp.async
// (16-byte pieces, zero-filled outside the matrices), STAGES slices deep, so STAGES - 1 slices are
// on their way from L2 while one is multiplied: a slice is a few hundred cycles of tensor work, an
// L2 round trip under load about a thousand, and with two slices (one in flight) 8192^3 ran at
// 72 TFLOP/s on an H200, waiting on every slice. Fragments come from shared memory through ldmatrix (A as stored, W transposed on the
// way, .trans), rows padded by 16 bytes so the eight rows one ldmatrix reads fall on different
// banks. Matrices whose rows are not 16-byte aligned (k or n not a multiple of 8, or an unaligned
// base) are staged by plain loads instead, with the same zero fill: any m, k, n is correct.
//
// Two tile sizes, chosen from m and n alone (the host's block request, ChainIr::stage_blocks,
// makes the same choice): 128 x 64 (each warp 32 x 16: 2 x 2 mma tiles, 16 f32 accumulators a
// thread), three slices deep, when there are at least PPTM_MMA_LARGE_FROM such tiles, else 64 x 64
// (each warp 16 x 16), four slices deep, twice the blocks for outputs too small to fill the GPU;
// 32 k a slice. (Warp parts of 32 x 32 hold 32 accumulators, and under the manifold's 64-register
// budget ptxas spilled them inside the k loop.) Both fit the 48 KB of static shared memory a block
// may have; deeper pipelines and larger tiles need dynamic shared memory and more registers than
// a manifold compiled for two blocks an SM has.
//
// The operands may also be f32 (a guarded stage, pptm_matmul_guarded below): they are converted to
// T (round to nearest even) as they are staged, by plain loads rather than cp.async.
//
// Shared memory: the linear patterns' scratch (pptm_linear_smem), which codegen enlarges to
// PPTM_LINEAR_SMEM_ALLOC_FLOATS for a domain with a tensor-core stage. Every thread of the block
// calls the pattern; work is split over blocks grid-stride, so any b.nblocks >= 1 is correct.
#ifndef PPTM_PATTERN_MMA_CUH
#define PPTM_PATTERN_MMA_CUH

#include "pptm/pattern/linear.cuh"
#include "pptm/pattern/wgmma.cuh"

#ifndef PPTM_MMA_LARGE_FROM
#error "PPTM_MMA_LARGE_FROM must be defined by the generated translation unit"
#endif

// ---- the instructions -------------------------------------------------------------------------

// d += a b for one 16 x 8 x 16 product: a is a 16 x 16 row-major fragment (4 registers of two
// 16-bit values), b a 16 x 8 column fragment (2 registers), d 16 x 8 f32 (4 registers).
template <class T>
struct pptm_mma;

template <>
struct pptm_mma<pptm_bf16> {
    __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <>
struct pptm_mma<pptm_f16> {
    __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// Four 8 x 8 matrices of 16-bit values from shared memory: lanes 8 q .. 8 q + 7 give the row
// addresses of matrix q, and r[q] holds, in lane l, row l / 4, columns 2 (l % 4) and + 1 (with
// .trans: column l / 4, rows 2 (l % 4) and + 1).
__device__ __forceinline__ void pptm_ldmatrix_x4(uint32_t (&r)[4], const uint16_t* row) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

__device__ __forceinline__ void pptm_ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* row) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

// ---- 16-bit conversions ---------------------------------------------------------------------

// Two f32 values as a pair of T (lo in the low half), rounded to nearest even; beyond T's range
// they become infinities, as the tensor cores would see them.
template <class T>
__device__ __forceinline__ uint32_t pptm_pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pptm_pack2<pptm_f16>(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

template <>
__device__ __forceinline__ uint32_t pptm_pack2<pptm_bf16>(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// x rounded to T and back: the value the tensor cores multiply.
template <class T>
__device__ __forceinline__ float pptm_round_to(float x);

template <>
__device__ __forceinline__ float pptm_round_to<pptm_f16>(float x) {
    const uint32_t p = pptm_pack2<pptm_f16>(x, 0.0f);
    float r;
    asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo; }" : "=f"(r) : "r"(p));
    return r;
}

template <>
__device__ __forceinline__ float pptm_round_to<pptm_bf16>(float x) {
    return __uint_as_float(pptm_pack2<pptm_bf16>(x, 0.0f) << 16);
}

// The operand pointer the stager reads: 16-bit storage as raw bits, f32 as it is.
__device__ __forceinline__ const uint16_t* pptm_mma_src(const pptm_bf16* p) { return reinterpret_cast<const uint16_t*>(p); }
__device__ __forceinline__ const uint16_t* pptm_mma_src(const pptm_f16* p) { return reinterpret_cast<const uint16_t*>(p); }
__device__ __forceinline__ const float* pptm_mma_src(const float* p) { return p; }
__device__ __forceinline__ const uint8_t* pptm_mma_src(const pptm_e4m3* p) { return reinterpret_cast<const uint8_t*>(p); }

// Two E4M3 values (the low two bytes of v, the first in the lower byte) as a pair of T (fp16 or
// bf16, the first in the low half), exactly (pptm_e4m3x2_to_f32 in device.cuh).
template <class T>
__device__ __forceinline__ uint32_t pptm_e4m3x2_widen(uint32_t v) {
    float lo, hi;
    pptm_e4m3x2_to_f32(v, lo, hi);
    return pptm_pack2<T>(lo, hi);
}
template <>
__device__ __forceinline__ uint32_t pptm_e4m3x2_widen<pptm_f16>(uint32_t v) {
#if __CUDA_ARCH__ >= 890
    uint32_t h;
    asm("{ .reg .b16 p; cvt.u16.u32 p, %1; cvt.rn.f16x2.e4m3x2 %0, p; }" : "=r"(h) : "r"(v));
    return h;
#else
    return pptm_pack2<pptm_f16>(pptm_e4m3_to_f32(v & 0xffu), pptm_e4m3_to_f32((v >> 8) & 0xffu));
#endif
}

// ---- the pattern ------------------------------------------------------------------------------

// Whether an m x n product takes the 128 x 64 tiles.
__device__ __forceinline__ bool pptm_mma_large(uint64_t m, uint64_t n) {
    return (m / 128 + (m % 128 != 0)) * (n / 64 + (n % 64 != 0)) >= (uint64_t)PPTM_MMA_LARGE_FROM;
}

// Stages rows x cols 16-bit values of a row-major matrix (ld elements a row, `rows_in` x
// `cols_in` of them inside the matrix) from `src` (its element (r0, c0)) into `dst`, whose rows
// are `ds` elements apart; zero outside. `vec`: 16-byte pieces by cp.async (rows 16-byte aligned,
// so a piece is all inside or all outside); otherwise plain loads, stored at once.
template <class T, uint32_t ROWS, uint32_t COLS>
__device__ __forceinline__ void pptm_mma_stage(uint16_t* dst, uint32_t ds, const uint16_t* base, uint64_t ld, uint64_t r0,
                                               uint64_t c0, uint64_t rows, uint64_t cols, bool vec) {
    constexpr uint32_t PIECES = ROWS * COLS / 8;
    for (uint32_t c = threadIdx.x; c < PIECES; c += PPTM_BLOCK_THREADS) {
        const uint32_t r = c / (COLS / 8), q = 8 * (c % (COLS / 8));
        const uint64_t gr = r0 + r, gc = c0 + q;
        uint16_t* const d = dst + r * ds + q;
        if (vec) {
            const bool in = gr < rows && gc < cols;
            pptm_cp_async_16(d, in ? base + gr * ld + gc : base, in ? 16u : 0u);
        } else {
            uint32_t w[4];
#pragma unroll
            for (uint32_t e = 0; e < 4; ++e) {
                const uint32_t lo = gr < rows && gc + 2 * e < cols ? pptm_ld_cg_u16(base + gr * ld + gc + 2 * e) : 0u;
                const uint32_t hi = gr < rows && gc + 2 * e + 1 < cols ? pptm_ld_cg_u16(base + gr * ld + gc + 2 * e + 1) : 0u;
                w[e] = lo | (hi << 16);
            }
            *reinterpret_cast<uint4*>(d) = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

// The same from an f32 matrix, converted to T on the way (`vec`: rows 16-byte aligned and a
// multiple of 8 long, so a piece of 8 is two 16-byte loads, all inside or all outside).
template <class T, uint32_t ROWS, uint32_t COLS>
__device__ __forceinline__ void pptm_mma_stage(uint16_t* dst, uint32_t ds, const float* base, uint64_t ld, uint64_t r0,
                                               uint64_t c0, uint64_t rows, uint64_t cols, bool vec) {
    constexpr uint32_t PIECES = ROWS * COLS / 8;
    for (uint32_t c = threadIdx.x; c < PIECES; c += PPTM_BLOCK_THREADS) {
        const uint32_t r = c / (COLS / 8), q = 8 * (c % (COLS / 8));
        const uint64_t gr = r0 + r, gc = c0 + q;
        float v[8];
        if (vec) {
            pptm_f4 lo = {0.0f, 0.0f, 0.0f, 0.0f}, hi = lo;
            if (gr < rows && gc < cols) {
                lo = pptm_ld_cg_f4(base + gr * ld + gc);
                hi = pptm_ld_cg_f4(base + gr * ld + gc + 4);
            }
            v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
        } else {
#pragma unroll
            for (uint32_t e = 0; e < 8; ++e) v[e] = gr < rows && gc + e < cols ? pptm_ld_cg_f32(base + gr * ld + gc + e) : 0.0f;
        }
        *reinterpret_cast<uint4*>(dst + r * ds + q) =
            make_uint4(pptm_pack2<T>(v[0], v[1]), pptm_pack2<T>(v[2], v[3]), pptm_pack2<T>(v[4], v[5]), pptm_pack2<T>(v[6], v[7]));
    }
}

// fp8 operands take a pipeline of their own: their raw bytes go to shared memory STAGES slices
// deep, by cp.async where rows are 16-byte aligned (plain loads that widen on the way, as before,
// left every slice's L2 latency exposed), and each thread widens the pieces it copied itself into
// the one slice of T the tensor cores read (its own copies are visible to it after
// cp.async.wait_group, so no extra barrier). Rows x cols bytes of a row-major matrix from (r0, c0)
// into `dst` (rows of `cols` bytes, unpadded: a thread reads its own 16 contiguous bytes back),
// zero outside. `vec`: rows 16-byte aligned and `cols` a multiple of 16, so a piece is all inside
// or all outside; otherwise byte by byte, stored at once.
template <uint32_t ROWS, uint32_t COLS>
__device__ __forceinline__ void pptm_fp8_copy(uint8_t* dst, const uint8_t* base, uint64_t ld, uint64_t r0, uint64_t c0,
                                              uint64_t rows, uint64_t cols, bool vec) {
    static_assert(COLS % 16 == 0, "fp8: rows of whole 16-byte pieces");
#pragma unroll 1
    for (uint32_t c = threadIdx.x; c < ROWS * COLS / 16; c += PPTM_BLOCK_THREADS) {
        const uint32_t r = c / (COLS / 16), q = 16 * (c % (COLS / 16));
        const uint64_t gr = r0 + r, gc = c0 + q;
        if (vec) {
            const bool in = gr < rows && gc < cols;
            pptm_cp_async_16(dst + r * COLS + q, in ? base + gr * ld + gc : base, in ? 16u : 0u);
        } else {
#pragma unroll 1
            for (uint32_t g = 0; g < 16; g += 4) {
                uint32_t word = 0;
#pragma unroll
                for (uint32_t e = 0; e < 4; ++e) {
                    const uint32_t v = gr < rows && gc + g + e < cols ? pptm_ld_cg_u8(base + gr * ld + gc + g + e) : 0u;
                    word |= v << (8 * e);
                }
                *reinterpret_cast<uint32_t*>(dst + r * COLS + q + g) = word;
            }
        }
    }
}

// The pieces this thread copied by pptm_fp8_copy<ROWS, COLS>, widened into `dst` (rows `ds` values
// apart).
template <class T, uint32_t ROWS, uint32_t COLS>
__device__ __forceinline__ void pptm_fp8_widen(uint16_t* dst, uint32_t ds, const uint8_t* raw) {
#pragma unroll 1
    for (uint32_t c = threadIdx.x; c < ROWS * COLS / 16; c += PPTM_BLOCK_THREADS) {
        const uint32_t r = c / (COLS / 16), q = 16 * (c % (COLS / 16));
        const uint4 b = *reinterpret_cast<const uint4*>(raw + r * COLS + q);
        uint32_t v[8];
        const uint32_t w[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (uint32_t e = 0; e < 8; ++e) v[e] = pptm_e4m3x2_widen<T>(w[e / 2] >> (16 * (e % 2)));
        uint4* const d = reinterpret_cast<uint4*>(dst + r * ds + q);
        d[0] = make_uint4(v[0], v[1], v[2], v[3]);
        d[1] = make_uint4(v[4], v[5], v[6], v[7]);
    }
}

// T: what the tensor cores multiply (pptm_bf16, pptm_f16); S: how A and W are stored (T, f32, or
// fp8 E4M3 for T = fp16). BATCHED: `batch` products stacked in A, W and out (pptm_matmul_batched
// in pattern/linear.cuh says how), their tiles numbered as one product's: tile t of product s is
// tile s T + t (T tiles a product). The batch index is worked out per tile, so a batch costs no
// registers across the k loop (a loop over products around this pattern made its variant spill
// three times as much); a single product (BATCHED false) has no batch arithmetic at all.
template <class T, uint32_t BM, uint32_t BN, uint32_t BK, uint32_t STAGES, bool BATCHED = false, class S, class Epi>
__device__ __forceinline__ void pptm_matmul_mma_tiled(const S* A, const S* W, uint64_t m, uint64_t k, uint64_t n,
                                                      const Epi& epi, float* out, const pptm_block_ctx& b,
                                                      uint64_t batch = 1) {
    constexpr uint32_t WARPS_M = 4, WARPS_N = 4;
    constexpr uint32_t WTM = BM / WARPS_M, WTN = BN / WARPS_N;  // a warp's part of the tile
    constexpr uint32_t MT = WTM / 16, NT = WTN / 8;              // its mma tiles
    // Rows padded by 8 values (16 bytes): ldmatrix's eight row reads hit eight different banks.
    constexpr uint32_t AS = BK + 8, WS = BN + 8;
    constexpr uint32_t STAGE = BM * AS + BK * WS;  // 16-bit values per slice
    static_assert(PPTM_WARPS == WARPS_M * WARPS_N, "mma: 16 warps in a 4 x 4 grid");
    static_assert(WTM % 16 == 0 && WTN % 16 == 0, "mma: a warp's part is whole 16 x 16 pieces (B in pairs of n8)");
    static_assert(BK % 16 == 0 && BN % 8 == 0 && BK % 8 == 0, "mma: slices are whole k16 steps and 16-byte pieces");
    static_assert((AS * 2) % 16 == 0 && (WS * 2) % 16 == 0 && (BM * AS * 2) % 16 == 0 && (STAGE * 2) % 16 == 0,
                  "mma: ldmatrix rows and cp.async pieces are 16-byte aligned");
    static_assert(STAGES >= 2 && STAGES * STAGE * 2 <= PPTM_LINEAR_SMEM_ALLOC_FLOATS * 4, "mma: the slices fit the scratch");
    constexpr uint32_t RAW = BM * BK + BK * BN;  // bytes of an fp8 slice
    static_assert(sizeof(S) != 1 || (STAGE * 2 + STAGES * RAW <= PPTM_LINEAR_SMEM_ALLOC_FLOATS * 4 && (BM * BK) % 16 == 0),
                  "mma: a slice of T and the fp8 slices fit the scratch");
    uint16_t* const smem = reinterpret_cast<uint16_t*>(pptm_linear_smem());
    const auto* const a_src = pptm_mma_src(A);
    const auto* const w_src = pptm_mma_src(W);
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t wm = warp / WARPS_N, wn = warp % WARPS_N;
    const bool vec_a = pptm_aligned16(A) && k % 8 == 0;
    const bool vec_w = pptm_aligned16(W) && n % 8 == 0;
    // fp8 rows of whole 16-byte pieces, 16-byte aligned: copied by cp.async (pptm_fp8_copy).
    [[maybe_unused]] const bool vec_a8 = pptm_aligned16(A) && k % 16 == 0;
    [[maybe_unused]] const bool vec_w8 = pptm_aligned16(W) && n % 16 == 0;
    const bool vec_out = out != nullptr && (reinterpret_cast<uint64_t>(out) & 7u) == 0 && n % 2 == 0;
    const uint64_t tiles_n = n / BN + (n % BN != 0);
    const uint64_t per_product = (m / BM + (m % BM != 0)) * tiles_n;
    const uint64_t tiles = BATCHED ? per_product * batch : per_product;
    const uint64_t ktiles = k / BK + (k % BK != 0);
    // Every reader of the scratch before this pattern (an earlier item's) is done.
    __syncthreads();
    for (uint64_t tile = b.block; tile < tiles; tile += b.nblocks) {
        pptm_tick(b);
        // Product s's matrices; its output rows are rows s m .. of the stacked output.
        const uint64_t s = BATCHED ? tile / per_product : 0;
        const uint64_t t = BATCHED ? tile - s * per_product : tile;
        const auto* const a_p = a_src + s * m * k;
        const auto* const w_p = w_src + s * k * n;
        const uint64_t row0 = s * m;
        const uint64_t i0 = t / tiles_n * BM, j0 = t % tiles_n * BN;
        float acc[MT][NT][4];
#pragma unroll
        for (uint32_t x = 0; x < MT; ++x)
#pragma unroll
            for (uint32_t y = 0; y < NT; ++y)
#pragma unroll
                for (uint32_t e = 0; e < 4; ++e) acc[x][y][e] = 0.0f;
        // The tensor cores' part of a slice: `as` (BM x BK of A), `ws` (BK x BN of W).
        auto multiply = [&](const uint16_t* as, const uint16_t* ws) {
#pragma unroll
            for (uint32_t kk = 0; kk < BK; kk += 16) {
                uint32_t af[MT][4];
#pragma unroll
                for (uint32_t x = 0; x < MT; ++x)
                    pptm_ldmatrix_x4(af[x], as + (wm * WTM + 16 * x + (lane & 15)) * AS + kk + 8 * (lane >> 4));
#pragma unroll
                for (uint32_t y = 0; y < NT; y += 2) {
                    // k rows kk .. kk + 15 of columns wn WTN + 8 y .. + 15: fragments of two n8 tiles.
                    uint32_t bf[4];
                    pptm_ldmatrix_x4_trans(bf, ws + (kk + (lane & 7) + 8 * ((lane >> 3) & 1)) * WS + wn * WTN + 8 * y +
                                                   8 * (lane >> 4));
#pragma unroll
                    for (uint32_t x = 0; x < MT; ++x) {
                        pptm_mma<T>::run(acc[x][y], af[x], bf[0], bf[1]);
                        pptm_mma<T>::run(acc[x][y + 1], af[x], bf[2], bf[3]);
                    }
                }
            }
        };
        if constexpr (sizeof(S) == 1) {
            // fp8 bytes STAGES slices deep (pptm_fp8_copy), widened a slice at a time into the
            // slice of T at the scratch's start.
            uint8_t* const ring = reinterpret_cast<uint8_t*>(smem + STAGE);
            auto fetch = [&](uint32_t s, uint64_t k0) {
                pptm_fp8_copy<BM, BK>(ring + s * RAW, a_p, k, i0, k0, m, k, vec_a8);
                pptm_fp8_copy<BK, BN>(ring + s * RAW + BM * BK, w_p, n, k0, j0, k, n, vec_w8);
            };
#pragma unroll 1
            for (uint32_t s = 0; s + 1 < STAGES; ++s) {
                if (s < ktiles) fetch(s, s * BK);
                pptm_cp_async_commit();
            }
            for (uint64_t kt = 0; kt < ktiles; ++kt) {
                // Slice kt + STAGES - 1 goes where slice kt - 1 was, which this thread widened.
                if (kt + STAGES - 1 < ktiles) fetch((uint32_t)((kt + STAGES - 1) % STAGES), (kt + STAGES - 1) * BK);
                pptm_cp_async_commit();
                pptm_cp_async_wait_group<STAGES - 1>();  // this thread's copies of slice kt have landed
                const uint8_t* const raw = ring + (uint32_t)(kt % STAGES) * RAW;
                pptm_fp8_widen<T, BM, BK>(smem, AS, raw);
                pptm_fp8_widen<T, BK, BN>(smem + BM * AS, WS, raw + BM * BK);
                __syncthreads();  // every thread's widened pieces
                multiply(smem, smem + BM * AS);
                // Every warp is done with the slice of T before it is widened into again.
                __syncthreads();
            }
        } else {
            auto load = [&](uint32_t s, uint64_t k0) {
                uint16_t* const as = smem + s * STAGE;
                pptm_mma_stage<T, BM, BK>(as, AS, a_p, k, i0, k0, m, k, vec_a);
                pptm_mma_stage<T, BK, BN>(as + BM * AS, WS, w_p, n, k0, j0, k, n, vec_w);
            };
            // Slices 0 .. STAGES - 2 start at once; one group of copies per slice (empty past k).
#pragma unroll
            for (uint32_t s = 0; s + 1 < STAGES; ++s) {
                if (s < ktiles) load(s, s * BK);
                pptm_cp_async_commit();
            }
            for (uint64_t kt = 0; kt < ktiles; ++kt) {
                // Slice kt + STAGES - 1 goes to the buffer of slice kt - 1, whose last reader (its
                // multiply) finished at the barrier that ended it.
                if (kt + STAGES - 1 < ktiles) load((uint32_t)((kt + STAGES - 1) % STAGES), (kt + STAGES - 1) * BK);
                pptm_cp_async_commit();
                pptm_cp_async_wait_group<STAGES - 1>();  // this thread's copies of slice kt have landed
                __syncthreads();                         // ... and every thread's
                const uint16_t* const as = smem + (uint32_t)(kt % STAGES) * STAGE;
                multiply(as, as + BM * AS);
                // Every warp is done with slice kt before its buffer is refilled.
                __syncthreads();
            }
        }
        if (out == nullptr) continue;
        // Accumulator e of mma tile (x, y) is row 16 x + lane / 4 (+ 8 for e >= 2), column
        // 8 y + 2 (lane % 4) + e % 2 of the warp's part. What the chain reads by column (a bias)
        // is loaded for all of this thread's columns at once, not element by element.
        constexpr uint32_t NC = Epi::col_loads;
        float c[NT][2][NC];
#pragma unroll
        for (uint32_t y = 0; y < NT; ++y)
#pragma unroll
            for (uint32_t e = 0; e < 2; ++e) pptm_epi_cols(epi, j0 + wn * WTN + 8 * y + 2 * (lane % 4) + e, n, c[y][e]);
#pragma unroll
        for (uint32_t x = 0; x < MT; ++x)
#pragma unroll
            for (uint32_t h = 0; h < 2; ++h) {
                const uint64_t i = i0 + wm * WTM + 16 * x + lane / 4 + 8 * h;
                if (i >= m) continue;
#pragma unroll
                for (uint32_t y = 0; y < NT; ++y) {
                    const uint64_t j = j0 + wn * WTN + 8 * y + 2 * (lane % 4);
                    if (j >= n) continue;
                    const uint64_t gi = row0 + i;  // the row of the stacked output
                    const float v0 = epi(gi, j, acc[x][y][2 * h], c[y][0]);
                    if (vec_out) {
                        // n is even and j is even: j + 1 < n too.
                        const float v1 = epi(gi, j + 1, acc[x][y][2 * h + 1], c[y][1]);
                        *reinterpret_cast<float2*>(out + gi * n + j) = make_float2(v0, v1);
                    } else {
                        out[gi * n + j] = v0;
                        if (j + 1 < n) out[gi * n + j + 1] = epi(gi, j + 1, acc[x][y][2 * h + 1], c[y][1]);
                    }
                }
            }
    }
}

// PROMOTE (a stage's `accumulate = "promoted"`): the wgmma path adds each 512 of k into f32 sums
// (pattern/wgmma.cuh). The fp8 path adds every slice so already; mma.sync's accumulators are
// kept as they are.
template <class T, bool PROMOTE = false, class S, class Epi>
__device__ __forceinline__ void pptm_matmul_mma(const S* A, const S* W, uint64_t m, uint64_t k, uint64_t n,
                                                const Epi& epi, float* out, const pptm_block_ctx& b) {
#ifdef PPTM_WGMMA
    // Hopper: TMA + wgmma (pattern/wgmma.cuh) where it applies.
    if constexpr (sizeof(S) == 2) {
        if (pptm_wgmma_fits(A, W, m, k, n)) {
            pptm_took_path(PPTM_PATH_WGMMA);
            pptm_matmul_wgmma<T, PROMOTE>(reinterpret_cast<const T*>(A), reinterpret_cast<const T*>(W), m, k, n, epi, out, b);
            return;
        }
    }
    // E4M3 operands: fp8 wgmma, W transposed slice by slice in shared memory.
    if constexpr (sizeof(S) == 1) {
        if (pptm_wgmma_fp8_fits(A, W, m, k, n)) {
            pptm_took_path(PPTM_PATH_WGMMA_FP8);
            pptm_matmul_wgmma_fp8(A, W, m, k, n, epi, out, b);
            return;
        }
    }
#endif
    pptm_took_path(PPTM_PATH_MMA_SYNC);
    if (pptm_mma_large(m, n))
        pptm_matmul_mma_tiled<T, 128, 64, 32, 3>(A, W, m, k, n, epi, out, b);
    else
        pptm_matmul_mma_tiled<T, 64, 64, 32, 4>(A, W, m, k, n, epi, out, b);
}

// ---- f32 operands in three bf16 products (`precision = "bf16x3"`) ----------------------------------
//
// Each f32 operand x splits into hi = bf16(x) and lo = bf16(x - hi) (x - hi is exact in f32): hi + lo
// is x to about 2^-17 of |x|. The product sums A_hi W_hi + A_lo W_hi + A_hi W_lo; the missing A_lo W_lo
// is about 2^-18 of each term. So every term is within about 2^-16 of its f32 value, and the sums
// are f32 (wgmma's, truncated at each k16 step; `accumulate = "promoted"` rounds them to nearest
// every 512 of k).
//
// In two phases on the item's blocks, which meet between them (pptm_item_meet): the blocks write
// the halves into the runtime's working memory (ChainIr::scratch gives its layout and size), then
// multiply them as one wgmma product over 3k (pptm_matmul_wgmma_tiled's SPLIT3). Where there is no
// working memory, no meeting (a launched kernel) or no wgmma (not Hopper, or outside
// pptm_wgmma_fits), the product runs in f32 on CUDA cores: the same accuracy or better.

// Splits 4 consecutive values into 4 hi and 4 lo bf16 (8 bytes each).
__device__ __forceinline__ void pptm_split4(const float (&x)[4], uint2& hi, uint2& lo) {
    float r[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) r[e] = x[e] - pptm_round_to<pptm_bf16>(x[e]);
    hi = make_uint2(pptm_pack2<pptm_bf16>(x[0], x[1]), pptm_pack2<pptm_bf16>(x[2], x[3]));
    lo = make_uint2(pptm_pack2<pptm_bf16>(r[0], r[1]), pptm_pack2<pptm_bf16>(r[2], r[3]));
}

// The rows x cols f32 matrix src (row-major, ld = cols) into its hi half at dst and its lo half at
// dst + lo_at (bf16 elements): drows rows dpitch apart (zero past rows) of dcols values (dcols >=
// cols, a multiple of 4; zero past cols). This block's share, 4 values a thread a step, grid-stride.
template <class I>
__device__ __forceinline__ void pptm_split_rows(const float* src, uint64_t rows, uint64_t cols, uint16_t* dst, uint64_t drows, uint64_t dcols,
                                                uint64_t dpitch, uint64_t lo_at, const pptm_block_ctx& b) {
    const I groups = (I)(dcols / 4), total = (I)drows * groups;
    const bool vec = cols % 4 == 0 && pptm_aligned16(src);
    const I stride = (I)b.nblocks * PPTM_BLOCK_THREADS;
    for (I g = (I)b.block * PPTM_BLOCK_THREADS + threadIdx.x; g < total; g += stride) {
        const I r = g / groups;
        const uint64_t c = (uint64_t)(g - r * groups) * 4;
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if ((uint64_t)r < rows) {
            const float* p = src + (uint64_t)r * cols + c;
            if (vec && c < cols) {
                const pptm_f4 v = pptm_ld_cg_f4(p);
                x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (c + e < cols) x[e] = pptm_ld_cg_f32(p + e);
            }
        }
        uint2 hi, lo;
        pptm_split4(x, hi, lo);
        uint16_t* const d = dst + (uint64_t)r * dpitch + c;
        *reinterpret_cast<uint2*>(d) = hi;
        *reinterpret_cast<uint2*>(d + lo_at) = lo;
    }
}

template <bool PROMOTE, class Epi>
__device__ __forceinline__ void pptm_matmul_bf16x3(const float* A, const float* W, uint64_t m, uint64_t k, uint64_t n, const Epi& epi,
                                                   float* out, const pptm_block_ctx& b, void* scratch) {
#ifdef PPTM_WGMMA
    const uint64_t kp = (k + 63) & ~63ull, np = (n + 7) & ~7ull;
    uint16_t* const a2 = reinterpret_cast<uint16_t*>(scratch);
    uint16_t* const w2 = a2 + ((m * 2 * kp * 2 + 127) & ~127ull) / 2;  // ChainIr::scratch's layout
    if (scratch != nullptr && pptm_can_meet(b) && pptm_wgmma_fits(a2, w2, m, 3 * kp, np)) {
        // A: m rows of [hi | lo], 2 kp wide. W: 2 kp rows ([hi ; lo]), np wide.
        if (m * kp / 4 < (1ull << 32) && kp * np / 4 < (1ull << 32)) {
            pptm_split_rows<uint32_t>(A, m, k, a2, m, kp, 2 * kp, kp, b);
            pptm_split_rows<uint32_t>(W, k, n, w2, kp, np, np, kp * np, b);
        } else {
            pptm_split_rows<uint64_t>(A, m, k, a2, m, kp, 2 * kp, kp, b);
            pptm_split_rows<uint64_t>(W, k, n, w2, kp, np, np, kp * np, b);
        }
        pptm_item_meet(b);
        pptm_took_path(PPTM_PATH_WGMMA);
        pptm_matmul_wgmma<pptm_bf16, PROMOTE, true>(reinterpret_cast<const pptm_bf16*>(a2), reinterpret_cast<const pptm_bf16*>(w2), m, kp, n, epi,
                                                    out, b);
        return;
    }
#endif
    (void)scratch;
    pptm_matmul(A, W, m, k, n, epi, out, b);
}

// Batched products on tensor cores (pptm_matmul_batched in pattern/linear.cuh says what they
// are): on Hopper, products of 128 x 128 outputs or more by wgmma (pattern/wgmma.cuh); the rest by
// mma.sync, the tile size chosen from the whole batch's tiles, as the host's block request
// (ChainIr::stage_blocks) does.
template <class T, class S, class Epi>
__device__ __forceinline__ void pptm_matmul_mma_batched(uint64_t batch, const S* A, const S* W, uint64_t m, uint64_t k,
                                                        uint64_t n, const Epi& epi, float* out, const pptm_block_ctx& b) {
#ifdef PPTM_WGMMA
    // Hopper, 16-bit operands in memory, products of 128 x 128 outputs or more: TMA + wgmma.
    if constexpr (sizeof(S) == 2) {
        if (pptm_wgmma_batched_fits(A, W, batch, m, k, n)) {
            pptm_took_path(PPTM_PATH_WGMMA);
            pptm_matmul_wgmma_batched<T>(batch, reinterpret_cast<const T*>(A), reinterpret_cast<const T*>(W), m, k, n, epi, out, b);
            return;
        }
    }
    // E4M3 operands, products of 128 x 128 outputs or more, k whole slices of 128: fp8 wgmma.
    if constexpr (sizeof(S) == 1) {
        if (pptm_wgmma_fp8_batched_fits(A, W, batch, m, k, n)) {
            pptm_took_path(PPTM_PATH_WGMMA_FP8);
            pptm_matmul_wgmma_fp8<true>(A, W, m, k, n, epi, out, b, (uint32_t)batch);
            return;
        }
    }
#endif
    pptm_took_path(PPTM_PATH_MMA_SYNC);
    const uint64_t large = (m / 128 + (m % 128 != 0)) * (n / 64 + (n % 64 != 0));
    // Products no taller than a small tile keep small tiles: a large one would be half empty.
    if (m > 64 && batch * large >= (uint64_t)PPTM_MMA_LARGE_FROM)
        pptm_matmul_mma_tiled<T, 128, 64, 32, 3, true>(A, W, m, k, n, epi, out, b, batch);
    else
        pptm_matmul_mma_tiled<T, 64, 64, 32, 4, true>(A, W, m, k, n, epi, out, b, batch);
}

// ---- the accuracy guard -----------------------------------------------------------------------
//
// A guarded stage (`tolerance = x`) keeps its operands in f32. Before it multiplies, every block
// computes the same PPTM_GUARD_SAMPLES outputs of A W twice, in f32 from the f32 operands and from
// the operands rounded to T as the tensor cores would get them, and takes the largest difference
// relative to the magnitude of the terms summed: an error that T's range or precision causes
// (an operand beyond fp16's 65504 becomes infinite) shows in these sums. Within the tolerance,
// the block multiplies in T on tensor cores; beyond it (or non-finite), in f32 on CUDA cores. All
// blocks see the same samples, so they decide alike without meeting. Sample s of an m x n output
// is row (2s + 1) m / 32, column (2 (5s mod 16) + 1) n / 32: rows and columns spread over the
// output, each once (pptm_spec::guard_samples says the same, for the CPU backend's emulation).
#ifndef PPTM_GUARD_SAMPLES
#error "PPTM_GUARD_SAMPLES must be defined by the generated translation unit"
#endif
static_assert(PPTM_WARPS == PPTM_GUARD_SAMPLES, "guard: a warp per sample");

// The largest sampled error, in every thread; +inf when a sample is not finite. `smem` holds
// PPTM_WARPS doubles (the block-reduction scratch).
template <class T>
__device__ __forceinline__ float pptm_guard_error(const float* A, const float* W, uint64_t m, uint64_t k, uint64_t n,
                                                  double* smem) {
    if (m == 0 || n == 0) return 0.0f;
    const uint32_t s = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint64_t i = (2 * s + 1) * m / (2 * PPTM_GUARD_SAMPLES);
    const uint64_t j = (2 * (5 * s % PPTM_GUARD_SAMPLES) + 1) * n / (2 * PPTM_GUARD_SAMPLES);
    float ref = 0.0f, mag = 0.0f, low = 0.0f;
    for (uint64_t p = lane; p < k; p += 32) {
        const float a = pptm_ld_cg_f32(A + i * k + p), w = pptm_ld_cg_f32(W + p * n + j);
        ref = fmaf(a, w, ref);
        mag += fabsf(a * w);
        low = fmaf(pptm_round_to<T>(a), pptm_round_to<T>(w), low);
    }
    ref = pptm_warp_sum(ref);
    mag = pptm_warp_sum(mag);
    low = pptm_warp_sum(low);
    float err = fabsf(low - ref) / fmaxf(mag, 1e-30f);
    if (!(err <= 3.0e38f)) err = __int_as_float(0x7f800000);  // NaN or inf: +inf
    // Every reader of smem before this (an earlier item's block reduction) is done.
    __syncthreads();
    if (lane == 0) smem[s] = err;
    __syncthreads();
    float worst = 0.0f;
#pragma unroll
    for (uint32_t w = 0; w < PPTM_WARPS; ++w) worst = fmaxf(worst, (float)smem[w]);
    __syncthreads();  // smem may be reused right after
    return worst;
}

// out = epi(A W) for a guarded stage computing in T with f32 operands, `tolerance` as declared.
// `level` (the descriptor's guard word, set by the runtime): 0 checks and decides as above, 1
// runs in f32 at once (this shape failed the check before). Returns what the host learns from the
// item (its completion value): the sampled error when T was used, its negation when f32 was
// (-inf for a non-finite check, -0.0 when level 1 skipped the check).
template <class T, class Epi>
__device__ __forceinline__ double pptm_matmul_guarded(const float* A, const float* W, uint64_t m, uint64_t k, uint64_t n,
                                                      const Epi& epi, float* out, const pptm_block_ctx& b, float tolerance,
                                                      uint32_t level) {
    if (level != 0) {
        pptm_matmul(A, W, m, k, n, epi, out, b);
        return -0.0;
    }
    const float err = pptm_guard_error<T>(A, W, m, k, n, b.red_smem);
    if (err <= tolerance) {
        pptm_matmul_mma<T>(A, W, m, k, n, epi, out, b);
        return (double)err;
    }
    pptm_matmul(A, W, m, k, n, epi, out, b);
    return -(double)err;
}

// ---- gemv_n on tensor cores: y = epi(A pro), A in bf16 or fp8 ----------------------------------
//
// For a Gemv stage with tensor_eligible = true and precision "bf16" or "fp8": A (m x n, row-major)
// is a bf16 or E4M3 buffer, the vector stays f32. A GEMV reads every element of A once and does two
// flops per element, so its time is A's bytes over the memory bandwidth: bf16 storage halves them
// against f32, fp8 quarters them, and mma.sync does the multiply-adds without costing the loads
// anything. E4M3 values are widened to bf16 as they are loaded, exactly (bf16 holds every one).
//
// The vector is not rounded to bf16. Each x_j is split into hi (x_j with its low 16 bits cleared,
// exact in bf16) and lo (x_j - hi, exact in f32, rounded to bf16), |x_j - hi - lo| <= 2^-16 |x_j|;
// an m16n8k16 product takes hi as column 0 of its B fragment and lo as column 1, so
// y_i = C[i][0] + C[i][1] is A's bf16 values times the f32 vector, to f32 accuracy. (Columns 2..7
// carry hi again; nothing reads them. An infinite x_j has lo = 0, so it stays infinite.)
//
// A block owns 16 rows, one mma tile (the host asks for m / 16 blocks, work::GEMV_MMA_ROWS); its
// warps split n, each taking PPTM_GEMV_MMA_SLABS slabs of 32 columns at a time, round robin. In a
// slab, lane (g, t) (g = lane / 4, t = lane % 4) multiplies a piece of eight columns of rows g and
// g + 8. A lane reads 16 bytes of a row at once: one piece of bf16 (columns 8t .. 8t + 7 of the
// slab) or two of fp8 (columns 16t .. 16t + 15 of a pair of slabs), so every lane has 64 bytes in
// flight and a warp reads 64 or 128 contiguous bytes of each row (fp8 with 8-byte loads, a piece
// at a time, ran at 1.5 TB/s on an H100, against bf16's 2.4). A dot product does not care in which
// order its terms are added, so a piece's eight values go into the fragment slots the lane owns
// (columns 2t, 2t + 1 and 2t + 8, 2t + 9 of two products) and B takes the vector's values for the
// same eight columns in the same slots. pro is evaluated once per column a warp: lane (g, t)
// evaluates it at column g of its piece, and shuffles hand each lane the eight values of its piece. Each warp's 16 sums go through the scratch, and 16 threads add them in
// warp order (the same result every run) and apply the epilogue.
//
// Rows whose start is not aligned for that load (n not a multiple of 8 for bf16 or of 16 for fp8,
// or an unaligned A) are read element by element instead; columns past n and rows past m read as 0 and are never stored.
#ifndef PPTM_GEMV_MMA_ROWS
#error "PPTM_GEMV_MMA_ROWS must be defined by the generated translation unit"
#endif
static_assert(PPTM_GEMV_MMA_ROWS == 16, "gemv_n_mma: a block owns the 16 rows of one mma tile");
#ifndef PPTM_GEMV_MMA_SLABS
#define PPTM_GEMV_MMA_SLABS 2
#endif
static_assert(PPTM_WARPS * PPTM_GEMV_MMA_ROWS <= PPTM_LINEAR_SMEM_FLOATS, "gemv_n_mma: the warps' sums fit the scratch");

// The pieces of eight elements one 16-byte load holds.
template <class E>
__device__ constexpr uint32_t pptm_gemv_mma_pieces() {
    return 16 / (8 * sizeof(E));
}

// Where lane t's piece s starts in a span of PPTM_GEMV_MMA_SLABS slabs (P pieces a load).
template <uint32_t P>
__device__ __forceinline__ uint32_t pptm_gemv_mma_piece(uint32_t s, uint32_t t) {
    return (s / P) * 32 * P + t * 8 * P + 8 * (s % P);
}

// Two E4M3 values (the low two bytes of v, the first in the lower byte) as a bf16 pair, exactly.
__device__ __forceinline__ uint32_t pptm_e4m3x2_to_bf16x2(uint32_t v) { return pptm_e4m3x2_widen<pptm_bf16>(v); }

// The 16 bytes of a row from column j: r[p] holds piece p (columns j + 8p .. j + 8p + 7) as four
// bf16 pairs, the lower column in the low half; 0 past the end of the row (VEC: rows aligned for
// one 16-byte load, and n a multiple of its elements). Rows of bf16 bits:
template <bool VEC>
__device__ __forceinline__ void pptm_gemv_mma_load(uint32_t (*r)[4], const uint16_t* row, uint64_t j, uint64_t n, bool live) {
    if constexpr (VEC) {
        if (live && j < n) {
            const pptm_f4 v = pptm_ld_cg_f4(reinterpret_cast<const float*>(row + j));
            r[0][0] = __float_as_uint(v.x);
            r[0][1] = __float_as_uint(v.y);
            r[0][2] = __float_as_uint(v.z);
            r[0][3] = __float_as_uint(v.w);
        } else {
            r[0][0] = r[0][1] = r[0][2] = r[0][3] = 0u;
        }
    } else {
#pragma unroll
        for (uint32_t q = 0; q < 4; ++q) {
            const uint32_t lo = live && j + 2 * q < n ? pptm_ld_cg_u16(row + j + 2 * q) : 0u;
            const uint32_t hi = live && j + 2 * q + 1 < n ? pptm_ld_cg_u16(row + j + 2 * q + 1) : 0u;
            r[0][q] = lo | (hi << 16);
        }
    }
}

// Rows of E4M3 bytes: two pieces, widened to bf16.
template <bool VEC>
__device__ __forceinline__ void pptm_gemv_mma_load(uint32_t (*r)[4], const uint8_t* row, uint64_t j, uint64_t n, bool live) {
    uint32_t w[4] = {0u, 0u, 0u, 0u};
    if constexpr (VEC) {
        if (live && j < n)
            asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                         : "l"(row + j));
    } else {
#pragma unroll
        for (uint32_t e = 0; e < 16; ++e) {
            const uint32_t v = live && j + e < n ? pptm_ld_cg_u8(row + j + e) : 0u;
            w[e / 4] |= v << (8 * (e % 4));
        }
    }
#pragma unroll
    for (uint32_t p = 0; p < 2; ++p)
#pragma unroll
        for (uint32_t q = 0; q < 4; ++q) r[p][q] = pptm_e4m3x2_to_bf16x2(w[2 * p + q / 2] >> (16 * (q % 2)));
}

// The part of x that column `lo_col ? 1 : 0` of B carries: hi = x with its low 16 bits cleared,
// or lo = x - hi (0 for an infinite x, whose hi is x already). Exact in f32; hi is exact in bf16.
__device__ __forceinline__ float pptm_bf16_part(float x, bool lo_col) {
    const float hi = __uint_as_float(__float_as_uint(x) & 0xffff0000u);
    const float lo = fabsf(x) == __int_as_float(0x7f800000) ? 0.0f : x - hi;
    return lo_col ? lo : hi;
}

template <bool VEC, class R, class E, class Pro, class Epi>
__device__ __forceinline__ double pptm_gemv_n_mma_rows(const E* A, uint64_t m, uint64_t n, const Pro& pro,
                                                       const Epi& epi, float* out, const pptm_block_ctx& b) {
    constexpr uint32_t S = PPTM_GEMV_MMA_SLABS, P = pptm_gemv_mma_pieces<E>();
    static_assert(S % P == 0, "gemv_n_mma: a span holds whole loads");
    constexpr uint64_t span = 32 * S, stride = span * PPTM_WARPS;
    float* const sums = pptm_linear_smem();
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3u;
    const bool lo_col = g == 1;
    const uint64_t groups = m / PPTM_GEMV_MMA_ROWS + (m % PPTM_GEMV_MMA_ROWS != 0);
    double red = R::identity();
    for (uint64_t grp = b.block; grp < groups; grp += b.nblocks) {
        pptm_tick(b);
        const uint64_t i0 = grp * PPTM_GEMV_MMA_ROWS + g, i1 = i0 + 8;
        const E* const row0 = A + i0 * n;  // read only while i0 < m
        const E* const row1 = A + i1 * n;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
        for (uint64_t c0 = (uint64_t)warp * span; c0 < n; c0 += stride) {  // warp-uniform
            uint32_t a0[S][4], a1[S][4];
            float xm[S];
#pragma unroll
            for (uint32_t s = 0; s < S; s += P) {
                const uint64_t j = c0 + pptm_gemv_mma_piece<P>(s, t);
                pptm_gemv_mma_load<VEC>(&a0[s], row0, j, n, i0 < m);
                pptm_gemv_mma_load<VEC>(&a1[s], row1, j, n, i1 < m);
            }
#pragma unroll
            for (uint32_t s = 0; s < S; ++s) {
                const uint64_t j = c0 + pptm_gemv_mma_piece<P>(s, t) + g;
                xm[s] = j < n ? pro(j) : 0.0f;
            }
#pragma unroll
            for (uint32_t s = 0; s < S; ++s) {
                uint32_t bq[4];
#pragma unroll
                for (uint32_t q = 0; q < 4; ++q) {
                    // Columns 2q and 2q + 1 of the lane's piece, evaluated by lanes (2q, t) and (2q + 1, t).
                    const float x0 = __shfl_sync(0xffffffffu, xm[s], 8 * q + t);
                    const float x1 = __shfl_sync(0xffffffffu, xm[s], 8 * q + 4 + t);
                    bq[q] = pptm_pack2<pptm_bf16>(pptm_bf16_part(x0, lo_col), pptm_bf16_part(x1, lo_col));
                }
                const uint32_t f0[4] = {a0[s][0], a1[s][0], a0[s][1], a1[s][1]};
                const uint32_t f1[4] = {a0[s][2], a1[s][2], a0[s][3], a1[s][3]};
                pptm_mma<pptm_bf16>::run(d, f0, bq[0], bq[1]);
                pptm_mma<pptm_bf16>::run(d, f1, bq[2], bq[3]);
            }
        }
        // Every reader of the scratch before this group (this call's or an earlier pattern's) is done.
        __syncthreads();
        if (t == 0) {  // lane (g, 0) holds columns 0 and 1 of rows g and g + 8
            sums[warp * PPTM_GEMV_MMA_ROWS + g] = d[0] + d[1];
            sums[warp * PPTM_GEMV_MMA_ROWS + g + 8] = d[2] + d[3];
        }
        __syncthreads();
        const uint64_t i = grp * PPTM_GEMV_MMA_ROWS + threadIdx.x;
        if (threadIdx.x < PPTM_GEMV_MMA_ROWS && i < m) {
            float acc = 0.0f;
#pragma unroll
            for (uint32_t w = 0; w < PPTM_WARPS; ++w) acc += sums[w * PPTM_GEMV_MMA_ROWS + threadIdx.x];
            const float y = epi(i, acc);
            if (out != nullptr) out[i] = y;
            red = R::combine(red, (double)y);
        }
    }
    return pptm_block_partial<R>(red, b.red_smem);
}

// A of bf16 or E4M3 (T); row i starts at A + i n, so every row start is aligned for the 16-byte
// load iff A is and n is a multiple of its elements (8 or 16).
template <class R, class T, class Pro, class Epi>
__device__ __forceinline__ double pptm_gemv_n_mma(const T* A, uint64_t m, uint64_t n, const Pro& pro, const Epi& epi,
                                                  float* out, const pptm_block_ctx& b) {
    const auto* const a = pptm_mma_src(A);
    if (pptm_aligned16(a) && n % (16 / sizeof(*a)) == 0) return pptm_gemv_n_mma_rows<true, R>(a, m, n, pro, epi, out, b);
    return pptm_gemv_n_mma_rows<false, R>(a, m, n, pro, epi, out, b);
}

#endif  // PPTM_PATTERN_MMA_CUH
