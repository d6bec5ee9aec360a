//! Shared by the integration tests: backends, random inputs, tolerances.
#![allow(dead_code)]

use std::sync::OnceLock;

pub mod crash;
#[macro_use]
pub mod gemv;
#[macro_use]
pub mod tensor;

use pptm::{Error, Runtime};
use rand::Rng;

/// Set on GPU hosts (`.device/run-tests` runs with it) so a missing GPU fails instead of skipping.
pub fn require_gpu() -> bool {
    std::env::var("PPTM_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// Opens a GPU runtime for `test`. Only an absent GPU (`Error::NoGpu`: no driver library, no
/// device) is a skip, printed and counted (the binary's total is printed when it exits), and
/// under `PPTM_REQUIRE_GPU=1` even that fails. A driver that is installed but fails to start, or
/// any other error, fails the test: a broken GPU must never read as a pass.
pub fn open_gpu(test: &str, config: pptm::Config) -> Option<Runtime> {
    init_logging();
    match Runtime::gpu_with(config) {
        Ok(rt) => Some(rt),
        Err(Error::NoGpu(why)) if !require_gpu() => {
            skip_because(test, &why);
            None
        }
        Err(e) => panic!("{test}: cannot open the GPU runtime: {e}"),
    }
}

/// GPU tests of this binary that skipped, and the first reason given.
static SKIPPED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static SKIP_REASON: OnceLock<String> = OnceLock::new();

/// Records a GPU test that could not run here: printed now (libtest shows it with
/// `--nocapture` or when the test fails) and counted in the line the binary prints at exit.
pub fn skip_because(test: &str, why: &str) {
    eprintln!("SKIPPED (no GPU: {why}): {test}");
    SKIPPED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut first = false;
    SKIP_REASON.get_or_init(|| {
        first = true;
        why.to_string()
    });
    if first {
        extern "C" fn report_skips() {
            let n = SKIPPED.load(std::sync::atomic::Ordering::Relaxed);
            let why = SKIP_REASON.get().map_or("", String::as_str);
            // After libtest's summary, outside its output capture: cargo test shows it.
            eprintln!(
                "pptm tests: {n} GPU test(s) of this binary SKIPPED, not run: no GPU ({why}); \
                 PPTM_REQUIRE_GPU=1 makes that a failure"
            );
        }
        unsafe extern "C" {
            fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
        }
        // SAFETY: registers a plain function with the C runtime; it runs once, at exit, and only
        // reads atomics and a OnceLock.
        unsafe { atexit(report_skips) };
    }
}

/// A random generator for the calling test. Each test thread draws from one generator, seeded
/// on first use from `PPTM_TEST_SEED` when set, else afresh, and the seed is printed then: a
/// failing test's output (libtest shows it) says how to replay its inputs, with
/// `PPTM_TEST_SEED=<seed> cargo test <its name>`. Each call hands out a generator of its own,
/// seeded from the thread's, so inputs depend only on the seed and the order of calls.
pub fn rng() -> rand::rngs::StdRng {
    use rand::SeedableRng;
    thread_local! {
        static THREAD_RNG: std::cell::RefCell<Option<rand::rngs::StdRng>> =
            const { std::cell::RefCell::new(None) };
    }
    THREAD_RNG.with(|cell| {
        let mut cell = cell.borrow_mut();
        let thread_rng = cell.get_or_insert_with(|| {
            let seed = match std::env::var("PPTM_TEST_SEED") {
                Ok(v) => v
                    .parse()
                    .unwrap_or_else(|_| panic!("PPTM_TEST_SEED={v:?} is not a u64")),
                Err(_) => rand::random(),
            };
            eprintln!(
                "random inputs of {}: seed {seed} (replay with PPTM_TEST_SEED={seed})",
                std::thread::current().name().unwrap_or("this test")
            );
            rand::rngs::StdRng::seed_from_u64(seed)
        });
        rand::rngs::StdRng::seed_from_u64(thread_rng.random())
    })
}

/// Logs from the runtime on stderr, filtered by RUST_LOG (default: warnings).
pub fn init_logging() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        crash::install_if_asked();
        let filter =
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// The GPU runtime shared by every GPU test of one test binary. A manifold is a whole-GPU
/// cooperative grid; one runtime per process keeps tests from competing for SMs.
pub fn gpu() -> Option<&'static Runtime> {
    init_logging();
    // tests/tensor_core.rs: its domain's blocks (one an SM, 226 KiB of shared memory on Hopper)
    // leave no room beside them, so its persistent runtime takes only part of the GPU and the
    // launched variants' kernels, run by the binary's other tests at the same time, get the rest.
    // tests/batched_matmul.rs and tests/precision_fp8.rs: the same (their domains take the Hopper
    // kernels too).
    let max_sms = matches!(
        env!("CARGO_CRATE_NAME"),
        "tensor_core" | "batched_matmul" | "precision_fp8" | "bf16x3"
    )
    .then_some(TENSOR_BINARY_SMS);
    GPU.get_or_init(|| {
        let rt = open_gpu(
            "the shared GPU runtime",
            pptm::Config {
                max_sms,
                ..Default::default()
            },
        )?;
        eprintln!("pptm tests: {}", rt.describe());
        shut_down_at_exit();
        Some(rt)
    })
    .as_ref()
}

static GPU: OnceLock<Option<Runtime>> = OnceLock::new();

/// SMs the persistent runtime of tests/tensor_core.rs, tests/batched_matmul.rs and
/// tests/precision_fp8.rs may use (half an H100's or H200's).
pub const TENSOR_BINARY_SMS: u32 = 64;

/// Statics are never dropped, so the shared runtime's manifolds would still be resident when the
/// process exits. The driver kills them then, but compute-sanitizer waits for every kernel to end
/// and would wait forever: with `PPTM_SHUTDOWN_AT_EXIT=1` (scripts/sanitize-gpu-suite sets it),
/// shut the runtime down from the C runtime's exit handlers instead. Off otherwise: nothing else
/// needs it. (It once hung the binaries whose runtime runs several domains: freeing the first
/// manifold's pinned rings waited for the others; the device now defers such frees, driver.rs.)
fn shut_down_at_exit() {
    if std::env::var("PPTM_SHUTDOWN_AT_EXIT").as_deref() != Ok("1") {
        return;
    }
    extern "C" fn at_exit() {
        if let Some(Some(rt)) = GPU.get() {
            eprintln!("pptm tests: at exit: shutting the shared runtime down");
            let started = std::time::Instant::now();
            match rt.shutdown() {
                Ok(()) => eprintln!("pptm tests: at exit: shut down in {:?}", started.elapsed()),
                Err(e) => eprintln!(
                    "pptm tests: at exit: shutdown failed after {:?}: {e}",
                    started.elapsed()
                ),
            }
        }
    }
    unsafe extern "C" {
        fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
    }
    // SAFETY: registers a plain function with the C runtime; it runs once, at exit, on a thread
    // that may call into the runtime like any other.
    unsafe { atexit(at_exit) };
}

/// GPU runtimes per test binary for the launched variants: the same fused code as one ordinary
/// kernel launch per item, and the unfused chain (one launch per stage).
pub fn gpu_variant(variant: pptm::Variant) -> Option<&'static Runtime> {
    static LAUNCHED: OnceLock<Option<Runtime>> = OnceLock::new();
    static UNFUSED: OnceLock<Option<Runtime>> = OnceLock::new();
    static UNFUSED_GRAPH: OnceLock<Option<Runtime>> = OnceLock::new();
    gpu()?;
    let cell = match variant {
        pptm::Variant::FusedLaunched => &LAUNCHED,
        pptm::Variant::Unfused => &UNFUSED,
        pptm::Variant::UnfusedGraph => &UNFUSED_GRAPH,
        pptm::Variant::Fused => return gpu(),
    };
    cell.get_or_init(|| {
        let rt = Runtime::gpu_with(pptm::Config {
            variant,
            ..Default::default()
        })
        .expect("a GPU runtime opened before");
        eprintln!("pptm tests: {}", rt.describe());
        Some(rt)
    })
    .as_ref()
}

/// A test's item count: the value of the environment variable `var` when set (the sanitizer
/// script shrinks long item loops this way: under compute-sanitizer an item takes milliseconds),
/// otherwise `default`.
pub fn count_from_env(var: &str, default: usize) -> usize {
    match std::env::var(var) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{var}={v:?} is not a count")),
        Err(_) => default,
    }
}

/// A GPU test whose runtime did not open (the reason was printed when it was tried).
pub fn skip(test: &str) {
    skip_because(test, "the GPU runtime did not open");
}

/// Instantiates each named test body (`fn(&Runtime)`) once per backend and variant: `cpu::name`,
/// `gpu::name` (fused, persistent), `gpu_launched::name` (fused, one launch per item),
/// `gpu_unfused::name` (one launch per stage), `gpu_unfused_graph::name` (those launches replayed
/// from a CUDA graph).
#[allow(unused_macros)]
macro_rules! on_every_backend {
    ($($test:ident),* $(,)?) => {
        mod cpu {
            $(
                #[test]
                fn $test() {
                    let rt = pptm::Runtime::cpu();
                    super::$test(&rt);
                }
            )*
        }
        mod gpu {
            $(
                #[test]
                fn $test() {
                    match crate::common::gpu() {
                        Some(rt) => super::$test(rt),
                        None => crate::common::skip(concat!(module_path!(), "::", stringify!($test))),
                    }
                }
            )*
        }
        mod gpu_launched {
            $(
                #[test]
                fn $test() {
                    match crate::common::gpu_variant(pptm::Variant::FusedLaunched) {
                        Some(rt) => super::$test(rt),
                        None => crate::common::skip(concat!(module_path!(), "::", stringify!($test))),
                    }
                }
            )*
        }
        mod gpu_unfused {
            $(
                #[test]
                fn $test() {
                    match crate::common::gpu_variant(pptm::Variant::Unfused) {
                        Some(rt) => super::$test(rt),
                        None => crate::common::skip(concat!(module_path!(), "::", stringify!($test))),
                    }
                }
            )*
        }
        mod gpu_unfused_graph {
            $(
                #[test]
                fn $test() {
                    match crate::common::gpu_variant(pptm::Variant::UnfusedGraph) {
                        Some(rt) => super::$test(rt),
                        None => crate::common::skip(concat!(module_path!(), "::", stringify!($test))),
                    }
                }
            )*
        }
    };
}

/// `n` values uniform in [lo, hi), fresh each call.
pub fn uniform(n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut rng = rng();
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// The exact GELU, x/2 (1 + erf(x / sqrt 2)), in f64.
pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// `n` values uniform in (0, 1], fresh each call.
pub fn positive(n: usize) -> Vec<f32> {
    let mut rng = rng();
    (0..n).map(|_| 1.0 - rng.random::<f32>()).collect()
}

/// Sets about one element in `every` to exactly 0.
pub fn sprinkle_zeros(v: &mut [f32], every: usize) {
    let mut rng = rng();
    for x in v.iter_mut() {
        if rng.random_range(0..every) == 0 {
            *x = 0.0;
        }
    }
}

/// The KL divergence in f64, written independently of the op catalog.
pub fn kl_reference(q: &[f32], p: &[f32]) -> f64 {
    q.iter().zip(p).map(|(&q, &p)| kl_term(q, p)).sum()
}

pub fn kl_term(q: f32, p: f32) -> f64 {
    let (q, p) = (f64::from(q), f64::from(p));
    if q == 0.0 {
        0.0
    } else {
        q * q.ln() - q * p.ln()
    }
}

/// Asserts a KL sum is within REL_TOL of its f64 reference, beyond what rounding each term to f32
/// cannot avoid. Random terms have both signs, and a few of them can nearly cancel (seven terms of
/// about 0.3 summed to -0.0013 once, 300 times smaller than the terms): then the reference's
/// relative bar asks each term for less than f32 rounding, which no f32 kernel meets. Each term's
/// own error is bounded by 2^-22 (q + |term|) (the log's absolute error, about 2^-22, times q,
/// and the term's rounding), so the allowance is that bound summed; the terms themselves are held
/// to REL_TOL of their own value elsewhere (kl_chain.rs, kl_terms_of_nearly_equal_q_and_p).
pub fn assert_kl_sum_close(got: f32, q: &[f32], p: &[f32], what: impl std::fmt::Display) {
    assert_kl_total_close(got, q, p, 1.0, what);
}

/// As [`assert_kl_sum_close`], for the mean of the terms (the sum and its allowance over n).
pub fn assert_kl_mean_close(got: f32, q: &[f32], p: &[f32], what: impl std::fmt::Display) {
    assert_kl_total_close(got, q, p, q.len() as f64, what);
}

fn assert_kl_total_close(got: f32, q: &[f32], p: &[f32], n: f64, what: impl std::fmt::Display) {
    let want = kl_reference(q, p) / n;
    let rounding: f64 = q
        .iter()
        .zip(p)
        .map(|(&qi, &pi)| (f64::from(qi).abs() + kl_term(qi, pi).abs()) * 2f64.powi(-22))
        .sum::<f64>()
        / n;
    let err = (f64::from(got) - want).abs();
    assert!(
        err <= REL_TOL * want.abs() + rounding,
        "{what}: got {got}, f64 reference {want}, error {err:e} (allowed: {REL_TOL:e} of it, plus \
         {rounding:e} for the terms' f32 rounding)"
    );
}

/// What a wall-clock bound in a test allows beyond the deadline the runtime was configured with:
/// a loaded machine (CI, a busy GPU host) can deschedule the watchdog or the waiting thread for
/// a while. A bound of "deadline + margin" still fails a watchdog that does not fire or a launch
/// that waits forever; the measured figure is printed for anyone who wants the real latency.
pub const SCHEDULING_MARGIN: std::time::Duration = std::time::Duration::from_secs(5);

/// The relative error every chain result must meet against its f64 reference.
pub const REL_TOL: f64 = 1e-5;

/// Asserts a chain's f32 result is within REL_TOL of the f64 reference; `what` names the case.
pub fn assert_close(got: f32, want: f64, what: impl std::fmt::Display) {
    let err = rel_err(f64::from(got), want);
    assert!(
        err < REL_TOL,
        "{what}: got {got}, f64 reference {want}, relative error {err:e}"
    );
}

/// |got − want| / |want|, or |got| when want is 0.
pub fn rel_err(got: f64, want: f64) -> f64 {
    if want == 0.0 {
        got.abs()
    } else {
        (got - want).abs() / want.abs()
    }
}

// ---------------------------------------------------------------------------------------------
// f64 references written here, independently of the op catalog and of the CPU backend (which
// runs the catalog's own f64 code): a test that compared with those would compare pptm with
// itself.

/// ψ(x) for x > 0: recurrence up to x >= 20, then the asymptotic series (terms to x^-6, below
/// 2e-13 there). Not `pptm_spec::ops::digamma`, which the CPU backend runs.
pub fn digamma(x: f64) -> f64 {
    assert!(x > 0.0, "digamma reference: x = {x} is not positive");
    let (mut x, mut acc) = (x, 0.0);
    while x < 20.0 {
        acc -= 1.0 / x;
        x += 1.0;
    }
    let r = 1.0 / (x * x);
    acc + x.ln() - 0.5 / x - r * (1.0 / 12.0 - r * (1.0 / 120.0 - r / 252.0))
}

/// Chebyshev distance between rows i and j of the n×d matrix `x`, taken as f32 differences (what
/// the chains promise).
pub fn cheb(x: &[f32], d: usize, i: usize, j: usize) -> f64 {
    (0..d)
        .map(|c| f64::from((x[i * d + c] - x[j * d + c]).abs()))
        .fold(0.0, f64::max)
}

/// For each k in `ks`, every point's k-th smallest distance to the others (ties counted once
/// each; each row is sorted once for all the k).
pub fn kth_reference(x: &[f32], n: usize, d: usize, ks: &[u32]) -> Vec<Vec<f64>> {
    let mut out = vec![Vec::with_capacity(n); ks.len()];
    let mut row = Vec::with_capacity(n);
    for i in 0..n {
        row.clear();
        row.extend((0..n).filter(|&j| j != i).map(|j| cheb(x, d, i, j)));
        row.sort_unstable_by(f64::total_cmp);
        for (o, &k) in out.iter_mut().zip(ks) {
            o.push(row.get(k as usize - 1).copied().unwrap_or(f64::NAN));
        }
    }
    out
}

/// `Σ_i z_i²` with `z = α A x + β y` (A: m×n) in f64, and the magnitude its f32 error is judged
/// on: `Σ_i |z_i| (|α| Σ_j |A_ij x_j| + |β y_i|)`. The sum of squares cannot cancel, but each z_i
/// can (α (A x)_i near −β y_i), and then a relative bar on the sum asks the row for less than
/// f32 rounding of its terms; with nothing cancelling the two bars are the same.
pub fn gemv_axpby_sum_reference(
    x: &[f32],
    a: &[f32],
    y: &[f32],
    alpha: f32,
    beta: f32,
) -> (f64, f64) {
    let n = x.len();
    let (mut sum, mut magnitude) = (0.0f64, 0.0f64);
    for (i, &yi) in y.iter().enumerate() {
        let row = &a[i * n..(i + 1) * n];
        let ax: f64 = row
            .iter()
            .zip(x)
            .map(|(&a, &x)| f64::from(a) * f64::from(x))
            .sum();
        let scale: f64 = row
            .iter()
            .zip(x)
            .map(|(&a, &x)| (f64::from(a) * f64::from(x)).abs())
            .sum();
        let by = f64::from(beta) * f64::from(yi);
        let z = f64::from(alpha) * ax + by;
        sum += z * z;
        magnitude += z.abs() * (f64::from(alpha).abs() * scale + by.abs());
    }
    (sum, magnitude)
}

/// Asserts a GemvAxpbySum result is within `tol` of its terms' magnitude of the f64 reference.
pub fn assert_gemv_axpby_sum_close(
    got: f32,
    (x, a, y): (&[f32], &[f32], &[f32]),
    (alpha, beta): (f32, f32),
    tol: f64,
    what: impl std::fmt::Display,
) {
    let (want, magnitude) = gemv_axpby_sum_reference(x, a, y, alpha, beta);
    let err = (f64::from(got) - want).abs();
    assert!(
        err <= tol * magnitude,
        "{what}: got {got}, f64 reference {want}, error {err:e}, allowed {tol:e} of the terms' \
         magnitude {magnitude:e}"
    );
}
