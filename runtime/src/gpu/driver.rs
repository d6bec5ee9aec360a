//! The few CUDA driver objects the runtime needs, over cudarc's `result`/`sys` layers.
//!
//! Rules that keep a never-returning kernel from deadlocking the process:
//! * nothing runs on the legacy default stream, and nothing synchronises the whole device or
//!   context: the manifold never finishes, so such a call would never return;
//! * device memory is allocated and freed stream-ordered (`cuMemAllocAsync`/`cuMemFreeAsync`) on
//!   the transfer stream, because a plain `cuMemFree` may wait for every kernel;
//! * copies between host and device go through the device's own pinned staging buffer, never
//!   from pageable memory, whose bounce buffers the driver allocates and releases as it sees fit;
//! * nothing the runtime does on the host needs an SM: memory is zeroed and filled with copies (copy
//!   engines), never with cuMemset (a kernel), because resident manifolds may hold every SM;
//! * modules are loaded once per process and device, before any manifold is resident: with CUDA's
//!   lazy loading, loading code can wait for running kernels, and a manifold never finishes;
//! * pinned host memory is freed only while no manifold is resident: `cuMemFreeHost` waits for
//!   every running kernel. A free that would wait is deferred until the device's last manifold
//!   stops (`Residency`). Measured on an H200 beside a spinning kernel: cuMemFreeHost, cuMemFree,
//!   cuModuleLoadData, cuModuleUnload and cuCtxSetLimit wait for it; cuMemAlloc(Async),
//!   cuMemFreeAsync, cuMemHostAlloc, cuMemHostRegister, graph instantiate/destroy, event and stream
//!   destroy do not (a runtime holding two manifolds hung in cuMemFreeHost when it shut the first
//!   one down). Graph instantiation is the exception that probe missed: it returned at once there,
//!   yet beside a resident manifold it can stop for good inside the driver, so executable graphs
//!   are made only while no manifold is resident and reused after that (graphs.rs). A
//!   `cuStreamCreate` beside resident manifolds once stopped in the same driver code (the driver's
//!   own bookkeeping grows for streams as for graphs), so streams and events are made when the
//!   device opens and lent out (`Spares`), and go back to the device instead of being destroyed;
//! * the context's local memory is sized for every loaded kernel when its module loads, and never
//!   shrinks (`CU_CTX_LMEM_RESIZE_TO_MAX`): growing it for a launch waits for the device to go
//!   idle, which it never does beside a manifold (measured on an H200: the linear-algebra tests,
//!   whose unfused and launched kernels spill, hung with every variant running at once);
//! * every call first makes the device's context current on the calling thread.

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys};

use crate::chain::DomainCode;
use crate::error::{Error, Result};

pub(crate) fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    r.result().map_err(|e| Error::driver(call, e))
}

/// A GPU and its primary context, with one stream for transfers.
pub(crate) struct Device {
    pub ordinal: usize,
    pub name: String,
    pub sm_count: u32,
    pub cc: (i32, i32),
    pub cooperative: bool,
    cu_device: sys::CUdevice,
    ctx: sys::CUcontext,
    /// Serialises transfers; every transfer waits for its own completion.
    transfer: Mutex<Transfer>,
    /// Loaded modules by domain key; unloaded when the device is dropped.
    modules: Mutex<HashMap<&'static str, Arc<Module>>>,
    /// Manifolds of this process that may be running on this device, and the frees that wait for
    /// them. Held across every call that would wait for a running kernel (module load, host free),
    /// so no manifold can be launched in the middle of one.
    residency: Mutex<Residency>,
    /// Notified whenever a counted manifold stops (module loads wait on it for cancelled launches).
    residency_changed: Condvar,
    /// A kernel on this device ignored an abort and may still write any memory it was given:
    /// from then on device memory is leaked instead of freed (see `Manifold::hang`).
    wedged: std::sync::atomic::AtomicBool,
    /// With `PPTM_DEVICE_ARENA_MB`: one block allocated at open, before any manifold, that
    /// buffers are carved from (see arena.rs for why).
    arena: Option<DeviceArena>,
    /// Streams and events made before any manifold, lent out and given back (see the module docs).
    spares: Mutex<Spares>,
    /// Peer access to other devices, by ordinal: enabled (both ways) or not possible. A pair is
    /// tried once, while neither device has a resident manifold (`enable_peer_access`).
    peers: Mutex<HashMap<usize, bool>>,
}

/// Idle streams and events, by handle. Made when the device opens; more are made only while no
/// manifold is resident; destroyed with the device.
#[derive(Default)]
struct Spares {
    streams: Vec<usize>,
    events: Vec<usize>,
}

/// Streams made when a device opens: enough for every manifold and launcher of several runtimes
/// of every domain at once (a test binary holds about 20), each from 4 us to make.
const STREAMS_AT_OPEN: usize = 48;
/// Events made when a device opens: two per launcher.
const EVENTS_AT_OPEN: usize = 64;

/// The transfer stream and its pinned staging buffer. Every copy between host and device goes
/// through the staging buffer rather than straight from the caller's pageable memory: for a
/// pageable copy the driver manages pinned bounce buffers of its own, and releasing pinned memory
/// waits for every running kernel (see the module docs), which a manifold never ends.
struct Transfer {
    stream: sys::CUstream,
    /// STAGING_BYTES of pinned host memory, allocated when the device opens (before any
    /// manifold) and freed with the device.
    staging: *mut c_void,
}

/// How long a module load waits for cancelled launches to end before it gives up.
const CANCELLED_EXIT_WAIT: Duration = Duration::from_secs(2);

/// How long a module load waits for the manifolds of another Runtime on this GPU to park
/// (`Config::park_when_idle`, 100 ms of idleness by default) before it gives up. Two runtimes in
/// one process (a test binary's persistent and launched variants, an application's two
/// libraries) load code while the other may be busy: without the wait, a load that came while
/// the other's manifold was resident failed at once.
const OTHER_RUNTIME_PARK_WAIT: Duration = Duration::from_secs(5);

/// Bytes a transfer moves per staged copy.
const STAGING_BYTES: usize = 4 << 20;
/// The staging buffer is used as two halves, one filled or emptied by the host while the other's
/// copy runs.
const STAGING_HALF: usize = STAGING_BYTES / 2;

#[derive(Default)]
struct Residency {
    manifolds: usize,
    /// Of those, launches given up on (Config::launch_timeout): they exit as soon as they start.
    cancelled: usize,
    /// Pinned host allocations (addresses) dropped while a manifold was resident.
    host_frees: Vec<usize>,
    /// Executable CUDA graphs (handles) dropped while a manifold was resident (graphs.rs).
    graph_frees: Vec<usize>,
    /// Plain (`cuMemAlloc`) device allocations dropped while a manifold was resident.
    plain_frees: Vec<sys::CUdeviceptr>,
}

struct DeviceArena {
    base: sys::CUdeviceptr,
    book: Mutex<super::arena::Arena>,
}

/// One `Device` per GPU per process, shared by every runtime on it (they share the primary
/// context, and must share loaded modules: see the module docs).
static DEVICES: Mutex<Vec<(usize, Weak<Device>)>> = Mutex::new(Vec::new());

// SAFETY: CUcontext and CUstream are handles the driver lets any thread use once the context is
// current on it (`bind` does that before every call); the stream is only used under its mutex.
unsafe impl Send for Device {}
// SAFETY: as above; no method hands out the raw handles.
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Device({} #{}: {}, sm_{}{}, {} SMs)",
            self.name, self.ordinal, self.cc.0, self.cc.0, self.cc.1, self.sm_count
        )
    }
}

impl Device {
    /// Opens GPU `ordinal`. No driver library, no device, or a device older than compute
    /// capability 8.0 is [`Error::NoGpu`], never a panic.
    pub fn open(ordinal: usize) -> Result<Arc<Device>> {
        let mut devices = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = devices
            .iter()
            .find(|(o, _)| *o == ordinal)
            .and_then(|(_, w)| w.upgrade())
        {
            d.bind()?;
            return Ok(d);
        }
        let d = Self::open_new(ordinal)?;
        devices.retain(|(o, w)| *o != ordinal && w.strong_count() > 0);
        devices.push((ordinal, Arc::downgrade(&d)));
        Ok(d)
    }

    /// How many GPUs the driver shows this process (`CUDA_VISIBLE_DEVICES` applies). No driver
    /// library or no device is [`Error::NoGpu`]; a driver that fails to start is
    /// [`Error::Driver`].
    pub fn count() -> Result<usize> {
        // SAFETY: probes for the driver library without calling into it.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::NoGpu(
                "the CUDA driver library (libcuda.so) is not installed".into(),
            ));
        }
        result::init().map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE {
                Error::NoGpu(format!(
                    "cuInit found no device: {}",
                    Error::driver("cuInit", e)
                ))
            } else {
                Error::driver("cuInit", e)
            }
        })?;
        let count =
            result::device::get_count().map_err(|e| Error::driver("cuDeviceGetCount", e))?;
        if count <= 0 {
            return Err(Error::NoGpu("the CUDA driver reports no device".into()));
        }
        Ok(count as usize)
    }

    fn open_new(ordinal: usize) -> Result<Arc<Device>> {
        // No device at all (none installed, or CUDA_VISIBLE_DEVICES hides them all) is "no GPU";
        // any other failure of cuInit is a driver that is there but broken, and says so: a test
        // suite must not mistake it for an absent GPU and skip.
        let count = Self::count()?;
        if ordinal >= count {
            return Err(Error::NoGpu(format!(
                "device {ordinal} requested but only {count} present"
            )));
        }
        let cu_device =
            result::device::get(ordinal as i32).map_err(|e| Error::driver("cuDeviceGet", e))?;
        let attr = |a: sys::CUdevice_attribute, call| -> Result<i32> {
            // SAFETY: cu_device is a valid device handle.
            unsafe { result::device::get_attribute(cu_device, a) }
                .map_err(|e| Error::driver(call, e))
        };
        use sys::CUdevice_attribute::*;
        let cc = (
            attr(
                CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                "cuDeviceGetAttribute",
            )?,
            attr(
                CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                "cuDeviceGetAttribute",
            )?,
        );
        let sm_count = attr(
            CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            "cuDeviceGetAttribute",
        )? as u32;
        let cooperative = attr(
            CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH,
            "cuDeviceGetAttribute",
        )? != 0;
        let name =
            result::device::get_name(cu_device).map_err(|e| Error::driver("cuDeviceGetName", e))?;
        if cc.0 < 8 {
            return Err(Error::NoGpu(format!(
                "{name} has compute capability {}.{}; pptm needs 8.0 or newer",
                cc.0, cc.1
            )));
        }
        // SAFETY: cu_device is valid; the retained context is released in Drop.
        let ctx = unsafe { result::primary_ctx::retain(cu_device) }
            .map_err(|e| Error::driver("cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: ctx was just retained.
        unsafe { result::ctx::set_current(ctx) }
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        // Local memory only grows (see the module docs). Best effort: without it `module` still
        // reserves what every kernel needs, and the driver would only shrink to that.
        // SAFETY: sets a flag of the current context; no work has been submitted yet.
        let flag = sys::CUctx_flags::CU_CTX_LMEM_RESIZE_TO_MAX as u32;
        if let Err(e) = check("cuCtxSetFlags", unsafe { sys::cuCtxSetFlags(flag) }) {
            tracing::warn!("local memory may shrink between launches: {e}");
        }
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| Error::driver("cuStreamCreate", e))?;
        // SAFETY: allocates pinned host memory in the current context; freed in Drop.
        let staging = match unsafe { result::malloc_host(STAGING_BYTES, 0) } {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: created above and unused.
                let _ = unsafe { result::stream::destroy(stream) };
                return Err(Error::driver("cuMemHostAlloc", e));
            }
        };
        let transfer = Transfer { stream, staging };
        let arena = super::arena::requested_bytes().and_then(|bytes| {
            // SAFETY: the context is current; freed in Drop. No kernel of ours runs yet.
            match unsafe { result::malloc_sync(bytes as usize) } {
                Ok(base) => {
                    tracing::info!("device arena: {} MiB at {base:#x}", bytes >> 20);
                    Some(DeviceArena {
                        base,
                        book: Mutex::new(super::arena::Arena::new(bytes)),
                    })
                }
                Err(e) => {
                    tracing::warn!(
                        "PPTM_DEVICE_ARENA_MB: could not allocate {} MiB ({e}); no arena",
                        bytes >> 20
                    );
                    None
                }
            }
        });
        let device = Device {
            ordinal,
            name,
            sm_count,
            cc,
            cooperative,
            cu_device,
            ctx,
            transfer: Mutex::new(transfer),
            modules: Mutex::new(HashMap::new()),
            residency: Mutex::new(Residency::default()),
            residency_changed: Condvar::new(),
            wedged: std::sync::atomic::AtomicBool::new(false),
            arena,
            spares: Mutex::new(Spares::default()),
            peers: Mutex::new(HashMap::new()),
        };
        // No manifold can be resident on a device that is only now opening.
        {
            let mut spares = device.spares.lock().unwrap_or_else(|e| e.into_inner());
            for _ in 0..STREAMS_AT_OPEN {
                spares.streams.push(create_stream()? as usize);
            }
            for _ in 0..EVENTS_AT_OPEN {
                spares.events.push(create_event()? as usize);
            }
        }
        Ok(Arc::new(device))
    }

    /// A stream from the spares; a new one only while no manifold is resident (making one beside
    /// a manifold can hang the driver: see the module docs). Give it back with `give_back_stream`.
    fn take_stream(&self) -> Result<sys::CUstream> {
        self.take_spare(
            "streams",
            STREAMS_AT_OPEN,
            |s| &mut s.streams,
            || create_stream().map(|s| s as usize),
        )
        .map(|s| s as sys::CUstream)
    }

    fn give_back_stream(&self, stream: sys::CUstream) {
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        spares.streams.push(stream as usize);
    }

    /// An event from the spares, like `take_stream`. Give it back with `give_back_event`.
    pub fn take_event(&self) -> Result<sys::CUevent> {
        self.take_spare(
            "events",
            EVENTS_AT_OPEN,
            |s| &mut s.events,
            || create_event().map(|e| e as usize),
        )
        .map(|e| e as sys::CUevent)
    }

    /// Returns an event from `take_event`, idle (no record of it pending).
    pub fn give_back_event(&self, event: sys::CUevent) {
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        spares.events.push(event as usize);
    }

    fn take_spare(
        &self,
        what: &'static str,
        at_open: usize,
        pool: impl Fn(&mut Spares) -> &mut Vec<usize>,
        create: impl FnOnce() -> Result<usize>,
    ) -> Result<usize> {
        if let Some(h) = pool(&mut self.spares.lock().unwrap_or_else(|e| e.into_inner())).pop() {
            return Ok(h);
        }
        // Held through the creation, so no manifold starts meanwhile.
        let residency = self.residency.lock().unwrap_or_else(|e| e.into_inner());
        if residency.manifolds > 0 {
            return Err(Error::DriverObjectsUnavailable {
                what,
                made: at_open,
            });
        }
        self.bind()?;
        let h = create()?;
        drop(residency);
        Ok(h)
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: ctx stays retained for the life of `self`.
        unsafe { result::ctx::set_current(self.ctx) }
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))
    }

    /// The loaded module of `code`'s domain: loaded on first use, eagerly, and kept until the
    /// device is dropped. Refused while a manifold may be running (the load could wait for it).
    pub fn module(&self, code: &'static DomainCode) -> Result<Arc<Module>> {
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = modules.get(code.key) {
            return Ok(m.clone());
        }
        // Held through the load: a manifold launched meanwhile would make the load wait for it.
        let mut residency = self.residency.lock().unwrap_or_else(|e| e.into_inner());
        // Launches given up on end by themselves once the kernels in their way have (a runtime
        // dropped just before this one was made, say): give them a moment. Another runtime's
        // manifolds park once it is idle: give them longer.
        let started = Instant::now();
        while residency.manifolds > 0 {
            let patience = if residency.manifolds == residency.cancelled {
                CANCELLED_EXIT_WAIT
            } else {
                OTHER_RUNTIME_PARK_WAIT
            };
            let Some(left) = (started + patience).checked_duration_since(Instant::now()) else {
                break;
            };
            residency = self
                .residency_changed
                .wait_timeout(residency, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if residency.manifolds > 0 {
            let cancelled = if residency.cancelled > 0 {
                format!(
                    "; {} of them a cancelled launch still waiting for the GPU",
                    residency.cancelled
                )
            } else {
                String::new()
            };
            return Err(Error::Launch {
                domain: code.name,
                reason: format!(
                    "its code cannot be loaded while a manifold is resident on this GPU ({} resident{cancelled}; \
                     the load would wait for the running kernel, which never finishes). A runtime drains its own \
                     manifolds before it loads code, so these belong to another Runtime on this GPU, which did \
                     not park within {:?} (Config::park_when_idle): use one Runtime per GPU (every domain starts \
                     on demand), or let the other park or drop it first",
                    residency.manifolds,
                    started.elapsed()
                ),
            });
        }
        let (arch, ptx) = match self.cc {
            (9, 0) => ("compute_90a", code.ptx_compute_90a),
            (major, _) if major >= 9 => ("compute_90", code.ptx_compute_90),
            _ => ("compute_80", code.ptx_compute_80),
        };
        let mut m = Module::load_ptx(self, ptx, code.name, arch)?;
        // Only a module that declares the templates is asked for them: a failed lookup is an API
        // error compute-sanitizer's memcheck counts (CUDA_ERROR_NOT_FOUND).
        let wgmma = if ptx.contains("pptm_tmap_template") {
            m.prepare_wgmma(self)
        } else {
            Ok(0)
        };
        match wgmma {
            Ok(smem) => m.dynamic_smem = smem,
            Err(e) => {
                // SAFETY: loaded above and not handed out.
                let _ = unsafe { result::module::unload(m.module) };
                return Err(e);
            }
        }
        let m = Arc::new(m);
        self.reserve_local_memory(&m)?;
        // No manifold is resident (checked above, lock held): the one time graphs can be made
        // safely (graphs.rs).
        let prefill = Instant::now();
        m.graphs.prefill(
            m.unfused,
            m.dynamic_smem,
            super::graphs::PREFILLED_STAGES,
            super::graphs::PREFILLED_PER_COUNT,
        )?;
        tracing::debug!(
            domain = code.name,
            us = prefill.elapsed().as_micros() as u64,
            "executable graphs made for the unfused-graph variant"
        );
        modules.insert(code.key, m.clone());
        Ok(m)
    }

    /// Raises the context's per-thread stack limit to the largest local memory any of `m`'s
    /// kernels uses, so no later launch has to grow local memory (which waits for an idle device:
    /// see the module docs). Called while no manifold is resident.
    fn reserve_local_memory(&self, m: &Module) -> Result<()> {
        let mut need = 0usize;
        for f in [m.manifold, m.empty, m.launched, m.unfused, m.echo] {
            // SAFETY: f is a loaded function of a live module.
            let bytes = unsafe {
                result::function::get_function_attribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                )
            }
            .map_err(|e| Error::driver("cuFuncGetAttribute", e))?;
            need = need.max(bytes.max(0) as usize);
        }
        let mut have = 0usize;
        // SAFETY: the context is current (bind); `have` is written by the call.
        check("cuCtxGetLimit", unsafe {
            sys::cuCtxGetLimit(&mut have, sys::CUlimit::CU_LIMIT_STACK_SIZE)
        })?;
        if need > have {
            // SAFETY: no manifold is resident (the caller checked), so nothing waits on this.
            check("cuCtxSetLimit", unsafe {
                sys::cuCtxSetLimit(sys::CUlimit::CU_LIMIT_STACK_SIZE, need.next_multiple_of(16))
            })?;
            tracing::debug!("per-thread local memory reserved: {have} -> {need} bytes");
        }
        Ok(())
    }

    /// Counts a manifold about to be launched, which may run from now on: `module` refuses to
    /// load and host frees are deferred until every counted manifold has stopped. The caller
    /// calls `manifold_stopped` once the kernel is known to have ended (or its launch failed); a
    /// kernel that may never end stays counted.
    pub fn manifold_started(&self) {
        self.residency
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .manifolds += 1;
    }

    /// A counted manifold whose launch was given up on: it exits as soon as it starts, and a
    /// module load waits a moment for it (`module`). Its reaper calls `manifold_stopped(true)`.
    pub fn manifold_cancelled(&self) {
        self.residency
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .cancelled += 1;
    }

    /// The counterpart of `manifold_started` (`cancelled`: of a launch `manifold_cancelled`
    /// counted). The last manifold to stop frees the pinned host memory whose free was deferred
    /// while it ran.
    pub fn manifold_stopped(&self, cancelled: bool) {
        let mut residency = self.residency.lock().unwrap_or_else(|e| e.into_inner());
        residency.manifolds = residency.manifolds.saturating_sub(1);
        if cancelled {
            residency.cancelled = residency.cancelled.saturating_sub(1);
        }
        self.residency_changed.notify_all();
        if residency.manifolds == 0 && !residency.graph_frees.is_empty() {
            let _ = self.bind();
            for exec in std::mem::take(&mut residency.graph_frees) {
                // SAFETY: an idle executable graph given to `destroy_graph_later`, destroyed
                // once; no manifold runs, and none can start while the lock is held.
                let _ = unsafe { result::graph::exec_destroy(exec as sys::CUgraphExec) };
            }
        }
        if residency.manifolds == 0 && !residency.plain_frees.is_empty() {
            let _ = self.bind();
            for ptr in std::mem::take(&mut residency.plain_frees) {
                // SAFETY: from `alloc_plain`, dropped, freed once; no manifold runs, and none can
                // start while the lock is held.
                let _ = unsafe { result::free_sync(ptr) };
            }
        }
        if residency.manifolds == 0 && !residency.host_frees.is_empty() {
            let frees = std::mem::take(&mut residency.host_frees);
            tracing::debug!(count = frees.len(), "freeing deferred pinned host memory");
            let _ = self.bind();
            for host in frees {
                // SAFETY: allocated by cuMemHostAlloc (MappedHost::new), dropped (so unused by the
                // host), its kernel gone, and no manifold runs (the lock keeps one from starting).
                let _ = unsafe { result::free_host(host as *mut c_void) };
            }
        }
    }

    /// `bytes` of page-locked host memory, pinned for every context (portable), for copies
    /// straight to and from device memory (`download_direct`, `upload_direct`). Free it with
    /// `free_pinned`. (`cuMemHostAlloc` runs beside resident manifolds; see the module docs.)
    pub fn alloc_pinned(&self, bytes: usize) -> Result<*mut c_void> {
        self.bind()?;
        // SAFETY: allocates `bytes` of pinned memory; the caller frees it with free_pinned.
        unsafe { result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(|e| Error::driver("cuMemHostAlloc", e))
    }

    /// Frees memory from `alloc_pinned`, now or when the last resident manifold stops.
    pub fn free_pinned(&self, host: *mut c_void) {
        if self.wedged.load(Ordering::Acquire) {
            return;
        }
        self.free_host(host);
    }

    /// Frees pinned host memory now, or when the last resident manifold stops (cuMemFreeHost
    /// waits for every running kernel, and a manifold runs until it is shut down).
    fn free_host(&self, host: *mut c_void) {
        let mut residency = self.residency.lock().unwrap_or_else(|e| e.into_inner());
        if residency.manifolds > 0 {
            residency.host_frees.push(host as usize);
            return;
        }
        let _ = self.bind();
        // SAFETY: allocated by cuMemHostAlloc, no longer used (the caller's promise), freed once;
        // no manifold runs, and none can start while the lock is held.
        let _ = unsafe { result::free_host(host) };
    }

    /// Destroys an idle executable graph now, or when the last resident manifold stops: graphs
    /// are neither made nor destroyed beside a manifold (graphs.rs).
    pub fn destroy_graph_later(&self, exec: sys::CUgraphExec) {
        let mut residency = self.residency.lock().unwrap_or_else(|e| e.into_inner());
        if residency.manifolds > 0 {
            residency.graph_frees.push(exec as usize);
            return;
        }
        let _ = self.bind();
        // SAFETY: the caller hands over an idle executable graph, destroyed once; no manifold
        // runs, and none can start while the lock is held.
        let _ = unsafe { result::graph::exec_destroy(exec) };
    }

    /// Instantiates `graph` if no manifold is resident on this device (held off until it returns);
    /// `Ok(None)` otherwise: beside a resident manifold instantiation can hang (graphs.rs).
    pub fn instantiate_unless_resident(
        &self,
        graph: sys::CUgraph,
    ) -> Result<Option<sys::CUgraphExec>> {
        let residency = self.residency.lock().unwrap_or_else(|e| e.into_inner());
        if residency.manifolds > 0 {
            return Ok(None);
        }
        self.bind()?;
        // SAFETY: `graph` is a valid graph; no manifold can start while `residency` is held.
        let exec = unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }
            .map_err(|e| Error::driver("cuGraphInstantiate", e))?;
        drop(residency);
        Ok(Some(exec))
    }

    fn with_transfer<T>(&self, f: impl FnOnce(&Transfer) -> Result<T>) -> Result<T> {
        self.bind()?;
        let transfer = self.transfer.lock().unwrap_or_else(|p| p.into_inner());
        let out = f(&transfer)?;
        // SAFETY: the stream is valid and owned by self.
        unsafe { result::stream::synchronize(transfer.stream) }
            .map_err(|e| Error::driver("cuStreamSynchronize", e))?;
        Ok(out)
    }

    /// Allocates `bytes` of device memory (stream-ordered), every 32-bit word set to `fill`.
    pub fn alloc(&self, bytes: usize, fill: u32) -> Result<sys::CUdeviceptr> {
        let carved = self.arena.as_ref().and_then(|a| {
            let mut book = a.book.lock().unwrap_or_else(|p| p.into_inner());
            let at = book.alloc(bytes as u64);
            if at.is_none() {
                tracing::warn!(
                    "device arena cannot hold {bytes} more bytes ({} of {} in use): using the \
                     stream-ordered allocator, which a sanitizer cannot see from a resident manifold",
                    book.in_use(),
                    book.size()
                );
            }
            at.map(|at| a.base + at)
        });
        let ptr = match carved {
            Some(ptr) => ptr,
            None => self.alloc_stream_ordered(bytes)?,
        };
        if let Err(e) = self.fill(ptr, bytes, fill) {
            self.free(ptr);
            return Err(e);
        }
        Ok(ptr)
    }

    fn alloc_stream_ordered(&self, bytes: usize) -> Result<sys::CUdeviceptr> {
        self.with_transfer(|t| {
            // SAFETY: the stream is a valid stream of the current context.
            unsafe { result::malloc_async(t.stream, bytes) }
                .map_err(|e| Error::driver("cuMemAllocAsync", e))
        })
    }

    /// Allocates `bytes` of zeroed device memory with plain `cuMemAlloc` (which runs beside
    /// resident manifolds), for memory that stream memory operations (`cuStreamWriteValue64`,
    /// `cuStreamWaitValue64`) use: on an H200 they refused stream-ordered (pool) memory with
    /// CUDA_ERROR_INVALID_VALUE. Free it with `free_plain`.
    pub fn alloc_plain(&self, bytes: usize) -> Result<sys::CUdeviceptr> {
        self.bind()?;
        // SAFETY: allocates `bytes`; freed by free_plain.
        let ptr =
            unsafe { result::malloc_sync(bytes) }.map_err(|e| Error::driver("cuMemAlloc", e))?;
        if let Err(e) = self.fill(ptr, bytes, 0) {
            self.free_plain(ptr);
            return Err(e);
        }
        Ok(ptr)
    }

    /// Frees memory from `alloc_plain` now, or when the last resident manifold stops (`cuMemFree`
    /// waits for every running kernel). Never on a wedged device.
    pub fn free_plain(&self, ptr: sys::CUdeviceptr) {
        if self.wedged.load(Ordering::Acquire) {
            return;
        }
        let mut residency = self.residency.lock().unwrap_or_else(|e| e.into_inner());
        if residency.manifolds > 0 {
            residency.plain_frees.push(ptr);
            return;
        }
        let _ = self.bind();
        // SAFETY: from alloc_plain, no longer used (the caller's promise), freed once; no manifold
        // runs, and none can start while the lock is held.
        let _ = unsafe { result::free_sync(ptr) };
    }

    /// Sets every 32-bit word of the `bytes` bytes at `ptr` to `fill`, with host-to-device copies
    /// of a pattern buffer (copy engines only; see the module docs).
    pub fn fill(&self, ptr: sys::CUdeviceptr, bytes: usize, fill: u32) -> Result<()> {
        const CHUNK: usize = 4 << 20;
        let pattern: Vec<u8> = fill
            .to_ne_bytes()
            .iter()
            .copied()
            .cycle()
            .take(CHUNK.min(bytes))
            .collect();
        let mut done = 0;
        while done < bytes {
            let n = CHUNK.min(bytes - done);
            self.upload(ptr + done as u64, &pattern[..n])?;
            done += n;
        }
        Ok(())
    }

    /// Manifolds resident on this GPU, of every runtime in the process.
    pub fn resident_manifolds(&self) -> usize {
        self.residency
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .manifolds
    }

    /// The device's primary context, which pptm runs in.
    pub fn context(&self) -> sys::CUcontext {
        self.ctx
    }

    /// Checks that `stream` belongs to this device's primary context (the null stream is the
    /// legacy stream of whichever context is current: this one, once bound).
    ///
    /// # Safety
    /// `stream` is null or a stream handle that has not been destroyed.
    pub unsafe fn check_stream(&self, stream: sys::CUstream) -> Result<()> {
        self.bind()?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the caller's promise; ctx is written by the call.
        let r = unsafe { sys::cuStreamGetCtx(stream, &mut ctx) };
        if let Err(e) = check("cuStreamGetCtx", r) {
            return Err(Error::ForeignStream {
                reason: e.to_string(),
            });
        }
        if ctx != self.ctx {
            return Err(Error::ForeignStream {
                reason: format!(
                    "the stream belongs to another CUDA context than pptm's (the primary context of GPU {})",
                    self.ordinal
                ),
            });
        }
        Ok(())
    }

    /// Checks that `bytes` bytes at `ptr` are device memory of this device's context, inside one
    /// allocation (the driver's pointer attributes), before pptm uses memory it did not allocate.
    pub fn check_foreign(
        &self,
        ptr: sys::CUdeviceptr,
        bytes: usize,
    ) -> std::result::Result<(), String> {
        use sys::CUpointer_attribute as A;
        self.bind().map_err(|e| e.to_string())?;
        let attr = |what: A, out: *mut std::ffi::c_void| {
            // SAFETY: `out` points to a value of the type the attribute writes (a CUcontext, a
            // u32 memory type, a CUdeviceptr or a usize); the driver checks `ptr` itself.
            let r = unsafe { sys::cuPointerGetAttribute(out, what, ptr) };
            if r == sys::CUresult::CUDA_SUCCESS {
                Ok(())
            } else {
                Err(format!(
                    "{ptr:#x} is not memory the CUDA driver knows ({r:?} for {what:?})"
                ))
            }
        };
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        attr(A::CU_POINTER_ATTRIBUTE_CONTEXT, (&raw mut ctx).cast())?;
        let mut kind = 0u32;
        attr(A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (&raw mut kind).cast())?;
        let mut start: sys::CUdeviceptr = 0;
        attr(
            A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            (&raw mut start).cast(),
        )?;
        let mut size = 0usize;
        attr(A::CU_POINTER_ATTRIBUTE_RANGE_SIZE, (&raw mut size).cast())?;
        if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return Err(format!(
                "{ptr:#x} is not device memory (memory type {kind})"
            ));
        }
        if !ctx.is_null() && ctx != self.ctx {
            return Err(format!(
                "{ptr:#x} belongs to another CUDA context than pptm's (the primary context of device {}); \
                 allocate it in the primary context (cudarc's CudaContext::new, the CUDA runtime API)",
                self.ordinal
            ));
        }
        let end = ptr.checked_add(bytes as u64).ok_or("the range overflows")?;
        if end > start + size as u64 {
            return Err(format!(
                "{bytes} bytes at {ptr:#x} run past the end of its allocation ({size} bytes at {start:#x})"
            ));
        }
        Ok(())
    }

    /// A kernel ignored an abort: never free device memory again in this process.
    pub fn wedge(&self) {
        self.wedged.store(true, Ordering::Release);
    }

    /// Frees device memory from `alloc` (stream-ordered: never waits for the manifold).
    pub fn free(&self, ptr: sys::CUdeviceptr) {
        if self.wedged.load(Ordering::Acquire) {
            return; // a wedged kernel may still write it
        }
        if let Some(a) = &self.arena
            && ptr >= a.base
        {
            let mut book = a.book.lock().unwrap_or_else(|p| p.into_inner());
            // Every earlier use of the memory has finished: the transfer stream synchronises
            // each copy, and kernels' users wait for their items before a buffer can drop.
            if book.free(ptr - a.base) {
                return;
            }
        }
        let r = self.bind().and_then(|_| {
            let transfer = self.transfer.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: ptr came from `alloc` and is freed once; later users of this memory are
            // ordered after the free on the same stream.
            unsafe { result::free_async(ptr, transfer.stream) }
                .map_err(|e| Error::driver("cuMemFreeAsync", e))
        });
        if let Err(e) = r {
            tracing::warn!("leaking device memory: {e}");
        }
    }

    /// Copies host bytes to device memory through the staging buffer and waits for the copy.
    /// The staging buffer's two halves alternate: the host fills one while the other's copy
    /// runs, so the host's memcpy and the DMA overlap.
    pub fn upload(&self, dst: sys::CUdeviceptr, src: &[u8]) -> Result<()> {
        self.with_transfer(|t| {
            for (i, chunk) in src.chunks(STAGING_HALF).enumerate() {
                let slot = t.half(i);
                // SAFETY: a half holds STAGING_HALF >= chunk.len() bytes, and no copy from this
                // one is in flight: the copy of chunk i - 2, its last user, was waited for
                // before chunk i - 1's was queued.
                unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), slot, chunk.len()) };
                t.wait()?; // chunk i - 1's copy, the only one in flight
                let at = dst + (i * STAGING_HALF) as u64;
                // SAFETY: the caller's buffer has src.len() bytes from dst, so chunk.len() from
                // `at`; the half is pinned, outlives the copy and is not written until the copy
                // has been waited for (the next iteration's wait).
                check("cuMemcpyHtoDAsync", unsafe {
                    sys::cuMemcpyHtoDAsync_v2(at, slot.cast(), chunk.len(), t.stream)
                })?;
            }
            t.wait()
        })
    }

    /// Copies device memory to host bytes through the staging buffer and waits for the copy.
    /// As in `upload`, the halves alternate: the host copies one out while the next chunk's DMA
    /// fills the other.
    pub fn download(&self, dst: &mut [u8], src: sys::CUdeviceptr) -> Result<()> {
        let queue = |t: &Transfer, i: usize, len: usize| {
            let at = src + (i * STAGING_HALF) as u64;
            // SAFETY: the caller's buffer has dst.len() bytes from src, so `len` (chunk i's
            // length) from `at`; the half holds STAGING_HALF >= len bytes, and the host is done
            // reading it (chunk i - 2 was copied out before this is queued).
            check("cuMemcpyDtoHAsync", unsafe {
                sys::cuMemcpyDtoHAsync_v2(t.half(i).cast(), at, len, t.stream)
            })
        };
        self.with_transfer(|t| {
            let total = dst.len();
            let len_of = |i: usize| (total - i * STAGING_HALF).min(STAGING_HALF);
            let chunks = total.div_ceil(STAGING_HALF);
            if chunks > 0 {
                queue(t, 0, len_of(0))?;
            }
            for (i, chunk) in dst.chunks_mut(STAGING_HALF).enumerate() {
                t.wait()?; // chunk i's copy, the only one in flight
                if i + 1 < chunks {
                    queue(t, i + 1, len_of(i + 1))?;
                }
                // SAFETY: chunk i's copy into its half has completed (waited above); the copy
                // queued since writes the other half.
                unsafe {
                    std::ptr::copy_nonoverlapping(t.half(i), chunk.as_mut_ptr(), chunk.len())
                };
            }
            Ok(())
        })
    }
}

impl Device {
    /// Copies device memory straight into `dst`, which must be pinned host memory
    /// (`alloc_pinned`): one DMA transfer on the transfer stream, waited for.
    pub fn download_direct(&self, dst: &mut [u8], src: sys::CUdeviceptr) -> Result<()> {
        self.with_transfer(|t| {
            // SAFETY: the caller's device buffer has dst.len() bytes from src; dst is borrowed
            // mutably until the copy, waited for below, completes.
            check("cuMemcpyDtoHAsync", unsafe {
                sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, dst.len(), t.stream)
            })?;
            t.wait()
        })
    }

    /// Copies `src`, which must be pinned host memory (`alloc_pinned`), straight to device
    /// memory: one DMA transfer on the transfer stream, waited for.
    pub fn upload_direct(&self, dst: sys::CUdeviceptr, src: &[u8]) -> Result<()> {
        self.with_transfer(|t| {
            // SAFETY: the caller's device buffer has src.len() bytes from dst; src is borrowed
            // until the copy, waited for below, completes.
            check("cuMemcpyHtoDAsync", unsafe {
                sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), t.stream)
            })?;
            t.wait()
        })
    }

    /// Copies `bytes` from `src` to `dst`, both on this device (a copy engine), waited for.
    pub fn copy_within(
        &self,
        dst: sys::CUdeviceptr,
        src: sys::CUdeviceptr,
        bytes: usize,
    ) -> Result<()> {
        self.with_transfer(|t| {
            // SAFETY: the caller's buffers have `bytes` bytes at dst and src, on this device, and
            // neither is used by anything else until the copy, waited for below, completes.
            check("cuMemcpyDtoDAsync", unsafe {
                sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, t.stream)
            })?;
            t.wait()
        })
    }

    /// Copies `bytes` from `src` on device `from` to `dst` on this one, waited for: straight
    /// between the GPUs where peer access is enabled (tried once per pair, see
    /// `enable_peer_access`), otherwise staged by the driver through host memory. Returns
    /// whether the pair has peer access.
    pub fn copy_from_peer(
        &self,
        dst: sys::CUdeviceptr,
        from: &Device,
        src: sys::CUdeviceptr,
        bytes: usize,
    ) -> Result<bool> {
        let peer = self.enable_peer_access(from);
        self.with_transfer(|t| {
            // SAFETY: the caller's buffers have `bytes` bytes at dst (this device) and src
            // (`from`), and neither is used by anything else until the copy, waited for below,
            // completes; both contexts are primary contexts that live as long as their devices.
            check("cuMemcpyPeerAsync", unsafe {
                sys::cuMemcpyPeerAsync(dst, self.ctx, src, from.ctx, bytes, t.stream)
            })?;
            t.wait()
        })?;
        Ok(peer)
    }

    /// Enables peer access between this device and `other`, both ways, if the hardware allows
    /// it and neither device has a resident manifold (whether `cuCtxEnablePeerAccess` waits for
    /// running kernels is not known; it is not risked beside a manifold that never ends). Tried
    /// once a pair, except that a pair found busy is tried again next time. Returns whether
    /// access is enabled.
    pub fn enable_peer_access(&self, other: &Device) -> bool {
        if self.ordinal == other.ordinal {
            return true;
        }
        if let Some(&known) = self
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&other.ordinal)
        {
            return known;
        }
        // Both residency locks, lower ordinal first, keep manifolds from starting meanwhile.
        let (first, second) = if self.ordinal < other.ordinal {
            (self, other)
        } else {
            (other, self)
        };
        let r1 = first.residency.lock().unwrap_or_else(|e| e.into_inner());
        let r2 = second.residency.lock().unwrap_or_else(|e| e.into_inner());
        if r1.manifolds > 0 || r2.manifolds > 0 {
            return false;
        }
        let can = |a: &Device, b: &Device| {
            let mut can: std::ffi::c_int = 0;
            // SAFETY: writes one integer; both handles are valid devices.
            let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.cu_device, b.cu_device) };
            r == sys::CUresult::CUDA_SUCCESS && can != 0
        };
        let enable = |a: &Device, b: &Device| {
            if a.bind().is_err() {
                return false;
            }
            // SAFETY: b's context is a live primary context; a's is current on this thread.
            let r = unsafe { sys::cuCtxEnablePeerAccess(b.ctx, 0) };
            matches!(
                r,
                sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
            )
        };
        let enabled =
            can(self, other) && can(other, self) && enable(self, other) && enable(other, self);
        drop((r2, r1));
        self.peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(other.ordinal, enabled);
        other
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.ordinal, enabled);
        tracing::debug!(
            "peer access between GPUs {} and {}: {}",
            self.ordinal,
            other.ordinal,
            if enabled { "enabled" } else { "not available" }
        );
        enabled
    }

    /// Free and total bytes of the device's memory, as the driver counts them.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two integers; a query that launches nothing.
        check("cuMemGetInfo", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free, total))
    }
}

fn create_stream() -> Result<sys::CUstream> {
    result::stream::create(result::stream::StreamKind::NonBlocking)
        .map_err(|e| Error::driver("cuStreamCreate", e))
}

fn create_event() -> Result<sys::CUevent> {
    result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
        .map_err(|e| Error::driver("cuEventCreate", e))
}

impl Transfer {
    /// The half of the staging buffer that chunk `i` of a transfer goes through.
    fn half(&self, i: usize) -> *mut u8 {
        // SAFETY: staging holds 2 STAGING_HALF bytes, so either half's start is inside it.
        unsafe { self.staging.cast::<u8>().add((i % 2) * STAGING_HALF) }
    }

    /// Waits for the copies queued on the transfer stream.
    fn wait(&self) -> Result<()> {
        // SAFETY: the stream is valid and owned by the device.
        unsafe { result::stream::synchronize(self.stream) }
            .map_err(|e| Error::driver("cuStreamSynchronize", e))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let _ = self.bind();
        let wedged = self.wedged.load(Ordering::Acquire);
        if let Ok(residency) = self.residency.get_mut()
            && !wedged
        {
            for exec in residency.graph_frees.drain(..) {
                // SAFETY: deferred destroys of idle executable graphs; no manifold runs.
                let _ = unsafe { result::graph::exec_destroy(exec as sys::CUgraphExec) };
            }
            for host in residency.host_frees.drain(..) {
                // SAFETY: deferred frees of dropped MappedHosts; every kernel that used them is
                // gone (a device is dropped only once no manifold holds it).
                let _ = unsafe { result::free_host(host as *mut c_void) };
            }
            for ptr in residency.plain_frees.drain(..) {
                // SAFETY: deferred frees from `free_plain`; no kernel uses them any more.
                let _ = unsafe { result::free_sync(ptr) };
            }
        }
        if let Some(a) = &self.arena
            && !wedged
        {
            // SAFETY: allocated in open_new; every user of the device (and so of the arena) is
            // gone; freed once.
            let _ = unsafe { result::free_sync(a.base) };
        }
        if let Ok(modules) = self.modules.get_mut() {
            for (_, m) in modules.drain() {
                m.graphs.destroy_all();
                // SAFETY: nothing uses the module any more: whatever held it held this device too.
                let _ = unsafe { result::module::unload(m.module) };
            }
        }
        if let Ok(spares) = self.spares.get_mut() {
            for stream in spares.streams.drain(..) {
                // SAFETY: an idle spare (given back by its user), destroyed once.
                let _ = unsafe { result::stream::destroy(stream as sys::CUstream) };
            }
            for event in spares.events.drain(..) {
                // SAFETY: as above.
                let _ = unsafe { result::event::destroy(event as sys::CUevent) };
            }
        }
        if let Ok(transfer) = self.transfer.get_mut() {
            // SAFETY: the stream is ours and no longer used.
            let _ = unsafe { result::stream::destroy(transfer.stream) };
            let idle = self.residency.get_mut().is_ok_and(|r| r.manifolds == 0);
            if idle && !wedged {
                // SAFETY: allocated in open_new, unused (no transfer runs: the device is being
                // dropped), freed once; no manifold runs, so the free does not wait for one.
                let _ = unsafe { result::free_host(transfer.staging) };
            }
        }
        // SAFETY: balances the retain in `open`.
        let _ = unsafe { result::primary_ctx::release(self.cu_device) };
    }
}

/// Pinned host memory mapped into the device's address space (the queue rings live here).
pub(crate) struct MappedHost {
    device: Arc<Device>,
    host: *mut c_void,
    pub dev: sys::CUdeviceptr,
    /// Set when a kernel that may still touch this memory could not be stopped.
    leak: std::sync::atomic::AtomicBool,
}

// SAFETY: the allocation is plain memory; concurrent access from host threads and the device goes
// through atomics (see queue.rs).
unsafe impl Send for MappedHost {}
// SAFETY: as above.
unsafe impl Sync for MappedHost {}

impl MappedHost {
    pub fn new(device: &Arc<Device>, bytes: usize) -> Result<Self> {
        device.bind()?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: allocates `bytes` of pinned memory; freed in Drop.
        let host = unsafe { result::malloc_host(bytes, flags) }
            .map_err(|e| Error::driver("cuMemHostAlloc", e))?;
        // SAFETY: `host` is `bytes` bytes we own; zero is a valid state for every ring.
        unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, bytes) };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: host was allocated with DEVICEMAP; dev is written by the call.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) };
        let mapped = MappedHost {
            device: device.clone(),
            host,
            dev,
            leak: Default::default(),
        };
        check("cuMemHostGetDevicePointer", r)?;
        Ok(mapped)
    }

    pub fn host_ptr(&self) -> *mut c_void {
        self.host
    }

    /// Keeps the memory allocated forever (a kernel that could not be stopped may still use it).
    pub fn leak(&self) {
        self.leak.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for MappedHost {
    fn drop(&mut self) {
        if self.leak.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        // Nothing uses it any more (its kernel has exited; otherwise `leak` was set).
        self.device.free_host(self.host);
    }
}

/// A loaded module with its two kernels. Owned by its `Device`, which unloads it.
pub(crate) struct Module {
    module: sys::CUmodule,
    pub arch: &'static str,
    /// The persistent loop.
    pub manifold: sys::CUfunction,
    /// An empty kernel, for launch-overhead baselines.
    pub empty: sys::CUfunction,
    /// One item per launch (`Variant::FusedLaunched`).
    pub launched: sys::CUfunction,
    /// One stage of one item per launch (`Variant::Unfused`).
    pub unfused: sys::CUfunction,
    /// Answers words written to mapped memory (the round-trip floor).
    pub echo: sys::CUfunction,
    /// Idle executable graphs of `unfused` (`Variant::UnfusedGraph`; see graphs.rs).
    pub graphs: super::graphs::GraphPool,
    /// Dynamic shared memory every launch of `manifold`, `launched` and `unfused` gets: 0, or
    /// `HOPPER_DYNAMIC_SMEM_BYTES` for a module with the wgmma path (`prepare_wgmma`).
    pub dynamic_smem: u32,
}

// SAFETY: module and function handles are usable from any thread with the context current.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

/// The tensor-map templates a wgmma module's `pptm_tmap_template` holds, in its order
/// (kernels/pptm/pattern/wgmma.cuh): (element type, its bytes, box columns, box rows), each with
/// 128-byte swizzle and zeros outside the matrix. bf16 then fp16, each A (64 x 128) and W
/// (64 x 64); then E4M3 bytes (128 x 128), both operands of an fp8 product.
const TMAP_TEMPLATES: &[(sys::CUtensorMapDataType, u32, u32, u32)] = {
    use sys::CUtensorMapDataType::{
        CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 as BF16, CU_TENSOR_MAP_DATA_TYPE_FLOAT16 as F16,
        CU_TENSOR_MAP_DATA_TYPE_UINT8 as U8,
    };
    &[
        (BF16, 2, 64, 128),
        (BF16, 2, 64, 64),
        (F16, 2, 64, 128),
        (F16, 2, 64, 64),
        (U8, 1, 128, 128),
    ]
};

impl Module {
    /// How many manifold blocks fit on one SM (the occupancy API, for the block size pptm uses).
    pub fn blocks_per_sm_max(&self, device: &Device) -> Result<u32> {
        // The occupancy API needs the context current on this thread (the module may have been
        // loaded on another).
        device.bind()?;
        let threads = pptm_spec::BLOCK_THREADS;
        // SAFETY: `manifold` is a kernel of this loaded module.
        let per_sm = unsafe {
            result::occupancy::max_active_block_per_multiprocessor(
                self.manifold,
                threads as i32,
                self.dynamic_smem as usize,
            )
        }
        .map_err(|e| Error::driver("cuOccupancyMaxActiveBlocksPerMultiprocessor", e))?;
        Ok(per_sm.max(0) as u32)
    }

    /// For a module with the Hopper wgmma path (kernels/pptm/pattern/wgmma.cuh; it alone has the
    /// `pptm_tmap_template` global): lets its kernels have `HOPPER_DYNAMIC_SMEM_BYTES` of dynamic
    /// shared memory, and fills the tensor-map templates the device copies and edits for each
    /// item (`TMAP_TEMPLATES`). Called at load, while no manifold is resident. Returns the dynamic
    /// shared memory the module's kernels take (0 without the path).
    fn prepare_wgmma(&self, device: &Device) -> Result<u32> {
        let mut global: sys::CUdeviceptr = 0;
        let mut bytes = 0usize;
        // SAFETY: the module is loaded; the name is NUL-terminated; both outputs are written.
        let found = unsafe {
            sys::cuModuleGetGlobal_v2(
                &mut global,
                &mut bytes,
                self.module,
                c"pptm_tmap_template".as_ptr(),
            )
        };
        if found == sys::CUresult::CUDA_ERROR_NOT_FOUND {
            return Ok(0);
        }
        check("cuModuleGetGlobal", found)?;
        let want = TMAP_TEMPLATES.len() * std::mem::size_of::<sys::CUtensorMap>();
        if bytes != want {
            return Err(Error::ModuleLoad {
                domain: "?",
                arch: self.arch,
                log: format!("pptm_tmap_template is {bytes} bytes, not {want}"),
            });
        }
        let smem = pptm_spec::HOPPER_DYNAMIC_SMEM_BYTES as i32;
        for f in [self.manifold, self.launched, self.unfused] {
            // SAFETY: f is a kernel of this loaded module.
            check("cuFuncSetAttribute", unsafe {
                sys::cuFuncSetAttribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem,
                )
            })?;
        }
        let mut maps = Vec::with_capacity(TMAP_TEMPLATES.len());
        for &(ty, elem_bytes, box_cols, box_rows) in TMAP_TEMPLATES {
            // A box_cols x box_rows matrix at the template array itself (any 16-byte aligned device
            // address does): the device replaces address, sizes and pitch for each item.
            let dims: [u64; 2] = [u64::from(box_cols), u64::from(box_rows)];
            let strides: [u64; 1] = [u64::from(box_cols * elem_bytes)];
            let boxes: [u32; 2] = [box_cols, box_rows];
            let steps: [u32; 2] = [1, 1];
            // SAFETY: CUtensorMap is plain bytes, written whole by the call on success.
            let mut map: sys::CUtensorMap = unsafe { std::mem::zeroed() };
            // SAFETY: every array has the rank's (2) entries, strides rank - 1; the address is
            // device memory of this context, 16-byte aligned (a 128-byte aligned global).
            check("cuTensorMapEncodeTiled", unsafe {
                sys::cuTensorMapEncodeTiled(
                    &mut map,
                    ty,
                    2,
                    global as *mut c_void,
                    dims.as_ptr(),
                    strides.as_ptr(),
                    boxes.as_ptr(),
                    steps.as_ptr(),
                    sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                    sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                    sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
                )
            })?;
            maps.extend_from_slice(&map.opaque);
        }
        device.upload(global, bytemuck::cast_slice(&maps))?;
        Ok(smem as u32)
    }

    /// Loads PTX (JIT-compiled by the driver), returning the JIT's error log on failure, and loads
    /// its kernels eagerly.
    fn load_ptx(
        device: &Device,
        ptx: &str,
        domain: &'static str,
        arch: &'static str,
    ) -> Result<Self> {
        device.bind()?;
        let image = CString::new(ptx).map_err(|_| Error::ModuleLoad {
            domain,
            arch,
            log: "PTX contains a NUL byte".into(),
        })?;
        let mut log = vec![0u8; 16 * 1024];
        let mut options = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), log.len() as *mut c_void];
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: image is NUL-terminated PTX; the option arrays have 2 entries; the log buffer
        // outlives the call and its size is what we pass.
        let r = unsafe {
            sys::cuModuleLoadDataEx(
                &mut module,
                image.as_ptr().cast(),
                2,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        if let Err(e) = r.result() {
            let text = String::from_utf8_lossy(&log)
                .trim_end_matches('\0')
                .trim()
                .to_string();
            return Err(Error::ModuleLoad {
                domain,
                arch,
                log: format!("{}; {text}", Error::driver("cuModuleLoadDataEx", e)),
            });
        }
        let function = |name: &str| -> Result<sys::CUfunction> {
            let c = CString::new(name).expect("kernel names have no NUL");
            // SAFETY: module is loaded; the handle lives as long as the module.
            let f = unsafe { result::module::get_function(module, c) }
                .map_err(|e| Error::driver("cuModuleGetFunction", e))?;
            // SAFETY: f is a valid function; loading it now means no later launch or query has to.
            check("cuFuncLoad", unsafe { sys::cuFuncLoad(f) })?;
            Ok(f)
        };
        let loaded = function("pptm_manifold").and_then(|m| {
            Ok((
                m,
                function("pptm_empty")?,
                function("pptm_launched")?,
                function("pptm_unfused_stage")?,
                function("pptm_echo")?,
            ))
        });
        match loaded {
            Ok((manifold, empty, launched, unfused, echo)) => Ok(Module {
                module,
                arch,
                manifold,
                empty,
                launched,
                unfused,
                echo,
                graphs: super::graphs::GraphPool::default(),
                dynamic_smem: 0,
            }),
            Err(e) => {
                // SAFETY: loaded above and not handed out.
                let _ = unsafe { result::module::unload(module) };
                Err(e)
            }
        }
    }
}

/// A non-blocking stream.
pub(crate) struct Stream {
    device: Arc<Device>,
    pub raw: sys::CUstream,
}

// SAFETY: stream handles are usable from any thread with the context current.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// A stream lent by the device (`Device::take_stream`), given back when dropped.
    pub fn new(device: &Arc<Device>) -> Result<Self> {
        device.bind()?;
        let raw = device.take_stream()?;
        Ok(Stream {
            device: device.clone(),
            raw,
        })
    }

    /// Ok(true): all work done; Ok(false): still running; Err: the work failed.
    pub fn query(&self) -> Result<bool> {
        self.device.bind()?;
        // SAFETY: the stream is valid.
        match unsafe { sys::cuStreamQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => check("cuStreamQuery", other).map(|_| false),
        }
    }

    pub fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: the stream is valid.
        unsafe { result::stream::synchronize(self.raw) }
            .map_err(|e| Error::driver("cuStreamSynchronize", e))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // An idle stream goes back to the device. One with work still queued (a manifold that
        // would not stop) is destroyed instead, which does not wait for the work: lent again, it
        // would queue its next user's work behind a kernel that never ends.
        if self.query().unwrap_or(false) {
            self.device.give_back_stream(self.raw);
        } else {
            let _ = self.device.bind();
            // SAFETY: taken in `new`, no longer used by us, destroyed once.
            let _ = unsafe { result::stream::destroy(self.raw) };
        }
    }
}
