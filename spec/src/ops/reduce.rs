//! Reductions that end a fused pass (device side: kernels/pptm/ops/reduce.cuh).

use super::{CpuImpl, FusionClass, OpDef, Ty, param};
use crate::Precision;

/// Every reduction reads one input: the flow.
const REDUCED: &[super::Param] = &[param("x", Ty::Like)];

/// A reduction of the flow input `x` to one f64-accumulated value: the shape every op here has.
/// `finish(total, n)` turns the combined accumulator of `n` elements into the result.
const fn reduction(
    name: &'static str,
    device: &'static str,
    identity: f64,
    combine: fn(f64, f64) -> f64,
    finish: fn(f64, usize) -> f64,
    doc: &'static str,
) -> OpDef {
    OpDef {
        name,
        class: FusionClass::Reduction,
        inputs: REDUCED,
        output: Ty::Scalar,
        flow_channels: Some(1),
        out_channels: Some(1),
        // The device accumulates in f64 whatever the stage declares; "fp64" also keeps an fp64
        // reduction's result in f64 for the stages after it.
        precisions: &[Precision::Fp32, Precision::Fp64],
        tensor_precisions: &[],
        header: "pptm/ops/reduce.cuh",
        cuda: "",
        device,
        cpu: CpuImpl::Reduction {
            identity,
            combine,
            finish,
        },
        check: None,
        doc,
    }
}

/// Sum of all elements, accumulated in f64 on both backends.
pub const SUM_REDUCTION: OpDef = reduction(
    "SumReduction",
    "pptm_op_sum_reduction",
    0.0,
    |a, b| a + b,
    |total, _| total,
    "Sum of all elements (f64 accumulation).",
);

/// Mean of all elements: the f64 sum over `n` (NaN for no elements).
pub const MEAN_REDUCTION: OpDef = reduction(
    "MeanReduction",
    "pptm_op_mean_reduction",
    0.0,
    |a, b| a + b,
    |total, n| total / n as f64,
    "Mean of all elements (f64 accumulation; NaN for none).",
);

/// Largest element (-inf for no elements; NaN elements are ignored).
pub const MAX_REDUCTION: OpDef = reduction(
    "MaxReduction",
    "pptm_op_max_reduction",
    f64::NEG_INFINITY,
    f64::max,
    |total, _| total,
    "Largest element (-inf for none; NaN elements are ignored).",
);
