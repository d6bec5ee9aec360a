//! The built-in ops written in the `#[pptm::op]` subset: each is one Rust function, which is its
//! f64 CPU reference, and from which [`device_header`] translates its device code (with
//! pptm-spec's `op_fn`, exactly as for an op of the user's own). The op's marker type, its catalog
//! entry and its fusion class come from the same declaration.
//!
//! The declarations read like `#[pptm::op]` functions with the marker's name in front:
//!
//! ```text
//! /// Doc of the op (and of its marker type).
//! Relu: #[op(f32_form)]
//! fn relu(x: f64) -> f64 { x.max(0.0) }
//! ```
//!
//! The attribute takes what `#[pptm::op(...)]` takes, in this order: `tensors(...)` then
//! `f32_form`, or `reduction(identity = ..., finish = ...)`. The marker's name is the function's
//! in CamelCase (a test checks it). Every parameter before the by-value ones is either the flow
//! or in `tensors(...)`, as the CPU backend hands them over in that order (checked when the
//! catalog entry is built, at compile time).
//!
//! Ops whose device code must be written by hand (tensor cores, the pairwise patterns, KL's
//! tuned logarithm) stay in the family modules beside this one.

use super::{CpuImpl, FusionClass, Op, OpDef, Param, Ty};
use crate::Precision;

/// The include name of the header [`device_header`] generates.
pub const HEADER: &str = "pptm/ops/subset.cuh";

/// The catalog entry's inputs for parameters `names` of Rust types `types` ("f64", "f32" or
/// "u32"), of which those in `tensors` (and the first, the flow) are inputs of their own: what
/// `OpFn::catalog_params` computes for an op of the user's own, at compile time. Panics (a
/// compile error, in a const) where the CPU backend's order (flow, tensors, by-value) is not the
/// parameters' or an f64 is passed by value.
const fn params<const N: usize>(
    names: [&'static str; N],
    types: [&str; N],
    tensors: &[&str],
) -> [Param; N] {
    let mut out = [Param {
        name: "",
        ty: Ty::Like,
    }; N];
    let mut by_value_seen = false;
    let mut i = 0;
    while i < N {
        let mut tensor = i == 0;
        let mut t = 0;
        while t < tensors.len() {
            tensor |= str_eq(tensors[t], names[i]);
            t += 1;
        }
        let ty = if tensor {
            assert!(!by_value_seen, "tensor inputs come before by-value ones");
            Ty::Like
        } else if str_eq(types[i], "f32") {
            Ty::F32
        } else if str_eq(types[i], "u32") {
            Ty::U32
        } else {
            panic!("an f64 parameter is the flow or in tensors(...)")
        };
        by_value_seen |= !tensor;
        out[i] = Param { name: names[i], ty };
        i += 1;
    }
    out
}

/// The precisions of an op returning `ret` (as `OpFn::precisions`).
const fn precisions(ret: &str) -> &'static [Precision] {
    if str_eq(ret, "f64") {
        &[Precision::Fp32, Precision::Fp64]
    } else {
        &[Precision::Fp32]
    }
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Declares each op: its function (the CPU reference), its marker type and the marker's [`Op`]
/// impl (the catalog entry), and [`SUBSET`].
macro_rules! subset_ops {
    ($(
        $(#[doc = $doc:literal])*
        $marker:ident: #[op $(($($attr:tt)*))?]
        fn $f:ident($($p:ident: $pty:ident),* $(,)?) -> $ret:ident $body:block
    )*) => {
        $(
            $(#[doc = $doc])*
            ///
            /// The op's CPU reference (and the source of its device code).
            #[allow(clippy::unnecessary_cast)]
            pub fn $f($($p: $pty),*) -> $ret $body

            $(#[doc = $doc])*
            #[derive(Debug, Clone, Copy, Default)]
            pub struct $marker;

            #[allow(clippy::unnecessary_cast, clippy::cast_possible_truncation)]
            impl Op for $marker {
                const DEF: &'static OpDef = &subset_ops!(
                    @def $marker, $f, [$($p: $pty),*], $ret, concat!($($doc),*), ($($($attr)*)?)
                );
            }
        )*

        /// Every op declared here, in order.
        pub const SUBSET: &[&OpDef] = &[$(<$marker as Op>::DEF),*];
    };

    // A reduction: `fn(a: f64, b: f64) -> f64` is its combine.
    (@def $marker:ident, $f:ident, [$($p:ident: $pty:ident),*], $ret:ident, $doc:expr,
        (reduction(identity = $identity:expr $(, finish = $finish:expr)?))) => {
        OpDef {
            name: stringify!($marker),
            class: FusionClass::Reduction,
            inputs: &[Param { name: "x", ty: Ty::Like }],
            output: Ty::Scalar,
            flow_channels: Some(1),
            out_channels: Some(1),
            states: crate::ops::StateTypes::NONE,
            precisions: &[Precision::Fp32, Precision::Fp64],
            tensor_precisions: &[],
            lanes: 1,
            header: HEADER,
            cuda: "",
            device: concat!("pptm_op_", stringify!($f), "_reducer"),
            cpu: CpuImpl::Reduction {
                identity: $identity,
                combine: $f,
                fold: $crate::fold_fn!($f),
                finish: subset_ops!(@finish $($finish)?),
            },
            check: None,
            doc: $doc,
        }
    };

    // `finish(total, n)` from the attribute's `|total, n| ...` (n an f64), or the total itself.
    (@finish) => { |total, _| total };
    (@finish $finish:expr) => {
        |total, n| {
            let finish: fn(f64, f64) -> f64 = $finish;
            #[allow(clippy::cast_precision_loss)]
            let n = n as f64;
            finish(total, n)
        }
    };

    // An elementwise op.
    (@def $marker:ident, $f:ident, [$($p:ident: $pty:ident),*], $ret:ident, $doc:expr,
        ($(tensors($($t:ident),*))? $(,)? $(f32_form)?)) => {
        OpDef {
            name: stringify!($marker),
            class: FusionClass::Elementwise,
            inputs: &params(
                [$(stringify!($p)),*],
                [$(stringify!($pty)),*],
                &[$($(stringify!($t)),*)?],
            ),
            output: Ty::Like,
            flow_channels: Some(1),
            out_channels: Some(1),
            states: crate::ops::StateTypes::NONE,
            precisions: precisions(stringify!($ret)),
            tensor_precisions: &[],
            lanes: 1,
            header: HEADER,
            cuda: "",
            device: concat!("pptm_op_", stringify!($f)),
            // The CPU backend hands over [flow, tensors in order, by-value arguments in order]:
            // the parameters' own order (`params` checks it).
            cpu: CpuImpl::Elementwise($crate::element_fn!(|x| {
                let &[$($p),*] = x else {
                    return f64::NAN;
                };
                $f($($p as $pty),*) as f64
            })),
            check: None,
            doc: $doc,
        }
    };
}

subset_ops! {
    /// `obs - pred` per element. Inputs `obs`, `pred`; elementwise.
    PredictionError: #[op(tensors(pred), f32_form)]
    fn prediction_error(obs: f64, pred: f64) -> f64 {
        obs - pred
    }

    /// `prec e` per element: a precision-weighted prediction error. Inputs: the previous
    /// stage's vector (or `e`), `prec`; elementwise.
    PrecisionWeight: #[op(tensors(prec), f32_form)]
    fn precision_weight(e: f64, prec: f64) -> f64 {
        prec * e
    }

    /// `-1/2 prec e^2` per element: the precision-weighted accuracy of an error. Inputs: the
    /// previous stage's vector (or `e`), `prec`; elementwise.
    Accuracy: #[op(tensors(prec), f32_form)]
    fn accuracy(e: f64, prec: f64) -> f64 {
        -0.5 * prec * e * e
    }

    /// `alpha x + beta y` per element; `alpha`, `beta` are f32 arguments. Elementwise.
    Axpby: #[op(tensors(y), f32_form)]
    fn axpby(x: f64, y: f64, alpha: f32, beta: f32) -> f64 {
        alpha as f64 * x + beta as f64 * y
    }

    /// `mu + lr g` per element: a gradient step on beliefs `mu`; `lr` is an f32 argument.
    /// Elementwise.
    BeliefUpdate: #[op(tensors(mu), f32_form)]
    fn belief_update(g: f64, mu: f64, lr: f32) -> f64 {
        mu + lr as f64 * g
    }

    /// `x²` per element. Elementwise.
    Square: #[op(f32_form)]
    fn square(x: f64) -> f64 {
        x * x
    }

    /// `max(x, 0)` (ReLU). Elementwise.
    Relu: #[op(f32_form)]
    fn relu(x: f64) -> f64 {
        x.max(0.0)
    }

    /// `1 / (1 + e^-x)`, the logistic sigmoid. Elementwise.
    Sigmoid: #[op(f32_form)]
    fn sigmoid(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }

    /// `tanh x`. Elementwise.
    Tanh: #[op(f32_form)]
    fn tanh(x: f64) -> f64 {
        x.tanh()
    }

    /// Sum of every element (f64 accumulation). Input: the previous stage's vector, or `x`;
    /// reduction.
    SumReduction: #[op(reduction(identity = 0.0))]
    fn sum_reduction(a: f64, b: f64) -> f64 {
        a + b
    }

    /// Mean of every element (f64 accumulation; NaN for none). Reduction.
    MeanReduction: #[op(reduction(identity = 0.0, finish = |total, n| total / n))]
    fn mean_reduction(a: f64, b: f64) -> f64 {
        a + b
    }

    /// Largest element (-inf for none; NaN elements ignored, as `f64::max` and CUDA's `fmax` do).
    /// Reduction.
    MaxReduction: #[op(reduction(identity = f64::NEG_INFINITY))]
    fn max_reduction(a: f64, b: f64) -> f64 {
        a.max(b)
    }
}

/// The ops of this file, read back from its source: (marker name, attribute, function).
#[cfg(feature = "parse")]
fn declarations() -> syn::Result<Vec<(syn::Ident, crate::op_fn::OpAttr, syn::ItemFn)>> {
    use syn::parse::Parser;
    let file: syn::File = syn::parse_str(include_str!("subset.rs"))?;
    let body = file
        .items
        .iter()
        .find_map(|item| match item {
            syn::Item::Macro(m) if m.mac.path.is_ident("subset_ops") => Some(m.mac.tokens.clone()),
            _ => None,
        })
        .ok_or_else(|| syn::Error::new(proc_macro2::Span::call_site(), "no subset_ops! { .. }"))?;
    let parser = |input: syn::parse::ParseStream| {
        let mut out = Vec::new();
        while !input.is_empty() {
            input.call(syn::Attribute::parse_outer)?;
            let marker: syn::Ident = input.parse()?;
            input.parse::<syn::Token![:]>()?;
            let mut f: syn::ItemFn = input.parse()?;
            let attr = f
                .attrs
                .iter()
                .position(crate::parse::is_op_attr)
                .map(|i| f.attrs.remove(i))
                .ok_or_else(|| syn::Error::new(marker.span(), "an op needs #[op]"))?;
            let args = match attr.meta {
                syn::Meta::List(l) => l.tokens,
                _ => proc_macro2::TokenStream::new(),
            };
            out.push((marker, crate::op_fn::parse_op_attr(args)?, f));
        }
        Ok(out)
    };
    parser.parse2(body)
}

/// The device code of every op here, translated from this file's source: the header
/// [`HEADER`] names, which codegen embeds beside the hand-written ones under `kernels/`.
#[cfg(feature = "parse")]
pub fn device_header() -> String {
    let mut out = String::from(
        "// The built-in ops written in the #[pptm::op] subset, translated from\n\
         // spec/src/ops/subset.rs (generated by pptm-codegen: edit the Rust source, not this).\n\
         #ifndef PPTM_OPS_SUBSET_CUH\n#define PPTM_OPS_SUBSET_CUH\n\n#include \"pptm/device.cuh\"\n",
    );
    out.push_str(crate::op_fn::HELPERS);
    let declarations = declarations().expect("spec/src/ops/subset.rs reads back (a test checks)");
    for (_, attr, f) in declarations {
        let op = crate::op_fn::parse_op_as(&attr, &f, crate::op_fn::BUILTIN_PREFIX, &[])
            .expect("every op in spec/src/ops/subset.rs translates (a test checks)");
        out.push('\n');
        out.push_str(&op.cuda);
    }
    out.push_str("\n#endif  // PPTM_OPS_SUBSET_CUH\n");
    out
}

#[cfg(all(test, feature = "parse"))]
mod tests {
    use super::*;

    /// Each entry built by the macro at compile time is the one `op_fn` builds from the same
    /// function for an op of the user's own: one description, not two.
    #[test]
    fn catalog_entries_are_what_the_translator_reads() {
        let declarations = declarations().unwrap();
        let header = device_header();
        assert_eq!(declarations.len(), SUBSET.len());
        for ((marker, attr, f), def) in declarations.iter().zip(SUBSET) {
            let op = crate::op_fn::parse_op_as(attr, f, crate::op_fn::BUILTIN_PREFIX, &[])
                .unwrap_or_else(|e| panic!("{marker}: {e}"));
            assert_eq!(
                op.op_name(),
                marker.to_string(),
                "the marker is the fn's CamelCase"
            );
            assert_eq!(def.name, marker.to_string());
            let want = op.leak_def(&attr.tensor_names()).unwrap();
            assert_eq!(def.class, want.class, "{marker}");
            assert_eq!(def.inputs, want.inputs, "{marker}");
            assert_eq!(def.output, want.output, "{marker}");
            assert_eq!(def.precisions, want.precisions, "{marker}");
            assert_eq!(def.device, want.device, "{marker}");
            assert!(header.contains(&op.cuda), "{marker}");
        }
    }

    #[test]
    #[should_panic(expected = "tensor inputs come before by-value ones")]
    fn a_by_value_parameter_before_a_tensor_is_refused() {
        // The CPU backend hands over [flow, tensors, by-value]: `a` before `y` would misplace them.
        params(["x", "a", "y"], ["f64", "f32", "f64"], &["y"]);
    }

    #[test]
    #[should_panic(expected = "an f64 parameter is the flow or in tensors(...)")]
    fn an_f64_passed_by_value_is_refused() {
        params(["x", "y"], ["f64", "f64"], &[]);
    }

    #[test]
    fn params_are_the_flow_tensors_then_by_value() {
        let p = params(["x", "y", "a", "k"], ["f64", "f64", "f32", "u32"], &["y"]);
        let tys: Vec<Ty> = p.iter().map(|p| p.ty).collect();
        assert_eq!(tys, [Ty::Like, Ty::Like, Ty::F32, Ty::U32]);
        assert_eq!(p[3].name, "k");
    }

    #[test]
    fn f32_forms_are_overloads_of_the_same_name() {
        let h = device_header();
        assert!(
            h.contains("__device__ __forceinline__ float pptm_op_relu(float x)"),
            "{h}"
        );
        assert!(
            h.contains("__device__ __forceinline__ double pptm_op_relu(double x)"),
            "{h}"
        );
        assert!(h.contains("fmaxf(x, 0.0f)"), "{h}");
        // By-value f32 parameters stay f32 in both forms.
        assert!(
            h.contains("double pptm_op_axpby(double x, double y, float alpha, float beta)"),
            "{h}"
        );
        assert!(
            h.contains("float pptm_op_axpby(float x, float y, float alpha, float beta)"),
            "{h}"
        );
        assert!(h.contains("struct pptm_op_max_reduction_reducer {"), "{h}");
    }

    #[test]
    fn cpu_references_take_their_inputs_in_the_backends_order() {
        let CpuImpl::Elementwise(f) = Axpby::DEF.cpu else {
            panic!()
        };
        assert_eq!((f.one)(&[1.0, 10.0, 2.0, 3.0]), 2.0 + 30.0);
        let mut out = [0.0; 2];
        (f.run)(
            &[&[1.0, 2.0], &[10.0, 20.0], &[2.0; 2], &[3.0; 2]],
            &mut out,
        );
        assert_eq!(out, [2.0 + 30.0, 4.0 + 60.0]);
        let CpuImpl::Elementwise(f) = BeliefUpdate::DEF.cpu else {
            panic!()
        };
        assert_eq!((f.one)(&[2.0, 1.0, 0.5]), 2.0);
        let CpuImpl::Reduction {
            identity,
            combine,
            fold,
            finish,
        } = MeanReduction::DEF.cpu
        else {
            panic!()
        };
        assert_eq!(identity, 0.0);
        assert_eq!(finish(combine(1.0, 2.0), 2), 1.5);
        assert_eq!(fold(1.0, &[2.0, 3.0]), combine(combine(1.0, 2.0), 3.0));
        assert!(finish(0.0, 0).is_nan());
        let CpuImpl::Reduction {
            identity, combine, ..
        } = MaxReduction::DEF.cpu
        else {
            panic!()
        };
        assert_eq!(identity, f64::NEG_INFINITY);
        assert_eq!(combine(f64::NAN, 1.0), 1.0);
    }
}
