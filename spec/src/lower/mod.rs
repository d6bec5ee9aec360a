//! Validation and lowering: [`ChainSpec`] → [`ChainIr`], the form codegen and the CPU backend use.
//!
//! Lowering type-checks the chain along its data flow: each op names its dimensions with letters
//! of its own (`Gemv` is `x[n], a[m×n] → [m]`), and the chain unifies them where a stage's
//! output feeds the next stage and where two stages share an argument name. What comes out:
//! the descriptor's argument layout (buffers, by-value arguments, then one word per dimension),
//! the fusion plan (which pass pattern runs the chain, see [`Plan`]), and the chain's identity.

mod bind;
mod error;
mod eval;
mod ir;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

pub use bind::{ArgValue, BindError, MAX_DIM};
pub use error::{Blame, SpecError};
pub use eval::{EvalArg, Evaluated};
pub use ir::{
    ArgKind, ArgSlot, ChainIr, ChainOutput, DimIr, Pattern, Plan, Shape, Source, StageIr,
};

use sha2::{Digest, Sha256};

use crate::chain::valid_domain_name;
use crate::ops::{self, Anchor, FusionClass, OpDef, Ty};
use crate::{ChainSpec, DESC_ARGS, DType, FIRST_VARIANT_OPCODE, Precision};

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
    channels: u8,
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
            Ty::Table(..) => st.tables.unwrap_or(DType::F32),
            _ => DType::F32,
        };
        if st.promoted == Some(true)
            && !(st.tensor_eligible == Some(true)
                && op.class == FusionClass::OutputFusable(crate::ops::Anchor::Matmul)
                && !guarded)
        {
            return Err(SpecError::Unfusable {
                stage: i,
                op: op.name,
                reason: "`accumulate = \"promoted\"` is for a tensor-core product \
                         (`tensor_eligible = true` on a Matmul) without `tolerance`"
                    .into(),
            });
        }
        if st.tables.is_some() && !op.inputs.iter().any(|p| matches!(p.ty, Ty::Table(..))) {
            return Err(SpecError::Unfusable {
                stage: i,
                op: op.name,
                reason: "`tables` sets how its tables are stored, but it reads no table".into(),
            });
        }

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
            // A state (`#[derive(pptm::State)]`) is stored as its fields, interleaved: a chain
            // argument of that many channels. Other values of several channels only ops make.
            let channels = match op.flow_channels {
                Some(need) if need != 1 && op.states.flow.is_none() => {
                    return Err(SpecError::Unfusable {
                        stage: i,
                        op: op.name,
                        reason: format!(
                            "it cannot start a chain: it reads {need} values per element, which only another op produces"
                        ),
                    });
                }
                Some(need) => need,
                None => 1,
            };
            t.args.push(ArgDraft {
                name: arg_name(flow.name),
                kind: ArgKind::Input,
                shape: dims.clone(),
                dtype: storage(flow.ty),
                channels,
            });
            inputs[0] = Source::Arg(t.args.len() - 1);
            Shape::Tensor { dims, channels }
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
                            channels: 1,
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
                        channels: 1,
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
            tables: st.tables.filter(|&d| d != DType::F32),
            promoted: st.promoted.unwrap_or(false),
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
    // An op that reads a table runs where each element is one thread's work: an elementwise pass
    // (maybe ending in a reduction), not inside a matrix or pairwise pattern.
    if plan.pattern != Pattern::Map
        && let Some(s) = stages
            .iter()
            .position(|st| st.op.inputs.iter().any(|p| matches!(p.ty, Ty::Table(..))))
    {
        return Err(SpecError::Unfusable {
            stage: decl(s),
            op: stages[s].op.name,
            reason: "it reads a table, which only a chain of elementwise stages (and a reduction \
                     after them) can: declare it in a chain of its own"
                .into(),
        });
    }
    let last = stages.last().expect("non-empty");
    let output = match &last.shape {
        Shape::Scalar => ChainOutput::Scalar,
        Shape::Tensor { channels: 1, .. } => ChainOutput::Vector,
        // A state: stored as its fields, interleaved.
        Shape::Tensor { .. } if last.op.states.out.is_some() => ChainOutput::Vector,
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
            channels: a.channels,
        })
        .collect();
    if let (ChainOutput::Vector, Shape::Tensor { dims, channels }) = (output, &last.shape) {
        args.push(ArgSlot {
            name: "out".into(),
            kind: ArgKind::Output,
            shape: dims.clone(),
            dim: None,
            dtype: DType::F32,
            channels: *channels,
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
            channels: 1,
        });
    }
    if stages.iter().any(|s| s.precision == Precision::Bf16x3) {
        args.push(ArgSlot {
            name: "scratch".into(),
            kind: ArgKind::Scratch,
            shape: vec![],
            dim: None,
            dtype: DType::F32,
            channels: 1,
        });
    }
    if stages.iter().any(|s| s.tolerance.is_some()) {
        args.push(ArgSlot {
            name: "guard_level".into(),
            kind: ArgKind::Guard,
            shape: vec![],
            dim: None,
            dtype: DType::F32,
            channels: 1,
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
        // (Only where it is not the default, so that other chains' hashes stay as they were.)
        if let Some(DType::F16) = s.tables {
            canonical.push_str(" tables=f16");
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
