//! The pptm host runtime.
//!
//! | what you know | its pptm counterpart |
//! |---|---|
//! | a kernel launch per operation | one resident *manifold* per domain, launched once, fed through a queue |
//! | `cudaStream` + launch + sync | [`Runtime::submit_chain`] (or the generated `Chain::submit`) → [`Ticket::wait`] |
//! | `cudaMalloc` + `cudaMemcpy` | [`Runtime::upload`], [`Runtime::alloc`], [`Buffer::to_vec`] |
//! | a fused kernel you wrote by hand | a chain declared with `#[derive(FusionBuilder)]`, fused by codegen |
//! | a CPU reference implementation | the CPU backend: same API, f64 reference code |
//!
//! The queue: a submission ring and a completion ring in pinned host memory mapped into the GPU
//! (protocol in `kernels/pptm/abi.h`). Submitting writes one tagged descriptor; the manifold's leader
//! polls the ring, the grid runs the fused variant, the last block to finish writes the completion,
//! and the waiting thread reads it directly — no launch, no interrupt, no completion thread.

#![warn(missing_docs)]

mod buffer;
mod chain;
mod cpu;
mod element;
mod error;
mod gpu;
mod guard;
mod host;
pub mod host_pool;
mod pipeline;
mod runtime;
mod state;
mod sync;
mod ticket;
pub mod tiles;
pub mod tune;

pub use buffer::Buffer;
pub use chain::{
    Arg, Chain, ChainOutput, Completion, DomainCode, InputBuffer, LINKED_DOMAINS, checked_ir,
    linked_domains,
};
/// The CUDA driver bindings pptm is built on, for interop: [`Runtime::wrap_cuda_slice`],
/// [`Runtime::cuda_context`], [`Buffer::device_address`].
pub use cudarc;
pub use element::{DType, Element, F8E4M3, bf16, f16};
pub use error::{Error, Result};
pub use gpu::baseline;
pub use guard::GuardStats;
pub use host_pool::{HostBuffer, HostPoolStats};
#[doc(hidden)]
pub use linkme;
pub use pipeline::{
    DeviceTime, ErasedPending, KeptPipeline, PipeArg, PipeInput, PipeItem, PipeLoop, PipeOutput,
    PipeOutputType, PipeResults, PipeWhen, Pipeline,
};
#[cfg(feature = "fault-injection")]
pub use runtime::Injection;
pub use runtime::{BackendKind, Config, GpuInfo, MemoryInfo, Runtime, Variant};
pub use state::State;
pub use ticket::{ProductPaths, Ticket, Timed};
