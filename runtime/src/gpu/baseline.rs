//! What a user would do without pptm, for benchmarks: launch an (empty) kernel and wait, or
//! replay it as a one-node CUDA graph and wait; and the floor under any host-visible result, a
//! round trip through mapped memory to one polling GPU thread. Uses the `pptm_empty` and
//! `pptm_echo` kernels that every domain's module carries, on a stream of its own. Create it
//! before the domain's manifold is resident (the module must be loaded first; see
//! `Runtime::prepare`), and measure before a manifold holds the SMs.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys};

use super::driver::{MappedHost, Module, Stream};

use crate::chain::DomainCode;
use crate::error::{Error, Result};
use crate::runtime::Runtime;

/// An empty kernel, launchable directly or through a captured one-node graph.
pub struct LaunchBaseline {
    stream: Stream,
    func: sys::CUfunction,
    graph: sys::CUgraphExec,
    module: Arc<Module>,
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
            module,
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

    /// `reps` round trips through mapped memory after `warmup` unrecorded ones: the host writes a
    /// word, one GPU thread polling it writes it back to another mapped word, the host sees it.
    /// Returns each recorded round trip's duration. Fails rather than hangs when the polling
    /// kernel does not answer within a second (no SM free for it).
    pub fn mapped_round_trips(&self, warmup: usize, reps: usize) -> Result<Vec<Duration>> {
        const LINE: usize = 128;
        let words = MappedHost::new(&self.device, 2 * LINE)?;
        let base = words.host_ptr().cast::<u8>();
        // SAFETY: two 8-byte-aligned words on separate lines of the zeroed allocation, alive until
        // the end of this function; the device accesses them with atomic 8-byte loads and stores.
        let (to_gpu, from_gpu) = unsafe {
            (
                &*base.cast::<AtomicU64>(),
                &*base.add(LINE).cast::<AtomicU64>(),
            )
        };
        let (mut din, mut dout) = (words.dev, words.dev + LINE as u64);
        let mut args: [*mut c_void; 2] = [
            (&mut din as *mut sys::CUdeviceptr).cast(),
            (&mut dout as *mut sys::CUdeviceptr).cast(),
        ];
        self.device.bind()?;
        // SAFETY: pptm_echo takes two pointers to mapped u64 words; both stay allocated until the
        // kernel has been told to stop and the stream synchronised below.
        unsafe {
            result::launch_kernel(
                self.module.echo,
                (1, 1, 1),
                (32, 1, 1),
                0,
                self.stream.raw,
                &mut args,
            )
        }
        .map_err(|e| Error::driver("cuLaunchKernel", e))?;
        let mut times = Vec::with_capacity(reps);
        let mut failed = None;
        for i in 1..=(warmup + reps) as u64 {
            let t = Instant::now();
            to_gpu.store(i, Ordering::Release);
            while from_gpu.load(Ordering::Acquire) != i {
                if t.elapsed() > Duration::from_secs(1) {
                    failed = Some(Error::Timeout(Duration::from_secs(1)));
                    break;
                }
                std::hint::spin_loop();
            }
            if failed.is_some() {
                break;
            }
            if i as usize > warmup {
                times.push(t.elapsed());
            }
        }
        to_gpu.store(u64::MAX, Ordering::Release);
        self.stream.synchronize()?;
        match failed {
            Some(e) => Err(e),
            None => Ok(times),
        }
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
