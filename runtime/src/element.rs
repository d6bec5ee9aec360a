//! Element types a [`Buffer`](crate::Buffer) may hold.

pub use half::{bf16, f16};
pub use pptm_spec::DType;

mod sealed {
    pub trait Sealed {}
}

/// A plain-old-data element type with a device representation identical to the host's.
pub trait Element:
    bytemuck::Pod + Send + Sync + std::fmt::Debug + sealed::Sealed + 'static
{
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
    }

    #[test]
    fn sixteen_bit_values_widen_exactly() {
        assert_eq!(bf16::from_f32(1.5).to_f64(), 1.5);
        assert_eq!(f16::from_f32(-0.25).to_f64(), -0.25);
        assert_eq!(bf16::from_bits(0x3f81).to_f64(), 1.0 + 1.0 / 128.0);
    }
}
