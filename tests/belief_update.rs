//! BeliefUpdateStep (domain `inference`): prediction error → precision weighting → Jᵀ · →
//! belief update, on every backend, against an f64 reference written here.

#[macro_use]
mod common;

use common::uniform;
use pptm::chains::BeliefUpdateStep;
use pptm::{Error, Runtime};

/// `mu + lr Jᵀ (prec ⊙ (obs − pred))` and, per output, the magnitude its f32 error is judged
/// on: |mu_j| + |lr| Σ_i |J_ij prec_i (obs_i − pred_i)|.
#[allow(clippy::too_many_arguments)]
fn reference(
    obs: &[f32],
    pred: &[f32],
    prec: &[f32],
    j: &[f32],
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
                let t = f64::from(j[i * n + c]) * e[i];
                g += t;
                scale += t.abs();
            }
            let mu = f64::from(mu[c]);
            (mu + lr * g, mu.abs() + lr.abs() * scale)
        })
        .unzip()
}

fn belief_update_matches_f64_reference(rt: &Runtime) {
    // Below 4096 columns a GEMV-T tile is 8 columns with four lanes each, from there 32 (the two
    // sides of GEMV_T_NARROW_BELOW); 2048 rows are one staged chunk of the prologue.
    for (m, n) in [
        (1, 1),
        (7, 5),
        (256, 256),
        (1023, 17),
        (3, 4099),
        (2048, 2048),
        (4097, 9),
        (2049, 4096),
    ] {
        let (obs, pred) = (uniform(m, -1.0, 1.0), uniform(m, -1.0, 1.0));
        let prec = uniform(m, 0.1, 2.0);
        let jac = uniform(m * n, -1.0, 1.0);
        let mu = uniform(n, -1.0, 1.0);
        let lr = 0.05;
        let (want, scale) = reference(&obs, &pred, &prec, &jac, &mu, lr, m, n);
        let up = |v: &[f32]| rt.upload(v).unwrap();
        let (ob, pb, wb, jb, mb) = (up(&obs), up(&pred), up(&prec), up(&jac), up(&mu));
        let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
        BeliefUpdateStep::submit(rt, &ob, &pb, &wb, &jb, &mb, lr, &mut out)
            .unwrap()
            .wait()
            .unwrap();
        let got = out.to_vec().unwrap();
        for c in 0..n {
            let err = (f64::from(got[c]) - want[c]).abs() / scale[c];
            assert!(
                err < 1e-4,
                "m={m} n={n} output {c}: got {}, f64 reference {}, error {err:e} of scale {}",
                got[c],
                want[c],
                scale[c]
            );
        }
    }
}

fn bad_shapes_are_typed_errors(rt: &Runtime) {
    let v3 = rt.upload(&[0.5f32; 3]).unwrap();
    let v2 = rt.upload(&[0.5f32; 2]).unwrap();
    let j7 = rt.upload(&[0.5f32; 7]).unwrap();
    let mut out = rt.alloc::<f32>(2).unwrap();
    match BeliefUpdateStep::submit(rt, &v3, &v3, &v3, &j7, &v2, 0.1, &mut out) {
        Err(Error::LengthMismatch {
            arg: "a",
            expected: 6,
            got: 7,
            rule,
            ..
        }) => {
            assert!(rule.contains("m x n = 3 x 2"), "{rule}")
        }
        other => panic!("expected LengthMismatch for `a`, got {other:?}"),
    }
    let j6 = rt.upload(&[0.5f32; 6]).unwrap();
    let mut out3 = rt.alloc::<f32>(3).unwrap();
    assert!(matches!(
        BeliefUpdateStep::submit(rt, &v3, &v3, &v3, &j6, &v2, 0.1, &mut out3),
        Err(Error::LengthMismatch { arg: "out", .. })
    ));
    assert!(matches!(
        BeliefUpdateStep::submit(rt, &v3, &v2, &v3, &j6, &v2, 0.1, &mut out),
        Err(Error::LengthMismatch { arg: "pred", .. })
    ));
}

on_every_backend!(
    belief_update_matches_f64_reference,
    bad_shapes_are_typed_errors
);
