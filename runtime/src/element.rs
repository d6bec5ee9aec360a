//! Element types a [`Buffer`](crate::Buffer) may hold.

/// Data type of a buffer's elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    F64,
    I32,
    U32,
}

mod sealed {
    pub trait Sealed {}
}

/// A plain-old-data element type with a device representation identical to the host's.
pub trait Element:
    bytemuck::Pod + Send + Sync + std::fmt::Debug + sealed::Sealed + 'static
{
    const DTYPE: DType;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    };
}
element!(f32, F32);
element!(f64, F64);
element!(i32, I32);
element!(u32, U32);
