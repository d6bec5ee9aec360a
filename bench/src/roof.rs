//! The run's bandwidth roof: a plain copy of n f32 (read n, write n), timed in the same process and
//! on the same GPU as every chain, so that the report can say what share of the reachable bandwidth
//! a memory-bound chain uses (bench/REPORT.md, "Against the roofs").
//!
//! Two ways to copy, both reported as chain [`CHAIN`]:
//! * [`KERNEL`]: a grid-stride kernel of 16-byte loads and stores (NVRTC-compiled here, as
//!   src/cublas.rs compiles its elementwise kernels), 256 threads a block, eight blocks an SM;
//! * [`MEMCPY`]: `cuMemcpyDtoDAsync`, the driver's own copy.
//!
//! The roof of a size is the faster of the two. Each copy's output is poisoned (all bits set)
//! before it runs and compared bit for bit with its input before and after timing. Timing is
//! pptm-bench's: host clock around enqueue → stream synchronised, CUDA events for device time.
//! Like src/cublas.rs, this runs while no pptm runtime exists in the process.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
    sys as cu,
};
use cudarc::nvrtc;

use crate::cublas::drv;
use crate::record::Measurement;
use crate::{Budget, Collector};

/// The chain's name in results.
pub const CHAIN: &str = "copy_roof";
/// The variants, as named in results.
pub const KERNEL: &str = "copy kernel (16-byte loads and stores)";
pub const MEMCPY: &str = "cuMemcpyDtoDAsync";
const VARIANTS: [&str; 2] = [KERNEL, MEMCPY];

/// (size, f32 elements): the element counts of the elementwise chains' sizes (cases.rs).
pub const SIZES: [(&str, usize); 3] = [("small", 4096), ("medium", 1 << 20), ("large", 1 << 26)];

/// Bytes a copy of `n` f32 moves: every element read once and written once.
pub fn bytes(n: usize) -> f64 {
    2.0 * 4.0 * n as f64
}

const BLOCK: u32 = 256;

const COPY_SRC: &str = r#"
extern "C" __global__ void pptm_bench_copy(const float4* __restrict__ in, float4* __restrict__ out,
                                           unsigned long long n4) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride)
        out[i] = in[i];
}
"#;

/// How many measurements [`run`] makes for the sizes `wants` accepts (for the progress bar).
pub fn count(wants: impl Fn(&str, &str) -> bool) -> usize {
    SIZES.iter().filter(|(s, _)| wants(CHAIN, s)).count() * VARIANTS.len()
}

/// Measures both copies at every size `wants` accepts, reporting each to `out` as a measurement
/// or a refusal. Must run while no pptm runtime exists in the process.
pub fn run(wants: impl Fn(&str, &str) -> bool, budget: &Budget, out: &mut Collector) {
    let sizes: Vec<(&str, usize)> = SIZES.into_iter().filter(|(s, _)| wants(CHAIN, s)).collect();
    if sizes.is_empty() {
        return;
    }
    out.progress.set_message("copy roof: context, NVRTC");
    let gpu = crate::cublas::catching(Copier::open);
    for (size, n) in sizes {
        for variant in VARIANTS {
            out.progress
                .set_message(format!("{CHAIN} {size} {variant}"));
            let attempt = match &gpu {
                Err(e) => Err(format!("CUDA setup failed: {e}")),
                Ok(g) => crate::cublas::catching(|| g.measure(variant, size, n, budget)),
            };
            match attempt {
                Ok(m) => out.report(m),
                Err(reason) => {
                    out.refuse(CHAIN, size, variant, reason);
                    out.progress.inc(1);
                }
            }
        }
    }
}

struct Copier {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The copy kernel, or why there is none (the memcpy variant runs without it).
    kernel: Result<CudaFunction, String>,
    sm_count: u32,
}

impl Copier {
    fn open() -> Result<Copier, String> {
        // SAFETY: only tries to open the driver library (cudarc would panic at the first call of
        // a missing one).
        if !unsafe { cu::is_culib_present() } {
            return Err("the CUDA driver library is not there".into());
        }
        let ctx = CudaContext::new(0).map_err(drv("CudaContext::new(0) (primary context)"))?;
        // SAFETY: one stream, one item at a time, every buffer freed on that stream: cudarc's
        // cross-stream event tracking is not needed (and would add event records to the timing).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("compute capability"))?;
        let sm_count =
            ctx.attribute(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(drv("cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)"))? as u32;
        // SAFETY: only tries to open the NVRTC library.
        let kernel = if unsafe { nvrtc::sys::is_culib_present() } {
            crate::cublas::catching(|| {
                let arch = format!("compute_{major}{minor}");
                let ptx = nvrtc::compile_ptx_with_opts(
                    COPY_SRC,
                    nvrtc::CompileOptions {
                        options: vec![format!("--gpu-architecture={arch}")],
                        name: Some("pptm_bench_copy.cu".into()),
                        ..Default::default()
                    },
                )
                .map_err(|e| format!("NVRTC compiling for {arch}: {e}"))?;
                let module = ctx.load_module(ptx).map_err(drv("cuModuleLoadData"))?;
                module
                    .load_function("pptm_bench_copy")
                    .map_err(drv("cuModuleGetFunction"))
            })
        } else {
            Err("NVRTC not found".into())
        };
        Ok(Copier {
            ctx,
            stream,
            kernel,
            sm_count,
        })
    }

    fn enqueue(
        &self,
        variant: &str,
        from: &CudaSlice<f32>,
        to: &mut CudaSlice<f32>,
    ) -> Result<(), String> {
        if variant == MEMCPY {
            return self
                .stream
                .memcpy_dtod(from, to)
                .map_err(drv("cuMemcpyDtoDAsync"));
        }
        let kernel = self.kernel.as_ref()?;
        let n4 = (from.len() / 4) as u64;
        let grid = (n4.div_ceil(u64::from(BLOCK)) as u32).clamp(1, self.sm_count.max(1) * 8);
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: pptm_bench_copy(const float4*, float4*, unsigned long long): both slices hold
        // 4 n4 f32 (the sizes are multiples of 4, and cudarc's allocations are 256-byte aligned),
        // and the kernel stays below n4.
        unsafe {
            self.stream
                .launch_builder(kernel)
                .arg(from)
                .arg(to)
                .arg(&n4)
                .launch(cfg)
        }
        .map_err(drv("launch pptm_bench_copy"))?;
        Ok(())
    }

    fn measure(
        &self,
        variant: &str,
        size: &str,
        n: usize,
        budget: &Budget,
    ) -> Result<Measurement, String> {
        if !n.is_multiple_of(4) {
            return Err(format!("{n} f32: the copy kernel moves 16-byte pieces"));
        }
        // A counter pattern whose bits differ from the poison and from one element to the next.
        let input: Vec<f32> = (0..n).map(|i| i as f32 + 0.5).collect();
        let from = self.stream.clone_htod(&input).map_err(drv("upload"))?;
        let mut to = self.stream.alloc_zeros::<f32>(n).map_err(drv("alloc"))?;
        let timing = cu::CUevent_flags::CU_EVENT_DEFAULT;
        let (start, end): (CudaEvent, CudaEvent) = (
            self.ctx
                .new_event(Some(timing))
                .map_err(drv("cuEventCreate"))?,
            self.ctx
                .new_event(Some(timing))
                .map_err(drv("cuEventCreate"))?,
        );
        let mut item = |to: &mut CudaSlice<f32>| -> Result<Option<Duration>, String> {
            start.record(&self.stream).map_err(drv("cuEventRecord"))?;
            self.enqueue(variant, &from, to)?;
            end.record(&self.stream).map_err(drv("cuEventRecord"))?;
            self.stream
                .synchronize()
                .map_err(drv("cuStreamSynchronize"))?;
            let ms = start.elapsed_ms(&end).map_err(drv("cuEventElapsedTime"))?;
            Ok(Some(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3)))
        };
        let checked = |to: &mut CudaSlice<f32>,
                       item: &mut dyn FnMut(&mut CudaSlice<f32>) -> Result<_, String>|
         -> Result<(), String> {
            // Poison: every bit set (a NaN), so that an element the copy missed shows.
            let poison = vec![f32::from_bits(u32::MAX); n];
            self.stream
                .memcpy_htod(&poison, to)
                .map_err(drv("poison the output"))?;
            item(to)?;
            let got = self.stream.clone_dtoh(to).map_err(drv("read back"))?;
            self.stream
                .synchronize()
                .map_err(drv("cuStreamSynchronize after read-back"))?;
            match got
                .iter()
                .zip(&input)
                .position(|(g, w)| g.to_bits() != w.to_bits())
            {
                None => Ok(()),
                Some(i) => Err(format!(
                    "element {i} of {n} is {} after the copy, not {}",
                    got[i], input[i]
                )),
            }
        };
        checked(&mut to, &mut item)?;
        let (host, device) = crate::time_loop(budget, || item(&mut to))?;
        checked(&mut to, &mut item).map_err(|e| format!("after timing: {e}"))?;
        Ok(Measurement {
            chain: CHAIN.into(),
            size: size.into(),
            shape: format!("n = {n} f32"),
            x: n as f64,
            variant: variant.into(),
            gbps: Some(bytes(n) / (host.median * 1e3)),
            tflops: None,
            host_us: host,
            device_us: device,
            max_rel_err: Some(0.0),
            value: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_count_one_read_and_one_write() {
        assert_eq!(bytes(1 << 26), 512.0 * 1024.0 * 1024.0);
    }

    /// Without a GPU every variant is refused with a reason (never a panic, never a silent skip);
    /// with one, every copy that is reported matched its input bit for bit before and after timing.
    #[test]
    fn small_copies_run_or_are_refused_with_a_reason() {
        let budget = Budget {
            time: Duration::from_millis(20),
            max_reps: 50,
        };
        let mut out = Collector::in_memory();
        run(|_, s| s == "small", &budget, &mut out);
        assert_eq!(out.results.len() + out.refused.len(), VARIANTS.len());
        for r in &out.refused {
            assert!(r.chain == CHAIN && r.size == "small" && !r.reason.is_empty());
        }
        // SAFETY: only tries to open the driver library.
        if !unsafe { cu::is_culib_present() } {
            assert_eq!(out.refused.len(), VARIANTS.len());
        } else if std::env::var("PPTM_REQUIRE_GPU").as_deref() == Ok("1") {
            let why: Vec<_> = out.refused.iter().map(|r| &r.reason).collect();
            assert!(out.refused.is_empty(), "refused: {why:?}");
        }
        for m in &out.results {
            assert_eq!(m.max_rel_err, Some(0.0));
            assert!(m.gbps.unwrap() > 0.0 && m.device_us.is_some());
        }
    }
}
