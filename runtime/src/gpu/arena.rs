//! An optional device memory arena: one allocation made when the device is opened, before any
//! manifold is resident, from which buffers are carved.
//!
//! Why: compute-sanitizer's memcheck instruments a kernel with the allocations that exist when it
//! is launched. A persistent manifold is launched once, so every buffer made afterwards looks
//! out of bounds to it (measured on an H200: buffers made before the launch are clean, the same
//! buffers made after it are "Invalid __global__ read"). Carving buffers out of one block that
//! predates the launch makes the manifold checkable. The price: memcheck then sees the arena as
//! one allocation, so an overrun from one buffer into its neighbour inside the arena is not
//! reported (the runtime's host checks and the device's argument checks still apply).
//!
//! Opt in with `PPTM_DEVICE_ARENA_MB=n` (read when the process first opens the device);
//! `scripts/sanitize-gpu-suite` sets it. A request the arena cannot hold falls back to the
//! stream-ordered allocator, with a warning.
//!
//! This file is the bookkeeping only (offsets, no device calls), so it is tested without a GPU.

use std::collections::BTreeMap;

/// Every buffer starts at a multiple of this many bytes (what `cuMemAlloc` guarantees, and more
/// than any vector load needs).
pub const ALIGN: u64 = 256;

/// First-fit allocator over `[0, size)`: free ranges by offset, coalesced on free.
#[derive(Debug)]
pub struct Arena {
    size: u64,
    /// Free ranges: offset -> length, none adjacent to another.
    free: BTreeMap<u64, u64>,
    /// Live allocations: offset -> length (rounded up to `ALIGN`).
    live: BTreeMap<u64, u64>,
}

impl Arena {
    /// An arena of `size` bytes (rounded down to `ALIGN`).
    pub fn new(size: u64) -> Self {
        let size = size / ALIGN * ALIGN;
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        Arena {
            size,
            free,
            live: BTreeMap::new(),
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes handed out and not yet freed.
    pub fn in_use(&self) -> u64 {
        self.live.values().sum()
    }

    /// The offset of `bytes` fresh bytes (at least one `ALIGN` unit), or None when no free range
    /// is large enough.
    pub fn alloc(&mut self, bytes: u64) -> Option<u64> {
        let len = bytes.max(1).checked_next_multiple_of(ALIGN)?;
        let (&at, &have) = self.free.iter().find(|&(_, &have)| have >= len)?;
        self.free.remove(&at);
        if have > len {
            self.free.insert(at + len, have - len);
        }
        self.live.insert(at, len);
        Some(at)
    }

    /// Returns the allocation at `offset`; false (and nothing changes) when there is none.
    pub fn free(&mut self, offset: u64) -> bool {
        let Some(mut len) = self.live.remove(&offset) else {
            return false;
        };
        let mut at = offset;
        // Merge with the free range that ends where this one starts, and the one after it.
        if let Some((&prev, &prev_len)) = self.free.range(..at).next_back()
            && prev + prev_len == at
        {
            self.free.remove(&prev);
            at = prev;
            len += prev_len;
        }
        if let Some(next_len) = self.free.remove(&(at + len)) {
            len += next_len;
        }
        self.free.insert(at, len);
        true
    }
}

/// The arena size the environment asks for (`PPTM_DEVICE_ARENA_MB`), in bytes; None when unset,
/// zero or not a number (a malformed value is reported, not ignored silently).
pub fn requested_bytes() -> Option<u64> {
    let raw = std::env::var("PPTM_DEVICE_ARENA_MB").ok()?;
    match raw.trim().parse::<u64>() {
        Ok(0) => None,
        Ok(mb) => mb.checked_mul(1 << 20),
        Err(_) => {
            tracing::warn!("PPTM_DEVICE_ARENA_MB={raw:?} is not a number of MiB; no arena");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn first_fit_aligned_and_coalesced() {
        let mut a = Arena::new(4 * ALIGN + 7);
        assert_eq!(a.size(), 4 * ALIGN);
        let x = a.alloc(1).unwrap();
        let y = a.alloc(ALIGN + 1).unwrap();
        let z = a.alloc(ALIGN).unwrap();
        assert_eq!((x, y, z), (0, ALIGN, 3 * ALIGN));
        assert_eq!(a.alloc(1), None, "full");
        assert!(a.free(y));
        assert!(!a.free(y), "double free is refused");
        assert!(!a.free(5), "not an allocation");
        assert_eq!(a.alloc(2 * ALIGN), Some(ALIGN), "the freed hole is reused");
        assert!(a.free(x) && a.free(z) && a.free(ALIGN));
        assert_eq!(a.in_use(), 0);
        assert_eq!(a.alloc(4 * ALIGN), Some(0), "everything coalesced back");
    }

    #[test]
    fn empty_and_huge_requests() {
        let mut a = Arena::new(0);
        assert_eq!(a.alloc(1), None);
        let mut b = Arena::new(ALIGN);
        assert_eq!(b.alloc(u64::MAX), None);
        assert_eq!(
            b.alloc(0),
            Some(0),
            "an empty buffer still gets a distinct address"
        );
    }

    proptest! {
        /// Random alloc/free sequences: live ranges never overlap, stay in bounds and aligned,
        /// and freeing everything restores one free range.
        #[test]
        fn never_overlaps(ops in proptest::collection::vec((any::<bool>(), 0u64..5000), 1..200)) {
            let mut a = Arena::new(64 * ALIGN);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (alloc, n) in ops {
                if alloc || live.is_empty() {
                    if let Some(at) = a.alloc(n) {
                        let len = n.max(1).next_multiple_of(ALIGN);
                        prop_assert_eq!(at % ALIGN, 0);
                        prop_assert!(at + len <= a.size());
                        for &(o, l) in &live {
                            prop_assert!(at + len <= o || o + l <= at, "overlap");
                        }
                        live.push((at, len));
                    }
                } else {
                    let (o, _) = live.swap_remove(n as usize % live.len());
                    prop_assert!(a.free(o));
                }
            }
            for (o, _) in live {
                prop_assert!(a.free(o));
            }
            prop_assert_eq!(a.in_use(), 0);
            prop_assert_eq!(a.alloc(64 * ALIGN), Some(0));
        }
    }
}
