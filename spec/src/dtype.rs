//! Element types of the buffers a chain reads and writes.

use std::fmt;

use crate::Precision;

/// The element type of a buffer. Chains read f32 buffers, except the matrix operands of a stage
/// that computes in bf16, fp16 or fp8 (on tensor cores), which are stored in that type; every
/// output is f32. The runtime's `Buffer<T>` carries one of these for each element type it supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 binary32: every output, and every input not stored in a narrower type.
    F32,
    /// IEEE 754 binary64.
    F64,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// bfloat16: f32's exponent range with an 8-bit significand.
    Bf16,
    /// IEEE 754 binary16.
    F16,
    /// OCP fp8 E4M3 (as CUDA's `__nv_fp8_e4m3`): 4 exponent bits, 3 significand bits, finite
    /// (largest 448), NaN at S.1111.111.
    F8E4M3,
}

impl DType {
    /// The Rust-style lowercase name (`f32`, `bf16`, `f8e4m3`), as `Display` shows it.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::F8E4M3 => "f8e4m3",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::Bf16 | DType::F16 => 2,
            DType::F8E4M3 => 1,
        }
    }

    /// How a matrix operand of a stage computing in `precision` is stored: in that type for the
    /// 16- and 8-bit precisions the tensor cores take, else f32 (an fp64 stage widens f32 inputs).
    pub fn matrix_storage(precision: Precision) -> DType {
        match precision {
            Precision::Bf16 => DType::Bf16,
            Precision::Fp16 => DType::F16,
            Precision::Fp8 => DType::F8E4M3,
            Precision::Fp64 | Precision::Fp32 | Precision::Bf16x3 => DType::F32,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sizes_and_matrix_storage() {
        let all = [
            (DType::F32, "f32", 4),
            (DType::F64, "f64", 8),
            (DType::I32, "i32", 4),
            (DType::U32, "u32", 4),
            (DType::Bf16, "bf16", 2),
            (DType::F16, "f16", 2),
            (DType::F8E4M3, "f8e4m3", 1),
        ];
        for (t, name, size) in all {
            assert_eq!(t.name(), name);
            assert_eq!(t.to_string(), name);
            assert_eq!(t.size(), size, "{name}");
        }
        let storage: Vec<DType> = Precision::ALL
            .into_iter()
            .map(DType::matrix_storage)
            .collect();
        // fp64, fp32, bf16x3 (f32 operands, split on the device), bf16, fp16, fp8.
        assert_eq!(
            storage,
            [
                DType::F32,
                DType::F32,
                DType::F32,
                DType::Bf16,
                DType::F16,
                DType::F8E4M3
            ]
        );
    }
}
