//! Words in device memory that order pptm's items and an application's CUDA streams on the GPU,
//! without a host round trip (docs/embedding.md, "Ordering with the application's streams").
//! Device memory rather than mapped host memory: on an H200 a stream and a resident kernel handed
//! control back and forth through device words in 3.0 us, through host words in 5.7 us, and each
//! stream memory operation on host memory cost the host twice as long to enqueue
//! (bench/probes/stream_memops.cu).
//!
//! * **Domain lines.** Each domain's manifold stores `base + seq + 1` into its line after item
//!   `seq` completes (abi.h, `pptm_manifold_params::signal`). An application stream waits for an
//!   item with `cuStreamWaitValue64(line, base + seq + 1, GEQ)`: `Ticket::signal_stream`. The line
//!   only grows: a manifold that replaces another of its domain (a re-partition, a restart after
//!   the watchdog) starts from where the last one ended, and a manifold that stops without running
//!   its items (a hang, a fault) has its line raised past them, so a waiting stream is released
//!   and the failure is reported by the ticket instead.
//! * **Stream lines.** `Runtime::wait_for_stream` enqueues `cuStreamWriteValue64(line, v)` on the
//!   application's stream, one line per stream (a stream's writes land in its order, so its line
//!   only grows), and the next item of every domain is preceded by a `PPTM_OP_WAIT_VALUE` item
//!   that waits on the GPU until the line holds `v`.
//!
//! The application's streams reach this memory after the calls return, perhaps much later. So
//! every such call is followed by an event recorded on the same stream, and the memory is freed
//! only once every event has completed; if some never do within the shutdown timeout, the memory
//! is leaked rather than freed under a stream that may still read or write it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::sys;

use super::driver::{Device, check};
use crate::error::{Error, Result};

/// Bytes per line: one 64-byte line each, so the device's stores to one line and a stream's
/// accesses to another never share one.
const LINE_BYTES: usize = 64;
/// Lines for domains (each domain that starts a manifold in this runtime takes one for good).
const DOMAIN_LINES: usize = 64;
/// Lines for application streams (reused, least recently used first, once idle).
const STREAM_LINES: usize = 192;

/// An application stream's line and the last value handed out on it.
struct StreamLine {
    line: usize,
    used: u64,
}

struct Book {
    domains: HashMap<&'static str, usize>,
    /// Per domain line: the value its next manifold starts from.
    next_base: Vec<u64>,
    streams: HashMap<usize, StreamLine>,
    free_stream_lines: Vec<usize>,
    /// Per line: the last value handed out on it (a stream line keeps counting up when another
    /// stream takes it over).
    last: Vec<u64>,
    /// Per application stream that has an operation on the lines not known to be passed: an
    /// event recorded after its latest one (a stream runs in order, so one event covers them all).
    pending: HashMap<usize, sys::CUevent>,
    uses: u64,
}

/// The signal lines of one runtime (see the module docs).
pub(crate) struct Signals {
    device: Arc<Device>,
    /// (DOMAIN_LINES + STREAM_LINES) lines of device memory, zeroed.
    mem: sys::CUdeviceptr,
    /// Set when an application stream may still use the memory: it is never freed.
    leak: AtomicBool,
    book: Mutex<Book>,
    shutdown_timeout: Duration,
}

// SAFETY: the events are driver handles usable from any thread; the book is behind a mutex.
unsafe impl Send for Signals {}
// SAFETY: as above.
unsafe impl Sync for Signals {}

/// Where a manifold signals its completions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DomainLine {
    pub index: usize,
    pub device_ptr: u64,
    /// The line's value when the manifold starts: item `seq` completes as `base + seq + 1`.
    pub base: u64,
}

impl Signals {
    /// Allocates the lines: plain device memory (stream memory operations refuse pool memory),
    /// zeroed with copies; both work beside resident manifolds.
    pub fn new(device: &Arc<Device>, shutdown_timeout: Duration) -> Result<Arc<Self>> {
        let mem = device.alloc_plain((DOMAIN_LINES + STREAM_LINES) * LINE_BYTES)?;
        Ok(Arc::new(Signals {
            device: device.clone(),
            mem,
            leak: AtomicBool::new(false),
            book: Mutex::new(Book {
                domains: HashMap::new(),
                next_base: vec![0; DOMAIN_LINES],
                streams: HashMap::new(),
                free_stream_lines: (DOMAIN_LINES..DOMAIN_LINES + STREAM_LINES).rev().collect(),
                last: vec![0; DOMAIN_LINES + STREAM_LINES],
                pending: HashMap::new(),
                uses: 0,
            }),
            shutdown_timeout,
        }))
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn device_ptr(&self, line: usize) -> u64 {
        self.mem + (line * LINE_BYTES) as u64
    }

    /// The line of `domain` (taken on first use) and the value its next manifold starts from.
    pub fn domain_line(&self, domain: &'static str) -> Result<DomainLine> {
        let mut book = self.book();
        let taken = book.domains.len();
        let index = match book.domains.get(domain) {
            Some(&i) => i,
            None if taken < DOMAIN_LINES => {
                book.domains.insert(domain, taken);
                taken
            }
            None => {
                return Err(Error::Config(format!(
                    "a runtime runs at most {DOMAIN_LINES} domains; `{domain}` would be one more"
                )));
            }
        };
        Ok(DomainLine {
            index,
            device_ptr: self.device_ptr(index),
            base: book.next_base[index],
        })
    }

    /// A manifold of the line's domain has stopped after `items` items (every one it was given,
    /// run or not): its line is raised past them, so no stream waits for an item that will never
    /// complete, and the next manifold of the domain starts there.
    pub fn finish_domain_line(&self, line: DomainLine, items: u64) {
        let end = line.base + items;
        let mut book = self.book();
        if book.next_base[line.index] >= end {
            return;
        }
        book.next_base[line.index] = end;
        // Every value the manifold stored is below `end` (and a stopped manifold stores no more),
        // so this only raises the word. A copy, which runs beside resident manifolds.
        if let Err(e) = self.device.upload(line.device_ptr, &end.to_ne_bytes()) {
            tracing::warn!(
                "could not release the application streams waiting for a stopped manifold: {e}"
            );
        }
    }

    /// Makes `stream` wait on the GPU until the domain line holds `value` or more.
    ///
    /// # Safety
    /// `stream` is a valid stream of this device's primary context.
    pub unsafe fn stream_waits_for(
        &self,
        stream: sys::CUstream,
        line: DomainLine,
        value: u64,
    ) -> Result<()> {
        let mut book = self.book();
        self.device.bind()?;
        let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: the caller vouches for the stream; the address is a word of our
        // device allocation, which stays allocated until the event recorded below has completed.
        check("cuStreamWaitValue64", unsafe {
            sys::cuStreamWaitValue64_v2(stream, line.device_ptr, value, flags)
        })?;
        // SAFETY: as above.
        unsafe { self.guard(&mut book, stream) }
    }

    /// Enqueues on `stream` a write of a new value to the stream's line, after the work already
    /// enqueued there (with a memory barrier: what that work wrote is visible to whoever sees the
    /// value). Returns the line's device address and the value, for a `PPTM_OP_WAIT_VALUE` item.
    ///
    /// # Safety
    /// `stream` is a valid stream of this device's primary context.
    pub unsafe fn stream_reaches(&self, stream: sys::CUstream) -> Result<(u64, u64)> {
        let mut book = self.book();
        book.uses += 1;
        let used = book.uses;
        let key = stream as usize;
        if !book.streams.contains_key(&key) {
            let line = match book.free_stream_lines.pop() {
                Some(line) => line,
                None => {
                    // The least recently used stream line whose stream is past it.
                    self.reap(&mut book);
                    let victim = book
                        .streams
                        .iter()
                        .filter(|(k, _)| !book.pending.contains_key(k))
                        .min_by_key(|(_, s)| s.used)
                        .map(|(&k, _)| k)
                        .ok_or(Error::DriverObjectsUnavailable {
                            what: "stream signal lines",
                            made: STREAM_LINES,
                        })?;
                    book.streams.remove(&victim).expect("found").line
                }
            };
            // A reused line keeps its value; the new stream's values continue above it.
            book.streams.insert(key, StreamLine { line, used });
        }
        let s = book.streams.get_mut(&key).expect("inserted");
        s.used = used;
        let line = s.line;
        book.last[line] += 1;
        let value = book.last[line];
        self.device.bind()?;
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // SAFETY: the caller vouches for the stream; the address is a word of our
        // allocation, kept until the event recorded below has completed.
        let written = check("cuStreamWriteValue64", unsafe {
            sys::cuStreamWriteValue64_v2(stream, self.device_ptr(line), value, flags)
        });
        if let Err(e) = written {
            book.last[line] -= 1;
            return Err(e);
        }
        // SAFETY: as above.
        unsafe { self.guard(&mut book, stream) }?;
        Ok((self.device_ptr(line), value))
    }

    /// Whether the stream point `(word, value)` (from `stream_reaches`) is known to be passed: the
    /// stream that wrote it has passed its latest operation on the words. A manifold launched
    /// after the point need not queue a wait for it.
    pub fn point_passed(&self, word: u64, value: u64) -> bool {
        let mut book = self.book();
        let line = ((word - self.mem) / LINE_BYTES as u64) as usize;
        if book.last.get(line).is_none_or(|&last| last < value) {
            return false;
        }
        let Some(key) = book
            .streams
            .iter()
            .find(|(_, s)| s.line == line)
            .map(|(&k, _)| k)
        else {
            // A line is handed to another stream only once its last one has passed it.
            return true;
        };
        let Some(&event) = book.pending.get(&key) else {
            return true;
        };
        if self.device.bind().is_err() {
            return false;
        }
        // SAFETY: a recorded event of ours.
        let done = unsafe { sys::cuEventQuery(event) } == sys::CUresult::CUDA_SUCCESS;
        if done {
            book.pending.remove(&key);
            self.device.give_back_event(event);
        }
        done
    }

    /// Records an event on `stream` after an operation on the lines, kept until it completes: the
    /// stream's event, recorded again, or one from the device's spares.
    ///
    /// # Safety
    /// `stream` is a valid stream of this device's primary context.
    unsafe fn guard(&self, book: &mut Book, stream: sys::CUstream) -> Result<()> {
        let key = stream as usize;
        let (event, fresh) = match book.pending.get(&key) {
            Some(&e) => (e, false),
            None => {
                // A new stream: first give back the events of streams that are past theirs.
                self.reap(book);
                (self.device.take_event()?, true)
            }
        };
        // SAFETY: the event is ours (recording it again moves it to the stream's new end); the
        // stream is the caller's promise.
        let recorded = unsafe { sys::cuEventRecord(event, stream) };
        if let Err(e) = check("cuEventRecord", recorded) {
            // The operation is enqueued but unguarded: keep the memory for good.
            self.leak.store(true, Ordering::Relaxed);
            if fresh {
                self.device.give_back_event(event);
            }
            return Err(e);
        }
        book.pending.insert(key, event);
        Ok(())
    }

    /// Gives back the events whose streams have passed them.
    fn reap(&self, book: &mut Book) {
        if book.pending.is_empty() || self.device.bind().is_err() {
            return;
        }
        book.pending.retain(|_, &mut event| {
            // SAFETY: a recorded event of ours.
            let done = unsafe { sys::cuEventQuery(event) } == sys::CUresult::CUDA_SUCCESS;
            if done {
                self.device.give_back_event(event);
            }
            !done
        });
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        let deadline = Instant::now() + self.shutdown_timeout;
        let mut book = std::mem::replace(
            self.book.get_mut().unwrap_or_else(|e| e.into_inner()),
            Book {
                domains: HashMap::new(),
                next_base: Vec::new(),
                streams: HashMap::new(),
                free_stream_lines: Vec::new(),
                last: Vec::new(),
                pending: HashMap::new(),
                uses: 0,
            },
        );
        loop {
            self.reap(&mut book);
            if book.pending.is_empty() {
                if !self.leak.load(Ordering::Relaxed) {
                    self.device.free_plain(self.mem);
                }
                return;
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        tracing::warn!(
            streams = book.pending.len(),
            "application streams have not passed pptm's signal words within the shutdown timeout; \
             the words' memory is leaked rather than freed under them"
        );
        for (_, event) in book.pending {
            // SAFETY: our event; destroying one with a record pending returns at once and
            // releases it when the record completes.
            let _ = unsafe { sys::cuEventDestroy_v2(event) };
        }
    }
}
