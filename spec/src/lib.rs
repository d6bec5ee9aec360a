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

mod chain;
mod lower;
pub mod ops;
#[cfg(feature = "parse")]
pub mod parse;

pub use chain::{ChainSpec, Precision, StageSpec};
pub use lower::{
    ArgKind, ArgSlot, Blame, ChainIr, ChainOutput, Evaluated, Source, SpecError, StageIr, lower,
};
pub use ops::{CpuImpl, FusionClass, Kind, OpDef, Param};

/// Threads per block of every manifold. The generated PTX is compiled for it
/// (`__launch_bounds__`), and the runtime launches with it.
pub const BLOCK_THREADS: u32 = 512;

/// Argument words in a descriptor (`PPTM_DESC_ARGS` in kernels/pptm/abi.h; the runtime checks
/// the two agree).
pub const DESC_ARGS: usize = 15;

/// Elements one compute block takes in a fused pass. An item over `n` elements runs on
/// `ceil(n / ELEMS_PER_BLOCK)` blocks (at least one, at most the grid): a small input stays on one
/// block, so it costs no grid-wide arrival; a large one spreads over every SM.
pub const ELEMS_PER_BLOCK: usize = 8192;

/// Opcodes below this are built into every manifold (`PPTM_OP_FIRST_VARIANT` in abi.h).
pub const FIRST_VARIANT_OPCODE: u32 = 16;
