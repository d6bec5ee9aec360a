//! The chain IR of pptm, shared by every stage of the data path:
//!
//! | who | uses |
//! |---|---|
//! | `#[derive(FusionBuilder)]` (pptm-macros) | [`parse`] to read the struct, [`lower`] to validate it and lay out its arguments |
//! | build.rs (pptm-codegen) | the same [`parse`] + [`lower`] on the crate's sources, then generates CUDA C from the [`ChainIr`] |
//! | the runtime's CPU backend | [`lower`] + the f64 references in [`ops`] to run a chain on the host |
//!
//! Each op is defined once, in [`ops`]: its signature, its fusion class, the device function that
//! implements it (in `kernels/pptm/ops/`), and its f64 CPU reference.

#![warn(missing_docs)]

mod chain;
mod dtype;
mod lower;
#[cfg(feature = "parse")]
pub mod op_fn;
pub mod ops;
#[cfg(feature = "parse")]
pub mod parse;
pub mod pipeline;

pub use chain::{ChainSpec, Precision, StageSpec, Tolerance};
pub use dtype::DType;
pub use lower::{
    ArgKind, ArgSlot, ArgValue, BindError, Blame, ChainIr, ChainOutput, DimIr, EvalArg, Evaluated,
    MAX_DIM, Pattern, Plan, Shape, Source, SpecError, StageIr, lower, lower_with,
};
pub use ops::{
    Anchor, CpuImpl, ElementFn, FusionClass, Op, OpDef, OpInputs, Param, StateTypes, Table,
    TableCoord, Ty,
};

/// Threads per block of every manifold. The generated PTX is compiled for it
/// (`__launch_bounds__`), and the runtime launches with it.
pub const BLOCK_THREADS: u32 = 512;

/// Argument words in a descriptor (`PPTM_DESC_ARGS` in kernels/pptm/abi.h; the runtime checks
/// the two agree).
pub const DESC_ARGS: usize = 15;

/// How much work one compute block takes in each pass pattern: an item asks for as many blocks as
/// its size needs (at least one, at most the grid), so a small input stays on one block and costs
/// no grid-wide arrival, and a large one spreads over every SM. The device patterns are correct
/// for any block count; these only set how many the host asks for.
pub mod work {
    /// Elements per block of an elementwise (`Map`) pass.
    pub const MAP_ELEMS_PER_BLOCK: usize = 8192;
    /// An elementwise pass of this many steps or more (`repeat = k` counts k) is heavy: it takes
    /// one element per thread (`ChainIr::map_elems_per_block`), as a pass over a state does.
    pub const HEAVY_MAP_STEPS: usize = 8;
    /// Elements per block of a heavy elementwise pass (a state, a table, `HEAVY_MAP_STEPS`
    /// steps or more): a quarter of a block's threads, so that a few thousand elements spread over
    /// every SM (`pptm_map_each` gives each block an equal run of them, one element a thread).
    pub const HEAVY_ELEMS_PER_BLOCK: usize = 128;
    /// Elements per block of a light elementwise pass that is a step of a pipeline's plan, with
    /// no reduction: one 16-byte chunk a thread. Alone, such an item stays on few blocks (a
    /// multi-block item pays an arrival); in a plan its blocks need not meet at all (a
    /// `PPTM_STEP_LIGHT` step), and a chain of them over the same elements runs block by block.
    /// 170 dependent 4096-element blends: 1.85 µs a step on one block, 1.27 on two (H200,
    /// bench/probes/plan_probe.cu).
    pub const PLAN_MAP_ELEMS_PER_BLOCK: usize = 4 * crate::BLOCK_THREADS as usize;
    /// Output rows per block of a GEMV (16 warps, 4 rows each).
    pub const GEMV_ROWS_PER_BLOCK: usize = 64;
    /// A GEMV of fewer rows than this gives each warp one row (16 a block), for four times the
    /// blocks (`PPTM_GEMV_N_SHORT_BELOW` in the generated code; kernels/pptm/pattern/linear.cuh).
    pub const GEMV_SHORT_BELOW: usize = 8192;
    /// Output rows per block of a GEMV of fewer than `GEMV_SHORT_BELOW` rows.
    pub const GEMV_SHORT_ROWS_PER_BLOCK: usize = 16;
    /// Output rows per block of a GEMV on tensor cores (bf16 or fp8 A): one mma tile of 16 rows,
    /// the block's warps splitting the columns (`PPTM_GEMV_MMA_ROWS`; kernels/pptm/pattern/mma.cuh).
    pub const GEMV_MMA_ROWS: usize = 16;
    /// Output columns per block of a transposed GEMV (a 32-column tile, a lane per column).
    pub const GEMV_T_COLS_PER_BLOCK: usize = 32;
    /// A transposed GEMV of fewer columns than this takes `GEMV_T_NARROW_COLS_PER_BLOCK` columns
    /// a block (four lanes per column), for four times the blocks and a quarter of the rounds
    /// (`PPTM_GEMV_T_NARROW_BELOW` in the generated code; kernels/pptm/pattern/linear.cuh).
    pub const GEMV_T_NARROW_BELOW: usize = 4096;
    /// Output columns per block of a transposed GEMV of fewer than `GEMV_T_NARROW_BELOW` columns.
    pub const GEMV_T_NARROW_COLS_PER_BLOCK: usize = 8;
    /// Output tile edge of a matmul (64 x 64 per block).
    pub const MATMUL_TILE: usize = 64;
    /// A matmul with fewer 64 x 64 tiles than this uses 32 x 32 tiles instead, four times the
    /// blocks (`PPTM_MATMUL_SMALL_BELOW` in the generated code; kernels/pptm/pattern/linear.cuh).
    pub const MATMUL_SMALL_BELOW: usize = 64;
    /// Output tile edge of a small matmul.
    pub const MATMUL_SMALL_TILE: usize = 32;
    /// Output tile edge of a large matmul: 128 x 128 per block, each thread a 4 x 8 micro-tile
    /// (kernels/pptm/pattern/linear.cuh).
    pub const MATMUL_LARGE_TILE: usize = 128;
    /// A matmul with at least this many 128 x 128 tiles (about one a block of an H200 at two
    /// blocks an SM) takes them, where k and n are multiples of 4 (`PPTM_MATMUL_LARGE_FROM` in
    /// the generated code).
    pub const MATMUL_LARGE_FROM: usize = 128;
    /// Rows of a matmul tile on the direct path (kernels/pptm/pattern/linear.cuh): a warp's 32
    /// lanes own an 8 x 16 tile, four adjacent columns each, and the block's warps split k.
    pub const MATMUL_DIRECT_ROWS: usize = 8;
    /// Columns of a matmul tile on the direct path.
    pub const MATMUL_DIRECT_COLS: usize = 16;
    /// An output of at most this many direct tiles (two rounds of an H200's 132 SMs) takes the
    /// direct path: one pass over k split across the warps (a k of up to 256 is one round trip to
    /// L2), so the least fixed cost per tile.
    pub const MATMUL_DIRECT_MAX_TILES: usize = 256;
    /// Output tile of a tensor-core matmul (bf16/fp16 operands, `mma.sync` m16n8k16): 128 rows by
    /// 64 columns, each of a block's 16 warps owning 32 x 16 of it.
    pub const MMA_LARGE_ROWS: usize = 128;
    /// Columns of a large tensor-core matmul tile (see [`MMA_LARGE_ROWS`]).
    pub const MMA_LARGE_COLS: usize = 64;
    /// Output tile edge of a tensor-core matmul whose large tiles would be too few to give every
    /// SM one (64 x 64, each warp owning 16 x 16: twice the blocks).
    pub const MMA_SMALL_TILE: usize = 64;
    /// A tensor-core matmul takes large tiles from this many of them on (`PPTM_MMA_LARGE_FROM`
    /// in the generated code; kernels/pptm/pattern/mma.cuh).
    pub const MMA_LARGE_FROM: usize = 128;
    /// A bf16/fp16 matmul on Hopper takes the TMA + wgmma path from this many multiply-adds
    /// (m n k) on (`PPTM_WGMMA_FROM`); smaller ones stay on mma.sync, whose tiles start sooner.
    pub const WGMMA_FROM: usize = 1 << 24;
    /// Points per block of a pairwise pass (one warp per point).
    pub const PAIRWISE_POINTS_PER_BLOCK: usize = 16;
    /// Rows per block of a row-wise reduction (one warp per row: a pairwise op's points, or the
    /// rows of a matrix).
    pub const ROWS_PER_BLOCK: usize = crate::BLOCK_THREADS as usize / 32;
    /// Most coordinates per point (over every subspace) a pairwise op takes: a block keeps its
    /// warps' own points in shared memory.
    pub const PAIRWISE_MAX_FEATURES: usize = 128;
}

/// Outputs the accuracy guard samples before a guarded stage runs (`PPTM_GUARD_SAMPLES` in the
/// generated code: one warp each; kernels/pptm/pattern/mma.cuh).
pub const GUARD_SAMPLES: usize = 16;

/// Dynamic shared memory a block of a Hopper tensor-core domain's kernels gets when they run as
/// compute_90a (`PPTM_DYNAMIC_SMEM_BYTES`; kernels/pptm/pattern/wgmma.cuh): 224 KiB of operand
/// slices plus 2 KiB for barriers, tensor maps and alignment. More than half an SM's, so one such
/// block an SM.
pub const HOPPER_DYNAMIC_SMEM_BYTES: usize = 224 * 1024 + 2048;

/// The (row, column) of the outputs the accuracy guard samples in an m x n product: sample s is
/// row (2s + 1) m / 32, column (2 (5s mod 16) + 1) n / 32, rows and columns spread over the output,
/// each once. The device computes the same positions (pptm_guard_error in pattern/mma.cuh); the
/// CPU backend uses this to make the same decisions.
pub fn guard_samples(m: usize, n: usize) -> Vec<(usize, usize)> {
    if m == 0 || n == 0 {
        return Vec::new();
    }
    let s2 = 2 * GUARD_SAMPLES;
    (0..GUARD_SAMPLES)
        .map(|s| {
            (
                (2 * s + 1) * m / s2,
                (2 * (5 * s % GUARD_SAMPLES) + 1) * n / s2,
            )
        })
        .collect()
}

/// Opcodes below this are built into every manifold (`PPTM_OP_FIRST_VARIANT` in abi.h).
pub const FIRST_VARIANT_OPCODE: u32 = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_samples_spread_over_the_output_each_row_and_column_once() {
        assert!(guard_samples(0, 5).is_empty());
        assert!(guard_samples(5, 0).is_empty());
        // 32 x 32: rows 1, 3, .., 31 in order; columns the odd numbers too, in the order
        // 2 (5 s mod 16) + 1: 1, 11, 21, 31, 9, ...
        let s = guard_samples(32, 32);
        assert_eq!(s.len(), GUARD_SAMPLES);
        let rows: Vec<usize> = s.iter().map(|p| p.0).collect();
        assert_eq!(rows, (0..16).map(|i| 2 * i + 1).collect::<Vec<_>>());
        let cols: Vec<usize> = s.iter().map(|p| p.1).collect();
        assert_eq!(&cols[..5], &[1, 11, 21, 31, 9]);
        let mut sorted = cols.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, rows, "every odd column once");
        // Scaled: 64 x 320 doubles the rows and multiplies the columns by ten; one row or one
        // column puts every sample there.
        let big = guard_samples(64, 320);
        for (a, b) in s.iter().zip(&big) {
            assert_eq!((2 * a.0, 10 * a.1), *b);
        }
        assert!(guard_samples(1, 7).iter().all(|&(r, c)| r == 0 && c < 7));
        assert!(
            guard_samples(1000, 1)
                .iter()
                .all(|&(r, c)| r < 1000 && c == 0)
        );
        // Uneven sizes round down: sample 15 of 1000 x 7 is row 31 * 1000 / 32, column
        // (2 * (75 mod 16) + 1) * 7 / 32.
        assert_eq!(guard_samples(1000, 7)[15], (968, 5));
    }
}
