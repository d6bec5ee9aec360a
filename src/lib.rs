//! # pptm: persistent tensor manifolds
//!
//! pptm keeps a few long-running ("persistent", "manifold") cooperative CUDA kernels resident on the
//! GPU and feeds them work through a queue in mapped host memory, so an application pays no kernel
//! launch per operation. What those kernels run is generated at build time from fused operator
//! chains declared in Rust:
//!
//! ```ignore
//! use pptm::FusionBuilder;
//! use pptm::ops::{KlDivergence, SumReduction};
//!
//! #[derive(FusionBuilder)]
//! #[fusion(domain = "inference")]
//! pub struct KlComplexity {
//!     #[stage(1)] kl: KlDivergence,
//!     #[stage(2, reduction = true)] total: SumReduction,
//! }
//!
//! let rt = pptm::Runtime::new()?;               // GPU if present, else the CPU backend
//! let (q, p) = (rt.upload(&q_host)?, rt.upload(&p_host)?);
//! let kl: f32 = KlComplexity::submit(&rt, &q, &p)?.wait()?;
//! ```
//!
//! | what you know | its pptm counterpart |
//! |---|---|
//! | a kernel launch per operation | one resident manifold per domain, launched once, fed through a queue |
//! | a hand-fused kernel | a chain declared with `#[derive(FusionBuilder)]`; build.rs fuses and compiles it to PTX |
//! | `cudaMemcpy` | [`Runtime::upload`], [`Buffer::to_vec`] |
//! | launch + `cudaStreamSynchronize` | `Chain::submit` → [`Ticket::wait`] |
//! | a CPU reference implementation | the CPU backend: the same API, running f64 reference code |
//!
//! The data path, folder by folder: `spec/` (chain IR, op catalog) → `codegen/` (CUDA C, NVRTC) →
//! `generated/` (versioned PTX) → `runtime/` (queue, manifolds, backends) → `kernels/` (the device
//! loop and the op library).

//! [`guide`] walks through the API in runnable examples.

#![warn(missing_docs)]

// Lets the derive macro's `::pptm::...` paths resolve inside this crate too.
extern crate self as pptm;

pub mod chains;
pub mod guide;
pub mod ops;
pub mod timing;

pub use pptm_macros::{FusionBuilder, Pipeline, State, op};
pub use pptm_runtime::*;
pub use pptm_spec::ChainIr;
pub use pptm_spec::Op;
pub use pptm_spec::{Table, TableCoord};

/// What the derive macro's expansion uses. Not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use bytemuck;
    pub use pptm_runtime::{LINKED_DOMAINS, checked_ir, linkme};
    pub use pptm_spec::{
        ChainSpec, CpuImpl, DESC_ARGS, ElementFn, FusionClass, OpDef, Param, Precision, SpecError,
        StageSpec, StateTypes, Tolerance, Ty, lower, lower_with,
        ops::{fold_elements, run_elements},
    };

    /// The ops of the user's own that the chains of a pipeline part's steps name (what the part
    /// is lowered with at run time): every stage op of theirs that is not built in.
    pub fn step_ops(
        steps: &[fn() -> Result<&'static pptm_spec::ChainIr, pptm_runtime::Error>],
    ) -> Vec<&'static OpDef> {
        let mut ops: Vec<&'static OpDef> = Vec::new();
        for ir in steps.iter().filter_map(|step| step().ok()) {
            for st in &ir.stages {
                if pptm_spec::ops::find(st.op.name).is_none()
                    && !ops.iter().any(|o| std::ptr::eq(*o, st.op))
                {
                    ops.push(st.op);
                }
            }
        }
        ops
    }

    /// Implemented by the derive macro so the stage fields count as used.
    pub trait StageFields {
        fn stage_fields(&self) -> usize;
    }

    /// `const` string equality: the derive macro checks each stage's type is the op it names.
    pub const fn str_eq(a: &str, b: &str) -> bool {
        a.len() == b.len() && contains(a.as_bytes(), b.as_bytes())
    }

    /// `const` substring search: the derive macro checks generated/manifest.txt lists its chain.
    pub const fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        if needle.len() > haystack.len() {
            return false;
        }
        let mut i = 0;
        while i + needle.len() <= haystack.len() {
            let mut j = 0;
            while j < needle.len() && haystack[i + j] == needle[j] {
                j += 1;
            }
            if j == needle.len() {
                return true;
            }
            i += 1;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::__private::{contains, str_eq};

    #[test]
    fn every_catalog_op_has_a_marker_type() {
        let mut catalog: Vec<_> = pptm_spec::ops::CATALOG.iter().map(|op| op.name).collect();
        let mut markers = crate::ops::NAMES.to_vec();
        markers.extend(pptm_spec::ops::subset::SUBSET.iter().map(|op| op.name));
        catalog.sort();
        markers.sort();
        assert_eq!(catalog, markers);
    }

    #[test]
    fn const_contains() {
        assert!(contains(b"abc spec=12 x", b"spec=12"));
        assert!(!contains(b"abc spec=13 x", b"spec=12"));
        assert!(!contains(b"ab", b"abc"));
        assert!(contains(b"abc", b""));
        assert!(str_eq("Square", "Square"));
        assert!(!str_eq("Square", "SquareX"));
        assert!(!str_eq("Squarf", "Square"));
    }
}
