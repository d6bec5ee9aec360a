//! Host buffers for large copies between the host and a runtime's buffers, kept in a pool.
//!
//! [`Buffer::read_into`] and [`Buffer::write`] take any slice, so on the GPU they go through the
//! device's own 4 MiB pinned staging buffer: a device-to-host copy into it, then a `memcpy` into
//! the slice, chunk after chunk. For a stream of large results (the tiles of a kernel matrix, a
//! batch's outputs) that doubles the host's memory traffic and serialises the two copies.
//!
//! A [`HostBuffer`] is page-locked (pinned) host memory on the GPU backend:
//! [`Buffer::read_to_host`] and [`Buffer::write_from_host`] copy straight between it and the
//! device, one DMA transfer. Pinning is slow (`cuMemHostAlloc` maps and locks every page, about
//! a millisecond for 100 MB) and so is unpinning; worse, `cuMemFreeHost` waits for every running
//! kernel, and a persistent manifold runs until it is shut down (runtime/src/gpu/driver.rs). So a
//! dropped buffer goes back to its runtime's pool, and the next request of a similar size takes
//! it again: a loop that downloads one tile after another pins memory once.
//!
//! ```
//! # fn main() -> pptm_runtime::Result<()> {
//! let rt = pptm_runtime::Runtime::new()?;
//! let tile = rt.upload(&vec![1.5f32; 1 << 16])?;
//! for _ in 0..3 {
//!     let mut host = rt.host_buffer::<f32>(tile.len())?; // the same memory every time
//!     tile.read_to_host(&mut host)?;
//!     assert_eq!(host[0], 1.5);
//! }
//! let stats = rt.host_pool_stats();
//! assert_eq!((stats.allocations, stats.reuses), (1, 2));
//! # Ok(())
//! # }
//! ```
//!
//! On the CPU backend a host buffer is ordinary memory from the same kind of pool, so code
//! written for the GPU runs unchanged and reuses its memory alike.
//!
//! The pool keeps at most [`Config::host_pool_bytes`](crate::Config::host_pool_bytes) of idle
//! memory (1 GiB by default); a buffer dropped beyond that is freed. [`Runtime::trim_host_pool`]
//! frees every idle buffer now.
//!
//! [`Buffer::read_into`]: crate::Buffer::read_into
//! [`Buffer::write`]: crate::Buffer::write
//! [`Buffer::read_to_host`]: crate::Buffer::read_to_host
//! [`Buffer::write_from_host`]: crate::Buffer::write_from_host
//! [`Runtime::trim_host_pool`]: crate::Runtime::trim_host_pool

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use crate::element::Element;
use crate::error::{Error, Result};
use crate::gpu::Device;

/// Allocations are whole multiples of this (and aligned to it on the CPU backend).
const GRAIN: usize = 4096;

/// One allocation: pinned on the GPU backend, from the global allocator on the CPU backend.
struct Block {
    ptr: NonNull<u8>,
    capacity: usize,
}

// SAFETY: a block is plain memory owned by exactly one HostBuffer or by the pool's free list.
unsafe impl Send for Block {}

/// What the pool has done and holds ([`Runtime::host_pool_stats`](crate::Runtime::host_pool_stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostPoolStats {
    /// Buffers that needed a new allocation (pinned memory on the GPU backend).
    pub allocations: u64,
    /// Buffers served by memory a dropped buffer had given back.
    pub reuses: u64,
    /// Bytes the pool keeps for reuse.
    pub idle_bytes: usize,
    /// Bytes of the live buffers.
    pub in_use_bytes: usize,
}

#[derive(Default)]
struct PoolState {
    /// Idle blocks, by capacity (ascending).
    idle: Vec<Block>,
    stats: HostPoolStats,
}

/// A runtime's pool of host buffers.
pub(crate) struct HostPool {
    /// The device whose pinned memory the pool hands out; `None` on the CPU backend.
    device: Option<Arc<Device>>,
    /// Idle bytes kept at most.
    keep_bytes: usize,
    state: Mutex<PoolState>,
}

impl HostPool {
    pub(crate) fn new(device: Option<Arc<Device>>, keep_bytes: usize) -> Arc<HostPool> {
        Arc::new(HostPool {
            device,
            keep_bytes,
            state: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn stats(&self) -> HostPoolStats {
        self.lock().stats
    }

    /// A buffer of `len` elements: an idle block of at least its size (and at most twice it,
    /// so a small request does not pin a large block), or a new one. A new block is zeroed; a
    /// reused one holds what its last user left.
    pub(crate) fn take<T: Element>(self: &Arc<Self>, len: usize) -> Result<HostBuffer<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|b| *b <= isize::MAX as usize / 2)
            .ok_or(Error::TooLarge {
                what: "a host buffer",
                len,
            })?;
        let capacity = bytes.div_ceil(GRAIN).max(1) * GRAIN;
        let reused = {
            let mut state = self.lock();
            let at = state
                .idle
                .iter()
                .position(|b| b.capacity >= capacity && b.capacity <= 2 * capacity);
            let block = at.map(|i| state.idle.remove(i));
            if let Some(b) = &block {
                state.stats.reuses += 1;
                state.stats.idle_bytes -= b.capacity;
                state.stats.in_use_bytes += b.capacity;
            }
            block
        };
        let block = match reused {
            Some(b) => b,
            None => {
                let b = self.allocate(capacity)?;
                let mut state = self.lock();
                state.stats.allocations += 1;
                state.stats.in_use_bytes += b.capacity;
                b
            }
        };
        Ok(HostBuffer {
            block: Some(block),
            len,
            pool: self.clone(),
            _t: PhantomData,
        })
    }

    fn allocate(&self, capacity: usize) -> Result<Block> {
        let ptr = match &self.device {
            Some(device) => device.alloc_pinned(capacity)?.cast::<u8>(),
            None => {
                let layout = std::alloc::Layout::from_size_align(capacity, GRAIN)
                    .map_err(|_| Error::OutOfMemory { bytes: capacity })?;
                // SAFETY: the layout's size is at least GRAIN, so not zero.
                unsafe { std::alloc::alloc(layout) }
            }
        };
        let ptr = NonNull::new(ptr).ok_or(Error::OutOfMemory { bytes: capacity })?;
        // SAFETY: `capacity` bytes at ptr are ours; zeroing makes every byte initialised, so the
        // buffer may be viewed as a slice of any plain-old-data type.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, capacity) };
        Ok(Block { ptr, capacity })
    }

    fn release(&self, block: Block) {
        let mut freed = None;
        {
            let mut state = self.lock();
            state.stats.in_use_bytes -= block.capacity;
            if state.stats.idle_bytes + block.capacity <= self.keep_bytes {
                state.stats.idle_bytes += block.capacity;
                let at = state.idle.partition_point(|b| b.capacity < block.capacity);
                state.idle.insert(at, block);
            } else {
                freed = Some(block);
            }
        }
        if let Some(b) = freed {
            self.free(b);
        }
    }

    /// Frees every idle block.
    pub(crate) fn trim(&self) {
        let idle = {
            let mut state = self.lock();
            state.stats.idle_bytes = 0;
            std::mem::take(&mut state.idle)
        };
        for b in idle {
            self.free(b);
        }
    }

    fn free(&self, block: Block) {
        match &self.device {
            // Deferred by the device while a manifold is resident (cuMemFreeHost would wait).
            Some(device) => device.free_pinned(block.ptr.as_ptr().cast()),
            None => {
                let layout = std::alloc::Layout::from_size_align(block.capacity, GRAIN)
                    .expect("the layout the block was allocated with");
                // SAFETY: allocated in `allocate` with this layout, and freed once (the block is
                // moved in).
                unsafe { std::alloc::dealloc(block.ptr.as_ptr(), layout) };
            }
        }
    }

    /// Whether the pool's buffers are pinned memory (allocated portable: pinned for every
    /// device's context, so any GPU runtime may copy straight to and from them).
    pub(crate) fn pinned(&self) -> bool {
        self.device.is_some()
    }
}

impl Drop for HostPool {
    fn drop(&mut self) {
        self.trim();
    }
}

/// `len` values of `T` in host memory from a runtime's pool ([`Runtime::host_buffer`]): pinned
/// on the GPU backend, so [`Buffer::read_to_host`] and [`Buffer::write_from_host`] copy straight
/// between it and the device. It derefs to a slice. Dropped, its memory goes back to the pool
/// for the next buffer of a similar size (see the [module docs](self)).
///
/// [`Runtime::host_buffer`]: crate::Runtime::host_buffer
/// [`Buffer::read_to_host`]: crate::Buffer::read_to_host
/// [`Buffer::write_from_host`]: crate::Buffer::write_from_host
pub struct HostBuffer<T: Element> {
    /// Always `Some` until drop hands it back.
    block: Option<Block>,
    len: usize,
    pool: Arc<HostPool>,
    _t: PhantomData<T>,
}

// SAFETY: the buffer owns its block exclusively; T is Send + Sync (Element's bounds).
unsafe impl<T: Element> Send for HostBuffer<T> {}
// SAFETY: shared access only reads the block.
unsafe impl<T: Element> Sync for HostBuffer<T> {}

impl<T: Element> HostBuffer<T> {
    fn block(&self) -> &Block {
        self.block
            .as_ref()
            .expect("a live host buffer holds its block")
    }

    /// The buffer's length, in elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the allocation behind it (a whole number of pages, at least its length).
    pub fn capacity_bytes(&self) -> usize {
        self.block().capacity
    }

    /// Whether the memory is pinned (a GPU runtime's pool).
    pub fn is_pinned(&self) -> bool {
        self.pool.pinned()
    }
}

impl<T: Element> std::ops::Deref for HostBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        let b = self.block();
        // SAFETY: the block holds capacity >= len * size_of::<T>() initialised bytes (zeroed when
        // allocated, then only written through typed slices of Pod types), aligned to GRAIN
        // (pinned memory is page-aligned), and is borrowed for as long as `self` is.
        unsafe { std::slice::from_raw_parts(b.ptr.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Element> std::ops::DerefMut for HostBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let b = self.block();
        // SAFETY: as in deref; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(b.ptr.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Element> std::fmt::Debug for HostBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HostBuffer<{:?}>[{}] ({})",
            T::DTYPE,
            self.len,
            if self.pool.device.is_some() {
                "pinned"
            } else {
                "host"
            }
        )
    }
}

impl<T: Element> Drop for HostBuffer<T> {
    fn drop(&mut self) {
        if let Some(b) = self.block.take() {
            self.pool.release(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_buffers_are_reused_and_sizes_kept_apart() {
        let pool = HostPool::new(None, 1 << 30);
        let mut a = pool.take::<f32>(1000).unwrap();
        assert_eq!(a.len(), 1000);
        assert!(a.iter().all(|&v| v == 0.0), "new memory is zeroed");
        a[999] = 7.0;
        let capacity = a.capacity_bytes();
        assert_eq!(capacity, 4096);
        drop(a);
        let s = pool.stats();
        assert_eq!(
            (s.allocations, s.reuses, s.idle_bytes, s.in_use_bytes),
            (1, 0, 4096, 0)
        );
        // The same size takes the same block back (holding what its last user left).
        let b = pool.take::<f32>(1000).unwrap();
        assert_eq!(b[999], 7.0);
        // Another buffer while it is out gets memory of its own.
        let small = pool.take::<crate::F8E4M3>(10).unwrap();
        assert_eq!(small.len(), 10);
        let s = pool.stats();
        assert_eq!((s.allocations, s.reuses, s.in_use_bytes), (2, 1, 8192));
        drop((b, small));
        // A request larger than every idle block allocates; then a request for a tenth of that
        // block does not take it (a small buffer would pin a large block), but a page-sized one.
        let big = pool.take::<f64>(5000).unwrap(); // 40,000 bytes
        assert_eq!(big.capacity_bytes(), 40960);
        assert!(!big.is_pinned());
        drop(big);
        let tenth = pool.take::<f32>(1000).unwrap();
        assert_eq!(tenth.capacity_bytes(), 4096);
        let s = pool.stats();
        assert_eq!((s.allocations, s.reuses), (3, 2));
        assert_eq!((s.idle_bytes, s.in_use_bytes), (4096 + 40960, 4096));
        drop(tenth);
        // Close to its size, the large block is taken.
        let near = pool.take::<f64>(4000).unwrap();
        assert_eq!(near.capacity_bytes(), 40960);
        drop(near);
        let s = pool.stats();
        assert_eq!((s.allocations, s.reuses, s.in_use_bytes), (3, 3, 0));
        pool.trim();
        assert_eq!(pool.stats().idle_bytes, 0);
        let empty = pool.take::<f32>(0).unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn the_pool_keeps_at_most_its_limit() {
        let pool = HostPool::new(None, 8192);
        let bufs: Vec<_> = (0..4).map(|_| pool.take::<u32>(1024).unwrap()).collect();
        drop(bufs);
        let s = pool.stats();
        assert_eq!((s.idle_bytes, s.in_use_bytes), (8192, 0));
        assert!(matches!(
            pool.take::<f64>(usize::MAX / 4),
            Err(Error::TooLarge { .. })
        ));
    }
}
