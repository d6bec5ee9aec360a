//! Which CUDA driver calls an application can make while a pptm manifold is resident: each call
//! runs in a process of its own, beside a manifold that has just answered an item, and is timed.
//! A call still running after `LIMIT` is reported as blocking; the manifold is then shut down (the
//! runtime dropped) and the time the call needed after that is reported too.
//!
//!   embedding-probe            # every call, one child process each; prints a table
//!   embedding-probe CALL       # one call (what the parent runs)
//!
//! Measurement for issue 31 (docs/embedding.md); not a test.

use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use pptm::Runtime;
use pptm::chains::KlComplexity;

const LIMIT: Duration = Duration::from_secs(3);

/// A kernel that stores 7 through its pointer.
const PTX: &str = "
.version 7.0
.target sm_80
.address_size 64
.visible .entry probe_store(.param .u64 p)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [p];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, 7;
    st.global.u32 [%rd2], %r1;
    ret;
}
\0";

const CALLS: &[&str] = &[
    "mem_alloc",
    "mem_free",
    "host_alloc",
    "stream_create_destroy",
    "event_record_sync",
    "module_load",
    "module_unload",
    "launch_own_stream",
    "launch_legacy_stream",
    "memcpy_htod_sync",
    "memcpy_dtoh_sync",
    "memcpy_async_own_stream",
    "mem_alloc_async",
    "ctx_synchronize",
    "cublas_create",
    "other_ctx_module_load",
];

fn check(what: &str, r: sys::CUresult) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what} failed: {r:?}");
}

/// What a call needs made before the manifold starts (a module to unload, memory to free).
#[derive(Clone, Copy)]
struct Setup {
    ctx: sys::CUcontext,
    module: sys::CUmodule,
    func: sys::CUfunction,
    mem: sys::CUdeviceptr,
    stream: sys::CUstream,
}
// SAFETY: plain driver handles, used from one thread at a time.
unsafe impl Send for Setup {}

fn setup() -> Setup {
    // SAFETY: driver calls with valid out-pointers; the primary context is pptm's too.
    unsafe {
        check("cuInit", sys::cuInit(0));
        let mut dev = 0;
        check("cuDeviceGet", sys::cuDeviceGet(&mut dev, 0));
        let mut ctx = std::ptr::null_mut();
        check(
            "cuDevicePrimaryCtxRetain",
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
        );
        check("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx));
        let mut module = std::ptr::null_mut();
        check(
            "cuModuleLoadData",
            sys::cuModuleLoadData(&mut module, PTX.as_ptr().cast()),
        );
        let mut func = std::ptr::null_mut();
        check(
            "cuModuleGetFunction",
            sys::cuModuleGetFunction(&mut func, module, c"probe_store".as_ptr()),
        );
        let mut mem = 0;
        check("cuMemAlloc", sys::cuMemAlloc_v2(&mut mem, 1 << 20));
        let mut stream = std::ptr::null_mut();
        check(
            "cuStreamCreate",
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            ),
        );
        Setup {
            ctx,
            module,
            func,
            mem,
            stream,
        }
    }
}

fn launch(s: &Setup, stream: sys::CUstream) {
    let mut p = s.mem;
    let mut params = [(&mut p as *mut u64).cast::<std::ffi::c_void>()];
    // SAFETY: probe_store takes one pointer; s.mem holds 1 MiB.
    unsafe {
        check(
            "cuLaunchKernel",
            sys::cuLaunchKernel(
                s.func,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
        );
        check("cuStreamSynchronize", sys::cuStreamSynchronize(stream));
        let mut v = 0u32;
        check(
            "cuMemcpyDtoH",
            sys::cuMemcpyDtoH_v2((&mut v as *mut u32).cast(), s.mem, 4),
        );
        assert_eq!(v, 7, "the probe kernel did not run");
    }
}

fn run(call: &str, s: Setup) {
    // SAFETY: driver calls with valid arguments on the primary context (made current here).
    unsafe {
        check("cuCtxSetCurrent", sys::cuCtxSetCurrent(s.ctx));
        let mut host = vec![0u8; 1 << 20];
        match call {
            "mem_alloc" => {
                let mut p = 0;
                check("cuMemAlloc", sys::cuMemAlloc_v2(&mut p, 1 << 20));
            }
            "mem_free" => check("cuMemFree", sys::cuMemFree_v2(s.mem)),
            "host_alloc" => {
                let mut p = std::ptr::null_mut();
                check("cuMemHostAlloc", sys::cuMemHostAlloc(&mut p, 1 << 20, 0));
                check("cuMemFreeHost", sys::cuMemFreeHost(p));
            }
            "stream_create_destroy" => {
                let mut st = std::ptr::null_mut();
                check("cuStreamCreate", sys::cuStreamCreate(&mut st, 1));
                check("cuStreamDestroy", sys::cuStreamDestroy_v2(st));
            }
            "event_record_sync" => {
                let mut e = std::ptr::null_mut();
                check("cuEventCreate", sys::cuEventCreate(&mut e, 0));
                check("cuEventRecord", sys::cuEventRecord(e, s.stream));
                check("cuEventSynchronize", sys::cuEventSynchronize(e));
                check("cuEventDestroy", sys::cuEventDestroy_v2(e));
            }
            "module_load" => {
                let mut m = std::ptr::null_mut();
                check(
                    "cuModuleLoadData",
                    sys::cuModuleLoadData(&mut m, PTX.as_ptr().cast()),
                );
            }
            "module_unload" => check("cuModuleUnload", sys::cuModuleUnload(s.module)),
            "launch_own_stream" => launch(&s, s.stream),
            "launch_legacy_stream" => launch(&s, std::ptr::null_mut()),
            "memcpy_htod_sync" => check(
                "cuMemcpyHtoD",
                sys::cuMemcpyHtoD_v2(s.mem, host.as_ptr().cast(), host.len()),
            ),
            "memcpy_dtoh_sync" => check(
                "cuMemcpyDtoH",
                sys::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), s.mem, host.len()),
            ),
            "memcpy_async_own_stream" => {
                check(
                    "cuMemcpyDtoHAsync",
                    sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), s.mem, 4096, s.stream),
                );
                check("cuStreamSynchronize", sys::cuStreamSynchronize(s.stream));
            }
            "mem_alloc_async" => {
                let mut p = 0;
                check(
                    "cuMemAllocAsync",
                    sys::cuMemAllocAsync(&mut p, 1 << 20, s.stream),
                );
                check("cuMemFreeAsync", sys::cuMemFreeAsync(p, s.stream));
                check("cuStreamSynchronize", sys::cuStreamSynchronize(s.stream));
            }
            "ctx_synchronize" => check("cuCtxSynchronize", sys::cuCtxSynchronize()),
            "cublas_create" => {
                let h = cudarc::cublas::result::create_handle().expect("cublasCreate");
                cudarc::cublas::result::destroy_handle(h).expect("cublasDestroy");
            }
            "other_ctx_module_load" => {
                let mut dev = 0;
                check("cuDeviceGet", sys::cuDeviceGet(&mut dev, 0));
                let mut ctx = std::ptr::null_mut();
                check(
                    "cuCtxCreate",
                    sys::cuCtxCreate_v4(&mut ctx, std::ptr::null_mut(), 0, dev),
                );
                let mut m = std::ptr::null_mut();
                check(
                    "cuModuleLoadData",
                    sys::cuModuleLoadData(&mut m, PTX.as_ptr().cast()),
                );
                let mut f = std::ptr::null_mut();
                check(
                    "cuModuleGetFunction",
                    sys::cuModuleGetFunction(&mut f, m, c"probe_store".as_ptr()),
                );
                let mut mem = 0;
                check("cuMemAlloc", sys::cuMemAlloc_v2(&mut mem, 4096));
                let other = Setup {
                    ctx,
                    module: m,
                    func: f,
                    mem,
                    stream: std::ptr::null_mut(),
                };
                launch(&other, std::ptr::null_mut());
                check("cuCtxSetCurrent", sys::cuCtxSetCurrent(s.ctx));
            }
            other => panic!("unknown call {other}"),
        }
    }
}

fn one(call: &str) {
    let s = setup();
    let rt = Runtime::gpu().expect("a GPU");
    let (q, p) = (vec![0.25f32; 4096], vec![0.25f32; 4096]);
    let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
    let kl = KlComplexity::submit(&rt, &qb, &pb).unwrap().wait().unwrap();
    assert!(kl.abs() < 1e-6, "KL of equal distributions: {kl}");
    let (tx, rx) = mpsc::channel();
    let name = call.to_string();
    let started = Instant::now();
    let worker = std::thread::spawn(move || {
        run(&name, s);
        tx.send(()).unwrap();
    });
    match rx.recv_timeout(LIMIT) {
        Ok(()) => {
            let took = started.elapsed();
            // The manifold still answers.
            let again = KlComplexity::submit(&rt, &qb, &pb).unwrap().wait().unwrap();
            assert!(again.abs() < 1e-6);
            println!(
                "RESULT {call}: returns beside the manifold in {:.1} us; the manifold still answers",
                took.as_secs_f64() * 1e6
            );
        }
        Err(_) => {
            println!(
                "RESULT {call}: BLOCKS beside the manifold (still running after {} s)",
                LIMIT.as_secs()
            );
            use std::io::Write;
            std::io::stdout().flush().unwrap();
            let parked = Instant::now();
            drop((qb, pb));
            drop(rt);
            let dropped = parked.elapsed();
            let ok = rx.recv_timeout(Duration::from_secs(10)).is_ok();
            println!(
                "AFTER  {call}: {} {:.1} ms after the runtime was dropped (the drop took {:.1} ms)",
                if ok { "returned" } else { "still blocked 10 s" },
                parked.elapsed().as_secs_f64() * 1e3,
                dropped.as_secs_f64() * 1e3
            );
            if !ok {
                std::process::exit(3);
            }
        }
    }
    worker.join().unwrap();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(call) = args.first() {
        one(call);
        return;
    }
    let me = std::env::current_exe().unwrap();
    for call in CALLS {
        let out = Command::new("timeout")
            .args(["60", me.to_str().unwrap(), call])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("RESULT") || l.starts_with("AFTER"))
            .collect();
        for l in &lines {
            println!("{l}");
        }
        if !out.status.success() {
            println!(
                "EXIT   {call}: {:?}: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
        }
    }
}
