//! The accuracy guard's host half: which shapes of a guarded chain run in the next precision up,
//! and counters of what happened.
//!
//! A guarded stage (`tolerance = x`) checks sampled outputs on the device before it runs (see
//! kernels/pptm/pattern/mma.cuh, `pptm_matmul_guarded`) and reports the sampled error in its
//! completion's value: positive when its declared precision was kept, negative when the stage ran
//! in f32 instead. The runtime then keeps that chain and shape in f32 (the descriptor's guard
//! word, [`pptm_spec::ArgKind::Guard`], set to 1, so the device skips the check) until
//! [`Runtime::reset_guard`](crate::Runtime::reset_guard). The CPU backend computes in f64 whatever
//! the precision, and makes the same decisions from the same samples, so the counters read alike
//! on every backend.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use pptm_spec::{ChainIr, DType, Precision};

/// What the accuracy guard of one chain did, counted since the runtime started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GuardStats {
    /// Items whose guarded stage ran the sampled check.
    pub checked: u64,
    /// Checked items whose check failed: the stage ran in the next precision up (f32).
    pub fell_back: u64,
    /// Items that ran in the next precision up without a check, their shape having fallen back
    /// before.
    pub pinned: u64,
    /// Shapes that run in the next precision up now.
    pub pinned_shapes: usize,
    /// The largest sampled error a check saw, relative to the magnitude of the terms summed
    /// (+inf for a non-finite sample).
    pub worst_error: f64,
}

/// The guard's state, shared by a runtime and the tickets of its guarded items.
#[derive(Debug, Default)]
pub(crate) struct GuardBook {
    chains: Mutex<HashMap<u32, Entry>>,
}

#[derive(Debug, Default)]
struct Entry {
    stats: GuardStats,
    /// Dimension sizes of the shapes kept in the next precision up.
    pinned: HashSet<Vec<usize>>,
}

/// What a ticket records about its guarded item when it completes.
#[derive(Debug, Clone)]
pub(crate) struct GuardNote {
    pub book: Arc<GuardBook>,
    pub opcode: u32,
    pub sizes: Vec<usize>,
    pub level: u32,
}

impl GuardBook {
    /// The guard level for a submission of `opcode` at `sizes`: 1 where the shape fell back.
    pub fn level(&self, opcode: u32, sizes: &[usize]) -> u32 {
        let chains = self.chains.lock().unwrap_or_else(|e| e.into_inner());
        u32::from(
            chains
                .get(&opcode)
                .is_some_and(|e| e.pinned.contains(sizes)),
        )
    }

    /// Records a completed item's guard value (see the module docs).
    pub fn record(&self, note: &GuardNote, value: f64) {
        let mut chains = self.chains.lock().unwrap_or_else(|e| e.into_inner());
        let e = chains.entry(note.opcode).or_default();
        if note.level != 0 {
            e.stats.pinned += 1;
            return;
        }
        e.stats.checked += 1;
        e.stats.worst_error = e.stats.worst_error.max(value.abs());
        if value.is_sign_negative() {
            e.stats.fell_back += 1;
            e.pinned.insert(note.sizes.clone());
        }
        e.stats.pinned_shapes = e.pinned.len();
    }

    pub fn stats(&self, opcode: u32) -> GuardStats {
        let chains = self.chains.lock().unwrap_or_else(|e| e.into_inner());
        chains.get(&opcode).map(|e| e.stats).unwrap_or_default()
    }

    /// Lets every shape of `opcode` try its declared precision again.
    pub fn reset(&self, opcode: u32) {
        let mut chains = self.chains.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = chains.get_mut(&opcode) {
            e.pinned.clear();
            e.stats.pinned_shapes = 0;
        }
    }
}

/// The guard value the device would report for a guarded matmul stage, computed on the host from
/// the f64 values of its f32 operands `a` (m x k) and `w` (k x n): the same samples
/// ([`pptm_spec::guard_samples`]), each in f64 from the operands and from the operands rounded to
/// the stage's precision, the largest difference relative to the terms' magnitude; negated when
/// it exceeds the tolerance (or is not finite), -0.0 at level 1.
pub(crate) fn emulate(
    ir: &ChainIr,
    stage: usize,
    level: u32,
    a: &[f64],
    w: &[f64],
    sizes: &[usize],
) -> f64 {
    if level != 0 {
        return -0.0;
    }
    let st = &ir.stages[stage];
    let dim = |l: &str| sizes[st.dim(l).expect("matmul letters")];
    let (k, n) = (dim("k"), dim("n"));
    let round = |x: f64| -> f64 {
        match DType::matrix_storage(st.precision) {
            DType::F16 => half::f16::from_f64(x).to_f64(),
            DType::Bf16 => half::bf16::from_f64(x).to_f64(),
            DType::F8E4M3 => float8::F8E4M3::from_f64(x).to_f64(),
            _ => x,
        }
    };
    debug_assert!(matches!(st.precision, Precision::Fp16 | Precision::Bf16));
    let mut worst = 0.0f64;
    for (i, j) in pptm_spec::guard_samples(dim("m"), n) {
        let (mut exact, mut magnitude, mut low) = (0.0f64, 0.0f64, 0.0f64);
        for p in 0..k {
            let (x, y) = (a[i * k + p], w[p * n + j]);
            exact += x * y;
            magnitude += (x * y).abs();
            low += round(x) * round(y);
        }
        let err = (low - exact).abs() / magnitude.max(1e-30);
        worst = worst.max(if err.is_finite() { err } else { f64::INFINITY });
    }
    let tolerance = st.tolerance.expect("a guarded stage");
    if worst <= tolerance { worst } else { -worst }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(book: &Arc<GuardBook>, level: u32) -> GuardNote {
        GuardNote {
            book: book.clone(),
            opcode: 7,
            sizes: vec![2, 3, 4],
            level,
        }
    }

    #[test]
    fn a_failed_check_pins_the_shape_until_reset() {
        let book = Arc::new(GuardBook::default());
        assert_eq!(book.level(7, &[2, 3, 4]), 0);
        book.record(&note(&book, 0), 1e-4);
        assert_eq!(book.level(7, &[2, 3, 4]), 0);
        book.record(&note(&book, 0), -f64::INFINITY);
        assert_eq!(book.level(7, &[2, 3, 4]), 1);
        assert_eq!(book.level(7, &[2, 3, 5]), 0, "only that shape");
        assert_eq!(book.level(8, &[2, 3, 4]), 0, "only that chain");
        book.record(&note(&book, 1), -0.0);
        let s = book.stats(7);
        assert_eq!(
            (s.checked, s.fell_back, s.pinned, s.pinned_shapes),
            (2, 1, 1, 1)
        );
        assert_eq!(s.worst_error, f64::INFINITY);
        book.reset(7);
        assert_eq!(book.level(7, &[2, 3, 4]), 0);
        assert_eq!(book.stats(7).pinned_shapes, 0);
        assert_eq!(book.stats(7).fell_back, 1, "counters are kept");
    }
}
