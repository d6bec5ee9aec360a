//! The op catalog. One entry per op; the DSL names an op by its type name
//! (`pptm::ops::KlDivergence`), and everything else about it is here.
//!
//! To add a built-in op that fits the `#[pptm::op]` subset (docs/ops.md): declare it in
//! [`subset`], once; its device code, marker type and catalog entry follow from the function.
//! An op that needs hand-written device code: write it in a header under `kernels/pptm/ops/`, add
//! an [`OpDef`] in the family module here (with the f64 reference), list it in [`CATALOG`], and
//! add its marker type to the `builtin_ops!` list in `src/ops.rs` of the facade crate (which
//! implements [`Op`] for it: a marker whose name is not its op's is a compile error, and a test
//! checks that every catalog entry has a marker).

mod divergence;
mod linalg;
mod neighbours;
pub mod subset;

pub use divergence::KL_DIVERGENCE;
pub use linalg::{ADD_BIAS, BATCHED_MATMUL, GELU, GEMV, GEMV_T, MATMUL, is_matmul};
pub use neighbours::{
    ADD_DIGAMMA, CHEBYSHEV_DISTANCE, DIGAMMA, KSG_DIGAMMA, KTH_SMALLEST, MAX_K, RADIUS_COUNT,
    SUBSPACE_DISTANCES, digamma,
};
pub use subset::{
    Accuracy, Axpby, BeliefUpdate, MaxReduction, MeanReduction, PrecisionWeight, PredictionError,
    Relu, Sigmoid, Square, SumReduction, Tanh,
};

use crate::Precision;

/// How an op fuses with its neighbours (after TVM's op-pattern lattice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusionClass {
    /// One output element from the same-index element of each input (and scalar arguments):
    /// fuses into any pass, as a prologue, a body or an epilogue.
    Elementwise,
    /// Elementwise, with an input broadcast along the rows of a matrix (a bias): fuses as an
    /// epilogue of the op that produced the matrix.
    Broadcast,
    /// Many elements to one value; ends a fused pass (block reduction + last-block combine).
    Reduction,
    /// GEMV, matmul: each output element is a dot product. Elementwise prologues fuse into the
    /// vector input, elementwise/broadcast epilogues into the output before it is stored. The
    /// anchor names the hand-written pattern that computes it.
    OutputFusable(Anchor),
    /// A value per pair of points (distances), never stored: a [`FusionClass::RowReduction`]
    /// must consume it in the same pass.
    Pairwise,
    /// Reduces each row of a pairwise op's values to one value per point (k-th smallest, count).
    RowReduction,
}

/// The hand-written pattern an output-fusable op anchors a fused pass with
/// (kernels/pptm/pattern/): what lowering and codegen pick the pattern by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// `A x`: one dot product per row (`pptm_gemv_n`).
    Gemv,
    /// `Aᵀ x`: one dot product per column (`pptm_gemv_t`).
    GemvT,
    /// `A W`: tiles of outputs (`pptm_matmul`, or on tensor cores `pptm_matmul_mma`).
    Matmul,
    /// `A[s] W[s]` for every s of a batch (`pptm_matmul_batched`, `pptm_matmul_mma_batched`).
    BatchedMatmul,
}

/// The type of an op's input or output. Dimensions are named by letters local to the op
/// (`"m"`, `"n"`); a chain unifies them along the data flow and across arguments of one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    /// The same shape as the op's flow input (input 0). For a chain's first stage, a vector.
    Like,
    /// A vector over the flow's last dimension, broadcast along its rows (a bias).
    Row,
    /// An f32 vector over one dimension.
    Vector(&'static str),
    /// A row-major f32 matrix.
    Matrix(&'static str, &'static str),
    /// A stack of row-major matrices of one shape, one after another (batch, rows, columns).
    Batch(&'static str, &'static str, &'static str),
    /// A value for every pair (i, j), i != j, of `n` points: computed, consumed, never stored.
    Pairs(&'static str),
    /// One value: what a reduction produces.
    Scalar,
    /// A row-major f32 table over two dimensions of its own, read at coordinates an op computes
    /// (`#[pptm::op(tables(...))]`; see [`Table`]).
    Table(&'static str, &'static str),
    /// An f32 argument passed by value.
    F32,
    /// A u32 argument passed by value.
    U32,
}

impl Ty {
    /// The type in words, for error messages ("a vector", "per-pair values").
    pub fn describe(self) -> &'static str {
        match self {
            Ty::Like => "a value shaped like its flow input",
            Ty::Row => "a vector over the last dimension",
            Ty::Vector(_) => "a vector",
            Ty::Matrix(..) => "a matrix",
            Ty::Batch(..) => "a stack of matrices",
            Ty::Pairs(_) => "per-pair values",
            Ty::Table(..) => "a table",
            Ty::Scalar => "a scalar",
            Ty::F32 => "an f32 argument",
            Ty::U32 => "a u32 argument",
        }
    }

    /// The dimension letters of a tensor type, outermost first (`None` for the others).
    pub fn letters(self) -> Option<Vec<&'static str>> {
        match self {
            Ty::Vector(l) => Some(vec![l]),
            Ty::Matrix(r, c) => Some(vec![r, c]),
            Ty::Batch(s, r, c) => Some(vec![s, r, c]),
            Ty::Table(r, c) => Some(vec![r, c]),
            _ => None,
        }
    }

    /// A matrix, or a stack of them: what a precision's matrix storage applies to.
    pub fn is_matrix(self) -> bool {
        matches!(self, Ty::Matrix(..) | Ty::Batch(..))
    }

    /// Passed by value in the descriptor rather than as a buffer.
    pub fn is_by_value(self) -> bool {
        matches!(self, Ty::F32 | Ty::U32)
    }
}

/// One input of an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    /// The parameter's name: the chain argument it becomes, unless the stage renames it with
    /// `args(...)`.
    pub name: &'static str,
    /// Its type, whose dimension letters lowering binds to the chain's dimensions.
    pub ty: Ty,
}

/// Shorthand for catalog entries.
pub(crate) const fn param(name: &'static str, ty: Ty) -> Param {
    Param { name, ty }
}

/// What one op sees when the CPU backend runs it on whole tensors (f64 copies of its inputs).
#[derive(Debug)]
pub struct OpInputs<'a> {
    /// Input 0: the previous stage's output, or the chain argument of a first stage.
    pub flow: &'a [f64],
    /// The op's other buffer inputs, in declaration order.
    pub tensors: Vec<&'a [f64]>,
    /// The op's by-value inputs ([`Ty::F32`], [`Ty::U32`]), in declaration order.
    pub scalars: Vec<f64>,
    /// The op's dimension letters and their sizes.
    pub dims: Vec<(&'static str, usize)>,
}

impl OpInputs<'_> {
    /// The size of dimension `letter` of this op.
    pub fn dim(&self, letter: &str) -> usize {
        self.dims
            .iter()
            .find(|(l, _)| *l == letter)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("op has no dimension `{letter}`"))
    }
}

/// An elementwise op's f64 reference, per element and over a run of elements.
///
/// `one` is the definition. `run` is the same function applied along columns, with `one` inlined
/// into its loop (build it with [`element_fn!`](crate::element_fn), which guarantees that): the
/// CPU backend's fast path calls it once per block of elements and stage instead of once per
/// element, which is what lets a fused chain run near a hand-written loop's speed.
#[derive(Clone, Copy)]
pub struct ElementFn {
    /// f(flow channels, then the other inputs at the same element, then by-value inputs), for one
    /// element. A [`Ty::Row`] input contributes its element at the flow element's column.
    pub one: fn(&[f64]) -> f64,
    /// `out[i] = one([columns[0][i], columns[1][i], ...])` for every `i < out.len()`, one column
    /// per operand in `one`'s order (a by-value operand as a column of copies); for flows of one
    /// value per element. Every column holds at least `out.len()` values.
    pub run: fn(&[&[f64]], &mut [f64]),
}

/// An [`ElementFn`] from one function (a path or a closure that captures nothing): its `run` is
/// [`run_elements`] over the same function, so that the function is inlined into the loop.
#[macro_export]
macro_rules! element_fn {
    ($f:expr) => {
        $crate::ElementFn {
            one: $f,
            run: |columns, out| $crate::ops::run_elements(columns, out, $f),
        }
    };
}

/// Applies `f` along columns (see [`ElementFn::run`]). Generic over `f` so that each op's `run`
/// is a loop of its own with the op inlined; operand counts up to four get a loop each, whose
/// operand array has a length known at compile time.
#[inline(always)]
pub fn run_elements(columns: &[&[f64]], out: &mut [f64], f: impl Fn(&[f64]) -> f64) {
    let n = out.len();
    match *columns {
        [a] => {
            for (o, &a) in out.iter_mut().zip(&a[..n]) {
                *o = f(&[a]);
            }
        }
        [a, b] => {
            for ((o, &a), &b) in out.iter_mut().zip(&a[..n]).zip(&b[..n]) {
                *o = f(&[a, b]);
            }
        }
        [a, b, c] => {
            let (a, b, c) = (&a[..n], &b[..n], &c[..n]);
            for (i, o) in out.iter_mut().enumerate() {
                *o = f(&[a[i], b[i], c[i]]);
            }
        }
        [a, b, c, d] => {
            let (a, b, c, d) = (&a[..n], &b[..n], &c[..n], &d[..n]);
            for (i, o) in out.iter_mut().enumerate() {
                *o = f(&[a[i], b[i], c[i], d[i]]);
            }
        }
        _ => {
            let mut x = vec![0.0; columns.len()];
            for (i, o) in out.iter_mut().enumerate() {
                for (x, column) in x.iter_mut().zip(columns) {
                    *x = column[i];
                }
                *o = f(&x);
            }
        }
    }
}

/// A reduction's fold of a run of elements into the running value, `combine` inlined into the
/// loop: what [`CpuImpl::Reduction`]'s `fold` holds (built by [`fold_fn!`](crate::fold_fn)).
#[inline(always)]
pub fn fold_elements(acc: f64, xs: &[f64], combine: impl Fn(f64, f64) -> f64) -> f64 {
    xs.iter().fold(acc, |acc, &x| combine(acc, x))
}

/// A reduction's `fold` from its combine function (a path or a closure that captures nothing).
#[macro_export]
macro_rules! fold_fn {
    ($combine:expr) => {
        |acc, xs| $crate::ops::fold_elements(acc, xs, $combine)
    };
}

/// A table an op of the user's own reads at coordinates it computes (`#[pptm::op(tables(t))]`,
/// a parameter `t: pptm::Table`): `rows x cols` values, row-major. On the CPU backend it holds the
/// buffer's values widened to f64; on the device, the f32 buffer (read through the read-only
/// cache). Both read it alike:
///
/// * [`Table::at`]`(i, j)`: the value at row i, column j, each index clamped to the table;
/// * [`Table::bilinear`]`(x, y)`: the bilinear interpolation at row coordinate x and column
///   coordinate y in grid units (row i at x = i), each clamped to the table; NaN for a NaN
///   coordinate or an empty table;
/// * [`Table::rows`], [`Table::cols`]: its size.
#[derive(Debug, Clone, Copy)]
pub struct Table<'a> {
    values: &'a [f64],
    rows: usize,
    cols: usize,
}

/// A coordinate type [`Table::bilinear`] computes in: f32 or f64.
pub trait TableCoord: Copy + sealed::Sealed {
    #[doc(hidden)]
    fn to_f64(self) -> f64;
    #[doc(hidden)]
    fn from_f64(v: f64) -> Self;
    #[doc(hidden)]
    fn floor(self) -> Self;
    #[doc(hidden)]
    fn lerp(a: Self, b: Self, t: Self) -> Self;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

macro_rules! table_coord {
    ($t:ty) => {
        impl TableCoord for $t {
            fn to_f64(self) -> f64 {
                f64::from(self)
            }
            #[allow(clippy::cast_possible_truncation)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn floor(self) -> Self {
                <$t>::floor(self)
            }
            fn lerp(a: Self, b: Self, t: Self) -> Self {
                a + t * (b - a)
            }
        }
    };
}
table_coord!(f32);
table_coord!(f64);

impl<'a> Table<'a> {
    /// A table of `rows x cols` values, row-major; `None` unless `values` holds exactly that many.
    pub fn new(values: &'a [f64], rows: usize, cols: usize) -> Option<Self> {
        (rows.checked_mul(cols) == Some(values.len())).then_some(Table { values, rows, cols })
    }

    /// Its rows (saturating at `u32::MAX`).
    pub fn rows(&self) -> u32 {
        u32::try_from(self.rows).unwrap_or(u32::MAX)
    }

    /// Its columns (saturating at `u32::MAX`).
    pub fn cols(&self) -> u32 {
        u32::try_from(self.cols).unwrap_or(u32::MAX)
    }

    /// The value at row i, column j, each clamped to the table (NaN for an empty table).
    pub fn at(&self, i: u32, j: u32) -> f64 {
        if self.rows == 0 || self.cols == 0 {
            return f64::NAN;
        }
        let i = (i as usize).min(self.rows - 1);
        let j = (j as usize).min(self.cols - 1);
        self.values[i * self.cols + j]
    }

    /// The bilinear interpolation at row coordinate `x` and column coordinate `y`, in grid units,
    /// each clamped to the table, computed in the coordinates' type. NaN for a NaN coordinate or
    /// an empty table.
    pub fn bilinear<T: TableCoord>(&self, x: T, y: T) -> T {
        let (xf, yf) = (x.to_f64(), y.to_f64());
        if self.rows == 0 || self.cols == 0 || xf.is_nan() || yf.is_nan() {
            return T::from_f64(f64::NAN);
        }
        let clamp = |v: T, hi: usize| {
            let hi_t = T::from_f64((hi - 1) as f64);
            if v.to_f64() < 0.0 {
                T::from_f64(0.0)
            } else if v.to_f64() > hi_t.to_f64() {
                hi_t
            } else {
                v
            }
        };
        let (x, y) = (clamp(x, self.rows), clamp(y, self.cols));
        let (fx, fy) = (x.floor(), y.floor());
        let (i0, j0) = (fx.to_f64() as usize, fy.to_f64() as usize);
        let (i1, j1) = ((i0 + 1).min(self.rows - 1), (j0 + 1).min(self.cols - 1));
        let at = |i: usize, j: usize| T::from_f64(self.values[i * self.cols + j]);
        let tx = T::from_f64(x.to_f64() - fx.to_f64());
        let ty = T::from_f64(y.to_f64() - fy.to_f64());
        let a = T::lerp(at(i0, j0), at(i0, j1), ty);
        let b = T::lerp(at(i1, j0), at(i1, j1), ty);
        T::lerp(a, b, tx)
    }
}

/// The states an op's flow and output are ([`OpDef::states`]), by the name of the Rust struct
/// that derives `pptm::State`; `None` for a plain value. The device code names the struct
/// `pptm_state_<name>` (its fields as declared) and `pptm_state_<name>_f32` (every field f32:
/// what an fp32 stage of an op with an f32 form computes in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateTypes {
    /// The flow's state.
    pub flow: Option<&'static str>,
    /// The output's state.
    pub out: Option<&'static str>,
}

impl StateTypes {
    /// Neither the flow nor the output is a state.
    pub const NONE: StateTypes = StateTypes {
        flow: None,
        out: None,
    };
}

/// The f64 CPU reference of an op, run by the CPU backend.
#[derive(Clone, Copy)]
pub enum CpuImpl {
    /// Per element: see [`ElementFn`].
    Elementwise(ElementFn),
    /// Per element, for an op of the user's own that returns a state (`#[derive(pptm::State)]`)
    /// or reads tables (`#[pptm::op(tables(...))]`): `f(inputs, tables, out)` reads the inputs as
    /// [`ElementFn::one`] does (a state flow as its fields, in order; no tables among them), the
    /// op's tables in declaration order, and writes its value (a state's fields, in order) to
    /// `out`.
    PerElement(fn(&[f64], &[Table<'_>], &mut [f64])),
    /// Fold every element with `combine`, starting from `identity`; then `finish(total, n)`.
    Reduction {
        /// The value folding starts from (0 for a sum, -inf for a max).
        identity: f64,
        /// Folds one more element into the running value.
        combine: fn(f64, f64) -> f64,
        /// Folds a run of elements into the running value, in order: `combine` along the run,
        /// inlined (see [`fold_fn!`](crate::fold_fn)); the same result as folding one by one.
        fold: fn(f64, &[f64]) -> f64,
        /// The result from the folded value and the number of elements folded (a mean divides).
        finish: fn(f64, usize) -> f64,
    },
    /// The whole output from the whole inputs (GEMV, matmul).
    Tensor(fn(&OpInputs) -> Vec<f64>),
    /// The values of pair (i, j) written to `out` (one per channel).
    Pair(fn(&OpInputs, usize, usize, &mut [f64])),
    /// Point i's values (one per channel) from its row of pair values (`row[j]` holds the
    /// `channels` values of pair (i, j) at `j * channels`; the entry j = i is absent).
    Row(fn(&OpInputs, usize, &[f64], usize, &mut [f64])),
}

impl std::fmt::Debug for CpuImpl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CpuImpl::Elementwise(_) => f.write_str("Elementwise(..)"),
            CpuImpl::PerElement(_) => f.write_str("PerElement(..)"),
            CpuImpl::Reduction { identity, .. } => {
                write!(f, "Reduction {{ identity: {identity}, .. }}")
            }
            CpuImpl::Tensor(_) => f.write_str("Tensor(..)"),
            CpuImpl::Pair(_) => f.write_str("Pair(..)"),
            CpuImpl::Row(_) => f.write_str("Row(..)"),
        }
    }
}

/// An op's submission-time check of its by-value arguments and dimension sizes.
pub type ArgCheck = fn(&[f64], &[(&'static str, usize)]) -> Result<(), String>;

/// Everything pptm knows about one op.
#[derive(Debug)]
pub struct OpDef {
    /// The DSL name: the last path segment of the stage's type.
    pub name: &'static str,
    /// How it fuses with the stages around it: what lowering plans the pass by.
    pub class: FusionClass,
    /// Inputs in order. In a chain, input 0 of every stage after the first is the previous
    /// stage's output; the others become the chain's arguments, by name.
    pub inputs: &'static [Param],
    /// The type of what it produces.
    pub output: Ty,
    /// Values per element the flow input must carry (`None`: any), and the output carries
    /// (`None`: as many as the flow). Only the neighbour-count ops use more than one.
    pub flow_channels: Option<u8>,
    /// Values per element of the output (`None`: as many as the flow); see `flow_channels`.
    pub out_channels: Option<u8>,
    /// The states (`#[derive(pptm::State)]`) the op reads as its flow and gives as its output,
    /// where they are states rather than one value: their channels are the state's fields.
    pub states: StateTypes,
    /// Precisions the device code implements on CUDA cores (the default, `tensor_eligible` off).
    pub precisions: &'static [Precision],
    /// Precisions its tensor-core path implements (`tensor_eligible = true`); empty when it has
    /// none, and `tensor_eligible = true` is refused. A precision listed only here is a compile
    /// error without `tensor_eligible = true`, naming the fix.
    pub tensor_precisions: &'static [Precision],
    /// The header under `kernels/` that defines the device side (empty for an op of the user's
    /// own, whose device code is `cuda`).
    pub header: &'static str,
    /// The device side written inline: an op of the user's own (`#[pptm::op]`, translated by
    /// `op_fn`), pasted into each translation unit that uses it. Empty for the built-in ops.
    pub cuda: &'static str,
    /// The threads of a warp that share each element of an elementwise pass that runs this op:
    /// 1, or for an op of the user's own with a `for s in lanes(a..b)` loop, its `lanes = N`
    /// (pptm-spec's `op_fn::OpAttr::lanes`). A chain's pass takes its stages' largest.
    pub lanes: u8,
    /// Device symbol: an `__device__` function for elementwise and broadcast ops, a reducer type
    /// for reductions, a pattern building block for the others.
    pub device: &'static str,
    /// Its f64 reference, which the CPU backend runs and the device results are tested against.
    pub cpu: CpuImpl,
    /// Checks by-value arguments and sizes at submission (`scalars` and `dims` as in
    /// [`OpInputs`]); the message becomes a typed bad-argument error.
    pub check: Option<ArgCheck>,
    /// One line on what the op computes (for a `#[pptm::op]`, one the macro writes).
    pub doc: &'static str,
}

impl OpDef {
    /// An elementwise op of f32 inputs shaped like the flow, in the given header.
    pub(crate) const fn elementwise(
        name: &'static str,
        inputs: &'static [Param],
        header: &'static str,
        device: &'static str,
        f: ElementFn,
        doc: &'static str,
    ) -> OpDef {
        OpDef {
            name,
            class: FusionClass::Elementwise,
            inputs,
            output: Ty::Like,
            flow_channels: Some(1),
            out_channels: Some(1),
            states: crate::ops::StateTypes::NONE,
            // Each elementwise op's device code has an f32 and an f64 form
            // (`precision = "fp64"`: inputs widened, the op and what flows on in f64).
            precisions: &[Precision::Fp32, Precision::Fp64],
            tensor_precisions: &[],
            lanes: 1,
            header,
            cuda: "",
            device,
            cpu: CpuImpl::Elementwise(f),
            check: None,
            doc,
        }
    }
}

/// Every op the DSL knows.
pub const CATALOG: &[&OpDef] = &[
    &KL_DIVERGENCE,
    PredictionError::DEF,
    PrecisionWeight::DEF,
    Accuracy::DEF,
    SumReduction::DEF,
    MeanReduction::DEF,
    MaxReduction::DEF,
    &GEMV,
    &GEMV_T,
    Axpby::DEF,
    BeliefUpdate::DEF,
    Square::DEF,
    &MATMUL,
    &BATCHED_MATMUL,
    &ADD_BIAS,
    Relu::DEF,
    Sigmoid::DEF,
    Tanh::DEF,
    &GELU,
    &CHEBYSHEV_DISTANCE,
    &SUBSPACE_DISTANCES,
    &KTH_SMALLEST,
    &RADIUS_COUNT,
    &DIGAMMA,
    &KSG_DIGAMMA,
    &ADD_DIGAMMA,
];

/// Looks an op up by its DSL name.
pub fn find(name: &str) -> Option<&'static OpDef> {
    CATALOG.iter().copied().find(|op| op.name == name)
}

/// The catalog name closest to `name`, for "did you mean" hints.
pub fn closest(name: &str) -> Option<&'static str> {
    CATALOG
        .iter()
        .map(|op| {
            (
                edit_distance(&name.to_ascii_lowercase(), &op.name.to_ascii_lowercase()),
                op.name,
            )
        })
        .filter(|(d, _)| *d <= 3)
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// An op, named by its marker type: every built-in op's (`pptm::ops::Square`: its catalog entry)
/// and every `#[pptm::op]` function's (the macro implements it for the function's name in
/// CamelCase). A chain's stage field must be of a type that implements it: the `FusionBuilder`
/// derive checks each stage's type against the op it lowered the stage with, so a type that is
/// not an op, or not the op of that name, is a compile error at the field.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an op",
    label = "a stage's type is an op",
    note = "an op is a type of `pptm::ops` or the marker of a `#[pptm::op]` function (its name in CamelCase)"
)]
pub trait Op {
    /// The op, as the catalog describes it.
    const DEF: &'static OpDef;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distances_count_insertions_deletions_and_substitutions() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("abc", ""), 3);
        assert_eq!(edit_distance("abc", "abd"), 1);
        assert_eq!(edit_distance("abc", "abxc"), 1);
        assert_eq!(edit_distance("abxc", "abc"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn types_and_cpu_code_describe_themselves() {
        assert_eq!(Ty::Matrix("m", "n").describe(), "a matrix");
        assert_eq!(Ty::Vector("n").describe(), "a vector");
        assert_eq!(format!("{:?}", KL_DIVERGENCE.cpu), "Elementwise(..)");
        assert_eq!(format!("{:?}", GEMV.cpu), "Tensor(..)");
        assert_eq!(format!("{:?}", KTH_SMALLEST.cpu), "Row(..)");
        assert_eq!(format!("{:?}", CHEBYSHEV_DISTANCE.cpu), "Pair(..)");
        assert_eq!(
            format!("{:?}", MaxReduction::DEF.cpu),
            "Reduction { identity: -inf, .. }"
        );
    }

    #[test]
    fn names_are_unique_and_well_formed() {
        for (i, a) in CATALOG.iter().enumerate() {
            assert!(
                a.name.chars().next().unwrap().is_ascii_uppercase(),
                "{}",
                a.name
            );
            assert!(!a.inputs.is_empty(), "{} has no inputs", a.name);
            assert!(
                !a.inputs[0].ty.is_by_value(),
                "{}: input 0 is the flow input, a tensor",
                a.name
            );
            assert!(
                a.precisions.contains(&Precision::Fp32),
                "{}: fp32 is the default precision",
                a.name
            );
            assert!(
                a.header.starts_with("pptm/ops/") && a.header.ends_with(".cuh"),
                "{}",
                a.header
            );
            for p in a.inputs {
                assert!(
                    p.name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                    "{}: argument names become Rust fields: {}",
                    a.name,
                    p.name
                );
            }
            for b in &CATALOG[i + 1..] {
                assert_ne!(a.name, b.name);
            }
            let ok = match (a.class, a.cpu) {
                (FusionClass::Elementwise | FusionClass::Broadcast, CpuImpl::Elementwise(_)) => {
                    a.output == Ty::Like
                }
                (FusionClass::Reduction, CpuImpl::Reduction { .. }) => a.output == Ty::Scalar,
                (FusionClass::OutputFusable(_), CpuImpl::Tensor(_)) => {
                    matches!(a.output, Ty::Vector(_) | Ty::Matrix(..) | Ty::Batch(..))
                }
                (FusionClass::Pairwise, CpuImpl::Pair(_)) => matches!(a.output, Ty::Pairs(_)),
                (FusionClass::RowReduction, CpuImpl::Row(_)) => {
                    matches!(a.inputs[0].ty, Ty::Pairs(_)) && matches!(a.output, Ty::Vector(_))
                }
                _ => false,
            };
            assert!(ok, "{}: class, output and CPU reference disagree", a.name);
            assert_eq!(
                a.class == FusionClass::Broadcast,
                a.inputs.iter().any(|p| p.ty == Ty::Row),
                "{}: broadcast ops are the ones with a Row input",
                a.name
            );
        }
    }

    // That each op's device symbol is defined in its header is checked by pptm-codegen, which
    // embeds the headers (codegen/src/kernels.rs).

    #[test]
    fn suggestions() {
        assert_eq!(closest("KlDivergance"), Some("KlDivergence"));
        assert_eq!(closest("Sumreduction"), Some("SumReduction"));
        assert_eq!(closest("Softmax"), None);
    }
}
