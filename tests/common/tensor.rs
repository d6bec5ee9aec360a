//! The tensor-core matmul test bodies, shared by tests/tensor_core.rs (bf16, fp16: domain
//! `tensor`), tests/precision_fp8.rs (fp8: domain `fp8`) and tests/batched_matmul.rs (batched
//! products, f32 and 16/8-bit: domain `batched`).
#![allow(dead_code)]

use pptm::{Buffer, Element, Error, ProductPaths, Runtime, Ticket};

use super::{gelu, uniform};

/// A 16- or 8-bit operand type and the chain that multiplies in it on tensor cores.
pub trait Operand: Element {
    const NAME: &'static str;
    fn from_f32(x: f32) -> Self;
    #[allow(
        clippy::too_many_arguments,
        reason = "the chain's submit, one parameter per argument"
    )]
    fn submit<'a>(
        rt: &Runtime,
        a: &'a Buffer<Self>,
        w: &'a Buffer<Self>,
        b: &'a Buffer<f32>,
        out: &'a mut Buffer<f32>,
        m: usize,
        k: usize,
    ) -> Result<Ticket<'a, ()>, Error>;
}

/// The Operand impl of an operand type and its chain.
#[allow(unused_macros)]
macro_rules! operand {
    ($t:ty, $name:literal, $chain:ty) => {
        impl $crate::common::tensor::Operand for $t {
            const NAME: &'static str = $name;
            fn from_f32(x: f32) -> Self {
                <$t>::from_f32(x)
            }
            fn submit<'a>(
                rt: &pptm::Runtime,
                a: &'a pptm::Buffer<Self>,
                w: &'a pptm::Buffer<Self>,
                b: &'a pptm::Buffer<f32>,
                out: &'a mut pptm::Buffer<f32>,
                m: usize,
                k: usize,
            ) -> Result<pptm::Ticket<'a, ()>, pptm::Error> {
                <$chain>::submit(rt, a, w, b, out, m, k)
            }
        }
    };
}

/// A batched chain's operand type: what `gelu(A[s] W[s] + b)` multiplies in (f32 on CUDA cores,
/// or 16/8-bit values on tensor cores).
pub trait BatchedOperand: Element {
    const NAME: &'static str;
    fn from_f32(x: f32) -> Self;
    #[allow(
        clippy::too_many_arguments,
        reason = "the chain's submit, one parameter per argument"
    )]
    fn submit_batched<'a>(
        rt: &Runtime,
        a: &'a Buffer<Self>,
        w: &'a Buffer<Self>,
        b: &'a Buffer<f32>,
        out: &'a mut Buffer<f32>,
        batch: usize,
        m: usize,
        k: usize,
    ) -> Result<Ticket<'a, ()>, Error>;
}

/// The BatchedOperand impl of an operand type and its batched chain.
#[allow(unused_macros)]
macro_rules! batched_operand {
    ($t:ty, $name:literal, $chain:ty, $from_f32:expr) => {
        impl $crate::common::tensor::BatchedOperand for $t {
            const NAME: &'static str = $name;
            fn from_f32(x: f32) -> Self {
                ($from_f32)(x)
            }
            fn submit_batched<'a>(
                rt: &pptm::Runtime,
                a: &'a pptm::Buffer<Self>,
                w: &'a pptm::Buffer<Self>,
                b: &'a pptm::Buffer<f32>,
                out: &'a mut pptm::Buffer<f32>,
                batch: usize,
                m: usize,
                k: usize,
            ) -> Result<pptm::Ticket<'a, ()>, pptm::Error> {
                <$chain>::submit(rt, a, w, b, out, batch, m, k)
            }
        }
    };
}

/// gelu(A W + b) with 16- or 8-bit A and W. The reference multiplies the very operand values the
/// chain gets (widened exactly) in f64, so what is left to judge is the device's f32
/// accumulation and epilogue: they must meet the f32 path's bar (1e-4 of the terms' magnitude;
/// 1e-3 for fp8 shapes on Hopper's fp8 wgmma, see check_products),
/// well inside the plan's 1e-2 for bf16 operands.
pub fn tensor_core_matmul<T: Operand>(rt: &Runtime) {
    // m, k, n each take 1, 17, 64, 1000 and 4096; shapes on both tile sizes (128 x 64 from 128
    // such tiles on), rows of A or W that are not 16-byte aligned (k or n not a multiple of 8),
    // partial tiles at every edge.
    let shapes = [
        (1, 1, 1),
        (1, 64, 17),
        (17, 17, 17),
        (64, 64, 64),
        (64, 256, 256),
        (17, 4096, 64),
        (1000, 17, 1000),
        (4096, 64, 1),
        (1000, 1000, 64),
        (300, 17, 130),
        (64, 1000, 4096),
        // Large tiles: 32 x 16 of them, the last column of tiles partial.
        (4096, 64, 1000),
        // Large tiles with rows of A that are not 16-byte aligned.
        (2048, 17, 1000),
        // On Hopper, the wgmma paths for every operand type (fp8 needs k and n multiples of 16):
        // partial tiles at both edges and a partial last slice of k (128 bytes of it for fp8);
        // then a long k, 32 slices, over which fp8's per-slice sums add up.
        (1000, 1040, 272),
        (130, 4096, 512),
        // bf16/fp16 wgmma tiles (pptm_matmul_wgmma picks by rounds of tiles over the blocks: 64 in
        // this binary's persistent manifold, 132 for the launched variants on an H100 or H200).
        // Above: 128 x 64 with k split in the block, and 256 x 128 for (4096, 64, 1000). Here:
        // 128 x 128 on 64 blocks and the split tile on 132; 256 x 128 on 64 and 128 x 128 on 132;
        // 256 x 192 on both (264 of them).
        (768, 200, 1000),
        (1280, 136, 1240),
        (3072, 16, 4224),
    ];
    single_products(rt, T::NAME, T::NAME, T::from_f32, &shapes, T::submit);
}

/// gelu(A W + b) with bf16 operands and `accumulate = "promoted"` (tests/promoted_accumulation.rs)
/// through `submit`, on the same terms as [`tensor_core_matmul`]: shapes that Hopper's wgmma path
/// takes with promotions (every 8 slices of 64) and a partial last run of slices, one k of a
/// single slice, and shapes that fall back to mma.sync.
pub fn promoted_matmul(
    rt: &Runtime,
    submit: impl for<'a> Fn(
        &Runtime,
        &'a Buffer<pptm::bf16>,
        &'a Buffer<pptm::bf16>,
        &'a Buffer<f32>,
        &'a mut Buffer<f32>,
        usize,
        usize,
    ) -> Result<Ticket<'a, ()>, Error>,
) {
    let shapes = [
        (1, 1, 1),
        (17, 17, 17),
        (64, 1000, 4096),
        (256, 64, 256),
        (256, 1600, 256),
        (1000, 1040, 272),
        (130, 4096, 512),
        (512, 8192, 384),
    ];
    single_products(
        rt,
        "bf16",
        "bf16 promoted",
        pptm::bf16::from_f32,
        &shapes,
        submit,
    );
}

/// gelu(A W + b) with f32 operands and `precision = "bf16x3"` (tests/bf16x3.rs) through `submit`,
/// on the same terms as [`tensor_core_matmul`] (1e-4 of the terms' magnitude against f64): shapes
/// too small for Hopper's wgmma (f32 on CUDA cores), and shapes it takes with every edge partial:
/// m, n and k odd, k not a multiple of the 64 a slice holds, n not a multiple of 8 (the split
/// operands are padded), a long k.
pub fn bf16x3_matmul(
    rt: &Runtime,
    submit: impl for<'a> Fn(
        &Runtime,
        &'a Buffer<f32>,
        &'a Buffer<f32>,
        &'a Buffer<f32>,
        &'a mut Buffer<f32>,
        usize,
        usize,
    ) -> Result<Ticket<'a, ()>, Error>,
) {
    let shapes = [
        (1, 1, 1),
        (7, 7, 7),
        (17, 100, 130),
        (300, 1000, 260),
        (1023, 517, 1023),
        (1000, 1040, 272),
        (130, 4096, 512),
        (64, 8192, 33),
    ];
    single_products(rt, "bf16x3", "bf16x3", |x| x, &shapes, submit);
}

/// One product of each of `shapes` (m, k, n) through `submit`, each checked by [`check_products`]
/// (named `label` in failures), then the paths they took by [`PathsSeen`] under `paths`' rules.
fn single_products<T: Element>(
    rt: &Runtime,
    paths: &'static str,
    label: &str,
    from_f32: fn(f32) -> T,
    shapes: &[(usize, usize, usize)],
    submit: impl for<'a> Fn(
        &Runtime,
        &'a Buffer<T>,
        &'a Buffer<T>,
        &'a Buffer<f32>,
        &'a mut Buffer<f32>,
        usize,
        usize,
    ) -> Result<Ticket<'a, ()>, Error>,
) {
    let mut ran = PathsSeen::new(rt, paths);
    for &(m, k, n) in shapes {
        ran.add(check_products(
            rt,
            label,
            from_f32,
            1,
            m,
            k,
            n,
            |rt, a, w, b, out| submit(rt, a, w, b, out, m, k),
        ));
    }
    ran.check();
}

/// gelu(A[s] W[s] + b) for a batch of products, on the same terms as [`tensor_core_matmul`].
pub fn batched_matmul<T: BatchedOperand>(rt: &Runtime) {
    // (batch, m, k, n): one product and a few; many single-tile products (more tiles than the
    // GPU has blocks, so blocks take several products); products of one or two rows; unaligned
    // rows (k or n not a multiple of 8) and partial tiles at every edge; a batch on the large
    // tiles (m > 64, at least 128 of them); products on the f32 path's three tile shapes; on
    // Hopper, the wgmma path.
    let shapes = [
        (1, 1, 1, 1),
        (7, 17, 17, 17),
        (3, 64, 64, 64),
        (1000, 64, 64, 64),
        (1023, 16, 32, 16),
        (257, 1, 64, 7),
        (5, 300, 17, 130),
        (130, 128, 64, 64),
        (4, 33, 1000, 9),
        (2, 1000, 64, 1000),
        (3, 512, 7, 448),
        // On Hopper the wgmma path (products of 128 x 128 outputs or more, k whole slices of
        // 64): partial tiles in both dimensions, whose rows past m read the next product's A.
        (4, 300, 192, 264),
        // On Hopper the fp8 wgmma path too (k whole slices of 128, n a multiple of 16): partial
        // tiles in both dimensions.
        (3, 200, 256, 272),
    ];
    let mut ran = PathsSeen::new(rt, T::NAME);
    for (batch, m, k, n) in shapes {
        ran.add(check_products(
            rt,
            T::NAME,
            T::from_f32,
            batch,
            m,
            k,
            n,
            |rt, a, w, b, out| T::submit_batched(rt, a, w, b, out, batch, m, k),
        ));
    }
    ran.check();
}

/// The product paths a list of shapes reached on the GPU, so a test knows the paths it means to
/// cover ran: every 16- and 8-bit shape list has shapes for Hopper's wgmma, and those must reach
/// it on sm_90 (and nowhere else).
struct PathsSeen {
    name: &'static str,
    /// Whether the runtime is persistent (the launched variants lend no working memory).
    persistent: bool,
    /// The GPU's compute capability; `None` on the CPU backend, where nothing is checked.
    cc: Option<(u32, u32)>,
    seen: Vec<ProductPaths>,
}

impl PathsSeen {
    fn new(rt: &Runtime, name: &'static str) -> Self {
        PathsSeen {
            name,
            persistent: rt.config().variant == pptm::Variant::Fused,
            cc: rt.gpu_info().map(|g| g.compute_capability),
            seen: Vec::new(),
        }
    }

    fn add(&mut self, paths: Option<ProductPaths>) {
        self.seen.extend(paths);
    }

    fn check(&self) {
        let Some(cc) = self.cc else { return };
        let name = self.name;
        let hopper = cc == (9, 0);
        let any = |f: fn(ProductPaths) -> bool| self.seen.iter().any(|&p| f(p));
        if name == "bf16x3" {
            // Hopper's wgmma for the shapes it takes; f32 on CUDA cores for the rest, and off
            // Hopper. Never mma.sync. (The launched variants lend no working memory: all f32.)
            assert!(
                !any(|p| p.mma_sync() || p.wgmma_fp8()),
                "{name}: a product ran on mma.sync or fp8: {:?}",
                self.seen
            );
            assert!(
                any(ProductPaths::cuda_cores),
                "{name}: no shape ran on CUDA cores: {:?}",
                self.seen
            );
            assert_eq!(
                any(ProductPaths::wgmma),
                hopper && self.persistent,
                "{name} on sm_{}{} ({}): wgmma {} (paths reported: {:?})",
                cc.0,
                cc.1,
                if self.persistent {
                    "persistent"
                } else {
                    "launched"
                },
                if hopper && self.persistent {
                    "never ran"
                } else {
                    "ran"
                },
                self.seen
            );
            return;
        }
        if name == "f32" {
            assert!(
                !any(|p| !p.cuda_cores()),
                "{name}: a product left the CUDA cores: {:?}",
                self.seen
            );
            return;
        }
        let want: fn(ProductPaths) -> bool = if name == "fp8" {
            ProductPaths::wgmma_fp8
        } else {
            ProductPaths::wgmma
        };
        assert_eq!(
            any(want),
            hopper,
            "{name} on sm_{}{}: Hopper's wgmma path {} (paths reported: {:?})",
            cc.0,
            cc.1,
            if hopper {
                "never ran"
            } else {
                "ran off Hopper"
            },
            self.seen
        );
        assert!(
            any(ProductPaths::mma_sync),
            "{name}: no shape ran on mma.sync: {:?}",
            self.seen
        );
        assert!(
            !any(ProductPaths::cuda_cores),
            "{name}: a product ran on CUDA cores: {:?}",
            self.seen
        );
    }
}

/// Submits `gelu(A[s] W[s] + b)` for `batch` stacked products of fresh random operands through
/// `submit`, into an output poisoned with NaN, and compares every element with an f64 reference
/// of the same operand values: within 1e-4 of the terms' magnitude (1e-3 where the device reports
/// that Hopper's fp8 tensor cores took the product: they add in reduced precision). Returns the
/// product paths the device reported, each item's being exactly one path.
#[allow(
    clippy::too_many_arguments,
    reason = "one product shape and how to build and submit it"
)]
fn check_products<T: Element>(
    rt: &Runtime,
    name: &str,
    from_f32: fn(f32) -> T,
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    submit: impl for<'a> FnOnce(
        &Runtime,
        &'a Buffer<T>,
        &'a Buffer<T>,
        &'a Buffer<f32>,
        &'a mut Buffer<f32>,
    ) -> Result<Ticket<'a, ()>, Error>,
) -> Option<ProductPaths> {
    let a: Vec<T> = uniform(batch * m * k, -1.0, 1.0)
        .into_iter()
        .map(from_f32)
        .collect();
    let w: Vec<T> = uniform(batch * k * n, -1.0, 1.0)
        .into_iter()
        .map(from_f32)
        .collect();
    let b = uniform(n, -1.0, 1.0);
    let mut pre = vec![0.0f64; batch * m * n];
    let mut scale = vec![0.0f64; batch * m * n];
    for s in 0..batch {
        for i in 0..m {
            let row = (s * m + i) * n;
            for p in 0..k {
                let aip = a[(s * m + i) * k + p].to_f64();
                let w_row = &w[(s * k + p) * n..(s * k + p + 1) * n];
                let (r, mag) = (&mut pre[row..row + n], &mut scale[row..row + n]);
                for ((r, mg), wv) in r.iter_mut().zip(mag.iter_mut()).zip(w_row) {
                    let t = aip * wv.to_f64();
                    *r += t;
                    *mg += t.abs();
                }
            }
        }
    }
    let (ab, wb, bb) = (
        rt.upload(&a).unwrap(),
        rt.upload(&w).unwrap(),
        rt.upload(&b).unwrap(),
    );
    let mut out = rt.upload(&vec![f32::NAN; batch * m * n]).unwrap();
    let paths = submit(rt, &ab, &wb, &bb, &mut out)
        .unwrap()
        .wait_timed()
        .unwrap()
        .paths;
    if let Some(p) = paths {
        let one = [p.cuda_cores(), p.mma_sync(), p.wgmma(), p.wgmma_fp8()]
            .iter()
            .filter(|&&on| on)
            .count();
        assert_eq!(
            one, 1,
            "{name} batch={batch} m={m} k={k} n={n}: the device reported paths {p}, not one"
        );
    }
    let got = out.to_vec().unwrap();
    // fp8 on Hopper's e4m3 wgmma (shapes that path may take): the tensor cores add a slice's
    // (128 of k) four k32 steps with about 13 mantissa bits, truncating (each slice's sum then
    // goes into f32), so up to about 4 * 2^-13 = 5e-4 of the terms' magnitude; seen up to 1.2e-4
    // (k = 256, two slices, H100). Every other path, fp8's mma.sync included, adds in f32: 1e-4.
    let bar = if paths.is_some_and(ProductPaths::wgmma_fp8) {
        1e-3
    } else {
        1e-4
    };
    let mut worst = 0.0f64;
    for (at, (&g, (&p, &sc))) in got.iter().zip(pre.iter().zip(&scale)).enumerate() {
        let (s, i, j) = (at / (m * n), at / n % m, at % n);
        let bias = f64::from(b[j]);
        let want = gelu(p + bias);
        let magnitude = (sc + bias.abs()).max(1e-3);
        let err = (f64::from(g) - want).abs();
        assert!(
            err < bar * magnitude,
            "{name} batch={batch} m={m} k={k} n={n} product {s} at ({i}, {j}) on {paths:?}: got {g}, f64 reference {want}, error {err:e}, terms' magnitude {magnitude:e}",
        );
        worst = worst.max(err / magnitude);
    }
    eprintln!(
        "{name} batch={batch} m={m} k={k} n={n} on {}: worst error {worst:.1e} of the terms' magnitude",
        paths.map_or("the CPU".to_string(), |p| p.to_string())
    );
    paths
}
