//! Plans, host side (`PPTM_OP_PLAN`; layout and order rules in kernels/pptm/abi.h): the two arenas
//! a manifold's plans live in, a plan region's layout, and writing steps and reading results.
//!
//! A plan is a pipeline's items of one domain dispatched as one queue item. The host writes its
//! steps into the host arena (mapped pinned memory); the plan's block 0 copies them into the
//! device arena. A region is reserved in each arena per plan and given back once every plan that
//! refers to it (another domain's plan may wait on its `done` words) has completed.

use crate::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use super::abi::{PPTM_PLAN_HEADER_BYTES, pptm_desc, pptm_plan_result, pptm_plan_step};
use super::arena::Arena;
use super::manifold::Manifold;
use crate::error::{Error, Result};

const STEP_BYTES: u64 = std::mem::size_of::<pptm_plan_step>() as u64;
const RESULT_BYTES: u64 = std::mem::size_of::<pptm_plan_result>() as u64;
/// Per step in the device region after the steps: arrivals, finished, done, and its result.
const COUNTER_BYTES: u64 = 24 + RESULT_BYTES;

/// Bytes of a plan's host region: its steps and one result per step, plus the summary.
pub(crate) fn host_bytes(steps: u64) -> u64 {
    steps * STEP_BYTES + (steps + 1) * RESULT_BYTES
}

/// Bytes of a plan's device region.
pub(crate) fn dev_bytes(steps: u64, partials: u64) -> u64 {
    u64::from(PPTM_PLAN_HEADER_BYTES) + steps * (STEP_BYTES + COUNTER_BYTES) + partials * 8
}

/// Byte offset, in a device region of `steps` steps, of step `k`'s `done` word.
pub(crate) fn done_offset(steps: u64, k: u64) -> u64 {
    u64::from(PPTM_PLAN_HEADER_BYTES) + steps * STEP_BYTES + 2 * steps * 8 + k * 8
}

/// A plan's two regions, as byte offsets into its manifold's arenas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Region {
    pub host: u64,
    pub dev: u64,
}

/// A manifold's plan arenas: where they are, and which ranges are taken.
pub(crate) struct Arenas {
    /// Device address of the device arena.
    dev: u64,
    bytes: u64,
    /// Host arena, device arena.
    book: Mutex<(Arena, Arena)>,
    freed: Condvar,
}

impl Arenas {
    pub fn new(dev: u64, bytes: u64) -> Self {
        Arenas {
            dev,
            bytes,
            book: Mutex::new((Arena::new(bytes), Arena::new(bytes))),
            freed: Condvar::new(),
        }
    }

    /// Device address of byte `offset` of the device arena.
    pub fn dev_address(&self, offset: u64) -> u64 {
        self.dev + offset
    }

    /// Reserves a region for a plan, waiting until `deadline` for other plans to give theirs
    /// back. [`Error::PlanTooLarge`] when it could never fit; [`Error::Timeout`] when the arenas
    /// stayed full.
    pub fn reserve(&self, host: u64, dev: u64, deadline: Instant) -> Result<Region> {
        if host > self.bytes || dev > self.bytes {
            return Err(Error::PlanTooLarge {
                bytes: host.max(dev),
                capacity: self.bytes,
            });
        }
        let started = Instant::now();
        let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(h) = book.0.alloc(host) {
                if let Some(d) = book.1.alloc(dev) {
                    return Ok(Region { host: h, dev: d });
                }
                book.0.free(h);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout(now - started));
            }
            book = self
                .freed
                .wait_timeout(book, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Gives a region back (its plan, and every plan that waits on it, have completed).
    pub fn release(&self, r: Region) {
        let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        book.0.free(r.host);
        book.1.free(r.dev);
        drop(book);
        self.freed.notify_all();
    }
}

/// Writes a plan's steps into its host region. False when the region is not the arena's.
pub(crate) fn write_steps(m: &Manifold, region: Region, steps: &[pptm_plan_step]) -> bool {
    let words = steps.len() * STEP_BYTES as usize / 8;
    let Some(dst) = m.plan_host_words(region.host, words) else {
        return false;
    };
    // Relaxed: the submission's release store orders them before the device reads the slot.
    for (d, s) in dst.chunks_exact(STEP_BYTES as usize / 8).zip(steps) {
        for (w, v) in d.iter().zip(step_words(s)) {
            w.store(v, Ordering::Relaxed);
        }
    }
    true
}

/// A step as the u64 words of its bytes (little-endian, `repr(C)`: the layout abi_generated.rs
/// asserts).
fn step_words(s: &pptm_plan_step) -> [u64; STEP_BYTES as usize / 8] {
    let pair = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    let mut w = [0u64; STEP_BYTES as usize / 8];
    w[0] = pair(s.desc.opcode, s.desc.blocks);
    w[1..16].copy_from_slice(&s.desc.args);
    w[16] = pair(s.sync, s.flags);
    w[17] = pair(s.partials, s.reserved0);
    w[18] = pair(s.deps[0], s.deps[1]);
    w[19] = pair(s.deps[2], s.deps[3]);
    for (k, r) in s.reserved.chunks_exact(2).enumerate() {
        w[20 + k] = pair(r[0], r[1]);
    }
    w
}

/// What a step left, read from the host region once its plan has completed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StepResult {
    pub status: u32,
    pub paths: u32,
    pub value: f64,
    pub start: u64,
    pub end: u64,
}

/// Results 0..=`steps` (the steps', then the summary) of a completed plan of `steps` steps, read
/// in one sequential pass: the device wrote them over PCIe just before the plan completed, so
/// the lines miss the host's caches, and a tight loop lets the misses overlap (170 results in
/// about 0.7 µs on an H200 host).
pub(crate) fn read_results(m: &Manifold, region: Region, steps: u64) -> Option<Vec<StepResult>> {
    let at = region.host + steps * STEP_BYTES;
    let words = usize::try_from((steps + 1) * (RESULT_BYTES / 8)).ok()?;
    let w = m.plan_host_words(at, words)?;
    // Relaxed: the plan's completion (acquired when its ticket resolved) ordered these.
    Some(
        w.chunks_exact(4)
            .map(|r| {
                let first = r[0].load(Ordering::Relaxed);
                StepResult {
                    status: first as u32,
                    paths: (first >> 32) as u32,
                    value: f64::from_bits(r[1].load(Ordering::Relaxed)),
                    start: r[2].load(Ordering::Relaxed),
                    end: r[3].load(Ordering::Relaxed),
                }
            })
            .collect(),
    )
}

/// A step with no dependencies yet (`deps` all none).
pub(crate) fn step(desc: pptm_desc) -> pptm_plan_step {
    pptm_plan_step {
        desc,
        deps: [super::abi::PPTM_DEP_NONE; super::abi::PPTM_PLAN_DEPS as usize],
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_sizes_match_the_layout_abi_h_gives() {
        assert_eq!(STEP_BYTES, 192);
        assert_eq!(RESULT_BYTES, 32);
        assert_eq!(host_bytes(1), 192 + 64);
        assert_eq!(dev_bytes(2, 3), 128 + 2 * (192 + 56) + 24);
        // steps, then arrivals and finished (2n words), then done.
        assert_eq!(done_offset(3, 0), 128 + 3 * 192 + 6 * 8);
        assert_eq!(done_offset(3, 2), done_offset(3, 0) + 16);
    }

    #[test]
    fn step_words_follow_the_struct_layout() {
        use std::mem::offset_of;
        let mut s = step(pptm_desc {
            opcode: 7,
            blocks: 3,
            args: std::array::from_fn(|i| 100 + i as u64),
        });
        s.sync = 2;
        s.partials = 9;
        s.deps[1] = 5;
        let w = step_words(&s);
        assert_eq!(w[0], 7 | (3 << 32));
        assert_eq!(w[1 + 14], 114);
        assert_eq!(offset_of!(pptm_plan_step, sync), 16 * 8);
        assert_eq!(w[16], 2);
        assert_eq!(offset_of!(pptm_plan_step, partials), 17 * 8);
        assert_eq!(w[17], 9);
        assert_eq!(offset_of!(pptm_plan_step, deps), 18 * 8);
        assert_eq!(
            w[18],
            u64::from(super::super::abi::PPTM_DEP_NONE) | (5 << 32)
        );
    }

    #[test]
    fn reservations_wait_for_space_and_refuse_what_never_fits() {
        let a = Arenas::new(0, 4096);
        let soon = Instant::now() + std::time::Duration::from_millis(20);
        let r = a.reserve(2048, 2048, soon).unwrap();
        let r2 = a.reserve(2048, 2048, soon).unwrap();
        assert_ne!(r, r2);
        assert!(matches!(
            a.reserve(
                256,
                256,
                Instant::now() + std::time::Duration::from_millis(5)
            ),
            Err(Error::Timeout(_))
        ));
        a.release(r);
        assert!(a.reserve(256, 256, soon).is_ok());
        assert!(matches!(
            a.reserve(8192, 1, soon),
            Err(Error::PlanTooLarge { .. })
        ));
    }
}
