//! Validation and lowering: [`ChainSpec`] → [`ChainIr`], the form codegen and the CPU backend use.
//!
//! Lowering type-checks the chain along its data flow: each op names its dimensions with letters
//! of its own (`Gemv` is `x[n], a[m×n] → [m]`), and the chain unifies them where a stage's
//! output feeds the next stage and where two stages share an argument name. What comes out:
//! the descriptor's argument layout (buffers, by-value arguments, then one word per dimension),
//! the fusion plan (which pass pattern runs the chain, see [`Plan`]), and the chain's identity.

use sha2::{Digest, Sha256};

use crate::chain::valid_domain_name;
use crate::ops::{self, Anchor, CpuImpl, FusionClass, OpDef, OpInputs, Ty};
use crate::{ChainSpec, DESC_ARGS, DType, FIRST_VARIANT_OPCODE, Precision};

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

/// Which part of the declaration an error is about, so the macro can point at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The chain as a whole (the struct's name).
    Chain,
    /// The `domain = "..."` of `#[fusion(...)]`.
    Domain,
    /// The `n` of `#[stage(n)]` of the stage at this declaration index.
    StageNumber(usize),
    /// The op type of the stage at this declaration index.
    StageOp(usize),
    /// One attribute of the stage at this declaration index.
    StageAttr(usize, &'static str),
}

/// Why a chain is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The struct has no `#[stage]` field.
    #[error(
        "a fusion chain needs at least one stage: add fields marked #[stage(1)], #[stage(2)], ..."
    )]
    Empty,
    /// The `domain = "..."` of `#[fusion(...)]`, carried as written, is not a valid domain name.
    #[error(
        "domain \"{0}\" is not a valid domain name: use lowercase ASCII letters, digits and '_', starting with a letter"
    )]
    BadDomain(String),
    /// Two stages have the same `#[stage(n)]`.
    #[error("stage number {number} is used twice")]
    DuplicateStage {
        /// The later-declared stage's index in declaration order (what the macro points at).
        stage: usize,
        /// The number both stages have.
        number: u32,
    },
    /// The stage numbers are not exactly 1..=k.
    #[error(
        "stage numbers must run 1, 2, 3, ... without gaps: expected stage {expected} here, found {found}"
    )]
    StageGap {
        /// The declaration index of the first stage, in number order, whose number is out of place.
        stage: usize,
        /// The number this position in stage-number order should have.
        expected: u32,
        /// The number the stage has.
        found: u32,
    },
    /// The stage's type names no built-in op and none of the user's own.
    #[error("unknown op `{name}`{hint}")]
    UnknownOp {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The op name as written.
        name: String,
        /// The closest known name (`; did you mean ...?`), or the list of known ops.
        hint: String,
    },
    /// A `#[pptm::op]` of the user's has a built-in op's name.
    #[error("`{name}`: an op of your own has the name of a built-in op; give it another name")]
    OpShadowed {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The name both have.
        name: String,
    },
    /// Two different `#[pptm::op]`s of the user's have one name.
    #[error(
        "`{name}`: two ops of your own have this name (two `#[pptm::op] fn`s of one name); rename one"
    )]
    OpTwice {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The name both have.
        name: String,
    },
    /// `reduction = ...` contradicts the op's fusion class.
    #[error("`{op}` {is} a reduction, but the stage says `reduction = {said}`")]
    ReductionMismatch {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The stage's op.
        op: &'static str,
        /// "is" or "is not", for the message.
        is: &'static str,
        /// The `reduction = ...` as written.
        said: bool,
    },
    /// `tensor_eligible = true` on an op with no tensor-core precisions.
    #[error("`{op}` has no tensor-core path; remove `tensor_eligible = true`")]
    TensorUnsupported {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The stage's op.
        op: &'static str,
    },
    /// `finite = true` on an op whose values stay inside its pass pattern (not an elementwise,
    /// broadcast or reduction op).
    #[error(
        "`{op}`: `finite` is checked where elementwise and reduction stages compute their values; \
         {op}'s values stay inside its pattern. Put `finite = true` on an elementwise stage after it \
         (an activation, a bias) or on the reduction"
    )]
    FiniteUnsupported {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The stage's op.
        op: &'static str,
    },
    /// `tolerance = x` is out of range, or on a stage the accuracy guard cannot watch.
    #[error("`{op}`: `tolerance` {reason}")]
    ToleranceUnsupported {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The stage's op.
        op: &'static str,
        /// What is wrong, completing "`tolerance` ...".
        reason: String,
    },
    /// The precision is one the op offers only with `tensor_eligible = true`.
    #[error(
        "`{op}` implements precision \"{precision}\" only on tensor cores: add `tensor_eligible = true` to the stage"
    )]
    TensorRequired {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The stage's op.
        op: &'static str,
        /// The precision asked for.
        precision: Precision,
    },
    /// The op does not offer the precision (on the cores the stage asked for).
    #[error("`{op}` does not implement precision \"{precision}\" (it implements {supported})")]
    PrecisionUnsupported {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The stage's op.
        op: &'static str,
        /// The precision asked for.
        precision: Precision,
        /// The precisions it does offer, quoted and listed, with " on tensor cores" if the
        /// stage asked for them.
        supported: String,
    },
    /// The stage's input does not have the shape (or channel count) the previous stage produces.
    #[error(
        "`{op}` needs {needs} as its input, but the stage before it (`{prev}`) produces {gives}"
    )]
    FlowMismatch {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The stage's op.
        op: &'static str,
        /// What the op takes, in words ("a vector", "3 value(s) per element").
        needs: String,
        /// The op of the stage before it in data flow.
        prev: &'static str,
        /// What that stage produces, in words.
        gives: String,
    },
    /// A chain argument is used with two types, shapes or storage types, or a row argument has no
    /// tensor flow to broadcast along.
    #[error("`{op}`: argument `{arg}` {reason}")]
    ArgConflict {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The stage's op.
        op: &'static str,
        /// The chain argument's name (after `args(...)` renames).
        arg: String,
        /// What clashes, completing "argument `x` ...".
        reason: String,
    },
    /// `per_row = true` on an op that is not a reduction.
    #[error(
        "`{op}` is not a reduction: `per_row = true` makes a reduction (SumReduction, MaxReduction, \
         an #[pptm::op(reduction)], ...) fold each row of a matrix into one value"
    )]
    PerRowUnsupported {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The stage's op.
        op: &'static str,
    },
    /// `args(...)` renames a parameter the op does not take, or the stage's flow input.
    #[error("`{op}`: `args(...)` {reason}")]
    BadRename {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The stage's op.
        op: &'static str,
        /// What is wrong, completing "`args(...)` ...".
        reason: String,
    },
    /// The stages do not fit one pass (see [`Plan`]), or the op cannot stand where it is.
    #[error("`{op}` cannot be fused here: {reason}")]
    Unfusable {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The stage's op.
        op: &'static str,
        /// Why, in a sentence that says what to do instead where there is something.
        reason: String,
    },
    /// An op input is named `out`, the name of the chain's output buffer.
    #[error("`{op}` has an input named `out`, which is reserved for the chain's output")]
    ReservedName {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The stage's op.
        op: &'static str,
    },
    /// The descriptor would need more argument words than it has.
    #[error("the chain needs {count} descriptor arguments; at most {max} fit")]
    TooManyArgs {
        /// The words the chain needs (arguments, dimensions, guard level).
        count: usize,
        /// [`DESC_ARGS`](crate::DESC_ARGS).
        max: usize,
    },
    /// `repeat = k` out of range, or on an op that is not elementwise.
    #[error("`{op}`: `repeat` {reason}")]
    BadRepeat {
        /// The stage's index in declaration order (what the derive macro points at).
        stage: usize,
        /// The stage's op.
        op: &'static str,
        /// What is wrong, completing "`repeat` ...".
        reason: String,
    },
}

impl SpecError {
    /// The part of the declaration to point at.
    pub fn blame(&self) -> Blame {
        match *self {
            SpecError::Empty | SpecError::TooManyArgs { .. } => Blame::Chain,
            SpecError::BadDomain(_) => Blame::Domain,
            SpecError::DuplicateStage { stage, .. } | SpecError::StageGap { stage, .. } => {
                Blame::StageNumber(stage)
            }
            SpecError::UnknownOp { stage, .. }
            | SpecError::OpShadowed { stage, .. }
            | SpecError::OpTwice { stage, .. }
            | SpecError::FlowMismatch { stage, .. }
            | SpecError::ArgConflict { stage, .. }
            | SpecError::Unfusable { stage, .. }
            | SpecError::ReservedName { stage, .. } => Blame::StageOp(stage),
            SpecError::ReductionMismatch { stage, .. } => Blame::StageAttr(stage, "reduction"),
            SpecError::TensorUnsupported { stage, .. } => {
                Blame::StageAttr(stage, "tensor_eligible")
            }
            SpecError::ToleranceUnsupported { stage, .. } => Blame::StageAttr(stage, "tolerance"),
            SpecError::FiniteUnsupported { stage, .. } => Blame::StageAttr(stage, "finite"),
            SpecError::PerRowUnsupported { stage, .. } => Blame::StageAttr(stage, "per_row"),
            SpecError::BadRename { stage, .. } => Blame::StageAttr(stage, "args"),
            SpecError::BadRepeat { stage, .. } => Blame::StageAttr(stage, "repeat"),
            SpecError::PrecisionUnsupported { stage, .. }
            | SpecError::TensorRequired { stage, .. } => Blame::StageAttr(stage, "precision"),
        }
    }
}

/// A chain dimension while lowering. A `weak` name is only a default (`n` for the vector a chain
/// starts from), which the first op letter bound to it replaces (`m` when it feeds `GemvT`).
struct DimDraft {
    name: String,
    weak: bool,
}

struct ArgDraft {
    name: String,
    kind: ArgKind,
    shape: Vec<usize>,
    dtype: DType,
}

/// The dimension and argument tables a chain builds while it is lowered.
#[derive(Default)]
struct Tables {
    dims: Vec<DimDraft>,
    args: Vec<ArgDraft>,
}

impl Tables {
    fn fresh(&mut self, name: &str, weak: bool) -> usize {
        self.dims.push(DimDraft {
            name: name.to_string(),
            weak,
        });
        self.dims.len() - 1
    }

    /// Binds op letter `l` to chain dimension `d` within one stage (`letters`).
    fn bind(
        &mut self,
        letters: &mut Vec<(&'static str, usize)>,
        l: &'static str,
        d: usize,
    ) -> bool {
        if let Some(&(_, bound)) = letters.iter().find(|(x, _)| *x == l) {
            return bound == d;
        }
        if self.dims[d].weak {
            self.dims[d] = DimDraft {
                name: l.to_string(),
                weak: false,
            };
        }
        letters.push((l, d));
        true
    }

    /// The chain dimension of op letter `l` in this stage, fresh if not bound yet.
    fn letter(&mut self, letters: &mut Vec<(&'static str, usize)>, l: &'static str) -> usize {
        if let Some(&(_, d)) = letters.iter().find(|(x, _)| *x == l) {
            return d;
        }
        let d = self.fresh(l, false);
        letters.push((l, d));
        d
    }

    fn arg(&self, name: &str) -> Option<usize> {
        self.args.iter().position(|a| a.name == name)
    }
}

/// Why fields numbered `#[stage(n)]` or `#[step(n)]` are not numbered 1, 2, 3, ...
pub(crate) enum Misnumbered {
    /// The field at declaration index `index` repeats the number of one declared before it.
    Twice { index: usize, number: u32 },
    /// The field at declaration index `index` has `found` where `expected` comes next.
    Gap {
        index: usize,
        expected: u32,
        found: u32,
    },
}

/// The declaration indices of fields in the order of their numbers, which must run 1, 2, 3, ...
/// without a gap or a repeat (the first offender in that order is named).
pub(crate) fn numbered_order(numbers: &[u32]) -> Result<Vec<usize>, Misnumbered> {
    let mut order: Vec<usize> = (0..numbers.len()).collect();
    order.sort_by_key(|&i| (numbers[i], i));
    for (pos, &i) in order.iter().enumerate() {
        let found = numbers[i];
        if pos > 0 && numbers[order[pos - 1]] == found {
            return Err(Misnumbered::Twice {
                index: i,
                number: found,
            });
        }
        let expected = pos as u32 + 1;
        if found != expected {
            return Err(Misnumbered::Gap {
                index: i,
                expected,
                found,
            });
        }
    }
    Ok(order)
}

/// Validates a chain and lowers it to IR.
pub fn lower(spec: &ChainSpec) -> Result<ChainIr, SpecError> {
    lower_with(spec, &[])
}

/// [`lower`] for a chain whose stages may also name ops of the user's own (`#[pptm::op]`), given
/// as `extra`: they are found by name after the built-in catalog, and one with a built-in's name
/// is refused where a stage uses it.
pub fn lower_with(spec: &ChainSpec, extra: &[&'static OpDef]) -> Result<ChainIr, SpecError> {
    if !valid_domain_name(&spec.domain) {
        return Err(SpecError::BadDomain(spec.domain.clone()));
    }
    if spec.stages.is_empty() {
        return Err(SpecError::Empty);
    }
    // Data-flow order is stage-number order; numbers must be exactly 1..=k.
    let numbers: Vec<u32> = spec.stages.iter().map(|s| s.number).collect();
    let order = numbered_order(&numbers).map_err(|e| match e {
        Misnumbered::Twice { index, number } => SpecError::DuplicateStage {
            stage: index,
            number,
        },
        Misnumbered::Gap {
            index,
            expected,
            found,
        } => SpecError::StageGap {
            stage: index,
            expected,
            found,
        },
    })?;

    // A stage with `repeat = k` takes k places in the data flow, one after the other (each
    // reading what the one before produced); errors still name the declared stage.
    for (i, st) in spec.stages.iter().enumerate() {
        if let Some(times) = st.repeat
            && !(1..=crate::chain::MAX_REPEAT).contains(&times)
        {
            return Err(SpecError::BadRepeat {
                stage: i,
                op: check_stage(i, st, extra)?.name,
                reason: format!(
                    "takes a count from 1 to {}, not {times}",
                    crate::chain::MAX_REPEAT
                ),
            });
        }
    }
    let order: Vec<usize> = order
        .into_iter()
        .flat_map(|i| std::iter::repeat_n(i, spec.stages[i].repeat.unwrap_or(1) as usize))
        .collect();

    // A chain that folds rows (`per_row = true`) reads its first input as a row-major matrix.
    let matrix_rows = spec.stages.iter().any(|s| s.per_row == Some(true));
    let mut t = Tables::default();
    let mut stages: Vec<StageIr> = Vec::new();
    for (pos, &i) in order.iter().enumerate() {
        let st = &spec.stages[i];
        let per_row = st.per_row == Some(true);
        let op = check_stage(i, st, extra)?;
        if st.repeat.is_some_and(|times| times > 1) && op.class != FusionClass::Elementwise {
            return Err(SpecError::BadRepeat {
                stage: i,
                op: op.name,
                reason: format!(
                    "runs a stage again on what it produced, so only an elementwise op repeats; \
                     `{}` is not one",
                    op.name
                ),
            });
        }
        let conflict = |arg: &str, reason: String| SpecError::ArgConflict {
            stage: i,
            op: op.name,
            arg: arg.to_string(),
            reason,
        };
        // The chain argument each op parameter binds to: its own name, or the stage's rename.
        for (param, _) in &st.args {
            let Some(k) = op.inputs.iter().position(|p| p.name == *param) else {
                return Err(SpecError::BadRename {
                    stage: i,
                    op: op.name,
                    reason: format!(
                        "renames `{param}`, which `{}` does not take (its parameters: {})",
                        op.name,
                        op.inputs
                            .iter()
                            .map(|p| p.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
            };
            if k == 0 && pos > 0 {
                return Err(SpecError::BadRename {
                    stage: i,
                    op: op.name,
                    reason: format!(
                        "renames `{param}`, but that is the stage's flow: it comes from stage {}, not from an argument",
                        pos
                    ),
                });
            }
        }
        let arg_name = |param: &'static str| -> String {
            st.args
                .iter()
                .find(|(p, _)| p == param)
                .map_or_else(|| param.to_string(), |(_, n)| n.clone())
        };
        let mut letters: Vec<(&'static str, usize)> = Vec::new();
        let mut inputs = vec![Source::Stage(usize::MAX); op.inputs.len()];
        let precision = st.precision.unwrap_or(Precision::Fp32);
        let guarded = st.tolerance.is_some();
        // How this stage stores a buffer input of type `ty`: matrices in the stage's precision,
        // unless the stage is guarded (the guard recomputes from the f32 values).
        let storage = |ty: Ty| match ty {
            ty if ty.is_matrix() && !guarded => DType::matrix_storage(precision),
            _ => DType::F32,
        };

        // The flow input: the previous stage's output, or a chain argument for the first stage.
        let flow = op.inputs[0];
        let flow_shape = if pos == 0 {
            if flow.name == "out" {
                return Err(SpecError::ReservedName {
                    stage: i,
                    op: op.name,
                });
            }
            let dims = match flow.ty {
                Ty::Like if matrix_rows => vec![t.fresh("rows", true), t.fresh("cols", true)],
                Ty::Like => vec![t.fresh("n", true)],
                ty if ty.letters().is_some() => ty
                    .letters()
                    .into_iter()
                    .flatten()
                    .map(|l| t.letter(&mut letters, l))
                    .collect(),
                other => {
                    return Err(SpecError::Unfusable {
                        stage: i,
                        op: op.name,
                        reason: format!(
                            "it cannot start a chain: its input is {}, which only another op produces",
                            other.describe()
                        ),
                    });
                }
            };
            if let Some(need) = op.flow_channels.filter(|&c| c != 1) {
                return Err(SpecError::Unfusable {
                    stage: i,
                    op: op.name,
                    reason: format!(
                        "it cannot start a chain: it reads {need} values per element, which only another op produces"
                    ),
                });
            }
            t.args.push(ArgDraft {
                name: arg_name(flow.name),
                kind: ArgKind::Input,
                shape: dims.clone(),
                dtype: storage(flow.ty),
            });
            inputs[0] = Source::Arg(t.args.len() - 1);
            Shape::Tensor { dims, channels: 1 }
        } else {
            let prev = &stages[pos - 1];
            inputs[0] = Source::Stage(pos - 1);
            let mismatch = |needs: String, gives: String| SpecError::FlowMismatch {
                stage: i,
                op: op.name,
                needs,
                prev: prev.op.name,
                gives,
            };
            let ok = match (flow.ty, &prev.shape) {
                // A row-wise reduction folds the last dimension of a matrix (or stack of them).
                (Ty::Like, Shape::Tensor { dims, .. }) if per_row => dims.len() >= 2,
                (Ty::Like, Shape::Tensor { .. }) => true,
                (Ty::Like, Shape::Scalar) => op.class == FusionClass::Elementwise,
                (ty, Shape::Tensor { dims, .. })
                    if ty.letters().is_some_and(|l| l.len() == dims.len()) =>
                {
                    let ls = ty.letters().expect("a tensor type");
                    ls.into_iter()
                        .zip(dims)
                        .all(|(l, &d)| t.bind(&mut letters, l, d))
                }
                (Ty::Pairs(l), Shape::Pairs { dim, .. }) => t.bind(&mut letters, l, *dim),
                // A reduction after a pairwise op folds each point's row of values: a row-wise
                // reduction, one value per point (the pairwise pattern's row type).
                (Ty::Like, Shape::Pairs { .. }) => op.class == FusionClass::Reduction,
                _ => false,
            };
            if !ok {
                let needs = match (flow.ty, op.class) {
                    (Ty::Like, FusionClass::Reduction) if per_row => {
                        "a matrix, whose rows `per_row = true` folds (or a pairwise op's values)"
                            .to_string()
                    }
                    (Ty::Like, FusionClass::Reduction) => {
                        "a tensor (or a pairwise op's values, folded per point)".to_string()
                    }
                    (Ty::Like, _) => "a tensor (or, for an elementwise op, a scalar)".to_string(),
                    (ty, _) => ty.describe().to_string(),
                };
                return Err(mismatch(needs, shape_text(&prev.shape)));
            }
            let ch = prev.shape.channels();
            if let Some(need) = op.flow_channels
                && need != ch
            {
                return Err(mismatch(
                    format!("{need} value(s) per element"),
                    format!("{ch} value(s) per element"),
                ));
            }
            prev.shape.clone()
        };

        if (per_row || matches!(flow_shape, Shape::Pairs { .. })) && precision == Precision::Fp64 {
            return Err(SpecError::Unfusable {
                stage: i,
                op: op.name,
                reason: "a row-wise reduction folds in f64 already and hands each row's value \
                         on as f32; `precision = \"fp64\"` is for a chain's reduction"
                    .to_string(),
            });
        }

        // The other inputs. Names an earlier stage already declared go first, so their shapes
        // bind this op's letters before fresh dimensions are made for the rest.
        let mut rest: Vec<usize> = (1..op.inputs.len()).collect();
        rest.sort_by_key(|&k| t.arg(&arg_name(op.inputs[k].name)).is_none());
        for k in rest {
            let p = op.inputs[k];
            if p.name == "out" {
                return Err(SpecError::ReservedName {
                    stage: i,
                    op: op.name,
                });
            }
            let name = arg_name(p.name);
            let existing = t.arg(&name);
            if p.ty.is_by_value() {
                let kind = if p.ty == Ty::F32 {
                    ArgKind::F32
                } else {
                    ArgKind::U32
                };
                let slot = match existing {
                    Some(s) if t.args[s].kind == kind => s,
                    Some(_) => {
                        return Err(conflict(
                            &name,
                            "is used with another type by an earlier stage".into(),
                        ));
                    }
                    None => {
                        t.args.push(ArgDraft {
                            name: name.clone(),
                            kind,
                            shape: vec![],
                            dtype: DType::F32,
                        });
                        t.args.len() - 1
                    }
                };
                inputs[k] = Source::Arg(slot);
                continue;
            }
            let flow_dims = match &flow_shape {
                Shape::Tensor { dims, .. } => Some(dims.clone()),
                _ => None,
            };
            // The shape this input must have: a dimension per entry, `Err(letter)` where the
            // op's letter is not bound yet.
            let wanted: Vec<Result<usize, &'static str>> = match p.ty {
                Ty::Like => match flow_dims {
                    Some(d) => d.into_iter().map(Ok).collect(),
                    None => {
                        return Err(SpecError::FlowMismatch {
                            stage: i,
                            op: op.name,
                            needs: format!(
                                "a tensor (its argument `{}` is a buffer of the same shape)",
                                p.name
                            ),
                            prev: stages[pos - 1].op.name,
                            gives: format!(
                                "{}; after a reduction only ops whose other arguments are passed by value can follow",
                                shape_text(&flow_shape)
                            ),
                        });
                    }
                },
                Ty::Row => match flow_dims.as_deref() {
                    Some([.., last]) => vec![Ok(*last)],
                    _ => {
                        return Err(conflict(
                            &name,
                            "needs a tensor flow to broadcast along".into(),
                        ));
                    }
                },
                ty if ty.letters().is_some() => ty
                    .letters()
                    .into_iter()
                    .flatten()
                    .map(|l| letters.iter().find(|x| x.0 == l).map(|x| x.1).ok_or(l))
                    .collect(),
                other => unreachable!("catalog: {} input {} is {other:?}", op.name, p.name),
            };
            let shape: Vec<usize> = match existing {
                Some(s) => {
                    let have = t.args[s].shape.clone();
                    if t.args[s].kind != ArgKind::Input || have.len() != wanted.len() {
                        return Err(conflict(
                            &name,
                            "is used with another shape by an earlier stage (name one of them \
                             differently with #[stage(n, args(...))])"
                                .into(),
                        ));
                    }
                    if t.args[s].dtype != storage(p.ty) {
                        return Err(conflict(
                            &name,
                            format!(
                                "is stored as {} here, but an earlier stage reads it as {}",
                                storage(p.ty),
                                t.args[s].dtype
                            ),
                        ));
                    }
                    for (w, &h) in wanted.iter().zip(&have) {
                        let ok = match *w {
                            Ok(d) => d == h,
                            Err(l) => t.bind(&mut letters, l, h),
                        };
                        if !ok {
                            return Err(conflict(
                                &name,
                                format!(
                                    "is used with another shape by an earlier stage ({}); name one of them \
                                     differently with #[stage(n, args(...))]",
                                    have.iter()
                                        .map(|&d| t.dims[d].name.clone())
                                        .collect::<Vec<_>>()
                                        .join(" x ")
                                ),
                            ));
                        }
                    }
                    inputs[k] = Source::Arg(s);
                    have
                }
                None => {
                    let shape: Vec<usize> = wanted
                        .iter()
                        .map(|w| match *w {
                            Ok(d) => d,
                            Err(l) => t.letter(&mut letters, l),
                        })
                        .collect();
                    t.args.push(ArgDraft {
                        name,
                        kind: ArgKind::Input,
                        shape: shape.clone(),
                        dtype: storage(p.ty),
                    });
                    inputs[k] = Source::Arg(t.args.len() - 1);
                    shape
                }
            };
            debug_assert!(!shape.is_empty());
        }

        let ch_out = op.out_channels.unwrap_or(flow_shape.channels());
        let folds_matrix = per_row && matches!(flow_shape, Shape::Tensor { .. });
        let shape = match op.output {
            Ty::Like => match flow_shape {
                Shape::Tensor { dims, .. } => Shape::Tensor {
                    dims,
                    channels: ch_out,
                },
                other => other,
            },
            ty if ty.letters().is_some() => Shape::Tensor {
                dims: ty
                    .letters()
                    .into_iter()
                    .flatten()
                    .map(|l| t.letter(&mut letters, l))
                    .collect(),
                channels: ch_out,
            },
            Ty::Pairs(l) => Shape::Pairs {
                dim: t.letter(&mut letters, l),
                channels: ch_out,
            },
            // A row-wise reduction: one value per point, or per row of a matrix.
            Ty::Scalar => match flow_shape {
                Shape::Pairs { dim, .. } => Shape::Tensor {
                    dims: vec![dim],
                    channels: 1,
                },
                Shape::Tensor { mut dims, .. } if folds_matrix => {
                    dims.pop();
                    Shape::Tensor { dims, channels: 1 }
                }
                _ => Shape::Scalar,
            },
            other => unreachable!("catalog: {} outputs {other:?}", op.name),
        };
        stages.push(StageIr {
            field: st.field.clone(),
            number: st.number,
            op,
            precision,
            tensor: st.tensor_eligible.unwrap_or(false),
            inputs,
            dims: letters,
            shape,
            tolerance: st.tolerance.map(|t| t.0),
            finite: st.finite.unwrap_or(false),
            // Only where it folds a matrix: after a pairwise op every reduction folds rows.
            per_row: folds_matrix,
            renames: {
                let mut r = st.args.clone();
                r.sort();
                r
            },
        });
    }

    // Declaration index of the stage at each data-flow position, for errors.
    let decl = |pos: usize| order[pos];
    let plan = plan(&stages, decl)?;
    let last = stages.last().expect("non-empty");
    let output = match &last.shape {
        Shape::Scalar => ChainOutput::Scalar,
        Shape::Tensor { channels: 1, .. } => ChainOutput::Vector,
        other => {
            return Err(SpecError::Unfusable {
                stage: decl(stages.len() - 1),
                op: last.op.name,
                reason: format!(
                    "the chain would end with {}, which cannot be stored; add a stage that combines it into one value per element",
                    shape_text(other)
                ),
            });
        }
    };

    // Descriptor layout: buffers and by-value arguments in order of first use, `out`, then one
    // word per dimension.
    let mut args: Vec<ArgSlot> = t
        .args
        .iter()
        .map(|a| ArgSlot {
            name: a.name.to_string(),
            kind: a.kind,
            shape: a.shape.clone(),
            dim: None,
            dtype: a.dtype,
        })
        .collect();
    if let (ChainOutput::Vector, Shape::Tensor { dims, .. }) = (output, &last.shape) {
        args.push(ArgSlot {
            name: "out".into(),
            kind: ArgKind::Output,
            shape: dims.clone(),
            dim: None,
            dtype: DType::F32,
        });
    }
    let mut dims = Vec::with_capacity(t.dims.len());
    for (d, draft) in t.dims.iter().enumerate() {
        let mut name = draft.name.clone();
        let taken = |n: &str, args: &[ArgSlot]| args.iter().any(|a| a.name == n);
        if taken(&name, &args) {
            name = format!("{name}_len");
        }
        let mut k = 2;
        while taken(&name, &args) {
            name = format!("{}{k}", draft.name);
            k += 1;
        }
        let inferred_from = args
            .iter()
            .position(|a| matches!(a.kind, ArgKind::Input | ArgKind::Output) && a.shape == [d]);
        dims.push(DimIr {
            name: name.clone(),
            slot: args.len(),
            inferred_from,
        });
        args.push(ArgSlot {
            name,
            kind: ArgKind::Len,
            shape: vec![],
            dim: Some(d),
            dtype: DType::F32,
        });
    }
    if stages.iter().any(|s| s.tolerance.is_some()) {
        args.push(ArgSlot {
            name: "guard_level".into(),
            kind: ArgKind::Guard,
            shape: vec![],
            dim: None,
            dtype: DType::F32,
        });
    }
    if args.len() > DESC_ARGS {
        return Err(SpecError::TooManyArgs {
            count: args.len(),
            max: DESC_ARGS,
        });
    }

    let mut canonical = format!("pptm-chain/2 domain={} name={}\n", spec.domain, spec.name);
    for s in &stages {
        canonical.push_str(&format!(
            "stage {} {} precision={} tensor={}",
            s.number, s.op.name, s.precision, s.tensor
        ));
        if let Some(t) = s.tolerance {
            canonical.push_str(&format!(" tolerance={t:e}"));
        }
        if s.finite {
            canonical.push_str(" finite");
        }
        if s.per_row {
            canonical.push_str(" per_row");
        }
        if !s.op.cuda.is_empty() {
            // An op of the user's own is its code: a changed body is a changed chain.
            let d = Sha256::digest(s.op.cuda.as_bytes());
            let hex: String = d.iter().take(8).map(|b| format!("{b:02x}")).collect();
            canonical.push_str(&format!(" cuda={hex}"));
        }
        if !s.renames.is_empty() {
            canonical.push_str(" args=");
            canonical.push_str(
                &s.renames
                    .iter()
                    .map(|(p, n)| format!("{p}:{n}"))
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
        canonical.push('\n');
    }
    let digest = Sha256::digest(canonical.as_bytes());
    let spec_hash: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let opcode = variant_opcode(u32::from_be_bytes([
        digest[0], digest[1], digest[2], digest[3],
    ]));

    Ok(ChainIr {
        name: spec.name.clone(),
        domain: spec.domain.clone(),
        stages,
        args,
        dims,
        output,
        plan,
        canonical,
        spec_hash,
        opcode,
    })
}

/// Per-stage checks that need only the declaration: the op exists and honours the attributes.
pub(crate) fn check_stage(
    i: usize,
    st: &crate::StageSpec,
    extra: &[&'static OpDef],
) -> Result<&'static OpDef, SpecError> {
    let mut named = extra.iter().copied().filter(|o| o.name == st.op);
    let own = named.next();
    if named.any(|o| o.cuda != own.map_or("", |f| f.cuda)) {
        return Err(SpecError::OpTwice {
            stage: i,
            name: st.op.clone(),
        });
    }
    if own.is_some() && ops::find(&st.op).is_some() {
        return Err(SpecError::OpShadowed {
            stage: i,
            name: st.op.clone(),
        });
    }
    let op = ops::find(&st.op)
        .or(own)
        .ok_or_else(|| SpecError::UnknownOp {
            stage: i,
            name: st.op.clone(),
            hint: match ops::closest(&st.op) {
                Some(n) => format!("; did you mean `{n}`?"),
                None => {
                    let names: Vec<_> = ops::CATALOG
                        .iter()
                        .map(|o| o.name)
                        .chain(extra.iter().map(|o| o.name))
                        .collect();
                    format!("; known ops: {}", names.join(", "))
                }
            },
        })?;
    let is_reduction = op.class == FusionClass::Reduction;
    if let Some(said) = st.reduction
        && said != is_reduction
    {
        let is = if is_reduction { "is" } else { "is not" };
        return Err(SpecError::ReductionMismatch {
            stage: i,
            op: op.name,
            is,
            said,
        });
    }
    if st.per_row == Some(true) && !is_reduction {
        return Err(SpecError::PerRowUnsupported {
            stage: i,
            op: op.name,
        });
    }
    let tensor = st.tensor_eligible == Some(true);
    if tensor && op.tensor_precisions.is_empty() {
        return Err(SpecError::TensorUnsupported {
            stage: i,
            op: op.name,
        });
    }
    let precision = st.precision.unwrap_or(Precision::Fp32);
    let (offered, place) = if tensor {
        (op.tensor_precisions, " on tensor cores")
    } else {
        (op.precisions, "")
    };
    if !offered.contains(&precision) {
        if !tensor && op.tensor_precisions.contains(&precision) {
            return Err(SpecError::TensorRequired {
                stage: i,
                op: op.name,
                precision,
            });
        }
        let supported: Vec<_> = offered.iter().map(|p| format!("\"{p}\"")).collect();
        return Err(SpecError::PrecisionUnsupported {
            stage: i,
            op: op.name,
            precision,
            supported: format!("{}{place}", supported.join(", ")),
        });
    }
    if st.finite == Some(true)
        && !matches!(
            op.class,
            FusionClass::Elementwise | FusionClass::Broadcast | FusionClass::Reduction
        )
    {
        return Err(SpecError::FiniteUnsupported {
            stage: i,
            op: op.name,
        });
    }
    if let Some(t) = st.tolerance {
        let bad = |reason: &str| SpecError::ToleranceUnsupported {
            stage: i,
            op: op.name,
            reason: reason.to_string(),
        };
        if !(t.0.is_finite() && t.0 > 0.0 && t.0 < 1.0) {
            return Err(bad(
                "must be a number between 0 and 1 (an error relative to the terms' magnitude)",
            ));
        }
        if op.device != ops::MATMUL.device {
            return Err(bad(
                "guards a single Matmul only (the guard samples one product's outputs); other ops have none yet",
            ));
        }
        if !(tensor && matches!(precision, Precision::Bf16 | Precision::Fp16)) {
            return Err(bad(
                "guards a 16-bit tensor-core stage (tensor_eligible = true, precision = \"bf16\" or \"fp16\"), which falls back to fp32; this stage has no lower precision to guard",
            ));
        }
    }
    Ok(op)
}

/// A variant's opcode from the first four bytes of its spec hash: moved past the built-in
/// opcodes (no-op, shutdown, the debug items) where it would collide with one.
fn variant_opcode(raw: u32) -> u32 {
    if raw < FIRST_VARIANT_OPCODE {
        raw + FIRST_VARIANT_OPCODE
    } else {
        raw
    }
}

fn shape_text(s: &Shape) -> String {
    match s {
        Shape::Tensor { dims, channels: 1 } if dims.len() == 1 => "a vector".into(),
        Shape::Tensor { dims, channels: 1 } if dims.len() == 2 => "a matrix".into(),
        Shape::Tensor { dims, channels: 1 } if dims.len() == 3 => "a stack of matrices".into(),
        Shape::Tensor { channels, .. } => format!("a tensor of {channels} values per element"),
        Shape::Pairs { channels: 1, .. } => "per-pair values".into(),
        Shape::Pairs { channels, .. } => format!("per-pair values ({channels} per pair)"),
        Shape::Scalar => "a scalar".into(),
    }
}

/// The fusion rules: fits the stages into `prologue* anchor? epilogue* (reduction finish*)?`
/// (see [`Plan`]), or says why the chain would need a grid-wide barrier.
fn plan(stages: &[StageIr], decl: impl Fn(usize) -> usize) -> Result<Plan, SpecError> {
    let unfusable = |s: usize, reason: &str| SpecError::Unfusable {
        stage: decl(s),
        op: stages[s].op.name,
        reason: reason.to_string(),
    };
    let mut anchor: Option<usize> = None;
    let mut reduction: Option<usize> = None;
    for (s, st) in stages.iter().enumerate() {
        match st.op.class {
            FusionClass::Elementwise | FusionClass::RowReduction => {}
            FusionClass::Broadcast => {
                if anchor.is_none() {
                    return Err(unfusable(
                        s,
                        "a broadcast fuses as the epilogue of a Matmul (or GEMV) before it; it has none",
                    ));
                }
            }
            // The row reduction of a pairwise op (folds each point's row): part of the anchor.
            FusionClass::Reduction
                if anchor
                    .is_some_and(|a| s == a + 1 && stages[a].op.class == FusionClass::Pairwise) => {
            }
            // A reduction of each row of a matrix: the anchor of a `Rows` pass.
            FusionClass::Reduction if st.per_row => {
                if let Some(a) = anchor {
                    return Err(unfusable(
                        s,
                        if ops::is_matmul(stages[a].op) {
                            "folding the rows of a Matmul's output is not supported yet (a row \
                             spans the tiles of several blocks); split the chain in two"
                        } else {
                            "one pass folds the rows of one matrix: it reads the output of an \
                             earlier GEMV/pairwise stage, whose values are not rows of a matrix"
                        },
                    ));
                }
                anchor = Some(s);
            }
            FusionClass::Reduction => {
                if let Some(a) = anchor
                    && ops::is_matmul(stages[a].op)
                {
                    return Err(unfusable(
                        s,
                        "a reduction after Matmul is not supported yet",
                    ));
                }
                reduction = Some(s);
            }
            FusionClass::OutputFusable(_) | FusionClass::Pairwise => {
                if anchor.is_some() {
                    return Err(unfusable(
                        s,
                        "it needs every element of an earlier GEMV/matmul/pairwise stage's output, \
                         which needs a grid-wide barrier between two passes; split the chain in two",
                    ));
                }
                if s > 0 && (st.op.class == FusionClass::Pairwise || ops::is_matmul(st.op)) {
                    return Err(unfusable(
                        s,
                        "it must be the chain's first stage (an elementwise prologue into it is not supported yet)",
                    ));
                }
                anchor = Some(s);
            }
        }
    }
    let len = stages.len();
    let end = reduction.unwrap_or(len);
    let finish = reduction.map_or(len..len, |r| r + 1..len);
    let Some(a) = anchor else {
        return Ok(Plan {
            pattern: Pattern::Map,
            anchor: None,
            prologue: 0..end,
            epilogue: end..end,
            reduction,
            finish,
        });
    };
    let pattern = match stages[a].op.class {
        FusionClass::Pairwise => Pattern::Pairwise,
        FusionClass::Reduction => Pattern::Rows,
        FusionClass::OutputFusable(Anchor::Gemv) => Pattern::Gemv,
        FusionClass::OutputFusable(Anchor::GemvT) => Pattern::GemvT,
        FusionClass::OutputFusable(Anchor::Matmul | Anchor::BatchedMatmul) => Pattern::Matmul,
        _ => unreachable!("no pattern for op {}", stages[a].op.name),
    };
    let first_epilogue = if pattern == Pattern::Pairwise {
        a + 2
    } else {
        a + 1
    };
    if first_epilogue > len {
        return Err(unfusable(
            a,
            "its per-pair values must be consumed by a row reduction in the next stage (KthSmallest, \
             RadiusCount, or any reduction, which then folds each point's row)",
        ));
    }
    Ok(Plan {
        pattern,
        anchor: Some(a),
        prologue: 0..a,
        epilogue: first_epilogue..end,
        reduction,
        finish,
    })
}

/// One argument at submission, by descriptor slot (see [`ChainIr::bind`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArgValue {
    /// A buffer (input or output) of this many elements.
    Buffer(usize),
    /// An f32 passed by value ([`ArgKind::F32`]).
    F32(f32),
    /// A u32 passed by value ([`ArgKind::U32`]).
    U32(u32),
    /// The size of a dimension that is not inferred from a buffer.
    Dim(usize),
    /// A dimension inferred from a buffer's length: nothing to pass. Also what the guard level's
    /// slot takes, which the runtime fills in.
    Inferred,
}

/// The largest size (exclusive) a descriptor carries for a dimension: the device's argument checks
/// refuse anything from 2^48 on (codegen/src/cuda.rs), and `ChainIr::bind` refuses it first.
pub const MAX_DIM: u64 = 1 << 48;

/// Why a submission's arguments do not fit the chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    /// A value of the wrong kind for its slot (a size where a buffer goes, a size passed for a
    /// dimension a buffer gives...).
    #[error("expected {expected} for argument `{arg}`, got {got}")]
    Kind {
        /// The argument's name ([`ArgSlot::name`]).
        arg: String,
        /// What the slot takes, in words ("a buffer", "nothing (the size comes from a buffer)").
        expected: &'static str,
        /// The value passed, as `Debug` shows it.
        got: String,
    },
    /// A buffer's length is not the product of its dimensions' sizes.
    #[error("argument `{arg}` has {got} elements, but {rule} makes {expected}")]
    Length {
        /// The argument's name ([`ArgSlot::name`]).
        arg: String,
        /// The elements the dimensions make.
        expected: usize,
        /// The buffer's length.
        got: usize,
        /// How the dimensions make the count, for the message: `m x n = 3 x 2`, or the buffer
        /// that gave a one-dimensional size.
        rule: String,
    },
    /// A buffer's element count, or its size in f32 bytes, overflows `usize`.
    #[error("argument `{arg}` would have more elements than fit in memory ({rule})")]
    Overflow {
        /// The argument's name ([`ArgSlot::name`]).
        arg: String,
        /// How the dimensions make the count, for the message: `m x n = 3 x 2`, or the buffer
        /// that gave a one-dimensional size.
        rule: String,
    },
    /// Descriptors carry sizes below 2^48 (`MAX_DIM`), and the device refuses larger ones.
    #[error("{dim} = {size} is not below 2^48, the largest size a descriptor carries")]
    DimTooLarge {
        /// The dimension's name ([`DimIr::name`]).
        dim: String,
        /// The size it was given or inferred to have.
        size: usize,
    },
    /// A stage's output, which no buffer holds (a GEMV-T reduced to a scalar), would not fit in
    /// memory: the CPU backend computes it in f64 (and the unfused variant stores it).
    #[error("the output of `{op}` would have more elements than fit in memory ({rule})")]
    StageTooLarge {
        /// The stage's op.
        op: &'static str,
        /// How the output's dimensions make its count (`m x n = 3 x 2`).
        rule: String,
    },
    /// The op's own check ([`OpDef::check`]) refused its by-value arguments or sizes.
    #[error("`{op}`: {reason}")]
    Op {
        /// The stage's op.
        op: &'static str,
        /// What the check said.
        reason: String,
    },
}

impl ChainIr {
    /// Descriptor slots of the input buffers, in order.
    pub fn input_slots(&self) -> impl Iterator<Item = (usize, &ArgSlot)> {
        self.args
            .iter()
            .enumerate()
            .filter(|(_, a)| a.kind == ArgKind::Input)
    }

    /// The slot of the output buffer, if the chain writes one.
    pub fn output_slot(&self) -> Option<usize> {
        self.args.iter().position(|a| a.kind == ArgKind::Output)
    }

    /// The guarded stage, if any: its index and tolerance, and the descriptor slot of the guard
    /// level ([`ArgKind::Guard`]).
    pub fn guard(&self) -> Option<(usize, f64, usize)> {
        let (s, st) = self
            .stages
            .iter()
            .enumerate()
            .find(|(_, st)| st.tolerance.is_some())?;
        let slot = self.args.iter().position(|a| a.kind == ArgKind::Guard)?;
        Some((s, st.tolerance?, slot))
    }

    /// The reduction that ends the chain's pass, if any.
    pub fn reduction(&self) -> Option<&StageIr> {
        self.plan.reduction.map(|r| &self.stages[r])
    }

    /// Whether stage `s` is a reduction that folds rows, one value per row, rather than the
    /// chain's reduction to one value: the rows of a pairwise stage's values (one a point) or of
    /// a matrix (`per_row = true`).
    pub fn folds_rows(&self, s: usize) -> bool {
        self.folds_pair_rows(s) || self.stages[s].per_row
    }

    /// Whether stage `s` is a reduction that folds the rows of a pairwise stage's values.
    pub fn folds_pair_rows(&self, s: usize) -> bool {
        self.stages[s].op.class == FusionClass::Reduction
            && matches!(
                self.stages[s].inputs[0],
                Source::Stage(p) if matches!(self.stages[p].shape, Shape::Pairs { .. })
            )
    }

    /// "m x n = 3 x 2": how dimensions and their sizes make a count, for error messages.
    fn dims_rule(&self, dims: &[usize], sizes: &[usize]) -> String {
        let names: Vec<&str> = dims.iter().map(|&d| self.dims[d].name.as_str()).collect();
        let values: Vec<String> = dims.iter().map(|&d| sizes[d].to_string()).collect();
        format!("{} = {}", names.join(" x "), values.join(" x "))
    }

    /// Checks a submission's arguments (one per descriptor slot) and works out every
    /// dimension's size, in [`ChainIr::dims`] order.
    pub fn bind(&self, args: &[ArgValue]) -> Result<Vec<usize>, BindError> {
        assert_eq!(args.len(), self.args.len(), "one value per descriptor slot");
        let kind_err = |slot: usize, expected: &'static str| BindError::Kind {
            arg: self.args[slot].name.clone(),
            expected,
            got: format!("{:?}", args[slot]),
        };
        for (slot, (a, v)) in self.args.iter().zip(args).enumerate() {
            let ok = match a.kind {
                ArgKind::Input | ArgKind::Output => matches!(v, ArgValue::Buffer(_)),
                ArgKind::F32 => matches!(v, ArgValue::F32(_)),
                ArgKind::U32 => matches!(v, ArgValue::U32(_)),
                ArgKind::Guard => matches!(v, ArgValue::Inferred),
                ArgKind::Len => {
                    let inferred = self.dims[a.dim.expect("len slot")].inferred_from.is_some();
                    matches!(
                        (inferred, v),
                        (true, ArgValue::Inferred) | (false, ArgValue::Dim(_))
                    )
                }
            };
            if !ok {
                let expected = match a.kind {
                    ArgKind::Input | ArgKind::Output => "a buffer",
                    ArgKind::F32 => "an f32",
                    ArgKind::U32 => "a u32",
                    ArgKind::Guard => "nothing (the runtime fills in the guard level)",
                    ArgKind::Len if self.dims[a.dim.unwrap()].inferred_from.is_some() => {
                        "nothing (the size comes from a buffer)"
                    }
                    ArgKind::Len => "a size",
                };
                return Err(kind_err(slot, expected));
            }
        }
        let len_of = |slot: usize| match args[slot] {
            ArgValue::Buffer(n) => n,
            _ => unreachable!("checked"),
        };
        let sizes: Vec<usize> = self
            .dims
            .iter()
            .map(|d| match (d.inferred_from, args[d.slot]) {
                (Some(src), _) => len_of(src),
                (None, ArgValue::Dim(v)) => v,
                _ => unreachable!("checked"),
            })
            .collect();
        // The rule a buffer's length follows, for errors only: formatted on every submission,
        // it was most of a small item's host-side cost.
        let rule = |slot: usize, a: &ArgSlot| match a.shape.as_slice() {
            [d] => match self.dims[*d].inferred_from {
                Some(src) if src != slot => {
                    format!("`{}` (with {} elements)", self.args[src].name, len_of(src))
                }
                _ => format!("{} = {}", self.dims[*d].name, sizes[*d]),
            },
            dims => self.dims_rule(dims, &sizes),
        };
        // The device checks every size against the same limit (codegen's argument checks); one
        // it would refuse is a typed error here, on every backend alike.
        if let Some((d, &size)) = sizes
            .iter()
            .enumerate()
            .find(|&(_, &s)| s as u64 >= MAX_DIM)
        {
            return Err(BindError::DimTooLarge {
                dim: self.dims[d].name.clone(),
                size,
            });
        }
        for (slot, a) in self.args.iter().enumerate() {
            if !matches!(a.kind, ArgKind::Input | ArgKind::Output) {
                continue;
            }
            let expected = a
                .shape
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(sizes[d]))
                .filter(|&e| e.checked_mul(4).is_some())
                .ok_or_else(|| BindError::Overflow {
                    arg: a.name.clone(),
                    rule: rule(slot, a),
                })?;
            let got = len_of(slot);
            if got != expected {
                return Err(BindError::Length {
                    arg: a.name.clone(),
                    expected,
                    got,
                    rule: rule(slot, a),
                });
            }
        }
        // Every stage's output must fit in memory too, as f64 values, even where no buffer holds
        // it: a size no buffer bounds (`n` of a GEMV-T whose m is 0) could be anything.
        for st in &self.stages {
            let Shape::Tensor { dims, channels } = &st.shape else {
                continue;
            };
            let fits = dims
                .iter()
                .try_fold(usize::from(*channels), |acc, &d| acc.checked_mul(sizes[d]))
                .is_some_and(|e| e <= isize::MAX as usize / 8);
            if !fits {
                return Err(BindError::StageTooLarge {
                    op: st.op.name,
                    rule: self.dims_rule(dims, &sizes),
                });
            }
        }
        for st in &self.stages {
            if let Some(check) = st.op.check {
                let (scalars, dims) = self.op_values(st, args, &sizes);
                check(&scalars, &dims).map_err(|reason| BindError::Op {
                    op: st.op.name,
                    reason,
                })?;
            }
        }
        Ok(sizes)
    }

    /// A stage's by-value arguments and dimension sizes, as its op sees them.
    fn op_values(
        &self,
        st: &StageIr,
        args: &[ArgValue],
        sizes: &[usize],
    ) -> (Vec<f64>, Vec<(&'static str, usize)>) {
        let scalars = st
            .op
            .inputs
            .iter()
            .zip(&st.inputs)
            .filter(|(p, _)| p.ty.is_by_value())
            .map(|(_, src)| match src {
                Source::Arg(slot) => match args[*slot] {
                    ArgValue::F32(v) => f64::from(v),
                    ArgValue::U32(v) => f64::from(v),
                    _ => f64::NAN,
                },
                Source::Stage(_) => f64::NAN,
            })
            .collect();
        let dims = st.dims.iter().map(|&(l, d)| (l, sizes[d])).collect();
        (scalars, dims)
    }

    /// How many compute blocks an item asks for, given its dimension sizes (the device caps it
    /// at its grid). A small input stays on one block, so it costs no grid-wide arrival.
    pub fn blocks_for(&self, sizes: &[usize]) -> u32 {
        // The fused pass spreads the work of the stage that sets its shape: the anchor, the row
        // reduction of a pairwise pair (points, not pairs), or the first stage of a map.
        let s = match (self.plan.pattern, self.plan.anchor) {
            (Pattern::Map, _) | (_, None) => 0,
            // (The anchor of `Rows`: the row-wise reduction.)
            (Pattern::Pairwise, Some(a)) => a + 1,
            (_, Some(a)) => a,
        };
        self.stage_blocks(s, sizes)
    }

    /// Values (channels included) stage `s` produces when the chain runs unfused, one kernel per
    /// stage with its output stored: a pairwise stage stores its n×n values, a reduction one.
    /// Saturates at `usize::MAX` (which no allocation satisfies) rather than wrapping: `bind` bounds
    /// the buffers' lengths, not n×n.
    pub fn stage_output_len(&self, s: usize, sizes: &[usize]) -> usize {
        let channels = |c: u8| usize::from(c);
        match &self.stages[s].shape {
            Shape::Tensor { dims, channels: c } => dims
                .iter()
                .fold(channels(*c), |acc, &d| acc.saturating_mul(sizes[d])),
            Shape::Pairs { dim, channels: c } => sizes[*dim]
                .saturating_mul(sizes[*dim])
                .saturating_mul(channels(*c)),
            Shape::Scalar => 1,
        }
    }

    /// Blocks stage `s` asks for when the chain runs unfused.
    pub fn stage_blocks(&self, s: usize, sizes: &[usize]) -> u32 {
        use crate::work;
        let st = &self.stages[s];
        let dim = |l: &str| sizes[st.dim(l).expect("op letter")];
        // Products a batched matmul computes (1 for every other op).
        let batch = st.dim("batch").map_or(1, |d| sizes[d]);
        let blocks = match st.op.class {
            // Rows (of a matrix, or a pairwise stage's points), one a warp. A small matrix too:
            // on one block, each warp's rows are folded one after the other, a memory round trip
            // each, and 64 x 64 took 4.7 µs on the device against 3.8 on four blocks (H100).
            FusionClass::Reduction if self.folds_rows(s) => self
                .stage_output_len(s, sizes)
                .div_ceil(work::ROWS_PER_BLOCK),
            FusionClass::Elementwise | FusionClass::Broadcast | FusionClass::Reduction => self
                .flow_elements(s, sizes)
                .div_ceil(work::MAP_ELEMS_PER_BLOCK),
            FusionClass::OutputFusable(Anchor::Gemv) if st.tensor => {
                dim("m").div_ceil(work::GEMV_MMA_ROWS)
            }
            FusionClass::OutputFusable(Anchor::Gemv) => {
                let m = dim("m");
                m.div_ceil(if m < work::GEMV_SHORT_BELOW {
                    work::GEMV_SHORT_ROWS_PER_BLOCK
                } else {
                    work::GEMV_ROWS_PER_BLOCK
                })
            }
            FusionClass::OutputFusable(Anchor::GemvT) => {
                let n = dim("n");
                n.div_ceil(if n < work::GEMV_T_NARROW_BELOW {
                    work::GEMV_T_NARROW_COLS_PER_BLOCK
                } else {
                    work::GEMV_T_COLS_PER_BLOCK
                })
            }
            FusionClass::OutputFusable(_) if st.tensor => {
                // Tiles are numbered across a batched product's whole batch, and the tile size
                // is chosen from their total (pptm_matmul_mma_batched does the same).
                let tiles = |rows, cols| {
                    dim("m")
                        .div_ceil(rows)
                        .saturating_mul(dim("n").div_ceil(cols))
                        .saturating_mul(batch)
                };
                // A batch of products no taller than a small tile keeps small tiles: a large
                // one would be half empty.
                let short = batch > 1 && dim("m") <= work::MMA_SMALL_TILE;
                match tiles(work::MMA_LARGE_ROWS, work::MMA_LARGE_COLS) {
                    t if t >= work::MMA_LARGE_FROM && !short => t,
                    _ => tiles(work::MMA_SMALL_TILE, work::MMA_SMALL_TILE),
                }
            }
            FusionClass::OutputFusable(_) => {
                let tiles = |edge| {
                    dim("m")
                        .div_ceil(edge)
                        .saturating_mul(dim("n").div_ceil(edge))
                };
                let direct = dim("m")
                    .div_ceil(work::MATMUL_DIRECT_ROWS)
                    .saturating_mul(dim("n").div_ceil(work::MATMUL_DIRECT_COLS));
                // The f32 patterns choose a tile size per product; a batched product's tiles are
                // numbered across the batch (pptm_matmul_batched).
                let per_product = match tiles(work::MATMUL_TILE) {
                    _ if direct <= work::MATMUL_DIRECT_MAX_TILES => direct,
                    t if t < work::MATMUL_SMALL_BELOW => tiles(work::MATMUL_SMALL_TILE),
                    t => t,
                };
                per_product.saturating_mul(batch)
            }
            FusionClass::Pairwise => dim("n")
                .saturating_mul(dim("n"))
                .div_ceil(work::MAP_ELEMS_PER_BLOCK),
            FusionClass::RowReduction => dim("n").div_ceil(work::PAIRWISE_POINTS_PER_BLOCK),
        };
        blocks.clamp(1, u32::MAX as usize) as u32
    }

    /// Elements (not channels) of the value stage `s` reads as its flow input.
    pub fn flow_elements(&self, s: usize, sizes: &[usize]) -> usize {
        let dims = if s == 0 {
            match self.stages[0].inputs[0] {
                Source::Arg(slot) => self.args[slot].shape.clone(),
                Source::Stage(_) => unreachable!(),
            }
        } else {
            match &self.stages[s - 1].shape {
                Shape::Tensor { dims, .. } => dims.clone(),
                Shape::Pairs { dim, .. } => vec![*dim],
                Shape::Scalar => vec![],
            }
        };
        dims.iter()
            .fold(1, |acc: usize, &d| acc.saturating_mul(sizes[d]))
    }

    /// Short human-readable form: `KlDivergence -> SumReduction`.
    pub fn describe(&self) -> String {
        // A stage repeated k times (consecutive stages of one op and one declared number) shows
        // once, as `Op x k`.
        let mut parts: Vec<String> = Vec::new();
        let mut k = 0;
        while k < self.stages.len() {
            let s = &self.stages[k];
            let run = self.stages[k..]
                .iter()
                .take_while(|t| t.number == s.number && t.op.name == s.op.name)
                .count();
            parts.push(if run > 1 {
                format!("{} x {run}", s.op.name)
            } else {
                s.op.name.to_string()
            });
            k += run;
        }
        parts.join(" -> ")
    }
}

/// Result of running a chain on the CPU reference.
#[derive(Debug, Clone, PartialEq)]
pub enum Evaluated {
    /// The value of a chain that ends in a reduction ([`ChainOutput::Scalar`]).
    Scalar(f64),
    /// What a chain that writes `out` would write there, in f64.
    Vector(Vec<f64>),
}

/// An argument's contents for [`ChainIr::eval_f64`], by descriptor slot.
#[derive(Debug, Clone, Copy)]
pub enum EvalArg<'a> {
    /// An f32 input buffer's contents.
    Input(&'a [f32]),
    /// An input already widened to f64 (a bf16 or fp16 buffer's exact values).
    InputF64(&'a [f64]),
    /// A by-value argument (f32 or u32), widened to f64.
    Value(f64),
    /// Output buffers and dimension words: nothing to read.
    None,
}

impl ChainIr {
    /// Runs the chain with each op's f64 reference, stage by stage on whole tensors. `args` has
    /// one entry per descriptor slot; `sizes` comes from [`ChainIr::bind`], which must have
    /// accepted the same arguments.
    pub fn eval_f64(&self, args: &[EvalArg<'_>], sizes: &[usize]) -> Evaluated {
        self.eval_checked(args, sizes).0
    }

    /// As [`ChainIr::eval_f64`], and the first stage declared `finite = true` that produced a NaN
    /// or an infinity: judged as the device stores the value (f32 for an elementwise stage, the
    /// f64 result of a reduction), so every backend fails the same items.
    pub fn eval_checked(
        &self,
        args: &[EvalArg<'_>],
        sizes: &[usize],
    ) -> (Evaluated, Option<usize>) {
        let as_f64: Vec<Vec<f64>> = args
            .iter()
            .map(|a| match a {
                EvalArg::Input(v) => v.iter().map(|&x| f64::from(x)).collect(),
                EvalArg::InputF64(v) => v.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        let value_of = |slot: usize| match args[slot] {
            EvalArg::Value(v) => v,
            _ => f64::NAN,
        };
        // The output of each stage (empty for a pairwise stage, whose values are computed by the
        // row reduction that consumes them) and its channels.
        let mut outs: Vec<Vec<f64>> = Vec::with_capacity(self.stages.len());
        for (s, st) in self.stages.iter().enumerate() {
            let flow: &[f64] = match st.inputs[0] {
                Source::Arg(slot) => &as_f64[slot],
                Source::Stage(j) => &outs[j],
            };
            let inputs = self.op_inputs(st, flow, &as_f64, &value_of, sizes);
            let ch = if s == 0 {
                1
            } else {
                self.stages[s - 1].shape.channels() as usize
            };
            let out = match st.op.cpu {
                CpuImpl::Elementwise(f) => {
                    let row_len = match &st.shape {
                        Shape::Tensor { dims, .. } => dims.last().map_or(1, |&d| sizes[d]),
                        _ => 1,
                    };
                    let elements = flow.len() / ch.max(1);
                    let mut x =
                        Vec::with_capacity(ch + inputs.tensors.len() + inputs.scalars.len());
                    (0..elements)
                        .map(|e| {
                            x.clear();
                            x.extend_from_slice(&flow[e * ch..(e + 1) * ch]);
                            for (p, t) in st.op.inputs[1..]
                                .iter()
                                .filter(|p| !p.ty.is_by_value())
                                .zip(&inputs.tensors)
                            {
                                x.push(if p.ty == Ty::Row {
                                    t[e % row_len]
                                } else {
                                    t[e]
                                });
                            }
                            x.extend_from_slice(&inputs.scalars);
                            (f.one)(&x)
                        })
                        .collect()
                }
                // A row-wise reduction of a matrix: each row folded in column order.
                CpuImpl::Reduction {
                    identity,
                    combine,
                    finish,
                    ..
                } if st.per_row => {
                    let rows = self.stage_output_len(s, sizes);
                    let cols = flow.len().checked_div(rows).unwrap_or(0);
                    (0..rows)
                        .map(|r| {
                            let row = &flow[r * cols..(r + 1) * cols];
                            finish(row.iter().copied().fold(identity, combine), cols)
                        })
                        .collect()
                }
                // A row-wise reduction: each point's row of pair values, folded.
                CpuImpl::Reduction {
                    identity,
                    combine,
                    finish,
                    ..
                } if self.folds_rows(s) => {
                    let mut out = Vec::new();
                    self.pair_rows(s, &outs, &as_f64, &value_of, sizes, |_, row, _| {
                        out.push(finish(
                            row.iter().copied().fold(identity, combine),
                            row.len(),
                        ));
                    });
                    out
                }
                CpuImpl::Reduction {
                    identity,
                    combine,
                    finish,
                    ..
                } => {
                    vec![finish(
                        flow.iter().copied().fold(identity, combine),
                        flow.len(),
                    )]
                }
                CpuImpl::Tensor(f) => f(&inputs),
                CpuImpl::Pair(_) => Vec::new(),
                CpuImpl::Row(row_fn) => {
                    let och = st.shape.channels() as usize;
                    let mut out = Vec::new();
                    self.pair_rows(s, &outs, &as_f64, &value_of, sizes, |i, row, pch| {
                        out.resize((i + 1) * och, 0.0);
                        row_fn(&inputs, i, row, pch, &mut out[i * och..(i + 1) * och]);
                    });
                    out
                }
            };
            outs.push(out);
        }
        // (A row-wise reduction's values are stored as f32, like an elementwise stage's.)
        let non_finite = (0..self.stages.len()).position(|s| {
            let st = &self.stages[s];
            st.finite
                && outs[s].iter().any(|&x| match st.op.class {
                    FusionClass::Reduction if !self.folds_rows(s) => !x.is_finite(),
                    _ => !(x as f32).is_finite(),
                })
        });
        let value = match self.output {
            ChainOutput::Scalar => Evaluated::Scalar(
                outs.last()
                    .and_then(|v| v.first())
                    .copied()
                    .unwrap_or(f64::NAN),
            ),
            ChainOutput::Vector => Evaluated::Vector(outs.pop().unwrap_or_default()),
        };
        (value, non_finite)
    }

    /// Calls `f(i, row, channels)` for each point i of the pairwise stage that stage `s` reads:
    /// `row` holds the values of pairs (i, j), j != i, `channels` each, in order of j.
    fn pair_rows(
        &self,
        s: usize,
        outs: &[Vec<f64>],
        as_f64: &[Vec<f64>],
        value_of: &dyn Fn(usize) -> f64,
        sizes: &[usize],
        mut f: impl FnMut(usize, &[f64], usize),
    ) {
        let Source::Stage(p) = self.stages[s].inputs[0] else {
            unreachable!("rows follow pairs")
        };
        let pst = &self.stages[p];
        let CpuImpl::Pair(pair_fn) = pst.op.cpu else {
            unreachable!("rows follow pairs")
        };
        let pflow: &[f64] = match pst.inputs[0] {
            Source::Arg(slot) => &as_f64[slot],
            Source::Stage(j) => &outs[j],
        };
        let pin = self.op_inputs(pst, pflow, as_f64, value_of, sizes);
        let n = sizes[pst.dim("n").expect("pairwise ops count points in `n`")];
        let pch = pst.shape.channels() as usize;
        let mut row = Vec::with_capacity(n.saturating_sub(1) * pch);
        let mut pair = vec![0.0; pch];
        for i in 0..n {
            row.clear();
            for j in (0..n).filter(|&j| j != i) {
                pair_fn(&pin, i, j, &mut pair);
                row.extend_from_slice(&pair);
            }
            f(i, &row, pch);
        }
    }

    fn op_inputs<'a>(
        &self,
        st: &StageIr,
        flow: &'a [f64],
        as_f64: &'a [Vec<f64>],
        value_of: &dyn Fn(usize) -> f64,
        sizes: &[usize],
    ) -> OpInputs<'a> {
        let mut tensors = Vec::new();
        let mut scalars = Vec::new();
        for (p, src) in st.op.inputs.iter().zip(&st.inputs).skip(1) {
            let Source::Arg(slot) = *src else {
                unreachable!("only input 0 comes from a stage")
            };
            if p.ty.is_by_value() {
                scalars.push(value_of(slot));
            } else {
                tensors.push(as_f64[slot].as_slice());
            }
        }
        OpInputs {
            flow,
            tensors,
            scalars,
            dims: st.dims.iter().map(|&(l, d)| (l, sizes[d])).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StageSpec;

    fn stage(number: u32, op: &str) -> StageSpec {
        StageSpec {
            field: format!("s{number}"),
            number,
            op: op.into(),
            reduction: None,
            tensor_eligible: None,
            precision: None,
            tolerance: None,
            finite: None,
            per_row: None,
            args: Vec::new(),
            repeat: None,
        }
    }

    fn chain(stages: Vec<StageSpec>) -> ChainSpec {
        ChainSpec {
            name: "C".into(),
            domain: "inference".into(),
            stages,
        }
    }

    fn ops(names: &[&str]) -> Result<ChainIr, SpecError> {
        lower(&chain(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| stage(i as u32 + 1, n))
                .collect(),
        ))
    }

    fn layout(ir: &ChainIr) -> Vec<(&str, ArgKind)> {
        ir.args.iter().map(|a| (a.name.as_str(), a.kind)).collect()
    }

    /// A letter bound twice in one stage (a square matrix, `Matrix("n", "n")`, would do it) must
    /// name the same dimension both times; no catalog op has one yet, so this calls the table
    /// directly.
    #[test]
    fn a_letter_bound_twice_in_a_stage_must_name_one_dimension() {
        let mut t = Tables::default();
        let (d, e) = (t.fresh("n", true), t.fresh("m", false));
        let mut letters = Vec::new();
        assert!(t.bind(&mut letters, "n", d));
        // Binding renames a weak (inferred) dimension after the op's letter.
        assert_eq!(t.dims[d].name, "n");
        assert!(!t.dims[d].weak);
        assert!(t.bind(&mut letters, "n", d), "the same dimension again");
        assert!(!t.bind(&mut letters, "n", e), "another dimension");
        assert_eq!(letters, vec![("n", d)]);
    }

    /// An argument name read as a matrix by one stage and as a vector by another is refused,
    /// even where their leading dimensions agree: `y` is n x dy for SubspaceDistances and would be
    /// n for Axpby.
    #[test]
    fn an_argument_read_with_another_rank_is_refused() {
        let err = ops(&["SubspaceDistances", "RadiusCount", "KsgDigamma", "Axpby"]).unwrap_err();
        assert!(
            err.to_string().contains("`y`") && err.to_string().contains("another shape"),
            "{err}"
        );
    }

    #[test]
    fn variant_opcodes_never_take_a_built_in_opcode() {
        assert_eq!(variant_opcode(0), FIRST_VARIANT_OPCODE);
        assert_eq!(
            variant_opcode(FIRST_VARIANT_OPCODE - 1),
            2 * FIRST_VARIANT_OPCODE - 1
        );
        assert_eq!(variant_opcode(FIRST_VARIANT_OPCODE), FIRST_VARIANT_OPCODE);
        assert_eq!(variant_opcode(u32::MAX), u32::MAX);
    }

    /// A flow mismatch names what the earlier stage produces: a vector, a matrix, a stack of
    /// matrices, a scalar.
    #[test]
    fn flow_mismatches_name_the_shape_they_got() {
        for (ops_, gives) in [
            (
                &["Gemv", "ChebyshevDistance", "KthSmallest"][..],
                "produces a vector",
            ),
            (&["Matmul", "Gemv"][..], "produces a matrix"),
            (
                &["BatchedMatmul", "Gemv"][..],
                "produces a stack of matrices",
            ),
            (
                &["KlDivergence", "SumReduction", "Gemv"][..],
                "produces a scalar",
            ),
        ] {
            let e = ops(ops_).unwrap_err();
            assert!(matches!(e, SpecError::FlowMismatch { .. }), "{ops_:?}: {e}");
            assert!(e.to_string().ends_with(gives), "{ops_:?}: {e}");
        }
    }

    /// The descriptor holds DESC_ARGS argument words: a chain that needs exactly that many
    /// lowers, one more is refused. (A matmul's three sizes count, inferred or not; AddDigamma's
    /// `k` meets the matmul's dimension `k`, which becomes `k_len`.)
    #[test]
    fn a_chain_may_fill_the_descriptor_but_not_overflow_it() {
        let full = [
            "Matmul",          // a, w, out and the sizes m, k, n
            "AddBias",         // b
            "Axpby",           // y, alpha, beta
            "BeliefUpdate",    // mu, lr
            "PrecisionWeight", // prec
            "KlDivergence",    // p
            "AddDigamma",      // k (u32)
        ];
        let ir = ops(&full).unwrap();
        assert_eq!(ir.args.len(), DESC_ARGS);
        assert!(
            ir.args
                .iter()
                .any(|a| a.name == "k" && a.kind == ArgKind::U32)
        );
        assert!(
            ir.args
                .iter()
                .any(|a| a.name == "k_len" && a.kind == ArgKind::Len)
        );
        let mut over = full.to_vec();
        over.push("PredictionError"); // pred
        let e = ops(&over).unwrap_err();
        assert!(
            matches!(
                e,
                SpecError::TooManyArgs {
                    count: 16,
                    max: DESC_ARGS
                }
            ),
            "{e}"
        );
    }

    /// `tolerance = x`: a number strictly between 0 and 1, on a Matmul computing in bf16 or fp16
    /// on tensor cores, and nowhere else.
    #[test]
    fn tolerances_are_checked() {
        let guarded = |op: &str, tensor: bool, precision: Precision, t: f64| {
            let mut s = stage(1, op);
            s.tensor_eligible = Some(tensor);
            s.precision = Some(precision);
            s.tolerance = Some(crate::Tolerance(t));
            lower(&chain(vec![s]))
        };
        for p in [Precision::Bf16, Precision::Fp16] {
            assert!(guarded("Matmul", true, p, 0.5).is_ok());
            assert!(guarded("Matmul", true, p, 1e-9).is_ok());
            for t in [0.0, 1.0, -0.1, 2.0, f64::NAN, f64::INFINITY] {
                let e = guarded("Matmul", true, p, t).unwrap_err();
                assert!(e.to_string().contains("between 0 and 1"), "{t}: {e}");
            }
        }
        let e = guarded("Gemv", true, Precision::Bf16, 0.5).unwrap_err();
        assert!(e.to_string().contains("single Matmul"), "{e}");
        let e = guarded("Matmul", true, Precision::Fp8, 0.5).unwrap_err();
        assert!(e.to_string().contains("16-bit tensor-core stage"), "{e}");
        let e = guarded("Matmul", false, Precision::Fp32, 0.5).unwrap_err();
        assert!(e.to_string().contains("16-bit tensor-core stage"), "{e}");
    }

    /// Each anchor op runs its own pattern.
    #[test]
    fn anchors_pick_their_pattern() {
        for (chain, pattern) in [
            (&["KlDivergence", "SumReduction"][..], Pattern::Map),
            (&["Gemv", "Relu"][..], Pattern::Gemv),
            (&["PredictionError", "GemvT"][..], Pattern::GemvT),
            (&["Matmul", "AddBias"][..], Pattern::Matmul),
            (&["BatchedMatmul"][..], Pattern::Matmul),
            (&["ChebyshevDistance", "KthSmallest"][..], Pattern::Pairwise),
        ] {
            assert_eq!(ops(chain).unwrap().plan.pattern, pattern, "{chain:?}");
        }
    }

    #[test]
    fn a_reduction_after_a_pairwise_op_folds_each_row() {
        // Alone: one value per point, stored; the chain has no reduction of its own.
        let rows = ops(&["ChebyshevDistance", "MeanReduction"]).unwrap();
        assert_eq!(rows.plan.pattern, Pattern::Pairwise);
        assert_eq!(rows.plan.anchor, Some(0));
        assert_eq!(rows.plan.reduction, None);
        assert!(rows.folds_rows(1));
        assert!(!rows.folds_rows(0));
        assert_eq!(rows.output, ChainOutput::Vector);
        assert!(
            matches!(&rows.stages[1].shape, Shape::Tensor { dims, channels: 1 } if dims.len() == 1)
        );
        // Then an epilogue and a reduction over the points, which is the chain's.
        let total = ops(&[
            "ChebyshevDistance",
            "MeanReduction",
            "Square",
            "MaxReduction",
        ])
        .unwrap();
        assert_eq!(total.plan.epilogue, 2..3);
        assert_eq!(total.plan.reduction, Some(3));
        assert!(total.folds_rows(1) && !total.folds_rows(3));
        assert_eq!(total.output, ChainOutput::Scalar);
        // It asks for blocks by points, as KthSmallest does, not by pairs.
        let kth = ops(&["ChebyshevDistance", "KthSmallest"]).unwrap();
        let sizes = |ir: &ChainIr| {
            ir.dims
                .iter()
                .map(|d| if d.name == "n" { 100_000 } else { 3 })
                .collect::<Vec<_>>()
        };
        assert_eq!(rows.blocks_for(&sizes(&rows)), kth.blocks_for(&sizes(&kth)));
        // Three values a pair: a reduction folds one.
        let e = ops(&["SubspaceDistances", "SumReduction"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("1 value(s) per element"), "{e}");
        // An elementwise op cannot take the pairs.
        let e = ops(&["ChebyshevDistance", "Relu"]).unwrap_err().to_string();
        assert!(e.contains("per-pair values"), "{e}");
        // The f64 evaluator folds each point's row: three points on a line at 0, 1 and 3 have
        // mean distances 2, 1.5 and 2.5 to the others, and their largest is 2.5.
        assert_eq!(
            layout(&rows),
            [
                ("x", ArgKind::Input),
                ("out", ArgKind::Output),
                ("n", ArgKind::Len),
                ("d", ArgKind::Len)
            ]
        );
        let sizes = rows
            .bind(&[
                ArgValue::Buffer(3),
                ArgValue::Buffer(3),
                ArgValue::Inferred,
                ArgValue::Dim(1),
            ])
            .unwrap();
        let x = [0.0f32, 1.0, 3.0];
        let got = rows.eval_f64(
            &[
                EvalArg::Input(&x),
                EvalArg::None,
                EvalArg::None,
                EvalArg::None,
            ],
            &sizes,
        );
        assert_eq!(got, Evaluated::Vector(vec![2.0, 1.5, 2.5]));
        let widest = ops(&["ChebyshevDistance", "MeanReduction", "MaxReduction"]).unwrap();
        let sizes = widest
            .bind(&[ArgValue::Buffer(3), ArgValue::Dim(3), ArgValue::Dim(1)])
            .unwrap();
        let got = widest.eval_f64(&[EvalArg::Input(&x), EvalArg::None, EvalArg::None], &sizes);
        assert_eq!(got, Evaluated::Scalar(2.5));

        // Its values go on as f32: an fp64 row-wise reduction is refused, not quietly narrowed.
        let mut fold = stage(2, "SumReduction");
        fold.precision = Some(Precision::Fp64);
        let e = lower(&chain(vec![stage(1, "ChebyshevDistance"), fold]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("row-wise reduction folds in f64 already"), "{e}");
    }

    /// `per_row = true`: a reduction folds each row of a matrix (the chain's first input read as
    /// rows x cols), then an epilogue, and perhaps the chain's reduction over the rows.
    #[test]
    fn per_row_folds_each_row_of_a_matrix() {
        let per_row = |number: u32, op: &str| {
            let mut s = stage(number, op);
            s.per_row = Some(true);
            s
        };
        // (obs - pred)^2 summed per row: a `Rows` pass anchored at the reduction.
        let chi2 = lower(&chain(vec![
            stage(1, "PredictionError"),
            stage(2, "Square"),
            per_row(3, "SumReduction"),
        ]))
        .unwrap();
        assert_eq!(chi2.plan.pattern, Pattern::Rows);
        assert_eq!(chi2.plan.anchor, Some(2));
        assert_eq!(chi2.plan.prologue, 0..2);
        assert_eq!(chi2.plan.reduction, None);
        assert!(chi2.folds_rows(2) && !chi2.folds_pair_rows(2));
        assert!(chi2.stages[2].per_row);
        assert_eq!(chi2.output, ChainOutput::Vector);
        assert_eq!(
            layout(&chi2),
            [
                ("obs", ArgKind::Input),
                ("pred", ArgKind::Input),
                ("out", ArgKind::Output),
                ("rows", ArgKind::Len),
                ("cols", ArgKind::Len)
            ]
        );
        // `out` gives the row count; the row length is passed.
        assert_eq!(chi2.dims[0].inferred_from, Some(2));
        assert_eq!(chi2.dims[1].inferred_from, None);
        let sizes = chi2
            .bind(&[
                ArgValue::Buffer(6),
                ArgValue::Buffer(6),
                ArgValue::Buffer(2),
                ArgValue::Inferred,
                ArgValue::Dim(3),
            ])
            .unwrap();
        assert_eq!(sizes, [2, 3]);
        let e = chi2
            .bind(&[
                ArgValue::Buffer(6),
                ArgValue::Buffer(6),
                ArgValue::Buffer(3),
                ArgValue::Inferred,
                ArgValue::Dim(3),
            ])
            .unwrap_err()
            .to_string();
        assert!(e.contains("rows x cols = 3 x 3"), "{e}");
        // The f64 evaluator folds each row in order.
        let (x, mu) = ([1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [0.0f32; 6]);
        let got = chi2.eval_f64(
            &[
                EvalArg::Input(&x),
                EvalArg::Input(&mu),
                EvalArg::None,
                EvalArg::None,
                EvalArg::None,
            ],
            &sizes,
        );
        assert_eq!(got, Evaluated::Vector(vec![14.0, 77.0]));
        // A warp a row, 16 rows a block, whatever the row length.
        for (rows, cols) in [
            (100_000usize, 3usize),
            (100_000, 3000),
            (64, 64),
            (1, 1 << 26),
        ] {
            let want = rows.div_ceil(crate::work::ROWS_PER_BLOCK);
            assert_eq!(
                chi2.blocks_for(&[rows, cols]) as usize,
                want,
                "{rows} x {cols}"
            );
        }
        // Rows of zero length finish the identity (a mean's is NaN), and no rows make nothing.
        let means = lower(&chain(vec![per_row(1, "MeanReduction")])).unwrap();
        let sizes = means
            .bind(&[
                ArgValue::Buffer(0),
                ArgValue::Buffer(2),
                ArgValue::Inferred,
                ArgValue::Dim(0),
            ])
            .unwrap();
        let got = means.eval_f64(
            &[
                EvalArg::Input(&[]),
                EvalArg::None,
                EvalArg::None,
                EvalArg::None,
            ],
            &sizes,
        );
        assert!(
            matches!(&got, Evaluated::Vector(v) if v.len() == 2 && v.iter().all(|x| x.is_nan())),
            "{got:?}"
        );

        // Then an epilogue and the chain's own reduction over the rows.
        let total = lower(&chain(vec![
            stage(1, "Square"),
            per_row(2, "MaxReduction"),
            stage(3, "Sigmoid"),
            stage(4, "SumReduction"),
        ]))
        .unwrap();
        assert_eq!(total.plan.pattern, Pattern::Rows);
        assert_eq!(total.plan.epilogue, 2..3);
        assert_eq!(total.plan.reduction, Some(3));
        assert!(total.folds_rows(1) && !total.folds_rows(3));
        assert_eq!(total.output, ChainOutput::Scalar);
        // `per_row` is part of the chain's identity.
        let whole = ops(&["Square", "MaxReduction", "Sigmoid", "SumReduction"]);
        assert!(whole.is_err() || whole.unwrap().spec_hash != total.spec_hash);

        // Refused: on an op that is not a reduction, on a vector, after Matmul, in fp64.
        let e = lower(&chain(vec![per_row(1, "Relu")])).unwrap_err();
        assert!(e.to_string().contains("is not a reduction"), "{e}");
        assert_eq!(e.blame(), Blame::StageAttr(0, "per_row"));
        let e = lower(&chain(vec![stage(1, "Gemv"), per_row(2, "SumReduction")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a matrix, whose rows"), "{e}");
        let e = lower(&chain(vec![stage(1, "Matmul"), per_row(2, "SumReduction")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rows of a Matmul's output is not supported yet"),
            "{e}"
        );
        let mut wide = per_row(1, "SumReduction");
        wide.precision = Some(Precision::Fp64);
        let e = lower(&chain(vec![wide])).unwrap_err().to_string();
        assert!(e.contains("row-wise reduction folds in f64 already"), "{e}");
        // Two row-wise folds: the second's flow is a vector of row values.
        let e = lower(&chain(vec![
            per_row(1, "SumReduction"),
            per_row(2, "SumReduction"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("a matrix, whose rows"), "{e}");
        // After a pairwise op every reduction folds rows; `per_row` says so again, harmlessly.
        let pairs = lower(&chain(vec![
            stage(1, "ChebyshevDistance"),
            per_row(2, "SumReduction"),
        ]))
        .unwrap();
        assert_eq!(pairs.plan.pattern, Pattern::Pairwise);
        assert!(!pairs.stages[1].per_row && pairs.folds_pair_rows(1));
    }

    #[test]
    fn slots_guard_and_reduction_are_found() {
        let kl = ops(&["KlDivergence", "SumReduction"]).unwrap();
        let inputs: Vec<(usize, &str)> = kl
            .input_slots()
            .map(|(s, a)| (s, a.name.as_str()))
            .collect();
        assert_eq!(inputs, [(0, "q"), (1, "p")]);
        assert_eq!(kl.output_slot(), None);
        assert_eq!(kl.reduction().map(|st| st.op.name), Some("SumReduction"));
        assert_eq!(kl.guard(), None);
        let terms = ops(&["KlDivergence"]).unwrap();
        assert_eq!(terms.output_slot(), Some(2));
        assert!(terms.reduction().is_none());
        // A guarded matmul: the stage, its tolerance and the guard level's slot (after the sizes).
        let mut s = stage(1, "Matmul");
        s.tensor_eligible = Some(true);
        s.precision = Some(Precision::Bf16);
        s.tolerance = Some(crate::Tolerance(0.25));
        let guarded = lower(&chain(vec![stage(2, "Relu"), s])).unwrap();
        let slot = guarded
            .args
            .iter()
            .position(|a| a.kind == ArgKind::Guard)
            .unwrap();
        assert_eq!(slot, guarded.args.len() - 1);
        assert_eq!(guarded.guard(), Some((0, 0.25, slot)));
        let inputs: Vec<&str> = guarded
            .input_slots()
            .map(|(_, a)| a.name.as_str())
            .collect();
        assert_eq!(inputs, ["a", "w"]);
    }

    /// A size passed where a buffer gives it, or missing where none does, is named in the error;
    /// a buffer's length rule names the buffer its size comes from.
    #[test]
    fn bind_errors_say_what_was_expected() {
        let ir = ops(&["Gemv"]).unwrap(); // x[n], a[m x n] -> out[m]
        let slot = |name: &str| ir.args.iter().position(|a| a.name == name).unwrap();
        let base = || -> Vec<ArgValue> {
            ir.args
                .iter()
                .map(|a| match (a.kind, a.name.as_str()) {
                    (ArgKind::Input, "x") => ArgValue::Buffer(3),
                    (ArgKind::Input, _) => ArgValue::Buffer(6),
                    (ArgKind::Output, _) => ArgValue::Buffer(2),
                    _ => ArgValue::Inferred,
                })
                .collect()
        };
        assert_eq!(ir.bind(&base()).unwrap().len(), ir.dims.len());
        let mut a = base();
        a[slot("n")] = ArgValue::Dim(3);
        let e = ir.bind(&a).unwrap_err().to_string();
        assert!(e.contains("nothing (the size comes from a buffer)"), "{e}");
        // `a` has m x n = 2 x 3 elements, n from `x`'s length.
        let mut a = base();
        a[slot("a")] = ArgValue::Buffer(7);
        let e = ir.bind(&a).unwrap_err().to_string();
        assert!(e.contains("argument `a` has 7 elements"), "{e}");
        // m comes from `out`'s length: a longer `out` makes `a` the wrong length.
        let mut a = base();
        a[slot("out")] = ArgValue::Buffer(5);
        let e = ir.bind(&a).unwrap_err().to_string();
        assert!(
            e.contains("argument `a` has 6 elements, but m x n = 5 x 3 makes 15"),
            "{e}"
        );
        // Two vectors of one length: the second's rule names the first.
        let kl = ops(&["KlDivergence", "SumReduction"]).unwrap();
        let vals = [ArgValue::Buffer(4), ArgValue::Buffer(5), ArgValue::Inferred];
        let e = kl.bind(&vals).unwrap_err().to_string();
        assert!(
            e.contains("argument `p` has 5 elements, but `q` (with 4 elements) makes 4"),
            "{e}"
        );
        // A chain whose size no buffer gives wants it passed.
        let mm = ops(&["Matmul"]).unwrap();
        let vals: Vec<ArgValue> = mm
            .args
            .iter()
            .map(|a| match a.kind {
                ArgKind::Input | ArgKind::Output => ArgValue::Buffer(4),
                _ => ArgValue::Inferred,
            })
            .collect();
        let e = mm.bind(&vals).unwrap_err().to_string();
        assert!(e.contains("expected a size"), "{e}");
    }

    /// The blocks each stage asks for when the chain runs unfused, at every boundary of the
    /// rules the device shares (crate::work).
    #[test]
    fn unfused_stages_ask_for_blocks_by_the_shared_rules() {
        use crate::work::*;
        let blocks = |ir: &ChainIr, s: usize, dims: &[(&str, usize)]| {
            let mut sizes = vec![0; ir.dims.len()];
            for &(l, v) in dims {
                sizes[ir.stages[s].dim(l).unwrap()] = v;
            }
            ir.stage_blocks(s, &sizes)
        };
        let gemv = ops(&["Gemv"]).unwrap();
        let short = GEMV_SHORT_BELOW - 1;
        let b = |m| blocks(&gemv, 0, &[("m", m), ("n", 8)]);
        assert_eq!(b(short) as usize, short.div_ceil(GEMV_SHORT_ROWS_PER_BLOCK));
        assert_eq!(
            b(GEMV_SHORT_BELOW) as usize,
            GEMV_SHORT_BELOW.div_ceil(GEMV_ROWS_PER_BLOCK)
        );
        let mut spec = chain(vec![stage(1, "Gemv")]);
        spec.stages[0].tensor_eligible = Some(true);
        spec.stages[0].precision = Some(Precision::Bf16);
        let tensor = lower(&spec).unwrap();
        // Tall enough that CUDA cores would take GEMV_ROWS_PER_BLOCK rows a block.
        let tall = GEMV_SHORT_BELOW + 1000;
        assert_eq!(
            blocks(&tensor, 0, &[("m", tall), ("n", 8)]) as usize,
            tall.div_ceil(GEMV_MMA_ROWS)
        );
        let gemv_t = ops(&["GemvT"]).unwrap();
        let narrow = GEMV_T_NARROW_BELOW - 1;
        let b = |n| blocks(&gemv_t, 0, &[("m", 8), ("n", n)]);
        assert_eq!(
            b(narrow) as usize,
            narrow.div_ceil(GEMV_T_NARROW_COLS_PER_BLOCK)
        );
        assert_eq!(
            b(GEMV_T_NARROW_BELOW) as usize,
            GEMV_T_NARROW_BELOW.div_ceil(GEMV_T_COLS_PER_BLOCK)
        );
        // f32 matmul: direct tiles while few, else MATMUL_TILE tiles, or small ones when those
        // would be fewer than MATMUL_SMALL_BELOW.
        let mm = ops(&["Matmul"]).unwrap();
        let b = |m: usize, n: usize| blocks(&mm, 0, &[("m", m), ("k", 4), ("n", n)]) as usize;
        let direct =
            |m: usize, n: usize| m.div_ceil(MATMUL_DIRECT_ROWS) * n.div_ceil(MATMUL_DIRECT_COLS);
        let tiles = |m: usize, n: usize, e: usize| m.div_ceil(e) * n.div_ceil(e);
        let (m, n) = (MATMUL_DIRECT_ROWS * 16, MATMUL_DIRECT_COLS * 16); // exactly the most direct tiles
        assert_eq!(direct(m, n), MATMUL_DIRECT_MAX_TILES);
        assert_eq!(b(m, n), MATMUL_DIRECT_MAX_TILES);
        let (m, n) = (m + 1, n); // one more row of direct tiles: MATMUL_TILE tiles, few: small ones
        assert!(tiles(m, n, MATMUL_TILE) < MATMUL_SMALL_BELOW);
        assert_eq!(b(m, n), tiles(m, n, MATMUL_SMALL_TILE));
        let (m, n) = (MATMUL_TILE * 8, MATMUL_TILE * 8); // exactly MATMUL_SMALL_BELOW big tiles
        assert_eq!(tiles(m, n, MATMUL_TILE), MATMUL_SMALL_BELOW);
        assert_eq!(b(m, n), MATMUL_SMALL_BELOW);
        // Elementwise passes: MAP_ELEMS_PER_BLOCK each; pairwise rows: points per block.
        let map = ops(&["Relu"]).unwrap();
        let mut sizes = vec![0; map.dims.len()];
        sizes[map.args[0].shape[0]] = MAP_ELEMS_PER_BLOCK + 1;
        assert_eq!(map.stage_blocks(0, &sizes), 2);
        // A later stage's flow is the stage before's output (a reduction's own shape is a scalar).
        let sum = ops(&["Square", "SumReduction"]).unwrap();
        let mut sizes = vec![0; sum.dims.len()];
        sizes[sum.args[0].shape[0]] = MAP_ELEMS_PER_BLOCK + 1;
        assert_eq!(sum.flow_elements(1, &sizes), MAP_ELEMS_PER_BLOCK + 1);
        assert_eq!(sum.stage_blocks(1, &sizes), 2);
        let pairs = ops(&["ChebyshevDistance", "KthSmallest"]).unwrap();
        assert_eq!(
            blocks(&pairs, 1, &[("n", 33)]) as usize,
            33usize.div_ceil(PAIRWISE_POINTS_PER_BLOCK)
        );
    }

    /// Inputs already widened to f64 (what the CPU backend passes) evaluate as f32 ones do; a
    /// checked elementwise stage is judged as the f32 it stores, a checked reduction as its f64
    /// result.
    #[test]
    fn the_evaluator_takes_f64_inputs_and_judges_checked_values_as_stored() {
        let ir = ops(&["KlDivergence"]).unwrap();
        let (q, p) = ([0.5f32, 0.25], [0.25f32, 0.5]);
        let (qw, pw): (Vec<f64>, Vec<f64>) = (
            q.iter().map(|&v| f64::from(v)).collect(),
            p.iter().map(|&v| f64::from(v)).collect(),
        );
        let narrow = ir.eval_f64(
            &[EvalArg::Input(&q), EvalArg::Input(&p), EvalArg::None],
            &[2],
        );
        let wide = ir.eval_f64(
            &[
                EvalArg::InputF64(&qw),
                EvalArg::InputF64(&pw),
                EvalArg::None,
            ],
            &[2],
        );
        assert_eq!(narrow, wide);
        // Elementwise: a term that is finite in f64 but not as the f32 it is stored as fails.
        let mut spec = chain(vec![stage(1, "Square")]);
        spec.stages[0].finite = Some(true);
        let sq = lower(&spec).unwrap();
        let big = [1e20f32, 1.0];
        assert_eq!(
            sq.eval_checked(&[EvalArg::Input(&big), EvalArg::None], &[2])
                .1,
            Some(0)
        );
        let fine = [1e10f32, 1.0];
        assert_eq!(
            sq.eval_checked(&[EvalArg::Input(&fine), EvalArg::None], &[2])
                .1,
            None
        );
        // A reduction: its f64 result is what is checked (1e40 is finite there).
        let mut spec = chain(vec![stage(1, "Square"), stage(2, "SumReduction")]);
        spec.stages[1].finite = Some(true);
        let sum = lower(&spec).unwrap();
        let args = [EvalArg::InputF64(&[1e20, 0.5]), EvalArg::None];
        assert_eq!(sum.eval_checked(&args, &[2]).1, None);
        let args = [EvalArg::InputF64(&[1e200, 0.5]), EvalArg::None];
        assert_eq!(sum.eval_checked(&args, &[2]).1, Some(1));
    }

    #[test]
    fn kl_complexity_lowers_to_a_fused_reduction() {
        let ir = ops(&["KlDivergence", "SumReduction"]).unwrap();
        assert_eq!(ir.output, ChainOutput::Scalar);
        assert_eq!(
            layout(&ir),
            [
                ("q", ArgKind::Input),
                ("p", ArgKind::Input),
                ("n", ArgKind::Len)
            ]
        );
        assert_eq!(ir.dims[0].inferred_from, Some(0));
        assert_eq!(ir.stages[1].inputs, [Source::Stage(0)]);
        assert!(ir.opcode >= FIRST_VARIANT_OPCODE);
        assert_eq!(ir.describe(), "KlDivergence -> SumReduction");
        assert_eq!(ir.plan.pattern, Pattern::Map);
        assert_eq!(ir.plan.prologue, 0..1);
        assert_eq!(ir.plan.reduction, Some(1));
    }

    #[test]
    fn belief_update_types_and_names_its_dimensions() {
        let ir = ops(&[
            "PredictionError",
            "PrecisionWeight",
            "GemvT",
            "BeliefUpdate",
        ])
        .unwrap();
        assert_eq!(
            layout(&ir),
            [
                ("obs", ArgKind::Input),
                ("pred", ArgKind::Input),
                ("prec", ArgKind::Input),
                ("a", ArgKind::Input),
                ("mu", ArgKind::Input),
                ("lr", ArgKind::F32),
                ("out", ArgKind::Output),
                ("m", ArgKind::Len),
                ("n", ArgKind::Len),
            ]
        );
        // obs is m long (the vector GemvT reduces), a is m x n, mu and out are n long.
        assert_eq!(ir.args[0].shape, [0]);
        assert_eq!(ir.args[3].shape, [0, 1]);
        assert_eq!(ir.args[4].shape, [1]);
        assert_eq!(ir.dims[0].inferred_from, Some(0));
        assert_eq!(ir.dims[1].inferred_from, Some(4));
        assert_eq!(ir.plan.pattern, Pattern::GemvT);
        assert_eq!(ir.plan.prologue, 0..2);
        assert_eq!(ir.plan.epilogue, 3..4);
        let sizes = ir
            .bind(&[
                ArgValue::Buffer(3),
                ArgValue::Buffer(3),
                ArgValue::Buffer(3),
                ArgValue::Buffer(6),
                ArgValue::Buffer(2),
                ArgValue::F32(0.5),
                ArgValue::Buffer(2),
                ArgValue::Inferred,
                ArgValue::Inferred,
            ])
            .unwrap();
        assert_eq!(sizes, [3, 2]);
        let e = ir
            .bind(&[
                ArgValue::Buffer(3),
                ArgValue::Buffer(3),
                ArgValue::Buffer(3),
                ArgValue::Buffer(7),
                ArgValue::Buffer(2),
                ArgValue::F32(0.5),
                ArgValue::Buffer(2),
                ArgValue::Inferred,
                ArgValue::Inferred,
            ])
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "argument `a` has 7 elements, but m x n = 3 x 2 makes 6"
        );
        // obs = (1, 2, 3), pred = 0, prec = 1, a = [[1, 0], [0, 1], [1, 1]], mu = (10, 20).
        let a = [1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0];
        let got = ir.eval_f64(
            &[
                EvalArg::Input(&[1.0, 2.0, 3.0]),
                EvalArg::Input(&[0.0; 3]),
                EvalArg::Input(&[1.0; 3]),
                EvalArg::Input(&a),
                EvalArg::Input(&[10.0, 20.0]),
                EvalArg::Value(0.5),
                EvalArg::None,
                EvalArg::None,
                EvalArg::None,
            ],
            &sizes,
        );
        assert_eq!(got, Evaluated::Vector(vec![12.0, 22.5]));
    }

    #[test]
    fn gemv_axpby_sum_of_squares() {
        let ir = ops(&["Gemv", "Axpby", "Square", "SumReduction"]).unwrap();
        assert_eq!(
            layout(&ir),
            [
                ("x", ArgKind::Input),
                ("a", ArgKind::Input),
                ("y", ArgKind::Input),
                ("alpha", ArgKind::F32),
                ("beta", ArgKind::F32),
                ("n", ArgKind::Len),
                ("m", ArgKind::Len),
            ]
        );
        assert_eq!(ir.plan.pattern, Pattern::Gemv);
        assert_eq!(ir.plan.epilogue, 1..3);
        let args = [
            ArgValue::Buffer(2),
            ArgValue::Buffer(2),
            ArgValue::Buffer(1),
            ArgValue::F32(2.0),
            ArgValue::F32(-1.0),
            ArgValue::Inferred,
            ArgValue::Inferred,
        ];
        let sizes = ir.bind(&args).unwrap();
        assert_eq!(sizes, [2, 1]);
        let got = ir.eval_f64(
            &[
                EvalArg::Input(&[1.0, 2.0]),
                EvalArg::Input(&[3.0, 4.0]),
                EvalArg::Input(&[1.0]),
                EvalArg::Value(2.0),
                EvalArg::Value(-1.0),
                EvalArg::None,
                EvalArg::None,
            ],
            &sizes,
        );
        // z = 2 * 11 - 1 = 21.
        assert_eq!(got, Evaluated::Scalar(441.0));
        // Sizes are [n, m]: 16 rows a block below 8192 rows, 64 from there.
        assert_eq!(ir.blocks_for(&[100_000, 4096]), 256);
        assert_eq!(ir.blocks_for(&[100_000, 16_384]), 256);
        assert_eq!(ir.blocks_for(&[7, 1]), 1);
    }

    #[test]
    fn a_stage_output_too_large_for_memory_is_a_bind_error() {
        // Found by tests/dsl_fuzz.rs: with m = 0, x and A are empty whatever n is, and n (a size
        // parameter: the GEMV-T's output is reduced, not stored) sized the f64 reference's output
        // vector ("capacity overflow" for n = 2^64 - 1).
        let ir = ops(&["GemvT", "SumReduction"]).unwrap();
        let args = |n: usize| -> Vec<ArgValue> {
            ir.args
                .iter()
                .map(|a| match (a.kind, a.name.as_str()) {
                    (ArgKind::Len, "n") => ArgValue::Dim(n),
                    (ArgKind::Len, _) => ArgValue::Inferred,
                    _ => ArgValue::Buffer(0),
                })
                .collect()
        };
        // Such sizes are refused before any stage is sized: descriptors carry sizes below
        // MAX_DIM, so an n that no buffer bounds is refused as too large.
        for n in [
            usize::MAX,
            usize::MAX / 4,
            isize::MAX as usize / 8 + 1,
            MAX_DIM as usize,
        ] {
            match ir.bind(&args(n)) {
                Err(BindError::DimTooLarge { dim, size }) => {
                    assert_eq!((dim.as_str(), size), ("n", n))
                }
                other => panic!("n = {n}: {other:?}"),
            }
        }
        assert!(ir.bind(&args(MAX_DIM as usize - 1)).is_ok());
        let sizes = ir.bind(&args(5)).unwrap();
        let eval = vec![EvalArg::Input(&[]); ir.args.len()];
        assert_eq!(ir.eval_f64(&eval, &sizes), Evaluated::Scalar(0.0));
    }

    #[test]
    fn a_matmul_with_no_outputs_returns_at_once() {
        // Found by tests/api_properties.rs: with k = 0 and n = 0 every buffer is empty whatever
        // m is, and the f64 reference looped over m rows doing nothing (17 s for m = 2^34 on the
        // CPU backend; m = usize::MAX never returned; sizes from MAX_DIM on are refused now).
        let ir = ops(&["Matmul", "AddBias", "Relu"]).unwrap();
        let values: Vec<ArgValue> = ir
            .args
            .iter()
            .map(|a| match (a.kind, a.name.as_str()) {
                (ArgKind::Len, "m") => ArgValue::Dim(MAX_DIM as usize - 1),
                (ArgKind::Len, "k") => ArgValue::Dim(0),
                (ArgKind::Len, _) => ArgValue::Inferred,
                _ => ArgValue::Buffer(0),
            })
            .collect();
        let sizes = ir.bind(&values).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let eval = vec![EvalArg::Input(&[]); ir.args.len()];
            let _ = tx.send(ir.eval_f64(&eval, &sizes));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the reference returns at once");
        assert_eq!(got, Evaluated::Vector(Vec::new()));
    }

    #[test]
    fn unfused_sizes_saturate_instead_of_wrapping() {
        // Found by tests/dsl_fuzz.rs: 2^32 points (a 16 GiB `out`, and `x` empty with d = 0) bind,
        // and their n x n pair values overflowed: a panic in a debug build, and in a release build
        // a scratch buffer of 0 bytes for the unfused variant to write 2^64 values into.
        let ir = ops(&["ChebyshevDistance", "KthSmallest"]).unwrap();
        let n = 1usize << 32;
        let args = [
            ArgValue::Buffer(0),
            ArgValue::U32(1),
            ArgValue::Buffer(n),
            ArgValue::Inferred,
            ArgValue::Dim(0),
        ];
        let sizes = ir.bind(&args).unwrap();
        assert_eq!(ir.stage_output_len(0, &sizes), usize::MAX);
        assert_eq!(ir.stage_blocks(0, &sizes), u32::MAX);
        assert_eq!(ir.stage_output_len(1, &sizes), n);
        assert_eq!(
            ir.blocks_for(&sizes),
            (n / crate::work::PAIRWISE_POINTS_PER_BLOCK) as u32
        );
    }

    #[test]
    fn pairwise_chains() {
        let ir = ops(&["ChebyshevDistance", "KthSmallest"]).unwrap();
        assert_eq!(
            layout(&ir),
            [
                ("x", ArgKind::Input),
                ("k", ArgKind::U32),
                ("out", ArgKind::Output),
                ("n", ArgKind::Len),
                ("d", ArgKind::Len),
            ]
        );
        assert_eq!(ir.plan.pattern, Pattern::Pairwise);
        assert_eq!(ir.dims[0].inferred_from, Some(2));
        assert_eq!(ir.dims[1].inferred_from, None);
        // Points 0, 1, 3, 3 on a line (d = 1): a tie at distance 0 counts as a neighbour.
        let x = [0.0f32, 1.0, 3.0, 3.0];
        let args = [
            ArgValue::Buffer(4),
            ArgValue::U32(2),
            ArgValue::Buffer(4),
            ArgValue::Inferred,
            ArgValue::Dim(1),
        ];
        let sizes = ir.bind(&args).unwrap();
        let got = ir.eval_f64(
            &[
                EvalArg::Input(&x),
                EvalArg::Value(2.0),
                EvalArg::None,
                EvalArg::None,
                EvalArg::None,
            ],
            &sizes,
        );
        assert_eq!(got, Evaluated::Vector(vec![3.0, 2.0, 2.0, 2.0]));
        let mut bad = args;
        bad[1] = ArgValue::U32(4);
        assert!(matches!(
            ir.bind(&bad),
            Err(BindError::Op {
                op: "KthSmallest",
                ..
            })
        ));
        bad[1] = ArgValue::U32(0);
        assert!(ir.bind(&bad).is_err());
        bad[1] = ArgValue::U32(2);
        bad[4] = ArgValue::Inferred;
        assert!(matches!(ir.bind(&bad), Err(BindError::Kind { .. })));

        let te = ops(&[
            "SubspaceDistances",
            "RadiusCount",
            "KsgDigamma",
            "MeanReduction",
            "AddDigamma",
        ])
        .unwrap();
        assert_eq!(
            layout(&te),
            [
                ("x", ArgKind::Input),
                ("y", ArgKind::Input),
                ("z", ArgKind::Input),
                ("eps", ArgKind::Input),
                ("k", ArgKind::U32),
                ("n", ArgKind::Len),
                ("dx", ArgKind::Len),
                ("dy", ArgKind::Len),
                ("dz", ArgKind::Len),
            ]
        );
        assert_eq!(te.dims[0].inferred_from, Some(3));
        assert_eq!(te.plan.epilogue, 2..3);
        assert_eq!(te.plan.finish, 4..5);
    }

    #[test]
    fn matmul_bias_activation() {
        let ir = ops(&["Matmul", "AddBias", "Gelu"]).unwrap();
        assert_eq!(
            layout(&ir),
            [
                ("a", ArgKind::Input),
                ("w", ArgKind::Input),
                ("b", ArgKind::Input),
                ("out", ArgKind::Output),
                ("m", ArgKind::Len),
                ("k", ArgKind::Len),
                ("n", ArgKind::Len),
            ]
        );
        assert_eq!(ir.args[3].shape, [0, 2]);
        assert_eq!(ir.dims[2].inferred_from, Some(2));
        let sizes = ir
            .bind(&[
                ArgValue::Buffer(2),
                ArgValue::Buffer(1),
                ArgValue::Buffer(1),
                ArgValue::Buffer(2),
                ArgValue::Dim(2),
                ArgValue::Dim(1),
                ArgValue::Inferred,
            ])
            .unwrap();
        assert_eq!(sizes, [2, 1, 1]);
        // Sizes are [m, k, n]: 8 x 16 direct tiles up to 256 of them, then 32 x 32 tiles below
        // 64 tiles of 64 x 64, 64 x 64 from there.
        assert_eq!(ir.blocks_for(&[64, 256, 256]), 128);
        assert_eq!(ir.blocks_for(&[128, 9, 256]), 256);
        assert_eq!(ir.blocks_for(&[129, 9, 256]), 5 * 8);
        assert_eq!(ir.blocks_for(&[1, 1, 1]), 1);
        assert_eq!(ir.blocks_for(&[512, 7, 448]), 56 * 4);
        assert_eq!(ir.blocks_for(&[512, 7, 512]), 64);
        let relu = ops(&["Matmul", "AddBias", "Relu"]).unwrap();
        let got = relu.eval_f64(
            &[
                EvalArg::Input(&[1.0, -3.0]),
                EvalArg::Input(&[2.0]),
                EvalArg::Input(&[1.0]),
                EvalArg::None,
                EvalArg::None,
                EvalArg::None,
                EvalArg::None,
            ],
            &sizes,
        );
        assert_eq!(got, Evaluated::Vector(vec![3.0, 0.0]));
    }

    #[test]
    fn batched_matmul_stacks_products_and_numbers_tiles_across_the_batch() {
        let ir = ops(&["BatchedMatmul", "AddBias", "Relu"]).unwrap();
        assert_eq!(
            layout(&ir),
            [
                ("a", ArgKind::Input),
                ("w", ArgKind::Input),
                ("b", ArgKind::Input),
                ("out", ArgKind::Output),
                ("batch", ArgKind::Len),
                ("m", ArgKind::Len),
                ("k", ArgKind::Len),
                ("n", ArgKind::Len),
            ]
        );
        // The bias is one per column (n), shared by every product.
        assert_eq!(ir.args[2].shape, [3]);
        assert_eq!(ir.dims[3].inferred_from, Some(2));
        // Two 1 x 2 times 2 x 1 products: [1 -1] [2 3]^T = -1 and [2 1] [1 1]^T = 3, plus 1.
        let sizes = [2, 1, 2, 1];
        let got = ir.eval_f64(
            &[
                EvalArg::Input(&[1.0, -1.0, 2.0, 1.0]),
                EvalArg::Input(&[2.0, 3.0, 1.0, 1.0]),
                EvalArg::Input(&[1.0]),
                EvalArg::None,
                EvalArg::None,
                EvalArg::None,
                EvalArg::None,
                EvalArg::None,
            ],
            &sizes,
        );
        assert_eq!(got, Evaluated::Vector(vec![0.0, 4.0]));
        // Sizes are [batch, m, k, n]: one product's blocks times the batch.
        assert_eq!(ir.blocks_for(&[1, 64, 256, 256]), 128);
        assert_eq!(ir.blocks_for(&[100, 64, 256, 256]), 12800);
        assert_eq!(ir.blocks_for(&[0, 64, 256, 256]), 1);

        let mut spec = chain(vec![
            stage(1, "BatchedMatmul"),
            stage(2, "AddBias"),
            stage(3, "Gelu"),
        ]);
        spec.stages[0].tensor_eligible = Some(true);
        spec.stages[0].precision = Some(Precision::Bf16);
        let tc = lower(&spec).unwrap();
        assert_eq!(tc.args[0].dtype, DType::Bf16);
        assert_eq!(tc.args[1].dtype, DType::Bf16);
        assert_eq!(tc.args[2].dtype, DType::F32);
        // 64 x 64 products take a 64 x 64 tile each however many there are; taller ones take
        // 128 x 64 tiles once the batch has 128 of them.
        assert_eq!(tc.blocks_for(&[100, 64, 64, 64]), 100);
        assert_eq!(tc.blocks_for(&[1000, 64, 64, 64]), 1000);
        assert_eq!(tc.blocks_for(&[100, 256, 64, 64]), 200);
        assert_eq!(tc.blocks_for(&[10, 256, 64, 64]), 10 * 4);
        assert_eq!(tc.blocks_for(&[128, 256, 64, 64]), 256);
        // The guard samples one product: a batched stage refuses it, naming the attribute.
        spec.stages[0].tolerance = Some(crate::Tolerance(1e-2));
        assert!(matches!(
            lower(&spec),
            Err(SpecError::ToleranceUnsupported { .. })
        ));
    }

    #[test]
    fn unfusable_and_mistyped_chains_are_errors() {
        let e = ops(&["Gemv", "GemvT"]).unwrap_err();
        assert!(matches!(e, SpecError::Unfusable { stage: 1, .. }), "{e}");
        assert!(e.to_string().contains("barrier"), "{e}");
        let e = ops(&["KlDivergence", "ChebyshevDistance", "KthSmallest"]).unwrap_err();
        assert!(
            matches!(
                e,
                SpecError::FlowMismatch { .. } | SpecError::Unfusable { .. }
            ),
            "{e}"
        );
        assert!(matches!(
            ops(&["KthSmallest"]).unwrap_err(),
            SpecError::Unfusable { .. }
        ));
        assert!(matches!(
            ops(&["ChebyshevDistance"]).unwrap_err(),
            SpecError::Unfusable { .. }
        ));
        assert!(matches!(
            ops(&["AddBias"]).unwrap_err(),
            SpecError::Unfusable { .. }
        ));
        // Three counts per point cannot be stored.
        let e = ops(&["SubspaceDistances", "RadiusCount"]).unwrap_err();
        assert!(e.to_string().contains("3 values per element"), "{e}");
        // KsgDigamma needs three counts per element.
        assert!(
            matches!(
                ops(&["KsgDigamma"]).unwrap_err(),
                SpecError::FlowMismatch { .. } | SpecError::Unfusable { .. }
            ) || ops(&["KsgDigamma"]).is_ok()
        );
        assert!(matches!(
            ops(&["KsgDigamma"]).unwrap_err(),
            SpecError::Unfusable { .. }
        ));
        let e = ops(&["ChebyshevDistance", "KthSmallest", "KsgDigamma"]).unwrap_err();
        assert!(matches!(e, SpecError::FlowMismatch { .. }), "{e}");
        // A reduction of a reduction, and a buffer after a reduction.
        assert!(matches!(
            ops(&["SumReduction", "SumReduction"]).unwrap_err(),
            SpecError::FlowMismatch { .. }
        ));
        assert!(matches!(
            ops(&["SumReduction", "KlDivergence"]).unwrap_err(),
            SpecError::FlowMismatch { .. }
        ));
        // A by-value name reused as a buffer.
        let e = ops(&[
            "ChebyshevDistance",
            "KthSmallest",
            "AddDigamma",
            "PrecisionWeight",
        ]);
        assert!(e.is_ok(), "{e:?}");
        let e = ops(&["Matmul", "AddBias", "SumReduction"]).unwrap_err();
        assert!(matches!(e, SpecError::Unfusable { .. }));
    }

    #[test]
    fn declaration_order_does_not_matter_and_defaults_hash_like_explicit_values() {
        let a = ops(&["KlDivergence", "SumReduction"]).unwrap();
        let mut s2 = stage(2, "SumReduction");
        s2.reduction = Some(true);
        s2.precision = Some(Precision::Fp32);
        let b = lower(&chain(vec![s2, stage(1, "KlDivergence")])).unwrap();
        assert_eq!(a.spec_hash, b.spec_hash);
        assert_eq!(a.opcode, b.opcode);
    }

    #[test]
    fn hash_changes_with_name_domain_and_stages() {
        let base = ops(&["KlDivergence"]).unwrap();
        let mut renamed = chain(vec![stage(1, "KlDivergence")]);
        renamed.name = "D".into();
        assert_ne!(lower(&renamed).unwrap().spec_hash, base.spec_hash);
        let mut moved = chain(vec![stage(1, "KlDivergence")]);
        moved.domain = "other".into();
        assert_ne!(lower(&moved).unwrap().spec_hash, base.spec_hash);
        let longer = ops(&["KlDivergence", "SumReduction"]).unwrap();
        assert_ne!(longer.spec_hash, base.spec_hash);
    }

    #[test]
    fn vector_chain_gets_an_out_argument() {
        let ir = ops(&["KlDivergence"]).unwrap();
        assert_eq!(ir.output, ChainOutput::Vector);
        assert_eq!(
            ir.args.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
            ["q", "p", "out", "n"]
        );
    }

    #[test]
    fn declaration_errors() {
        assert_eq!(lower(&chain(vec![])).unwrap_err(), SpecError::Empty);
        let e = lower(&chain(vec![
            stage(1, "KlDivergence"),
            stage(3, "SumReduction"),
        ]))
        .unwrap_err();
        assert_eq!(
            e,
            SpecError::StageGap {
                stage: 1,
                expected: 2,
                found: 3
            }
        );
        assert_eq!(e.blame(), Blame::StageNumber(1));
        let e = lower(&chain(vec![
            stage(1, "KlDivergence"),
            stage(1, "SumReduction"),
        ]))
        .unwrap_err();
        assert_eq!(
            e,
            SpecError::DuplicateStage {
                stage: 1,
                number: 1
            }
        );
        let e = lower(&chain(vec![stage(2, "KlDivergence")])).unwrap_err();
        assert!(matches!(
            e,
            SpecError::StageGap {
                expected: 1,
                found: 2,
                ..
            }
        ));
        let e = ops(&["KlDivergance"]).unwrap_err();
        assert!(e.to_string().contains("did you mean `KlDivergence`"), "{e}");
        let e = ops(&["SumReduction", "KlDivergence"]).unwrap_err();
        assert_eq!(e.blame(), Blame::StageOp(1));
        let mut s = stage(1, "KlDivergence");
        s.reduction = Some(true);
        assert!(matches!(
            lower(&chain(vec![s])).unwrap_err(),
            SpecError::ReductionMismatch { .. }
        ));
        let mut s = stage(1, "KlDivergence");
        s.precision = Some(Precision::Bf16);
        let e = lower(&chain(vec![s])).unwrap_err();
        assert_eq!(e.blame(), Blame::StageAttr(0, "precision"));
        let mut s = stage(1, "KlDivergence");
        s.tensor_eligible = Some(true);
        assert!(matches!(
            lower(&chain(vec![s])).unwrap_err(),
            SpecError::TensorUnsupported { .. }
        ));
        let mut bad = chain(vec![stage(1, "KlDivergence")]);
        bad.domain = "Bad Domain".into();
        assert!(matches!(lower(&bad).unwrap_err(), SpecError::BadDomain(_)));
    }

    #[test]
    fn tensor_core_precisions() {
        let mm = |precision: Option<Precision>, tensor: Option<bool>| {
            let mut s = stage(1, "Matmul");
            s.precision = precision;
            s.tensor_eligible = tensor;
            lower(&chain(vec![s, stage(2, "AddBias"), stage(3, "Gelu")]))
        };
        // bf16 and fp16 operands are stored in that type; the bias and the output stay f32.
        for (p, dtype) in [
            (Precision::Bf16, DType::Bf16),
            (Precision::Fp16, DType::F16),
        ] {
            let ir = mm(Some(p), Some(true)).unwrap();
            let types: Vec<(&str, DType)> = ir
                .args
                .iter()
                .filter(|a| matches!(a.kind, ArgKind::Input | ArgKind::Output))
                .map(|a| (a.name.as_str(), a.dtype))
                .collect();
            assert_eq!(
                types,
                [
                    ("a", dtype),
                    ("w", dtype),
                    ("b", DType::F32),
                    ("out", DType::F32)
                ]
            );
            assert!(ir.stages[0].tensor);
            // The attributes are part of the chain's identity.
            assert_ne!(ir.spec_hash, mm(None, None).unwrap().spec_hash);
        }
        assert_ne!(
            mm(Some(Precision::Bf16), Some(true)).unwrap().spec_hash,
            mm(Some(Precision::Fp16), Some(true)).unwrap().spec_hash
        );
        // A 16-bit precision only exists on tensor cores: the error names the fix.
        let e = mm(Some(Precision::Bf16), None).unwrap_err();
        assert!(matches!(e, SpecError::TensorRequired { .. }), "{e}");
        assert!(e.to_string().contains("tensor_eligible = true"), "{e}");
        assert_eq!(e.blame(), Blame::StageAttr(0, "precision"));
        // Tensor cores take no f32 (tf32 would miss the 1e-4 bar) and no fp64.
        for p in [None, Some(Precision::Fp32), Some(Precision::Fp64)] {
            let e = mm(p, Some(true)).unwrap_err();
            assert!(e.to_string().contains("on tensor cores"), "{p:?}: {e}");
        }
        // Large outputs take 128 x 64 tiles, smaller ones 64 x 64 (sizes are [m, k, n]).
        let ir = mm(Some(Precision::Bf16), Some(true)).unwrap();
        let order: Vec<&str> = ir.dims.iter().map(|d| d.name.as_str()).collect();
        let sizes = |m: usize, k: usize, n: usize| -> Vec<usize> {
            order
                .iter()
                .map(|d| match *d {
                    "m" => m,
                    "k" => k,
                    "n" => n,
                    other => panic!("dimension {other}"),
                })
                .collect()
        };
        assert_eq!(ir.blocks_for(&sizes(8192, 8192, 8192)), 64 * 128);
        assert_eq!(ir.blocks_for(&sizes(1024, 1024, 1024)), 8 * 16);
        assert_eq!(ir.blocks_for(&sizes(1000, 1024, 960)), 16 * 15);
        assert_eq!(ir.blocks_for(&sizes(64, 256, 256)), 4);
        assert_eq!(ir.blocks_for(&sizes(1, 1, 1)), 1);
    }

    #[test]
    fn tensor_core_gemv_stores_a_in_its_precision_and_keeps_the_vector_f32() {
        let gemv = |precision: Precision, tolerance: Option<f64>| {
            let mut s = stage(1, "Gemv");
            s.precision = Some(precision);
            s.tensor_eligible = Some(true);
            s.tolerance = tolerance.map(crate::Tolerance);
            lower(&chain(vec![s]))
        };
        for (p, dtype) in [
            (Precision::Bf16, DType::Bf16),
            (Precision::Fp8, DType::F8E4M3),
        ] {
            let ir = gemv(p, None).unwrap();
            let types: Vec<(&str, DType)> = ir
                .args
                .iter()
                .filter(|a| matches!(a.kind, ArgKind::Input | ArgKind::Output))
                .map(|a| (a.name.as_str(), a.dtype))
                .collect();
            assert_eq!(
                types,
                [("x", DType::F32), ("a", dtype), ("out", DType::F32)]
            );
            assert!(ir.stages[0].tensor);
            // One block per 16 rows, whatever n (sizes in the chain's dimension order).
            let sizes: Vec<usize> = ir
                .dims
                .iter()
                .map(|d| if d.name == "m" { 1000 } else { 4096 })
                .collect();
            assert_eq!(ir.blocks_for(&sizes), 63);
        }
        // fp16 would have to carry the f32 vector in fp16's range: not offered.
        let e = gemv(Precision::Fp16, None).unwrap_err();
        assert!(e.to_string().contains("on tensor cores"), "{e}");
        // The accuracy guard samples matrix products only.
        assert!(matches!(
            gemv(Precision::Bf16, Some(1e-2)),
            Err(SpecError::ToleranceUnsupported { .. })
        ));
    }

    #[test]
    fn cuda_core_gemvs_store_a_narrow_and_keep_the_rest_f32() {
        for op in ["Gemv", "GemvT"] {
            for (p, dtype) in [
                (None, DType::F32),
                (Some(Precision::Fp32), DType::F32),
                (Some(Precision::Bf16), DType::Bf16),
                (Some(Precision::Fp16), DType::F16),
                (Some(Precision::Fp8), DType::F8E4M3),
            ] {
                let mut s = stage(1, op);
                s.precision = p;
                let ir = lower(&chain(vec![s, stage(2, "Square")])).unwrap();
                let types: Vec<(&str, DType)> = ir
                    .args
                    .iter()
                    .filter(|a| matches!(a.kind, ArgKind::Input | ArgKind::Output))
                    .map(|a| (a.name.as_str(), a.dtype))
                    .collect();
                assert_eq!(
                    types,
                    [("x", DType::F32), ("a", dtype), ("out", DType::F32)],
                    "{op} {p:?}"
                );
                assert!(!ir.stages[0].tensor);
                // The blocks asked for do not depend on A's storage (sizes in dimension order).
                let sizes: Vec<usize> = ir
                    .dims
                    .iter()
                    .map(|d| if d.name == "m" { 1000 } else { 4096 })
                    .collect();
                let want = if op == "Gemv" { 63 } else { 128 };
                assert_eq!(ir.blocks_for(&sizes), want, "{op} {p:?}");
            }
            // The patterns accumulate in f32: fp64 is refused at the attribute.
            let mut s = stage(1, op);
            s.precision = Some(Precision::Fp64);
            let e = lower(&chain(vec![s])).unwrap_err();
            assert!(matches!(e, SpecError::PrecisionUnsupported { .. }), "{e}");
            assert_eq!(e.blame(), Blame::StageAttr(0, "precision"));
        }
        // GemvT has no tensor-core form.
        let mut s = stage(1, "GemvT");
        s.tensor_eligible = Some(true);
        s.precision = Some(Precision::Bf16);
        assert!(matches!(
            lower(&chain(vec![s])).unwrap_err(),
            SpecError::TensorUnsupported { .. }
        ));
    }

    #[test]
    fn finite_is_accepted_where_values_are_computed_and_refused_inside_patterns() {
        let with_finite = |ops: &[&str], at: usize| {
            let mut stages: Vec<StageSpec> = ops
                .iter()
                .enumerate()
                .map(|(i, n)| stage(i as u32 + 1, n))
                .collect();
            stages[at].finite = Some(true);
            lower(&chain(stages))
        };
        let kl = with_finite(&["KlDivergence", "SumReduction"], 1).unwrap();
        assert!(kl.stages[1].finite && !kl.stages[0].finite);
        // `finite` is part of the chain's identity: a checked chain is a different variant.
        assert_ne!(
            kl.opcode,
            ops(&["KlDivergence", "SumReduction"]).unwrap().opcode
        );
        assert!(
            with_finite(
                &[
                    "PredictionError",
                    "PrecisionWeight",
                    "GemvT",
                    "BeliefUpdate"
                ],
                3
            )
            .is_ok()
        );
        let err = with_finite(
            &[
                "PredictionError",
                "PrecisionWeight",
                "GemvT",
                "BeliefUpdate",
            ],
            2,
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                SpecError::FiniteUnsupported {
                    stage: 2,
                    op: "GemvT"
                }
            ),
            "{err}"
        );
        assert_eq!(err.blame(), Blame::StageAttr(2, "finite"));
        assert!(
            err.to_string().contains("elementwise stage after it"),
            "{err}"
        );
    }

    #[test]
    fn eval_checked_names_the_first_non_finite_checked_stage() {
        let mut stages = vec![stage(1, "KlDivergence"), stage(2, "SumReduction")];
        stages[1].finite = Some(true);
        let ir = lower(&chain(stages)).unwrap();
        let q = [0.5f32, 0.25];
        let args = |p: &'static [f32]| [EvalArg::Input(&q), EvalArg::Input(p), EvalArg::None];
        assert_eq!(ir.eval_checked(&args(&[0.5, 0.25]), &[2]).1, None);
        // q > 0 = p: an infinite term, so an infinite total.
        assert_eq!(ir.eval_checked(&args(&[0.5, 0.0]), &[2]).1, Some(1));
        // Unchecked, the same input is no error.
        let plain = ops(&["KlDivergence", "SumReduction"]).unwrap();
        assert_eq!(plain.eval_checked(&args(&[0.5, 0.0]), &[2]).1, None);
    }

    #[test]
    fn eval_matches_hand_computed_values() {
        let ir = ops(&["KlDivergence", "SumReduction"]).unwrap();
        let q = [0.5f32, 0.0, 0.25];
        let p = [0.25f32, 0.3, 0.25];
        let args = [EvalArg::Input(&q), EvalArg::Input(&p), EvalArg::None];
        let Evaluated::Scalar(s) = ir.eval_f64(&args, &[3]) else {
            panic!()
        };
        assert!((s - 0.5 * 2f64.ln()).abs() < 1e-12);
        let ir = ops(&["KlDivergence"]).unwrap();
        let args = [
            EvalArg::Input(&q),
            EvalArg::Input(&p),
            EvalArg::None,
            EvalArg::None,
        ];
        let Evaluated::Vector(v) = ir.eval_f64(&args, &[3]) else {
            panic!()
        };
        assert_eq!(v.len(), 3);
        assert_eq!(v[1], 0.0);
        let ir = ops(&["SumReduction"]).unwrap();
        assert_eq!(
            ir.eval_f64(&[EvalArg::Input(&q), EvalArg::None], &[3]),
            Evaluated::Scalar(0.75)
        );
        assert_eq!(
            ir.eval_f64(&[EvalArg::Input(&[]), EvalArg::None], &[0]),
            Evaluated::Scalar(0.0)
        );
    }
}
