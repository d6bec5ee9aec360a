//! Validation and lowering: [`ChainSpec`] → [`ChainIr`], the form codegen and the CPU backend use.

use sha2::{Digest, Sha256};

use crate::chain::valid_domain_name;
use crate::ops::{self, CpuImpl, FusionClass, Kind, OpDef};
use crate::{ChainSpec, DESC_ARGS, FIRST_VARIANT_OPCODE, Precision};

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
    /// Device address of an f32 input vector of `n` elements.
    Input,
    /// Device address of the f32 output vector of `n` elements.
    Output,
    /// The element count `n` shared by every vector of the chain.
    Len,
}

/// One argument word of the chain's descriptor, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgSlot {
    pub name: String,
    pub kind: ArgKind,
}

/// What a submitted chain hands back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainOutput {
    /// A scalar, returned in the completion entry (the chain ends in a reduction).
    Scalar,
    /// A vector written to the `out` argument.
    Vector,
}

/// One stage after lowering.
#[derive(Debug, Clone)]
pub struct StageIr {
    pub field: String,
    pub number: u32,
    pub op: &'static OpDef,
    pub precision: Precision,
    pub tensor: bool,
    /// One source per op input.
    pub inputs: Vec<Source>,
}

/// A validated chain: stages in data-flow order, the descriptor's argument layout, its identity.
#[derive(Debug, Clone)]
pub struct ChainIr {
    pub name: String,
    pub domain: String,
    pub stages: Vec<StageIr>,
    pub args: Vec<ArgSlot>,
    pub output: ChainOutput,
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
    Chain,
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
    #[error(
        "a fusion chain needs at least one stage: add fields marked #[stage(1)], #[stage(2)], ..."
    )]
    Empty,
    #[error(
        "domain \"{0}\" is not a valid domain name: use lowercase ASCII letters, digits and '_', starting with a letter"
    )]
    BadDomain(String),
    #[error("stage number {number} is used twice")]
    DuplicateStage { stage: usize, number: u32 },
    #[error(
        "stage numbers must run 1, 2, 3, ... without gaps: expected stage {expected} here, found {found}"
    )]
    StageGap {
        stage: usize,
        expected: u32,
        found: u32,
    },
    #[error("unknown op `{name}`{hint}")]
    UnknownOp {
        stage: usize,
        name: String,
        hint: String,
    },
    #[error("`{op}` {is} a reduction, but the stage says `reduction = {said}`")]
    ReductionMismatch {
        stage: usize,
        op: &'static str,
        is: &'static str,
        said: bool,
    },
    #[error("`{op}` has no tensor-core path; remove `tensor_eligible = true`")]
    TensorUnsupported { stage: usize, op: &'static str },
    #[error("`{op}` does not implement precision \"{precision}\" (it implements {supported})")]
    PrecisionUnsupported {
        stage: usize,
        op: &'static str,
        precision: Precision,
        supported: String,
    },
    #[error(
        "`{op}` needs {needs} as its input, but the stage before it (`{prev}`) produces {gives}; \
         a reduction can only end a chain"
    )]
    FlowMismatch {
        stage: usize,
        op: &'static str,
        needs: &'static str,
        prev: &'static str,
        gives: &'static str,
    },
    #[error("`{op}` has an input named `out`, which is reserved for the chain's output")]
    ReservedName { stage: usize, op: &'static str },
    #[error("the chain needs {count} descriptor arguments; at most {max} fit")]
    TooManyArgs { count: usize, max: usize },
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
            | SpecError::FlowMismatch { stage, .. }
            | SpecError::ReservedName { stage, .. } => Blame::StageOp(stage),
            SpecError::ReductionMismatch { stage, .. } => Blame::StageAttr(stage, "reduction"),
            SpecError::TensorUnsupported { stage, .. } => {
                Blame::StageAttr(stage, "tensor_eligible")
            }
            SpecError::PrecisionUnsupported { stage, .. } => Blame::StageAttr(stage, "precision"),
        }
    }
}

/// Validates a chain and lowers it to IR.
pub fn lower(spec: &ChainSpec) -> Result<ChainIr, SpecError> {
    if !valid_domain_name(&spec.domain) {
        return Err(SpecError::BadDomain(spec.domain.clone()));
    }
    if spec.stages.is_empty() {
        return Err(SpecError::Empty);
    }
    // Data-flow order is stage-number order; numbers must be exactly 1..=k.
    let mut order: Vec<usize> = (0..spec.stages.len()).collect();
    order.sort_by_key(|&i| (spec.stages[i].number, i));
    for (pos, &i) in order.iter().enumerate() {
        let found = spec.stages[i].number;
        if pos > 0 && spec.stages[order[pos - 1]].number == found {
            return Err(SpecError::DuplicateStage {
                stage: i,
                number: found,
            });
        }
        let expected = pos as u32 + 1;
        if found != expected {
            return Err(SpecError::StageGap {
                stage: i,
                expected,
                found,
            });
        }
    }

    let mut args: Vec<ArgSlot> = Vec::new();
    let mut stages: Vec<StageIr> = Vec::new();
    for (pos, &i) in order.iter().enumerate() {
        let st = &spec.stages[i];
        let op = ops::find(&st.op).ok_or_else(|| SpecError::UnknownOp {
            stage: i,
            name: st.op.clone(),
            hint: match ops::closest(&st.op) {
                Some(n) => format!("; did you mean `{n}`?"),
                None => {
                    let names: Vec<_> = ops::CATALOG.iter().map(|o| o.name).collect();
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
        let tensor = st.tensor_eligible.unwrap_or(false);
        if tensor && !op.tensor_core {
            return Err(SpecError::TensorUnsupported {
                stage: i,
                op: op.name,
            });
        }
        let precision = st.precision.unwrap_or(Precision::Fp32);
        if !op.precisions.contains(&precision) {
            let supported: Vec<_> = op.precisions.iter().map(|p| format!("\"{p}\"")).collect();
            return Err(SpecError::PrecisionUnsupported {
                stage: i,
                op: op.name,
                precision,
                supported: supported.join(", "),
            });
        }
        let mut inputs = Vec::with_capacity(op.inputs.len());
        for (k, param) in op.inputs.iter().enumerate() {
            if k == 0 && pos > 0 {
                let prev = stages[pos - 1].op;
                if prev.output != param.kind {
                    return Err(SpecError::FlowMismatch {
                        stage: i,
                        op: op.name,
                        needs: param.kind.describe(),
                        prev: prev.name,
                        gives: prev.output.describe(),
                    });
                }
                inputs.push(Source::Stage(pos - 1));
                continue;
            }
            if param.name == "out" {
                return Err(SpecError::ReservedName {
                    stage: i,
                    op: op.name,
                });
            }
            debug_assert_eq!(
                param.kind,
                Kind::Vector,
                "scalar op parameters are not supported yet"
            );
            // Inputs of the same name are the same argument.
            let slot = match args.iter().position(|a| a.name == param.name) {
                Some(slot) => slot,
                None => {
                    args.push(ArgSlot {
                        name: param.name.to_string(),
                        kind: ArgKind::Input,
                    });
                    args.len() - 1
                }
            };
            inputs.push(Source::Arg(slot));
        }
        stages.push(StageIr {
            field: st.field.clone(),
            number: st.number,
            op,
            precision,
            tensor,
            inputs,
        });
    }

    let output = match stages.last().map(|s| s.op.output) {
        Some(Kind::Scalar) => ChainOutput::Scalar,
        _ => ChainOutput::Vector,
    };
    if output == ChainOutput::Vector {
        args.push(ArgSlot {
            name: "out".into(),
            kind: ArgKind::Output,
        });
    }
    args.push(ArgSlot {
        name: "n".into(),
        kind: ArgKind::Len,
    });
    if args.len() > DESC_ARGS {
        return Err(SpecError::TooManyArgs {
            count: args.len(),
            max: DESC_ARGS,
        });
    }

    let mut canonical = format!("pptm-chain/1 domain={} name={}\n", spec.domain, spec.name);
    for s in &stages {
        canonical.push_str(&format!(
            "stage {} {} precision={} tensor={}\n",
            s.number, s.op.name, s.precision, s.tensor
        ));
    }
    let digest = Sha256::digest(canonical.as_bytes());
    let spec_hash: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let raw = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    let opcode = if raw < FIRST_VARIANT_OPCODE {
        raw + FIRST_VARIANT_OPCODE
    } else {
        raw
    };

    Ok(ChainIr {
        name: spec.name.clone(),
        domain: spec.domain.clone(),
        stages,
        args,
        output,
        canonical,
        spec_hash,
        opcode,
    })
}

/// Result of running a chain on the CPU reference.
#[derive(Debug, Clone, PartialEq)]
pub enum Evaluated {
    Scalar(f64),
    Vector(Vec<f64>),
}

impl ChainIr {
    /// Descriptor slots of the input vectors, in order.
    pub fn input_slots(&self) -> impl Iterator<Item = (usize, &ArgSlot)> {
        self.args
            .iter()
            .enumerate()
            .filter(|(_, a)| a.kind == ArgKind::Input)
    }

    /// The reduction that ends the chain, if any.
    pub fn reduction(&self) -> Option<&StageIr> {
        self.stages
            .last()
            .filter(|s| s.op.class == FusionClass::Reduction)
    }

    /// How many compute blocks an item over `n` elements asks for (the device caps it at its grid).
    pub fn blocks_for(&self, n: usize) -> u32 {
        n.div_ceil(crate::ELEMS_PER_BLOCK)
            .clamp(1, u32::MAX as usize) as u32
    }

    /// Short human-readable form: `KlDivergence -> SumReduction`.
    pub fn describe(&self) -> String {
        self.stages
            .iter()
            .map(|s| s.op.name)
            .collect::<Vec<_>>()
            .join(" -> ")
    }

    /// Runs the chain with each op's f64 reference. `inputs[k]` is the k-th input vector (in
    /// [`ChainIr::input_slots`] order); all must have the same length (the caller checks).
    #[allow(
        clippy::needless_range_loop,
        reason = "`i` indexes every input vector, not one"
    )]
    pub fn eval_f64(&self, inputs: &[&[f32]]) -> Evaluated {
        let n = inputs.first().map_or(0, |v| v.len());
        debug_assert!(inputs.iter().all(|v| v.len() == n));
        // Map descriptor slot -> position in `inputs`.
        let mut input_of_slot = vec![usize::MAX; self.args.len()];
        for (k, (slot, _)) in self.input_slots().enumerate() {
            input_of_slot[slot] = k;
        }
        let mut acc = match self.reduction().map(|r| r.op.cpu) {
            Some(CpuImpl::Reduction { identity, .. }) => identity,
            _ => 0.0,
        };
        let mut out = Vec::with_capacity(if self.output == ChainOutput::Vector {
            n
        } else {
            0
        });
        let mut values = vec![0.0f64; self.stages.len()];
        let mut x = Vec::with_capacity(4);
        for i in 0..n {
            for (s, stage) in self.stages.iter().enumerate() {
                x.clear();
                x.extend(stage.inputs.iter().map(|src| match *src {
                    Source::Arg(slot) => f64::from(inputs[input_of_slot[slot]][i]),
                    Source::Stage(j) => values[j],
                }));
                values[s] = match stage.op.cpu {
                    CpuImpl::Elementwise(f) => f(&x),
                    CpuImpl::Reduction { combine, .. } => {
                        acc = combine(acc, x[0]);
                        f64::NAN
                    }
                };
            }
            if self.output == ChainOutput::Vector {
                out.push(values[self.stages.len() - 1]);
            }
        }
        match self.output {
            ChainOutput::Scalar => Evaluated::Scalar(match self.reduction().map(|r| r.op.cpu) {
                Some(CpuImpl::Reduction { finish, .. }) => finish(acc, n),
                _ => acc,
            }),
            ChainOutput::Vector => Evaluated::Vector(out),
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
        }
    }

    fn chain(stages: Vec<StageSpec>) -> ChainSpec {
        ChainSpec {
            name: "C".into(),
            domain: "inference".into(),
            stages,
        }
    }

    #[test]
    fn kl_complexity_lowers_to_a_fused_reduction() {
        let ir = lower(&chain(vec![
            stage(1, "KlDivergence"),
            stage(2, "SumReduction"),
        ]))
        .unwrap();
        assert_eq!(ir.output, ChainOutput::Scalar);
        let names: Vec<_> = ir.args.iter().map(|a| (a.name.as_str(), a.kind)).collect();
        assert_eq!(
            names,
            [
                ("q", ArgKind::Input),
                ("p", ArgKind::Input),
                ("n", ArgKind::Len)
            ]
        );
        assert_eq!(ir.stages[1].inputs, [Source::Stage(0)]);
        assert!(ir.opcode >= FIRST_VARIANT_OPCODE);
        assert_eq!(ir.describe(), "KlDivergence -> SumReduction");
    }

    #[test]
    fn declaration_order_does_not_matter_and_defaults_hash_like_explicit_values() {
        let a = lower(&chain(vec![
            stage(1, "KlDivergence"),
            stage(2, "SumReduction"),
        ]))
        .unwrap();
        let mut s2 = stage(2, "SumReduction");
        s2.reduction = Some(true);
        s2.precision = Some(Precision::Fp32);
        let b = lower(&chain(vec![s2, stage(1, "KlDivergence")])).unwrap();
        assert_eq!(a.spec_hash, b.spec_hash);
        assert_eq!(a.opcode, b.opcode);
    }

    #[test]
    fn hash_changes_with_name_domain_and_stages() {
        let base = lower(&chain(vec![stage(1, "KlDivergence")])).unwrap();
        let mut renamed = chain(vec![stage(1, "KlDivergence")]);
        renamed.name = "D".into();
        assert_ne!(lower(&renamed).unwrap().spec_hash, base.spec_hash);
        let mut moved = chain(vec![stage(1, "KlDivergence")]);
        moved.domain = "other".into();
        assert_ne!(lower(&moved).unwrap().spec_hash, base.spec_hash);
        let longer = lower(&chain(vec![
            stage(1, "KlDivergence"),
            stage(2, "SumReduction"),
        ]))
        .unwrap();
        assert_ne!(longer.spec_hash, base.spec_hash);
    }

    #[test]
    fn vector_chain_gets_an_out_argument() {
        let ir = lower(&chain(vec![stage(1, "KlDivergence")])).unwrap();
        assert_eq!(ir.output, ChainOutput::Vector);
        assert_eq!(
            ir.args.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
            ["q", "p", "out", "n"]
        );
    }

    #[test]
    fn errors() {
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
        let e = lower(&chain(vec![stage(1, "KlDivergance")])).unwrap_err();
        assert!(e.to_string().contains("did you mean `KlDivergence`"), "{e}");
        let e = lower(&chain(vec![
            stage(1, "SumReduction"),
            stage(2, "KlDivergence"),
        ]))
        .unwrap_err();
        assert!(
            matches!(e, SpecError::FlowMismatch { stage: 1, .. }),
            "{e:?}"
        );
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
    fn eval_matches_hand_computed_values() {
        let ir = lower(&chain(vec![
            stage(1, "KlDivergence"),
            stage(2, "SumReduction"),
        ]))
        .unwrap();
        let q = [0.5f32, 0.0, 0.25];
        let p = [0.25f32, 0.3, 0.25];
        let Evaluated::Scalar(s) = ir.eval_f64(&[&q, &p]) else {
            panic!()
        };
        assert!((s - 0.5 * 2f64.ln()).abs() < 1e-12);
        let ir = lower(&chain(vec![stage(1, "KlDivergence")])).unwrap();
        let Evaluated::Vector(v) = ir.eval_f64(&[&q, &p]) else {
            panic!()
        };
        assert_eq!(v.len(), 3);
        assert_eq!(v[1], 0.0);
        let ir = lower(&chain(vec![stage(1, "SumReduction")])).unwrap();
        assert_eq!(ir.eval_f64(&[&q]), Evaluated::Scalar(0.75));
        assert_eq!(ir.eval_f64(&[&[]]), Evaluated::Scalar(0.0));
    }
}
