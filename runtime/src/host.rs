//! Host memory of the CPU backend's buffers, shared with the items that run on it.
//!
//! The CPU backend runs an item on a worker pool after `submit` returns, while its ticket borrows
//! the buffers. The borrow is what keeps the application away from them, but a ticket can be
//! leaked (`std::mem::forget`), which ends the borrow with the item still running. So an item
//! does not rely on the borrow alone: it holds the memory itself ([`HostData`] is shared by
//! `Arc`, so dropping the buffer frees nothing under it) and an access lock on each buffer it
//! uses (shared to read, exclusive to write), taken at submission and released when it ends.
//! Every other access to the buffer takes the same lock, so after a leaked ticket a read of its
//! output waits for the item instead of racing it.

use std::cell::UnsafeCell;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// The elements of one host buffer, and who may touch them now.
pub(crate) struct HostData<T> {
    elements: UnsafeCell<Box<[T]>>,
    access: Mutex<Access>,
    changed: Condvar,
}

/// Readers in progress, or a writer: the state of a buffer's access lock.
#[derive(Default)]
struct Access {
    readers: usize,
    writer: bool,
}

// SAFETY: the elements are only reached through `HostRead` (shared access, no writer) and
// `HostWrite` (exclusive access), which the access lock hands out; `T` itself is sent and shared
// between threads that way, so it must be `Send + Sync`.
unsafe impl<T: Send + Sync> Sync for HostData<T> {}
// SAFETY: as above; the data moves with the `Arc` between threads.
unsafe impl<T: Send + Sync> Send for HostData<T> {}

impl<T> HostData<T> {
    pub(crate) fn new(elements: Vec<T>) -> Arc<Self> {
        Arc::new(HostData {
            elements: UnsafeCell::new(elements.into_boxed_slice()),
            access: Mutex::new(Access::default()),
            changed: Condvar::new(),
        })
    }

    /// Waits until no one writes the buffer, then reads it until the guard drops.
    pub(crate) fn read(self: &Arc<Self>) -> HostRead<T> {
        let mut a = self.access.lock().unwrap_or_else(PoisonError::into_inner);
        while a.writer {
            a = self.changed.wait(a).unwrap_or_else(PoisonError::into_inner);
        }
        a.readers += 1;
        HostRead { data: self.clone() }
    }

    /// Waits until no one reads or writes the buffer, then writes it until the guard drops.
    pub(crate) fn write(self: &Arc<Self>) -> HostWrite<T> {
        let mut a = self.access.lock().unwrap_or_else(PoisonError::into_inner);
        while a.writer || a.readers > 0 {
            a = self.changed.wait(a).unwrap_or_else(PoisonError::into_inner);
        }
        a.writer = true;
        HostWrite { data: self.clone() }
    }

    fn release(&self, writer: bool) {
        let mut a = self.access.lock().unwrap_or_else(PoisonError::into_inner);
        if writer {
            a.writer = false;
        } else {
            a.readers -= 1;
        }
        drop(a);
        self.changed.notify_all();
    }
}

/// Shared access to a host buffer's elements (no writer while it lives).
pub(crate) struct HostRead<T> {
    data: Arc<HostData<T>>,
}

impl<T> HostRead<T> {
    pub(crate) fn slice(&self) -> &[T] {
        // SAFETY: the read lock is held for as long as `self` lives, so no `HostWrite` exists
        // and nothing mutates the elements.
        unsafe { &*self.data.elements.get() }
    }
}

impl<T> Drop for HostRead<T> {
    fn drop(&mut self) {
        self.data.release(false);
    }
}

/// Exclusive access to a host buffer's elements.
pub(crate) struct HostWrite<T> {
    data: Arc<HostData<T>>,
}

impl<T> HostWrite<T> {
    pub(crate) fn slice_mut(&mut self) -> &mut [T] {
        // SAFETY: the write lock is held for as long as `self` lives, so no other guard exists;
        // `&mut self` makes this the only reference handed out by this guard.
        unsafe { &mut *self.data.elements.get() }
    }
}

impl<T> Drop for HostWrite<T> {
    fn drop(&mut self) {
        self.data.release(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_writer_waits_for_readers_and_readers_wait_for_a_writer() {
        let data = HostData::new(vec![0u32; 4]);
        let r1 = data.read();
        let r2 = data.read();
        assert_eq!(r1.slice(), r2.slice());
        let (tx, rx) = std::sync::mpsc::channel();
        let d = data.clone();
        let writer = std::thread::spawn(move || {
            let mut w = d.write();
            w.slice_mut().fill(7);
            tx.send(()).unwrap();
            // Held for a while: a reader that comes now must wait for it.
            std::thread::sleep(Duration::from_millis(50));
            w.slice_mut()[0] = 8;
        });
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        drop((r1, r2));
        rx.recv().unwrap();
        assert_eq!(data.read().slice(), &[8, 7, 7, 7]);
        writer.join().unwrap();
    }
}
