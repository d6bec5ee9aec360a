//! Tickets: the handle a submission returns, resolved from the completion ring.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::chain::{ChainOutput, Completion};
use crate::error::{Error, Result};
use crate::gpu::{Cell, Failure, Manifold, abi};
use crate::guard::GuardNote;

/// A chain's result with the time its item took on the device and how it computed its products.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timed<R> {
    /// The chain's result, as [`Ticket::wait`] returns it.
    pub value: R,
    /// From the manifold's first block taking the item to its last block finishing it
    /// (`%globaltimer`, whose resolution depends on the GPU), or between CUDA events around the
    /// launches of the launched variants; `None` on the CPU backend.
    pub device: Option<Duration>,
    /// Which implementations of a matrix product the item ran, as the device reports them;
    /// `None` on the CPU backend.
    pub paths: Option<ProductPaths>,
}

/// Which implementations of a matrix product an item ran on the GPU (empty for an item with no
/// product stage). The kernel chooses from the shapes and pointers of each item, so this is how
/// a caller learns, for one item, whether Hopper's tensor-core paths took it, and so which
/// precision its sums carry: e4m3 wgmma adds in reduced precision (docs/precision.md).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ProductPaths(u32);

impl ProductPaths {
    /// From the device's bit set (`PPTM_PATH_*` in kernels/pptm/abi.h); unknown bits are kept.
    pub(crate) fn from_bits(bits: u32) -> Self {
        ProductPaths(bits)
    }

    /// The device's bit set, as [`ProductPaths::from_bits`] took it.
    pub(crate) fn bits(self) -> u32 {
        self.0
    }

    /// f32 tiles on CUDA cores.
    pub fn cuda_cores(self) -> bool {
        self.0 & abi::PPTM_PATH_CUDA_CORES != 0
    }

    /// `mma.sync` tensor cores (16-bit or e4m3 operands, f32 sums).
    pub fn mma_sync(self) -> bool {
        self.0 & abi::PPTM_PATH_MMA_SYNC != 0
    }

    /// Hopper's wgmma with TMA, 16-bit operands (f32 sums).
    pub fn wgmma(self) -> bool {
        self.0 & abi::PPTM_PATH_WGMMA != 0
    }

    /// Hopper's wgmma with e4m3 operands, whose sums within a slice of 128 keep about 13
    /// mantissa bits.
    pub fn wgmma_fp8(self) -> bool {
        self.0 & abi::PPTM_PATH_WGMMA_FP8 != 0
    }

    /// No product ran.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::fmt::Debug for ProductPaths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProductPaths({self})")
    }
}

impl std::fmt::Display for ProductPaths {
    /// "none", or the paths joined by " + " ("mma.sync", "wgmma + wgmma fp8").
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = [
            (self.cuda_cores(), "cuda cores"),
            (self.mma_sync(), "mma.sync"),
            (self.wgmma(), "wgmma"),
            (self.wgmma_fp8(), "wgmma fp8"),
        ];
        let mut any = false;
        for (_, name) in names.iter().filter(|(on, _)| *on) {
            if any {
                f.write_str(" + ")?;
            }
            f.write_str(name)?;
            any = true;
        }
        if !any {
            f.write_str("none")?;
        }
        Ok(())
    }
}

/// Borrows the submitted buffers for `'a` (mutably: outputs may be among them) and yields an `R`.
type Borrows<'a, R> = PhantomData<(&'a mut (), fn() -> R)>;

enum State {
    /// Completed at submission (a small item of the CPU backend, the launched variants).
    Ready(Completion),
    /// Running on the CPU backend's worker pool.
    Cpu(Arc<crate::cpu::CpuJob>),
    Pending {
        manifold: Arc<Manifold>,
        cell: Arc<Cell>,
    },
    Taken,
}

/// A submitted item. Resolve it with [`Ticket::wait`] or [`Ticket::wait_timeout`], or `.await` it
/// (it is a `Future` of the same result): async code waits without a thread of its own, one
/// background thread of pptm's watching every awaited item.
///
/// The ticket borrows the buffers it was submitted with (`'a`), so they can be neither freed nor
/// rewritten while the device may use them. Dropping a pending ticket therefore waits for its item
/// to finish (bounded by the runtime's shutdown timeout). A ticket does not borrow the runtime:
/// dropping the runtime with tickets in flight drains them, and each one still resolves.
#[must_use = "a ticket resolves to the chain's result; dropping it waits for the item"]
pub struct Ticket<'a, R: ChainOutput> {
    state: State,
    chain: &'static str,
    domain: &'static str,
    /// For an item of a guarded chain: what to record when it completes.
    guard: Option<GuardNote>,
    _borrows: Borrows<'a, R>,
}

impl<R: ChainOutput> std::fmt::Debug for Ticket<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Ready(_) => "ready".to_string(),
            State::Cpu(job) if job.is_done() => "ready".to_string(),
            State::Cpu(_) => "running on the CPU".to_string(),
            State::Pending { cell, .. } => format!("pending (item {})", cell.seq),
            State::Taken => "taken".to_string(),
        };
        write!(f, "Ticket({}, {state})", self.chain)
    }
}

impl<'a, R: ChainOutput> Ticket<'a, R> {
    pub(crate) fn ready(chain: &'static str, domain: &'static str, c: Completion) -> Self {
        Ticket {
            state: State::Ready(c),
            chain,
            domain,
            guard: None,
            _borrows: PhantomData,
        }
    }

    /// An item of the CPU backend, as [`crate::cpu::HostItem::submit`] left it.
    pub(crate) fn cpu(
        chain: &'static str,
        domain: &'static str,
        run: crate::cpu::CpuRun,
    ) -> Result<Self> {
        Ok(match run {
            crate::cpu::CpuRun::Done(c) => Ticket::ready(chain, domain, c?),
            crate::cpu::CpuRun::Running(job) => Ticket {
                state: State::Cpu(job),
                chain,
                domain,
                guard: None,
                _borrows: PhantomData,
            },
        })
    }

    pub(crate) fn pending(chain: &'static str, manifold: Arc<Manifold>, cell: Arc<Cell>) -> Self {
        let domain = manifold.domain;
        Ticket {
            state: State::Pending { manifold, cell },
            chain,
            domain,
            guard: None,
            _borrows: PhantomData,
        }
    }

    /// The same ticket without the borrow of its buffers: for a [`crate::Pipeline`], which holds
    /// those borrows itself for as long as the item may run (and waits for it when dropped).
    pub(crate) fn detach(mut self) -> Ticket<'static, R> {
        Ticket {
            state: std::mem::replace(&mut self.state, State::Taken),
            chain: self.chain,
            domain: self.domain,
            guard: self.guard.take(),
            _borrows: PhantomData,
        }
    }

    /// Makes the ticket report its item's guard value to the runtime's guard when it completes.
    pub(crate) fn with_guard(mut self, note: Option<GuardNote>) -> Self {
        self.guard = note;
        self
    }

    fn note_guard(&mut self, c: &Completion) {
        if let Some(g) = self.guard.take() {
            g.book.record(&g, c.value);
        }
    }

    /// Waits for the result, however long it takes (a manifold that stops makes this an error).
    pub fn wait(mut self) -> Result<R> {
        self.take(None).map(|c| R::from_completion(&c))
    }

    /// As [`Ticket::wait`], with the time the item took on the device (see [`Timed`]).
    pub fn wait_timed(mut self) -> Result<Timed<R>> {
        let c = self.take(None)?;
        Ok(Timed {
            value: R::from_completion(&c),
            device: c.device_ns.map(Duration::from_nanos),
            paths: c.paths,
        })
    }

    /// As [`Ticket::wait`], with the whole completion (a pipeline's plan of one item pushed as
    /// an item reads its step's result from it).
    pub(crate) fn wait_completion(mut self) -> Result<Completion> {
        self.take(None)
    }

    /// Waits up to `timeout`. On [`Error::Timeout`] the ticket stays valid: wait again later.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<R> {
        self.take(Some(Instant::now() + timeout))
            .map(|c| R::from_completion(&c))
    }

    /// Whether the result is available (never blocks).
    pub fn is_ready(&self) -> bool {
        match &self.state {
            State::Ready(_) | State::Taken => true,
            State::Cpu(job) => job.is_done(),
            State::Pending { manifold, cell } => manifold.poll(cell),
        }
    }

    /// The item's sequence number in its manifold's queue (`None` on the CPU backend).
    pub fn seq(&self) -> Option<u64> {
        match &self.state {
            State::Pending { cell, .. } => Some(cell.seq),
            _ => None,
        }
    }

    /// Makes the work enqueued on `stream` after this call wait, on the GPU, until this item has
    /// completed; the host does not wait. The application's kernels may then read what the item
    /// wrote ([`crate::Buffer::device_address`]); keep the buffers alive until the stream is past
    /// them. If the item fails (a hang, a fault) the stream is released all the same and the
    /// ticket reports the failure. A ticket that is already resolved (the CPU backend, the
    /// launched variants, a waited item) has nothing to wait for. [`Error::ForeignStream`] for a
    /// stream of another context.
    pub fn signal_stream(&self, stream: &cudarc::driver::CudaStream) -> Result<()> {
        match &self.state {
            State::Pending { manifold, cell } => {
                if stream.context().cu_ctx() != manifold.context() {
                    return Err(Error::ForeignStream {
                        reason:
                            "the stream's context is not pptm's (the primary context of its GPU)"
                                .into(),
                    });
                }
                // SAFETY: a live cudarc stream of pptm's context (checked above).
                unsafe { manifold.signal_stream(stream.cu_stream(), cell.seq) }
            }
            State::Ready(_) | State::Cpu(_) | State::Taken => Ok(()),
        }
    }

    /// [`Ticket::signal_stream`] for a raw stream handle (another library's stream).
    ///
    /// # Safety
    /// `stream` is null (the legacy default stream) or a stream of pptm's context
    /// ([`crate::Runtime::cuda_context`]) that has not been destroyed.
    pub unsafe fn signal_raw_stream(&self, stream: cudarc::driver::sys::CUstream) -> Result<()> {
        match &self.state {
            State::Pending { manifold, cell } => {
                // SAFETY: the caller's promise.
                unsafe { manifold.check_stream(stream)? };
                // SAFETY: as above, and checked to be of pptm's context.
                unsafe { manifold.signal_stream(stream, cell.seq) }
            }
            State::Ready(_) | State::Cpu(_) | State::Taken => Ok(()),
        }
    }

    /// Ready once the result is available; until then, `cx`'s waker is woken when it is.
    pub(crate) fn poll_ready(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        match &self.state {
            State::Pending { manifold, cell } => {
                if manifold.poll(cell) {
                    return std::task::Poll::Ready(());
                }
                crate::gpu::watcher::watch(manifold, cell, cx.waker());
                // A result that came between the poll and the watch still wakes the task: the
                // watcher polls every watch it holds.
                std::task::Poll::Pending
            }
            State::Cpu(job) if !job.wake_when_done(cx.waker()) => std::task::Poll::Pending,
            State::Ready(_) | State::Cpu(_) | State::Taken => std::task::Poll::Ready(()),
        }
    }

    fn take(&mut self, deadline: Option<Instant>) -> Result<Completion> {
        let out = match &self.state {
            State::Taken => return Err(Error::TicketConsumed),
            State::Ready(c) => resolve(self.chain, self.domain, &Ok(*c)),
            State::Cpu(job) => match job.take(deadline) {
                Ok(c) => resolve(self.chain, self.domain, &Ok(c)),
                // The job keeps its result past a timeout: the ticket stays valid.
                Err(Error::Timeout(t)) => return Err(Error::Timeout(t)),
                Err(e) => Err(e),
            },
            State::Pending { manifold, cell } => {
                manifold.wait(cell, deadline)?;
                resolve(self.chain, self.domain, cell.result().expect("waited"))
            }
        };
        self.state = State::Taken;
        if let Ok(c) = &out {
            self.note_guard(c);
        }
        out
    }
}

pub(crate) fn resolve(
    chain: &'static str,
    domain: &'static str,
    r: &std::result::Result<Completion, Failure>,
) -> Result<Completion> {
    use crate::gpu::abi::{
        PPTM_STATUS_ABORTED, PPTM_STATUS_BAD_ARGUMENT, PPTM_STATUS_BAD_OPCODE,
        PPTM_STATUS_NON_FINITE, PPTM_STATUS_OK,
    };
    match r {
        Ok(c) if c.status == PPTM_STATUS_OK => Ok(*c),
        Ok(c) if c.status == PPTM_STATUS_NON_FINITE => Err(Error::NonFinite { chain }),
        Ok(c) => Err(Error::Device {
            chain,
            status: c.status,
            meaning: match c.status {
                PPTM_STATUS_BAD_OPCODE => "the manifold has no variant with this opcode",
                PPTM_STATUS_BAD_ARGUMENT => {
                    "an argument failed the device's checks (misaligned pointer or oversized length); the item did not run"
                }
                PPTM_STATUS_ABORTED => "the manifold was aborted while the item ran",
                _ => "unknown status",
            },
        }),
        Err(Failure::ShutDown) => Err(Error::ShutDown),
        Err(Failure::Stopped(reason)) => Err(Error::ManifoldStopped {
            domain,
            reason: reason.clone(),
        }),
        Err(Failure::Hang(c)) => Err(Error::Hang {
            domain,
            variant: crate::Variant::Fused,
            seq: c.seq,
            chain: c.chain,
            stalled: c.stalled,
            recovered: c.recovered,
        }),
        Err(Failure::Fault(c)) => Err(Error::DeviceFault {
            domain,
            seq: c.seq,
            chain: c.chain,
            reason: c.reason.clone(),
        }),
    }
}

/// `ticket.await` resolves to what [`Ticket::wait`] returns, without blocking the task's thread.
/// A ticket dropped before it resolves waits for its item, as it does outside async code (it
/// borrows buffers the device may still write).
impl<R: ChainOutput> std::future::Future for Ticket<'_, R> {
    type Output = Result<R>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.get_mut();
        match this.poll_ready(cx) {
            std::task::Poll::Ready(()) => {
                std::task::Poll::Ready(this.take(None).map(|c| R::from_completion(&c)))
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<R: ChainOutput> Drop for Ticket<'_, R> {
    fn drop(&mut self) {
        if let State::Pending { manifold, cell } = &self.state {
            // The device may still write buffers this ticket borrows: wait before releasing them.
            let deadline = Instant::now() + manifold.shutdown_timeout();
            if manifold.wait(cell, Some(deadline)).is_err() {
                tracing::error!(
                    chain = self.chain,
                    seq = cell.seq,
                    "dropped a ticket whose item did not finish in time"
                );
            } else if let Some(Ok(c)) = cell.result().cloned() {
                // The guard learns from items nobody waited for too.
                self.note_guard(&c);
            }
        } else if let State::Cpu(job) = &self.state {
            // The item holds its buffers itself (crate::host), but their borrow ends with the
            // ticket: wait, so that what the application does next sees the item's writes.
            if let Ok(c) = job.take(None) {
                self.note_guard(&c);
            }
        } else if let State::Ready(c) = self.state {
            self.note_guard(&c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn product_paths_name_each_bit_the_device_sets() {
        let none = ProductPaths::from_bits(0);
        assert!(none.is_empty());
        assert_eq!(none.to_string(), "none");
        let each = [
            (abi::PPTM_PATH_CUDA_CORES, "cuda cores"),
            (abi::PPTM_PATH_MMA_SYNC, "mma.sync"),
            (abi::PPTM_PATH_WGMMA, "wgmma"),
            (abi::PPTM_PATH_WGMMA_FP8, "wgmma fp8"),
        ];
        for (bit, name) in each {
            let p = ProductPaths::from_bits(bit);
            assert!(!p.is_empty());
            assert_eq!(p.to_string(), name);
            let set = [p.cuda_cores(), p.mma_sync(), p.wgmma(), p.wgmma_fp8()];
            assert_eq!(set.iter().filter(|&&b| b).count(), 1, "{name}: {set:?}");
        }
        let two = ProductPaths::from_bits(abi::PPTM_PATH_MMA_SYNC | abi::PPTM_PATH_WGMMA_FP8);
        assert_eq!(two.to_string(), "mma.sync + wgmma fp8");
        assert_eq!(format!("{two:?}"), "ProductPaths(mma.sync + wgmma fp8)");
        // The four bits are distinct.
        let all = each.iter().fold(0u32, |acc, (b, _)| {
            assert_eq!(acc & b, 0);
            acc | b
        });
        assert_eq!(all.count_ones(), 4);
    }
}
