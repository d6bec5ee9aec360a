//! One resident manifold: module, device state, rings, the cooperative launch, and shutdown.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys};

use super::abi::{
    PPTM_BLOCKS_INDEPENDENT, PPTM_MAX_BLOCKS, PPTM_OP_SHUTDOWN, PPTM_OP_WAIT_VALUE, pptm_desc,
    pptm_device_state, pptm_manifold_params,
};
use super::driver::{Device, MappedHost, Stream};
use super::exit;
use super::queue::{self, Cell, Culprit, Failure, PushError, Queue, RingMemory};
use super::signals::{DomainLine, Signals};
use crate::chain::DomainCode;
use crate::error::{Error, Result};
use crate::runtime::Config;

impl RingMemory for MappedHost {
    fn base(&self) -> *mut u8 {
        self.host_ptr().cast()
    }

    fn leak(&self) {
        MappedHost::leak(self);
    }
}

// The compute blocks poll `completed` and `abort` as one 16-byte pair, and a stage slot as 16 such
// pairs, in one vector load (kernels/pptm/manifold.cuh, pptm_compute_wait); device allocations
// are 256-byte aligned (arena.rs, cuMemAlloc). NVRTC has no offsetof, so the layout is checked here.
const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(pptm_device_state, completed).is_multiple_of(16));
    assert!(offset_of!(pptm_device_state, abort) == offset_of!(pptm_device_state, completed) + 8);
    assert!(offset_of!(pptm_device_state, stage).is_multiple_of(16));
    assert!(std::mem::size_of::<super::abi::pptm_sq_slot>().is_multiple_of(16));
};

/// Grid-wide device memory of one manifold.
struct DeviceState {
    device: Arc<Device>,
    ptr: sys::CUdeviceptr,
    /// The device plan arena (gpu/plan.rs); 0 when none was allocated.
    plan: sys::CUdeviceptr,
    leak: AtomicBool,
}

impl Drop for DeviceState {
    fn drop(&mut self) {
        if !self.leak.load(Ordering::Relaxed) {
            self.device.free(self.ptr);
            if self.plan != 0 {
                self.device.free(self.plan);
            }
        }
    }
}

/// How the manifold is doing, as far as the host knows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Life {
    Running,
    /// Shut down cleanly: the kernel returned after the shutdown item.
    Exited,
    /// Stopped for this reason; pending items failed with it.
    Failed(String),
    /// Left its loops when the watchdog aborted it: the kernel has returned, and a new manifold
    /// may be launched in its place.
    Aborted(String),
}

/// How long a hung manifold gets to leave its loops after the abort (polled finely)...
const ABORT_GRACE: Duration = Duration::from_millis(50);
/// ... and how long in all it gets to leave or to report a device fault before it counts as wedged.
const FAULT_GRACE: Duration = Duration::from_secs(2);

/// A resident manifold kernel and its queue.
pub(crate) struct Manifold {
    pub code: &'static DomainCode,
    pub domain: &'static str,
    /// The SMs it was given (`None`: every SM, or `Config::max_sms`).
    pub share: Option<u32>,
    pub arch: &'static str,
    /// Blocks in the grid: the compute blocks and one fetcher block.
    pub grid: u32,
    /// Blocks per SM the occupancy API allows (the grid uses `Config::blocks_per_sm` of them).
    pub blocks_per_sm_max: u32,
    queue: Queue,
    stream: Stream,
    life: Mutex<Life>,
    shutdown_timeout: Duration,
    submit_timeout: Duration,
    state: DeviceState,
    /// Whether this manifold still counts as resident on the device.
    counted: AtomicBool,
    /// The watchdog asked the kernel to abort: its exit is expected, and the watchdog (not a
    /// waiter that notices the exit first) fails the pending items, with the hang.
    aborting: AtomicBool,
    /// Where it signals completions to application streams (signals.rs), and the runtime's lines.
    signal: DomainLine,
    signals: Arc<Signals>,
    /// Stream lines (device address) and the value of each that this manifold's items already
    /// wait for (`Runtime::wait_for_stream`), with the runtime's gate count it is up to date with.
    gates_seen: Mutex<(u64, HashMap<u64, u64>)>,
    /// The gate count in `gates_seen`, readable without its lock: the submission path's one look
    /// when the application orders nothing after its streams.
    gates_version: std::sync::atomic::AtomicU64,
    /// The watchdog thread, joined once the manifold stops (`stop_watchdog`), so that the owner's
    /// reference is the last: a watchdog that held the last one would free the manifold's driver
    /// objects on its own thread, perhaps while the process exits (exit.rs).
    watchdog: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Where its plans live (gpu/plan.rs).
    pub(crate) plans: super::plan::Arenas,
    // Dropped last: the device owns the kernel's code.
    device: Arc<Device>,
}

impl std::fmt::Debug for Manifold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "manifold `{}`: {} compute blocks + 1 fetcher, {} threads each ({} per SM fit), {}",
            self.domain,
            self.grid - 1,
            pptm_spec::BLOCK_THREADS,
            self.blocks_per_sm_max,
            self.arch
        )
    }
}

impl Manifold {
    /// Loads the domain's PTX, sizes the grid with the occupancy API and launches it cooperatively.
    /// `sms` caps the SMs' worth of compute blocks (the runtime's share for this domain); `None`
    /// uses `cfg.max_sms` or the whole GPU.
    pub fn launch(
        device: &Arc<Device>,
        code: &'static DomainCode,
        cfg: &Config,
        sms: Option<u32>,
        signals: &Arc<Signals>,
    ) -> Result<Arc<Manifold>> {
        let domain = code.name;
        let launch_err = |reason: String| Error::Launch { domain, reason };
        if !device.cooperative {
            return Err(launch_err(format!(
                "{} does not support cooperative launches",
                device.name
            )));
        }
        tracing::debug!(domain, "loading module");
        let module = device.module(code)?;
        let (arch, func) = (module.arch, module.manifold);
        let threads = pptm_spec::BLOCK_THREADS;
        let per_sm = module.blocks_per_sm_max(device)? as i32;
        if per_sm < 1 {
            return Err(launch_err(format!(
                "not one block of {threads} threads fits on an SM"
            )));
        }
        // Compute blocks, plus one fetcher block; all must be co-resident.
        let share = sms;
        let sms = sms
            .or(cfg.max_sms)
            .map_or(device.sm_count, |m| m.clamp(1, device.sm_count));
        let capacity = device.sm_count * per_sm as u32;
        let compute = (sms * cfg.blocks_per_sm.min(per_sm as u32))
            .min(capacity.saturating_sub(1))
            .min(PPTM_MAX_BLOCKS);
        if compute == 0 {
            return Err(launch_err(format!(
                "room for {capacity} blocks: not enough for one compute block and the fetcher"
            )));
        }
        let grid = compute + 1;

        tracing::debug!(domain, grid, per_sm, "allocating rings and state");
        // The rings, then the host plan arena, in one mapped allocation.
        let plan_bytes = cfg.plan_arena_bytes;
        let tail = queue::tail_offset(cfg.queue_slots);
        let rings = MappedHost::new(device, tail + plan_bytes)?;
        let sq_dev = rings.dev;
        let cq_dev = rings.dev + queue::cq_offset(cfg.queue_slots) as u64;
        let control_dev = rings.dev + queue::control_offset(cfg.queue_slots) as u64;
        let plan_host_dev = rings.dev + tail as u64;
        let queue = Queue::with_tail(Box::new(rings), cfg.queue_slots, plan_bytes);
        let state_bytes = std::mem::size_of::<pptm_device_state>();
        let mut state = DeviceState {
            device: device.clone(),
            ptr: device.alloc(state_bytes, 0)?,
            plan: 0,
            leak: AtomicBool::new(false),
        };
        state.plan = device.alloc(plan_bytes, 0)?;
        let plan_dev = state.plan;
        let stream = Stream::new(device)?;
        let signal = signals.domain_line(domain)?;

        let mut params = pptm_manifold_params {
            sq: sq_dev as *mut _,
            cq: cq_dev as *mut _,
            control: control_dev as *mut _,
            state: state.ptr as *mut _,
            queue_slots: cfg.queue_slots,
            queue_slots_log2: queue.log2(),
            hot_polls: cfg.hot_polls,
            max_backoff_ns: cfg.max_backoff.as_nanos().min(u128::from(u32::MAX)) as u32,
            fetch_pollers: cfg.fetch_pollers,
            reserved: 0,
            signal: signal.device_ptr as *mut _,
            signal_base: signal.base,
            plan_host: plan_host_dev as *mut _,
            plan_dev: state.plan as *mut _,
            plan_host_bytes: plan_bytes as u64,
            plan_dev_bytes: plan_bytes as u64,
        };
        let mut args: [*mut c_void; 1] = [(&mut params as *mut pptm_manifold_params).cast()];
        device.bind()?;
        tracing::debug!(domain, grid, "cooperative launch");
        // Counted from before the launch: from here on a host free or module load would wait for
        // this kernel (driver.rs).
        device.manifold_started();
        // SAFETY: func takes one pptm_manifold_params by value (kernels/pptm/manifold.cuh), which
        // the driver copies at launch; every pointer in it stays valid until the kernel exits
        // (the rings and state are owned by the Manifold, which outlives the kernel or leaks them).
        unsafe {
            result::launch_cooperative_kernel(
                func,
                (grid, 1, 1),
                (threads, 1, 1),
                module.dynamic_smem,
                stream.raw,
                &mut args,
            )
        }
        .map_err(|e| {
            device.manifold_stopped(false);
            launch_err(format!(
                "cuLaunchCooperativeKernel with {grid} blocks: {}",
                Error::driver("cuLaunchCooperativeKernel", e)
            ))
        })?;

        // Start handshake: a cooperative launch that cannot be resident (other persistent kernels
        // hold the SMs) would wait forever; cancel it instead and say why.
        let launched = Instant::now();
        while !queue.started() {
            let failed = match stream.query() {
                Ok(false) => None,
                Ok(true) => Some("the kernel exited at start".to_string()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(reason) = failed {
                device.manifold_stopped(false);
                return Err(launch_err(reason));
            }
            if launched.elapsed() > cfg.launch_timeout {
                tracing::debug!(domain, "not resident in time: cancelling the launch");
                queue.cancel_start();
                std::thread::sleep(Duration::from_millis(100));
                if queue.started() {
                    break;
                }
                // It may still start later, and then exits at once: what it would touch stays
                // alive, and it stays counted as resident, until a reaper sees it end.
                reap_cancelled_launch(device, domain, stream, queue, state);
                return Err(launch_err(format!(
                    "{grid} blocks did not become resident within {:?}: other long-running kernels hold the GPU                      (another pptm runtime in this or another process?); the launch was cancelled",
                    cfg.launch_timeout
                )));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        tracing::info!(
            domain,
            arch,
            grid,
            threads,
            per_sm,
            start_us = launched.elapsed().as_micros() as u64,
            "manifold resident"
        );
        let manifold = Arc::new(Manifold {
            code,
            share,
            domain,
            arch,
            grid,
            blocks_per_sm_max: per_sm as u32,
            queue,
            stream,
            life: Mutex::new(Life::Running),
            shutdown_timeout: cfg.shutdown_timeout,
            submit_timeout: cfg.submit_timeout,
            state,
            counted: AtomicBool::new(true),
            aborting: AtomicBool::new(false),
            watchdog: Mutex::new(None),
            signal,
            signals: signals.clone(),
            gates_seen: Mutex::new((0, HashMap::new())),
            gates_version: Default::default(),
            plans: super::plan::Arenas::new(plan_dev, plan_bytes as u64),
            device: device.clone(),
        });
        if let Some(deadline) = cfg.watchdog {
            spawn_watchdog(&manifold, deadline)?;
        }
        Ok(manifold)
    }

    fn life(&self) -> Life {
        self.life.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether the kernel left after an abort, so a new manifold may take its place.
    pub fn was_aborted(&self) -> bool {
        matches!(self.life(), Life::Aborted(_))
    }

    /// Submits one descriptor of chain `chain`. `blocking`: wait for a free slot (up to the
    /// configured timeout) instead of returning [`Error::QueueFull`]. `independent`: the item's
    /// buffers are disjoint from those of every item in flight, so it may run beside them
    /// (abi.h, "Ordering"); otherwise it runs after every earlier item and before every later one.
    pub fn submit(
        &self,
        desc: &pptm_desc,
        blocking: bool,
        independent: bool,
        chain: &'static str,
    ) -> Result<Arc<Cell>> {
        let deadline = Instant::now() + self.submit_timeout;
        // More blocks than a grid has means all of them; the top bit is the ordering's.
        let desc = &pptm_desc {
            blocks: desc.blocks.min(PPTM_MAX_BLOCKS)
                | if independent {
                    PPTM_BLOCKS_INDEPENDENT
                } else {
                    0
                },
            ..*desc
        };
        loop {
            match self.queue.try_push(desc, false, chain) {
                Ok(cell) => return Ok(cell),
                Err(PushError::Closed) => {
                    return Err(match self.life() {
                        Life::Failed(reason) | Life::Aborted(reason) => Error::ManifoldStopped {
                            domain: self.domain,
                            reason,
                        },
                        _ => Error::ShutDown,
                    });
                }
                Err(PushError::Full) if !blocking => {
                    return Err(Error::QueueFull {
                        capacity: self.queue.slots() as usize,
                    });
                }
                Err(PushError::Full) => {
                    if let Some(oldest) = self.queue.blocking_item() {
                        self.wait(&oldest, Some(deadline))?;
                    }
                }
            }
        }
    }

    /// The device word that reaches the returned value once item `seq` has completed (its domain
    /// line, gpu/signals.rs), for a wait on the GPU.
    pub(crate) fn completion_word(&self, seq: u64) -> (u64, u64) {
        (self.signal.device_ptr, self.signal.base + seq + 1)
    }

    /// `words` u64 words of the host plan arena from byte `offset` (None beyond it).
    pub(crate) fn plan_host_words(
        &self,
        offset: u64,
        words: usize,
    ) -> Option<&[crate::sync::atomic::AtomicU64]> {
        self.queue.tail_words(usize::try_from(offset).ok()?, words)
    }

    /// Waits until `cell` has its result (or `deadline` passes). Spins first, for latency; then
    /// yields; then sleeps; and checks now and then that the kernel is still alive.
    pub fn wait(&self, cell: &Cell, deadline: Option<Instant>) -> Result<()> {
        let start = Instant::now();
        let mut next_check = start + Duration::from_millis(1);
        for i in 0u64.. {
            if self.queue.poll(cell) {
                return Ok(());
            }
            if i < 20_000 {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            if now >= next_check {
                self.check_alive();
                next_check = now + Duration::from_millis(1);
            }
            if let Some(d) = deadline
                && now >= d
            {
                return Err(Error::Timeout(now - start));
            }
            if now - start < Duration::from_millis(2) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        unreachable!()
    }

    /// [`Manifold::check_alive`] for the async watcher (runtime/src/gpu/watcher.rs).
    pub(crate) fn check_alive_now(&self) {
        self.check_alive();
    }

    /// Notices a kernel that exited or faulted without being asked to: fails every pending item
    /// (a fault, with the item that was running).
    fn check_alive(&self) {
        if self.life() != Life::Running || self.aborting.load(Ordering::Acquire) {
            return;
        }
        let reason = match self.stream.query() {
            Ok(false) => return,
            Ok(true) if self.queue.is_closed() => return,
            // Re-read: an abort requested since the first look explains the exit.
            Ok(true) if self.aborting.load(Ordering::Acquire) => return,
            Ok(true) => "the manifold kernel exited without a shutdown item".to_string(),
            Err(e) => {
                let reason = e.to_string();
                self.stopped_running();
                match self.queue.oldest_pending() {
                    Some((seq, chain)) => self.faulted(seq, chain, reason),
                    None => self.fail(reason),
                }
                return;
            }
        };
        self.stopped_running();
        self.fail(reason);
    }

    /// The device faulted while item `seq` ran: every pending item fails with the fault.
    fn faulted(&self, seq: u64, chain: &'static str, reason: String) {
        self.fail_with(
            format!("device fault while it ran item {seq} (`{chain}`): {reason}"),
            Failure::Fault(Culprit {
                seq,
                chain,
                reason,
                stalled: Duration::ZERO,
                recovered: false,
            }),
            false,
        );
    }

    /// One look of the watchdog. `seen` is the progress it saw last (heartbeat, oldest pending
    /// item) and `since` when it changed. Returns whether to keep watching.
    fn watch(
        &self,
        seen: &mut (u64, Option<u64>),
        since: &mut Instant,
        deadline: Duration,
    ) -> bool {
        if self.life() != Life::Running {
            return false;
        }
        self.check_alive();
        if self.life() != Life::Running || self.queue.is_closed() {
            // Stopped, or shutting down (which has its own timeout).
            return false;
        }
        let now = Instant::now();
        let oldest = self.queue.oldest_pending();
        let progress = (self.queue.heartbeat(), oldest.map(|(seq, _)| seq));
        if oldest.is_none() || progress != *seen {
            *seen = progress;
            *since = now;
            return true;
        }
        let stalled = now - *since;
        if let Some((seq, chain)) = oldest
            && stalled >= deadline
        {
            self.hang(seq, chain, stalled);
            return false;
        }
        true
    }

    /// No progress for too long while item `seq` was running: abort the kernel, and fail every
    /// pending item with the hang. A kernel that leaves on the abort is gone for good and its
    /// memory safe to release; one that does not (code that never reaches a point where it looks)
    /// is wedged: its memory, and every buffer freed from now on, is leaked rather than handed back
    /// while it may still write there.
    fn hang(&self, seq: u64, chain: &'static str, stalled: Duration) {
        tracing::error!(
            domain = self.domain,
            seq,
            chain,
            ?stalled,
            "watchdog: no progress; aborting the manifold"
        );
        self.aborting.store(true, Ordering::Release);
        self.queue.request_abort();
        // A device fault can take a while to surface (on an H200, an illegal address was still
        // "not ready" 100 ms after the store): a kernel that neither leaves nor reports an error
        // within the grace period gets FAULT_GRACE in all to show a fault before it counts as
        // wedged.
        let start = Instant::now();
        let exited = loop {
            match self.stream.query() {
                Ok(true) => break true,
                Ok(false) if start.elapsed() < FAULT_GRACE => {
                    let fine = start.elapsed() < ABORT_GRACE;
                    std::thread::sleep(Duration::from_micros(if fine { 100 } else { 1000 }))
                }
                Ok(false) => break false,
                Err(e) => {
                    // It was a fault all along: report it as one.
                    self.stopped_running();
                    self.faulted(seq, chain, e.to_string());
                    return;
                }
            }
        };
        let culprit = Culprit {
            seq,
            chain,
            reason: String::new(),
            stalled,
            recovered: exited,
        };
        let reason = format!("no progress for {stalled:?} while it ran item {seq} (`{chain}`)");
        if exited {
            self.stopped_running();
        } else {
            self.device.wedge();
            self.queue.leak_memory();
            self.state.leak.store(true, Ordering::Relaxed);
            std::mem::forget(self.device.clone());
        }
        self.fail_with(reason, Failure::Hang(culprit), exited);
    }

    /// The kernel is known to have stopped running.
    fn stopped_running(&self) {
        if self.counted.swap(false, Ordering::AcqRel) {
            self.device.manifold_stopped(false);
        }
    }

    fn fail(&self, reason: String) {
        self.fail_with(reason.clone(), Failure::Stopped(reason), false);
    }

    /// Stops taking items and fails every pending one with `failure`. `aborted`: the kernel left
    /// on an abort, so the runtime may launch a new manifold in its place.
    fn fail_with(&self, reason: String, failure: Failure, aborted: bool) {
        tracing::error!(domain = self.domain, "manifold stopped: {reason}");
        *self.life.lock().unwrap_or_else(|e| e.into_inner()) = if aborted {
            Life::Aborted(reason)
        } else {
            Life::Failed(reason)
        };
        self.queue.close();
        self.queue.fail_pending(failure);
        self.finish_signal();
    }

    /// The manifold takes no more items: its signal line goes past every item it was given, so
    /// that no application stream waits for one that failed (its ticket reports the failure).
    fn finish_signal(&self) {
        self.signals
            .finish_domain_line(self.signal, self.queue.submitted());
    }

    /// Stops the manifold: every item submitted before completes, then the kernel returns.
    /// Idempotent. If the kernel does not stop within the shutdown timeout, pending items fail and
    /// the memory it may still use is leaked rather than freed under it.
    pub fn shutdown(&self) -> Result<()> {
        self.begin_shutdown().finish()
    }

    /// Waits for the watchdog thread to end, after the queue is closed (it ends at its next look,
    /// woken now). Afterwards it holds no reference to the manifold. Called on the watchdog's own
    /// thread (the manifold dropped there), it returns at once.
    fn stop_watchdog(&self) {
        let Some(watchdog) = self
            .watchdog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        if watchdog.thread().id() == std::thread::current().id() {
            return;
        }
        debug_assert!(self.queue.is_closed() || self.life() != Life::Running);
        watchdog.thread().unpark();
        let _ = watchdog.join();
    }

    /// The first half of `shutdown`: closes the queue and queues the shutdown item, without
    /// waiting for it. A runtime with several manifolds asks them all before it waits for any:
    /// under compute-sanitizer one kernel's end is processed only once the device is idle, so
    /// waiting for each in turn hung beside the others (measured on an H200).
    pub fn begin_shutdown(&self) -> ShutdownRequest<'_> {
        if self.queue.is_closed() {
            return ShutdownRequest {
                manifold: self,
                pushed: None,
                deadline: None,
            };
        }
        self.queue.close();
        let deadline = Instant::now() + self.shutdown_timeout;
        let desc = pptm_desc {
            opcode: PPTM_OP_SHUTDOWN,
            ..Default::default()
        };
        let pushed = loop {
            match self.queue.try_push(&desc, true, "shutdown") {
                Ok(cell) => break Some(cell),
                Err(PushError::Full) if Instant::now() < deadline => {
                    if let Some(oldest) = self.queue.blocking_item() {
                        let _ = self.wait(&oldest, Some(deadline));
                    }
                    if self.life() != Life::Running {
                        break None;
                    }
                }
                Err(_) => break None,
            }
        };
        ShutdownRequest {
            manifold: self,
            pushed,
            deadline: Some(deadline),
        }
    }

    /// The second half of `shutdown`: waits for the kernel to take the shutdown item and return.
    fn finish_shutdown(&self, pushed: Option<Arc<Cell>>, deadline: Option<Instant>) -> Result<()> {
        let Some(deadline) = deadline else {
            // Already closed: shut down before, or stopped.
            return match self.life() {
                Life::Failed(reason) | Life::Aborted(reason) => Err(Error::ManifoldStopped {
                    domain: self.domain,
                    reason,
                }),
                _ => Ok(()),
            };
        };
        let stopped = match pushed {
            Some(cell) => self.wait(&cell, Some(deadline)).is_ok() && self.wait_exit(deadline),
            None => false,
        };
        if stopped {
            *self.life.lock().unwrap_or_else(|e| e.into_inner()) = Life::Exited;
            self.stopped_running();
            // Anything still without a result was never run (cannot happen in order, but be sure).
            self.queue.fail_pending(Failure::ShutDown);
            self.finish_signal();
            tracing::info!(
                domain = self.domain,
                items = self.queue.submitted(),
                "manifold shut down"
            );
            return Ok(());
        }
        let reason = match self.life() {
            Life::Failed(reason) | Life::Aborted(reason) => reason,
            _ => format!(
                "it did not stop within {:?}; its memory is leaked",
                self.shutdown_timeout
            ),
        };
        self.fail(reason.clone());
        self.queue.leak_memory();
        self.state.leak.store(true, Ordering::Relaxed);
        // The kernel may still run: its code and context must stay.
        std::mem::forget(self.device.clone());
        Err(Error::ManifoldStopped {
            domain: self.domain,
            reason,
        })
    }

    /// Waits for the kernel to return (the stream to drain), until `deadline`.
    fn wait_exit(&self, deadline: Instant) -> bool {
        loop {
            match self.stream.query() {
                Ok(true) => return true,
                Ok(false) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(50))
                }
                Ok(false) => return false,
                Err(e) => {
                    self.stopped_running();
                    self.fail(e.to_string());
                    return false;
                }
            }
        }
    }
}

/// A shutdown asked for and not yet waited for (`Manifold::begin_shutdown`).
pub(crate) struct ShutdownRequest<'a> {
    manifold: &'a Manifold,
    pushed: Option<Arc<Cell>>,
    /// None: the queue was closed already.
    deadline: Option<Instant>,
}

impl ShutdownRequest<'_> {
    /// Waits for the manifold to stop; what `Manifold::shutdown` returns.
    pub fn finish(self) -> Result<()> {
        let stopped = self.manifold.finish_shutdown(self.pushed, self.deadline);
        // The queue is closed: the watchdog ends at its next look.
        self.manifold.stop_watchdog();
        stopped
    }
}

impl Drop for Manifold {
    fn drop(&mut self) {
        if self.life() == Life::Running {
            let _ = self.shutdown();
        }
    }
}

/// The application stream points every item submitted from now on must follow
/// (`Runtime::wait_for_stream`): each stream line's device address and the value it will reach.
#[derive(Default)]
pub(crate) struct Gates {
    /// Bumped on every new point, so a manifold that is up to date can tell with one load.
    pub version: std::sync::atomic::AtomicU64,
    pub points: Mutex<HashMap<u64, u64>>,
}

impl Manifold {
    /// Before an item is pushed: queues a `PPTM_OP_WAIT_VALUE` item for every stream point of
    /// `gates` this manifold's items do not already follow, so the item starts after them.
    /// `patience`: how long each wait reports progress to the watchdog.
    pub fn follow_gates(&self, gates: &Gates, blocking: bool, patience: Duration) -> Result<()> {
        let version = gates.version.load(Ordering::Acquire);
        if self.gates_version.load(Ordering::Acquire) == version {
            return Ok(());
        }
        let mut seen = self.gates_seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.0 == version {
            return Ok(());
        }
        let points: Vec<(u64, u64)> = gates
            .points
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(&a, &v)| (a, v))
            .collect();
        for (addr, value) in points {
            if seen.1.get(&addr).is_some_and(|&v| v >= value) {
                continue;
            }
            if self.signals.point_passed(addr, value) {
                // The stream is past it already (a manifold launched after the point).
                seen.1.insert(addr, value);
                continue;
            }
            let mut desc = pptm_desc {
                opcode: PPTM_OP_WAIT_VALUE,
                blocks: 1,
                ..Default::default()
            };
            desc.args[0] = addr;
            desc.args[1] = value;
            desc.args[2] = patience.as_nanos().min(u128::from(u64::MAX)) as u64;
            // Its result needs no waiting for: a failure shows in the items after it (the
            // watchdog fails them all), and the ring keeps its cell until it completes.
            drop(self.submit(&desc, blocking, false, "wait for an application stream")?);
            seen.1.insert(addr, value);
        }
        seen.0 = version;
        self.gates_version.store(version, Ordering::Release);
        Ok(())
    }

    /// Makes `stream` wait on the GPU until item `seq` of this manifold has completed (or the
    /// manifold has stopped without running it).
    ///
    /// # Safety
    /// `stream` is a valid stream of the device's primary context.
    pub unsafe fn signal_stream(&self, stream: sys::CUstream, seq: u64) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe {
            self.signals
                .stream_waits_for(stream, self.signal, self.signal.base + seq + 1)
        }
    }

    /// Running, with every item it was given completed (the parker's test).
    pub fn is_idle(&self) -> bool {
        self.life() == Life::Running
            && !self.queue.is_closed()
            && self.queue.oldest_pending().is_none()
    }

    /// The context the manifold runs in (its device's primary context).
    pub fn context(&self) -> sys::CUcontext {
        self.device.context()
    }

    /// [`Device::check_stream`] for this manifold's device.
    ///
    /// # Safety
    /// As `Device::check_stream`.
    pub unsafe fn check_stream(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.device.check_stream(stream) }
    }

    /// Non-blocking: whether `cell` has its result.
    pub fn poll(&self, cell: &Cell) -> bool {
        self.queue.poll(cell)
    }

    pub fn shutdown_timeout(&self) -> Duration {
        self.shutdown_timeout
    }
}

/// Waits, on a thread of its own, for a cancelled launch's kernel to end (it exits as soon as it
/// starts, once the kernels in its way have finished), then releases what it would have touched
/// and stops counting it as resident, so host frees and module loads resume. Should the thread not
/// start, everything is leaked instead and the kernel stays counted for good.
fn reap_cancelled_launch(
    device: &Arc<Device>,
    domain: &'static str,
    stream: Stream,
    queue: Queue,
    state: DeviceState,
) {
    device.manifold_cancelled();
    let kept = Arc::new(Mutex::new(Some((stream, queue, state))));
    exit::install();
    let reaper = {
        let (device, kept) = (device.clone(), kept.clone());
        std::thread::Builder::new()
            .name(format!("pptm-reaper-{domain}"))
            .spawn(move || {
                let Some((stream, queue, state)) =
                    kept.lock().unwrap_or_else(|e| e.into_inner()).take()
                else {
                    return;
                };
                // Ended or failed: either way the kernel no longer runs. At process exit the
                // driver is going away: leave, touching nothing of it again (exit.rs).
                let busy = loop {
                    let Some(busy) = exit::enter() else {
                        return leak_for_good(device, stream, queue, state);
                    };
                    if !matches!(stream.query(), Ok(false)) {
                        break busy;
                    }
                    drop(busy);
                    std::thread::sleep(Duration::from_millis(20));
                };
                tracing::debug!(domain, "a cancelled manifold launch has ended");
                drop((queue, state, stream));
                device.manifold_stopped(true);
                // The last reference may be this one: its drop frees driver objects too.
                drop(device);
                drop(busy);
            })
    };
    if reaper.is_err()
        && let Some((stream, queue, state)) = kept.lock().unwrap_or_else(|e| e.into_inner()).take()
    {
        leak_for_good(device.clone(), stream, queue, state);
    }
}

/// What a cancelled launch's kernel may still touch, given up without a driver call: its memory is
/// never freed, and the kernel stays counted as resident (the device is never dropped).
fn leak_for_good(device: Arc<Device>, stream: Stream, queue: Queue, state: DeviceState) {
    queue.leak_memory();
    state.leak.store(true, Ordering::Relaxed);
    std::mem::forget((stream, queue, state, device));
}

/// The manifold's watchdog: a thread that looks every quarter deadline (at most every 25 ms) for
/// progress on pending work: the device's heartbeat (stamped per tile inside items) or the oldest
/// pending item completing. It holds only a weak reference, and ends with the manifold.
fn spawn_watchdog(m: &Arc<Manifold>, deadline: Duration) -> Result<()> {
    let weak: Weak<Manifold> = Arc::downgrade(m);
    let tick = (deadline / 4).clamp(Duration::from_millis(1), Duration::from_millis(25));
    exit::install();
    let watchdog = std::thread::Builder::new()
        .name(format!("pptm-watchdog-{}", m.domain))
        .spawn(move || {
            let mut seen = (u64::MAX, None);
            let mut since = Instant::now();
            loop {
                // Woken early by `stop_watchdog` (or spuriously: a look comes early).
                std::thread::park_timeout(tick);
                // Each look queries the stream and reads the mapped heartbeat: none once the
                // process is exiting (exit.rs). The manifold is dropped outside the leave: should
                // this thread hold the last reference (a manifold never shut down), its drop must
                // not make the exit handler wait on a shutdown.
                let Some(m) = weak.upgrade() else { return };
                let Some(busy) = exit::enter() else { return };
                let go_on = m.watch(&mut seen, &mut since, deadline);
                drop(busy);
                if !go_on {
                    return;
                }
            }
        })
        .map_err(|e| Error::Launch {
            domain: m.domain,
            reason: format!("cannot start its watchdog thread: {e}"),
        })?;
    *m.watchdog.lock().unwrap_or_else(|e| e.into_inner()) = Some(watchdog);
    Ok(())
}
