//! Elementwise stages after a reduction (a chain's *finish*) run on the reduced scalar:
//! `SumReduction → Square` is (Σ x)², meant and documented (docs/dsl.md, fusion rules), not Σ x².

use pptm_spec::{ArgValue, ChainSpec, EvalArg, Evaluated, StageSpec, lower};

fn stage(number: u32, op: &str) -> StageSpec {
    StageSpec {
        field: op.to_lowercase(),
        number,
        op: op.into(),
        args: vec![],
        ..Default::default()
    }
}

fn eval(ops: &[&str], x: &[f32]) -> f64 {
    let spec = ChainSpec {
        name: "Finish".into(),
        domain: "finish".into(),
        stages: ops
            .iter()
            .enumerate()
            .map(|(i, op)| stage(i as u32 + 1, op))
            .collect(),
    };
    let ir = lower(&spec).unwrap();
    let values: Vec<ArgValue> = ir
        .args
        .iter()
        .map(|a| match a.kind {
            pptm_spec::ArgKind::Input => ArgValue::Buffer(x.len()),
            _ => ArgValue::Inferred,
        })
        .collect();
    let sizes = ir.bind(&values).unwrap();
    let args: Vec<EvalArg> = ir
        .args
        .iter()
        .map(|a| match a.kind {
            pptm_spec::ArgKind::Input => EvalArg::Input(x),
            _ => EvalArg::None,
        })
        .collect();
    match ir.eval_f64(&args, &sizes) {
        Evaluated::Scalar(v) => v,
        Evaluated::Vector(_) => panic!("a reduction gives a scalar"),
    }
}

#[test]
fn a_stage_after_a_reduction_runs_on_its_scalar() {
    let x = [1.0f32, 2.0, -4.0, 0.5];
    let sum: f64 = x.iter().map(|&v| f64::from(v)).sum();
    let squares: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    assert_eq!(eval(&["SumReduction", "Square"], &x), sum * sum);
    assert_eq!(eval(&["Square", "SumReduction"], &x), squares);
    assert_ne!(sum * sum, squares);
}
