//! What `#[derive(FusionBuilder)]` implements, and what the runtime needs to run a chain.

use crate::{Buffer, Error};
use pptm_spec::ChainIr;

/// The generated code of one domain, embedded in the binary by the derive macro.
#[derive(Debug)]
pub struct DomainCode {
    /// Identifies the manifold: `<crate>/<domain>` (two crates may both have a domain `inference`).
    pub key: &'static str,
    pub name: &'static str,
    pub ptx_compute_80: &'static str,
    pub ptx_compute_90: &'static str,
}

/// A fusion chain: implemented by `#[derive(FusionBuilder)]`, never by hand.
pub trait Chain: 'static {
    /// The descriptor's argument words (`#[repr(C)]`, `Pod`).
    type Args: bytemuck::Pod;
    /// What a completed submission yields: `f32` for a chain ending in a reduction, else `()`.
    type Output: ChainOutput;
    const NAME: &'static str;
    /// SHA-256 of the chain's normalised spec; also lists it in generated/manifest.txt.
    const SPEC_HASH: &'static str;
    /// The variant's opcode in its manifold.
    const OPCODE: u32;
    const DOMAIN: &'static DomainCode;
    /// The lowered chain (argument layout, stages, CPU reference).
    fn ir() -> Result<&'static ChainIr, Error>;
}

/// A buffer bound to one of a chain's arguments, named as in the chain.
#[derive(Debug)]
pub enum Arg<'a> {
    Input(&'static str, &'a Buffer<f32>),
    Output(&'static str, &'a mut Buffer<f32>),
}

impl Arg<'_> {
    pub fn name(&self) -> &'static str {
        match self {
            Arg::Input(n, _) | Arg::Output(n, _) => n,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Arg::Input(_, b) => b.len(),
            Arg::Output(_, b) => b.len(),
        }
    }

    pub(crate) fn owner(&self) -> u64 {
        match self {
            Arg::Input(_, b) => b.owner(),
            Arg::Output(_, b) => b.owner(),
        }
    }
}

/// A completion as the device (or the CPU backend) reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Completion {
    pub status: u32,
    pub value: f64,
}

/// Converts a completion into a chain's result type.
pub trait ChainOutput: Sized + Send + 'static {
    fn from_completion(c: &Completion) -> Self;
}

impl ChainOutput for f32 {
    fn from_completion(c: &Completion) -> Self {
        c.value as f32
    }
}

impl ChainOutput for () {
    fn from_completion(_: &Completion) -> Self {}
}

/// Checks a chain's lowered IR against what the derive macro compiled in.
pub fn checked_ir<C: Chain>(
    ir: &'static Result<ChainIr, pptm_spec::SpecError>,
) -> Result<&'static ChainIr, Error> {
    match ir {
        Ok(ir) if ir.spec_hash == C::SPEC_HASH && ir.opcode == C::OPCODE => Ok(ir),
        Ok(_) => Err(Error::ChainMismatch {
            chain: C::NAME,
            reason: "its spec hash differs from the one computed at compile time".into(),
        }),
        Err(e) => Err(Error::ChainMismatch {
            chain: C::NAME,
            reason: e.to_string(),
        }),
    }
}
