//! The tensor-core matmul test body, shared by tests/tensor_core.rs (bf16, fp16: domain
//! `tensor`) and tests/precision_fp8.rs (fp8: domain `fp8`).
#![allow(dead_code)]

use pptm::{Buffer, Element, Error, Runtime, Ticket};

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

/// gelu(A W + b) with 16- or 8-bit A and W. The reference multiplies the very operand values the
/// chain gets (widened exactly) in f64, so what is left to judge is the device's f32
/// accumulation and epilogue: they must meet the f32 path's bar (1e-4 of the terms' magnitude),
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
    ];
    for (m, k, n) in shapes {
        let a: Vec<T> = uniform(m * k, -1.0, 1.0)
            .into_iter()
            .map(T::from_f32)
            .collect();
        let w: Vec<T> = uniform(k * n, -1.0, 1.0)
            .into_iter()
            .map(T::from_f32)
            .collect();
        let b = uniform(n, -1.0, 1.0);
        let mut pre = vec![0.0f64; m * n];
        let mut scale = vec![0.0f64; m * n];
        for i in 0..m {
            for p in 0..k {
                let aip = a[i * k + p].to_f64();
                let (row, mag) = (&mut pre[i * n..(i + 1) * n], &mut scale[i * n..(i + 1) * n]);
                for (j, (r, s)) in row.iter_mut().zip(mag.iter_mut()).enumerate() {
                    let t = aip * w[p * n + j].to_f64();
                    *r += t;
                    *s += t.abs();
                }
            }
        }
        let (ab, wb, bb) = (
            rt.upload(&a).unwrap(),
            rt.upload(&w).unwrap(),
            rt.upload(&b).unwrap(),
        );
        let mut out = rt.upload(&vec![f32::NAN; m * n]).unwrap();
        T::submit(rt, &ab, &wb, &bb, &mut out, m, k)
            .unwrap()
            .wait()
            .unwrap();
        let got = out.to_vec().unwrap();
        let mut worst = 0.0f64;
        for i in 0..m {
            for (j, &bias) in b.iter().enumerate() {
                let at = i * n + j;
                let want = gelu(pre[at] + f64::from(bias));
                let magnitude = (scale[at] + f64::from(bias).abs()).max(1e-3);
                let err = (f64::from(got[at]) - want).abs();
                assert!(
                    err < 1e-4 * magnitude,
                    "{} m={m} k={k} n={n} at ({i}, {j}): got {}, f64 reference {want}, error {err:e}, terms' magnitude {magnitude:e}",
                    T::NAME,
                    got[at]
                );
                worst = worst.max(err / magnitude);
            }
        }
        eprintln!(
            "{} m={m} k={k} n={n}: worst error {worst:.1e} of the terms' magnitude",
            T::NAME
        );
    }
}
