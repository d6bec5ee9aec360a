//! What a user would do without pptm, for benchmarks: launch an (empty) kernel and wait, or
//! replay it as a one-node CUDA graph and wait. Uses the `pptm_empty` kernel that every domain's
//! module carries, on a stream of its own. Create it before the domain's manifold is resident (the
//! module must be loaded first; see `Runtime::prepare`).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::driver::{Module, Stream};

use crate::chain::DomainCode;
use crate::error::{Error, Result};
use crate::runtime::Runtime;

/// An empty kernel, launchable directly or through a captured one-node graph.
pub struct LaunchBaseline {
    stream: Stream,
    func: sys::CUfunction,
    graph: sys::CUgraphExec,
    _module: Arc<Module>,
    device: Arc<super::Device>,
}

// SAFETY: the handles are usable from any thread once the context is bound (every method binds).
unsafe impl Send for LaunchBaseline {}

impl LaunchBaseline {
    /// Loads `code`'s module a second time (independent of any manifold) on `rt`'s GPU.
    pub fn new(rt: &Runtime, code: &'static DomainCode) -> Result<Self> {
        let device = rt
            .gpu_device()
            .ok_or_else(|| Error::NoGpu("the runtime uses the CPU backend".into()))?
            .clone();
        let module = device.module(code)?;
        let func = module.empty;
        let stream = Stream::new(&device)?;
        device.bind()?;
        // SAFETY: the stream is ours; capture records one launch of a parameterless kernel.
        let graph = unsafe {
            result::stream::begin_capture(
                stream.raw,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
            .map_err(|e| Error::driver("cuStreamBeginCapture", e))?;
            let launched =
                result::launch_kernel(func, (1, 1, 1), (32, 1, 1), 0, stream.raw, &mut []);
            let graph = result::stream::end_capture(stream.raw)
                .map_err(|e| Error::driver("cuStreamEndCapture", e))?;
            launched.map_err(|e| Error::driver("cuLaunchKernel (capture)", e))?;
            let exec = result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0));
            let _ = result::graph::destroy(graph);
            exec.map_err(|e| Error::driver("cuGraphInstantiate", e))?
        };
        Ok(LaunchBaseline {
            stream,
            func,
            graph,
            _module: module,
            device,
        })
    }

    /// One empty-kernel launch, then wait for it.
    pub fn launch_and_sync(&self) -> Result<()> {
        self.device.bind()?;
        let mut none: [*mut c_void; 0] = [];
        // SAFETY: pptm_empty takes no parameters.
        unsafe {
            result::launch_kernel(
                self.func,
                (1, 1, 1),
                (32, 1, 1),
                0,
                self.stream.raw,
                &mut none,
            )
        }
        .map_err(|e| Error::driver("cuLaunchKernel", e))?;
        self.stream.synchronize()
    }

    /// One replay of the one-node graph, then wait for it.
    pub fn graph_and_sync(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: graph and stream are valid and ours.
        unsafe { result::graph::launch(self.graph, self.stream.raw) }
            .map_err(|e| Error::driver("cuGraphLaunch", e))?;
        self.stream.synchronize()
    }
}

impl Drop for LaunchBaseline {
    fn drop(&mut self) {
        let _ = self.device.bind();
        let _ = self.stream.synchronize();
        // SAFETY: instantiated in `new`, destroyed once, after its last replay finished.
        let _ = unsafe { result::graph::exec_destroy(self.graph) };
    }
}
