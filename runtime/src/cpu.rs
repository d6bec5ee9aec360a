//! The CPU backend: runs a chain's IR with each op's f64 reference (pptm-spec), at submission.

use pptm_spec::{ChainIr, Evaluated};

use crate::chain::{Arg, Completion};
use crate::error::{Error, Result};

/// Runs `ir` on host buffers; writes the output vector, if any, as f32.
pub(crate) fn run(chain: &'static str, ir: &ChainIr, args: Vec<Arg<'_>>) -> Result<Completion> {
    let mut inputs: Vec<&[f32]> = Vec::new();
    let mut output: Option<&mut [f32]> = None;
    let not_host = |arg: &'static str| Error::ForeignBuffer { chain, arg };
    for a in args {
        match a {
            Arg::Input(name, b) => inputs.push(b.host_slice().ok_or_else(|| not_host(name))?),
            Arg::Output(name, b) => {
                output = Some(b.host_slice_mut().ok_or_else(|| not_host(name))?)
            }
        }
    }
    let value = match ir.eval_f64(&inputs) {
        Evaluated::Scalar(v) => v,
        Evaluated::Vector(v) => {
            let out = output.ok_or_else(|| Error::BadArguments {
                chain,
                reason: "no output buffer".into(),
            })?;
            for (o, x) in out.iter_mut().zip(v) {
                *o = x as f32;
            }
            0.0
        }
    };
    Ok(Completion { status: 0, value })
}
