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

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys};

use super::abi::{
    PPTM_MAX_BLOCKS, PPTM_MAX_STAGES, pptm_desc, pptm_launch_out, pptm_launch_params,
    pptm_unfused_params,
};
use super::driver::{Device, MappedHost, Module, Stream};
use crate::chain::{Completion, DomainCode};
use crate::error::{Error, Result};

/// Launches items of one domain, one at a time, on a stream of its own.
pub(crate) struct Launcher {
    device: Arc<Device>,
    module: Arc<Module>,
    /// Most blocks one launch uses: what a manifold of the same configuration would have.
    max_blocks: u32,
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
    pub fn new(device: &Arc<Device>, code: &'static DomainCode, max_blocks: u32) -> Result<Self> {
        let module = device.module(code)?;
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
            inner: Mutex::new(Inner {
                domain: code.name,
                stream,
                state,
                out,
                scratch: Vec::new(),
                events,
                graphs: HashMap::new(),
            }),
        })
    }

    /// Runs one item and waits for it.
    pub fn run(&self, desc: &pptm_desc) -> Result<Completion> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
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
        unsafe { inner.launch(self.module.launched, blocks, &mut params) }?;
        inner.record(1)?;
        inner.wait_and_read()
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
    ) -> Result<Completion> {
        if ir.stages.len() > PPTM_MAX_STAGES as usize {
            return Err(Error::BadArguments {
                chain: "unfused",
                reason: format!("more than {PPTM_MAX_STAGES} stages"),
            });
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        self.device.bind()?;
        // Every stage's output buffer, at least as large as this item needs.
        let mut scratch = [std::ptr::null_mut::<f32>(); PPTM_MAX_STAGES as usize];
        for (s, slot) in scratch.iter_mut().enumerate().take(ir.stages.len()) {
            let bytes =
                ir.stage_output_len(s, sizes)
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
        // SAFETY: the previous item's launches finished (its run synchronised the stream), so
        // nothing writes the mapped words now.
        unsafe {
            std::ptr::write_volatile(
                inner.out.host_ptr().cast::<pptm_launch_out>(),
                pptm_launch_out::default(),
            )
        };
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
                unsafe { inner.launch(self.module.unfused, blocks, &mut params) }?;
            }
            Ok(())
        };
        if !graph {
            inner.record(0)?;
            launch_stages(&inner)?;
            inner.record(1)?;
            return inner.wait_and_read();
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
        inner.wait_and_read()
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

    /// Launches `func` with `params` as its only parameter on this launcher's stream.
    ///
    /// # Safety
    /// `P` must be the parameter type `func` declares, and every pointer in it must stay valid
    /// until the launch finishes (the driver copies `params` itself at launch).
    unsafe fn launch<P>(&self, func: sys::CUfunction, blocks: u32, params: &mut P) -> Result<()> {
        let mut args: [*mut c_void; 1] = [(params as *mut P).cast()];
        // SAFETY: the caller vouches for the parameter type and its pointers; the stream is ours.
        unsafe {
            result::launch_kernel(
                func,
                (blocks, 1, 1),
                (pptm_spec::BLOCK_THREADS, 1, 1),
                0,
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

    /// Waits for everything launched and reads the item's result and device time.
    fn wait_and_read(&self) -> Result<Completion> {
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
