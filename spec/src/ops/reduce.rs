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
    },
    doc: "Sum of all elements (f64 accumulation).",
};
