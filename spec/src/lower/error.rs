//! Why a chain is invalid ([`SpecError`]) and which part of its declaration to blame: the
//! errors lowering reports, kept apart so the front ends that map them to spans read them alone.

use crate::Precision;

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
    /// The stages do not fit one pass (see [`Plan`](super::Plan)), or the op cannot stand where it
    /// is.
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
