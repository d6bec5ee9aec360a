//! GEMV test bodies shared by the binaries whose chains read A in different storage types: a
//! test binary runs one domain, and the chains of one body live in several (`linear_algebra`:
//! tensor-core bf16 and fp8; `narrow`: fp16, bf16 and fp8 on CUDA cores).

use super::uniform;
use pptm::{Buffer, Element, Error, Runtime, Ticket};

/// How a GEMV's A is stored, and the chains of one binary that read A that way: y = A x stored,
/// and the axpby-sum Σ(α A x + β y)².
pub trait GemvStorage: Element {
    const NAME: &'static str;
    fn from_f32(x: f32) -> Self;
    fn gemv<'a>(
        rt: &Runtime,
        x: &'a Buffer<f32>,
        a: &'a Buffer<Self>,
        out: &'a mut Buffer<f32>,
    ) -> Result<Ticket<'a, ()>, Error>;
    fn gemv_axpby_sum<'a>(
        rt: &Runtime,
        x: &'a Buffer<f32>,
        a: &'a Buffer<Self>,
        y: &'a Buffer<f32>,
        alpha: f32,
        beta: f32,
    ) -> Result<Ticket<'a, f32>, Error>;
}

/// `gemv_storage!(type, "name", GemvChain, GemvAxpbySumChain)` implements [`GemvStorage`].
#[allow(unused_macros)]
macro_rules! gemv_storage {
    ($t:ty, $name:literal, $gemv:ty, $sum:ty) => {
        impl common::gemv::GemvStorage for $t {
            const NAME: &'static str = $name;
            fn from_f32(x: f32) -> Self {
                <$t>::from_f32(x)
            }
            fn gemv<'a>(
                rt: &pptm::Runtime,
                x: &'a pptm::Buffer<f32>,
                a: &'a pptm::Buffer<Self>,
                out: &'a mut pptm::Buffer<f32>,
            ) -> Result<pptm::Ticket<'a, ()>, pptm::Error> {
                <$gemv>::submit(rt, x, a, out)
            }
            fn gemv_axpby_sum<'a>(
                rt: &pptm::Runtime,
                x: &'a pptm::Buffer<f32>,
                a: &'a pptm::Buffer<Self>,
                y: &'a pptm::Buffer<f32>,
                alpha: f32,
                beta: f32,
            ) -> Result<pptm::Ticket<'a, f32>, pptm::Error> {
                <$sum>::submit(rt, x, a, y, alpha, beta)
            }
        }
    };
}

/// A GEMV whose A is stored narrow (bf16 or fp8 on tensor cores, fp16 on CUDA cores) times the
/// f32 vector. The vector is not rounded (tensor cores carry it as two bf16 parts, CUDA cores
/// widen A instead), so every output must match the f64 product of A's stored values and x within
/// 1e-4 of its terms' magnitude, which x rounded to bf16 (2^-9) would miss. Shapes: rows whose
/// start is aligned for 16-byte loads (n a multiple of 8 for 16-bit A, of 16 for fp8) and not (read
/// element by element), partial 16-row tiles, a row shorter than one warp's 64 columns and longer
/// than the block's 1024, m past GEMV_SHORT_BELOW (four rows a warp on CUDA cores; at 8195 the
/// last warp has three), m = 2^20 + 3, and aligned rows whose pieces do not split evenly into the
/// quarters that one row a warp is read in (1023 x 1040, 33 x 2056). Outputs are poisoned with NaN
/// first.
pub fn gemv_narrow_matches_f64<T: GemvStorage>(rt: &Runtime) {
    let name = T::NAME;
    for (m, n) in [
        (1, 1),
        (7, 3),
        (16, 8),
        (17, 4099),
        (1023, 1025),
        (1000, 1000),
        (1023, 1040),
        (33, 2056),
        (4096, 4096),
        (8200, 64),
        (8195, 48),
        ((1 << 20) + 3, 7),
        (5, 1 << 16),
    ] {
        let x = uniform(n, -1.0, 1.0);
        let a: Vec<T> = uniform(m * n, -1.0, 1.0)
            .into_iter()
            .map(T::from_f32)
            .collect();
        let y = uniform(m, -1.0, 1.0);
        let (alpha, beta) = (0.75f32, -1.25f32);
        let mut want = vec![0.0f64; m];
        let mut scale = vec![0.0f64; m];
        for i in 0..m {
            for j in 0..n {
                let t = a[i * n + j].to_f64() * f64::from(x[j]);
                want[i] += t;
                scale[i] += t.abs();
            }
        }
        let (xb, ab, yb) = (
            rt.upload(&x).unwrap(),
            rt.upload(&a).unwrap(),
            rt.upload(&y).unwrap(),
        );
        let mut out = rt.upload(&vec![f32::NAN; m]).unwrap();
        T::gemv(rt, &xb, &ab, &mut out).unwrap().wait().unwrap();
        let got = out.to_vec().unwrap();
        for i in 0..m {
            let tol = 1e-4 * scale[i].max(1e-3);
            let err = (f64::from(got[i]) - want[i]).abs();
            assert!(
                err < tol,
                "Gemv {name} m={m} n={n} row {i}: got {}, f64 reference {}, error {err:e}, tolerance {tol:e}",
                got[i],
                want[i]
            );
        }
        // s = sum of z_i^2 = sum of z_i (alpha (A x)_i + beta y_i): its terms are z_i times z_i's,
        // so the bar is 1e-4 of sum |z_i| (|alpha| scale_i + |beta y_i|), as for each row. (Plain
        // relative error would fail where z_i cancels: m = n = 1 with 0.75 a x near 1.25 y, seen
        // on an H200 at 1.7e-4 with every row inside its bar.) With nothing cancelling, the two
        // are the same.
        let (mut want_sum, mut magnitude) = (0.0f64, 0.0f64);
        for i in 0..m {
            let (ax, by) = (
                f64::from(alpha) * want[i],
                f64::from(beta) * f64::from(y[i]),
            );
            let z = ax + by;
            want_sum += z * z;
            magnitude += z.abs() * (f64::from(alpha).abs() * scale[i] + by.abs());
        }
        let got_sum = T::gemv_axpby_sum(rt, &xb, &ab, &yb, alpha, beta)
            .unwrap()
            .wait()
            .unwrap();
        let err = (f64::from(got_sum) - want_sum).abs();
        assert!(
            err <= 1e-4 * magnitude,
            "GemvAxpbySum {name} m={m} n={n}: got {got_sum}, f64 reference {want_sum}, error {err:e}, terms' magnitude {magnitude:e}"
        );
    }
    // An infinite element of x stays infinite (on tensor cores its low part is 0, not inf - inf).
    let (m, n) = (19, 9);
    let mut x = vec![0.5f32; n];
    x[3] = f32::INFINITY;
    let a = rt.upload(&vec![T::from_f32(1.0); m * n]).unwrap();
    let mut out = rt.upload(&vec![f32::NAN; m]).unwrap();
    T::gemv(rt, &rt.upload(&x).unwrap(), &a, &mut out)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(out.to_vec().unwrap(), vec![f32::INFINITY; m]);
}

/// A belief-update chain whose Jacobian is stored as `Self`: mu + lr Jᵀ (prec ⊙ (obs − pred)).
pub trait BeliefStorage: Element {
    fn from_f32(x: f32) -> Self;
    #[allow(clippy::too_many_arguments)]
    fn submit<'a>(
        rt: &Runtime,
        obs: &'a Buffer<f32>,
        pred: &'a Buffer<f32>,
        prec: &'a Buffer<f32>,
        j: &'a Buffer<Self>,
        mu: &'a Buffer<f32>,
        lr: f32,
        out: &'a mut Buffer<f32>,
    ) -> Result<Ticket<'a, ()>, Error>;
}

/// `belief_storage!(type, BeliefUpdateChain, |x: f32| conversion)` implements [`BeliefStorage`].
#[allow(unused_macros)]
macro_rules! belief_storage {
    ($t:ty, $chain:ty, $from_f32:expr) => {
        impl common::gemv::BeliefStorage for $t {
            fn from_f32(x: f32) -> Self {
                ($from_f32)(x)
            }
            fn submit<'a>(
                rt: &pptm::Runtime,
                obs: &'a pptm::Buffer<f32>,
                pred: &'a pptm::Buffer<f32>,
                prec: &'a pptm::Buffer<f32>,
                j: &'a pptm::Buffer<Self>,
                mu: &'a pptm::Buffer<f32>,
                lr: f32,
                out: &'a mut pptm::Buffer<f32>,
            ) -> Result<pptm::Ticket<'a, ()>, pptm::Error> {
                <$chain>::submit(rt, obs, pred, prec, j, mu, lr, out)
            }
        }
    };
}

/// `mu + lr Jᵀ (prec ⊙ (obs − pred))` with J as stored, and, per output, the magnitude its f32
/// error is judged on: |mu_j| + |lr| Σ_i |J_ij prec_i (obs_i − pred_i)|.
#[allow(clippy::too_many_arguments)]
fn belief_reference<T: Element>(
    obs: &[f32],
    pred: &[f32],
    prec: &[f32],
    j: &[T],
    mu: &[f32],
    lr: f32,
    m: usize,
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let e: Vec<f64> = (0..m)
        .map(|i| f64::from(prec[i]) * (f64::from(obs[i]) - f64::from(pred[i])))
        .collect();
    let lr = f64::from(lr);
    (0..n)
        .map(|c| {
            let (mut g, mut scale) = (0.0, 0.0);
            for i in 0..m {
                let t = j[i * n + c].to_f64() * e[i];
                g += t;
                scale += t.abs();
            }
            let mu = f64::from(mu[c]);
            (mu + lr * g, mu.abs() + lr.abs() * scale)
        })
        .unzip()
}

/// The belief update with J stored as `T`, every output within 1e-4 of its magnitude of the f64
/// value computed from J's stored values. Below 4096 columns a GEMV-T tile is 8 columns, from
/// there 32 (the two sides of GEMV_T_NARROW_BELOW); 2048 rows are one staged chunk of the
/// prologue; a narrow J is read a word a lane where n is a multiple of its elements per word (even
/// n for 16-bit J, n % 4 == 0 for fp8) and element by element otherwise.
pub fn belief_update_matches_f64<T: BeliefStorage>(rt: &Runtime) {
    for (m, n) in [
        (1, 1),
        (7, 5),
        (256, 256),
        (1023, 17),
        (3, 4099),
        (2048, 2048),
        (4097, 9),
        (2049, 4096),
        (300, 4102),
    ] {
        let (obs, pred) = (uniform(m, -1.0, 1.0), uniform(m, -1.0, 1.0));
        let prec = uniform(m, 0.1, 2.0);
        let jac: Vec<T> = uniform(m * n, -1.0, 1.0)
            .into_iter()
            .map(T::from_f32)
            .collect();
        let mu = uniform(n, -1.0, 1.0);
        let lr = 0.05;
        let (want, scale) = belief_reference(&obs, &pred, &prec, &jac, &mu, lr, m, n);
        let (ob, pb, wb, jb, mb) = (
            rt.upload(&obs).unwrap(),
            rt.upload(&pred).unwrap(),
            rt.upload(&prec).unwrap(),
            rt.upload(&jac).unwrap(),
            rt.upload(&mu).unwrap(),
        );
        let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
        T::submit(rt, &ob, &pb, &wb, &jb, &mb, lr, &mut out)
            .unwrap()
            .wait()
            .unwrap();
        let got = out.to_vec().unwrap();
        for c in 0..n {
            let err = (f64::from(got[c]) - want[c]).abs() / scale[c];
            assert!(
                err < 1e-4,
                "J {:?} m={m} n={n} output {c}: got {}, f64 reference {}, error {err:e} of scale {}",
                T::DTYPE,
                got[c],
                want[c],
                scale[c]
            );
        }
    }
}
