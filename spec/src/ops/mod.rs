//! The op catalog. One entry per op; the DSL names an op by its type name
//! (`pptm::ops::KlDivergence`), and everything else about it is here.
//!
//! To add an op: write its device function in a header under `kernels/pptm/ops/`, add an [`OpDef`]
//! in the family module here (with the f64 reference), add the marker type in `src/ops.rs` of the
//! facade crate, and list it in [`CATALOG`].

mod divergence;
mod prediction;
mod reduce;

pub use divergence::KL_DIVERGENCE;
pub use prediction::{ACCURACY, PREDICTION_ERROR};
pub use reduce::{MAX_REDUCTION, MEAN_REDUCTION, SUM_REDUCTION};

use crate::Precision;

/// How an op fuses with its neighbours (after TVM's op-pattern lattice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusionClass {
    /// One output element from the same-index element of each input: fuses into any pass.
    Elementwise,
    /// Many elements to one value; ends a fused pass (block reduction + last-block combine).
    Reduction,
}

/// Shape of a value flowing between stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `n` f32 elements.
    Vector,
    /// One value.
    Scalar,
}

impl Kind {
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Vector => "a vector",
            Kind::Scalar => "a scalar",
        }
    }
}

/// One input of an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    pub name: &'static str,
    pub kind: Kind,
}

/// The f64 CPU reference of an op, run by the CPU backend.
#[derive(Clone, Copy)]
pub enum CpuImpl {
    /// f(inputs at index i) for every i.
    Elementwise(fn(&[f64]) -> f64),
    /// Fold every element with `combine`, starting from `identity`; then `finish(total, n)`.
    Reduction {
        identity: f64,
        combine: fn(f64, f64) -> f64,
        finish: fn(f64, usize) -> f64,
    },
}

impl std::fmt::Debug for CpuImpl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CpuImpl::Elementwise(_) => f.write_str("Elementwise(..)"),
            CpuImpl::Reduction { identity, .. } => {
                write!(f, "Reduction {{ identity: {identity}, .. }}")
            }
        }
    }
}

/// Everything pptm knows about one op.
#[derive(Debug)]
pub struct OpDef {
    /// The DSL name: the last path segment of the stage's type.
    pub name: &'static str,
    pub class: FusionClass,
    /// Inputs in order. In a chain, input 0 of every stage after the first is the previous
    /// stage's output; the others become the chain's arguments, by name.
    pub inputs: &'static [Param],
    pub output: Kind,
    /// Precisions the device code implements.
    pub precisions: &'static [Precision],
    /// Whether a tensor-core path exists (`tensor_eligible = true` is refused otherwise).
    pub tensor_core: bool,
    /// The header under `kernels/` that defines the device side.
    pub header: &'static str,
    /// Device symbol: an `__device__` function for elementwise ops, a reducer type for reductions.
    pub device: &'static str,
    pub cpu: CpuImpl,
    pub doc: &'static str,
}

/// Every op the DSL knows.
pub const CATALOG: &[&OpDef] = &[
    &KL_DIVERGENCE,
    &PREDICTION_ERROR,
    &ACCURACY,
    &SUM_REDUCTION,
    &MEAN_REDUCTION,
    &MAX_REDUCTION,
];

/// Looks an op up by its DSL name.
pub fn find(name: &str) -> Option<&'static OpDef> {
    CATALOG.iter().copied().find(|op| op.name == name)
}

/// The catalog name closest to `name`, for "did you mean" hints.
pub fn closest(name: &str) -> Option<&'static str> {
    CATALOG
        .iter()
        .map(|op| {
            (
                edit_distance(&name.to_ascii_lowercase(), &op.name.to_ascii_lowercase()),
                op.name,
            )
        })
        .filter(|(d, _)| *d <= 3)
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_well_formed() {
        for (i, a) in CATALOG.iter().enumerate() {
            assert!(
                a.name.chars().next().unwrap().is_ascii_uppercase(),
                "{}",
                a.name
            );
            assert!(!a.inputs.is_empty(), "{} has no inputs", a.name);
            assert!(
                a.inputs[0].kind == Kind::Vector,
                "{}: input 0 is the flow input, a vector",
                a.name
            );
            assert!(
                a.precisions.contains(&Precision::Fp32),
                "{}: fp32 is the default precision",
                a.name
            );
            assert!(
                a.header.starts_with("pptm/ops/") && a.header.ends_with(".cuh"),
                "{}",
                a.header
            );
            for b in &CATALOG[i + 1..] {
                assert_ne!(a.name, b.name);
            }
            match (a.class, a.cpu) {
                (FusionClass::Elementwise, CpuImpl::Elementwise(_)) => {
                    assert_eq!(a.output, Kind::Vector)
                }
                (FusionClass::Reduction, CpuImpl::Reduction { .. }) => {
                    assert_eq!(a.output, Kind::Scalar)
                }
                _ => panic!("{}: class and CPU reference disagree", a.name),
            }
        }
    }

    // That each op's device symbol is defined in its header is checked by pptm-codegen, which
    // embeds the headers (codegen/src/kernels.rs).

    #[test]
    fn suggestions() {
        assert_eq!(closest("KlDivergance"), Some("KlDivergence"));
        assert_eq!(closest("Sumreduction"), Some("SumReduction"));
        assert_eq!(closest("Softmax"), None);
    }
}
