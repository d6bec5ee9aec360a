//! The CUDA C that pptm-spec's op subset translator emits (`#[pptm::op]`, issue 32) compiles with
//! the pinned NVRTC, and a translation unit that holds several ops (each with the shared helpers)
//! compiles too. Skipped, saying so, where NVRTC is not installed (it is in CI: the pip wheels).

use pptm_codegen::nvrtc::Nvrtc;
use pptm_spec::op_fn::parse_op_fn;

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
    let mut unit = String::new();
    for src in OPS {
        let f: syn::ItemFn = syn::parse_str(src).unwrap();
        match parse_op_fn(&f) {
            Ok(op) => unit.push_str(&op.cuda),
            // The last one uses a method outside the subset: refused, not emitted.
            Err(e) => assert!(src.contains("is_finite_free"), "{src}: {e}"),
        }
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
