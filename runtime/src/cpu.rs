//! The CPU backend: runs a chain's IR with each op's f64 reference (pptm-spec), at submission.
//!
//! Elementwise chains (with or without a reduction) take a fast path: every stage fused per
//! element, in f64, over the f32 inputs where they lie, in parallel chunks on rayon's pool
//! ([`run_map`]). Every other chain runs the whole-tensor reference (`ChainIr::eval_checked`),
//! which widens its inputs to f64 first.

use pptm_spec::{ArgKind, ChainIr, CpuImpl, EvalArg, Evaluated, Pattern, Source, StageIr, Ty};
use rayon::prelude::*;

use crate::chain::{Arg, Completion, InputBuffer};
use crate::error::{Error, Result};

/// Runs `ir` on host buffers; writes the output tensor, if any, as f32. `args` are by descriptor
/// slot (`None` for dimensions inferred from buffers and the guard word) and `sizes` come from a
/// successful bind. A guarded chain's completion value is the guard's (crate::guard::emulate) at
/// `guard_level`; the output is f64 arithmetic either way. `reference`: skip the fast path.
pub(crate) fn run(
    chain: &'static str,
    ir: &ChainIr,
    args: Vec<Option<Arg<'_>>>,
    sizes: &[usize],
    guard_level: u32,
    reference: bool,
) -> Result<Completion> {
    let not_host = |arg: &'static str| Error::ForeignBuffer { chain, arg };
    let mut args = args;
    // The output buffer, taken out of the arguments so that they can be read beside it.
    let mut output: Option<&mut [f32]> = None;
    if let Some(slot) = args.iter().position(|a| matches!(a, Some(Arg::Output(..))))
        && let Some(Arg::Output(name, b)) = args[slot].take()
    {
        output = Some(b.host_slice_mut().ok_or_else(|| not_host(name))?);
    }
    for a in &args {
        if let Some(Arg::Input(name, b)) = a
            && !on_host(b)
        {
            return Err(not_host(name));
        }
    }
    if let Some((value, non_finite)) = (!reference)
        .then(|| run_map(ir, &args, &mut output))
        .flatten()
    {
        return Ok(completion(value, non_finite));
    }
    // Inputs widened to f64 (every element type converts exactly), by slot.
    let mut wide: Vec<Vec<f64>> = Vec::with_capacity(args.len());
    for a in &args {
        wide.push(match a {
            Some(Arg::Input(name, b)) => b.host_f64().ok_or_else(|| not_host(name))?,
            _ => Vec::new(),
        });
    }
    let mut eval = Vec::with_capacity(args.len());
    for ((a, slot), wide) in args.into_iter().zip(&ir.args).zip(&wide) {
        eval.push(match a {
            Some(Arg::Input(..)) => EvalArg::InputF64(wide),
            Some(Arg::F32(_, v)) => EvalArg::Value(f64::from(v)),
            Some(Arg::U32(_, v)) => EvalArg::Value(f64::from(v)),
            Some(Arg::Output(..) | Arg::Dim(..)) | None => {
                debug_assert!(matches!(
                    slot.kind,
                    ArgKind::Len | ArgKind::Guard | ArgKind::Output
                ));
                EvalArg::None
            }
        });
    }
    let guard_value = ir.guard().map(|(stage, _, _)| {
        let operand = |k: usize| match ir.stages[stage].inputs[k] {
            pptm_spec::Source::Arg(slot) => wide[slot].as_slice(),
            pptm_spec::Source::Stage(_) => unreachable!("a guarded matmul reads chain arguments"),
        };
        crate::guard::emulate(ir, stage, guard_level, operand(0), operand(1), sizes)
    });
    let (evaluated, non_finite) = ir.eval_checked(&eval, sizes);
    let value = match evaluated {
        Evaluated::Scalar(v) => v,
        Evaluated::Vector(v) => {
            let out = output.ok_or_else(|| Error::BadArguments {
                chain,
                reason: "no output buffer".into(),
            })?;
            for (o, x) in out.iter_mut().zip(v) {
                *o = x as f32;
            }
            guard_value.unwrap_or(0.0)
        }
    };
    Ok(completion(value, non_finite.is_some()))
}

/// Whether an input lives in host memory (a buffer of the CPU backend).
fn on_host(b: &InputBuffer<'_>) -> bool {
    match b {
        InputBuffer::F32(b) => b.host_slice().is_some(),
        InputBuffer::Bf16(b) => b.host_slice().is_some(),
        InputBuffer::F16(b) => b.host_slice().is_some(),
        InputBuffer::F8E4M3(b) => b.host_slice().is_some(),
    }
}

/// A completion as the device reports it (a non-finite value fails the item; its outputs are
/// written all the same).
fn completion(value: f64, non_finite: bool) -> Completion {
    Completion {
        status: if non_finite {
            crate::gpu::abi::PPTM_STATUS_NON_FINITE
        } else {
            crate::gpu::abi::PPTM_STATUS_OK
        },
        value,
        device_ns: None,
        paths: None,
    }
}

/// Elements per chunk of the elementwise fast path: each chunk is one rayon task, and reductions
/// combine their chunks' partials in chunk order (so results do not depend on the thread count).
const CHUNK: usize = 16 * 1024;

/// The most operands (flow, tensors, by-value arguments) a stage of the fast path takes.
const MAX_OPERANDS: usize = 16;

/// One elementwise stage of the fast path: its f64 reference, the f32 buffers it reads beside its
/// flow (by argument slot), and its by-value arguments.
struct MapStage<'a> {
    f: fn(&[f64]) -> f64,
    tensors: Vec<&'a [f32]>,
    scalars: Vec<f64>,
    finite: bool,
}

/// A reduction's fold, as the op's f64 reference defines it.
struct Fold {
    identity: f64,
    combine: fn(f64, f64) -> f64,
    finish: fn(f64, usize) -> f64,
    finite: bool,
}

/// An elementwise chain (`Map` pattern: elementwise stages, then maybe a reduction and stages on
/// its scalar) over f32 buffers of one length, run in parallel chunks with every stage fused per
/// element in f64, reading the inputs where they are (no widened copies). `None` for any other
/// chain (the whole-tensor reference below runs it).
fn run_map<'a>(
    ir: &ChainIr,
    args: &[Option<Arg<'a>>],
    output: &mut Option<&mut [f32]>,
) -> Option<(f64, bool)> {
    if ir.plan.pattern != Pattern::Map || ir.guard().is_some() || ir.dims.len() != 1 {
        return None;
    }
    let f32_slot = |slot: usize| -> Option<&'a [f32]> {
        match &args[slot] {
            Some(Arg::Input(_, InputBuffer::F32(b))) => {
                let b: &'a crate::Buffer<f32> = b;
                b.host_slice()
            }
            _ => None,
        }
    };
    let value_slot = |slot: usize| -> Option<f64> {
        match &args[slot] {
            Some(Arg::F32(_, v)) => Some(f64::from(*v)),
            Some(Arg::U32(_, v)) => Some(f64::from(*v)),
            _ => None,
        }
    };
    let Source::Arg(flow_slot) = ir.stages.first()?.inputs[0] else {
        return None;
    };
    let flow = f32_slot(flow_slot)?;
    let n = flow.len();
    let reduction = ir.plan.reduction;
    let elementwise_end = reduction.unwrap_or(ir.stages.len());
    let stage_of = |st: &StageIr| -> Option<MapStage<'a>> {
        let CpuImpl::Elementwise(f) = st.op.cpu else {
            return None;
        };
        if st.shape.channels() != 1 {
            return None;
        }
        let (mut tensors, mut scalars) = (Vec::new(), Vec::new());
        for (p, src) in st.op.inputs.iter().zip(&st.inputs).skip(1) {
            let Source::Arg(slot) = *src else { return None };
            if p.ty.is_by_value() {
                scalars.push(value_slot(slot)?);
            } else if p.ty == Ty::Row {
                return None;
            } else {
                let t = f32_slot(slot)?;
                if t.len() != n {
                    return None;
                }
                tensors.push(t);
            }
        }
        Some(MapStage {
            f,
            tensors,
            scalars,
            finite: st.finite,
        })
    };
    let stages: Vec<MapStage> = ir.stages[..elementwise_end]
        .iter()
        .map(stage_of)
        .collect::<Option<_>>()?;
    let fold = match reduction {
        Some(r) => match ir.stages[r].op.cpu {
            CpuImpl::Reduction {
                identity,
                combine,
                finish,
            } if !ir.stages[r].per_row => Some(Fold {
                identity,
                combine,
                finish,
                finite: ir.stages[r].finite,
            }),
            _ => return None,
        },
        None => None,
    };
    let finish: Vec<MapStage> = match reduction {
        Some(r) => ir.stages[r + 1..]
            .iter()
            .map(|st| stage_of(st).filter(|s| s.tensors.is_empty()))
            .collect::<Option<_>>()?,
        None => Vec::new(),
    };
    if fold.is_none() && output.as_ref().is_none_or(|o| o.len() != n) {
        return None;
    }

    // Every stage of one element, in order, its operands in a stack array; whether a checked
    // stage's value was not finite.
    if stages
        .iter()
        .chain(&finish)
        .any(|s| 1 + s.tensors.len() + s.scalars.len() > MAX_OPERANDS)
    {
        return None;
    }
    let element = |e: usize, x: &mut [f64; MAX_OPERANDS], bad: &mut bool| -> f64 {
        let mut v = f64::from(flow[e]);
        for s in &stages {
            x[0] = v;
            let mut k = 1;
            for t in &s.tensors {
                x[k] = f64::from(t[e]);
                k += 1;
            }
            x[k..k + s.scalars.len()].copy_from_slice(&s.scalars);
            v = (s.f)(&x[..k + s.scalars.len()]);
            *bad |= s.finite && !(v as f32).is_finite();
        }
        v
    };
    match (&fold, output.as_deref_mut()) {
        (None, Some(out)) => {
            let bad = out
                .par_chunks_mut(CHUNK)
                .enumerate()
                .map(|(c, out)| {
                    let (mut x, mut bad) = ([0.0f64; MAX_OPERANDS], false);
                    for (k, o) in out.iter_mut().enumerate() {
                        *o = element(c * CHUNK + k, &mut x, &mut bad) as f32;
                    }
                    bad
                })
                .reduce(|| false, |a, b| a | b);
            Some((0.0, bad))
        }
        (Some(fold), _) => {
            let partials: Vec<(f64, bool)> = (0..n.div_ceil(CHUNK))
                .into_par_iter()
                .map(|c| {
                    let (mut x, mut bad) = ([0.0f64; MAX_OPERANDS], false);
                    let mut acc = fold.identity;
                    for e in c * CHUNK..((c + 1) * CHUNK).min(n) {
                        acc = (fold.combine)(acc, element(e, &mut x, &mut bad));
                    }
                    (acc, bad)
                })
                .collect();
            let mut bad = partials.iter().any(|p| p.1);
            let total = partials
                .iter()
                .fold(fold.identity, |acc, p| (fold.combine)(acc, p.0));
            let mut v = (fold.finish)(total, n);
            bad |= fold.finite && !v.is_finite();
            let mut x = [0.0f64; MAX_OPERANDS];
            for s in &finish {
                x[0] = v;
                x[1..=s.scalars.len()].copy_from_slice(&s.scalars);
                v = (s.f)(&x[..=s.scalars.len()]);
                bad |= s.finite && !(v as f32).is_finite();
            }
            Some((v, bad))
        }
        (None, None) => None,
    }
}
