//! The one error type of the runtime. Every failure a caller can cause or meet is a variant here;
//! nothing on the public API panics on bad input.

use std::time::Duration;

/// Why a runtime call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No usable GPU: no driver library, no device, or a device too old. A driver that is
    /// installed but fails to start is [`Error::Driver`] (call `cuInit`) instead: that is a broken
    /// GPU, not an absent one.
    #[error("no usable GPU: {0}")]
    NoGpu(String),

    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed: {name} ({description})")]
    Driver {
        /// The driver function that failed (`cuInit`, `cuModuleLoadDataEx`, ...).
        call: &'static str,
        /// The name of the driver's error code (`CUDA_ERROR_...`).
        name: String,
        /// The driver's description of that code (empty where it has none).
        description: String,
    },

    /// Loading a domain's PTX failed (the JIT log says why).
    #[error("cannot load the PTX of domain `{domain}` for {arch}: {log}")]
    ModuleLoad {
        /// The domain whose PTX was loading (`?` where the failing check does not know it).
        domain: &'static str,
        /// The PTX target chosen for the GPU: `compute_80`, `compute_90` or `compute_90a`.
        arch: &'static str,
        /// The JIT's error log, or what else was wrong with the module.
        log: String,
    },

    /// The manifold of a domain could not be made resident.
    #[error("cannot launch the manifold of domain `{domain}`: {reason}")]
    Launch {
        /// The domain whose manifold could not start.
        domain: &'static str,
        /// Why, and where there is one, what to do about it.
        reason: String,
    },

    /// A buffer's length does not match the chain's shapes: its dimensions come from other
    /// buffers' lengths and the sizes passed to `submit`.
    #[error("`{chain}`: argument `{arg}` has {got} elements, but {rule} makes {expected}")]
    LengthMismatch {
        /// The chain submitted (its struct's name).
        chain: &'static str,
        /// The argument whose buffer has the wrong length, named as in the chain.
        arg: &'static str,
        /// The element count the chain's shapes give that buffer.
        expected: usize,
        /// The element count the buffer holds.
        got: usize,
        /// Where the expectation comes from: another buffer, or dimension sizes.
        rule: String,
    },

    /// A buffer's element type is not the one the chain reads for that argument (the generated
    /// `submit` takes typed buffers, so only [`Runtime::submit_chain`](crate::Runtime::submit_chain)
    /// can meet this).
    #[error("`{chain}`: argument `{arg}` must be a buffer of {expected}, got one of {got}")]
    DTypeMismatch {
        /// The chain submitted (its struct's name).
        chain: &'static str,
        /// The argument the buffer was passed as, named as in the chain.
        arg: &'static str,
        /// The element type the chain reads for that argument.
        expected: crate::DType,
        /// The element type of the buffer passed.
        got: crate::DType,
    },

    /// A host slice's length differs from the buffer's.
    #[error("buffer holds {buffer} elements but the slice has {slice}")]
    SliceLength {
        /// The buffer's length, in elements.
        buffer: usize,
        /// The host slice's length, in elements.
        slice: usize,
    },

    /// A write of `len` elements at `offset` reaches past the buffer's end.
    #[error(
        "a write of {len} elements at element {offset} reaches past the buffer's {buffer} elements"
    )]
    WriteOutOfRange {
        /// The buffer's length, in elements.
        buffer: usize,
        /// Where the write starts, in elements.
        offset: usize,
        /// The slice's length, in elements.
        len: usize,
    },

    /// A buffer passed to a runtime it does not belong to.
    #[error(
        "`{chain}`: buffer `{arg}` belongs to another runtime (or backend); allocate it with this runtime"
    )]
    ForeignBuffer {
        /// The chain submitted (its struct's name).
        chain: &'static str,
        /// The argument the buffer was passed as, named as in the chain.
        arg: &'static str,
    },

    /// Device memory handed to [`crate::Runtime::wrap_device_memory`] or
    /// [`crate::Runtime::wrap_cuda_slice`] cannot be a buffer of this runtime.
    #[error("cannot use this device memory as a pptm buffer: {reason}")]
    ForeignMemory {
        /// What is wrong with it: a null or misaligned pointer, memory that is not device memory
        /// of pptm's context, or a range past the end of its allocation.
        reason: String,
    },

    /// A CUDA stream handed to [`crate::Runtime::wait_for_stream`] or
    /// [`crate::Ticket::signal_stream`] cannot be ordered with this runtime's items: it belongs to
    /// another context, or the backend has no GPU.
    #[error("cannot order pptm's items with this CUDA stream: {reason}")]
    ForeignStream {
        /// Why: the stream belongs to another CUDA context, or the runtime runs on the CPU.
        reason: String,
    },

    /// A chain was given the wrong arguments (the generated `submit` never does this).
    #[error("`{chain}`: {reason}")]
    BadArguments {
        /// The chain submitted (its struct's name), or `pipeline` for a handle used with the
        /// wrong pipeline.
        chain: &'static str,
        /// What was wrong with the arguments.
        reason: String,
    },

    /// An item of a pipeline failed; the items after it ran on what it left, so the pipeline
    /// reports no results.
    #[error("pipeline item {item} (`{chain}`) failed: {source}")]
    PipelineItem {
        /// The failed item's position in its pipeline, from 0 (its
        /// [`PipeItem::index`](crate::PipeItem::index)).
        item: usize,
        /// The failed item's chain (its struct's name).
        chain: &'static str,
        /// How the item itself failed.
        source: Box<Error>,
    },
    /// Every submission slot holds an item that has not completed (from
    /// [`Runtime::try_submit_chain`](crate::Runtime::try_submit_chain), which does not wait).
    #[error("the submission queue is full ({capacity} items in flight)")]
    QueueFull {
        /// The queue's slots, `Config::queue_slots`: the most items in flight.
        capacity: usize,
    },

    /// A pipeline's items of one domain need more plan memory than the manifold has: raise
    /// `Config::plan_arena_bytes`, or wait on the pipeline in parts.
    #[error(
        "the pipeline's plan needs {bytes} bytes of plan arena, more than Config::plan_arena_bytes ({capacity}); raise it or wait on the pipeline in parts"
    )]
    PlanTooLarge {
        /// The plan memory those items need, in bytes.
        bytes: u64,
        /// The size of the manifold's plan arena, `Config::plan_arena_bytes`.
        capacity: u64,
    },

    /// A pipeline loop that pptm cannot run as asked; the reason says why and what to do.
    #[error("pipeline loop: {reason}")]
    PipelineLoop {
        /// Why pptm refuses the loop, and what to do instead.
        reason: String,
    },

    /// A pipeline `when` that pptm cannot run as asked; the reason says why and what to do.
    #[error("pipeline when: {reason}")]
    PipelineWhen {
        /// Why pptm refuses the conditional body, and what to do instead.
        reason: String,
    },

    /// The item is inside a [`Pipeline::when`](crate::Pipeline::when) whose condition was never
    /// met in this run: it has no result.
    #[error("pipeline item {item} (`{chain}`) did not run: its `when` condition was not met")]
    NotRun {
        /// The item's position in its pipeline, from 0.
        item: usize,
        /// The item's chain (its struct's name).
        chain: &'static str,
    },

    /// A wait ran out of time. A ticket that timed out can be waited on again.
    #[error("timed out after {0:?}")]
    Timeout(Duration),

    /// A submission from inside [`Runtime::quiesce`](crate::Runtime::quiesce)'s closure: the
    /// manifolds are parked until it returns, so the item could never run. Submit after `quiesce`
    /// returns.
    #[error(
        "pptm work was submitted inside Runtime::quiesce, while the manifolds are parked; submit it after quiesce returns"
    )]
    Quiesced,

    /// The runtime (or its manifold) has shut down; the item did not run.
    #[error("the runtime has shut down; the item was not run")]
    ShutDown,

    /// The manifold stopped unexpectedly (a device fault or a kernel that exited).
    #[error("the manifold of domain `{domain}` stopped: {reason}")]
    ManifoldStopped {
        /// The domain whose manifold stopped.
        domain: &'static str,
        /// What stopped it: a driver error, a device fault, a hang, the kernel exiting without
        /// being told to, or a shutdown that did not finish in time.
        reason: String,
    },

    /// The watchdog saw no progress on pending work for longer than `Config::watchdog`: every item
    /// pending on the manifold fails with this, naming the item that was running. With
    /// `recovered`, the manifold left when told to abort (its memory was safe to release) and the
    /// next submission launches a fresh one; without it, the kernel ignored the abort and still
    /// holds the GPU (see RELIABILITY.md). On the launched variants the item's own submission
    /// fails with it (`seq` counts that launcher's items); unrecovered, so does every later item
    /// of that domain on that runtime.
    #[error(
        "no progress for {stalled:?} in domain `{domain}` ({variant:?}) while it ran item {seq} (`{chain}`); {}",
        match (*recovered, variant) {
            (true, crate::Variant::Fused) => "the manifold was stopped and the next submission relaunches it",
            (true, _) => "the kernel was stopped and the next submission runs",
            (false, _) => "the kernel did not respond to the abort and still holds the GPU",
        }
    )]
    Hang {
        /// The domain of the item that made no progress.
        domain: &'static str,
        /// How the runtime ran it (`Config::variant`): the manifold, or a launched variant.
        variant: crate::Variant,
        /// The item that was running (sequence number in its manifold's queue) and its chain.
        seq: u64,
        /// The running item's chain (its struct's name).
        chain: &'static str,
        /// How long the watchdog saw no progress.
        stalled: Duration,
        /// Whether the kernel left when told to abort, so that the next submission can run.
        recovered: bool,
    },

    /// The device faulted (an illegal address, a trap) while the manifold of `domain` ran item
    /// `seq` (`chain`). CUDA makes such an error sticky: the process cannot use the GPU again, and
    /// every later call fails with this error or a driver error (see RELIABILITY.md).
    #[error(
        "device fault in the manifold of domain `{domain}` while it ran item {seq} (`{chain}`): {reason}"
    )]
    DeviceFault {
        /// The domain whose manifold was running when the device faulted.
        domain: &'static str,
        /// The running item's sequence number in its manifold's queue.
        seq: u64,
        /// The running item's chain (its struct's name).
        chain: &'static str,
        /// The fault, as the driver reports it.
        reason: String,
    },

    /// A stage declared `finite = true` produced a NaN or an infinity. The item ran to the end:
    /// its output buffer holds what was computed, non-finite values included.
    #[error(
        "`{chain}`: a stage declared `finite = true` produced a NaN or an infinity (the outputs were still written)"
    )]
    NonFinite {
        /// The chain the item ran (its struct's name).
        chain: &'static str,
    },

    /// The device rejected an item.
    #[error("the device reported status {status} ({meaning}) for `{chain}`")]
    Device {
        /// The rejected item's chain (its struct's name), or `pipeline plan` for a pipeline's
        /// plan.
        chain: &'static str,
        /// The completion's status word (`PPTM_STATUS_*` in kernels/pptm/abi.h).
        status: u32,
        /// What that status means.
        meaning: &'static str,
    },

    /// An op's CPU reference panicked while the CPU backend ran an item (an op of the
    /// application's own, most likely). The item's output is left as far as it got.
    #[error("`{chain}`: an op's CPU code panicked on the CPU backend: {message}")]
    CpuPanic {
        /// The chain the item ran (its struct's name).
        chain: &'static str,
        /// The panic's message, where it had one.
        message: String,
    },

    /// A ticket's result was already taken.
    #[error("this ticket's result was already taken")]
    TicketConsumed,

    /// The chain's compiled-in description disagrees with this pptm (a version mismatch).
    #[error("chain `{chain}` does not match this version of pptm: {reason}")]
    ChainMismatch {
        /// The chain (its struct's name).
        chain: &'static str,
        /// What disagrees.
        reason: String,
    },

    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// This backend or platform cannot do what was asked.
    #[error("not supported here: {what}")]
    Unsupported {
        /// What was asked.
        what: String,
    },

    /// No tile of the smallest size the planner may choose fits the memory it was given
    /// ([`crate::tiles::TilePlanner`]).
    #[error(
        "no tile fits: the smallest ({tile} x {tile}) needs {needed} bytes, the budget is {budget} bytes"
    )]
    TileTooLarge {
        /// The smallest tile edge tried.
        tile: u64,
        /// Bytes that tile needs.
        needed: u64,
        /// Bytes the planner may use.
        budget: u64,
    },

    /// Memory could not be allocated.
    #[error("out of memory allocating {bytes} bytes")]
    OutOfMemory {
        /// The size of the allocation that failed.
        bytes: usize,
    },

    /// Values that are not a whole number of states ([`State::unflatten`](crate::State)).
    #[error("{len} values are not a whole number of states of {fields} fields")]
    StateLength {
        /// The state's fields (values per state).
        fields: usize,
        /// The values given.
        len: usize,
    },

    /// A buffer too large to describe.
    #[error("{what} of {len} elements is too large")]
    TooLarge {
        /// What was too large (`a buffer`, `an unfused stage's output`).
        what: &'static str,
        /// Its length in elements (`usize::MAX` where the size overflowed before it was known).
        len: usize,
    },

    /// `Variant::UnfusedGraph` met a new shape beside a resident manifold and had no executable
    /// graph of its node count to reuse; instantiating one there can hang the driver
    /// (runtime/src/gpu/graphs.rs).
    #[error(
        "no executable CUDA graph of {stages} kernel nodes is free for domain `{domain}` ({refused} \
         refused the update), and none may be instantiated while a manifold is resident on this \
         GPU (the driver can hang); make the graph runtime's first submissions before any manifold \
         starts, or use Variant::Unfused"
    )]
    GraphUnavailable {
        /// The domain of the chain submitted.
        domain: &'static str,
        /// The kernel nodes the graph needs: one per stage of the chain.
        stages: usize,
        /// How many executable graphs of that node count refused to be updated to this item.
        refused: usize,
    },

    /// Every stream or event the device made before its manifolds started is in use, and making
    /// another beside a resident manifold can hang the driver (runtime/src/gpu/driver.rs).
    #[error(
        "all {made} CUDA {what} made when the GPU was opened are in use, and no more may be made while \
         a manifold is resident (the driver can hang); drop idle runtimes, or create every runtime \
         before the first submission"
    )]
    DriverObjectsUnavailable {
        /// What ran out: `streams`, `events`, or `stream signal lines`.
        what: &'static str,
        /// How many of them there are, every one in use.
        made: usize,
    },
}

impl Error {
    pub(crate) fn driver(call: &'static str, e: cudarc::driver::DriverError) -> Self {
        let name = e
            .error_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{:?}", e.0));
        let description = e
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Error::Driver {
            call,
            name,
            description,
        }
    }
}

/// The result of a runtime call: [`Error`] unless another error type is named.
pub type Result<T, E = Error> = std::result::Result<T, E>;
