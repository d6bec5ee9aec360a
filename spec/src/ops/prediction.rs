//! Prediction errors and their precision-weighted accuracy (device side:
//! kernels/pptm/ops/prediction.cuh).

use super::{CpuImpl, FusionClass, Kind, OpDef, Param};
use crate::Precision;

/// `obs - pred` per element.
pub const PREDICTION_ERROR: OpDef = OpDef {
    name: "PredictionError",
    class: FusionClass::Elementwise,
    inputs: &[
        Param {
            name: "obs",
            kind: Kind::Vector,
        },
        Param {
            name: "pred",
            kind: Kind::Vector,
        },
    ],
    output: Kind::Vector,
    precisions: &[Precision::Fp32],
    tensor_core: false,
    header: "pptm/ops/prediction.cuh",
    device: "pptm_op_prediction_error",
    cpu: CpuImpl::Elementwise(|x| x[0] - x[1]),
    doc: "Prediction error: obs - pred.",
};

/// `-1/2 prec e^2` per element: the precision-weighted accuracy of a prediction error `e`.
pub const ACCURACY: OpDef = OpDef {
    name: "Accuracy",
    class: FusionClass::Elementwise,
    inputs: &[
        Param {
            name: "e",
            kind: Kind::Vector,
        },
        Param {
            name: "prec",
            kind: Kind::Vector,
        },
    ],
    output: Kind::Vector,
    precisions: &[Precision::Fp32],
    tensor_core: false,
    header: "pptm/ops/prediction.cuh",
    device: "pptm_op_accuracy",
    cpu: CpuImpl::Elementwise(|x| -0.5 * x[1] * x[0] * x[0]),
    doc: "Precision-weighted accuracy of an error e: -1/2 prec e^2.",
};
