//! Prediction errors and their precision weighting (device side: kernels/pptm/ops/prediction.cuh).

use super::{OpDef, Ty, param};

const HEADER: &str = "pptm/ops/prediction.cuh";

/// `obs - pred` per element.
pub const PREDICTION_ERROR: OpDef = OpDef::elementwise(
    "PredictionError",
    &[param("obs", Ty::Like), param("pred", Ty::Like)],
    HEADER,
    "pptm_op_prediction_error",
    |x| x[0] - x[1],
    "Prediction error: obs - pred.",
);

/// `prec e` per element: a precision-weighted prediction error.
pub const PRECISION_WEIGHT: OpDef = OpDef::elementwise(
    "PrecisionWeight",
    &[param("e", Ty::Like), param("prec", Ty::Like)],
    HEADER,
    "pptm_op_precision_weight",
    |x| x[1] * x[0],
    "Precision-weighted error: prec e.",
);

/// `-1/2 prec e^2` per element: the precision-weighted accuracy of a prediction error `e`.
pub const ACCURACY: OpDef = OpDef::elementwise(
    "Accuracy",
    &[param("e", Ty::Like), param("prec", Ty::Like)],
    HEADER,
    "pptm_op_accuracy",
    |x| -0.5 * x[1] * x[0] * x[0],
    "Precision-weighted accuracy of an error e: -1/2 prec e^2.",
);
