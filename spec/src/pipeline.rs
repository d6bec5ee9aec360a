//! Build-time pipelines: `#[derive(Pipeline)]` composes declared chains into a fixed sequence of
//! steps, and [`compose`] turns that sequence into the fewest fused passes that keep its meaning.
//!
//! A step is a chain; its arguments bind by name to the pipeline's arguments (steps share an
//! argument by naming it alike, `args(x = "belief")` renames one), and its output is the buffer
//! named after the step's field (or `args(out = "name")`). A step that reads the buffer an
//! earlier step wrote depends on it.
//!
//! Where a step's first input (its flow) is the output of the step just before it, and nothing
//! else reads or writes that buffer, the two run as one pass: the later step's stages continue
//! the earlier step's flow, element by element or tile by tile as the chain model allows
//! (`lower` decides: an elementwise step after a GEMV is its epilogue; an elementwise step before
//! a GEMV computes the vector where it is read). That intermediate buffer is then never stored.
//! Otherwise a step starts a new pass (a *part*), which depends on the whole of the item it reads:
//! the runtime pipeline orders parts on the GPU (dependency counters in one plan).
//!
//! Each part is a chain of its own (`{Pipeline}Part{k}`), generated into the domain of its first
//! step, so the pipeline pays for one dispatch of as many items as it has parts.

use crate::lower::{
    ArgKind, ChainIr, ChainOutput, Misnumbered, SpecError, check_stage, lower_with, numbered_order,
};
use crate::ops::OpDef;
use crate::{ChainSpec, StageSpec};

/// One `#[step(n, ...)]` field, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepSpec {
    /// The field name: also the name of the step's output buffer, unless `args(out = ...)`.
    pub field: String,
    /// The `n` of `#[step(n)]`: the step's position, from 1.
    pub number: u32,
    /// The chain's name (the last segment of the field's type).
    pub chain: String,
    /// `args(chain_arg = "pipeline_arg", ...)`: the pipeline argument each named argument of the
    /// chain binds to, where it is not the argument's own name (`out` included).
    pub args: Vec<(String, String)>,
    /// `repeat = k`: the step's chain applied k times over, the first time to the step's input,
    /// each next time to what the time before produced, in one pass (so only a chain that can run
    /// on its own output, an elementwise one, repeats); the last time's result is the output.
    pub repeat: Option<u32>,
    /// `store = true`: the step's output is stored even where the next step could take it in
    /// registers (so the step ends its part).
    pub store: Option<bool>,
}

/// A pipeline as declared with `#[derive(Pipeline)]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineSpec {
    /// The struct's name; its parts are named `{name}Part{k}`.
    pub name: String,
    /// Steps in declaration order.
    pub steps: Vec<StepSpec>,
}

/// One fused pass of a pipeline: a chain of its own.
#[derive(Debug, Clone)]
pub struct PartIr {
    /// The part's chain, as declared by composition (its arguments are named as the pipeline's).
    pub spec: ChainSpec,
    /// The part's chain, lowered: what codegen generates and the runtime submits.
    pub ir: ChainIr,
    /// The steps (declaration indices) it runs, in order; the last gives the part's result.
    pub steps: Vec<usize>,
    /// For a part that stores a tensor: the pipeline argument its `out` binds to.
    pub output: Option<String>,
}

impl PartIr {
    /// The pipeline argument a part argument binds to (`out` binds to [`PartIr::output`]).
    pub fn binding<'a>(&'a self, chain_arg: &'a str) -> &'a str {
        match (chain_arg, &self.output) {
            ("out", Some(o)) => o,
            _ => chain_arg,
        }
    }
}

/// A composed pipeline.
#[derive(Debug, Clone)]
pub struct PipelineIr {
    /// The pipeline's name (the struct's).
    pub name: String,
    /// The fused passes, in the order they run.
    pub parts: Vec<PartIr>,
}

impl PipelineIr {
    /// One line per part: its steps and what they fused into ("Part1: a + b (Map: Axpby x 2)").
    pub fn describe(&self, steps: &[StepSpec]) -> String {
        self.parts
            .iter()
            .map(|p| {
                let names: Vec<&str> = p.steps.iter().map(|&s| steps[s].field.as_str()).collect();
                format!(
                    "{}: {} ({:?}: {})",
                    p.spec.name,
                    names.join(" + "),
                    p.ir.plan.pattern,
                    p.ir.describe()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Which part of a pipeline declaration an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipelineBlame {
    /// The pipeline as a whole (the struct's name).
    Pipeline,
    /// The `n` of `#[step(n)]` of the step at this declaration index.
    StepNumber(usize),
    /// The chain type of the step at this declaration index.
    StepChain(usize),
    /// One attribute of the step at this declaration index.
    StepAttr(usize, &'static str),
}

/// Why a pipeline is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PipelineError {
    /// The struct has no `#[step]` field.
    #[error("a pipeline needs at least one step: add fields marked #[step(1)], #[step(2)], ...")]
    Empty,
    /// Two steps have the same `#[step(n)]`.
    #[error("step number {number} is used twice")]
    DuplicateStep {
        /// The later-declared step's index in declaration order (what the macro points at).
        step: usize,
        /// The number both steps have.
        number: u32,
    },
    /// The step numbers are not exactly 1..=k.
    #[error(
        "step numbers must run 1, 2, 3, ... without gaps: expected step {expected} here, found {found}"
    )]
    StepGap {
        /// The declaration index of the first step, in number order, whose number is out of place.
        step: usize,
        /// The number this position in step-number order should have.
        expected: u32,
        /// The number the step has.
        found: u32,
    },
    /// No chain of the crate has the step's chain name.
    #[error(
        "no chain `{name}` is declared in this crate (a struct with #[derive(FusionBuilder)] that \
         validates); a pipeline's steps are chains of its own crate"
    )]
    UnknownChain {
        /// The step's index in declaration order (what the derive macro points at).
        step: usize,
        /// The chain name as written.
        name: String,
    },
    /// Two different chain declarations of the crate have the step's chain name.
    #[error(
        "two different chains are named `{name}` in this crate; rename one so the step names one chain"
    )]
    AmbiguousChain {
        /// The step's index in declaration order (what the derive macro points at).
        step: usize,
        /// The name both chains have.
        name: String,
    },
    /// The step's chain does not lower on its own.
    #[error("chain `{chain}` is invalid: {error}")]
    InvalidChain {
        /// The step's index in declaration order (what the derive macro points at).
        step: usize,
        /// The chain's name.
        chain: String,
        /// Why it does not lower.
        error: SpecError,
    },
    /// `args(...)` renames an argument the step's chain does not take.
    #[error("`args(...)` {reason}")]
    BadRename {
        /// The step's index in declaration order (what the derive macro points at).
        step: usize,
        /// What is wrong, completing "`args(...)` ...".
        reason: String,
    },
    /// A pipeline argument is of one kind (buffer, f32, u32, size) in one step and another in
    /// another, or a step reads the name of a step whose value is a scalar.
    #[error("`{arg}`: {reason}")]
    ArgConflict {
        /// The declaration index of the step that uses the name (what the macro points at).
        step: usize,
        /// The pipeline argument's name.
        arg: String,
        /// What clashes.
        reason: String,
    },
    /// `repeat = k` out of range, or on a step whose chain cannot run on its own output in one
    /// pass.
    #[error("`repeat` {reason}")]
    BadRepeat {
        /// The step's index in declaration order (what the derive macro points at).
        step: usize,
        /// What is wrong, completing "`repeat` ...".
        reason: String,
    },
    /// A step's chain has a `precision = "bf16x3"` product, whose split operands go to working
    /// memory the runtime lends each item; a build-time pipeline's parts have none.
    #[error(
        "chain `{chain}` multiplies in bf16x3, which takes working memory the runtime lends an item; push it into a runtime pipeline (`rt.pipeline()`) instead"
    )]
    NeedsScratch {
        /// The step's index in declaration order (what the derive macro points at).
        step: usize,
        /// The chain's name.
        chain: String,
    },
    /// A part, composed of steps that each lower alone, does not lower.
    #[error("the steps cannot run as declared: {error}")]
    Part {
        /// The declaration index of the part's last step (what the macro points at).
        step: usize,
        /// Why the part does not lower.
        error: SpecError,
    },
}

impl PipelineError {
    /// The part of the declaration to point at.
    pub fn blame(&self) -> PipelineBlame {
        match *self {
            PipelineError::Empty => PipelineBlame::Pipeline,
            PipelineError::DuplicateStep { step, .. } | PipelineError::StepGap { step, .. } => {
                PipelineBlame::StepNumber(step)
            }
            PipelineError::UnknownChain { step, .. }
            | PipelineError::AmbiguousChain { step, .. }
            | PipelineError::InvalidChain { step, .. }
            | PipelineError::NeedsScratch { step, .. }
            | PipelineError::Part { step, .. } => PipelineBlame::StepChain(step),
            PipelineError::BadRename { step, .. } | PipelineError::ArgConflict { step, .. } => {
                PipelineBlame::StepAttr(step, "args")
            }
            PipelineError::BadRepeat { step, .. } => PipelineBlame::StepAttr(step, "repeat"),
        }
    }
}

/// A step with its chain looked up and lowered alone.
struct Step<'a> {
    index: usize,
    spec: &'a StepSpec,
    chain: &'a ChainSpec,
    ir: ChainIr,
}

impl Step<'_> {
    /// The pipeline argument a chain argument binds to.
    fn bound(&self, chain_arg: &str) -> String {
        match self.spec.args.iter().find(|(a, _)| a == chain_arg) {
            Some((_, p)) => p.clone(),
            None if chain_arg == "out" => self.spec.field.clone(),
            None => chain_arg.to_string(),
        }
    }

    /// The buffer the step writes, if its chain stores a tensor.
    fn output(&self) -> Option<String> {
        (self.ir.output == ChainOutput::Vector).then(|| self.bound("out"))
    }

    /// The pipeline arguments the step reads as buffers.
    fn reads(&self) -> Vec<String> {
        self.ir
            .args
            .iter()
            .filter(|a| a.kind == ArgKind::Input)
            .map(|a| self.bound(&a.name))
            .collect()
    }

    /// The pipeline argument its flow (the first stage's first input) binds to.
    fn flow(&self) -> Option<String> {
        match self.ir.stages.first()?.inputs.first()? {
            crate::Source::Arg(slot) => Some(self.bound(&self.ir.args[*slot].name)),
            crate::Source::Stage(_) => None,
        }
    }
}

/// Composes a pipeline. `chains` finds a chain's declarations by name (more than one distinct
/// spec is ambiguous); `extra` are the ops of the user's own the chains may name.
pub fn compose<'c>(
    spec: &PipelineSpec,
    chains: &dyn Fn(&str) -> Vec<&'c ChainSpec>,
    extra: &[&'static OpDef],
) -> Result<PipelineIr, PipelineError> {
    if spec.steps.is_empty() {
        return Err(PipelineError::Empty);
    }
    let numbers: Vec<u32> = spec.steps.iter().map(|s| s.number).collect();
    let order = numbered_order(&numbers).map_err(|e| match e {
        Misnumbered::Twice { index, number } => PipelineError::DuplicateStep {
            step: index,
            number,
        },
        Misnumbered::Gap {
            index,
            expected,
            found,
        } => PipelineError::StepGap {
            step: index,
            expected,
            found,
        },
    })?;

    let mut steps: Vec<Step> = Vec::new();
    for &i in &order {
        let st = &spec.steps[i];
        let mut found = chains(&st.chain);
        found.dedup_by(|a, b| a == b);
        let chain = match found.as_slice() {
            [] => {
                return Err(PipelineError::UnknownChain {
                    step: i,
                    name: st.chain.clone(),
                });
            }
            [one] => *one,
            _ => {
                return Err(PipelineError::AmbiguousChain {
                    step: i,
                    name: st.chain.clone(),
                });
            }
        };
        let ir = lower_with(chain, extra).map_err(|error| PipelineError::InvalidChain {
            step: i,
            chain: st.chain.clone(),
            error,
        })?;
        if ir.args.iter().any(|a| a.kind == ArgKind::Scratch) {
            return Err(PipelineError::NeedsScratch {
                step: i,
                chain: st.chain.clone(),
            });
        }
        for (arg, _) in &st.args {
            let known = ir
                .args
                .iter()
                .any(|a| a.name == *arg && a.kind != ArgKind::Len && a.kind != ArgKind::Guard);
            if !known {
                let names: Vec<&str> = ir
                    .args
                    .iter()
                    .filter(|a| a.kind != ArgKind::Len && a.kind != ArgKind::Guard)
                    .map(|a| a.name.as_str())
                    .collect();
                return Err(PipelineError::BadRename {
                    step: i,
                    reason: format!(
                        "renames `{arg}`, which chain `{}` does not take (its arguments: {})",
                        st.chain,
                        names.join(", ")
                    ),
                });
            }
        }
        steps.push(Step {
            index: i,
            spec: st,
            chain,
            ir,
        });
    }

    // A name is a buffer, a scalar or a size wherever it is used.
    let mut kinds: Vec<(String, ArgKind, usize)> = Vec::new();
    for s in &steps {
        for a in &s.ir.args {
            let kind = match a.kind {
                ArgKind::Output => ArgKind::Input,
                ArgKind::Guard => continue,
                k => k,
            };
            let name = s.bound(&a.name);
            match kinds.iter().find(|(n, _, _)| *n == name) {
                Some((_, k, first)) if *k != kind => {
                    let what = |k: ArgKind| match k {
                        ArgKind::Input | ArgKind::Output => "a buffer",
                        ArgKind::F32 => "an f32",
                        ArgKind::U32 => "a u32",
                        _ => "a size",
                    };
                    return Err(PipelineError::ArgConflict {
                        step: s.index,
                        arg: name,
                        reason: format!(
                            "is {} here but {} in step `{}`",
                            what(kind),
                            what(*k),
                            spec.steps[*first].field
                        ),
                    });
                }
                Some(_) => {}
                None => kinds.push((name, kind, s.index)),
            }
        }
        // A step whose value is a scalar leaves no buffer under its name: reading one there is a
        // mistake worth naming.
        if s.ir.output == ChainOutput::Scalar
            && let Some(r) = steps.iter().find(|r| r.reads().contains(&s.spec.field))
        {
            return Err(PipelineError::ArgConflict {
                step: r.index,
                arg: s.spec.field.clone(),
                reason: format!(
                    "step `{}` ends in a reduction: its value is a result of the pipeline, not a buffer a step can read",
                    s.spec.field
                ),
            });
        }
    }

    // Each step's stages as the part's stages: the chain's renames composed with the step's.
    let stages_of = |s: &Step, continues_flow: bool| -> Result<Vec<StageSpec>, PipelineError> {
        let mut out = Vec::new();
        let mut sorted: Vec<&StageSpec> = s.chain.stages.iter().collect();
        sorted.sort_by_key(|st| st.number);
        for (k, st) in sorted.into_iter().enumerate() {
            let op = check_stage(k, st, extra).map_err(|error| PipelineError::InvalidChain {
                step: s.index,
                chain: s.spec.chain.clone(),
                error,
            })?;
            let mut args = Vec::new();
            for (p, param) in op.inputs.iter().enumerate() {
                if p == 0 && (k > 0 || continues_flow) {
                    continue;
                }
                let chain_name = st
                    .args
                    .iter()
                    .find(|(q, _)| q == param.name)
                    .map_or(param.name.to_string(), |(_, n)| n.clone());
                let bound = s.bound(&chain_name);
                if bound != param.name {
                    args.push((param.name.to_string(), bound));
                }
            }
            args.sort();
            out.push(StageSpec {
                field: format!("{}_{}", s.spec.field, st.field),
                args,
                ..st.clone()
            });
        }
        Ok(out)
    };

    let readers = |name: &str, except: usize| {
        steps
            .iter()
            .filter(|r| r.index != except)
            .any(|r| r.reads().iter().any(|n| n == name))
    };
    let writers = |name: &str| {
        steps
            .iter()
            .filter(|w| w.output().as_deref() == Some(name))
            .count()
    };

    let mut parts: Vec<PartIr> = Vec::new();
    let mut current: Option<(ChainSpec, Vec<usize>)> = None;
    let finish = |spec: ChainSpec, members: Vec<usize>, parts: &mut Vec<PartIr>| {
        let last = &steps[*members.last().expect("a part has a step")];
        let step = last.index;
        let ir = lower_with(&spec, extra).map_err(|error| PipelineError::Part { step, error })?;
        let output = (ir.output == ChainOutput::Vector).then(|| last.bound("out"));
        parts.push(PartIr {
            spec,
            ir,
            steps: members.iter().map(|&m| steps[m].index).collect(),
            output,
        });
        Ok::<(), PipelineError>(())
    };
    for (pos, s) in steps.iter().enumerate() {
        let times = s.spec.repeat.unwrap_or(1);
        if !(1..=crate::chain::MAX_REPEAT).contains(&times) {
            return Err(PipelineError::BadRepeat {
                step: s.index,
                reason: format!(
                    "takes a count from 1 to {}, not {times}",
                    crate::chain::MAX_REPEAT
                ),
            });
        }
        // Joins the part before it where that part's last step hands it its flow and nobody else
        // sees the buffer between them.
        let joined = match &current {
            Some((part, members)) if pos > 0 => {
                let prev = &steps[*members.last().expect("a part has a step")];
                let handed = prev.output().filter(|o| {
                    s.flow().as_ref() == Some(o)
                        && prev.spec.store != Some(true)
                        && prev.chain.domain == s.chain.domain
                        && writers(o) == 1
                        && !readers(o, s.index)
                        && s.reads().iter().filter(|n| *n == o).count() == 1
                });
                match handed {
                    Some(_) => {
                        let mut stages = part.stages.clone();
                        stages.extend(stages_of(s, true)?);
                        let candidate = numbered(part, stages);
                        lower_with(&candidate, extra).is_ok().then_some(candidate)
                    }
                    None => None,
                }
            }
            _ => None,
        };
        let (mut part, mut members) = match joined {
            Some(c) => {
                let (_, mut members) = current.take().expect("joined a part");
                members.push(pos);
                (c, members)
            }
            None => {
                if let Some((spec, members)) = current.take() {
                    finish(spec, members, &mut parts)?;
                }
                let spec = ChainSpec {
                    name: format!("{}Part{}", spec.name, parts.len() + 1),
                    domain: s.chain.domain.clone(),
                    stages: stages_of(s, false)?,
                };
                (numbered(&spec, spec.stages.clone()), vec![pos])
            }
        };
        // `repeat = k`: k - 1 more copies, each continuing the flow of the one before.
        if times > 1 {
            let refuse = |reason: String| PipelineError::BadRepeat {
                step: s.index,
                reason,
            };
            let copy = stages_of(s, true)?;
            let mut stages = part.stages.clone();
            if let [single] = copy.as_slice() {
                // One stage: the chain's own `repeat` covers the copies.
                let last = stages.last_mut().expect("the step's stage");
                let total = single.repeat.unwrap_or(1) as u64 * times as u64;
                if total > crate::chain::MAX_REPEAT as u64 {
                    return Err(refuse(format!(
                        "runs {total} stages in one pass; at most {} fit",
                        crate::chain::MAX_REPEAT
                    )));
                }
                last.repeat = Some(total as u32);
            } else {
                let total = copy.len() as u64 * times as u64;
                if total > crate::chain::MAX_REPEAT as u64 {
                    return Err(refuse(format!(
                        "runs {total} stages in one pass; at most {} fit",
                        crate::chain::MAX_REPEAT
                    )));
                }
                for _ in 1..times {
                    stages.extend(copy.iter().cloned());
                }
            }
            let candidate = numbered(&part, stages);
            if let Err(e) = lower_with(&candidate, extra) {
                return Err(refuse(format!(
                    "needs a chain that runs on its own output in one pass (an elementwise chain); \
                     `{}` cannot: {e}. Push it in a `Pipeline::repeat` loop instead",
                    s.spec.chain
                )));
            }
            part = candidate;
        }
        members.shrink_to_fit();
        current = Some((part, members));
    }
    if let Some((spec, members)) = current.take() {
        finish(spec, members, &mut parts)?;
    }
    Ok(PipelineIr {
        name: spec.name.clone(),
        parts,
    })
}

/// `spec` with `stages` numbered 1, 2, 3, ... in order.
fn numbered(spec: &ChainSpec, mut stages: Vec<StageSpec>) -> ChainSpec {
    for (k, st) in stages.iter_mut().enumerate() {
        st.number = k as u32 + 1;
    }
    ChainSpec {
        name: spec.name.clone(),
        domain: spec.domain.clone(),
        stages,
    }
}
