//! pptm embedded in an application that has CUDA work of its own (docs/embedding.md):
//! * every domain linked into the binary starts on demand, in any order, by re-partitioning the
//!   GPU among the running manifolds;
//! * the application's own driver calls beside a resident manifold with items in flight: those
//!   that work there (allocation, streams, its own kernels, copies) run beside it, those that wait
//!   for every kernel on the GPU (module loads, cuMemFree) run inside `Runtime::quiesce`;
//! * interop: device memory the application owns (a raw pointer, a cudarc slice) as buffers, a
//!   buffer's device address, pptm's context; bad memory is a typed error.
//!
//! Every pptm result is checked against an f64 reference with fresh random inputs.

mod common;

use std::time::{Duration, Instant};

use pptm::chains::{DistanceKth, GemvAxpbySum, KlComplexity, KlTerms, MatmulBiasGeluBf16};
use pptm::cudarc::driver::sys;
use pptm::ops::{KlDivergence, MaxReduction};
use pptm::{Buffer, Chain, Config, Error, FusionBuilder, Runtime, bf16};

/// A chain of this crate's own (the largest KL term), in a domain of its own (a test's chains never
/// join the library's domains): the application's chains are registered at link time and their
/// code loaded before the first manifold starts.
#[derive(FusionBuilder)]
#[fusion(domain = "embedding_app")]
pub struct LargestKlTerm {
    #[stage(1)]
    kl: KlDivergence,
    #[stage(2, reduction = true)]
    largest: MaxReduction,
}

/// The GPU tests run one at a time: each has a runtime of its own, and `quiesce` (rightly) refuses
/// to run while another runtime's manifold is resident.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

use common::{
    assert_gemv_axpby_sum_close, assert_kl_sum_close, gelu, kth_reference, open_gpu, positive,
    uniform,
};

fn distribution(n: usize) -> Vec<f32> {
    let v = positive(n);
    let s: f64 = v.iter().map(|&x| f64::from(x)).sum();
    v.into_iter().map(|x| (f64::from(x) / s) as f32).collect()
}

/// One item of each domain the on-demand test visits, checked against its reference.
#[derive(Clone, Copy, Debug)]
enum Step {
    Inference,
    Tensor,
    TransferEntropy,
    LinearAlgebra,
}

impl Step {
    fn domain(self) -> &'static str {
        match self {
            Step::Inference => KlComplexity::DOMAIN.name,
            Step::Tensor => MatmulBiasGeluBf16::DOMAIN.name,
            Step::TransferEntropy => DistanceKth::DOMAIN.name,
            Step::LinearAlgebra => GemvAxpbySum::DOMAIN.name,
        }
    }

    /// Submits one item of the step's domain with fresh inputs and checks it.
    fn run_and_check(self, rt: &Runtime, round: usize) {
        let what = format!("round {round}, domain {}", self.domain());
        match self {
            Step::Inference => {
                let n = [1, 7, 1023, (1 << 20) + 3][round % 4];
                let (q, p) = (distribution(n), distribution(n));
                let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
                let got = KlComplexity::submit(rt, &qb, &pb).unwrap().wait().unwrap();
                assert_kl_sum_close(got, &q, &p, &what);
                let largest = LargestKlTerm::submit(rt, &qb, &pb).unwrap().wait().unwrap();
                let want = q
                    .iter()
                    .zip(&p)
                    .map(|(&q, &p)| common::kl_term(q, p))
                    .fold(f64::NEG_INFINITY, f64::max);
                assert!(
                    (f64::from(largest) - want).abs() <= 1e-6 * want.abs().max(1e-30) + 1e-12,
                    "{what}: largest KL term {largest}, f64 reference {want}"
                );
            }
            Step::Tensor => {
                let (m, k, n) = [(1, 1, 1), (37, 64, 29), (130, 200, 72)][round % 3];
                let a: Vec<bf16> = uniform(m * k, -1.0, 1.0)
                    .into_iter()
                    .map(bf16::from_f32)
                    .collect();
                let w: Vec<bf16> = uniform(k * n, -1.0, 1.0)
                    .into_iter()
                    .map(bf16::from_f32)
                    .collect();
                let b = uniform(n, -1.0, 1.0);
                let mut out = rt.upload(&vec![f32::NAN; m * n]).unwrap();
                MatmulBiasGeluBf16::submit(
                    rt,
                    &rt.upload(&a).unwrap(),
                    &rt.upload(&w).unwrap(),
                    &rt.upload(&b).unwrap(),
                    &mut out,
                    m,
                    k,
                )
                .unwrap()
                .wait()
                .unwrap();
                let got = out.to_vec().unwrap();
                for i in 0..m {
                    for j in 0..n {
                        let (mut s, mut mag) = (f64::from(b[j]), f64::from(b[j]).abs());
                        for p in 0..k {
                            let t = a[i * k + p].to_f64() * w[p * n + j].to_f64();
                            s += t;
                            mag += t.abs();
                        }
                        let err = (f64::from(got[i * n + j]) - gelu(s)).abs();
                        assert!(
                            err < 1e-4 * mag.max(1e-3),
                            "{what}: ({i}, {j}) of {m}x{k}x{n}: got {}, f64 reference {}",
                            got[i * n + j],
                            gelu(s)
                        );
                    }
                }
            }
            Step::TransferEntropy => {
                let (n, d, k) = [(7, 1, 1), (300, 3, 4), (1023, 2, 3)][round % 3];
                let x = uniform(n * d, -1.0, 1.0);
                let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
                DistanceKth::submit(rt, &rt.upload(&x).unwrap(), k, &mut out, d)
                    .unwrap()
                    .wait()
                    .unwrap();
                let want = &kth_reference(&x, n, d, &[k])[0];
                for (i, (&g, &w)) in out.to_vec().unwrap().iter().zip(want).enumerate() {
                    // Chebyshev distances of f32 coordinates: one f32 subtraction each.
                    assert!(
                        (w.is_nan() && g.is_nan())
                            || (f64::from(g) - w).abs() <= 2e-7 * w.abs().max(1.0),
                        "{what}: point {i} of {n}: got {g}, f64 reference {w}"
                    );
                }
            }
            Step::LinearAlgebra => {
                let (m, n) = [(1, 1), (7, 1023), (1023, 7)][round % 3];
                let (x, a, y) = (
                    uniform(n, -1.0, 1.0),
                    uniform(m * n, -1.0, 1.0),
                    uniform(m, -1.0, 1.0),
                );
                let got = GemvAxpbySum::submit(
                    rt,
                    &rt.upload(&x).unwrap(),
                    &rt.upload(&a).unwrap(),
                    &rt.upload(&y).unwrap(),
                    0.75,
                    -1.5,
                )
                .unwrap()
                .wait()
                .unwrap();
                assert_gemv_axpby_sum_close(got, (&x, &a, &y), (0.75, -1.5), 1e-4, &what);
            }
        }
    }
}

#[test]
fn this_crates_chains_are_linked() {
    let names: Vec<&str> = pptm::linked_domains().iter().map(|d| d.name).collect();
    assert!(
        pptm::linked_domains()
            .iter()
            .any(|d| d.key == LargestKlTerm::DOMAIN.key),
        "{names:?}"
    );
    let mut keys: Vec<&str> = pptm::linked_domains().iter().map(|d| d.key).collect();
    let listed = keys.len();
    keys.dedup();
    assert_eq!(keys.len(), listed, "a domain is listed twice: {keys:?}");
}

/// No-op item latency through `KlComplexity`'s manifold, host clocks around each synchronised
/// item after a warm-up: (median, p99) in microseconds. A figure, not an assertion.
fn noop_latency(rt: &Runtime) -> (f64, f64) {
    for _ in 0..200 {
        rt.submit_noop::<KlComplexity>().unwrap().wait().unwrap();
    }
    let mut us: Vec<f64> = (0..2000)
        .map(|_| {
            let t = Instant::now();
            rt.submit_noop::<KlComplexity>().unwrap().wait().unwrap();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    us.sort_by(f64::total_cmp);
    (us[us.len() / 2], us[us.len() * 99 / 100])
}

/// Domains in alternating order with no prepare_domains: each new one re-partitions the GPU, and
/// every result is right. Prints what a re-partition costs.
#[test]
fn domains_start_on_demand_in_any_order() {
    let _one = one_at_a_time();
    // Resident throughout (no parking when idle): the test counts re-partitions.
    let resident = Config {
        park_when_idle: None,
        ..Config::default()
    };
    let Some(rt) = open_gpu("domains_start_on_demand_in_any_order", resident) else {
        return;
    };
    use Step::*;
    let order = [
        Inference,
        Tensor,
        TransferEntropy,
        LinearAlgebra,
        Inference,
        Tensor,
        TransferEntropy,
        LinearAlgebra,
        LinearAlgebra,
        Inference,
    ];
    let mut first_of_domain = Vec::new();
    eprintln!("[on demand] first item");
    Inference.run_and_check(&rt, 0);
    let (alone_median, alone_p99) = noop_latency(&rt);
    for (round, step) in order.into_iter().enumerate() {
        let before = rt.repartitions();
        eprintln!("[on demand] round {round}: {step:?}");
        let started = Instant::now();
        step.run_and_check(&rt, round);
        let took = started.elapsed();
        if rt.repartitions() > before {
            first_of_domain.push((step.domain(), took));
        }
    }
    // inference starts alone and embedding_app (this crate's own chain, in the same step) joins it;
    // tensor, transfer_entropy and linear_algebra each re-partition once.
    assert_eq!(rt.repartitions(), 4, "{}", rt.describe());
    for d in [
        "inference",
        "embedding_app",
        "tensor",
        "transfer_entropy",
        "linear_algebra",
    ] {
        assert!(
            rt.describe().contains(&format!("`{d}`")),
            "{d} not running: {}",
            rt.describe()
        );
    }
    let (four_median, four_p99) = noop_latency(&rt);
    eprintln!(
        "no-op item latency: inference manifold alone {alone_median:.1} us median, {alone_p99:.1} us p99; \
         beside four others {four_median:.1} us median, {four_p99:.1} us p99"
    );
    for (d, took) in first_of_domain {
        eprintln!(
            "re-partition to start `{d}` and run its first item: {:.2} ms",
            took.as_secs_f64() * 1e3
        );
    }
    // The cost on its own: quiesce drains and relaunches the same four manifolds.
    let mut costs: Vec<f64> = (0..11)
        .map(|_| {
            let t = Instant::now();
            rt.quiesce(|| ()).unwrap();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    costs.sort_by(f64::total_cmp);
    eprintln!(
        "drain and relaunch of 4 manifolds (Runtime::quiesce with an empty closure): median {:.2} ms, max {:.2} ms",
        costs[costs.len() / 2],
        costs[costs.len() - 1]
    );
    Inference.run_and_check(&rt, 99);
}

/// A one-thread kernel that stores 7 through its pointer.
const PTX: &str = "
.version 7.0
.target sm_80
.address_size 64
.visible .entry store_seven(.param .u64 p)
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

fn ok(call: &str, r: sys::CUresult) {
    eprintln!("  {call}: {r:?}");
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{call}");
}

/// KL items in flight, to check after the application's work.
struct InFlight {
    q: Vec<f32>,
    p: Vec<f32>,
    qb: Buffer<f32>,
    pb: Buffer<f32>,
}

impl InFlight {
    fn new(rt: &Runtime, n: usize) -> Self {
        let (q, p) = (distribution(n), distribution(n));
        let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
        InFlight { q, p, qb, pb }
    }
}

#[test]
fn application_cuda_work_beside_a_manifold() {
    let _one = one_at_a_time();
    let Some(rt) = open_gpu("application_cuda_work_beside_a_manifold", Config::default()) else {
        return;
    };
    let ctx = rt.cuda_context().expect("a GPU runtime has a context");
    // SAFETY: pptm's context is valid while `rt` lives.
    ok("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) });
    let items: Vec<InFlight> = [7usize, 1023, (1 << 20) + 3]
        .iter()
        .map(|&n| InFlight::new(&rt, n))
        .collect();
    // A module load waits for every kernel on the GPU: inside quiesce. Items submitted before
    // it complete first and are still right.
    let before: Vec<_> = items
        .iter()
        .map(|i| KlComplexity::submit(&rt, &i.qb, &i.pb).unwrap())
        .collect();
    eprintln!("[beside] quiesce to load a module");
    let (module, func) = rt
        .quiesce(|| {
            // Inside, pptm work is refused rather than left waiting.
            let refused = KlComplexity::submit(&rt, &items[0].qb, &items[0].pb);
            assert!(matches!(refused, Err(Error::Quiesced)), "{refused:?}");
            let mut module = std::ptr::null_mut();
            let mut func = std::ptr::null_mut();
            // SAFETY: valid out-pointers, a NUL-terminated PTX image, the current context.
            unsafe {
                ok(
                    "cuModuleLoadData",
                    sys::cuModuleLoadData(&mut module, PTX.as_ptr().cast()),
                );
                ok(
                    "cuModuleGetFunction",
                    sys::cuModuleGetFunction(&mut func, module, c"store_seven".as_ptr()),
                );
            }
            (module, func)
        })
        .unwrap();
    for (t, i) in before.into_iter().zip(&items) {
        assert_kl_sum_close(
            t.wait().unwrap(),
            &i.q,
            &i.p,
            "an item submitted before quiesce",
        );
    }

    // Beside the resident manifold, with items in flight: allocate, make a stream, launch the
    // application's kernel and copy, all while pptm works.
    let in_flight: Vec<_> = items
        .iter()
        .map(|i| KlComplexity::submit(&rt, &i.qb, &i.pb).unwrap())
        .collect();
    eprintln!("[beside] the application's calls beside the manifold");
    let mut mem: sys::CUdeviceptr = 0;
    let mut stream: sys::CUstream = std::ptr::null_mut();
    let mut seven = 0u32;
    // SAFETY: driver calls with valid out-pointers in pptm's context; `mem` holds 4 KiB, the
    // kernel's one pointer parameter is `mem`.
    unsafe {
        ok("cuMemAlloc", sys::cuMemAlloc_v2(&mut mem, 4096));
        ok("cuStreamCreate", sys::cuStreamCreate(&mut stream, 1));
        let mut arg = mem;
        let mut params = [(&raw mut arg).cast::<std::ffi::c_void>()];
        ok(
            "cuLaunchKernel",
            sys::cuLaunchKernel(
                func,
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
        ok("cuStreamSynchronize", sys::cuStreamSynchronize(stream));
        ok(
            "cuMemcpyDtoH",
            sys::cuMemcpyDtoH_v2((&raw mut seven).cast(), mem, 4),
        );
        ok("cuStreamDestroy", sys::cuStreamDestroy_v2(stream));
    }
    assert_eq!(
        seven, 7,
        "the application's kernel did not run beside the manifold"
    );
    for (t, i) in in_flight.into_iter().zip(&items) {
        assert_kl_sum_close(
            t.wait().unwrap(),
            &i.q,
            &i.p,
            "an item in flight beside the application's work",
        );
    }

    eprintln!("[beside] the application's kernel writes a pptm buffer");
    // The application's kernel writes into a pptm buffer through its device address.
    let mut out = rt.upload(&[0u32; 3]).unwrap();
    let at = out
        .device_address()
        .expect("a device buffer has an address");
    // SAFETY: `at` is 12 bytes of pptm's device memory; no pptm item uses `out` meanwhile.
    unsafe {
        let mut arg = at + 4;
        let mut params = [(&raw mut arg).cast::<std::ffi::c_void>()];
        ok(
            "cuLaunchKernel",
            sys::cuLaunchKernel(
                func,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
        );
        ok(
            "cuStreamSynchronize",
            sys::cuStreamSynchronize(std::ptr::null_mut()),
        );
    }
    assert_eq!(out.to_vec().unwrap(), vec![0, 7, 0]);
    out.fill(1).unwrap();

    eprintln!("[beside] quiesce to free and unload");
    // cuMemFree and a module unload wait for every kernel too: inside quiesce.
    rt.quiesce(|| {
        // SAFETY: both came from the calls above and are released once.
        unsafe {
            ok("cuMemFree", sys::cuMemFree_v2(mem));
            ok("cuModuleUnload", sys::cuModuleUnload(module));
        }
    })
    .unwrap();
    for i in &items {
        let got = KlComplexity::submit(&rt, &i.qb, &i.pb)
            .unwrap()
            .wait()
            .unwrap();
        assert_kl_sum_close(got, &i.q, &i.p, "an item after the second quiesce");
    }
}

#[test]
fn the_applications_device_memory_as_buffers() {
    let _one = one_at_a_time();
    let Some(rt) = open_gpu(
        "the_applications_device_memory_as_buffers",
        Config::default(),
    ) else {
        return;
    };
    let ctx = rt.cuda_context().unwrap();
    // SAFETY: pptm's context is valid while `rt` lives.
    ok("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) });
    let n = 1023;
    let (q, p) = (distribution(n), distribution(n));
    // Start the manifold first: the application's memory comes while it is resident.
    let warm = KlComplexity::submit(&rt, &rt.upload(&q).unwrap(), &rt.upload(&p).unwrap())
        .unwrap()
        .wait()
        .unwrap();
    assert_kl_sum_close(warm, &q, &p, "before wrapping");

    eprintln!("[memory] raw allocation");
    // A raw allocation of the application's.
    let mut mem: sys::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; copies within the 8 KiB allocated.
    unsafe {
        ok("cuMemAlloc", sys::cuMemAlloc_v2(&mut mem, 2 * 4 * n));
        ok(
            "cuMemcpyHtoD",
            sys::cuMemcpyHtoD_v2(mem, q.as_ptr().cast(), 4 * n),
        );
        ok(
            "cuMemcpyHtoD",
            sys::cuMemcpyHtoD_v2(mem + 4 * n as u64, p.as_ptr().cast(), 4 * n),
        );
    }
    {
        // SAFETY: both halves are n f32 of the allocation above, alive until cuMemFree below,
        // and nothing else touches them meanwhile.
        let (qb, pb) = unsafe {
            (
                rt.wrap_device_memory::<f32>(mem, n).unwrap(),
                rt.wrap_device_memory::<f32>(mem + 4 * n as u64, n).unwrap(),
            )
        };
        assert_eq!(qb.to_vec().unwrap(), q);
        let got = KlComplexity::submit(&rt, &qb, &pb).unwrap().wait().unwrap();
        assert_kl_sum_close(got, &q, &p, "on the application's raw memory");

        eprintln!("[memory] bad memory");
        // Bad memory is a typed error.
        // SAFETY: each call is refused before the memory is used.
        unsafe {
            for (what, ptr, len) in [
                ("misaligned", mem + 2, 4),
                ("past the allocation's end", mem + 4, 2 * n),
                ("null", 0, 1),
                ("a host address", q.as_ptr() as u64, n),
            ] {
                let e = rt.wrap_device_memory::<f32>(ptr, len).unwrap_err();
                assert!(matches!(e, Error::ForeignMemory { .. }), "{what}: {e:?}");
            }
        }
    }
    rt.quiesce(|| {
        // SAFETY: allocated above; the buffers over it are gone.
        ok("cuMemFree", unsafe { sys::cuMemFree_v2(mem) });
    })
    .unwrap();

    eprintln!("[memory] cudarc slices");
    // A cudarc slice (the primary context, as pptm's). cudarc's first new_stream synchronises the
    // context (cuCtxSynchronize), which waits for every kernel: inside quiesce.
    let (cx, stream) = rt
        .quiesce(|| {
            let cx = pptm::cudarc::driver::CudaContext::new(0).unwrap();
            let stream = cx.new_stream().unwrap();
            (cx, stream)
        })
        .unwrap();
    let qs = stream.clone_htod(&q).unwrap();
    let ps = stream.clone_htod(&p).unwrap();
    let (qb, pb) = (
        rt.wrap_cuda_slice(qs).unwrap(),
        rt.wrap_cuda_slice(ps).unwrap(),
    );
    let got = KlComplexity::submit(&rt, &qb, &pb).unwrap().wait().unwrap();
    assert_kl_sum_close(got, &q, &p, "on cudarc slices");
    drop((qb, pb, stream, cx));
}

#[test]
fn wrapping_memory_needs_the_gpu_backend() {
    let rt = Runtime::cpu();
    assert!(rt.cuda_context().is_none());
    assert!(rt.upload(&[1.0f32]).unwrap().device_address().is_none());
    // SAFETY: refused before any use.
    let e = unsafe { rt.wrap_device_memory::<f32>(0x1000, 4) }.unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    // On the CPU backend quiesce only runs the closure.
    assert_eq!(rt.quiesce(|| 5).unwrap(), 5);
    assert_eq!(rt.repartitions(), 0);
}

/// Copies `n` u32 words from `src` to `dst` once every thread has spun for `delay_ns` of the GPU's
/// clock: application work that finishes well after the host enqueued it, so an item that did not
/// wait for it on the GPU would read the poisoned destination.
const DELAYED_COPY_PTX: &str = "
.version 7.0
.target sm_80
.address_size 64
.visible .entry delayed_copy(.param .u64 src, .param .u64 dst, .param .u32 n, .param .u64 delay)
{
    .reg .pred %p<3>;
    .reg .b32 %r<9>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [dst];
    ld.param.u32 %r1, [n];
    ld.param.u64 %rd3, [delay];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u64 %rd4, %globaltimer;
SPIN:
    mov.u64 %rd5, %globaltimer;
    sub.u64 %rd6, %rd5, %rd4;
    setp.lt.u64 %p1, %rd6, %rd3;
    @%p1 bra SPIN;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    mov.u32 %r6, %nctaid.x;
    mul.lo.u32 %r7, %r6, %r3;
COPY:
    setp.ge.u32 %p2, %r5, %r1;
    @%p2 bra DONE;
    mul.wide.u32 %rd7, %r5, 4;
    add.u64 %rd8, %rd1, %rd7;
    ld.global.u32 %r8, [%rd8];
    add.u64 %rd9, %rd2, %rd7;
    st.global.u32 [%rd9], %r8;
    add.u32 %r5, %r5, %r7;
    bra COPY;
DONE:
    ret;
}
\0";

/// Launches `delayed_copy` on `stream`: `n` words from `src` to `dst` after `delay_ns`.
///
/// # Safety
/// `func` is `delayed_copy`; `src` and `dst` hold `n` u32 each and stay allocated until the
/// stream is past the kernel; `stream` is a stream of the current context (or null).
unsafe fn delayed_copy(
    func: sys::CUfunction,
    stream: sys::CUstream,
    src: u64,
    dst: u64,
    n: usize,
    delay_ns: u64,
) {
    let (mut s, mut d, mut len, mut delay) = (src, dst, n as u32, delay_ns);
    let mut params = [
        (&raw mut s).cast::<std::ffi::c_void>(),
        (&raw mut d).cast(),
        (&raw mut len).cast(),
        (&raw mut delay).cast(),
    ];
    let blocks = n.div_ceil(256).clamp(1, 264) as u32;
    // SAFETY: the caller's promise; four parameters as the kernel declares them.
    ok("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            func,
            blocks,
            1,
            1,
            256,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    });
}

/// Synchronises a stream when dropped: declared after the buffers an application kernel uses, it
/// keeps a failing test from freeing them under the kernel (which would poison the process's
/// context for the tests after it).
struct SyncOnDrop<'a>(&'a pptm::cudarc::driver::CudaStream);

impl Drop for SyncOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.synchronize();
    }
}

/// The device address of a pptm buffer, for the application's kernels.
fn address<T: pptm::Element>(b: &Buffer<T>) -> u64 {
    b.device_address().expect("a device buffer has an address")
}

/// The f64 reference of KlTerms.
fn kl_terms_close(got: &[f32], q: &[f32], p: &[f32], what: &str) {
    assert_eq!(got.len(), q.len(), "{what}");
    let n = q.len();
    for (i, (&g, (&qi, &pi))) in got.iter().zip(q.iter().zip(p)).enumerate() {
        let want = common::kl_term(qi, pi);
        assert!(
            // As kl_chain.rs: a term where q ≈ p cancels, so the bar is scaled by q too.
            (f64::from(g) - want).abs()
                <= common::REL_TOL * want.abs().max(f64::from(qi)).max(1e-30),
            "{what}: term {i} of {n}: got {g}, f64 reference {want}"
        );
    }
}

#[test]
fn items_and_application_streams_ordered_on_the_gpu() {
    let _one = one_at_a_time();
    let Some(rt) = open_gpu(
        "items_and_application_streams_ordered_on_the_gpu",
        Config::default(),
    ) else {
        return;
    };
    // Before any manifold is resident: cudarc's first stream synchronises the context, and a
    // module load waits for every kernel.
    let cx = pptm::cudarc::driver::CudaContext::new(0).unwrap();
    let (app, held) = (cx.new_stream().unwrap(), cx.new_stream().unwrap());
    let ctx = rt.cuda_context().unwrap();
    // SAFETY: pptm's context is valid while `rt` lives.
    ok("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) });
    let mut module = std::ptr::null_mut();
    let mut func = std::ptr::null_mut();
    // SAFETY: valid out-pointers, a NUL-terminated PTX image, pptm's context current.
    unsafe {
        ok(
            "cuModuleLoadData",
            sys::cuModuleLoadData(&mut module, DELAYED_COPY_PTX.as_ptr().cast()),
        );
        ok(
            "cuModuleGetFunction",
            sys::cuModuleGetFunction(&mut func, module, c"delayed_copy".as_ptr()),
        );
    }
    const DELAY_NS: u64 = 20_000_000;

    eprintln!("[streams] items wait on the GPU for the application's stream");
    for (round, n) in [1usize, 7, 1023, (1 << 20) + 3].into_iter().enumerate() {
        let (q, p) = (distribution(n), distribution(n));
        let (qsrc, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
        let qdst = rt.upload(&vec![f32::NAN; n]).unwrap();
        let _synced = SyncOnDrop(&app);
        // The application fills q 20 ms from now; pptm's items read it.
        // SAFETY: n f32 each, alive until after the stream is synchronised below.
        unsafe {
            delayed_copy(
                func,
                app.cu_stream(),
                address(&qsrc),
                address(&qdst),
                n,
                DELAY_NS,
            )
        };
        rt.wait_for_stream(&app).unwrap();
        let kl = KlComplexity::submit(&rt, &qdst, &pb).unwrap();
        let largest = LargestKlTerm::submit(&rt, &qdst, &pb).unwrap();
        let what = format!("round {round}, n = {n}, after the application's stream");
        assert_kl_sum_close(kl.wait().unwrap(), &q, &p, &what);
        let want = q
            .iter()
            .zip(&p)
            .map(|(&q, &p)| common::kl_term(q, p))
            .fold(f64::NEG_INFINITY, f64::max);
        let got = f64::from(largest.wait().unwrap());
        assert!(
            (got - want).abs() <= 1e-6 * want.abs().max(1e-30) + 1e-12,
            "{what}: largest KL term {got}, f64 reference {want}"
        );
        if round == 2 {
            // Another domain's manifold, started after the stream point, follows it too.
            let (m, cols) = (7, 1023);
            let (x, a, y) = (
                uniform(cols, -1.0, 1.0),
                uniform(m * cols, -1.0, 1.0),
                uniform(m, -1.0, 1.0),
            );
            let xsrc = rt.upload(&x).unwrap();
            let xdst = rt.upload(&vec![f32::NAN; cols]).unwrap();
            let _synced = SyncOnDrop(&app);
            // SAFETY: as above.
            unsafe {
                delayed_copy(
                    func,
                    app.cu_stream(),
                    address(&xsrc),
                    address(&xdst),
                    cols,
                    DELAY_NS,
                )
            };
            rt.wait_for_stream(&app).unwrap();
            let got = GemvAxpbySum::submit(
                &rt,
                &xdst,
                &rt.upload(&a).unwrap(),
                &rt.upload(&y).unwrap(),
                0.75,
                -1.5,
            )
            .unwrap()
            .wait()
            .unwrap();
            assert_gemv_axpby_sum_close(got, (&x, &a, &y), (0.75, -1.5), 1e-4, &what);
        }
        app.synchronize().unwrap();
    }

    eprintln!("[streams] the legacy default stream");
    {
        let n = 1023;
        let (q, p) = (distribution(n), distribution(n));
        let (qsrc, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
        let qdst = rt.upload(&vec![f32::NAN; n]).unwrap();
        // SAFETY: as above; the null stream is the legacy stream of pptm's (current) context.
        unsafe {
            delayed_copy(
                func,
                std::ptr::null_mut(),
                address(&qsrc),
                address(&qdst),
                n,
                DELAY_NS,
            );
            rt.wait_for_raw_stream(std::ptr::null_mut()).unwrap();
        }
        let got = KlComplexity::submit(&rt, &qdst, &pb)
            .unwrap()
            .wait()
            .unwrap();
        assert_kl_sum_close(got, &q, &p, "after the legacy stream");
    }

    // The application's stream waits on the GPU for an item. pptm's queue is held first by a point
    // on another stream, reached 30 ms from now, so the item completes well after the host has
    // enqueued the application's copy of its output: a copy that did not wait would copy poison.
    let item_then_copy = |round: &str| {
        let n = (1 << 20) + 3;
        let (q, p) = (distribution(n), distribution(n));
        let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
        let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
        let copied = rt.upload(&vec![f32::NAN; n]).unwrap();
        let (from, to) = (address(&out), address(&copied));
        let _synced = (SyncOnDrop(&app), SyncOnDrop(&held));
        // SAFETY: a zero-length copy after 30 ms touches no memory.
        unsafe { delayed_copy(func, held.cu_stream(), 0, 0, 0, 30_000_000) };
        rt.wait_for_stream(&held).unwrap();
        let t = KlTerms::submit(&rt, &qb, &pb, &mut out).unwrap();
        t.signal_stream(&app).unwrap();
        // SAFETY: n f32 each; both buffers outlive the synchronisation below.
        unsafe { delayed_copy(func, app.cu_stream(), from, to, n, 0) };
        app.synchronize().unwrap();
        t.wait().unwrap();
        kl_terms_close(
            &copied.to_vec().unwrap(),
            &q,
            &p,
            &format!("{round}: the application's copy of an item's output"),
        );
        held.synchronize().unwrap();
    };
    eprintln!("[streams] the application's stream waits on the GPU for an item");
    item_then_copy("first");

    eprintln!("[streams] a failed item releases the stream that waits for it");
    {
        let hang = rt.inject::<KlComplexity>(pptm::Injection::Hang).unwrap();
        let n = 1023;
        let (q, p) = (distribution(n), distribution(n));
        let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
        let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
        let t = KlTerms::submit(&rt, &qb, &pb, &mut out).unwrap();
        t.signal_stream(&app).unwrap();
        // Returns once the watchdog has failed the item (the test binary's watch limit turns a
        // stream left waiting into a failure).
        app.synchronize().unwrap();
        let e = t.wait().unwrap_err();
        assert!(matches!(e, Error::Hang { .. }), "{e:?}");
        assert!(matches!(hang.wait(), Err(Error::Hang { .. })));
    }
    eprintln!("[streams] after the manifold's relaunch");
    // The new manifold's signals continue from where the aborted one's line was raised to.
    item_then_copy("after a relaunch");

    eprintln!("[streams] a ticket already resolved and the CPU backend");
    let cpu = Runtime::cpu();
    let e = cpu.wait_for_stream(&app).unwrap_err();
    assert!(matches!(e, Error::ForeignStream { .. }), "{e:?}");
    let (q, p) = (distribution(7), distribution(7));
    let (qc, pc) = (cpu.upload(&q).unwrap(), cpu.upload(&p).unwrap());
    let t = KlComplexity::submit(&cpu, &qc, &pc).unwrap();
    t.signal_stream(&app).unwrap();
    assert_kl_sum_close(t.wait().unwrap(), &q, &p, "the CPU backend");

    eprintln!("[streams] GPU ping-pong against host round trips");
    {
        let reps = 2000;
        let noop = || rt.submit_noop::<KlComplexity>().unwrap();
        // SAFETY: a zero-length copy touches no memory.
        let kernel = || unsafe { delayed_copy(func, app.cu_stream(), 0, 0, 0, 0) };
        noop().wait().unwrap();
        // Microseconds a step of `step`, run `reps` times, then everything waited for; and how
        // long the host's calls took a step.
        let per_step = |step: &dyn Fn() -> Option<pptm::Ticket<'static, ()>>| {
            let started = Instant::now();
            let mut last = None;
            for _ in 0..reps {
                if let Some(t) = step() {
                    last = Some(t);
                }
            }
            let enqueued = started.elapsed().as_secs_f64() * 1e6 / reps as f64;
            app.synchronize().unwrap();
            if let Some(t) = last {
                t.wait().unwrap();
            }
            (
                started.elapsed().as_secs_f64() * 1e6 / reps as f64,
                enqueued,
            )
        };
        let figures = [
            (
                "application kernels alone, waited at the end",
                per_step(&|| {
                    kernel();
                    None
                }),
            ),
            (
                "no-op items alone, waited at the end",
                per_step(&|| Some(noop())),
            ),
            (
                "kernel -> item -> kernel with host round trips",
                per_step(&|| {
                    kernel();
                    app.synchronize().unwrap();
                    noop().wait().unwrap();
                    None
                }),
            ),
            (
                "kernel -> item ordered on the GPU (wait_for_stream)",
                per_step(&|| {
                    kernel();
                    rt.wait_for_stream(&app).unwrap();
                    Some(noop())
                }),
            ),
            (
                "item -> kernel ordered on the GPU (signal_stream)",
                per_step(&|| {
                    let t = noop();
                    t.signal_stream(&app).unwrap();
                    kernel();
                    Some(t)
                }),
            ),
            (
                "kernel -> item -> kernel ordered on the GPU (both)",
                per_step(&|| {
                    kernel();
                    rt.wait_for_stream(&app).unwrap();
                    let t = noop();
                    t.signal_stream(&app).unwrap();
                    Some(t)
                }),
            ),
        ];
        for (what, (step, host)) in figures {
            eprintln!(
                "ping-pong, {reps} steps: {what}: {step:.2} us a step (the host's calls {host:.2} us a step)"
            );
        }
    }
    drop(rt);
    // SAFETY: loaded above; no manifold is resident any more (the runtime is gone).
    ok("cuModuleUnload", unsafe { sys::cuModuleUnload(module) });
}

/// Runs `call` on a thread of its own, with pptm's context current there, and returns what it
/// returns, or panics if it has not returned within a minute (a driver call waiting for a kernel
/// that never ends).
fn returns_in_time<R: Send + 'static>(
    rt: &Runtime,
    what: &str,
    call: impl FnOnce() -> R + Send + 'static,
) -> (R, Duration) {
    let ctx = rt.cuda_context().unwrap() as usize;
    let (tx, rx) = std::sync::mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        // SAFETY: pptm's context, alive while the runtime lives (the test holds it).
        ok("cuCtxSetCurrent", unsafe {
            sys::cuCtxSetCurrent(ctx as sys::CUcontext)
        });
        let _ = tx.send(call());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(r) => (r, started.elapsed()),
        Err(_) => panic!("{what} beside an idle runtime did not return within 60 s"),
    }
}

/// Asserts the runtime parked since its count was `before` (the parker counts a park once the
/// drain is done, just after the kernels' exit lets the application's call return).
fn parked_since(rt: &Runtime, before: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while rt.parks() <= before {
        assert!(
            Instant::now() < deadline,
            "{what} returned, but the runtime did not park"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Submit to result of one KL item (its reference is checked apart, untimed): after parking,
/// what the relaunch costs the first item.
fn first_item(rt: &Runtime, i: &InFlight) -> Duration {
    let started = Instant::now();
    let got = KlComplexity::submit(rt, &i.qb, &i.pb)
        .unwrap()
        .wait()
        .unwrap();
    let took = started.elapsed();
    assert_kl_sum_close(got, &i.q, &i.p, "the first item after parking");
    took
}

#[test]
fn an_idle_runtime_parks_so_the_applications_blocking_calls_return() {
    let _one = one_at_a_time();
    let idle = Duration::from_millis(50);
    let Some(rt) = open_gpu(
        "an_idle_runtime_parks_so_the_applications_blocking_calls_return",
        Config {
            park_when_idle: Some(idle),
            ..Config::default()
        },
    ) else {
        return;
    };
    let ctx = rt.cuda_context().unwrap();
    // SAFETY: pptm's context is valid while `rt` lives.
    ok("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) });
    let items: Vec<InFlight> = [7usize, 1023, (1 << 20) + 3]
        .iter()
        .map(|&n| InFlight::new(&rt, n))
        .collect();
    let check_all = |what: &str| {
        let tickets: Vec<_> = items
            .iter()
            .map(|i| KlComplexity::submit(&rt, &i.qb, &i.pb).unwrap())
            .collect();
        for (t, i) in tickets.into_iter().zip(&items) {
            assert_kl_sum_close(t.wait().unwrap(), &i.q, &i.p, what);
        }
    };
    check_all("resident");
    assert!(rt.describe().contains("`inference`"), "{}", rt.describe());
    let parks = rt.parks();

    // With no quiesce: the module load waits for the manifold, which parks once the runtime has
    // been idle for 50 ms; then it returns.
    eprintln!("[park] the application's module load beside an idle manifold");
    let ((module, func), load_waited) = returns_in_time(&rt, "cuModuleLoadData", || {
        let mut module = std::ptr::null_mut();
        let mut func = std::ptr::null_mut();
        // SAFETY: valid out-pointers, a NUL-terminated PTX image, pptm's context current.
        unsafe {
            ok(
                "cuModuleLoadData",
                sys::cuModuleLoadData(&mut module, PTX.as_ptr().cast()),
            );
            ok(
                "cuModuleGetFunction",
                sys::cuModuleGetFunction(&mut func, module, c"store_seven".as_ptr()),
            );
        }
        (module as usize, func as usize)
    });
    parked_since(&rt, parks, "the module load");
    let relaunched = first_item(&rt, &items[0]);
    check_all("after parking for a module load");
    // Resident again. The references above take a while on a busy host, and 50 ms of idleness
    // parks the runtime once more: one small item (its reference is quick) brings the manifold
    // back first, so what follows starts from a resident runtime.
    let _ = first_item(&rt, &items[0]);
    assert!(rt.describe().contains("`inference`"), "{}", rt.describe());

    // The application's kernel and allocation beside the manifold (no parking needed), then
    // cuMemFree, which waits for every kernel: it returns once the runtime parks again.
    let mut mem: sys::CUdeviceptr = 0;
    let mut seven = 0u32;
    // SAFETY: a 4-byte allocation, the kernel's one pointer parameter, the legacy stream of the
    // current (pptm's) context.
    unsafe {
        ok("cuMemAlloc", sys::cuMemAlloc_v2(&mut mem, 4));
        let mut arg = mem;
        let mut params = [(&raw mut arg).cast::<std::ffi::c_void>()];
        ok(
            "cuLaunchKernel",
            sys::cuLaunchKernel(
                func as sys::CUfunction,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
        );
        ok(
            "cuStreamSynchronize",
            sys::cuStreamSynchronize(std::ptr::null_mut()),
        );
        ok(
            "cuMemcpyDtoH",
            sys::cuMemcpyDtoH_v2((&raw mut seven).cast(), mem, 4),
        );
    }
    assert_eq!(seven, 7);
    eprintln!("[park] cuMemFree and cuModuleUnload beside an idle manifold");
    let parks = rt.parks();
    let ((), free_waited) = returns_in_time(&rt, "cuMemFree", move || {
        // SAFETY: allocated above, freed once.
        ok("cuMemFree", unsafe { sys::cuMemFree_v2(mem) });
    });
    parked_since(&rt, parks, "cuMemFree");
    let relaunched_again = first_item(&rt, &items[0]);
    check_all("after parking for cuMemFree");
    let ((), _) = returns_in_time(&rt, "cuModuleUnload", move || {
        // SAFETY: loaded above, unloaded once.
        ok("cuModuleUnload", unsafe {
            sys::cuModuleUnload(module as sys::CUmodule)
        });
    });
    check_all("after the module's unload");

    // Two domains that fit differently on an SM (tensor: one block, for its shared memory;
    // inference: two) park and come back together, in an order the block scheduler can place.
    eprintln!("[park] two domains park and come back");
    rt.prepare_domains(&[KlComplexity::DOMAIN, MatmulBiasGeluBf16::DOMAIN])
        .unwrap();
    for round in 0..3 {
        Step::Tensor.run_and_check(&rt, round);
        Step::Inference.run_and_check(&rt, round);
        let parks = rt.parks();
        std::thread::sleep(idle * 3);
        parked_since(&rt, parks, "an idle wait");
    }
    Step::Tensor.run_and_check(&rt, 3);
    Step::Inference.run_and_check(&rt, 3);
    for d in ["inference", "tensor"] {
        assert!(
            rt.describe().contains(&format!("`{d}`")),
            "{d} did not come back: {}",
            rt.describe()
        );
    }
    eprintln!(
        "parking after {idle:?} idle: the module load returned after {:.1} ms, cuMemFree after {:.1} ms; \
         the first item after parking (n = 7, the relaunch included) took {:.2} ms after the module load, \
         {:.2} ms after cuMemFree",
        load_waited.as_secs_f64() * 1e3,
        free_waited.as_secs_f64() * 1e3,
        relaunched.as_secs_f64() * 1e3,
        relaunched_again.as_secs_f64() * 1e3
    );
}
