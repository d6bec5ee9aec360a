//! The chain IR that lowering produces: stages, the descriptor's argument layout, the fusion
//! plan. Plain data, kept apart from the code that builds it ([`super::lower`]) and the code
//! that binds and runs it (`bind`, `eval`).

use crate::ops::OpDef;
use crate::{DType, Precision};

/// Where a value a stage reads comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The chain argument in this descriptor slot.
    Arg(usize),
    /// The output of the stage at this position in data-flow order.
    Stage(usize),
}

/// What a descriptor argument word holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    /// Device address of an input buffer (its shape is [`ArgSlot::shape`], its element type
    /// [`ArgSlot::dtype`]).
    Input,
    /// Device address of the f32 output buffer.
    Output,
    /// An f32 passed by value (its bits in the low half of the word).
    F32,
    /// A u32 passed by value.
    U32,
    /// The size of one of the chain's dimensions ([`ArgSlot::dim`]).
    Len,
    /// The accuracy guard's level for this submission, filled in by the runtime (never a `submit`
    /// parameter): 0 runs the guarded stage in its declared precision after a sampled check, and
    /// in the next precision up when the check fails; 1 runs the next precision up at once (the
    /// shape fell back before). Present when a stage declares `tolerance`.
    Guard,
    /// Device address of working memory the runtime lends the item (never a `submit`
    /// parameter), at least [`ChainIr::scratch_bytes`] long; 0 where it lends none (the launched
    /// variants), and the stage then runs in f32 on CUDA cores. Present when a stage is a
    /// `precision = "bf16x3"` product: its operands' bf16 halves go there.
    Scratch,
}

/// One argument word of the chain's descriptor, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgSlot {
    /// The argument's name: the op parameter's (or its `args(...)` rename), `out`, a dimension's
    /// name, or `guard_level`; unique within the chain.
    pub name: String,
    /// What the word holds.
    pub kind: ArgKind,
    /// For buffers: the chain dimensions of the buffer, outermost first (row-major).
    pub shape: Vec<usize>,
    /// For [`ArgKind::Len`]: which chain dimension.
    pub dim: Option<usize>,
    /// For buffers: the element type ([`DType::F32`] but for the matrix operands of a bf16/fp16
    /// tensor-core stage). [`DType::F32`] for the other slots.
    pub dtype: DType,
    /// For buffers: values per element, interleaved (element i's values at `i * channels ..`).
    /// 1 but for a state of several fields (`#[derive(pptm::State)]`) that a chain reads as its
    /// flow or writes as its output. 1 for the other slots.
    pub channels: u8,
}

/// One dimension of a chain (a size shared by the buffers and stages that use it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DimIr {
    /// The op letter it was first bound to (`n`, `m`, `rows`...), given a `_len` or number
    /// suffix where an argument already has that name.
    pub name: String,
    /// The descriptor slot that carries its size.
    pub slot: usize,
    /// The one-dimensional buffer argument whose length gives the size at submission; `None`
    /// when no buffer has exactly this shape, and the caller passes the size.
    pub inferred_from: Option<usize>,
}

/// What a submitted chain hands back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainOutput {
    /// A scalar, returned in the completion entry (the chain ends in a reduction).
    Scalar,
    /// A tensor written to the `out` argument.
    Vector,
}

/// The shape of the value a stage produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// A row-major tensor over these chain dimensions, `channels` values per element.
    Tensor {
        /// Indices into [`ChainIr::dims`], outermost first.
        dims: Vec<usize>,
        /// Values per element, interleaved: 1 but downstream of a multi-channel pairwise op
        /// (`RadiusCount` of `SubspaceDistances` gives 3 counts per point).
        channels: u8,
    },
    /// One value per pair of the points of this dimension (never stored).
    Pairs {
        /// The points' dimension, an index into [`ChainIr::dims`].
        dim: usize,
        /// Values per pair (`SubspaceDistances` gives 3).
        channels: u8,
    },
    /// One value.
    Scalar,
}

impl Shape {
    /// Values per element (1 for a scalar).
    pub fn channels(&self) -> u8 {
        match self {
            Shape::Tensor { channels, .. } | Shape::Pairs { channels, .. } => *channels,
            Shape::Scalar => 1,
        }
    }
}

/// One stage after lowering.
#[derive(Debug, Clone)]
pub struct StageIr {
    /// The struct field that declared the stage (documentation only).
    pub field: String,
    /// The `n` of `#[stage(n)]` (shared by every step of a `repeat = k` stage).
    pub number: u32,
    /// The op the stage runs, from the catalog or the user's own.
    pub op: &'static OpDef,
    /// `precision = "..."`, [`Precision::Fp32`] if not written.
    pub precision: Precision,
    /// `tensor_eligible = true`: the op's tensor-core path runs it.
    pub tensor: bool,
    /// One source per op input.
    pub inputs: Vec<Source>,
    /// The op's dimension letters and the chain dimension each is bound to.
    pub dims: Vec<(&'static str, usize)>,
    /// The shape of the stage's output.
    pub shape: Shape,
    /// `tolerance = x`: the stage is guarded (its matrix operands are then f32 buffers, converted
    /// to `precision` as they are read, so the guard can recompute from them).
    pub tolerance: Option<f64>,
    /// `finite = true`: every value the stage produces must be finite, else the item completes
    /// with `PPTM_STATUS_NON_FINITE` (checked where the value is computed, on every backend).
    pub finite: bool,
    /// `args(...)`: (op parameter, chain argument) pairs, sorted by parameter.
    pub renames: Vec<(String, String)>,
    /// `per_row = true` on a reduction over a matrix: it folds each row (the last dimension), one
    /// value per row. (A reduction after a pairwise op folds rows without it: see
    /// [`ChainIr::folds_rows`].)
    pub per_row: bool,
    /// `tables = "fp16"`: the storage of its tables where it is not f32.
    pub tables: Option<DType>,
    /// `accumulate = "promoted"` on a tensor-core product: partial sums promoted to f32 sums
    /// every 512 of k (the wgmma path; `pptm_matmul_wgmma`'s PROMOTE).
    pub promoted: bool,
}

impl StageIr {
    /// The chain dimension bound to the op's letter `letter`.
    pub fn dim(&self, letter: &str) -> Option<usize> {
        self.dims
            .iter()
            .find(|(l, _)| *l == letter)
            .map(|(_, d)| *d)
    }
}

/// How codegen runs a chain: which pass pattern, and which stages sit where in it. Every chain
/// runs as one pass over its data, with no grid-wide barrier:
///
/// ```text
/// prologue* anchor? epilogue* (reduction finish*)?
/// ```
///
/// * `Map`: no anchor; the elementwise stages fuse into one functor per element.
/// * `Gemv`/`GemvT`/`Matmul`: the prologue's elementwise stages compute the vector input where it
///   is read; the epilogue's run on each output element before it is stored or reduced.
/// * `Pairwise`: a pairwise op (no prologue) and the row reduction that consumes its values,
///   then the epilogue on each point's result.
/// * `Rows`: a reduction with `per_row = true` (the anchor) folds each row of a matrix; the
///   prologue's elementwise stages compute the matrix's elements where they are read, the
///   epilogue runs on each row's value.
///
/// A reduction ends the pass: blocks reduce, the last block to arrive combines, and the `finish`
/// stages (elementwise on the scalar, by-value arguments only) run on the result there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Elementwise stages only, fused into one functor per element.
    Map,
    /// Anchored on a `Gemv` (`A x`).
    Gemv,
    /// Anchored on a `GemvT` (`Aᵀ x`).
    GemvT,
    /// Anchored on a `Matmul` or a `BatchedMatmul`.
    Matmul,
    /// Anchored on a pairwise op and the row reduction after it.
    Pairwise,
    /// Anchored on a reduction with `per_row = true`.
    Rows,
}

/// A chain's fusion plan; stage indices into [`ChainIr::stages`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The pass pattern the anchor (or its absence) selects.
    pub pattern: Pattern,
    /// The output-fusable or pairwise stage, or a `Rows` pass's row-wise reduction; for
    /// `Pairwise`, the row reduction is `anchor + 1`.
    pub anchor: Option<usize>,
    /// Stages before the anchor (for `Map`: every stage before the reduction).
    pub prologue: std::ops::Range<usize>,
    /// Elementwise/broadcast stages after the anchor, before the reduction.
    pub epilogue: std::ops::Range<usize>,
    /// The reduction to one value that ends the pass, if the chain has one (a row-wise
    /// reduction is the anchor instead, or the anchor's partner in `Pairwise`).
    pub reduction: Option<usize>,
    /// Stages after the reduction, applied to its scalar.
    pub finish: std::ops::Range<usize>,
}

/// A validated chain: stages in data-flow order, the descriptor's argument layout, its identity.
#[derive(Debug, Clone)]
pub struct ChainIr {
    /// The declaring struct's name.
    pub name: String,
    /// The manifold that hosts the chain (a folder under generated/).
    pub domain: String,
    /// In data-flow order; a `repeat = k` stage appears k times over.
    pub stages: Vec<StageIr>,
    /// The descriptor's argument words: buffers and by-value arguments in order of first use,
    /// `out`, one word per dimension, then the guard level if a stage is guarded.
    pub args: Vec<ArgSlot>,
    /// The chain's dimensions, which [`Shape`]s and [`ArgSlot::shape`] index into.
    pub dims: Vec<DimIr>,
    /// Whether a submission hands back a scalar or writes `out`.
    pub output: ChainOutput,
    /// How the stages fuse into one pass.
    pub plan: Plan,
    /// Normalised text of the chain (defaults applied); what the hash covers.
    pub canonical: String,
    /// SHA-256 of `canonical`, lowercase hex.
    pub spec_hash: String,
    /// The variant's opcode in its manifold, derived from the hash (>= FIRST_VARIANT_OPCODE).
    pub opcode: u32,
}
