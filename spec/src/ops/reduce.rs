//! Reductions that end a fused pass (device side: kernels/pptm/ops/reduce.cuh).

use super::{CpuImpl, FusionClass, Kind, OpDef, Param};
use crate::Precision;

/// Sum of all elements, accumulated in f64 on both backends.
pub const SUM_REDUCTION: OpDef = OpDef {
    name: "SumReduction",
    class: FusionClass::Reduction,
    inputs: &[Param {
        name: "x",
        kind: Kind::Vector,
    }],
    output: Kind::Scalar,
    precisions: &[Precision::Fp32],
    tensor_core: false,
    header: "pptm/ops/reduce.cuh",
    device: "pptm_op_sum_reduction",
    cpu: CpuImpl::Reduction {
        identity: 0.0,
        combine: |a, b| a + b,
        finish: |total, _| total,
    },
    doc: "Sum of all elements (f64 accumulation).",
};

/// Mean of all elements: the f64 sum over `n` (NaN for no elements).
pub const MEAN_REDUCTION: OpDef = OpDef {
    name: "MeanReduction",
    class: FusionClass::Reduction,
    inputs: &[Param {
        name: "x",
        kind: Kind::Vector,
    }],
    output: Kind::Scalar,
    precisions: &[Precision::Fp32],
    tensor_core: false,
    header: "pptm/ops/reduce.cuh",
    device: "pptm_op_mean_reduction",
    cpu: CpuImpl::Reduction {
        identity: 0.0,
        combine: |a, b| a + b,
        finish: |total, n| total / n as f64,
    },
    doc: "Mean of all elements (f64 accumulation; NaN for none).",
};

/// Largest element (-inf for no elements; NaN elements are ignored).
pub const MAX_REDUCTION: OpDef = OpDef {
    name: "MaxReduction",
    class: FusionClass::Reduction,
    inputs: &[Param {
        name: "x",
        kind: Kind::Vector,
    }],
    output: Kind::Scalar,
    precisions: &[Precision::Fp32],
    tensor_core: false,
    header: "pptm/ops/reduce.cuh",
    device: "pptm_op_max_reduction",
    cpu: CpuImpl::Reduction {
        identity: f64::NEG_INFINITY,
        combine: f64::max,
        finish: |total, _| total,
    },
    doc: "Largest element (-inf for none; NaN elements are ignored).",
};
