//! The chains of domain `narrow`, GEMVs on CUDA cores that read a matrix stored in bf16, fp16 or
//! fp8 (E4M3) and compute in f32: GemvFp16 and GemvAxpbySumFp16 (the GEMV body that
//! tests/linear_algebra.rs runs on the tensor-core bf16 and fp8 chains), GemvT{Bf16,Fp16,Fp8},
//! and BeliefUpdateStepBf16 (the belief-update body of tests/belief_update.rs), on every backend,
//! against f64 references computed from A's stored values.

#[macro_use]
mod common;

use common::uniform;
use pptm::chains::{
    BeliefUpdateStepBf16, GemvAxpbySumFp16, GemvFp16, GemvTBf16, GemvTFp8, GemvTFp16,
};
use pptm::{Buffer, Element, Error, F8E4M3, Runtime, Ticket, bf16, f16};

gemv_storage!(f16, "fp16", GemvFp16, GemvAxpbySumFp16);
belief_storage!(bf16, BeliefUpdateStepBf16, bf16::from_f32);

fn gemv_fp16_matches_f64_reference(rt: &Runtime) {
    common::gemv::gemv_narrow_matches_f64::<f16>(rt);
}

fn belief_update_bf16_matches_f64_reference(rt: &Runtime) {
    common::gemv::belief_update_matches_f64::<bf16>(rt);
}

/// A transposed GEMV chain reading A stored as `Self`.
trait GemvTStorage: Element {
    fn from_f32(x: f32) -> Self;
    fn gemv_t<'a>(
        rt: &Runtime,
        x: &'a Buffer<f32>,
        a: &'a Buffer<Self>,
        out: &'a mut Buffer<f32>,
    ) -> Result<Ticket<'a, ()>, Error>;
}

macro_rules! gemv_t_storage {
    ($t:ty, $chain:ty) => {
        impl GemvTStorage for $t {
            fn from_f32(x: f32) -> Self {
                <$t>::from_f32(x)
            }
            fn gemv_t<'a>(
                rt: &Runtime,
                x: &'a Buffer<f32>,
                a: &'a Buffer<Self>,
                out: &'a mut Buffer<f32>,
            ) -> Result<Ticket<'a, ()>, Error> {
                <$chain>::submit(rt, x, a, out)
            }
        }
    };
}
gemv_t_storage!(bf16, GemvTBf16);
gemv_t_storage!(f16, GemvTFp16);
gemv_t_storage!(F8E4M3, GemvTFp8);

/// y = Aᵀ x with A stored as T: every output within 1e-4 of its terms' magnitude of the f64
/// product of A's stored values and x (x is not rounded). Shapes: both tile widths (8 columns
/// below 4096, 32 from there), n odd (read element by element), even but not a multiple of 4 (a
/// word a lane for 16-bit A, element by element for fp8) and a multiple of 4, several 2048-row
/// chunks, m = 2^20 + 3, n = 2^16 + 2. Outputs are poisoned with NaN first; an infinite element
/// of x makes its columns infinite.
fn gemv_t_matches_f64<T: GemvTStorage>(rt: &Runtime) {
    for (m, n) in [
        (1, 1),
        (7, 3),
        (5, 6),
        (33, 8),
        (1023, 17),
        (1000, 1000),
        (4097, 130),
        (3, 4099),
        (2049, 4096),
        (300, 4102),
        ((1 << 20) + 3, 7),
        (5, (1 << 16) + 2),
    ] {
        let x = uniform(m, -1.0, 1.0);
        let a: Vec<T> = uniform(m * n, -1.0, 1.0)
            .into_iter()
            .map(T::from_f32)
            .collect();
        let (mut want, mut scale) = (vec![0.0f64; n], vec![0.0f64; n]);
        for i in 0..m {
            let xi = f64::from(x[i]);
            for j in 0..n {
                let t = a[i * n + j].to_f64() * xi;
                want[j] += t;
                scale[j] += t.abs();
            }
        }
        let (xb, ab) = (rt.upload(&x).unwrap(), rt.upload(&a).unwrap());
        let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
        T::gemv_t(rt, &xb, &ab, &mut out).unwrap().wait().unwrap();
        let got = out.to_vec().unwrap();
        for j in 0..n {
            let tol = 1e-4 * scale[j].max(1e-3);
            let err = (f64::from(got[j]) - want[j]).abs();
            assert!(
                err < tol,
                "GemvT {:?} m={m} n={n} column {j}: got {}, f64 reference {}, error {err:e}, tolerance {tol:e}",
                T::DTYPE,
                got[j],
                want[j]
            );
        }
    }
    let (m, n) = (9, 19);
    let mut x = vec![0.5f32; m];
    x[3] = f32::INFINITY;
    let a = rt.upload(&vec![T::from_f32(1.0); m * n]).unwrap();
    let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
    T::gemv_t(rt, &rt.upload(&x).unwrap(), &a, &mut out)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(out.to_vec().unwrap(), vec![f32::INFINITY; n]);
}

fn gemv_t_bf16_matches_f64_reference(rt: &Runtime) {
    gemv_t_matches_f64::<bf16>(rt);
}

fn gemv_t_fp16_matches_f64_reference(rt: &Runtime) {
    gemv_t_matches_f64::<f16>(rt);
}

fn gemv_t_fp8_matches_f64_reference(rt: &Runtime) {
    gemv_t_matches_f64::<F8E4M3>(rt);
}

/// Wrong lengths are typed errors naming the argument, on the narrow buffers as on f32 ones.
fn bad_shapes_are_typed_errors(rt: &Runtime) {
    let x3 = rt.upload(&[0.5f32; 3]).unwrap();
    let a7 = rt.upload(&[bf16::from_f32(0.5); 7]).unwrap();
    let mut out2 = rt.alloc::<f32>(2).unwrap();
    // m = 3 (x), n = 2 (out): a must hold 6.
    assert!(matches!(
        GemvTBf16::submit(rt, &x3, &a7, &mut out2),
        Err(Error::LengthMismatch {
            arg: "a",
            expected: 6,
            got: 7,
            ..
        })
    ));
    let a6 = rt.upload(&[f16::from_f32(0.5); 6]).unwrap();
    let mut out3 = rt.alloc::<f32>(3).unwrap();
    // Gemv: n = 3 (x), m = 3 (out): a must hold 9.
    assert!(matches!(
        GemvFp16::submit(rt, &x3, &a6, &mut out3),
        Err(Error::LengthMismatch {
            arg: "a",
            expected: 9,
            got: 6,
            ..
        })
    ));
}

on_every_backend!(
    gemv_fp16_matches_f64_reference,
    belief_update_bf16_matches_f64_reference,
    gemv_t_bf16_matches_f64_reference,
    gemv_t_fp16_matches_f64_reference,
    gemv_t_fp8_matches_f64_reference,
    bad_shapes_are_typed_errors,
);
