//! The launched variants, waited for on the host:
//! * `Variant::FusedLaunched`: a domain's fused variants run by one ordinary kernel launch per item
//!   (the `pptm_launched` kernel of the same module). The variant code is the manifold's; only
//!   dispatch differs, so comparing the two measures what persistence buys.
//! * `Variant::Unfused`: every stage of the chain its own launch (`pptm_unfused_stage`), one after
//!   another on the stream, each storing its output in a scratch buffer the next one reads: the
//!   debugging path and the baseline that measures what fusion buys.
//! * `Variant::UnfusedGraph`: the same stage launches captured into a CUDA graph and replayed: what
//!   a user who captures their launch sequence gets. One executable graph is kept per topology
//!   (opcode, block count, sizes); an item with other arguments (pointers, scalars) is captured
//!   again and written into that executable graph with `cuGraphExecUpdate`, as graph users do,
//!   rather than instantiated anew.
//!
//! Every item's device time is taken between CUDA events recorded around its launches.
//!
//! The launched variants have a watchdog too (`Config::watchdog`): the host waits by polling the
//! stream and the launch's progress word, which the kernel's blocks stamp at most once a
//! millisecond as they reach tiles (`pptm_tick`). An item with no progress for the deadline is
//! asked to stop (the launch's `abort` word, which injected hangs poll) and fails with
//! `Error::Hang`; a kernel that ignores it leaves the launcher wedged, and later items fail at
//! once instead of queueing behind it.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys};

use super::abi::{
    PPTM_MAX_BLOCKS, PPTM_MAX_STAGES, PPTM_STATUS_ABORTED, pptm_desc, pptm_launch_out,
    pptm_launch_params, pptm_unfused_params,
};
use super::driver::{Device, MappedHost, Module, Stream};
use crate::chain::{Completion, DomainCode};
use crate::error::{Error, Result};
use crate::runtime::Variant;
use crate::ticket::ProductPaths;

/// How long a stalled item has, once asked to stop, before the launcher counts it as wedged (for
/// good: a kernel that merely waited for the GPU that long would be counted too).
const ABORT_GRACE: Duration = Duration::from_secs(5);
/// The wait spins on the stream for this long, then sleeps between polls (a long item's end is
/// seen up to a poll later; short items, the ones whose latency is measured, never sleep).
const SPIN_FOR: Duration = Duration::from_millis(20);
const POLL_SLEEP: Duration = Duration::from_micros(50);

/// Launches items of one domain, one at a time, on a stream of its own.
pub(crate) struct Launcher {
    device: Arc<Device>,
    module: Arc<Module>,
    /// Most blocks one launch uses: what a manifold of the same configuration would have.
    max_blocks: u32,
    /// `Config::watchdog` and `Config::variant` of the runtime (for `Error::Hang`).
    watchdog: Option<Duration>,
    variant: Variant,
    inner: Mutex<Inner>,
}

struct Inner {
    /// The domain whose chains this launcher runs (for errors).
    domain: &'static str,
    stream: Stream,
    /// Arrival counter, then PPTM_MAX_BLOCKS partials (device memory, zeroed).
    state: sys::CUdeviceptr,
    out: MappedHost,
    /// Unfused mode: each stage's output buffer (address, bytes), grown on demand.
    scratch: Vec<(sys::CUdeviceptr, usize)>,
    /// Recorded before the first launch and after the last of every item.
    events: [sys::CUevent; 2],
    /// Graph mode: an executable graph per topology (see `GraphKey`). The graphs hold the
    /// scratch addresses, so they are dropped whenever a scratch buffer is reallocated.
    graphs: HashMap<Vec<u64>, CachedGraph>,
    /// Items run so far (the `seq` of `Error::Hang`).
    items: u64,
    /// An item's kernel ignored the watchdog's abort and may run forever (its seq, chain and how
    /// long it had stalled): every later item fails with its `Error::Hang` (their launches would
    /// queue behind it).
    wedged: Option<(u64, &'static str, Duration)>,
}

/// An executable graph and the arguments it was last captured or updated with.
struct CachedGraph {
    exec: sys::CUgraphExec,
    /// Kernel nodes: graphs of as many nodes can be updated into one another.
    stages: usize,
    args: Vec<u64>,
}

/// Most graphs kept per launcher; beyond it the cache starts again (a loop over a few shapes
/// stays far below).
const MAX_GRAPHS: usize = 64;

// SAFETY: the raw handles are used under `inner`'s lock with the context bound.
unsafe impl Send for Launcher {}
// SAFETY: as above.
unsafe impl Sync for Launcher {}

const STATE_BYTES: usize = 128 + 8 * PPTM_MAX_BLOCKS as usize;

impl Launcher {
    pub fn new(
        device: &Arc<Device>,
        code: &'static DomainCode,
        max_blocks: u32,
        watchdog: Option<Duration>,
        variant: Variant,
    ) -> Result<Self> {
        let module = device.module(code)?;
        // A module whose kernels run one block an SM (the Hopper tensor path) gets a grid of one
        // wave: the caller's figure assumes Config::blocks_per_sm.
        let per_sm = module.blocks_per_sm_max(device)?.max(1);
        let max_blocks = max_blocks.min(device.sm_count.saturating_mul(per_sm));
        let stream = Stream::new(device)?;
        // Lent by the device (made before any manifold: see driver.rs), given back on every
        // path below that does not keep them.
        let first = device.take_event()?;
        let events = match device.take_event() {
            Ok(second) => [first, second],
            Err(e) => {
                device.give_back_event(first);
                return Err(e);
            }
        };
        let give_back = |e: Error| {
            for &event in &events {
                device.give_back_event(event);
            }
            e
        };
        let state = device.alloc(STATE_BYTES, 0).map_err(give_back)?;
        let out = match MappedHost::new(device, std::mem::size_of::<pptm_launch_out>()) {
            Ok(out) => out,
            Err(e) => {
                device.free(state);
                return Err(give_back(e));
            }
        };
        Ok(Launcher {
            device: device.clone(),
            module,
            max_blocks: max_blocks.clamp(1, PPTM_MAX_BLOCKS),
            watchdog,
            variant,
            inner: Mutex::new(Inner {
                domain: code.name,
                stream,
                state,
                out,
                scratch: Vec::new(),
                events,
                graphs: HashMap::new(),
                items: 0,
                wedged: None,
            }),
        })
    }

    /// Runs one item of chain `chain` and waits for it.
    pub fn run(&self, desc: &pptm_desc, chain: &'static str) -> Result<Completion> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.begin_item(self.variant)?;
        self.device.bind()?;
        let blocks = match desc.blocks {
            0 => self.max_blocks,
            b => b.min(self.max_blocks),
        };
        let mut params = pptm_launch_params {
            desc: *desc,
            arrivals: inner.arrivals(),
            partials: inner.partials(),
            out: inner.out_dev(),
        };
        inner.record(0)?;
        // SAFETY: pptm_launched's only parameter is a pptm_launch_params.
        unsafe {
            inner.launch(
                self.module.launched,
                blocks,
                self.module.dynamic_smem,
                &mut params,
            )
        }?;
        inner.record(1)?;
        self.wait_and_read(&mut inner, chain)
    }

    /// Waits for the item's launches (watched, see the module docs) and reads its result.
    fn wait_and_read(&self, inner: &mut Inner, chain: &'static str) -> Result<Completion> {
        if let Some(deadline) = self.watchdog {
            inner.watch(&self.device, deadline, self.variant, chain)?;
        }
        inner.read()
    }
}

impl Launcher {
    /// Runs one item unfused, stage by stage, and waits for it: launched one by one, or with
    /// `graph`, replayed from a CUDA graph captured the first time this item was seen. `sizes` are
    /// the chain's dimension sizes (from `ChainIr::bind`).
    pub fn run_unfused(
        &self,
        desc: &pptm_desc,
        ir: &pptm_spec::ChainIr,
        sizes: &[usize],
        graph: bool,
        chain: &'static str,
    ) -> Result<Completion> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.begin_item(self.variant)?;
        self.device.bind()?;
        // The stages' output buffers, at least as large as this item needs. A chain of more
        // stages than the ring holds (`repeat = k`) reuses them: stage s stores to s % ring, and
        // each stage reads only what the one before it stored (codegen's `scratch`).
        const RING: usize = PPTM_MAX_STAGES as usize;
        let mut scratch = [std::ptr::null_mut::<f32>(); RING];
        for (s, slot) in scratch.iter_mut().enumerate().take(ir.stages.len()) {
            let bytes = (s..ir.stages.len())
                .step_by(RING)
                .map(|k| ir.stage_output_len(k, sizes))
                .max()
                .unwrap_or(0)
                .max(1)
                .checked_mul(4)
                .ok_or(Error::TooLarge {
                    what: "an unfused stage's output",
                    len: usize::MAX,
                })?;
            if inner.scratch.len() <= s {
                inner.scratch.push((0, 0));
            }
            if inner.scratch[s].1 < bytes {
                inner.drop_graphs(&self.module);
                if inner.scratch[s].0 != 0 {
                    self.device.free(inner.scratch[s].0);
                    inner.scratch[s] = (0, 0);
                }
                inner.scratch[s] = (self.device.alloc(bytes, 0)?, bytes);
            }
            *slot = inner.scratch[s].0 as *mut f32;
        }
        let launch_stages = |inner: &Inner| -> Result<()> {
            for s in 0..ir.stages.len() {
                let mut params = pptm_unfused_params {
                    desc: *desc,
                    stage: s as u32,
                    pad: 0,
                    scratch,
                    arrivals: inner.arrivals(),
                    partials: inner.partials(),
                    out: inner.out_dev(),
                };
                let blocks = ir.stage_blocks(s, sizes).min(self.max_blocks);
                // SAFETY: pptm_unfused_stage's only parameter is a pptm_unfused_params; the
                // scratch buffers were sized for this item above (and a graph that holds them is
                // dropped before they are reallocated).
                unsafe {
                    inner.launch(
                        self.module.unfused,
                        blocks,
                        self.module.dynamic_smem,
                        &mut params,
                    )
                }?;
            }
            Ok(())
        };
        if !graph {
            inner.record(0)?;
            launch_stages(&inner)?;
            inner.record(1)?;
            return self.wait_and_read(&mut inner, chain);
        }
        let key = GraphKey::of(desc, sizes);
        let exec = inner.graph_for(&self.device, &self.module, &key, ir.stages.len(), |inner| {
            launch_stages(inner)
        })?;
        inner.record(0)?;
        // SAFETY: the graph was instantiated from launches on this launcher's buffers, which are
        // still allocated (a reallocation drops every graph first); the stream is ours.
        unsafe { result::graph::launch(exec, inner.stream.raw) }
            .map_err(|e| Error::driver("cuGraphLaunch", e))?;
        inner.record(1)?;
        self.wait_and_read(&mut inner, chain)
    }
}

/// What makes two unfused items one graph (`topology`: opcode, block count and every dimension
/// size, which fix the stages' grids) and what only changes its kernels' parameters (`args`).
struct GraphKey {
    topology: Vec<u64>,
    args: Vec<u64>,
}

impl GraphKey {
    fn of(desc: &pptm_desc, sizes: &[usize]) -> Self {
        let mut topology = Vec::with_capacity(2 + sizes.len());
        topology.push(u64::from(desc.opcode));
        topology.push(u64::from(desc.blocks));
        topology.extend(sizes.iter().map(|&s| s as u64));
        GraphKey {
            topology,
            args: desc.args.to_vec(),
        }
    }
}

impl Inner {
    fn arrivals(&self) -> *mut u64 {
        self.state as *mut u64
    }

    fn partials(&self) -> *mut f64 {
        (self.state + 128) as *mut f64
    }

    fn out_dev(&self) -> *mut pptm_launch_out {
        self.out.dev as *mut pptm_launch_out
    }

    /// Launches `func` with `params` as its only parameter and `smem` bytes of dynamic shared
    /// memory (the module's `dynamic_smem`) on this launcher's stream.
    ///
    /// # Safety
    /// `P` must be the parameter type `func` declares, and every pointer in it must stay valid
    /// until the launch finishes (the driver copies `params` itself at launch).
    unsafe fn launch<P>(
        &self,
        func: sys::CUfunction,
        blocks: u32,
        smem: u32,
        params: &mut P,
    ) -> Result<()> {
        let mut args: [*mut c_void; 1] = [(params as *mut P).cast()];
        // SAFETY: the caller vouches for the parameter type and its pointers; the stream is ours.
        unsafe {
            result::launch_kernel(
                func,
                (blocks, 1, 1),
                (pptm_spec::BLOCK_THREADS, 1, 1),
                smem,
                self.stream.raw,
                &mut args,
            )
        }
        .map_err(|e| Error::driver("cuLaunchKernel", e))
    }

    /// Records event `which` (0: before the item's launches, 1: after them) on the stream.
    fn record(&self, which: usize) -> Result<()> {
        // SAFETY: the event and the stream are ours and valid.
        unsafe { result::event::record(self.events[which], self.stream.raw) }
            .map_err(|e| Error::driver("cuEventRecord", e))
    }

    /// The executable graph for `key` (an item of `stages` stages): cached as is, updated in
    /// place when only the arguments changed, or else a graph of as many nodes updated to this
    /// item: one from the module's pool, one instantiated (only while no manifold is resident),
    /// or one of this launcher's own cached graphs. Never instantiates beside a manifold
    /// (graphs.rs says why).
    fn graph_for(
        &mut self,
        device: &Device,
        module: &Module,
        key: &GraphKey,
        stages: usize,
        launch: impl FnOnce(&Inner) -> Result<()>,
    ) -> Result<sys::CUgraphExec> {
        if let Some(cached) = self.graphs.get(&key.topology)
            && cached.args == key.args
        {
            return Ok(cached.exec);
        }
        let graph = self.capture(launch)?;
        let exec = self.exec_for(device, module, key, stages, graph);
        // SAFETY: an exec keeps what it needs of the graph, which is destroyed once, here.
        let _ = unsafe { result::graph::destroy(graph) };
        let exec = exec?;
        self.graphs.insert(
            key.topology.clone(),
            CachedGraph {
                exec,
                stages,
                args: key.args.clone(),
            },
        );
        Ok(exec)
    }

    /// An executable graph holding `graph`'s launches; see `graph_for`.
    fn exec_for(
        &mut self,
        device: &Device,
        module: &Module,
        key: &GraphKey,
        stages: usize,
        graph: sys::CUgraph,
    ) -> Result<sys::CUgraphExec> {
        // Every exec below is idle: each item synchronises the stream before the next starts.
        // SAFETY (each `update`): both handles are valid and the exec is not running.
        if let Some(cached) = self.graphs.remove(&key.topology) {
            // SAFETY: see above.
            if unsafe { update(cached.exec, graph) } {
                return Ok(cached.exec);
            }
            device.destroy_graph_later(cached.exec);
        }
        if self.graphs.len() >= MAX_GRAPHS {
            self.drop_graphs(module);
        }
        let mut refused = 0;
        while let Some(exec) = module.graphs.take(stages) {
            // SAFETY: see above.
            if unsafe { update(exec, graph) } {
                return Ok(exec);
            }
            refused += 1;
            device.destroy_graph_later(exec);
        }
        if let Some(exec) = device.instantiate_unless_resident(graph)? {
            return Ok(exec);
        }
        // Reuse one of this launcher's graphs of as many nodes (its topology is then recaptured
        // when next needed).
        while let Some(topology) = self
            .graphs
            .iter()
            .find(|(_, c)| c.stages == stages)
            .map(|(t, _)| t.clone())
        {
            let Some(cached) = self.graphs.remove(&topology) else {
                break;
            };
            // SAFETY: see above.
            if unsafe { update(cached.exec, graph) } {
                return Ok(cached.exec);
            }
            refused += 1;
            module.graphs.give(stages, cached.exec);
        }
        Err(Error::GraphUnavailable {
            domain: self.domain,
            stages,
            refused,
        })
    }

    /// Captures what `launch` enqueues on the stream into a graph (not yet instantiated).
    fn capture(&self, launch: impl FnOnce(&Inner) -> Result<()>) -> Result<sys::CUgraph> {
        // SAFETY: the stream is ours and idle (every item synchronises it); capture only records
        // the launches.
        unsafe {
            result::stream::begin_capture(
                self.stream.raw,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
            .map_err(|e| Error::driver("cuStreamBeginCapture", e))?;
            let launched = launch(self);
            let graph = result::stream::end_capture(self.stream.raw)
                .map_err(|e| Error::driver("cuStreamEndCapture", e))?;
            if let Err(e) = launched {
                let _ = result::graph::destroy(graph);
                return Err(e);
            }
            Ok(graph)
        }
    }

    /// Gives every cached graph back to the module's pool (never destroyed: graphs.rs).
    fn drop_graphs(&mut self, module: &Module) {
        for (_, cached) in self.graphs.drain() {
            // Every item synchronised the stream, so no replay is running.
            module.graphs.give(cached.stages, cached.exec);
        }
    }

    /// Before an item's launches: refuses it if an earlier kernel is stuck on the stream, and
    /// clears the mapped result, progress and abort words.
    fn begin_item(&mut self, variant: Variant) -> Result<()> {
        if let Some((seq, chain, stalled)) = self.wedged {
            return Err(Error::Hang {
                domain: self.domain,
                variant,
                seq,
                chain,
                stalled,
                recovered: false,
            });
        }
        self.items += 1;
        // SAFETY: the previous item's launches finished (its wait saw the stream idle), so
        // nothing writes the mapped words now; the allocation holds one pptm_launch_out.
        unsafe {
            std::ptr::write_volatile(
                self.out.host_ptr().cast::<pptm_launch_out>(),
                pptm_launch_out::default(),
            )
        };
        Ok(())
    }

    /// The launch's word at `offset` bytes into the mapped pptm_launch_out, which the device
    /// writes with relaxed system-scope stores while the host reads it.
    fn out_word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: the allocation holds one pptm_launch_out (8-byte aligned, `offset` is one of
        // its u64 fields) and lives as long as `self`; device and host access it atomically.
        unsafe { AtomicU64::from_ptr(self.out.host_ptr().cast::<u8>().add(offset).cast::<u64>()) }
    }

    /// Polls the stream until the item's launches finish, or until its progress word has not
    /// moved for `deadline`: then asks the kernel to stop (`abort`) and fails with
    /// `Error::Hang`, after at most ABORT_GRACE more.
    fn watch(
        &mut self,
        device: &Device,
        deadline: Duration,
        variant: Variant,
        chain: &'static str,
    ) -> Result<()> {
        let started = Instant::now();
        let progress = std::mem::offset_of!(pptm_launch_out, progress);
        let (mut seen, mut since) = (0u64, started);
        loop {
            if self.stream.query()? {
                return Ok(());
            }
            let now = Instant::now();
            let p = self.out_word(progress).load(Ordering::Relaxed);
            if p != seen {
                (seen, since) = (p, now);
            } else if now - since >= deadline {
                let stalled = now - since;
                self.out_word(std::mem::offset_of!(pptm_launch_out, abort))
                    .store(1, Ordering::Relaxed);
                let recovered = loop {
                    if self.stream.query()? {
                        break true;
                    }
                    if now.elapsed() >= ABORT_GRACE {
                        break false;
                    }
                    std::thread::sleep(POLL_SLEEP);
                };
                // Variant code does not poll `abort`: a kernel that finished with any other status
                // was slow (or waited for the GPU) rather than hung, and its result stands.
                // SAFETY: the stream is idle, so the mapped words are settled; the allocation
                // holds one pptm_launch_out.
                let status = unsafe {
                    std::ptr::read_volatile(self.out.host_ptr().cast::<pptm_launch_out>()).status
                };
                if recovered && status != PPTM_STATUS_ABORTED {
                    tracing::warn!(
                        domain = self.domain,
                        chain,
                        "a launched item showed no progress for {stalled:?} but finished by itself"
                    );
                    return Ok(());
                }
                let hang = Error::Hang {
                    domain: self.domain,
                    variant,
                    seq: self.items,
                    chain,
                    stalled,
                    recovered,
                };
                tracing::error!("{hang}");
                if !recovered {
                    // It may still write any memory it was given.
                    device.wedge();
                    self.wedged = Some((self.items, chain, stalled));
                }
                return Err(hang);
            }
            if now - started < SPIN_FOR {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(POLL_SLEEP);
            }
        }
    }

    /// Waits for everything launched and reads the item's result and device time.
    fn read(&self) -> Result<Completion> {
        self.stream.synchronize()?;
        // SAFETY: the launches finished (stream synchronised), so the mapped words are settled;
        // the allocation holds one pptm_launch_out.
        let out = unsafe { std::ptr::read_volatile(self.out.host_ptr().cast::<pptm_launch_out>()) };
        // SAFETY: both events were recorded on this stream, which has finished.
        let ms = unsafe { result::event::elapsed(self.events[0], self.events[1]) }
            .map_err(|e| Error::driver("cuEventElapsedTime", e))?;
        Ok(Completion {
            status: out.status,
            value: out.value,
            device_ns: Some((f64::from(ms) * 1e6) as u64),
            paths: Some(ProductPaths::from_bits(out.paths)),
        })
    }
}

/// Writes `graph`'s kernel parameters into `exec`, which was instantiated from a graph of the same
/// topology. False when the driver refuses (the caller instantiates instead).
///
/// # Safety
/// Both handles must be valid and `exec` must not be running.
unsafe fn update(exec: sys::CUgraphExec, graph: sys::CUgraph) -> bool {
    let mut info = sys::CUgraphExecUpdateResultInfo {
        result: sys::CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
        errorNode: std::ptr::null_mut(),
        errorFromNode: std::ptr::null_mut(),
    };
    // SAFETY: as the caller vouches; `info` is a valid out-parameter.
    let r = unsafe { sys::cuGraphExecUpdate_v2(exec, graph, &mut info) };
    r == sys::CUresult::CUDA_SUCCESS
        && info.result == sys::CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS
}

impl Drop for Launcher {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        let _ = self.device.bind();
        if inner.wedged.is_some() {
            // A kernel still runs on the stream and may use all of it: leak it (the stream is
            // destroyed, not lent again: driver.rs).
            return;
        }
        let _ = inner.stream.synchronize();
        inner.drop_graphs(&self.module);
        for &event in &inner.events {
            // Idle: the stream, the only place they were recorded, has finished.
            self.device.give_back_event(event);
        }
        self.device.free(inner.state);
        for &(ptr, _) in &inner.scratch {
            if ptr != 0 {
                self.device.free(ptr);
            }
        }
    }
}
