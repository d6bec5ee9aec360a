//! The CUDA C that pptm-spec's op subset translator emits (`#[pptm::op]`, issue 32) compiles with
//! the pinned NVRTC, and a translation unit that holds several ops after the shared helpers
//! compiles too. Skipped, saying so, where NVRTC is not installed (it is in CI: the pip wheels).

use pptm_codegen::nvrtc::Nvrtc;
use pptm_spec::op_fn::{parse_op, parse_op_attr, parse_op_fn};

const OPS: &[&str] = &[
    "fn swish(x: f32, beta: f32) -> f32 { x / (1.0 + (-beta * x).exp()) }",
    "fn huber(r: f64, delta: f32) -> f64 {
         let a = r.abs();
         let d = delta as f64;
         if a <= d { 0.5 * r * r } else { d * (a - 0.5 * d) }
     }",
    "fn gelu_tanh(x: f32) -> f32 {
         let k = (2.0_f32 / std::f32::consts::PI).sqrt();
         0.5 * x * (1.0 + (k * (x + 0.044715 * x.powi(3))).tanh())
     }",
    "fn relu6(x: f32) -> f32 { if x < 0.0 { 0.0 } else if x > 6.0 { let s = 6.0_f32; s } else { x } }",
    "fn quantise(x: f32, levels: u32) -> f32 { let k = (x * levels as f32) as u32; k as f32 / levels as f32 }",
    "fn mixed(x: f64, y: f64) -> f64 { f64::max(x.mul_add(y, 1.0), x.clamp(-1.0, 1.0).recip()) % 3.0 }",
    "fn limits(x: f32) -> f32 { if x.is_finite_free() { x } else { f32::MAX } }",
];

#[test]
fn translated_ops_compile_with_nvrtc() {
    let nvrtc = match Nvrtc::find() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("SKIPPED (no NVRTC: {e}): translated_ops_compile_with_nvrtc");
            return;
        }
    };
    let mut unit = String::from(pptm_spec::op_fn::HELPERS);
    for src in OPS {
        let f: syn::ItemFn = syn::parse_str(src).unwrap();
        match parse_op_fn(&f) {
            Ok(op) => unit.push_str(&op.cuda),
            // The last one uses a method outside the subset: refused, not emitted.
            Err(e) => assert!(src.contains("is_finite_free"), "{src}: {e}"),
        }
    }
    for (attr, src) in REDUCTIONS {
        unit.push_str(&reduction(attr, src).cuda);
    }
    // Call each op once, so the compiler checks the calls' types as well as the definitions.
    unit.push_str(
        "extern \"C\" __global__ void use_ops(float* o, double* d, unsigned int n) {
             o[0] = pptm_user_swish(o[1], o[2]);
             d[0] = pptm_user_huber(d[1], o[3]);
             o[4] = pptm_user_gelu_tanh(o[5]);
             o[6] = pptm_user_relu6(o[7]);
             o[8] = pptm_user_quantise(o[9], n);
             d[2] = pptm_user_mixed(d[3], d[4]);
             d[5] = pptm_user_log_sum_exp_reducer::finish(pptm_user_log_sum_exp_reducer::combine(pptm_user_log_sum_exp_reducer::identity(), d[6]), n);
             d[7] = pptm_user_rms_reducer::finish(pptm_user_rms_reducer::combine(pptm_user_rms_reducer::identity(), d[8]), n);
         }\n",
    );
    let options = vec![
        "--gpu-architecture=compute_80".to_string(),
        "--std=c++17".to_string(),
    ];
    let ptx = nvrtc
        .compile("user_ops.cu", &unit, &[], &options)
        .unwrap_or_else(|e| panic!("NVRTC refused the translated ops: {e}\n{unit}"));
    assert!(ptx.contains(".entry use_ops"), "{ptx}");
}

/// Reductions: the attribute's arguments and the combine.
const REDUCTIONS: &[(&str, &str)] = &[
    (
        "reduction(identity = f64::NEG_INFINITY)",
        "fn log_sum_exp(a: f64, b: f64) -> f64 {
             let m = a.max(b);
             if m == f64::NEG_INFINITY { m } else { m + ((a - m).exp() + (b - m).exp()).ln() }
         }",
    ),
    (
        "reduction(identity = 0.0, finish = |total, count| { let mean = total / count; mean.sqrt() })",
        "fn rms(a: f64, b: f64) -> f64 { a + b }",
    ),
];

fn reduction(attr: &str, src: &str) -> pptm_spec::op_fn::OpFn {
    let attr = parse_op_attr(attr.parse().unwrap()).unwrap();
    let f: syn::ItemFn = syn::parse_str(src).unwrap();
    parse_op(&attr, &f).unwrap()
}

/// A user op as the runtime will get it (the CPU reference is beside the point here).
fn user_op(src: &str, tensors: &[&str]) -> &'static pptm_spec::OpDef {
    let f: syn::ItemFn = syn::parse_str(src).unwrap();
    let op = parse_op_fn(&f).unwrap();
    let tensors: Vec<String> = tensors.iter().map(|t| t.to_string()).collect();
    op.leak_def(&tensors).unwrap()
}

fn chain(
    name: &str,
    stages: &[(&str, bool, Option<pptm_spec::Precision>)],
) -> pptm_spec::ChainSpec {
    pptm_spec::ChainSpec {
        name: name.into(),
        domain: "user".into(),
        stages: stages
            .iter()
            .enumerate()
            .map(|(i, &(op, reduction, precision))| pptm_spec::StageSpec {
                field: format!("s{i}"),
                number: i as u32 + 1,
                op: op.into(),
                reduction: reduction.then_some(true),
                precision,
                ..Default::default()
            })
            .collect(),
    }
}

#[test]
fn chains_of_user_ops_fuse_and_compile_with_nvrtc() {
    use pptm_spec::{ArgKind, Pattern, Precision, lower_with};
    let swish = user_op(
        "fn swish(x: f32, beta: f32) -> f32 { x / (1.0 + (-beta * x).exp()) }",
        &[],
    );
    let huber = user_op(
        "fn huber(r: f64, delta: f32) -> f64 { let a = r.abs(); let d = delta as f64; if a <= d { 0.5 * r * r } else { d * (a - 0.5 * d) } }",
        &[],
    );
    let sq_err = user_op(
        "fn sq_err(pred: f32, obs: f32) -> f32 { let d = pred - obs; d * d }",
        &["obs"],
    );
    let extra = [swish, huber, sq_err];
    assert_eq!(swish.name, "Swish");
    assert_eq!(sq_err.name, "SqErr");

    let total = lower_with(
        &chain(
            "SwishSum",
            &[("Swish", false, None), ("SumReduction", true, None)],
        ),
        &extra,
    )
    .unwrap();
    assert_eq!(total.plan.pattern, Pattern::Map);
    assert!(
        total
            .args
            .iter()
            .any(|a| a.name == "beta" && a.kind == ArgKind::F32)
    );
    assert!(total.canonical.contains(" cuda="), "{}", total.canonical);
    // A GEMV's epilogue, exactly like a built-in elementwise op.
    let layer = lower_with(
        &chain(
            "GemvSwish",
            &[("Gemv", false, None), ("Swish", false, None)],
        ),
        &extra,
    )
    .unwrap();
    assert_eq!(layer.plan.pattern, Pattern::Gemv);
    assert_eq!(layer.plan.epilogue, 1..2);
    let loss = lower_with(
        &chain(
            "HuberSum",
            &[
                ("Huber", false, Some(Precision::Fp64)),
                ("SumReduction", true, Some(Precision::Fp64)),
            ],
        ),
        &extra,
    )
    .unwrap();
    let mse = lower_with(
        &chain(
            "SqErrSum",
            &[("SqErr", false, None), ("SumReduction", true, None)],
        ),
        &extra,
    )
    .unwrap();
    assert!(
        mse.args
            .iter()
            .any(|a| a.name == "obs" && a.kind == ArgKind::Input)
    );
    // An f32 op has no fp64 form; a name of a built-in is refused.
    let e = lower_with(
        &chain("SwishF64", &[("Swish", false, Some(Precision::Fp64))]),
        &extra,
    )
    .unwrap_err();
    assert!(e.to_string().contains("fp64"), "{e}");
    // Two different ops of one name are refused (the same op found twice is one op).
    let other_swish = user_op("fn swish(x: f32, beta: f32) -> f32 { x * beta }", &[]);
    let e = lower_with(
        &chain("S", &[("Swish", false, None)]),
        &[swish, other_swish],
    )
    .unwrap_err();
    assert!(e.to_string().contains("two ops of your own"), "{e}");
    lower_with(&chain("S", &[("Swish", false, None)]), &[swish, swish]).unwrap();
    let relu = user_op("fn relu(x: f32) -> f32 { x.max(0.0) }", &[]);
    let e = lower_with(&chain("R", &[("Relu", false, None)]), &[relu]).unwrap_err();
    assert!(
        e.to_string().contains("has the name of a built-in op"),
        "{e}"
    );

    // A reduction of the user's own ends a pass like SumReduction: after an elementwise prologue,
    // and as a GEMV's epilogue reduction.
    let lse = reduction(REDUCTIONS[0].0, REDUCTIONS[0].1)
        .leak_def(&[])
        .unwrap();
    assert_eq!(lse.name, "LogSumExp");
    let extra = [swish, huber, sq_err, lse];
    let soft = lower_with(
        &chain(
            "SwishLse",
            &[("Swish", false, None), ("LogSumExp", true, None)],
        ),
        &extra,
    )
    .unwrap();
    assert_eq!(soft.plan.pattern, Pattern::Map);
    assert_eq!(soft.reduction().map(|s| s.op.name), Some("LogSumExp"));
    let logits = lower_with(
        &chain(
            "GemvLse",
            &[("Gemv", false, None), ("LogSumExp", true, None)],
        ),
        &extra,
    )
    .unwrap();
    assert_eq!(logits.plan.pattern, Pattern::Gemv);

    let chains = [total, layer, loss, mse, soft, logits];
    let source = pptm_codegen::cuda::domain_source("user", &chains);
    assert_eq!(
        source
            .matches("__device__ __forceinline__ float pptm_user_swish(")
            .count(),
        1,
        "{source}"
    );
    assert!(
        source.contains("pptm_map_reduce<1, pptm_user_log_sum_exp_reducer>")
            || source.contains("pptm_user_log_sum_exp_reducer>("),
        "{source}"
    );
    let nvrtc = match Nvrtc::find() {
        Ok(n) => n,
        Err(e) => {
            eprintln!(
                "SKIPPED (no NVRTC: {e}): the NVRTC half of chains_of_user_ops_fuse_and_compile_with_nvrtc"
            );
            return;
        }
    };
    for arch in pptm_codegen::ARCHS {
        nvrtc
            .compile(
                "generated/user/user.cu",
                &source,
                pptm_codegen::kernels::headers(),
                &pptm_codegen::project::nvrtc_options(arch),
            )
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
    }
}
