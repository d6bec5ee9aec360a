//! `precision = "bf16x3"`: f32 matrix products on bf16 tensor cores at f32's accuracy
//! (`pptm::chains::MatmulBiasGeluBf16x3`). On every backend against f64 references of the f32
//! operands, outputs poisoned: single products of every edge case (tests/common/tensor.rs), the
//! working memory the runtime lends such items (grown while a smaller item is in flight, shared by
//! the items of a pipeline, which it orders), and a kept pipeline run again. On Hopper the
//! persistent runtime splits the operands on the device and multiplies them by wgmma; the launched
//! variants and other GPUs compute in f32 on CUDA cores. Its own binary: the `tensor` domain's
//! kernels take a whole SM's shared memory (tests/tensor_core.rs says why that matters).

#[macro_use]
mod common;

use common::{gelu, uniform};
use pptm::chains::MatmulBiasGeluBf16x3;
use pptm::{Buffer, Runtime};

fn bf16x3_matches_f64_reference(rt: &Runtime) {
    common::tensor::bf16x3_matmul(rt, |rt, a, w, b, out, m, k| {
        MatmulBiasGeluBf16x3::submit(rt, a, w, b, out, m, k)
    });
}

/// gelu(A W + b) in f64, row-major m x n, with each output's terms' magnitude.
fn reference(a: &[f32], w: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<(f64, f64)> {
    let mut out = vec![(0.0, 0.0); m * n];
    for i in 0..m {
        for p in 0..k {
            let aip = f64::from(a[i * k + p]);
            for j in 0..n {
                let t = aip * f64::from(w[p * n + j]);
                out[i * n + j].0 += t;
                out[i * n + j].1 += t.abs();
            }
        }
    }
    for (at, o) in out.iter_mut().enumerate() {
        let bias = f64::from(b[at % n]);
        *o = (gelu(o.0 + bias), o.1 + bias.abs());
    }
    out
}

/// Every element of `got` within 1e-4 of its terms' magnitude of the f64 reference.
fn check(what: &str, got: &[f32], want: &[(f64, f64)]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (at, (&g, &(w, mag))) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(
            err < 1e-4 * mag.max(1e-3),
            "{what} at {at}: got {g}, f64 reference {w}, error {err:e}, terms' magnitude {mag:e}"
        );
    }
}

struct Product {
    m: usize,
    k: usize,
    n: usize,
    a: Vec<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
}

impl Product {
    fn new(m: usize, k: usize, n: usize) -> Self {
        Product {
            m,
            k,
            n,
            a: uniform(m * k, -1.0, 1.0),
            w: uniform(k * n, -1.0, 1.0),
            b: uniform(n, -1.0, 1.0),
        }
    }

    fn want(&self) -> Vec<(f64, f64)> {
        reference(&self.a, &self.w, &self.b, self.m, self.k, self.n)
    }

    fn upload(&self, rt: &Runtime) -> [Buffer<f32>; 4] {
        [
            rt.upload(&self.a).unwrap(),
            rt.upload(&self.w).unwrap(),
            rt.upload(&self.b).unwrap(),
            rt.upload(&vec![f32::NAN; self.m * self.n]).unwrap(),
        ]
    }
}

/// A small product in flight while a larger one needs more working memory than the runtime holds:
/// the runtime allocates more and keeps the first item's until the runtime is dropped; both
/// results hold.
fn working_memory_grows_under_an_item_in_flight(rt: &Runtime) {
    let small = Product::new(200, 300, 136);
    let large = Product::new(640, 2000, 700);
    let [sa, sw, sb, mut so] = small.upload(rt);
    let [la, lw, lb, mut lo] = large.upload(rt);
    let first = MatmulBiasGeluBf16x3::submit(rt, &sa, &sw, &sb, &mut so, small.m, small.k).unwrap();
    let second =
        MatmulBiasGeluBf16x3::submit(rt, &la, &lw, &lb, &mut lo, large.m, large.k).unwrap();
    second.wait().unwrap();
    first.wait().unwrap();
    check("small, in flight", &so.to_vec().unwrap(), &small.want());
    check("large", &lo.to_vec().unwrap(), &large.want());
}

/// Three bf16x3 items in one pipeline: the second reads the first's output (read after write),
/// the third reads neither; all three use the manifold's working memory, which the pipeline orders
/// like a buffer each of them writes. Kept and run again with every output poisoned: same results.
fn pipeline_orders_items_that_share_working_memory(rt: &Runtime) {
    let (m, k, n) = (300, 520, 260);
    let first = Product::new(m, k, n);
    let second_w = uniform(n * 130, -1.0, 1.0);
    let second_b = uniform(130, -1.0, 1.0);
    let third = Product::new(129, 1000, 300);
    let [a1, w1, b1, mut o1] = first.upload(rt);
    let (w2, b2) = (rt.upload(&second_w).unwrap(), rt.upload(&second_b).unwrap());
    let mut o2 = rt.upload(&vec![f32::NAN; m * 130]).unwrap();
    let [a3, w3, b3, mut o3] = third.upload(rt);
    let mut p = rt.pipeline();
    let (a1h, w1h, b1h) = (p.input(&a1), p.input(&w1), p.input(&b1));
    let (w2h, b2h) = (p.input(&w2), p.input(&b2));
    let (a3h, w3h, b3h) = (p.input(&a3), p.input(&w3), p.input(&b3));
    let (o1h, o2h, o3h) = (p.output(&mut o1), p.output(&mut o2), p.output(&mut o3));
    MatmulBiasGeluBf16x3::push(&mut p, a1h, w1h, b1h, o1h, m, k).unwrap();
    MatmulBiasGeluBf16x3::push(&mut p, o1h, w2h, b2h, o2h, m, n).unwrap();
    MatmulBiasGeluBf16x3::push(&mut p, a3h, w3h, b3h, o3h, third.m, third.k).unwrap();
    let (_, mut kept) = p.wait_and_keep().unwrap();
    for run in 0..2 {
        let got1 = kept.buffer(o1h).unwrap().to_vec().unwrap();
        let want1 = first.want();
        check(&format!("run {run}: first"), &got1, &want1);
        // The second product's reference from the first's f32 output, as the device read it.
        let want2 = reference(&got1, &second_w, &second_b, m, n, 130);
        check(
            &format!("run {run}: second (reads the first)"),
            &kept.buffer(o2h).unwrap().to_vec().unwrap(),
            &want2,
        );
        check(
            &format!("run {run}: third"),
            &kept.buffer(o3h).unwrap().to_vec().unwrap(),
            &third.want(),
        );
        if run == 0 {
            for o in [o1h, o2h, o3h] {
                kept.buffer_mut(o).unwrap().fill(f32::NAN).unwrap();
            }
            kept.run().unwrap();
        }
    }
}

on_every_backend!(
    bf16x3_matches_f64_reference,
    working_memory_grows_under_an_item_in_flight,
    pipeline_orders_items_that_share_working_memory,
);
