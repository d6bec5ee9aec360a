// pptm Hopper tensor-core pattern: out[i, j] = epi(i, j, sum_p A[i, p] * W[p, j]) with A (m x k) and
// W (k x n) row-major bf16 or fp16, f32 accumulation, by wgmma (warpgroup MMA, operands read from
// shared memory by the tensor cores) fed by TMA (bulk tensor copies, cp.async.bulk.tensor) through
// an mbarrier pipeline. Compiled only for compute_90a (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere
// pattern/mma.cuh's mma.sync path is all there is.
//
// Shape. A block (512 threads = 4 warpgroups) computes a BM x BN tile of out: 256 x 192, each
// warpgroup 64 rows (96 f32 accumulators a thread, one m64n192k16 wgmma per 16 of k), or 128 x 128
// where the large tiles would leave blocks idle, the warpgroups 2 x 2 (m64n64k16); also 256 x 128 and 128 x 64 with
// each slice's k split in the block (KS below): pptm_matmul_wgmma picks by a cost model. What bounds the
// large products is the bytes each SM takes from L2 (about 5.9 TB/s in all on an H100, for cuBLAS
// too): 256 x 192 takes 22 % fewer a product than 128 x 256, whose 8192^3 reached 0.67 of cuBLAS
// against 0.84. k advances in slices of 64: the slice of A (BM rows x 64, boxes of 128 rows) and of
// W (64 rows x BN, boxes of 64 columns) land in shared memory in the 128-byte swizzled layout
// wgmma reads, 224 KiB of slices deep (4 of 56 KiB, or 7 of 32).
// Pipeline. Thread 0 is also the producer: a slice's buffer is refilled as soon as every warp has
// released it (the `empty` barrier, one arrival per warp once wgmma.wait_group shows its reads
// done), and a slice is multiplied once its bytes have landed (the `full` barrier, TMA's
// complete_tx). The slice sequence runs across the block's tiles, so the next tile's first slices
// load while this tile's epilogue runs. The epilogue applies the chain's bias and activation to the
// accumulators in registers and stores f32 straight from them.
//
// Tensor maps. TMA needs a tensor map (a 128-byte descriptor of the matrix: address, sizes, row
// pitch, box, swizzle) in global memory. The host encodes one template per operand type and role
// when it loads the module (pptm_tmap_template); for each item, warp 0 copies the templates to
// shared memory, writes the item's address, sizes and pitch into them (tensormap.replace), and
// copies them to this SM's slot (pptm_tmap_slot[%smid]) with the proxy fence that makes them
// visible to TMA. A slot per SM is race-free: the pattern's shared memory (PPTM_DYNAMIC_SMEM_BYTES,
// more than half an SM's) leaves room for one block of any kernel of this module on an SM.
#ifndef PPTM_PATTERN_WGMMA_CUH
#define PPTM_PATTERN_WGMMA_CUH

#include "pptm/device.cuh"

#define PPTM_WG_BK 64
#define PPTM_WG_A_BOX_BYTES (128 * PPTM_WG_BK * 2)
#define PPTM_WG_W_BOX_BYTES (64 * PPTM_WG_BK * 2)
// The slices take PPTM_WG_RING_BYTES whatever the tile (4 slices of 256 x 192, 7 of 128 x 128);
// then the barriers (full, empty) and two 128-byte tensor maps, from a 1024-byte aligned
// base; plus 1024 bytes of slack to align the dynamic shared memory's start.
#define PPTM_WG_RING_BYTES (224 * 1024)
#define PPTM_WG_SMEM_BYTES (PPTM_WG_RING_BYTES + 2048)
// Groups of 8 columns whose column values (a bias) the epilogue loads at once (2, 4 and 8 were
// within noise of each other in bench/probes/wgmma_probe.cu on an H100).
#ifndef PPTM_WG_EPI_GROUPS
#define PPTM_WG_EPI_GROUPS 4
#endif
// Tensor-map templates: [operand type: 0 bf16, 1 fp16][role: 0 A (box 64 x 128), 1 W (box 64 x 64)],
// then (index 4) E4M3 bytes, box 128 x 128, for both of an fp8 product's operands.
#define PPTM_WG_TEMPLATES 5
#define PPTM_WG_TEMPLATE_E4M3 4


// The host finds the templates by name in a module that has this path (they exist only there), and
// fills them when it loads the module. (Also in every pass of nvcc, for bench/probes/wgmma_probe.cu:
// one of them defines __CUDA_ARCH__ without the sm_90a feature macro.)
#if defined(PPTM_WGMMA) || !defined(__CUDACC_RTC__)
extern "C" {
__device__ __align__(128) uint64_t pptm_tmap_template[PPTM_WG_TEMPLATES][16];
__device__ __align__(128) uint64_t pptm_tmap_slot[256][2][16];
}
#endif

#ifdef PPTM_WGMMA

#ifndef PPTM_DYNAMIC_SMEM_BYTES
#error "PPTM_DYNAMIC_SMEM_BYTES must be defined by the generated translation unit"
#endif
static_assert(PPTM_WG_SMEM_BYTES <= PPTM_DYNAMIC_SMEM_BYTES, "wgmma: the pipeline fits the dynamic shared memory");
static_assert(PPTM_DYNAMIC_SMEM_BYTES > 116 * 1024, "wgmma: one block an SM, so a tensor-map slot per SM is exclusive");
static_assert(PPTM_BLOCK_THREADS == 512, "wgmma: four warpgroups");


__device__ __forceinline__ uint32_t pptm_smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// ---- mbarriers and TMA --------------------------------------------------------------------------

__device__ __forceinline__ void pptm_mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void pptm_mbar_inval(uint32_t bar) {
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void pptm_mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void pptm_mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits for the phase with the given parity to complete.
__device__ __forceinline__ void pptm_mbar_wait(uint32_t bar, uint32_t parity) {
    for (;;) {
        uint32_t done;
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
        if (done) return;
    }
}

// The box of `tmap` at (c0 = column, c1 = row) into shared memory at `dst`, counted on `bar`.
__device__ __forceinline__ void pptm_tma_load_2d(uint32_t dst, const void* tmap, int32_t c0, int32_t c1, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
        "l"(tmap), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

// ---- tensor maps ----------------------------------------------------------------------------------

// Warp 0: this SM's two tensor maps for A (rows x cols) and W, from templates a_tpl and w_tpl, for
// elements of `esize` bytes, in global memory and visible to TMA once the issuing thread runs
// pptm_tmap_acquire.
__device__ __forceinline__ void pptm_tmap_build(uint32_t a_tpl, uint32_t w_tpl, uint32_t esize, const void* a, uint64_t a_rows,
                                                uint64_t a_cols, const void* w, uint64_t w_rows, uint64_t w_cols, uint64_t* smem_maps,
                                                uint64_t (*slot)[16]) {
    const uint32_t lane = threadIdx.x & 31u;
    smem_maps[lane] = pptm_tmap_template[lane < 16 ? a_tpl : w_tpl][lane % 16];
    __syncwarp();
    if (lane < 2) {
        const uint32_t m = pptm_smem_addr(smem_maps + 16 * lane);
        const uint64_t addr = reinterpret_cast<uint64_t>(lane == 0 ? a : w);
        const uint32_t rows = (uint32_t)(lane == 0 ? a_rows : w_rows), cols = (uint32_t)(lane == 0 ? a_cols : w_cols);
        const uint64_t pitch = esize * (lane == 0 ? a_cols : w_cols);
        asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;" ::"r"(m), "l"(addr) : "memory");
        asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 0, %1;" ::"r"(m), "r"(cols) : "memory");
        asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 1, %1;" ::"r"(m), "r"(rows) : "memory");
        // Ordinal 0: the stride of dimension 1 (rows); dimension 0's is the element size.
        asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], 0, %1;" ::"r"(m), "l"(pitch) : "memory");
    }
    __syncwarp();
#pragma unroll
    for (uint32_t r = 0; r < 2; ++r)
        asm volatile(
            "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;" ::"l"(
                slot[r]),
            "r"(pptm_smem_addr(smem_maps + 16 * r))
            : "memory");
}

__device__ __forceinline__ void pptm_tmap_acquire(const void* map) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(map) : "memory");
}

// ---- wgmma --------------------------------------------------------------------------------------

// A shared-memory matrix descriptor: start address, leading and stride byte offsets, 128-byte swizzle.
__device__ __forceinline__ uint64_t pptm_wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void pptm_wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void pptm_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Keeps the compiler from moving accumulator reads or writes across the asynchronous MMA's edges.
template <int R>
__device__ __forceinline__ void pptm_wg_fence_operands(float (&d)[R]) {
#pragma unroll
    for (uint32_t e = 0; e < R; ++e) asm volatile("" : "+f"(d[e])::"memory");
}
template <int N>
__device__ __forceinline__ void pptm_wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

#define PPTM_WG_D8(o) "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), "+f"(d[o + 6]), "+f"(d[o + 7])
#define PPTM_WG_D32 PPTM_WG_D8(0), PPTM_WG_D8(8), PPTM_WG_D8(16), PPTM_WG_D8(24)
#define PPTM_WG_D64 PPTM_WG_D32, PPTM_WG_D8(32), PPTM_WG_D8(40), PPTM_WG_D8(48), PPTM_WG_D8(56)
#define PPTM_WG_R32                                                                                                         \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, " \
    "%25, %26, %27, %28, %29, %30, %31"
#define PPTM_WG_R64                                                                                                      \
    PPTM_WG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, " \
                "%52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define PPTM_WG_D96 PPTM_WG_D64, PPTM_WG_D8(64), PPTM_WG_D8(72), PPTM_WG_D8(80), PPTM_WG_D8(88)
#define PPTM_WG_R96 PPTM_WG_R64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, " \
    "%76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
// One wgmma: d (64 x N f32, this thread's N / 2) += A (64 x 16, K-major) B (16 x N, N-major:
// transposed in), scale 1, 1.
#define PPTM_WG_MMA(shape, type, regs, outs, a_op, b_op) \
    asm volatile("wgmma.mma_async.sync.aligned." shape ".f32." type "." type " {" regs "}, " a_op ", " b_op ", 1, 1, 1, 0, 1;" : outs : "l"(a), "l"(b))

template <class T, int N>
struct pptm_wgmma;
template <>
struct pptm_wgmma<pptm_bf16, 128> {
    __device__ __forceinline__ static void run(float (&d)[64], uint64_t a, uint64_t b) {
        PPTM_WG_MMA("m64n128k16", "bf16", PPTM_WG_R64, PPTM_WG_D64, "%64", "%65");
    }
};
template <>
struct pptm_wgmma<pptm_f16, 128> {
    __device__ __forceinline__ static void run(float (&d)[64], uint64_t a, uint64_t b) {
        PPTM_WG_MMA("m64n128k16", "f16", PPTM_WG_R64, PPTM_WG_D64, "%64", "%65");
    }
};
template <>
struct pptm_wgmma<pptm_bf16, 192> {
    __device__ __forceinline__ static void run(float (&d)[96], uint64_t a, uint64_t b) {
        PPTM_WG_MMA("m64n192k16", "bf16", PPTM_WG_R96, PPTM_WG_D96, "%96", "%97");
    }
};
template <>
struct pptm_wgmma<pptm_f16, 192> {
    __device__ __forceinline__ static void run(float (&d)[96], uint64_t a, uint64_t b) {
        PPTM_WG_MMA("m64n192k16", "f16", PPTM_WG_R96, PPTM_WG_D96, "%96", "%97");
    }
};
template <>
struct pptm_wgmma<pptm_bf16, 64> {
    __device__ __forceinline__ static void run(float (&d)[32], uint64_t a, uint64_t b) {
        PPTM_WG_MMA("m64n64k16", "bf16", PPTM_WG_R32, PPTM_WG_D32, "%32", "%33");
    }
};
template <>
struct pptm_wgmma<pptm_f16, 64> {
    __device__ __forceinline__ static void run(float (&d)[32], uint64_t a, uint64_t b) {
        PPTM_WG_MMA("m64n64k16", "f16", PPTM_WG_R32, PPTM_WG_D32, "%32", "%33");
    }
};

template <class T>
struct pptm_wg_type;
template <>
struct pptm_wg_type<pptm_bf16> {
    static constexpr uint32_t index = 0;
};
template <>
struct pptm_wg_type<pptm_f16> {
    static constexpr uint32_t index = 1;
};

// ---- the epilogue ----------------------------------------------------------------------------------

// A warpgroup's 64 x N accumulators d (f32, this thread's N / 2) through the chain's epilogue into
// out (m x n, row-major; rows row0 + i of it for a batch's product): the warpgroup's block of
// outputs starts at row i0, column j0. Accumulator 4 q + e is row 16 (warp % 4) + lane / 4 (+ 8 for
// e >= 2), column 8 q + 2 (lane % 4) + e % 2 of the 64 x N.
template <uint32_t N, uint32_t R, class Epi>
__device__ __forceinline__ void pptm_wg_store(const float (&d)[R], const Epi& epi, float* out, uint64_t m, uint64_t n, uint64_t row0,
                                              uint64_t i0, uint64_t j0) {
    static_assert(R == N / 2, "wgmma: N / 2 accumulators a thread");
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint64_t i_base = i0 + 16 * (warp % 4) + lane / 4, j_base = j0 + 2 * (lane % 4);
    const bool vec_out = (reinterpret_cast<uint64_t>(out) & 7u) == 0 && n % 2 == 0;
    // What the chain reads by column (a bias) is loaded for QC groups of 8 columns at once, then
    // serves both rows: loaded element by element, each load (from L2) waited for before the
    // next, it took most of the epilogue's time (64 x 512^3 batched, H100: 156 -> 117 us through
    // the manifold). Two groups where a thread holds 96 accumulators: four spilled there in the
    // manifolds.
    constexpr uint32_t QC = R >= 96 ? 2 : PPTM_WG_EPI_GROUPS, NC = Epi::col_loads;
    static_assert((N / 8) % QC == 0, "wgmma: whole groups of columns");
#pragma unroll
    for (uint32_t q0 = 0; q0 < N / 8; q0 += QC) {
        float c[QC][2][NC];
#pragma unroll
        for (uint32_t qq = 0; qq < QC; ++qq)
#pragma unroll
            for (uint32_t e = 0; e < 2; ++e) pptm_epi_cols(epi, j_base + 8 * (q0 + qq) + e, n, c[qq][e]);
#pragma unroll
        for (uint32_t h = 0; h < 2; ++h) {
            const uint64_t i = i_base + 8 * h;
            if (i >= m) continue;
            const uint64_t gi = row0 + i;
#pragma unroll
            for (uint32_t qq = 0; qq < QC; ++qq) {
                const uint32_t q = q0 + qq;
                const uint64_t j = j_base + 8 * q;
                if (j >= n) continue;
                const float v0 = epi(gi, j, d[4 * q + 2 * h], c[qq][0]);
                if (vec_out) {
                    // n is even and so is j: j + 1 < n too.
                    const float v1 = epi(gi, j + 1, d[4 * q + 2 * h + 1], c[qq][1]);
                    *reinterpret_cast<float2*>(out + gi * n + j) = make_float2(v0, v1);
                } else {
                    out[gi * n + j] = v0;
                    if (j + 1 < n) out[gi * n + j + 1] = epi(gi, j + 1, d[4 * q + 2 * h + 1], c[qq][1]);
                }
            }
        }
    }
}

// ---- the pattern ----------------------------------------------------------------------------------

// Whether the TMA path can take these operands, whose elements are 16 / `row_unit` bytes and whose
// k advances in slices of `bk`: rows 16-byte aligned (k and n multiples of `row_unit`), sizes within
// TMA's 32-bit coordinates, and enough work to pay for building tensor maps. The bf16/fp16 and the
// E4M3 paths differ only in these two numbers (pptm_wgmma_fits, pptm_wgmma_fp8_fits).
__device__ __forceinline__ bool pptm_wgmma_fits_with(const void* A, const void* W, uint64_t m, uint64_t k, uint64_t n,
                                                     uint64_t row_unit, uint64_t bk) {
    const bool aligned = (reinterpret_cast<uint64_t>(A) & 15u) == 0 && (reinterpret_cast<uint64_t>(W) & 15u) == 0 &&
                         k % row_unit == 0 && n % row_unit == 0;
    // TMA's coordinates are 32-bit, and so are the pattern's counts of tiles and slices (at most
    // (m / 128 + 1) (n / 128 + 1) (k / bk + 1) slices in all).
    const bool small = m < (1ull << 31) && k < (1ull << 31) && n < (1ull << 31) &&
                       (m / 128 + 1) * (n / 128 + 1) < (1ull << 31) && (m / 128 + 1) * (n / 128 + 1) * (k / bk + 1) < (1ull << 32);
    return aligned && small && m != 0 && k != 0 && n != 0 && m * n * k >= (uint64_t)PPTM_WGMMA_FROM;
}

// Whether a batch of products takes the wgmma path: each product at least 128 x 128 outputs (a
// smaller one would leave most of a tile empty; pattern/mma.cuh's 64 x 64 tiles fit it), k whole
// slices of `bk` (so no slice reads into the next product's W), the stacked matrices within
// pptm_wgmma_fits_with, and the batch's counts within 32 bits.
__device__ __forceinline__ bool pptm_wgmma_batched_fits_with(const void* A, const void* W, uint64_t batch, uint64_t m, uint64_t k,
                                                             uint64_t n, uint64_t row_unit, uint64_t bk) {
    if (batch == 0 || m < 128 || n < 128 || k % bk != 0 || batch >= (1ull << 31) || m >= (1ull << 31) || k >= (1ull << 31))
        return false;
    const uint64_t slices = batch * (m / 128 + 1) * (n / 128 + 1) * (k / bk + 1);
    return batch * m < (1ull << 31) && batch * k < (1ull << 31) && slices < (1ull << 32) &&
           pptm_wgmma_fits_with(A, W, batch * m, k, n, row_unit, bk);
}

// bf16 / fp16 operands: 8 elements to 16 bytes, slices of PPTM_WG_BK.
__device__ __forceinline__ bool pptm_wgmma_fits(const void* A, const void* W, uint64_t m, uint64_t k, uint64_t n) {
    return pptm_wgmma_fits_with(A, W, m, k, n, 8, PPTM_WG_BK);
}

__device__ __forceinline__ bool pptm_wgmma_batched_fits(const void* A, const void* W, uint64_t batch, uint64_t m, uint64_t k,
                                                        uint64_t n) {
    return pptm_wgmma_batched_fits_with(A, W, batch, m, k, n, 8, PPTM_WG_BK);
}

// Tile t of a tiles_m x tiles_n grid, row by row. (Grouping tile rows, so a wave of tiles shares
// rows of A and columns of W in L2, measured 1-2 % slower at 8192^3 on an H100: the bound is the
// bytes each SM takes from L2, not DRAM.)
__device__ __forceinline__ void pptm_wg_tile(uint32_t t, uint32_t tiles_n, uint32_t& ti, uint32_t& tj) {
    ti = t / tiles_n;
    tj = t % tiles_n;
}

// BATCHED: `batch` products stacked in A, W and out (pattern/linear.cuh's pptm_matmul_batched),
// their tiles numbered as one product's (tile t of product s is tile s T + t). TMA sees A as one
// (batch m) x k matrix and W as one (batch k) x n: product s's slices are rows s m + i of the first
// and s k + p of the second. A tile's rows past m read the next product's rows of A, whose
// outputs are never stored; k is a whole number of slices (pptm_wgmma_batched_fits), so no slice
// reads into the next product's W.
//
// KS = 2 splits each slice's k between two halves of the block: warpgroups 0 and 1 multiply its
// first 32 of k, 2 and 3 its last 32, into accumulators of the same 64 x N outputs; at the tile's
// end each pair swaps half of its sums through shared memory (XBYTES past the ring's slices), and
// each member stores the half of the columns it kept. For tiles of 128 x 64 on products that 128 x
// 128 tiles cover with half the blocks or fewer (1024^3: 64 tiles, on 132 SMs).
//
// PROMOTE (slices, 0 for none): Hopper's tensor cores add into their f32 accumulators with
// truncation (round toward zero), so over a long k the sums drift toward zero: a kernel-matrix
// product of k = 24,576 (bf16x3, q = 12) came out 1e-4 off, where f32 sums rounded to nearest
// keep 1e-5 (a float32 model of both, in numpy, gives the same two figures). With PROMOTE, the
// accumulators are added into f32 sums (`sum`, rounded to nearest) and cleared every PROMOTE
// slices and at the tile's end, as the fp8 path does every slice. The sums double the
// registers of the accumulators: 128 x 128 tiles only (R = 32).
//
// SPLIT3 (`precision = "bf16x3"`, pptm_matmul_bf16x3 in pattern/mma.cuh): A is the m x 2k matrix
// [A_hi | A_lo] and W the 2k x n' one [W_hi ; W_lo] (k a multiple of the slice, n' = n rounded up
// to 8, zero past n), and the product runs over 3k: its slices take A_hi W_hi, then A_lo W_hi,
// then A_hi W_lo, into the same accumulators (the fourth, A_lo W_lo, is below f32's rounding).
template <class T, uint32_t BM, uint32_t BN, bool BATCHED = false, uint32_t KS = 1, uint32_t PROMOTE = 0, bool SPLIT3 = false,
          class Epi>
__device__ __forceinline__ void pptm_matmul_wgmma_tiled(const T* A, const T* W, uint64_t m, uint64_t k, uint64_t n, const Epi& epi,
                                                        float* out, const pptm_block_ctx& b, uint32_t batch = 1) {
    static_assert(!(SPLIT3 && BATCHED), "wgmma: a split product is not batched");
    constexpr uint32_t WGM = BM / 64, WGN = 4 / (WGM * KS);  // the warpgroups' grid over the tile
    constexpr uint32_t N = BN / WGN, R = N / 2;            // a warpgroup's columns, a thread's accumulators
    constexpr uint32_t A_BYTES = BM * PPTM_WG_BK * 2, STAGE_BYTES = A_BYTES + BN * PPTM_WG_BK * 2;
    static_assert((KS == 1 || KS == 2) && WGM * WGN * KS == 4 && BM % 128 == 0 && BN % 64 == 0 && N % 64 == 0, "wgmma: tile shape");
    static_assert(PROMOTE == 0 || (KS == 1 && R <= 32), "wgmma: promoted sums fit beside 32 accumulators");
    constexpr uint32_t RS = PROMOTE == 0 ? 1 : R;  // the promoted sums (one unused without)
    constexpr uint32_t KK = PPTM_WG_BK / 16 / KS;                  // a warpgroup's k16 steps a slice
    constexpr uint32_t XBYTES = KS == 1 ? 0 : 4 * 128 * (R / 2) * 4;  // the swapped halves
    constexpr uint32_t S = (PPTM_WG_RING_BYTES - XBYTES) / STAGE_BYTES;
    static_assert(S >= 3 && S * STAGE_BYTES + XBYTES <= PPTM_WG_RING_BYTES && STAGE_BYTES % 1024 == 0, "wgmma: the slice ring");
    uint8_t* const base = reinterpret_cast<uint8_t*>((reinterpret_cast<uint64_t>(pptm_dynamic_smem()) + 1023) & ~(uint64_t)1023);
    uint64_t* const bars = reinterpret_cast<uint64_t*>(base + PPTM_WG_RING_BYTES);  // full[S], empty[S]
    uint64_t* const maps = reinterpret_cast<uint64_t*>(base + PPTM_WG_RING_BYTES + 512);
    const uint32_t smem0 = pptm_smem_addr(base);
    const uint32_t full0 = pptm_smem_addr(bars), empty0 = full0 + 8 * S;
    uint32_t smid;
    asm("mov.u32 %0, %%smid;" : "=r"(smid));
    uint64_t(*const slot)[16] = pptm_tmap_slot[smid & 255u];
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // kh: which half of each slice's k this warpgroup multiplies (KS = 2).
    const uint32_t wg = warp / 4, kh = KS == 1 ? 0 : wg / (WGM * WGN), wm = (KS == 1 ? wg : wg % (WGM * WGN)) / WGN, wn = wg % WGN;

    // Every reader and writer of this shared memory before the pattern (an earlier item's) is done.
    __syncthreads();
    if (threadIdx.x == 0) {
        for (uint32_t s = 0; s < S; ++s) {
            pptm_mbar_init(full0 + 8 * s, 1);
            pptm_mbar_init(empty0 + 8 * s, PPTM_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        // Generic-proxy writes to these bytes (an earlier pattern's) come before TMA's.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    if (warp == 0) {
        if constexpr (SPLIT3)
            pptm_tmap_build(2 * pptm_wg_type<T>::index, 2 * pptm_wg_type<T>::index + 1, 2, A, m, 2 * k, W, 2 * k, (n + 7) & ~7ull, maps, slot);
        else
            pptm_tmap_build(2 * pptm_wg_type<T>::index, 2 * pptm_wg_type<T>::index + 1, 2, A, BATCHED ? batch * m : m, k, W, BATCHED ? batch * k : k, n, maps,
                            slot);
    }
    __syncthreads();

    // 32-bit counts (pptm_wgmma_fits bounds them): a 64-bit division is a function call, and a
    // call between a wgmma and its wait makes ptxas serialize every wgmma of the kernel.
    const uint32_t tiles_m = (uint32_t)(m / BM + (m % BM != 0)), tiles_n = (uint32_t)(n / BN + (n % BN != 0));
    const uint32_t per_product = tiles_m * tiles_n;
    const uint32_t tiles = BATCHED ? per_product * batch : per_product;
    const uint32_t kslices = (uint32_t)(k / PPTM_WG_BK + (k % PPTM_WG_BK != 0));  // of one split part
    const uint32_t ktiles = SPLIT3 ? 3 * kslices : kslices;
    const uint32_t mine = b.block < tiles ? (tiles - b.block + b.nblocks - 1) / b.nblocks : 0;
    const uint32_t total = mine * ktiles;  // this block's slices, over all its tiles

    // Thread 0 issues slice p: waits for its buffer's previous slice (p - S) to be released.
    auto produce = [&](uint32_t p) {
        const uint32_t s = (uint32_t)(p % S);
        if (p >= S) pptm_mbar_wait(empty0 + 8 * s, (uint32_t)((p / S - 1) & 1));
        uint32_t ti, tj;
        const uint32_t tile = b.block + (p / ktiles) * b.nblocks;
        const uint32_t prod = BATCHED ? tile / per_product : 0;  // its product
        pptm_wg_tile(tile - prod * per_product, tiles_n, ti, tj);
        const int32_t i0 = (int32_t)(prod * (uint32_t)m + ti * BM), j0 = (int32_t)(tj * BN);
        int32_t k0 = (int32_t)(p % ktiles * PPTM_WG_BK), kw0 = (int32_t)(prod * (uint32_t)k) + k0;
        if constexpr (SPLIT3) {
            // Part 0: A_hi W_hi, 1: A_lo W_hi, 2: A_hi W_lo; the lo halves start k into A's rows
            // and k rows into W.
            const uint32_t kt = p % ktiles, part = kt / kslices, at = (kt - part * kslices) * PPTM_WG_BK;
            k0 = (int32_t)(at + (part == 1 ? (uint32_t)k : 0u));
            kw0 = (int32_t)(at + (part == 2 ? (uint32_t)k : 0u));
        }
        const uint32_t dst = smem0 + s * STAGE_BYTES, bar = full0 + 8 * s;
        pptm_mbar_expect_tx(bar, STAGE_BYTES);
#pragma unroll
        for (uint32_t r = 0; r < BM / 128; ++r) pptm_tma_load_2d(dst + r * PPTM_WG_A_BOX_BYTES, slot[0], k0, i0 + 128 * (int32_t)r, bar);
#pragma unroll
        for (uint32_t q = 0; q < BN / 64; ++q) pptm_tma_load_2d(dst + A_BYTES + q * PPTM_WG_W_BOX_BYTES, slot[1], j0 + 64 * (int32_t)q, kw0, bar);
    };
    if (threadIdx.x == 0) {
        pptm_tmap_acquire(slot[0]);
        pptm_tmap_acquire(slot[1]);
        for (uint32_t p = 0; p + 1 < S && p < total; ++p) produce(p);
    }

    float d[R], sum[RS];
    uint32_t g = 0;         // slices consumed so far, over this block's tiles
    uint32_t released = 0;  // slices this warp has released (its lane 0 arrived on `empty`)
    auto release_below = [&](uint32_t end) {
        for (; released < end; ++released)
            if (lane == 0) pptm_mbar_arrive(empty0 + 8 * (uint32_t)(released % S));
    };
    for (uint32_t tile = b.block; tile < tiles; tile += b.nblocks) {
        pptm_tick(b);
#pragma unroll
        for (uint32_t e = 0; e < R; ++e) d[e] = 0.0f;
        if constexpr (PROMOTE != 0) {
#pragma unroll
            for (uint32_t e = 0; e < RS; ++e) sum[e] = 0.0f;
        }
        pptm_wg_fence_operands(d);
        for (uint32_t kt = 0; kt < ktiles; ++kt, ++g) {
            const uint32_t s = (uint32_t)(g % S);
            pptm_mbar_wait(full0 + 8 * s, (uint32_t)((g / S) & 1));
            const uint32_t a_addr = smem0 + s * STAGE_BYTES + wm * 64 * 128;
            const uint32_t w_addr = smem0 + s * STAGE_BYTES + A_BYTES + wn * (N / 64) * PPTM_WG_W_BOX_BYTES;
            pptm_wg_fence();
#pragma unroll
            for (uint32_t q = 0; q < KK; ++q) {
                const uint32_t kk = kh * KK + q;
                // A: 128-byte rows, 8-row atoms 1024 bytes apart (stride); k16 is 32 bytes along the
                // row. W: 64-column boxes PPTM_WG_W_BOX_BYTES apart (leading), 8-row atoms 1024
                // apart (stride); k16 is 16 rows, 2048 bytes.
                pptm_wgmma<T, N>::run(d, pptm_wg_desc(a_addr + 32 * kk, 16, 1024),
                                      pptm_wg_desc(w_addr + 2048 * kk, PPTM_WG_W_BOX_BYTES, 1024));
            }
            pptm_wg_commit();
            pptm_wg_fence_operands(d);
            // The slice before this one has been read by this warp's tensor-core work.
            pptm_wg_wait<1>();
            pptm_wg_fence_operands(d);
            release_below(g);
            if (threadIdx.x == 0 && g + S - 1 < total) produce(g + S - 1);
            __syncwarp();
            if constexpr (PROMOTE != 0) {
                if ((kt + 1) % PROMOTE == 0 && kt + 1 < ktiles) {
                    // Every slice so far is multiplied: add the accumulators into the sums and
                    // start them again from zero.
                    pptm_wg_wait<0>();
                    pptm_wg_fence_operands(d);
#pragma unroll
                    for (uint32_t e = 0; e < R; ++e) {
                        sum[e] += d[e];
                        d[e] = 0.0f;
                    }
                    pptm_wg_fence_operands(d);
                }
            }
        }
        pptm_wg_wait<0>();
        pptm_wg_fence_operands(d);
        release_below(g);
        if constexpr (PROMOTE != 0) {
#pragma unroll
            for (uint32_t e = 0; e < R; ++e) d[e] += sum[e];
        }
        if (out == nullptr) continue;
        uint32_t ti, tj;
        const uint32_t prod = BATCHED ? tile / per_product : 0;
        pptm_wg_tile(tile - prod * per_product, tiles_n, ti, tj);
        // Product prod's rows of the stacked output.
        const uint64_t row0 = (uint64_t)prod * m, i0 = (uint64_t)ti * BM + 64 * wm, j0 = (uint64_t)tj * BN + N * wn;
        if constexpr (KS == 1) {
            pptm_wg_store<N>(d, epi, out, m, n, row0, i0, j0);
        } else {
            // Accumulators [0, H) are the first N / 2 columns. kh 0 keeps them and sends the rest;
            // kh 1 the reverse. The swap area is [warpgroup][H][128 threads]: a warp's writes and
            // reads are 32 consecutive words. The first barrier orders this tile's writes after
            // every read of the previous tile's; the second, the reads after the writes. (Branches
            // on kh, not an index computed from it, keep d in registers.)
            constexpr uint32_t H = R / 2;
            float* const swap = reinterpret_cast<float*>(base + S * STAGE_BYTES);
            const uint32_t t = threadIdx.x % 128;
            __syncthreads();
            float* const mine = swap + wg * H * 128;
            if (kh == 0) {
#pragma unroll
                for (uint32_t e = 0; e < H; ++e) mine[e * 128 + t] = d[H + e];
            } else {
#pragma unroll
                for (uint32_t e = 0; e < H; ++e) mine[e * 128 + t] = d[e];
            }
            __syncthreads();
            const float* const theirs = swap + (wg ^ (WGM * WGN)) * H * 128;
            float h[H];
            if (kh == 0) {
#pragma unroll
                for (uint32_t e = 0; e < H; ++e) h[e] = d[e] + theirs[e * 128 + t];
            } else {
#pragma unroll
                for (uint32_t e = 0; e < H; ++e) h[e] = d[H + e] + theirs[e * 128 + t];
            }
            pptm_wg_store<N / 2>(h, epi, out, m, n, row0, i0, j0 + kh * (N / 2));
        }
    }
    // Every barrier's phases are complete (each slice was waited for and released); retire them so
    // the bytes may serve another pattern.
    __syncthreads();
    if (threadIdx.x == 0)
        for (uint32_t s = 0; s < 2 * S; ++s) pptm_mbar_inval(full0 + 8 * s);
}

// Rounds of `tiles` over the blocks times a tile's time per unit of k, in twentieths of a 256 x 192
// tile's: what a tile shape takes for a product that k does not make short. 32-bit counts
// (pptm_wgmma_fits bounds the tiles of 128 x 128 below 2^31): a 64-bit division is a call.
__device__ __forceinline__ uint32_t pptm_wg_cost(uint64_t m, uint64_t n, uint32_t bm, uint32_t bn, uint32_t per_k, uint32_t nblocks) {
    const uint32_t tiles = (uint32_t)((m / bm + (m % bm != 0)) * (n / bn + (n % bn != 0)));
    return (tiles / nblocks + (tiles % nblocks != 0)) * per_k;
}

// The tile that finishes soonest by pptm_wg_cost. Per unit of k, against a 256 x 192 tile (the
// fewest bytes from L2 per product), a 256 x 128 tile takes 0.8, 128 x 128 0.65 and the 128 x 64
// split one (KS = 2) 0.5: bench/probes/wgmma_probe.cu on an H200, 256 x 192 / 256 x 128 /
// 128 x 128 / split: 8192^3 in 11 / 16 / 32 / 63 rounds took 1679 / 2036 / 3195 / 4600 us, 4096^3
// in 3 / 4 / 8 / 16 rounds 226 / 228 / 391 / 598. Ties go to the larger tile. So 1024^3 takes the
// split tile (one round of 128: 18.7 us against 22.3 for 128 x 128), 1536^3 to 2048^3 256 x 128
// (one round; 2048^3 40.8 us against 49.0 for 88 tiles of 256 x 192), 3072^3 up 256 x 192.
//
// PROMOTE (`accumulate = "promoted"`): 128 x 128 tiles whose accumulators are added into f32 sums
// every 8 slices (512 of k), the only shape with registers for the sums. A k of 512 or less is
// one such run: the accumulators are the sums already, and the tile is chosen as without.
//
// SPLIT3: a bf16x3 product's split operands (pptm_matmul_wgmma_tiled), k one part's.
template <class T, bool PROMOTE = false, bool SPLIT3 = false, class Epi>
__device__ __forceinline__ void pptm_matmul_wgmma(const T* A, const T* W, uint64_t m, uint64_t k, uint64_t n, const Epi& epi,
                                                  float* out, const pptm_block_ctx& b) {
    if constexpr (PROMOTE) {
        if ((SPLIT3 ? 3 * k : k) > 8 * PPTM_WG_BK) {
            pptm_matmul_wgmma_tiled<T, 128, 128, false, 1, 8, SPLIT3>(A, W, m, k, n, epi, out, b);
            return;
        }
    }
    const uint32_t large = pptm_wg_cost(m, n, 256, 192, 20, b.nblocks), wide = pptm_wg_cost(m, n, 256, 128, 16, b.nblocks);
    const uint32_t square = pptm_wg_cost(m, n, 128, 128, 13, b.nblocks), split = pptm_wg_cost(m, n, 128, 64, 10, b.nblocks);
    if (large <= wide && large <= square && large <= split)
        pptm_matmul_wgmma_tiled<T, 256, 192, false, 1, 0, SPLIT3>(A, W, m, k, n, epi, out, b);
    else if (wide <= square && wide <= split)
        pptm_matmul_wgmma_tiled<T, 256, 128, false, 1, 0, SPLIT3>(A, W, m, k, n, epi, out, b);
    else if (square <= split)
        pptm_matmul_wgmma_tiled<T, 128, 128, false, 1, 0, SPLIT3>(A, W, m, k, n, epi, out, b);
    else
        pptm_matmul_wgmma_tiled<T, 128, 64, false, 2, 0, SPLIT3>(A, W, m, k, n, epi, out, b);
}

template <class T, class Epi>
__device__ __forceinline__ void pptm_matmul_wgmma_batched(uint64_t batch, const T* A, const T* W, uint64_t m, uint64_t k,
                                                          uint64_t n, const Epi& epi, float* out, const pptm_block_ctx& b) {
    // 256 x 192 tiles where they fill the blocks and cover a product with at most 1/8 more area
    // than 128 x 128 ones (a 128 x 128 product in a 256 x 192 tile ran at a third of the rate).
    // (Batched products are short in k, and a tile's time is then not pptm_wg_cost's.)
    const uint64_t large = (m / 256 + (m % 256 != 0)) * (n / 192 + (n % 192 != 0));
    const uint64_t small = (m / 128 + (m % 128 != 0)) * (n / 128 + (n % 128 != 0));
    if (batch * large >= b.nblocks && large * 256 * 192 <= small * 128 * 128 + small * 128 * 128 / 8)
        pptm_matmul_wgmma_tiled<T, 256, 192, true>(A, W, m, k, n, epi, out, b, (uint32_t)batch);
    else
        pptm_matmul_wgmma_tiled<T, 128, 128, true>(A, W, m, k, n, epi, out, b, (uint32_t)batch);
}

// ---- fp8 (E4M3) operands --------------------------------------------------------------------------
//
// Hopper's e4m3 wgmma takes both operands K-major (rows of k), and W (k x n, row-major) is not: its
// slices land as TMA writes them (128 rows of k, 128 bytes of n each, 128-byte swizzled), and the
// block transposes each into a K-major copy (128 rows of n, 128 bytes of k, swizzled as TMA would
// have) that the tensor cores read. A is K-major already. A slice is 128 of k: one 128-byte row.
// The transpose is 4 x 4 bytes a step (four 32-bit loads, eight byte permutes, four stores), each
// warp's 32 steps placed so both its loads and its stores touch 32 different banks. Each warp
// transposes its part of slice g + 1 while the tensor cores multiply slice g.
//
// Accumulation: the fp8 MMA adds into its accumulators with fewer mantissa bits than f32 (about
// 13, as the SageAttention2 and DeepSeek-V3 papers measured), so its rounding would grow with k.
// Each slice's product (128 of k) goes into a fresh accumulator (scale-d 0), which is waited for
// and added to an f32 sum. (Two accumulators taking turns, the older added while the newer runs,
// made ptxas serialize every wgmma, its C7514 notice: it does not see that wait_group 1 retires
// the older.)
//
// Tiles of 128 x 128, the four warpgroups 2 x 2 (64 x 64 each). Shared memory: S slices of A and
// raw W (32 KiB each) and three transposed copies of W (16 KiB each). No block-wide barrier in the
// loop: mbarriers say when a copy is whole (`ready`, an arrival from each warp once its part is
// written) and when every warpgroup is done reading it (`freed`, an arrival from each warp after
// its wait), so a warpgroup that has added its sum issues its next slice at once, while the tensor
// cores still run the others' (a block-wide barrier each slice left them idle between slices:
// 8192^3 at 2.77 ms on an H100).

#define PPTM_WG8_BOX (128 * 128)

// d (64 x 64 f32) = [d +] A (64 x 32, K-major) B (32 x 64, K-major), E4M3 operands.
template <bool ACCUMULATE>
__device__ __forceinline__ void pptm_wgmma_e4m3_n64(float (&d)[32], uint64_t a, uint64_t b) {
    if constexpr (ACCUMULATE)
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {" PPTM_WG_R32 "}, %32, %33, 1, 1, 1;"
                     : PPTM_WG_D32
                     : "l"(a), "l"(b));
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {" PPTM_WG_R32 "}, %32, %33, 0, 1, 1;"
                     : PPTM_WG_D32
                     : "l"(a), "l"(b));
}

// E4M3 operands: 16 bytes are 16 elements, slices of 128.
__device__ __forceinline__ bool pptm_wgmma_fp8_fits(const void* A, const void* W, uint64_t m, uint64_t k, uint64_t n) {
    return pptm_wgmma_fits_with(A, W, m, k, n, 16, 128);
}

// This thread's share of a W slice's transpose: raw (128 rows of k, 128 bytes of n, swizzled) into
// t (128 rows of n, 128 bytes of k, swizzled), both shared-memory addresses 1024-byte aligned.
// Byte (r, c) of either sits at (128 r + c) ^ ((r % 8) 16): the row's low bits select which 16-byte
// piece of it holds c. Lane (a, b) = (lane / 4, lane % 4) of warp w moves, for x = 2 w + it, the
// 4 x 4 block at rows k0 = 16 (a ^ x / 4) + 4 (b ^ x % 4), columns n0 = 16 a + 4 b: its loads' banks
// are 4 (a ^ f(b)) + b, its stores' 4 (a ^ x / 4 ^ g(b)) + (b ^ x % 4), 32 different ones a warp.
// A block's four rows start at r0 with r0 % 8 = 0 or 4, so row r0 + i sits at (r0's address ^ 16 i)
// + 128 i: one XOR an access, the rest in the instruction's offset. (With 64-bit generic
// addresses computed for each access, the integer pipe was the busiest and bounded the product.)
__device__ __forceinline__ void pptm_fp8_transpose_slice(uint32_t raw, uint32_t t) {
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, a = lane / 4, b = lane % 4;
    static_assert(PPTM_WARPS * 2 == 32, "fp8 wgmma: 16 warps, two blocks of each of the 32 placements");
#pragma unroll
    for (uint32_t it = 0; it < 2; ++it) {
        const uint32_t x = 2 * warp + it, ka = a ^ (x / 4), kb = b ^ (x % 4);
        const uint32_t k0 = 16 * ka + 4 * kb, n0 = 16 * a + 4 * b;
        const uint32_t ld0 = raw + ((128 * k0 + n0) ^ ((k0 & 7) << 4)), st0 = t + ((128 * n0 + k0) ^ ((n0 & 7) << 4));
        uint32_t r[4];
#pragma unroll
        for (uint32_t i = 0; i < 4; ++i)
            asm volatile("ld.shared.b32 %0, [%1];" : "=r"(r[i]) : "r"((ld0 ^ (16 * i)) + 128 * i) : "memory");
        // r[i] holds row k0 + i, columns n0 .. n0 + 3; o[j] holds row n0 + j, columns k0 .. k0 + 3.
        const uint32_t t0 = __byte_perm(r[0], r[1], 0x5140), t1 = __byte_perm(r[0], r[1], 0x7362);
        const uint32_t t2 = __byte_perm(r[2], r[3], 0x5140), t3 = __byte_perm(r[2], r[3], 0x7362);
        const uint32_t o[4] = {__byte_perm(t0, t2, 0x5410), __byte_perm(t0, t2, 0x7632), __byte_perm(t1, t3, 0x5410),
                               __byte_perm(t1, t3, 0x7632)};
#pragma unroll
        for (uint32_t j = 0; j < 4; ++j)
            asm volatile("st.shared.b32 [%0], %1;" ::"r"((st0 ^ (16 * j)) + 128 * j), "r"(o[j]) : "memory");
    }
}

// BATCHED: `batch` products stacked in A, W and out, as pptm_matmul_wgmma_tiled takes them (k a
// whole number of slices: pptm_wgmma_fp8_batched_fits).
template <bool BATCHED = false, class Epi>
__device__ __forceinline__ void pptm_matmul_wgmma_fp8(const pptm_e4m3* A, const pptm_e4m3* W, uint64_t m, uint64_t k, uint64_t n,
                                                      const Epi& epi, float* out, const pptm_block_ctx& b, uint32_t batch = 1) {
    constexpr uint32_t BM = 128, BN = 128, BK = 128, N = 64, R = 32;
    constexpr uint32_t STAGE_BYTES = 2 * PPTM_WG8_BOX;  // A's slice, then W's as it landed
    constexpr uint32_t S = (PPTM_WG_RING_BYTES - 3 * PPTM_WG8_BOX) / STAGE_BYTES;
    static_assert(S >= 3 && S * STAGE_BYTES + 3 * PPTM_WG8_BOX <= PPTM_WG_RING_BYTES, "fp8 wgmma: the slice ring");
    uint8_t* const base = reinterpret_cast<uint8_t*>((reinterpret_cast<uint64_t>(pptm_dynamic_smem()) + 1023) & ~(uint64_t)1023);
    uint8_t* const wt = base + S * STAGE_BYTES;  // the three transposed copies of W
    // full[S], empty[S], ready[3], freed[3]
    uint64_t* const bars = reinterpret_cast<uint64_t*>(base + PPTM_WG_RING_BYTES);
    uint64_t* const maps = reinterpret_cast<uint64_t*>(base + PPTM_WG_RING_BYTES + 512);
    const uint32_t smem0 = pptm_smem_addr(base), wt0 = pptm_smem_addr(wt);
    const uint32_t full0 = pptm_smem_addr(bars), empty0 = full0 + 8 * S, ready0 = empty0 + 8 * S, freed0 = ready0 + 24;
    static_assert(8 * (2 * S + 6) <= 512, "fp8 wgmma: the barriers fit before the tensor maps");
    uint32_t smid;
    asm("mov.u32 %0, %%smid;" : "=r"(smid));
    uint64_t(*const slot)[16] = pptm_tmap_slot[smid & 255u];
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t wg = warp / 4, wm = wg / 2, wn = wg % 2;

    // Every reader and writer of this shared memory before the pattern (an earlier item's) is done.
    __syncthreads();
    if (threadIdx.x == 0) {
        for (uint32_t s = 0; s < S; ++s) {
            pptm_mbar_init(full0 + 8 * s, 1);
            pptm_mbar_init(empty0 + 8 * s, PPTM_WARPS);
        }
        for (uint32_t c = 0; c < 3; ++c) {
            pptm_mbar_init(ready0 + 8 * c, PPTM_WARPS);
            pptm_mbar_init(freed0 + 8 * c, PPTM_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    if (warp == 0)
        pptm_tmap_build(PPTM_WG_TEMPLATE_E4M3, PPTM_WG_TEMPLATE_E4M3, 1, A, BATCHED ? batch * m : m, k, W, BATCHED ? batch * k : k, n, maps,
                        slot);
    __syncthreads();

    const uint32_t tiles_m = (uint32_t)(m / BM + (m % BM != 0)), tiles_n = (uint32_t)(n / BN + (n % BN != 0));
    const uint32_t per_product = tiles_m * tiles_n, tiles = BATCHED ? per_product * batch : per_product;
    const uint32_t ktiles = (uint32_t)(k / BK + (k % BK != 0));
    const uint32_t mine = b.block < tiles ? (tiles - b.block + b.nblocks - 1) / b.nblocks : 0;
    const uint32_t total = mine * ktiles;  // this block's slices, over all its tiles

    // Thread 0 issues slice p into buffer p % S once every warp has released slice p - S.
    // (It issues slice g + S - 1 after multiplying slice g: the buffer of slice g - 1, which every
    // warp has released by then or nearly. Waiting for slice g's own release held warpgroup 0's
    // next wgmma until every warpgroup had finished slice g, and the tensor cores ran dry.)
    auto produce = [&](uint32_t p) {
        const uint32_t s = p % S;
        if (p >= S) pptm_mbar_wait(empty0 + 8 * s, (p / S - 1) & 1);
        uint32_t ti, tj;
        const uint32_t tile = b.block + (p / ktiles) * b.nblocks, prod = BATCHED ? tile / per_product : 0;
        pptm_wg_tile(tile - prod * per_product, tiles_n, ti, tj);
        const int32_t i0 = (int32_t)(prod * (uint32_t)m + ti * BM), j0 = (int32_t)(tj * BN), k0 = (int32_t)(p % ktiles * BK);
        const uint32_t dst = smem0 + s * STAGE_BYTES, bar = full0 + 8 * s;
        pptm_mbar_expect_tx(bar, STAGE_BYTES);
        pptm_tma_load_2d(dst, slot[0], k0, i0, bar);
        pptm_tma_load_2d(dst + PPTM_WG8_BOX, slot[1], j0, (int32_t)(prod * (uint32_t)k) + k0, bar);
    };
    if (threadIdx.x == 0) {
        pptm_tmap_acquire(slot[0]);
        pptm_tmap_acquire(slot[1]);
        for (uint32_t p = 0; p + 1 < S && p < total; ++p) produce(p);
    }

    // This warp's part of slice p's W, transposed into copy p % 3 once its bytes have landed and
    // every warpgroup is done with slice p - 3 (which read that copy); then the warp says so.
    auto transpose = [&](uint32_t p) {
        const uint32_t s = p % S, c = p % 3;
        if (p >= 3) pptm_mbar_wait(freed0 + 8 * c, (p / 3 - 1) & 1);
        pptm_mbar_wait(full0 + 8 * s, (p / S) & 1);
        pptm_fp8_transpose_slice(smem0 + s * STAGE_BYTES + PPTM_WG8_BOX, wt0 + c * PPTM_WG8_BOX);
        // The copy's bytes (generic proxy writes) are visible to the tensor cores (async proxy)
        // of whoever acquires `ready`.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncwarp();
        if (lane == 0) pptm_mbar_arrive(ready0 + 8 * c);
    };
    if (total > 0) transpose(0);

    float sum[R], acc[R];
#pragma unroll
    for (uint32_t e = 0; e < R; ++e) acc[e] = 0.0f;  // (scale-d 0 ignores them; defined all the same)
    uint32_t g = 0;  // slices multiplied so far, over this block's tiles
    for (uint32_t tile = b.block; tile < tiles; tile += b.nblocks) {
        pptm_tick(b);
#pragma unroll
        for (uint32_t e = 0; e < R; ++e) sum[e] = 0.0f;
        for (uint32_t kt = 0; kt < ktiles; ++kt, ++g) {
            const uint32_t s = g % S, c = g % 3;
            pptm_mbar_wait(ready0 + 8 * c, (g / 3) & 1);
            const uint32_t a_addr = smem0 + s * STAGE_BYTES + wm * 64 * 128;
            const uint32_t b_addr = wt0 + c * PPTM_WG8_BOX + wn * 64 * 128;
            pptm_wg_fence_operands(acc);
            pptm_wg_fence();
            // 128-byte rows, 8-row atoms 1024 bytes apart; k32 is 32 bytes along the row.
            pptm_wgmma_e4m3_n64<false>(acc, pptm_wg_desc(a_addr, 16, 1024), pptm_wg_desc(b_addr, 16, 1024));
#pragma unroll
            for (uint32_t kk = 1; kk < BK / 32; ++kk)
                pptm_wgmma_e4m3_n64<true>(acc, pptm_wg_desc(a_addr + 32 * kk, 16, 1024),
                                          pptm_wg_desc(b_addr + 32 * kk, 16, 1024));
            pptm_wg_commit();
            pptm_wg_fence_operands(acc);
            // Slice g + 1 (this tile's or the next one's) is transposed meanwhile, into the copy
            // slice g - 2 read: every warpgroup finished that one before slice g could be issued.
            if (g + 1 < total) transpose(g + 1);
            pptm_wg_wait<0>();
            pptm_wg_fence_operands(acc);
#pragma unroll
            for (uint32_t e = 0; e < R; ++e) sum[e] += acc[e];
            // Slice g is done with: its copy of W read, its A multiplied, its raw W transposed
            // (a slice ago).
            __syncwarp();
            if (lane == 0) {
                pptm_mbar_arrive(freed0 + 8 * c);
                pptm_mbar_arrive(empty0 + 8 * s);
            }
            if (threadIdx.x == 0 && g + S - 1 < total) produce(g + S - 1);
            __syncwarp();
        }
        if (out == nullptr) continue;
        uint32_t ti, tj;
        const uint32_t prod = BATCHED ? tile / per_product : 0;
        pptm_wg_tile(tile - prod * per_product, tiles_n, ti, tj);
        pptm_wg_store<N>(sum, epi, out, m, n, (uint64_t)prod * m, (uint64_t)ti * BM + 64 * wm, (uint64_t)tj * BN + N * wn);
    }
    // Every barrier's arrivals are in (each slice was transposed, multiplied and released); retire
    // them so the bytes may serve another pattern.
    __syncthreads();
    if (threadIdx.x == 0)
        for (uint32_t x = 0; x < 2 * S + 6; ++x) pptm_mbar_inval(full0 + 8 * x);
}

__device__ __forceinline__ bool pptm_wgmma_fp8_batched_fits(const void* A, const void* W, uint64_t batch, uint64_t m, uint64_t k,
                                                            uint64_t n) {
    return pptm_wgmma_batched_fits_with(A, W, batch, m, k, n, 16, 128);
}

#endif  // PPTM_WGMMA
#endif  // PPTM_PATTERN_WGMMA_CUH
