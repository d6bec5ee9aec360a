//! Executable CUDA graphs for `Variant::UnfusedGraph`, made before any manifold is resident and
//! reused from then on, so that no graph is instantiated or destroyed beside a running manifold.
//!
//! Why: `cuGraphInstantiate` beside a resident manifold can stop inside the driver for good, holding
//! the driver's lock, so every other CUDA call of the process stops behind it. Measured on an H100
//! and an H200 (driver 580) in the linear-algebra tests: with the unfused-graph tests running
//! beside the manifold the test binary hung in 2 to 4 runs of 5; run one test at a time it hung
//! every time at the same test, after a few dozen instantiations had returned; without the graph
//! tests it never hung. Destroying executable graphs before the manifold started made every run
//! hang, and never destroying them beside it did not help. The driver's reasons are not visible; a
//! graph that already exists only needs `cuGraphExecUpdate`, which the same runs did beside the
//! manifold thousands of times without a hang.
//!
//! So each module keeps a pool of executable graphs per node count, filled when the module loads
//! (no manifold can be resident then: see `Device::module`). A launcher takes one, writes its
//! item's launches into it with `cuGraphExecUpdate` (kernel nodes of the same function may change
//! grid and parameters), and gives it back instead of destroying it. New graphs are instantiated
//! only while no manifold is resident.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::driver::{result, sys};

use super::abi::pptm_unfused_params;
use crate::error::{Error, Result};

/// Node counts the pool is filled for at module load: every chain pptm ships has at most 5 stages.
pub(crate) const PREFILLED_STAGES: usize = 5;
/// Graphs made per node count at module load. One: beside a manifold a launcher also reuses its
/// own graphs, and every graph made takes room in the driver's own allocations, whose growth beside
/// a manifold can hang too (a `cuStreamCreate` did, stuck in the same driver code as the
/// instantiations, after four graphs per node count had been made for each of three modules).
pub(crate) const PREFILLED_PER_COUNT: usize = 1;

/// Idle executable graphs of one module's `pptm_unfused_stage`, by node count.
#[derive(Default)]
pub(crate) struct GraphPool {
    free: Mutex<HashMap<usize, Vec<usize>>>,
}

impl GraphPool {
    /// Instantiates `per_count` graphs of 1..=`counts` chained launches of `func` (which takes a
    /// `pptm_unfused_params`). The caller guarantees that no manifold is resident and that the
    /// context is current.
    pub fn prefill(
        &self,
        func: sys::CUfunction,
        smem: u32,
        counts: usize,
        per_count: usize,
    ) -> Result<()> {
        let mut made = Vec::new();
        for stages in 1..=counts {
            for _ in 0..per_count {
                let graph = capture_template(func, smem, stages)?;
                // SAFETY: `graph` is a valid captured graph, destroyed once right after.
                let exec =
                    unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) };
                // SAFETY: as above; the exec keeps what it needs.
                let _ = unsafe { result::graph::destroy(graph) };
                made.push((
                    stages,
                    exec.map_err(|e| Error::driver("cuGraphInstantiate", e))?,
                ));
            }
        }
        for (stages, exec) in made {
            self.give(stages, exec);
        }
        Ok(())
    }

    /// An idle graph of `stages` kernel nodes, if the pool has one.
    pub fn take(&self, stages: usize) -> Option<sys::CUgraphExec> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.get_mut(&stages)?
            .pop()
            .map(|exec| exec as sys::CUgraphExec)
    }

    /// Returns an idle graph of `stages` kernel nodes (nothing may be replaying it).
    pub fn give(&self, stages: usize, exec: sys::CUgraphExec) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.entry(stages).or_default().push(exec as usize);
    }

    /// Destroys every pooled graph. Only while no manifold is resident (the module is unloading).
    pub fn destroy_all(&self) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        for (_, execs) in free.drain() {
            for exec in execs {
                // SAFETY: idle graphs handed to the pool, each destroyed once (drained).
                let _ = unsafe { result::graph::exec_destroy(exec as sys::CUgraphExec) };
            }
        }
    }
}

/// A graph of `stages` chained launches of `func` with zeroed parameters, one block each and `smem`
/// bytes of dynamic shared memory (as every launch of it gets): the
/// shape every unfused item of that many stages has, to be filled in with `cuGraphExecUpdate`.
fn capture_template(func: sys::CUfunction, smem: u32, stages: usize) -> Result<sys::CUgraph> {
    // SAFETY: a stream of our own, captured (nothing runs: capture only records the launches) and
    // destroyed here; the zeroed parameters are a valid pptm_unfused_params (integers and null
    // pointers), copied by the driver into the graph.
    unsafe {
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| Error::driver("cuStreamCreate", e))?;
        let captured = (|| {
            result::stream::begin_capture(
                stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
            .map_err(|e| Error::driver("cuStreamBeginCapture", e))?;
            let mut launched = Ok(());
            for _ in 0..stages {
                let mut params: pptm_unfused_params = std::mem::zeroed();
                let mut args: [*mut c_void; 1] = [(&mut params as *mut pptm_unfused_params).cast()];
                launched = launched.and(
                    result::launch_kernel(
                        func,
                        (1, 1, 1),
                        (pptm_spec::BLOCK_THREADS, 1, 1),
                        smem,
                        stream,
                        &mut args,
                    )
                    .map_err(|e| Error::driver("cuLaunchKernel (capture)", e)),
                );
            }
            let graph = result::stream::end_capture(stream)
                .map_err(|e| Error::driver("cuStreamEndCapture", e))?;
            if let Err(e) = launched {
                let _ = result::graph::destroy(graph);
                return Err(e);
            }
            Ok(graph)
        })();
        let _ = result::stream::destroy(stream);
        captured
    }
}
