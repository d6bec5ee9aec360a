//! Element types a [`Buffer`](crate::Buffer) may hold.

pub use float8::F8E4M3;
pub use half::{bf16, f16};
pub use pptm_spec::DType;

mod sealed {
    pub trait Sealed {}
}

/// A plain-old-data element type with a device representation identical to the host's.
pub trait Element:
    bytemuck::Pod + Send + Sync + std::fmt::Debug + sealed::Sealed + 'static
{
    /// The element type as chains and errors name it.
    const DTYPE: DType;
    /// The exact value as an f64 (the CPU backend computes on these).
    fn to_f64(self) -> f64;
}

macro_rules! element {
    ($t:ty, $d:ident, $x:ident => $wide:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn to_f64(self) -> f64 {
                let $x = self;
                $wide
            }
        }
    };
}
element!(f32, F32, x => f64::from(x));
element!(f64, F64, x => x);
element!(i32, I32, x => f64::from(x));
element!(u32, U32, x => f64::from(x));
element!(bf16, Bf16, x => x.to_f64());
element!(f16, F16, x => x.to_f64());
element!(F8E4M3, F8E4M3, x => F8E4M3::to_f64(&x));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_dtypes() {
        fn check<T: Element>() {
            assert_eq!(std::mem::size_of::<T>(), T::DTYPE.size(), "{:?}", T::DTYPE);
        }
        check::<f32>();
        check::<f64>();
        check::<i32>();
        check::<u32>();
        check::<bf16>();
        check::<f16>();
        check::<F8E4M3>();
    }

    #[test]
    fn sixteen_bit_values_widen_exactly() {
        assert_eq!(bf16::from_f32(1.5).to_f64(), 1.5);
        assert_eq!(f16::from_f32(-0.25).to_f64(), -0.25);
        assert_eq!(bf16::from_bits(0x3f81).to_f64(), 1.0 + 1.0 / 128.0);
    }

    /// F8E4M3 is the OCP E4M3 the device decodes (kernels/pptm/pattern/mma.cuh): no infinities,
    /// 448 the largest value, S.1111.111 NaN, subnormals m 2^-9.
    #[test]
    fn e4m3_is_the_format_the_device_decodes() {
        assert_eq!(F8E4M3::from_f32(448.0).to_bits(), 0x7e);
        assert!(F8E4M3::from_bits(0x7f).to_f64().is_nan());
        assert_eq!(F8E4M3::from_bits(0x01).to_f64(), 2f64.powi(-9));
        assert_eq!(F8E4M3::from_bits(0xb9).to_f64(), -1.125);
        assert_eq!(F8E4M3::from_f32(1.0).to_bits(), 0x38);
    }
}
