//! GemvAxpbySum, GemvTwoAxpbySum (stages with arguments of their own), MatmulBias{Relu,Sigmoid,
//! Tanh,Gelu} (f32, CUDA cores), Gemv{Bf16,Fp8} and
//! GemvAxpbySum{Bf16,Fp8} (a bf16 or fp8 A on tensor cores) and MatmulBiasGeluGuarded (the accuracy
//! guard) of domain `linear_algebra` on every backend, against f64 references written here. The
//! bf16/fp16 matmul chains (domain `tensor`) are in tests/tensor_core.rs, fp8 in
//! tests/precision_fp8.rs.

#[macro_use]
mod common;

use common::{gelu, uniform};
use pptm::chains::{
    GemvAxpbySum, GemvAxpbySumBf16, GemvAxpbySumFp8, GemvBf16, GemvFp8, MatmulBiasGelu,
    MatmulBiasGeluGuarded, MatmulBiasRelu, MatmulBiasSigmoid, MatmulBiasTanh,
};
use pptm::ops::{Axpby, Gemv, Square, SumReduction};
use pptm::{Buffer, Error, F8E4M3, FusionBuilder, Runtime, Ticket, bf16};

/// `z = α₂ (α A x + β y) + β₂ y₂`, reduced to `Σ z²`: two Axpby stages, the second with arguments
/// of its own (`args(...)`), so one chain takes two vectors and four scalars.
#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra_tests")]
pub struct GemvTwoAxpbySum {
    #[stage(1)]
    product: Gemv,
    #[stage(2)]
    first: Axpby,
    #[stage(3, args(y = "y2", alpha = "alpha2", beta = "beta2"))]
    second: Axpby,
    #[stage(4)]
    square: Square,
    #[stage(5, reduction = true)]
    total: SumReduction,
}

fn stages_with_arguments_of_their_own(rt: &Runtime) {
    for (m, n) in [(1, 1), (7, 1023), (1023, 7), (4099, 33)] {
        let (x, a, y, y2) = (
            uniform(n, -1.0, 1.0),
            uniform(m * n, -1.0, 1.0),
            uniform(m, -1.0, 1.0),
            uniform(m, -1.0, 1.0),
        );
        let (alpha, beta, alpha2, beta2) = (0.75f32, -1.25f32, 1.5f32, 0.5f32);
        let (xb, ab, yb, y2b) = (
            rt.upload(&x).unwrap(),
            rt.upload(&a).unwrap(),
            rt.upload(&y).unwrap(),
            rt.upload(&y2).unwrap(),
        );
        let got = GemvTwoAxpbySum::submit(rt, &xb, &ab, &yb, alpha, beta, &y2b, alpha2, beta2)
            .unwrap()
            .wait()
            .unwrap();
        let (mut want, mut magnitude) = (0.0f64, 0.0f64);
        for i in 0..m {
            let row = &a[i * n..(i + 1) * n];
            let ax: f64 = row
                .iter()
                .zip(&x)
                .map(|(&a, &x)| f64::from(a) * f64::from(x))
                .sum();
            let scale: f64 = row
                .iter()
                .zip(&x)
                .map(|(&a, &x)| (f64::from(a) * f64::from(x)).abs())
                .sum();
            let first = f64::from(alpha) * ax + f64::from(beta) * f64::from(y[i]);
            let z = f64::from(alpha2) * first + f64::from(beta2) * f64::from(y2[i]);
            want += z * z;
            let first_mag =
                f64::from(alpha).abs() * scale + (f64::from(beta) * f64::from(y[i])).abs();
            magnitude += z.abs()
                * (f64::from(alpha2).abs() * first_mag
                    + (f64::from(beta2) * f64::from(y2[i])).abs());
        }
        let err = (f64::from(got) - want).abs();
        assert!(
            err <= 1e-4 * magnitude,
            "m={m} n={n}: got {got}, f64 reference {want}, error {err:e}, allowed 1e-4 of {magnitude:e}"
        );
    }
}

fn gemv_axpby_sum_matches_f64_reference(rt: &Runtime) {
    // Below 8192 rows a warp takes one row, from there four (the two sides of GEMV_SHORT_BELOW);
    // from 4096 columns, with every row 16-byte aligned, those four are walked together from end
    // to end (the stream walk; a last warp of three rows at 8195).
    for (m, n) in [
        (1, 1),
        (7, 3),
        (1023, 1025),
        (17, 4099),
        (4096, 4096),
        (8193, 33),
        (8200, 64),
        (8195, 4100),
        (8192, 4099),
        (8257, 6148),
    ] {
        let (x, a, y) = (
            uniform(n, -1.0, 1.0),
            uniform(m * n, -1.0, 1.0),
            uniform(m, -1.0, 1.0),
        );
        let (alpha, beta) = (0.75f32, -1.25f32);
        let (xb, ab, yb) = (
            rt.upload(&x).unwrap(),
            rt.upload(&a).unwrap(),
            rt.upload(&y).unwrap(),
        );
        let got = GemvAxpbySum::submit(rt, &xb, &ab, &yb, alpha, beta)
            .unwrap()
            .wait()
            .unwrap();
        common::assert_gemv_axpby_sum_close(
            got,
            (&x, &a, &y),
            (alpha, beta),
            1e-4,
            format_args!("m={m} n={n}"),
        );
    }
}

gemv_storage!(bf16, "bf16", GemvBf16, GemvAxpbySumBf16);
gemv_storage!(F8E4M3, "fp8", GemvFp8, GemvAxpbySumFp8);

fn gemv_bf16_matches_f64_reference(rt: &Runtime) {
    common::gemv::gemv_narrow_matches_f64::<bf16>(rt);
}

fn gemv_fp8_matches_f64_reference(rt: &Runtime) {
    common::gemv::gemv_narrow_matches_f64::<F8E4M3>(rt);
}

type Submit = for<'a> fn(
    &Runtime,
    &'a Buffer<f32>,
    &'a Buffer<f32>,
    &'a Buffer<f32>,
    &'a mut Buffer<f32>,
    usize,
    usize,
) -> Result<Ticket<'a, ()>, Error>;

/// An activation's name, its f64 form, and the submit of the chain that applies it.
type Layer = (&'static str, fn(f64) -> f64, Submit);

fn layers() -> [Layer; 4] {
    [
        ("relu", |x| x.max(0.0), MatmulBiasRelu::submit),
        (
            "sigmoid",
            |x| 1.0 / (1.0 + (-x).exp()),
            MatmulBiasSigmoid::submit,
        ),
        ("tanh", f64::tanh, MatmulBiasTanh::submit),
        ("gelu", gelu, MatmulBiasGelu::submit),
    ]
}

fn matmul_bias_act_matches_f64_reference(rt: &Runtime) {
    let shapes = [
        (1, 1, 1),
        (1, 17, 64),
        (17, 17, 17),
        (64, 64, 64),
        (65, 1000, 33),
        (1000, 64, 1000),
        (64, 256, 256),
        (7, 300, 130),
        // 256 direct tiles (two rounds on 132 SMs) with rows of W that are not 16-byte aligned.
        (128, 33, 255),
        // Enough 128 x 128 tiles for them (9 x 17), with partial tiles on both edges and a last
        // slice of k that is half outside; then the same with n or k not a multiple of 4, which
        // keep the 64 x 64 tiles.
        (1031, 36, 2052),
        (1031, 36, 2051),
        (1031, 37, 2052),
    ];
    for (m, k, n) in shapes {
        let (a, w, b) = (
            uniform(m * k, -1.0, 1.0),
            uniform(k * n, -1.0, 1.0),
            uniform(n, -1.0, 1.0),
        );
        // Pre-activation in f64 and the magnitude of its terms (the f32 error scale).
        let mut pre = vec![0.0f64; m * n];
        let mut scale = vec![0.0f64; m * n];
        for i in 0..m {
            for p in 0..k {
                let aip = f64::from(a[i * k + p]);
                for j in 0..n {
                    let t = aip * f64::from(w[p * n + j]);
                    pre[i * n + j] += t;
                    scale[i * n + j] += t.abs();
                }
            }
        }
        let (ab, wb, bb) = (
            rt.upload(&a).unwrap(),
            rt.upload(&w).unwrap(),
            rt.upload(&b).unwrap(),
        );
        for (name, act, submit) in layers() {
            let mut out = rt.upload(&vec![f32::NAN; m * n]).unwrap();
            submit(rt, &ab, &wb, &bb, &mut out, m, k)
                .unwrap()
                .wait()
                .unwrap();
            let got = out.to_vec().unwrap();
            for i in 0..m {
                for (j, &bias) in b.iter().enumerate() {
                    let at = i * n + j;
                    let x = pre[at] + f64::from(bias);
                    let want = act(x);
                    // Every activation here has slope at most 1.13: an error of the
                    // pre-activation (judged on its terms' magnitude) passes through scaled by it.
                    let tol = 1e-4 * (scale[at] + f64::from(bias).abs()).max(1e-3);
                    let err = (f64::from(got[at]) - want).abs();
                    assert!(
                        err < tol,
                        "{name} m={m} k={k} n={n} at ({i}, {j}): got {}, f64 reference {want}, error {err:e}, tolerance {tol:e}",
                        got[at]
                    );
                }
            }
        }
    }
}

/// Runs MatmulBiasGeluGuarded on f32 operands and checks the output against f64 within `bar` of
/// each output's terms' magnitude.
fn run_guarded(rt: &Runtime, a: &[f32], w: &[f32], b: &[f32], m: usize, k: usize, bar: f64) {
    let n = b.len();
    let (ab, wb, bb) = (
        rt.upload(a).unwrap(),
        rt.upload(w).unwrap(),
        rt.upload(b).unwrap(),
    );
    let mut out = rt.upload(&vec![f32::NAN; m * n]).unwrap();
    MatmulBiasGeluGuarded::submit(rt, &ab, &wb, &bb, &mut out, m, k)
        .unwrap()
        .wait()
        .unwrap();
    let got = out.to_vec().unwrap();
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut mag) = (f64::from(b[j]), f64::from(b[j]).abs());
            for p in 0..k {
                let t = f64::from(a[i * k + p]) * f64::from(w[p * n + j]);
                s += t;
                mag += t.abs();
            }
            let err = (f64::from(got[i * n + j]) - gelu(s)).abs();
            assert!(
                err <= bar * mag.max(1e-3),
                "guarded m={m} k={k} n={n} at ({i}, {j}): got {}, f64 reference {}, error {err:e}, bar {bar:e} of {mag:e}",
                got[i * n + j],
                gelu(s)
            );
        }
    }
}

/// The accuracy guard (issue 5): a fp16 stage with `tolerance = 1e-2` keeps fp16 for benign input,
/// falls back to f32 for input beyond fp16's range (rounded to fp16 it would be infinite), keeps
/// that shape in f32 until reset, and counts all of it. The same decisions on every backend (the
/// CPU backend computes in f64 and emulates the check).
fn accuracy_guard_falls_back_on_fp16_overflow_only(rt: &Runtime) {
    type G = MatmulBiasGeluGuarded;
    let (m, k, n) = (300, 257, 190);
    let (a, w, b) = (
        uniform(m * k, -1.0, 1.0),
        uniform(k * n, -1.0, 1.0),
        uniform(n, -1.0, 1.0),
    );
    // Every entry of A beyond fp16's largest value (65504), its sign kept.
    let huge: Vec<f32> = a
        .iter()
        .map(|&x| x.signum() * (7e4 + 1e4 * x.abs()))
        .collect();
    let stats = || rt.guard_stats::<G>();
    let counts = |s: pptm::GuardStats| (s.checked, s.fell_back, s.pinned, s.pinned_shapes);
    rt.reset_guard::<G>();
    let s0 = stats();
    // Benign: checked, kept in fp16 (operands rounded to fp16: about 1e-3 of the magnitude).
    run_guarded(rt, &a, &w, &b, m, k, 2e-3);
    let s1 = stats();
    assert_eq!(
        counts(s1),
        (s0.checked + 1, s0.fell_back, s0.pinned, 0),
        "benign input: {s1:?}"
    );
    assert!(s1.worst_error < 1e-2, "{s1:?}");
    // Beyond fp16: checked, falls back to f32 (the f32 path's 1e-4 bar), the shape is pinned.
    run_guarded(rt, &huge, &w, &b, m, k, 1e-4);
    let s2 = stats();
    assert_eq!(
        counts(s2),
        (s1.checked + 1, s1.fell_back + 1, s1.pinned, 1),
        "fp16 overflow: {s2:?}"
    );
    assert_eq!(s2.worst_error, f64::INFINITY);
    // The same shape stays in f32 without a check, whatever the input.
    run_guarded(rt, &a, &w, &b, m, k, 1e-4);
    let s3 = stats();
    assert_eq!(
        counts(s3),
        (s2.checked, s2.fell_back, s2.pinned + 1, 1),
        "pinned shape: {s3:?}"
    );
    // Another shape is checked on its own.
    run_guarded(rt, &a[..(m - 1) * k], &w, &b, m - 1, k, 2e-3);
    let s4 = stats();
    assert_eq!(
        counts(s4),
        (s3.checked + 1, s3.fell_back, s3.pinned, 1),
        "another shape: {s4:?}"
    );
    // Until told otherwise: after a reset the first shape is checked (and kept in fp16) again.
    rt.reset_guard::<G>();
    run_guarded(rt, &a, &w, &b, m, k, 2e-3);
    let s5 = stats();
    assert_eq!(
        counts(s5),
        (s4.checked + 1, s4.fell_back, s4.pinned, 0),
        "after reset: {s5:?}"
    );
}

fn bad_shapes_are_typed_errors(rt: &Runtime) {
    let a = rt.upload(&[1.0f32; 6]).unwrap();
    let w = rt.upload(&[1.0f32; 6]).unwrap();
    let b = rt.upload(&[1.0f32; 2]).unwrap();
    let mut out = rt.alloc::<f32>(6).unwrap();
    // a is 2 x 3 but m = 3, k = 3 says 9.
    assert!(matches!(
        MatmulBiasRelu::submit(rt, &a, &w, &b, &mut out, 3, 3),
        Err(Error::LengthMismatch {
            arg: "a",
            expected: 9,
            got: 6,
            ..
        })
    ));
    // m = 2, k = 3: w must be 3 x 2 = 6 (it is), out 2 x 2 = 4 (it is 6).
    assert!(matches!(
        MatmulBiasRelu::submit(rt, &a, &w, &b, &mut out, 2, 3),
        Err(Error::LengthMismatch {
            arg: "out",
            expected: 4,
            got: 6,
            ..
        })
    ));
    // Sizes whose product overflows are refused, not wrapped.
    let mut out4 = rt.alloc::<f32>(4).unwrap();
    assert!(matches!(
        MatmulBiasRelu::submit(rt, &a, &w, &b, &mut out4, usize::MAX / 2, 3),
        Err(Error::BadArguments { .. } | Error::LengthMismatch { .. })
    ));
    let x = rt.upload(&[1.0f32; 3]).unwrap();
    let y = rt.upload(&[1.0f32; 3]).unwrap();
    assert!(matches!(
        GemvAxpbySum::submit(rt, &x, &a, &y, 1.0, 1.0),
        Err(Error::LengthMismatch {
            arg: "a",
            expected: 9,
            got: 6,
            ..
        })
    ));
}

on_every_backend!(
    gemv_axpby_sum_matches_f64_reference,
    gemv_bf16_matches_f64_reference,
    gemv_fp8_matches_f64_reference,
    matmul_bias_act_matches_f64_reference,
    accuracy_guard_falls_back_on_fp16_overflow_only,
    bad_shapes_are_typed_errors,
    stages_with_arguments_of_their_own,
);
