//! What a user would otherwise run for matmul + bias + GELU with bf16 operands: cuBLAS and
//! cuBLASLt on the same GPU, in the same process, timed like every other variant.
//!
//! Chain `matmul_bias_gelu_bf16`: A m×k and W k×n row-major bf16, b n f32,
//! out[i,j] = gelu(Σ_p A[i,p] W[p,j] + b[j]) as f32, m×n row-major. Three variants:
//! * [`GEMM`]: `cublasGemmEx`, bf16 × bf16 → f32 (CUBLAS_COMPUTE_32F), no bias, no GELU;
//! * [`LAUNCHES`]: the same GEMM, then a bias-add launch and an exact-GELU launch
//!   (x/2 (1 + erf(x/√2))) on the f32 output, one stream;
//! * [`LT_EPILOGUE`]: `cublasLtMatmul` with `CUBLASLT_EPILOGUE_GELU_BIAS` (f32 bias, the output's
//!   type). cuBLASLt's GELU is the tanh approximation, so this variant is checked against a tanh
//!   reference; the other two against erf (or against the bare product, for the GEMM alone).
//!
//! Inputs (the bench's counter-based generator, `cases::uniform`): A = bf16(u22 − 0.5),
//! W = bf16(u23 − 0.5), b = u24 − 0.5 in f32, with uN the stream of seed N and bf16(·) rounding
//! to nearest even. The reference is f64 over the bf16-rounded values, at 64 sampled elements plus
//! two corners; relative error bar 1e-2 of max(|ref|, Σ_p |A[i,p] W[p,j]| + |b[j]|).
//!
//! Row-major through column-major cuBLAS: the m×n row-major output is the n×m column-major matrix
//! outᵀ = Wᵀ Aᵀ, and row-major W (k×n) and A (m×k) are, as stored, the column-major Wᵀ (n×k) and
//! Aᵀ (k×m). So cuBLAS computes C = op(A)·op(B) with no transposes, its A operand our W, its B
//! our A: [`ColMajorGemm::for_row_major`]. cuBLASLt's bias has one value per row of its D (n
//! rows), i.e. per column j of our output: b[j], as wanted.
//!
//! Every CUDA library is loaded at run time (cudarc's dynamic loading panics on a missing library
//! or symbol), so each is probed first: a missing one, any CUDA error, a wrong result or even a
//! panic in the bindings is a refusal with its reason, never a crash and never a silent skip.
//! Nothing here may run while a pptm runtime is alive (a resident manifold holds SMs, and loading
//! cuBLAS's kernels could wait for it): main.rs calls [`run`] between the dispatch floors and the
//! first chain, when no runtime exists. All work goes to a stream of our own, never the legacy
//! default stream.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use cudarc::cublas;
use cudarc::cublaslt;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PushKernelArg, sys as cu,
};
use cudarc::nvrtc;
use half::bf16;

use crate::cases::{self, Expect, Got};
use crate::record::Measurement;
use crate::{Budget, Collector};

/// The chains' names in results (those of pptm's cases, `cases::CHAINS`): one product, and a
/// batch of products of one shape (`cublasGemmStridedBatchedEx`, or cuBLASLt with strided batch
/// layouts; the bias is shared by every product).
pub const CHAIN: &str = "matmul_bias_gelu_bf16";
pub const BATCHED_CHAIN: &str = "batched_matmul_bias_gelu_bf16";

/// The variants, as named in results.
pub const GEMM: &str = "cuBLAS bf16 GEMM alone (no bias, no GELU)";
pub const LAUNCHES: &str = "cuBLAS GEMM + bias launch + erf-GELU launch";
pub const LT_EPILOGUE: &str = "cuBLASLt GEMM, fused bias+GELU epilogue (tanh GELU)";

/// (chain, size, batch, m, k, n): pptm's cases of the same names (bench/src/cases.rs).
const SIZES: [(&str, &str, usize, usize, usize, usize); 6] = [
    (CHAIN, "small", 1, 64, 256, 256),
    (CHAIN, "medium", 1, 1024, 1024, 1024),
    (CHAIN, "large", 1, 8192, 8192, 8192),
    (BATCHED_CHAIN, "small", 128, 64, 64, 64),
    (BATCHED_CHAIN, "medium", 256, 128, 128, 128),
    (BATCHED_CHAIN, "large", 64, 512, 512, 512),
];

/// Input stream seeds: those of pptm's own matmul_bias_gelu_bf16 case.
const SEED_A: u64 = cases::seed::MM16_A;
const SEED_W: u64 = cases::seed::MM16_W;
const SEED_B: u64 = cases::seed::MM16_B;

/// The relative error a variant must stay under (bf16 products, f32 accumulation).
const BAR: f64 = 1e-2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Gemm,
    Launches,
    LtEpilogue,
}

const VARIANTS: [Variant; 3] = [Variant::Gemm, Variant::Launches, Variant::LtEpilogue];

/// What follows the product, per variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activation {
    /// The bare product: no bias, no GELU.
    None,
    /// gelu(x + b) = (x + b)/2 (1 + erf((x + b)/√2)).
    GeluErf,
    /// gelu(x + b) with the tanh approximation, as cuBLASLt computes it.
    GeluTanh,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Gemm => GEMM,
            Variant::Launches => LAUNCHES,
            Variant::LtEpilogue => LT_EPILOGUE,
        }
    }

    fn activation(self) -> Activation {
        match self {
            Variant::Gemm => Activation::None,
            Variant::Launches => Activation::GeluErf,
            Variant::LtEpilogue => Activation::GeluTanh,
        }
    }

    /// Why this variant cannot run with the libraries present, if it cannot.
    fn missing(self, libs: &Libraries) -> Option<String> {
        let mut need = vec![("the CUDA driver (libcuda.so)", libs.driver)];
        match self {
            Variant::Gemm => need.push(("cuBLAS (libcublas.so)", libs.cublas)),
            Variant::Launches => {
                need.push(("cuBLAS (libcublas.so)", libs.cublas));
                need.push(("NVRTC (libnvrtc.so)", libs.nvrtc));
            }
            Variant::LtEpilogue => need.push(("cuBLASLt (libcublasLt.so)", libs.cublaslt)),
        }
        let absent: Vec<&str> = need
            .into_iter()
            .filter(|(_, present)| !present)
            .map(|(name, _)| name)
            .collect();
        (!absent.is_empty()).then(|| {
            format!(
                "{} not found by the dynamic loader (install, or add the directory to \
                 LD_LIBRARY_PATH)",
                absent.join(", ")
            )
        })
    }
}

/// Which of the run-time-loaded libraries the dynamic loader finds.
#[derive(Debug, Clone, Copy)]
struct Libraries {
    driver: bool,
    cublas: bool,
    cublaslt: bool,
    nvrtc: bool,
}

impl Libraries {
    fn probe() -> Libraries {
        // SAFETY: each probe only tries to open the library (dlopen), calling nothing in it.
        unsafe {
            Libraries {
                driver: cu::is_culib_present(),
                cublas: cublas::sys::is_culib_present(),
                cublaslt: cublaslt::sys::is_culib_present(),
                nvrtc: nvrtc::sys::is_culib_present(),
            }
        }
    }
}

/// How many measurements [`run`] makes for the (chain, size) pairs `wants` accepts (for the
/// progress bar).
pub fn count(wants: impl Fn(&str, &str) -> bool) -> usize {
    SIZES.iter().filter(|(c, s, ..)| wants(c, s)).count() * VARIANTS.len()
}

/// Measures every variant at every size `wants` accepts, reporting each to `out` as a
/// measurement or a refusal. Must run while no pptm runtime exists in the process.
pub fn run(wants: impl Fn(&str, &str) -> bool, budget: &Budget, out: &mut Collector) {
    let sizes: Vec<(&str, &str, usize, usize, usize, usize)> =
        SIZES.into_iter().filter(|(c, s, ..)| wants(c, s)).collect();
    if sizes.is_empty() {
        return;
    }
    let libs = Libraries::probe();
    let refuse_all = |out: &mut Collector, why: &dyn Fn(Variant) -> String| {
        for &(chain, size, ..) in &sizes {
            for v in VARIANTS {
                out.refuse(chain, size, v.name(), why(v));
                out.progress.inc(1);
            }
        }
    };
    if !libs.driver {
        refuse_all(out, &|v| v.missing(&libs).unwrap_or_default());
        return;
    }
    out.progress.set_message("cuBLAS: context, handles, NVRTC");
    let gpu = match catching(|| Gpu::open(&libs)) {
        Ok(gpu) => gpu,
        Err(e) => {
            refuse_all(out, &|_| format!("CUDA setup failed: {e}"));
            return;
        }
    };
    out.say(gpu.describe());
    for (chain, size, batch, m, k, n) in sizes {
        out.progress.set_message(format!("{chain} {size}: inputs"));
        let problem = Problem::batched(chain, batch, m, k, n);
        let prepared = catching(|| Prepared::new(&gpu, &problem));
        for v in VARIANTS {
            out.progress
                .set_message(format!("{chain} {size} {}", v.name()));
            let attempt = match (&prepared, v.missing(&libs)) {
                (_, Some(why)) => Err(why),
                (Err(e), _) => Err(format!("preparing the inputs failed: {e}")),
                (Ok(p), None) => catching(|| measure(&gpu, p, &problem, v, size, budget)),
            };
            match attempt {
                Ok(m) => out.report(m),
                Err(reason) => {
                    out.refuse(chain, size, v.name(), reason);
                    out.progress.inc(1);
                }
            }
        }
        drop(prepared);
        if let Err(e) = gpu.stream.synchronize() {
            out.say(format!(
                "{chain} {size}: stream synchronisation failed: {e}"
            ));
        }
    }
}

/// Runs `f`, turning a panic (a library or symbol the bindings could not load, an `unwrap` in
/// them) into an error.
pub(crate) fn catching<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let msg = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "(no message)".into());
        Err(format!("panicked in the CUDA bindings: {msg}"))
    })
}

/// cuBLAS's column-major C = op(A)·op(B) (no transposes) that computes the row-major
/// out = A·W: cuBLAS's A operand is our W, its B operand our A, its C our output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ColMajorGemm {
    /// cuBLAS's m: rows of its A and C (= our n). Also the length of cuBLASLt's bias vector.
    rows: usize,
    /// cuBLAS's n: columns of its B and C (= our m).
    cols: usize,
    /// cuBLAS's k: the shared dimension (= our k).
    inner: usize,
    /// Leading dimensions of cuBLAS's A (our W), B (our A) and C (our output).
    lda: usize,
    ldb: usize,
    ldc: usize,
    /// Products, and the elements from one product's A (our W), B (our A) and C to the next's.
    batch: usize,
    stride_a: usize,
    stride_b: usize,
    stride_c: usize,
}

impl ColMajorGemm {
    /// For out[s] (m×n) = A[s] (m×k) · W[s] (k×n), s < batch, everything row-major, densely
    /// packed, each product's matrices after the previous one's.
    fn for_row_major(batch: usize, m: usize, k: usize, n: usize) -> ColMajorGemm {
        ColMajorGemm {
            rows: n,
            cols: m,
            inner: k,
            lda: n,
            ldb: k,
            ldc: n,
            batch,
            stride_a: k * n,
            stride_b: m * k,
            stride_c: m * n,
        }
    }

    fn int(v: usize) -> Result<i32, String> {
        i32::try_from(v).map_err(|_| format!("dimension {v} does not fit cuBLAS's int"))
    }
}

/// One shape's inputs on the host (bf16 as bits) and the reference at the sampled elements:
/// `batch` products stacked (one product: batch 1).
struct Problem {
    chain: &'static str,
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    a: Vec<u16>,
    w: Vec<u16>,
    b: Vec<f32>,
}

impl Problem {
    #[cfg(test)]
    fn new(m: usize, k: usize, n: usize) -> Problem {
        Problem::batched(CHAIN, 1, m, k, n)
    }

    fn batched(chain: &'static str, batch: usize, m: usize, k: usize, n: usize) -> Problem {
        // The same operands as pptm's case (cases::centred_bf16), as raw bits for the upload.
        let bits = |v: Vec<bf16>| -> Vec<u16> { v.into_iter().map(bf16::to_bits).collect() };
        Problem {
            chain,
            batch,
            m,
            k,
            n,
            a: bits(cases::centred_bf16(SEED_A, batch * m * k)),
            w: bits(cases::centred_bf16(SEED_W, batch * k * n)),
            b: cases::centred(SEED_B, n),
        }
    }

    fn shape(&self) -> String {
        cases::matmul_shape(self.batch, self.m, self.k, self.n)
    }

    /// 2 batch m n k: the products' multiply-adds.
    fn flops(&self) -> f64 {
        2.0 * (self.batch * self.m * self.n * self.k) as f64
    }

    /// Bytes the chain must move: A and W in bf16, b and the output in f32.
    fn bytes(&self) -> f64 {
        (2 * self.batch * (self.m * self.k + self.k * self.n)
            + 4 * (self.n + self.batch * self.m * self.n)) as f64
    }

    /// out[i,j] (i a row of the stacked output) in f64 from the bf16-rounded inputs, and the
    /// scale its error is judged against.
    fn reference(&self, i: usize, j: usize, act: Activation) -> (f64, f64) {
        let (mut dot, mut abs) = (0.0f64, 0.0f64);
        // Row i is row i % m of product i / m, whose W starts at row (i / m) k of the stack.
        let w0 = i / self.m * self.k;
        for p in 0..self.k {
            let t = bf16::from_bits(self.a[i * self.k + p]).to_f64()
                * bf16::from_bits(self.w[(w0 + p) * self.n + j]).to_f64();
            dot += t;
            abs += t.abs();
        }
        let b = f64::from(self.b[j]);
        match act {
            Activation::None => (dot, abs),
            Activation::GeluErf => (gelu_erf(dot + b), abs + b.abs()),
            Activation::GeluTanh => (gelu_tanh(dot + b), abs + b.abs()),
        }
    }

    fn expect(&self, act: Activation) -> Expect {
        let at = sample_points(self.batch * self.m, self.n)
            .into_iter()
            .map(|(i, j)| {
                let (value, scale) = self.reference(i, j, act);
                (i * self.n + j, value, scale)
            })
            .collect();
        Expect::Elements { at, exact: false }
    }
}

fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn gelu_tanh(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044_715 * x * x * x)).tanh())
}

/// (row, column) pairs to check: 64 spread over rows and columns independently (so a transposed
/// or mis-strided result cannot hide in one column), and the two corners.
fn sample_points(m: usize, n: usize) -> Vec<(usize, usize)> {
    let mut at = vec![(0, 0), (m - 1, n - 1)];
    for s in 0..64usize {
        // An odd multiplier walks every row of a power-of-two m; the quadratic term scatters
        // the columns.
        let i = s.wrapping_mul(2_654_435_761) % m;
        let j = (s * 40_503 + s * s * 13 + 1) % n;
        at.push((i, j));
    }
    at.sort_unstable();
    at.dedup();
    at
}

/// The elementwise stages of [`LAUNCHES`], compiled at run time by NVRTC: 256-thread blocks,
/// grid-stride loops, in place on the row-major m×n f32 output (n columns).
const ELEMENTWISE_SRC: &str = r#"
extern "C" __global__ void pptm_bench_bias_add(float* out, const float* bias,
                                               unsigned int len, unsigned int n) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < len;
         i += gridDim.x * blockDim.x) {
        out[i] += bias[i % n];
    }
}

extern "C" __global__ void pptm_bench_gelu_erf(float* out, unsigned int len) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < len;
         i += gridDim.x * blockDim.x) {
        float x = out[i];
        out[i] = 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
    }
}
"#;

const BLOCK: u32 = 256;

/// The device's primary context, our stream, and whatever of cuBLAS, cuBLASLt and the NVRTC
/// kernels could be set up (each `Err` says why not).
struct Gpu {
    // Fields drop in order: the handles and kernels before the stream and context they use.
    blas: Result<Blas, String>,
    lt: Result<Lt, String>,
    kernels: Result<Kernels, String>,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    name: String,
    cc: (i32, i32),
    sm_count: u32,
}

pub(crate) fn drv(call: &str) -> impl Fn(cudarc::driver::DriverError) -> String + '_ {
    move |e| format!("{call}: {e:?}")
}

fn blas_err(call: &str) -> impl Fn(cublas::result::CublasError) -> String + '_ {
    move |e| format!("{call}: {:?}", e.0)
}

fn lt_err(call: &str) -> impl Fn(cublaslt::result::CublasError) -> String + '_ {
    move |e| format!("{call}: {:?}", e.0)
}

impl Gpu {
    fn open(libs: &Libraries) -> Result<Gpu, String> {
        let ctx = CudaContext::new(0).map_err(drv("CudaContext::new(0) (primary context)"))?;
        // SAFETY: everything here runs on one stream, one item at a time, and every buffer is
        // freed on that same stream, so cudarc's cross-stream event tracking is not needed (and
        // would add event records to every launch inside the timed region).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        let name = ctx.name().map_err(drv("cuDeviceGetName"))?;
        let cc = ctx
            .compute_capability()
            .map_err(drv("compute capability"))?;
        let sm_count =
            ctx.attribute(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(drv("cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)"))? as u32;
        let blas = if libs.cublas {
            catching(|| Blas::new(&stream))
        } else {
            Err("cuBLAS not found".into())
        };
        let lt = if libs.cublaslt {
            catching(|| Lt::new(&stream, cc))
        } else {
            Err("cuBLASLt not found".into())
        };
        let kernels = if libs.nvrtc {
            catching(|| Kernels::new(&ctx, cc))
        } else {
            Err("NVRTC not found".into())
        };
        Ok(Gpu {
            blas,
            lt,
            kernels,
            stream,
            ctx,
            name,
            cc,
            sm_count,
        })
    }

    fn describe(&self) -> String {
        let status = |r: Result<String, &String>| r.unwrap_or_else(|e| format!("unavailable: {e}"));
        format!(
            "{CHAIN}: {} (sm_{}{}, {} SMs); cuBLAS {}; cuBLASLt {}; elementwise kernels {}",
            self.name,
            self.cc.0,
            self.cc.1,
            self.sm_count,
            status(self.blas.as_ref().map(|b| b.version.to_string())),
            status(self.lt.as_ref().map(|l| l.version.to_string())),
            status(self.kernels.as_ref().map(|k| k.compiled.clone())),
        )
    }
}

/// Checks that a library exports every symbol in `names` (cudarc would panic at the first call of
/// a missing one); `exported` looks one up.
fn has_symbols(names: &[&str], exported: impl Fn(&str) -> bool) -> Result<(), String> {
    let missing: Vec<&str> = names.iter().copied().filter(|n| !exported(n)).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("the library lacks {}", missing.join(", ")))
    }
}

/// A cuBLAS handle bound to our stream.
struct Blas {
    handle: cublas::sys::cublasHandle_t,
    stream: Arc<CudaStream>,
    version: i32,
}

impl Blas {
    fn new(stream: &Arc<CudaStream>) -> Result<Blas, String> {
        // SAFETY: the library is present (probed by the caller); culib only opens it.
        let lib = unsafe { cublas::sys::culib() };
        has_symbols(
            &[
                "cublasCreate_v2",
                "cublasDestroy_v2",
                "cublasSetStream_v2",
                "cublasGetVersion_v2",
                "cublasGemmEx",
                "cublasGemmStridedBatchedEx",
            ],
            // SAFETY: looks the symbol up (dlsym) without calling it or reading through it.
            |name| unsafe { lib.get::<unsafe extern "C" fn()>(name) }.is_ok(),
        )?;
        stream
            .context()
            .bind_to_thread()
            .map_err(drv("cuCtxSetCurrent"))?;
        let handle = cublas::result::create_handle().map_err(blas_err("cublasCreate"))?;
        let mut blas = Blas {
            handle,
            stream: stream.clone(),
            version: 0,
        };
        // SAFETY: the handle was just created; the stream belongs to the current context and
        // outlives the handle (the handle holds an Arc of it).
        unsafe { cublas::result::set_stream(blas.handle, stream.cu_stream() as _) }
            .map_err(blas_err("cublasSetStream"))?;
        // SAFETY: a valid handle and a pointer to a live int.
        unsafe { cublas::sys::cublasGetVersion_v2(blas.handle, &mut blas.version) }
            .result()
            .map_err(blas_err("cublasGetVersion"))?;
        Ok(blas)
    }

    /// Enqueues out = A·W (f32) on the stream: one product by `cublasGemmEx`, a batch by
    /// `cublasGemmStridedBatchedEx`.
    fn gemm(&self, g: &ColMajorGemm, p: &Prepared) -> Result<(), String> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let int = ColMajorGemm::int;
        if g.batch > 1 {
            let stride = |v: usize| v as std::ffi::c_longlong;
            // SAFETY: as for one product below, with `batch` products of those sizes `stride_*`
            // elements apart in each buffer (`Prepared::new` allocates batch times as much).
            return unsafe {
                cublas::result::gemm_strided_batched_ex(
                    self.handle,
                    cublas::sys::cublasOperation_t::CUBLAS_OP_N,
                    cublas::sys::cublasOperation_t::CUBLAS_OP_N,
                    int(g.rows)?,
                    int(g.cols)?,
                    int(g.inner)?,
                    (&alpha as *const f32).cast(),
                    p.w_ptr as *const c_void,
                    cublas::sys::cudaDataType::CUDA_R_16BF,
                    int(g.lda)?,
                    stride(g.stride_a),
                    p.a_ptr as *const c_void,
                    cublas::sys::cudaDataType::CUDA_R_16BF,
                    int(g.ldb)?,
                    stride(g.stride_b),
                    (&beta as *const f32).cast(),
                    p.out_ptr as *mut c_void,
                    cublas::sys::cudaDataType::CUDA_R_32F,
                    int(g.ldc)?,
                    stride(g.stride_c),
                    int(g.batch)?,
                    cublas::sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublas::sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(blas_err("cublasGemmStridedBatchedEx"));
        }
        // SAFETY: the pointers are live device allocations of the sizes `g` describes (our W is
        // rows×inner with ld rows, our A inner×cols with ld inner, the output rows×cols with ld
        // rows, see `Prepared::new`); alpha and beta are host f32 (the default pointer mode),
        // alive for the call; the handle is valid and bound to our stream.
        unsafe {
            cublas::result::gemm_ex(
                self.handle,
                cublas::sys::cublasOperation_t::CUBLAS_OP_N,
                cublas::sys::cublasOperation_t::CUBLAS_OP_N,
                int(g.rows)?,
                int(g.cols)?,
                int(g.inner)?,
                (&alpha as *const f32).cast(),
                p.w_ptr as *const c_void,
                cublas::sys::cudaDataType::CUDA_R_16BF,
                int(g.lda)?,
                p.a_ptr as *const c_void,
                cublas::sys::cudaDataType::CUDA_R_16BF,
                int(g.ldb)?,
                (&beta as *const f32).cast(),
                p.out_ptr as *mut c_void,
                cublas::sys::cudaDataType::CUDA_R_32F,
                int(g.ldc)?,
                cublas::sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublas::sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(blas_err("cublasGemmEx"))
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: created in `new`, destroyed once, nothing uses it after this.
        let _ = unsafe { cublas::result::destroy_handle(self.handle) };
    }
}

/// A cuBLASLt handle and its workspace (32 MiB on Hopper and newer, 4 MiB before, as NVIDIA
/// recommends).
struct Lt {
    handle: cublaslt::sys::cublasLtHandle_t,
    stream: Arc<CudaStream>,
    workspace: CudaSlice<u8>,
    workspace_ptr: u64,
    version: usize,
}

impl Lt {
    fn new(stream: &Arc<CudaStream>, cc: (i32, i32)) -> Result<Lt, String> {
        // SAFETY: the library is present (probed by the caller); culib only opens it.
        let lib = unsafe { cublaslt::sys::culib() };
        has_symbols(
            &[
                "cublasLtCreate",
                "cublasLtDestroy",
                "cublasLtGetVersion",
                "cublasLtMatmulDescCreate",
                "cublasLtMatmulDescSetAttribute",
                "cublasLtMatmulDescDestroy",
                "cublasLtMatrixLayoutCreate",
                "cublasLtMatrixLayoutSetAttribute",
                "cublasLtMatrixLayoutDestroy",
                "cublasLtMatmulPreferenceCreate",
                "cublasLtMatmulPreferenceSetAttribute",
                "cublasLtMatmulPreferenceDestroy",
                "cublasLtMatmulAlgoGetHeuristic",
                "cublasLtMatmul",
            ],
            // SAFETY: looks the symbol up (dlsym) without calling it or reading through it.
            |name| unsafe { lib.get::<unsafe extern "C" fn()>(name) }.is_ok(),
        )?;
        stream
            .context()
            .bind_to_thread()
            .map_err(drv("cuCtxSetCurrent"))?;
        let bytes = if cc.0 >= 9 { 32 << 20 } else { 4 << 20 };
        let workspace = stream
            .alloc_zeros::<u8>(bytes)
            .map_err(drv("cuMemAllocAsync (cuBLASLt workspace)"))?;
        let (workspace_ptr, _) = workspace.device_ptr(stream);
        let handle = cublaslt::result::create_handle().map_err(lt_err("cublasLtCreate"))?;
        // SAFETY: takes no arguments; the library is loaded.
        let version = unsafe { cublaslt::sys::cublasLtGetVersion() };
        Ok(Lt {
            handle,
            stream: stream.clone(),
            workspace,
            workspace_ptr,
            version,
        })
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: created in `new`, destroyed once, nothing uses it after this.
        let _ = unsafe { cublaslt::result::destroy_handle(self.handle) };
    }
}

/// The cuBLASLt descriptors of one shape: bf16 × bf16 → f32, f32 compute and scale, epilogue
/// GELU_BIAS with an f32 bias, and the algorithm cuBLASLt's heuristic picked for them.
struct LtPlan {
    desc: cublaslt::sys::cublasLtMatmulDesc_t,
    a: cublaslt::sys::cublasLtMatrixLayout_t,
    b: cublaslt::sys::cublasLtMatrixLayout_t,
    c: cublaslt::sys::cublasLtMatrixLayout_t,
    algo: Option<cublaslt::sys::cublasLtMatmulAlgo_t>,
}

impl LtPlan {
    fn new(lt: &Lt, g: &ColMajorGemm, bias_ptr: u64) -> Result<LtPlan, String> {
        use cublaslt::sys::{
            cublasComputeType_t, cublasLtEpilogue_t, cublasLtMatmulDescAttributes_t as Desc,
            cublasLtMatmulPreferenceAttributes_t as Pref, cudaDataType,
        };
        let layout = |ty, rows: usize, cols: usize, ld: usize| {
            cublaslt::result::create_matrix_layout(ty, rows as u64, cols as u64, ld as i64)
                .map_err(lt_err("cublasLtMatrixLayoutCreate"))
        };
        let mut plan = LtPlan {
            desc: cublaslt::result::create_matmul_desc(
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cudaDataType::CUDA_R_32F,
            )
            .map_err(lt_err("cublasLtMatmulDescCreate"))?,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            c: std::ptr::null_mut(),
            algo: None,
        };
        // Column-major, no transposes (the descriptor's defaults): A is our W, B our A.
        plan.a = layout(cudaDataType::CUDA_R_16BF, g.rows, g.inner, g.lda)?;
        plan.b = layout(cudaDataType::CUDA_R_16BF, g.inner, g.cols, g.ldb)?;
        plan.c = layout(cudaDataType::CUDA_R_32F, g.rows, g.cols, g.ldc)?;
        if g.batch > 1 {
            // A batch: every layout has `batch` matrices, `stride_*` elements apart. The bias
            // keeps its default batch stride, 0: one vector shared by every product.
            use cublaslt::sys::cublasLtMatrixLayoutAttribute_t as L;
            let count = ColMajorGemm::int(g.batch)?;
            for (l, stride) in [
                (plan.a, g.stride_a),
                (plan.b, g.stride_b),
                (plan.c, g.stride_c),
            ] {
                let stride = stride as i64;
                // SAFETY: `l` is a live layout made above; each value is a live local of the
                // type the attribute takes (int32 count, int64 offset), its size given.
                unsafe {
                    cublaslt::result::set_matrix_layout_attribute(
                        l,
                        L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        (&count as *const i32).cast(),
                        std::mem::size_of::<i32>(),
                    )
                    .and_then(|()| {
                        cublaslt::result::set_matrix_layout_attribute(
                            l,
                            L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                            (&stride as *const i64).cast(),
                            std::mem::size_of::<i64>(),
                        )
                    })
                }
                .map_err(lt_err("cublasLtMatrixLayoutSetAttribute"))?;
            }
        }
        let epilogue = cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS;
        let bias_type = cudaDataType::CUDA_R_32F;
        let set = |attr, value: *const c_void, size: usize| {
            // SAFETY: the descriptor is live; `value` points to `size` readable bytes of the
            // type the attribute takes (cuBLASLt copies them).
            unsafe { cublaslt::result::set_matmul_desc_attribute(plan.desc, attr, value, size) }
                .map_err(lt_err("cublasLtMatmulDescSetAttribute"))
        };
        set(
            Desc::CUBLASLT_MATMUL_DESC_EPILOGUE,
            (&epilogue as *const cublasLtEpilogue_t).cast(),
            std::mem::size_of::<cublasLtEpilogue_t>(),
        )?;
        set(
            Desc::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
            (&bias_ptr as *const u64).cast(),
            std::mem::size_of::<u64>(),
        )?;
        set(
            Desc::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
            (&bias_type as *const cudaDataType).cast(),
            std::mem::size_of::<cudaDataType>(),
        )?;
        let pref = cublaslt::result::create_matmul_pref()
            .map_err(lt_err("cublasLtMatmulPreferenceCreate"))?;
        let limit = lt.workspace.len() as u64;
        // SAFETY: the preference is live; the value is a u64, as MAX_WORKSPACE_BYTES takes.
        let set_pref = unsafe {
            cublaslt::result::set_matmul_pref_attribute(
                pref,
                Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&limit as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        }
        .map_err(lt_err("cublasLtMatmulPreferenceSetAttribute"));
        let heuristic = set_pref.and_then(|()| {
            // SAFETY: every descriptor is live; D has C's layout (the product is written in
            // place of C, with beta 0).
            unsafe {
                cublaslt::result::get_matmul_algo_heuristic(
                    lt.handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref,
                )
            }
            .map_err(|e| {
                format!(
                    "cublasLtMatmulAlgoGetHeuristic: {:?} (no algorithm for bf16×bf16→f32 with \
                     the GELU_BIAS epilogue and {limit} bytes of workspace?)",
                    e.0
                )
            })
        });
        // SAFETY: created above, destroyed once; the heuristic's result does not refer to it.
        let _ = unsafe { cublaslt::result::destroy_matmul_pref(pref) };
        let heuristic = heuristic?;
        if heuristic.workspaceSize > lt.workspace.len() {
            return Err(format!(
                "cuBLASLt's algorithm wants {} bytes of workspace, more than the {} given",
                heuristic.workspaceSize,
                lt.workspace.len()
            ));
        }
        plan.algo = Some(heuristic.algo);
        Ok(plan)
    }

    /// Enqueues out = gelu_tanh(W·A + b) (cuBLAS's view; ours: gelu(A·W + b)) on the stream.
    fn matmul(&self, lt: &Lt, p: &Prepared) -> Result<(), String> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let algo = self.algo.as_ref().ok_or("no cuBLASLt algorithm")?;
        // SAFETY: the handle, descriptors and algorithm are live and describe these device
        // allocations (see `LtPlan::new` and `Prepared::new`); alpha and beta are host f32 as
        // the f32 scale type wants; C and D are the same buffer with the same layout, allowed
        // for an in-place product; the workspace is ours and as large as the preference said.
        unsafe {
            cublaslt::result::matmul(
                lt.handle,
                self.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                p.w_ptr as *const c_void,
                self.a,
                p.a_ptr as *const c_void,
                self.b,
                p.out_ptr as *const c_void,
                self.c,
                p.out_ptr as *mut c_void,
                self.c,
                algo,
                lt.workspace_ptr as *mut c_void,
                lt.workspace.len(),
                lt.stream.cu_stream() as _,
            )
        }
        .map_err(lt_err("cublasLtMatmul"))
    }
}

impl Drop for LtPlan {
    fn drop(&mut self) {
        // SAFETY: each was created in `new` (or is null, skipped), destroyed once here.
        unsafe {
            for l in [self.a, self.b, self.c] {
                if !l.is_null() {
                    let _ = cublaslt::result::destroy_matrix_layout(l);
                }
            }
            let _ = cublaslt::result::destroy_matmul_desc(self.desc);
        }
    }
}

/// The bias-add and exact-GELU kernels.
struct Kernels {
    bias_add: CudaFunction,
    gelu: CudaFunction,
    /// NVRTC's version and the target, for the log.
    compiled: String,
}

impl Kernels {
    fn new(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> Result<Kernels, String> {
        // SAFETY: the library is present (probed by the caller); culib only opens it.
        let lib = unsafe { nvrtc::sys::culib() };
        has_symbols(
            &[
                "nvrtcVersion",
                "nvrtcCreateProgram",
                "nvrtcCompileProgram",
                "nvrtcGetProgramLogSize",
                "nvrtcGetProgramLog",
                "nvrtcGetPTXSize",
                "nvrtcGetPTX",
                "nvrtcDestroyProgram",
            ],
            // SAFETY: looks the symbol up (dlsym) without calling it or reading through it.
            |name| unsafe { lib.get::<unsafe extern "C" fn()>(name) }.is_ok(),
        )?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two pointers to live ints.
        let _ = unsafe { nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        let arch = format!("compute_{}{}", cc.0, cc.1);
        let ptx = nvrtc::compile_ptx_with_opts(
            ELEMENTWISE_SRC,
            nvrtc::CompileOptions {
                options: vec![format!("--gpu-architecture={arch}")],
                name: Some("pptm_bench_elementwise.cu".into()),
                ..Default::default()
            },
        )
        .map_err(|e| format!("NVRTC {major}.{minor} compiling for {arch}: {e}"))?;
        let module = ctx.load_module(ptx).map_err(drv("cuModuleLoadData"))?;
        Ok(Kernels {
            bias_add: module
                .load_function("pptm_bench_bias_add")
                .map_err(drv("cuModuleGetFunction"))?,
            gelu: module
                .load_function("pptm_bench_gelu_erf")
                .map_err(drv("cuModuleGetFunction"))?,
            compiled: format!("NVRTC {major}.{minor}, {arch}"),
        })
    }
}

/// One shape's device buffers (raw pointers taken once: nothing tracks them per launch) and,
/// where cuBLASLt is there, its plan.
struct Prepared {
    plan: Result<LtPlan, String>,
    a_ptr: u64,
    w_ptr: u64,
    b_ptr: u64,
    out_ptr: u64,
    len: u32,
    n: u32,
    gemm: ColMajorGemm,
    _buffers: (CudaSlice<u16>, CudaSlice<u16>, CudaSlice<f32>),
    out: CudaSlice<f32>,
}

impl Prepared {
    fn new(gpu: &Gpu, p: &Problem) -> Result<Prepared, String> {
        let s = &gpu.stream;
        let outputs = p.batch * p.m * p.n;
        let len = u32::try_from(outputs)
            .map_err(|_| format!("{outputs} outputs do not fit the kernels' u32 index"))?;
        let a = s.clone_htod(&p.a).map_err(drv("upload A"))?;
        let w = s.clone_htod(&p.w).map_err(drv("upload W"))?;
        let b = s.clone_htod(&p.b).map_err(drv("upload b"))?;
        let out = s.alloc_zeros::<f32>(outputs).map_err(drv("alloc out"))?;
        s.synchronize()
            .map_err(drv("cuStreamSynchronize after upload"))?;
        let (a_ptr, w_ptr, b_ptr, out_ptr) = (
            a.device_ptr(s).0,
            w.device_ptr(s).0,
            b.device_ptr(s).0,
            out.device_ptr(s).0,
        );
        let gemm = ColMajorGemm::for_row_major(p.batch, p.m, p.k, p.n);
        let plan = match &gpu.lt {
            Ok(lt) => catching(|| LtPlan::new(lt, &gemm, b_ptr)),
            Err(e) => Err(e.clone()),
        };
        Ok(Prepared {
            plan,
            a_ptr,
            w_ptr,
            b_ptr,
            out_ptr,
            len,
            n: p.n as u32,
            gemm,
            _buffers: (a, w, b),
            out,
        })
    }

    /// Fills the output with NaNs (all bits set), so that a variant that writes nothing fails
    /// its check rather than passing on an earlier variant's result.
    fn poison(&self, stream: &CudaStream) -> Result<(), String> {
        // SAFETY: out_ptr is a live allocation of len f32 on this stream's context.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.out_ptr,
                0xff,
                self.len as usize * std::mem::size_of::<f32>(),
                stream.cu_stream(),
            )
        }
        .map_err(drv("cuMemsetD8Async (poison the output)"))
    }

    /// The output, read back after everything enqueued finished.
    fn read(&self, stream: &Arc<CudaStream>) -> Result<Vec<f32>, String> {
        let v = stream.clone_dtoh(&self.out).map_err(drv("read back"))?;
        stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize after read-back"))?;
        Ok(v)
    }
}

/// Enqueues one item of `v` on the stream (no synchronisation).
fn enqueue(gpu: &Gpu, p: &Prepared, v: Variant) -> Result<(), String> {
    match v {
        Variant::Gemm => gpu.blas.as_ref()?.gemm(&p.gemm, p),
        Variant::Launches => {
            gpu.blas.as_ref()?.gemm(&p.gemm, p)?;
            let k = gpu.kernels.as_ref()?;
            let grid = p
                .len
                .div_ceil(BLOCK)
                .min(gpu.sm_count.max(1) * (2048 / BLOCK));
            let cfg = LaunchConfig {
                grid_dim: (grid, 1, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: pptm_bench_bias_add(float*, const float*, unsigned, unsigned): out and b
            // are live f32 allocations of len and n elements; the kernel stays within len.
            unsafe {
                gpu.stream
                    .launch_builder(&k.bias_add)
                    .arg(&p.out_ptr)
                    .arg(&p.b_ptr)
                    .arg(&p.len)
                    .arg(&p.n)
                    .launch(cfg)
            }
            .map_err(drv("launch bias_add"))?;
            // SAFETY: pptm_bench_gelu_erf(float*, unsigned): out is a live f32 allocation of
            // len elements.
            unsafe {
                gpu.stream
                    .launch_builder(&k.gelu)
                    .arg(&p.out_ptr)
                    .arg(&p.len)
                    .launch(cfg)
            }
            .map_err(drv("launch gelu_erf"))?;
            Ok(())
        }
        Variant::LtEpilogue => {
            let lt = gpu.lt.as_ref()?;
            p.plan.as_ref()?.matmul(lt, p)
        }
    }
}

/// Times `v` at one shape, checking its output against the f64 reference before and after.
fn measure(
    gpu: &Gpu,
    p: &Prepared,
    problem: &Problem,
    v: Variant,
    size: &str,
    budget: &Budget,
) -> Result<Measurement, String> {
    let expect = problem.expect(v.activation());
    let timing = cu::CUevent_flags::CU_EVENT_DEFAULT;
    let (start, end): (CudaEvent, CudaEvent) = (
        gpu.ctx
            .new_event(Some(timing))
            .map_err(drv("cuEventCreate"))?,
        gpu.ctx
            .new_event(Some(timing))
            .map_err(drv("cuEventCreate"))?,
    );
    // One item: enqueue everything, wait for the stream; the device time is between events
    // recorded around the enqueued work.
    let mut item = || -> Result<Option<Duration>, String> {
        start.record(&gpu.stream).map_err(drv("cuEventRecord"))?;
        enqueue(gpu, p, v)?;
        end.record(&gpu.stream).map_err(drv("cuEventRecord"))?;
        gpu.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        let ms = start.elapsed_ms(&end).map_err(drv("cuEventElapsedTime"))?;
        Ok(Some(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3)))
    };
    let checked = |item: &mut dyn FnMut() -> Result<Option<Duration>, String>| {
        p.poison(&gpu.stream)?;
        item()?;
        let got = Got::Vector(p.read(&gpu.stream)?);
        let err = cases::check(&expect, &got)?;
        if err > BAR {
            return Err(format!(
                "relative error {err:.2e} against the f64 reference (the bar is {BAR:.0e})"
            ));
        }
        Ok((err, got.summary()))
    };
    let (err_before, value) = checked(&mut item)?;
    let (host, device) = crate::time_loop(budget, &mut item)?;
    let (err_after, _) = checked(&mut item).map_err(|e| format!("after timing: {e}"))?;
    Ok(Measurement {
        chain: problem.chain.into(),
        size: size.into(),
        shape: problem.shape(),
        x: problem.m as f64,
        variant: v.name().into(),
        gbps: Some(problem.bytes() / (host.median * 1e3)),
        tflops: Some(problem.flops() / (host.median * 1e6)),
        host_us: host,
        device_us: device,
        max_rel_err: Some(err_before.max(err_after)),
        value: Some(value),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cuBLAS's C = op(A)·op(B) with no transposes, column-major, as its documentation defines
    /// it: X(r, c) lives at x[r + c·ld].
    fn col_major_gemm(g: &ColMajorGemm, a: &[f64], b: &[f64]) -> Vec<f64> {
        let mut c = vec![f64::NAN; g.ldc * g.cols];
        for col in 0..g.cols {
            for row in 0..g.rows {
                c[row + col * g.ldc] = (0..g.inner)
                    .map(|p| a[row + p * g.lda] * b[p + col * g.ldb])
                    .sum();
            }
        }
        c
    }

    fn row_major_matmul(a: &[f64], w: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| a[i * k + p] * w[p * n + j]).sum();
            }
        }
        out
    }

    #[test]
    fn column_major_gemm_of_w_and_a_is_the_row_major_product() {
        for (m, k, n) in [(3, 5, 4), (1, 7, 2), (6, 1, 3), (4, 4, 4)] {
            let a: Vec<f64> = (0..m * k).map(|v| (v as f64 * 0.37).sin()).collect();
            let w: Vec<f64> = (0..k * n).map(|v| (v as f64 * 0.91).cos()).collect();
            let g = ColMajorGemm::for_row_major(1, m, k, n);
            // cuBLAS's operands are valid: ld ≥ rows of the stored matrix.
            assert!(g.lda >= g.rows && g.ldb >= g.inner && g.ldc >= g.rows);
            // Everything is densely packed: the buffers are exactly our arrays.
            assert_eq!((g.lda * g.inner, g.ldb * g.cols), (k * n, m * k));
            // cuBLAS's A operand is W's memory, its B operand A's memory.
            let c = col_major_gemm(&g, &w, &a);
            let want = row_major_matmul(&a, &w, m, k, n);
            assert_eq!(c.len(), want.len());
            for (x, y) in c.iter().zip(&want) {
                assert!((x - y).abs() < 1e-12, "{m}×{k}×{n}: {x} vs {y}");
            }
            // cuBLASLt's bias has one value per row of D: adding bias[r] to D(r, c) must be
            // adding b[j] to out[i, j].
            let bias: Vec<f64> = (0..g.rows).map(|j| j as f64 * 10.0).collect();
            assert_eq!(bias.len(), n);
            let mut d = c.clone();
            for col in 0..g.cols {
                for row in 0..g.rows {
                    d[row + col * g.ldc] += bias[row];
                }
            }
            for i in 0..m {
                for j in 0..n {
                    assert!((d[i * n + j] - (want[i * n + j] + bias[j])).abs() < 1e-12);
                }
            }
        }
    }

    #[test]
    fn references_follow_the_definition() {
        let p = Problem::new(4, 8, 5);
        assert!(p.a.len() == 32 && p.w.len() == 40 && p.b.len() == 5);
        // Inputs are bf16-rounded u − 0.5: in [−0.5, 0.5], and exactly representable.
        let u = cases::uniform(SEED_A, 32);
        for (bits, u) in p.a.iter().zip(&u) {
            let x = bf16::from_bits(*bits).to_f32();
            assert!(x.abs() <= 0.5);
            assert!((x - (u - 0.5)).abs() <= (u - 0.5).abs() / 256.0);
        }
        let (i, j) = (2, 3);
        let dot: f64 = (0..8)
            .map(|q| {
                bf16::from_bits(p.a[i * 8 + q]).to_f64() * bf16::from_bits(p.w[q * 5 + j]).to_f64()
            })
            .sum();
        let x = dot + f64::from(p.b[j]);
        assert_eq!(p.reference(i, j, Activation::None).0, dot);
        assert!((p.reference(i, j, Activation::GeluErf).0 - gelu_erf(x)).abs() < 1e-15);
        assert!((p.reference(i, j, Activation::GeluTanh).0 - gelu_tanh(x)).abs() < 1e-15);
        // The two GELUs: equal at 0, both ≈ x for large x, ≈ 0 for very negative x, close
        // but not equal in between.
        assert_eq!(gelu_erf(0.0), 0.0);
        assert_eq!(gelu_tanh(0.0), 0.0);
        assert!((gelu_erf(1.0) - 0.841_344_746).abs() < 1e-9);
        assert!((gelu_tanh(1.0) - 0.841_191_990).abs() < 1e-8);
        assert!((gelu_erf(6.0) - 6.0).abs() < 1e-6 && gelu_tanh(-6.0).abs() < 1e-6);
        // Scale: Σ|A W| + |b| bounds |x|.
        let (_, scale) = p.reference(i, j, Activation::GeluErf);
        assert!(scale >= x.abs());
    }

    #[test]
    fn batched_references_use_each_products_own_matrices() {
        let (batch, m, k, n) = (3, 2, 4, 5);
        let p = Problem::batched(BATCHED_CHAIN, batch, m, k, n);
        assert!(p.a.len() == batch * m * k && p.w.len() == batch * k * n && p.b.len() == n);
        // Row 5 of the stack is row 1 of product 2: A's row 5, W's rows 8 .. 11.
        let (i, j) = (5, 3);
        let x = |v: u16| bf16::from_bits(v).to_f64();
        let dot: f64 = (0..k)
            .map(|q| x(p.a[i * k + q]) * x(p.w[(2 * k + q) * n + j]))
            .sum();
        assert_eq!(p.reference(i, j, Activation::None).0, dot);
        let g = ColMajorGemm::for_row_major(batch, m, k, n);
        assert_eq!((g.stride_a, g.stride_b, g.stride_c), (k * n, m * k, m * n));
        // The samples span the whole stack, its last element included.
        let Expect::Elements { at, .. } = p.expect(Activation::None) else {
            panic!("elements expected")
        };
        assert!(at.iter().all(|&(e, ..)| e < batch * m * n));
        assert!(at.iter().any(|&(e, ..)| e == batch * m * n - 1));
    }

    #[test]
    fn samples_cover_rows_and_columns() {
        for (_, _, batch, m, _, n) in SIZES {
            let m = batch * m;
            let at = sample_points(m, n);
            assert!(at.len() >= 64 && at.iter().all(|&(i, j)| i < m && j < n));
            let rows: std::collections::BTreeSet<_> = at.iter().map(|x| x.0).collect();
            let cols: std::collections::BTreeSet<_> = at.iter().map(|x| x.1).collect();
            assert!(
                rows.len() >= 60 && cols.len() >= 32,
                "{m}×{n}: {rows:?} {cols:?}"
            );
            assert!(at.contains(&(0, 0)) && at.contains(&(m - 1, n - 1)));
        }
    }

    #[test]
    fn check_judges_against_the_right_reference() {
        let p = Problem::new(3, 16, 4);
        let exact: Vec<f32> = (0..12)
            .map(|e| p.reference(e / 4, e % 4, Activation::GeluErf).0 as f32)
            .collect();
        let want = p.expect(Activation::GeluErf);
        assert!(cases::check(&want, &Got::Vector(exact.clone())).unwrap() < 1e-6);
        // A result without the bias is off by far more than the bar.
        let bare: Vec<f32> = (0..12)
            .map(|e| p.reference(e / 4, e % 4, Activation::None).0 as f32)
            .collect();
        assert!(cases::check(&want, &Got::Vector(bare)).unwrap() > BAR);
        // A transposed output (3×4 read as 4×3) is off too.
        let mut transposed = exact.clone();
        for i in 0..3 {
            for j in 0..4 {
                transposed[j * 3 + i] = exact[i * 4 + j];
            }
        }
        assert!(cases::check(&want, &Got::Vector(transposed)).unwrap() > BAR);
    }

    #[test]
    fn every_variant_names_what_it_misses() {
        let all = Libraries {
            driver: true,
            cublas: true,
            cublaslt: true,
            nvrtc: true,
        };
        assert!(VARIANTS.iter().all(|v| v.missing(&all).is_none()));
        let no_nvrtc = Libraries {
            nvrtc: false,
            ..all
        };
        assert!(Variant::Gemm.missing(&no_nvrtc).is_none());
        assert!(Variant::LtEpilogue.missing(&no_nvrtc).is_none());
        assert!(
            Variant::Launches
                .missing(&no_nvrtc)
                .unwrap()
                .contains("NVRTC")
        );
        let no_lt = Libraries {
            cublaslt: false,
            ..all
        };
        assert!(
            Variant::LtEpilogue
                .missing(&no_lt)
                .unwrap()
                .contains("cuBLASLt")
        );
        assert!(Variant::Gemm.missing(&no_lt).is_none());
        let nothing = Libraries {
            driver: false,
            cublas: false,
            cublaslt: false,
            nvrtc: false,
        };
        for v in VARIANTS {
            assert!(v.missing(&nothing).unwrap().contains("libcuda"));
        }
        assert_eq!(count(|_, _| true), 18);
        assert_eq!(count(|c, s| c == CHAIN && s == "small"), 3);
        assert_eq!(count(|_, s| s == "small"), 6);
        assert_eq!(count(|_, _| false), 0);
    }

    /// The whole block at the small size, one product and a batch: refused cleanly where there
    /// is no driver (every variant, with the reason); measured and checked where there is a GPU
    /// (and then, with PPTM_REQUIRE_GPU=1, nothing may be refused).
    #[test]
    fn small_size_runs_or_is_refused_with_a_reason() {
        let budget = Budget {
            time: Duration::from_millis(20),
            max_reps: 50,
        };
        let mut out = Collector::in_memory();
        run(|_, s| s == "small", &budget, &mut out);
        assert_eq!(out.results.len() + out.refused.len(), 6);
        for r in &out.refused {
            assert!(
                (r.chain == CHAIN || r.chain == BATCHED_CHAIN)
                    && r.size == "small"
                    && !r.reason.is_empty()
            );
        }
        // SAFETY: only tries to open the driver library.
        if !unsafe { cu::is_culib_present() } {
            assert_eq!(out.refused.len(), 6);
            assert!(out.refused.iter().all(|r| r.reason.contains("libcuda")));
        } else if std::env::var("PPTM_REQUIRE_GPU").as_deref() == Ok("1") {
            let why: Vec<_> = out.refused.iter().map(|r| &r.reason).collect();
            assert!(out.refused.is_empty(), "refused: {why:?}");
        }
        for m in &out.results {
            assert!(m.max_rel_err.unwrap() <= BAR && m.tflops.unwrap() > 0.0);
        }
    }
}
