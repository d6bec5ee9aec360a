//! BeliefUpdateStep (domain `inference`): prediction error → precision weighting → Jᵀ · →
//! belief update, on every backend, against an f64 reference (tests/common/gemv.rs, whose body
//! tests/narrow.rs runs on the bf16 Jacobian of BeliefUpdateStepBf16).

#[macro_use]
mod common;

use pptm::chains::BeliefUpdateStep;
use pptm::{Error, Runtime};

belief_storage!(f32, BeliefUpdateStep, |x: f32| x);

fn belief_update_matches_f64_reference(rt: &Runtime) {
    common::gemv::belief_update_matches_f64::<f32>(rt);
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
