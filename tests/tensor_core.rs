//! MatmulBiasGelu{Bf16,F16} (16-bit operands on tensor cores, domain `tensor`) on every backend,
//! against f64 references written here.
//!
//! On H100/H200 the domain's kernels run one block an SM with 226 KiB of shared memory, so nothing
//! else fits beside a block of them: this binary's persistent runtime takes at most
//! `common::TENSOR_BINARY_SMS` SMs (tests/common/mod.rs), leaving the rest to the launched
//! variants' kernels that its other tests run at the same time.

#[macro_use]
mod common;

use pptm::chains::{MatmulBiasGeluBf16, MatmulBiasGeluF16};
use pptm::{Arg, Buffer, DType, Element, Error, Runtime, Ticket, bf16, f16};
use rand::Rng;

fn uniform(n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut rng = rand::rng();
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// A 16-bit operand type and the chain that multiplies in it on tensor cores.
trait Operand: Element {
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

/// The Operand impl of a 16-bit type and its chain.
macro_rules! operand {
    ($t:ty, $name:literal, $chain:ty) => {
        impl Operand for $t {
            const NAME: &'static str = $name;
            fn from_f32(x: f32) -> Self {
                <$t>::from_f32(x)
            }
            fn submit<'a>(
                rt: &Runtime,
                a: &'a Buffer<Self>,
                w: &'a Buffer<Self>,
                b: &'a Buffer<f32>,
                out: &'a mut Buffer<f32>,
                m: usize,
                k: usize,
            ) -> Result<Ticket<'a, ()>, Error> {
                <$chain>::submit(rt, a, w, b, out, m, k)
            }
        }
    };
}
operand!(bf16, "bf16", MatmulBiasGeluBf16);
operand!(f16, "fp16", MatmulBiasGeluF16);

/// gelu(A W + b) with 16-bit A and W. The reference multiplies the very operand values the chain
/// gets (16-bit, widened exactly) in f64, so what is left to judge is the device's f32
/// accumulation and epilogue: they must meet the f32 path's bar (1e-4 of the terms' magnitude),
/// well inside the plan's 1e-2 for bf16 operands.
fn tensor_core_matmul<T: Operand>(rt: &Runtime) {
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

fn bf16_matmul_bias_gelu_matches_f64_reference(rt: &Runtime) {
    tensor_core_matmul::<bf16>(rt);
}

fn f16_matmul_bias_gelu_matches_f64_reference(rt: &Runtime) {
    tensor_core_matmul::<f16>(rt);
}

/// A buffer of the wrong element type is a typed error, not a reinterpretation of its bytes.
fn wrong_operand_type_is_a_typed_error(rt: &Runtime) {
    let a = rt.upload(&[1.0f32; 4]).unwrap();
    let w = rt.upload(&[bf16::from_f32(1.0); 4]).unwrap();
    let b = rt.upload(&[0.0f32; 2]).unwrap();
    let mut out = rt.alloc::<f32>(4).unwrap();
    let e = rt
        .submit_chain::<MatmulBiasGeluBf16>(vec![
            Arg::Input("a", (&a).into()),
            Arg::Input("w", (&w).into()),
            Arg::Input("b", (&b).into()),
            Arg::Output("out", &mut out),
            Arg::Dim("m", 2),
            Arg::Dim("k", 2),
        ])
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::DTypeMismatch {
                arg: "a",
                expected: DType::Bf16,
                got: DType::F32,
                ..
            }
        ),
        "{e}"
    );
}

on_every_backend!(
    bf16_matmul_bias_gelu_matches_f64_reference,
    f16_matmul_bias_gelu_matches_f64_reference,
    wrong_operand_type_is_a_typed_error,
);
