//! What `#[derive(FusionBuilder)]` implements, and what the runtime needs to run a chain.

use crate::element::{DType, F8E4M3, bf16, f16};
use crate::{Buffer, Error};
use pptm_spec::ChainIr;

/// The generated code of one domain, embedded in the binary by the derive macro.
#[derive(Debug)]
pub struct DomainCode {
    /// Identifies the manifold: `<crate>/<domain>` (two crates may both have a domain `inference`).
    pub key: &'static str,
    /// The domain's name, as `#[fusion(domain = "...")]` gives it and errors and logs show it.
    pub name: &'static str,
    /// Loaded on GPUs of compute capability 8.x (Ampere, Ada).
    pub ptx_compute_80: &'static str,
    /// Loaded on GPUs of compute capability above 9.0: `ptx_compute_90a` runs on sm_90 alone.
    pub ptx_compute_90: &'static str,
    /// Loaded on sm_90 (H100, H200): wgmma and TMA where the domain has a bf16/fp16 tensor stage.
    pub ptx_compute_90a: &'static str,
}

/// The domain of every chain linked into the binary from the application's crates (and pptm's
/// tests and examples): `#[derive(FusionBuilder)]` adds each chain's domain here at link time, so
/// the runtime loads their code before the first manifold starts. The chains of pptm's own library
/// (`pptm::chains`) are left out, so that a binary carries only the PTX of the built-in domains it
/// uses; theirs loads when first used. Any domain starts on demand either way. A domain appears
/// once per chain; [`linked_domains`] lists each once.
#[linkme::distributed_slice]
pub static LINKED_DOMAINS: [&'static DomainCode];

/// The domains linked into the binary ([`LINKED_DOMAINS`]), each once, by key.
pub fn linked_domains() -> Vec<&'static DomainCode> {
    let mut out: Vec<&'static DomainCode> = Vec::new();
    for &d in LINKED_DOMAINS.iter() {
        if !out.iter().any(|o| o.key == d.key) {
            out.push(d);
        }
    }
    out.sort_by_key(|d| d.key);
    out
}

/// A fusion chain: implemented by `#[derive(FusionBuilder)]`, never by hand.
pub trait Chain: 'static {
    /// The descriptor's argument words (`#[repr(C)]`, `Pod`).
    type Args: bytemuck::Pod;
    /// What a completed submission yields: `f32` for a chain ending in a reduction, else `()`.
    type Output: ChainOutput;
    /// The chain's struct's name, as errors and logs name the chain.
    const NAME: &'static str;
    /// SHA-256 of the chain's normalised spec; also lists it in generated/manifest.txt.
    const SPEC_HASH: &'static str;
    /// The variant's opcode in its manifold.
    const OPCODE: u32;
    /// The code of the domain whose manifold runs the chain.
    const DOMAIN: &'static DomainCode;
    /// The lowered chain (argument layout, stages, CPU reference).
    fn ir() -> Result<&'static ChainIr, Error>;
}

/// One of a chain's arguments at submission, named as in the chain (the generated `submit` builds
/// these in descriptor order).
#[derive(Debug)]
pub enum Arg<'a> {
    /// An input buffer: `Arg::Input("q", (&q).into())`.
    Input(&'static str, InputBuffer<'a>),
    /// The f32 buffer the chain writes, borrowed until its ticket resolves.
    Output(&'static str, &'a mut Buffer<f32>),
    /// An f32 passed by value.
    F32(&'static str, f32),
    /// A u32 passed by value.
    U32(&'static str, u32),
    /// The size of a dimension no buffer's length gives (a matrix's column count).
    Dim(&'static str, usize),
}

/// An input buffer of one of the element types chains read: f32, or bf16/fp16/fp8 for the matrix
/// operands of a tensor-core stage. `From` converts a typed buffer reference.
#[derive(Debug, Clone, Copy)]
pub enum InputBuffer<'a> {
    /// A buffer of f32.
    F32(&'a Buffer<f32>),
    /// A buffer of bf16, a tensor-core stage's matrix operand.
    Bf16(&'a Buffer<bf16>),
    /// A buffer of fp16, a tensor-core stage's matrix operand.
    F16(&'a Buffer<f16>),
    /// A buffer of fp8 (e4m3), a tensor-core stage's matrix operand.
    F8E4M3(&'a Buffer<F8E4M3>),
}

impl<'a> From<&'a Buffer<f32>> for InputBuffer<'a> {
    fn from(b: &'a Buffer<f32>) -> Self {
        InputBuffer::F32(b)
    }
}

impl<'a> From<&'a Buffer<bf16>> for InputBuffer<'a> {
    fn from(b: &'a Buffer<bf16>) -> Self {
        InputBuffer::Bf16(b)
    }
}

impl<'a> From<&'a Buffer<f16>> for InputBuffer<'a> {
    fn from(b: &'a Buffer<f16>) -> Self {
        InputBuffer::F16(b)
    }
}

impl<'a> From<&'a Buffer<F8E4M3>> for InputBuffer<'a> {
    fn from(b: &'a Buffer<F8E4M3>) -> Self {
        InputBuffer::F8E4M3(b)
    }
}

impl InputBuffer<'_> {
    /// The buffer's element type, which the runtime checks against the chain's.
    pub fn dtype(&self) -> DType {
        match self {
            InputBuffer::F32(b) => b.dtype(),
            InputBuffer::Bf16(b) => b.dtype(),
            InputBuffer::F16(b) => b.dtype(),
            InputBuffer::F8E4M3(b) => b.dtype(),
        }
    }

    /// The buffer's length, in elements.
    pub fn len(&self) -> usize {
        match self {
            InputBuffer::F32(b) => b.len(),
            InputBuffer::Bf16(b) => b.len(),
            InputBuffer::F16(b) => b.len(),
            InputBuffer::F8E4M3(b) => b.len(),
        }
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn owner(&self) -> u64 {
        match self {
            InputBuffer::F32(b) => b.owner(),
            InputBuffer::Bf16(b) => b.owner(),
            InputBuffer::F16(b) => b.owner(),
            InputBuffer::F8E4M3(b) => b.owner(),
        }
    }

    /// The address of the buffer itself (not of its memory): who a pipeline's hazards are about.
    pub(crate) fn address(&self) -> usize {
        match self {
            InputBuffer::F32(b) => std::ptr::from_ref(*b) as usize,
            InputBuffer::Bf16(b) => std::ptr::from_ref(*b) as usize,
            InputBuffer::F16(b) => std::ptr::from_ref(*b) as usize,
            InputBuffer::F8E4M3(b) => std::ptr::from_ref(*b) as usize,
        }
    }

    pub(crate) fn device_ptr(&self) -> u64 {
        match self {
            InputBuffer::F32(b) => b.device_ptr(),
            InputBuffer::Bf16(b) => b.device_ptr(),
            InputBuffer::F16(b) => b.device_ptr(),
            InputBuffer::F8E4M3(b) => b.device_ptr(),
        }
    }
}

impl Arg<'_> {
    /// The argument's name, as in the chain (errors name it so).
    pub fn name(&self) -> &'static str {
        match self {
            Arg::Input(n, _)
            | Arg::Output(n, _)
            | Arg::F32(n, _)
            | Arg::U32(n, _)
            | Arg::Dim(n, _) => n,
        }
    }

    /// The buffer's owner, for buffers.
    pub(crate) fn owner(&self) -> Option<u64> {
        match self {
            Arg::Input(_, b) => Some(b.owner()),
            Arg::Output(_, b) => Some(b.owner()),
            _ => None,
        }
    }

    /// What [`pptm_spec::ChainIr::bind`] checks.
    pub(crate) fn value(&self) -> pptm_spec::ArgValue {
        use pptm_spec::ArgValue;
        match self {
            Arg::Input(_, b) => ArgValue::Buffer(b.len()),
            Arg::Output(_, b) => ArgValue::Buffer(b.len()),
            Arg::F32(_, v) => ArgValue::F32(*v),
            Arg::U32(_, v) => ArgValue::U32(*v),
            Arg::Dim(_, v) => ArgValue::Dim(*v),
        }
    }
}

/// A completion as the device (or the CPU backend) reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Completion {
    /// The item's status word: 0 (`PPTM_STATUS_OK`) when it succeeded, else why not (the other
    /// `PPTM_STATUS_*` in kernels/pptm/abi.h).
    pub status: u32,
    /// The item's scalar: a reducing chain's result; for a chain that writes a buffer, the
    /// sampled error of its guarded stage where it has one (runtime/src/guard.rs), else 0.
    pub value: f64,
    /// Time the item took on the device, where the backend measures it: the manifold from its
    /// first block taking the item to its last block finishing it (%globaltimer), the launched
    /// variants between CUDA events around their launches. `None` on the CPU backend.
    pub device_ns: Option<u64>,
    /// The product paths the item ran, as the device reports them; `None` on the CPU backend.
    pub paths: Option<crate::ticket::ProductPaths>,
}

/// Converts a completion into a chain's result type.
pub trait ChainOutput: Sized + Send + 'static {
    /// The result of a completed item: its value as an `f32`, or `()` for a chain that writes a
    /// buffer.
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
