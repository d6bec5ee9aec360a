//! `#[pptm::op]`: an elementwise op written as a Rust function (issue 32, first part). The macro
//! keeps the function (the op's CPU reference), checks it against the op subset and adds the op's
//! marker type with its description and translated device code. Chains in this crate name such
//! ops like built-in ones: build.rs and the derive find them in the sources, and the chains run on
//! every backend against f64 references written here.

#[macro_use]
mod common;

use common::uniform;
use pptm::__private::{ChainSpec, CpuImpl, StageSpec, Ty, lower_with};
use pptm::ops::SumReduction;
use pptm::{FusionBuilder, Runtime, UserOp, op};

/// Σ swish(x; β): an op of this crate's own, then a built-in reduction.
#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct SwishSum {
    #[stage(1)]
    act: Swish,
    #[stage(2, reduction = true)]
    total: SumReduction,
}

/// Σ w (pred − obs)²: an op with an input of its own and a value passed by value.
#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct WeightedLoss {
    #[stage(1)]
    err: WeightedSqErr,
    #[stage(2, reduction = true)]
    total: SumReduction,
}

fn user_op_chains_match_f64_references(rt: &Runtime) {
    for n in [1usize, 7, 1023, (1 << 20) + 3] {
        let x = uniform(n, -4.0, 4.0);
        let beta = 0.7f32;
        let got = SwishSum::submit(rt, &rt.upload(&x).unwrap(), beta)
            .unwrap()
            .wait()
            .unwrap();
        let (mut want, mut magnitude) = (0.0f64, 0.0f64);
        for &v in &x {
            let v = f64::from(v);
            let t = v / (1.0 + (-f64::from(beta) * v).exp());
            want += t;
            magnitude += t.abs();
        }
        let err = (f64::from(got) - want).abs();
        assert!(
            err <= 1e-5 * magnitude + 1e-30,
            "swish sum, n = {n}: got {got}, f64 reference {want}, error {err:e} of {magnitude:e}"
        );

        let (pred, obs) = (uniform(n, -1.0, 1.0), uniform(n, -1.0, 1.0));
        let w = 0.5f32;
        let got =
            WeightedLoss::submit(rt, &rt.upload(&pred).unwrap(), w, &rt.upload(&obs).unwrap())
                .unwrap()
                .wait()
                .unwrap();
        let want: f64 = pred
            .iter()
            .zip(&obs)
            .map(|(&p, &o)| f64::from(w) * (f64::from(p) - f64::from(o)).powi(2))
            .sum();
        assert!(
            (f64::from(got) - want).abs() <= 1e-5 * want.abs() + 1e-30,
            "weighted loss, n = {n}: got {got}, f64 reference {want}"
        );
    }
}

on_every_backend!(user_op_chains_match_f64_references);

#[op]
fn swish(x: f32, beta: f32) -> f32 {
    x / (1.0 + (-beta * x).exp())
}

#[op(tensors(obs))]
fn weighted_sq_err(pred: f32, w: f32, obs: f32) -> f32 {
    let d = pred - obs;
    w * d * d
}

#[op]
fn huber(r: f64, delta: f32) -> f64 {
    let a = r.abs();
    let d = delta as f64;
    if a <= d {
        0.5 * r * r
    } else {
        d * (a - 0.5 * d)
    }
}

fn cpu_of(def: &pptm::__private::OpDef) -> fn(&[f64]) -> f64 {
    match def.cpu {
        CpuImpl::Elementwise(f) => f,
        _ => panic!("{} is not elementwise", def.name),
    }
}

#[test]
fn an_op_is_described_and_its_cpu_reference_is_the_function() {
    let d = Swish::DEF;
    assert_eq!(d.name, "Swish");
    assert_eq!(d.device, "pptm_user_swish");
    assert!(
        d.cuda
            .contains("float pptm_user_swish(float x, float beta)"),
        "{}",
        d.cuda
    );
    let kinds: Vec<(&str, Ty)> = d.inputs.iter().map(|p| (p.name, p.ty)).collect();
    assert_eq!(kinds, vec![("x", Ty::Like), ("beta", Ty::F32)]);
    let mut rng = 0x2545F4914F6CDD1Du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
    };
    for _ in 0..1000 {
        let (x, b) = (next(), next());
        assert_eq!(
            cpu_of(d)(&[f64::from(x), f64::from(b)]),
            f64::from(swish(x, b))
        );
    }
    // The CPU backend passes [flow, inputs of their own, by-value values]: the macro puts each
    // back in the function's order.
    let w = WeightedSqErr::DEF;
    let kinds: Vec<(&str, Ty)> = w.inputs.iter().map(|p| (p.name, p.ty)).collect();
    assert_eq!(
        kinds,
        vec![("pred", Ty::Like), ("w", Ty::F32), ("obs", Ty::Like)]
    );
    assert_eq!(
        cpu_of(w)(&[1.0, 3.0, 2.0]),
        f64::from(weighted_sq_err(1.0, 2.0, 3.0))
    );
    let h = Huber::DEF;
    assert_eq!(
        h.precisions.len(),
        2,
        "an f64 op serves fp32 and fp64 stages"
    );
    assert_eq!(cpu_of(h)(&[3.0, 1.0]), huber(3.0, 1.0));
}

#[test]
fn a_chain_naming_an_op_of_ones_own_lowers_with_its_definition() {
    let stage = |number: u32, op: &str, reduction: bool| StageSpec {
        field: format!("s{number}"),
        number,
        op: op.into(),
        reduction: reduction.then_some(true),
        tensor_eligible: None,
        precision: None,
        tolerance: None,
        finite: None,
        args: Vec::new(),
    };
    let spec = ChainSpec {
        name: "WeightedLoss".into(),
        domain: "user".into(),
        stages: vec![
            stage(1, "WeightedSqErr", false),
            stage(2, "SumReduction", true),
        ],
    };
    let ir = lower_with(&spec, &[WeightedSqErr::DEF, Swish::DEF]).unwrap();
    let names: Vec<&str> = ir.args.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(&names[..3], &["pred", "w", "obs"], "{names:?}");
    // Without the definition it is an unknown op.
    let e = lower_with(&spec, &[]).unwrap_err();
    assert!(e.to_string().contains("unknown op `WeightedSqErr`"), "{e}");
}
