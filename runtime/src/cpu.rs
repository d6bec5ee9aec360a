//! The CPU backend: runs a chain's IR with each op's f64 reference (pptm-spec), at submission.

use pptm_spec::{ArgKind, ChainIr, EvalArg, Evaluated};

use crate::chain::{Arg, Completion};
use crate::error::{Error, Result};

/// Runs `ir` on host buffers; writes the output tensor, if any, as f32. `args` are by descriptor
/// slot (`None` for dimensions inferred from buffers and the guard word) and `sizes` come from a
/// successful bind. A guarded chain's completion value is the guard's (crate::guard::emulate) at
/// `guard_level`; the output is f64 arithmetic either way.
pub(crate) fn run(
    chain: &'static str,
    ir: &ChainIr,
    args: Vec<Option<Arg<'_>>>,
    sizes: &[usize],
    guard_level: u32,
) -> Result<Completion> {
    let not_host = |arg: &'static str| Error::ForeignBuffer { chain, arg };
    // Inputs widened to f64 (every element type converts exactly), by slot.
    let mut wide: Vec<Vec<f64>> = Vec::with_capacity(args.len());
    for a in &args {
        wide.push(match a {
            Some(Arg::Input(name, b)) => b.host_f64().ok_or_else(|| not_host(name))?,
            _ => Vec::new(),
        });
    }
    let mut eval = Vec::with_capacity(args.len());
    let mut output: Option<&mut [f32]> = None;
    for ((a, slot), wide) in args.into_iter().zip(&ir.args).zip(&wide) {
        eval.push(match a {
            Some(Arg::Input(..)) => EvalArg::InputF64(wide),
            Some(Arg::Output(name, b)) => {
                output = Some(b.host_slice_mut().ok_or_else(|| not_host(name))?);
                EvalArg::None
            }
            Some(Arg::F32(_, v)) => EvalArg::Value(f64::from(v)),
            Some(Arg::U32(_, v)) => EvalArg::Value(f64::from(v)),
            Some(Arg::Dim(..)) | None => {
                debug_assert!(matches!(slot.kind, ArgKind::Len | ArgKind::Guard));
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
    Ok(Completion {
        // As the device reports it (its outputs are written all the same).
        status: if non_finite.is_some() {
            crate::gpu::abi::PPTM_STATUS_NON_FINITE
        } else {
            crate::gpu::abi::PPTM_STATUS_OK
        },
        value,
        device_ns: None,
        paths: None,
    })
}
