//! States of several values per element: what `#[derive(pptm::State)]` implements.
//!
//! An op may take a state as its flow and return one (docs/ops.md, "States"). A chain stores a
//! state as its fields, interleaved, in f32: element i's fields at `i * k .. (i + 1) * k` of a
//! buffer, for a state of k fields. [`State::flatten`] and [`State::unflatten`] convert between
//! a slice of states and that layout.

use crate::error::{Error, Result};

/// A struct whose named fields (each f32 or f64) travel together as one element of a chain: an
/// op's flow and result, stored as its fields, interleaved. Implemented by
/// `#[derive(pptm::State)]`, which also checks the struct (`#[repr(C)]`, named f32/f64 fields).
pub trait State: Copy + Sized {
    /// The field names, in declaration order: the order of the values of one element.
    const FIELDS: &'static [&'static str];

    /// The state from its fields' values in order (`values.len() >= FIELDS.len()`), each
    /// converted to the field's type: the CPU backend's view of one element.
    fn from_values(values: &[f64]) -> Self;

    /// Writes the fields' values, in order, to `out[..FIELDS.len()]`.
    fn to_values(&self, out: &mut [f64]);

    /// The states as a chain stores them: each state's fields in order, as f32, one state after
    /// another. Upload the result with [`Runtime::upload`](crate::Runtime::upload).
    fn flatten(states: &[Self]) -> Vec<f32> {
        let k = Self::FIELDS.len();
        let mut values = vec![0.0; k];
        let mut out = Vec::with_capacity(states.len() * k);
        for s in states {
            s.to_values(&mut values);
            out.extend(values.iter().map(|&v| v as f32));
        }
        out
    }

    /// The states a chain wrote: `values` holds each state's fields in order, as f32. A length
    /// that is not a whole number of states is [`Error::StateLength`].
    fn unflatten(values: &[f32]) -> Result<Vec<Self>> {
        let k = Self::FIELDS.len();
        if k == 0 || !values.len().is_multiple_of(k) {
            return Err(Error::StateLength {
                fields: k,
                len: values.len(),
            });
        }
        let mut wide = vec![0.0; k];
        Ok(values
            .chunks_exact(k)
            .map(|c| {
                for (w, &v) in wide.iter_mut().zip(c) {
                    *w = f64::from(v);
                }
                Self::from_values(&wide)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Pair {
        x: f64,
        v: f32,
    }

    impl State for Pair {
        const FIELDS: &'static [&'static str] = &["x", "v"];
        fn from_values(values: &[f64]) -> Self {
            Pair {
                x: values[0],
                v: values[1] as f32,
            }
        }
        fn to_values(&self, out: &mut [f64]) {
            out[0] = self.x;
            out[1] = f64::from(self.v);
        }
    }

    #[test]
    fn states_flatten_to_interleaved_fields_and_back() {
        let s = [Pair { x: 1.5, v: -2.0 }, Pair { x: 0.25, v: 3.0 }];
        let flat = Pair::flatten(&s);
        assert_eq!(flat, vec![1.5, -2.0, 0.25, 3.0]);
        assert_eq!(Pair::unflatten(&flat).unwrap(), s.to_vec());
        assert!(Pair::unflatten(&[]).unwrap().is_empty());
    }

    #[test]
    fn a_partial_state_is_a_typed_error() {
        let e = Pair::unflatten(&[1.0, 2.0, 3.0]).unwrap_err();
        assert!(matches!(e, Error::StateLength { fields: 2, len: 3 }), "{e}");
        assert!(e.to_string().contains("2 fields"), "{e}");
    }
}
