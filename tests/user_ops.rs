//! `#[pptm::op]`: an elementwise op written as a Rust function (issue 32, first part). The macro
//! keeps the function (the op's CPU reference), checks it against the op subset and adds the op's
//! marker type with its description and translated device code. Chains that name such an op are
//! lowered with `lower_with`; the derive and build.rs do not find these ops yet.

use pptm::__private::{ChainSpec, CpuImpl, StageSpec, Ty, lower_with};
use pptm::{UserOp, op};

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
