//! The host half of the submission/completion rings (the protocol is in kernels/pptm/abi.h).
//!
//! Ownership, io_uring style:
//! * SQ slots: written only by the host, under the producer lock, with release stores of whole
//!   tagged 8-byte words; read only by the device.
//! * CQ entries: written only by the device; read by any host thread that waits on a ticket, and
//!   by the producer before it reuses a slot.
//! * A slot (SQ slot and CQ entry of the same index) belongs to one item from its submission until
//!   its completion has been read into the item's [`Cell`]; only then may the producer reuse it.
//!   Since the device reads an item before completing it, this is enough for neither side to
//!   overrun the other, in whatever order items complete (independent items side by side
//!   complete out of order).
//!
//! Completions are read by the waiting thread itself (no completion thread, no wake-up latency):
//! the first reader copies the entry into the item's `Cell` (a `OnceLock`), so each completion is
//! delivered exactly once whoever reads it first. Entries are tagged words (abi.h), so a reader
//! either sees a whole completion of the item it asks about or nothing.

// Through crate::sync: loom's primitives under `--cfg loom` (models in gpu/queue_loom.rs).
use std::sync::Arc;

use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Mutex, OnceLock};

use super::abi::{
    PPTM_CQ_WORDS, PPTM_SQ_SLOT_WORDS, payload, pptm_cq_entry, pptm_desc, pptm_host_control,
    pptm_sq_slot, sq_tag,
};
use crate::chain::Completion;
use crate::ticket::ProductPaths;

/// Memory that holds both rings and the control words: `slots` SQ slots, then `slots` CQ entries,
/// then one `pptm_host_control`.
pub(crate) trait RingMemory: Send + Sync {
    /// Base address, 64-byte aligned, of `bytes_for(slots)` bytes that stay valid while `self` lives.
    fn base(&self) -> *mut u8;
    /// Called when a device that may still write the rings could not be stopped.
    fn leak(&self) {}
}

pub(crate) fn bytes_for(slots: u32) -> usize {
    control_offset(slots) + std::mem::size_of::<pptm_host_control>()
}

/// Byte offset, after the rings and control words, of the memory a manifold keeps beside them in
/// the same allocation (its host plan arena, gpu/plan.rs).
pub(crate) fn tail_offset(slots: u32) -> usize {
    bytes_for(slots).next_multiple_of(256)
}

/// Byte offset of the CQ in the ring memory.
pub(crate) fn cq_offset(slots: u32) -> usize {
    slots as usize * std::mem::size_of::<pptm_sq_slot>()
}

/// Byte offset of the control words in the ring memory.
pub(crate) fn control_offset(slots: u32) -> usize {
    cq_offset(slots) + slots as usize * std::mem::size_of::<pptm_cq_entry>()
}

/// Why an item will not complete normally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The queue shut down before the item ran.
    ShutDown,
    /// The manifold stopped (fault, unexpected exit, or it could not be stopped).
    Stopped(String),
    /// The watchdog saw no progress: `running` is the item that was running.
    Hang(Culprit),
    /// The device faulted while `running` was the item running.
    Fault(Culprit),
}

/// The item that was running when a manifold hung or faulted, and what the host knows of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Culprit {
    pub seq: u64,
    /// The chain (or built-in item) it ran.
    pub chain: &'static str,
    /// Fault: the driver's error.
    pub reason: String,
    /// Hang: how long no progress was seen.
    pub stalled: std::time::Duration,
    /// Hang: whether the manifold left on the abort (its memory safe to reuse, relaunch possible).
    pub recovered: bool,
}

/// One submitted item: filled exactly once, with its completion or its failure.
#[derive(Debug)]
pub(crate) struct Cell {
    pub seq: u64,
    /// What the item runs (a chain's name), for errors that name it.
    pub label: &'static str,
    result: OnceLock<Result<Completion, Failure>>,
}

impl Cell {
    pub fn result(&self) -> Option<&Result<Completion, Failure>> {
        self.result.get()
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PushError {
    /// Every slot holds an item that has not completed.
    Full,
    /// The queue no longer accepts items.
    Closed,
}

struct Producer {
    next_seq: u64,
    /// The item that owns each slot, if any.
    cells: Vec<Option<Arc<Cell>>>,
}

pub(crate) struct Queue {
    memory: Box<dyn RingMemory>,
    /// Bytes of the memory after `tail_offset(slots)` (the host plan arena).
    tail_bytes: usize,
    slots: u32,
    log2: u32,
    producer: Mutex<Producer>,
    closed: AtomicBool,
}

impl Queue {
    /// `slots` must be a power of two; `memory` must hold `bytes_for(slots)` zeroed bytes.
    #[cfg(any(test, loom))]
    pub fn new(memory: Box<dyn RingMemory>, slots: u32) -> Self {
        Self::with_tail(memory, slots, 0)
    }

    /// As `new`, with `tail_bytes` more bytes after `tail_offset(slots)` in `memory`.
    pub fn with_tail(memory: Box<dyn RingMemory>, slots: u32, tail_bytes: usize) -> Self {
        assert!(
            slots.is_power_of_two(),
            "queue slots must be a power of two"
        );
        assert_eq!(
            memory.base() as usize % 64,
            0,
            "ring memory must be 64-byte aligned"
        );
        Queue {
            memory,
            tail_bytes,
            slots,
            log2: slots.trailing_zeros(),
            producer: Mutex::new(Producer {
                next_seq: 0,
                cells: vec![None; slots as usize],
            }),
            closed: AtomicBool::new(false),
        }
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    pub fn log2(&self) -> u32 {
        self.log2
    }

    fn sq_words(&self, slot: usize) -> &[AtomicU64] {
        let words = PPTM_SQ_SLOT_WORDS as usize;
        // SAFETY: the memory holds `slots` SQ slots of `words` u64 each from `base`, 64-byte
        // aligned, alive as long as `self`; AtomicU64 has u64's layout, and every access to these
        // words (host or device) is atomic.
        unsafe {
            std::slice::from_raw_parts(
                self.memory.base().cast::<AtomicU64>().add(slot * words),
                words,
            )
        }
    }

    /// `words` u64 words of the tail from byte `offset` (8-byte aligned), or None beyond it.
    pub fn tail_words(&self, offset: usize, words: usize) -> Option<&[AtomicU64]> {
        let end = words.checked_mul(8)?.checked_add(offset)?;
        if !offset.is_multiple_of(8) || end > self.tail_bytes {
            return None;
        }
        // SAFETY: in bounds of the tail (checked above), which lives in the same allocation as the
        // rings for as long as `self`; 8-byte aligned (the tail starts 256-byte aligned); the
        // device and the host access these words only as whole u64 words.
        Some(unsafe {
            std::slice::from_raw_parts(
                self.memory
                    .base()
                    .add(tail_offset(self.slots) + offset)
                    .cast::<AtomicU64>(),
                words,
            )
        })
    }

    fn cq_words(&self, slot: usize) -> &[AtomicU64; 8] {
        // SAFETY: the CQ follows the SQ in the same allocation: `slots` entries of 64 bytes (8
        // u64 words), alive as long as `self`; the device writes them atomically and the host
        // only reads them atomically.
        unsafe {
            &*self
                .memory
                .base()
                .add(cq_offset(self.slots) + slot * std::mem::size_of::<pptm_cq_entry>())
                .cast::<[AtomicU64; 8]>()
        }
    }

    /// The start handshake words (`pptm_host_control`): whether the kernel started.
    pub fn started(&self) -> bool {
        self.control_words()[0].load(Ordering::Acquire) != 0
    }

    /// The device's latest progress stamp (`pptm_host_control::heartbeat`).
    pub fn heartbeat(&self) -> u64 {
        self.control_words()[16].load(Ordering::Relaxed)
    }

    /// Asks every block of the manifold to leave its loops (`pptm_host_control::abort`).
    pub fn request_abort(&self) {
        self.control_words()[24].store(1, Ordering::Release);
    }

    /// The oldest item without a result, after reading what the device completed: its sequence
    /// number and label (the item the device is running, or about to run).
    pub fn oldest_pending(&self) -> Option<(u64, &'static str)> {
        let p = self.producer.lock().unwrap_or_else(|e| e.into_inner());
        p.cells
            .iter()
            .flatten()
            .filter(|c| !self.poll(c))
            .min_by_key(|c| c.seq)
            .map(|c| (c.seq, c.label))
    }

    /// Tells a manifold that has not started yet to exit as soon as it does.
    pub fn cancel_start(&self) {
        self.control_words()[8].store(1, Ordering::Release);
    }

    fn control_words(&self) -> &[AtomicU64; 32] {
        // SAFETY: the control block (256 bytes = 32 u64 words: `started` at 0, `cancel` at 8,
        // `heartbeat` at 16, `abort` at 24) follows the CQ in the same allocation, alive as long
        // as `self`; both sides access it atomically.
        unsafe {
            &*self
                .memory
                .base()
                .add(control_offset(self.slots))
                .cast::<[AtomicU64; 32]>()
        }
    }

    /// Writes `desc` (what `label` names) into the next slot. `allow_closed` lets the shutdown
    /// item through.
    pub fn try_push(
        &self,
        desc: &pptm_desc,
        allow_closed: bool,
        label: &'static str,
    ) -> Result<Arc<Cell>, PushError> {
        let mut p = self.producer.lock().unwrap_or_else(|e| e.into_inner());
        if self.closed.load(Ordering::Acquire) && !allow_closed {
            return Err(PushError::Closed);
        }
        let seq = p.next_seq;
        let slot = (seq & u64::from(self.slots - 1)) as usize;
        if let Some(prev) = &p.cells[slot]
            && !self.poll(prev)
        {
            return Err(PushError::Full);
        }
        let tag = u64::from(sq_tag(seq, self.log2));
        for (word, value) in self.sq_words(slot).iter().zip(payload(desc)) {
            word.store((u64::from(value) << 32) | tag, Ordering::Release);
        }
        let cell = Arc::new(Cell {
            seq,
            label,
            result: OnceLock::new(),
        });
        p.cells[slot] = Some(cell.clone());
        p.next_seq = seq + 1;
        Ok(cell)
    }

    /// The item whose slot the next submission needs (to wait on when the queue is full).
    pub fn blocking_item(&self) -> Option<Arc<Cell>> {
        let p = self.producer.lock().unwrap_or_else(|e| e.into_inner());
        let slot = (p.next_seq & u64::from(self.slots - 1)) as usize;
        p.cells[slot].clone()
    }

    /// Whether `cell` has its result, reading its completion entry if the device wrote it.
    pub fn poll(&self, cell: &Cell) -> bool {
        if cell.result.get().is_some() {
            return true;
        }
        if let Some(c) = self.read_completion(cell.seq) {
            let _ = cell.result.set(Ok(c));
            return true;
        }
        // Tags that do not match mean "not written yet" or "already overwritten by a later item";
        // in the second case the producer copied this item's completion into the cell first.
        cell.result.get().is_some()
    }

    /// The completion of item `seq`, if its entry holds it (every word tagged for `seq`).
    fn read_completion(&self, seq: u64) -> Option<Completion> {
        let e = self.cq_words((seq & u64::from(self.slots - 1)) as usize);
        let tag = sq_tag(seq, self.log2);
        let mut payload = [0u32; PPTM_CQ_WORDS as usize];
        for (p, w) in payload.iter_mut().zip(e.iter()) {
            let v = w.load(Ordering::Acquire);
            if v as u32 != tag {
                return None;
            }
            *p = (v >> 32) as u32;
        }
        Some(Completion {
            status: payload[0],
            value: f64::from_bits(u64::from(payload[2]) | (u64::from(payload[3]) << 32)),
            device_ns: Some(u64::from(payload[4])),
            paths: Some(ProductPaths::from_bits(payload[5])),
        })
    }

    /// Stops accepting items (the shutdown item still goes through `try_push(.., true)`).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Fails every item that has no result yet; returns how many.
    pub fn fail_pending(&self, failure: Failure) -> usize {
        let p = self.producer.lock().unwrap_or_else(|e| e.into_inner());
        let mut failed = 0;
        for cell in p.cells.iter().flatten() {
            if !self.poll(cell) && cell.result.set(Err(failure.clone())).is_ok() {
                failed += 1;
            }
        }
        failed
    }

    /// Items submitted so far.
    pub fn submitted(&self) -> u64 {
        self.producer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .next_seq
    }

    /// Marks the ring memory as never to be freed (the device may still use it).
    pub fn leak_memory(&self) {
        self.memory.leak();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! The protocol against a device emulated by a host thread: what the manifold's leader and last
    //! block do, word for word, on plain memory.

    use super::*;
    use crate::gpu::abi::{PPTM_OP_SHUTDOWN, PPTM_STATUS_OK, from_payload, pptm_host_control};
    use std::thread;
    use std::time::{Duration, Instant};

    /// Heap memory standing in for the mapped rings.
    pub(crate) struct HeapRings(Box<[AtomicU64]>);

    impl HeapRings {
        pub fn new(slots: u32) -> Box<Self> {
            let words = bytes_for(slots) / 8 + 8;
            // 8 spare words: `base` starts at the first 64-byte boundary inside.
            Box::new(HeapRings((0..words).map(|_| AtomicU64::new(0)).collect()))
        }
    }

    impl RingMemory for HeapRings {
        fn base(&self) -> *mut u8 {
            let p = self.0.as_ptr() as usize;
            let aligned = p.div_ceil(64) * 64;
            aligned as *mut u8
        }
    }

    /// Item `seq`'s descriptor if its slot holds it (every word tagged for `seq`).
    fn staged(queue: &Queue, seq: u64) -> Option<pptm_desc> {
        let slot = (seq as usize) & (queue.slots as usize - 1);
        let tag = sq_tag(seq, queue.log2);
        let mut payload = [0u32; 32];
        for (i, w) in queue.sq_words(slot).iter().enumerate() {
            let v = w.load(Ordering::Acquire);
            if v as u32 != tag {
                return None;
            }
            payload[i] = (v >> 32) as u32;
        }
        Some(from_payload(&payload))
    }

    /// Writes item `seq`'s completion as the device does: the result is 2 × args[0]; word 4 (the
    /// device time, ns) is the item number, word 5 (the product paths) the opcode's low bits.
    fn complete(queue: &Queue, seq: u64, d: &pptm_desc) {
        let slot = (seq as usize) & (queue.slots as usize - 1);
        let tag = sq_tag(seq, queue.log2);
        let e = queue.cq_words(slot);
        let bits = (d.args[0] as f64 * 2.0).to_bits();
        let words = [
            PPTM_STATUS_OK,
            d.opcode,
            bits as u32,
            (bits >> 32) as u32,
            seq as u32,
            d.opcode & 0xf,
        ];
        const _: () = assert!(PPTM_CQ_WORDS == 6, "the fake device writes every word");
        // Written in an arbitrary order: each word stands on its own.
        for i in [3usize, 1, 5, 4, 0, 2] {
            e[i].store(
                u64::from(words[i]) << 32 | u64::from(tag),
                Ordering::Relaxed,
            );
        }
    }

    /// Runs items in order, one at a time, as a manifold runs barriers; the result of an item is
    /// 2 × args[0].
    pub(crate) fn fake_device(
        queue: Arc<Queue>,
        pause: Arc<AtomicBool>,
    ) -> thread::JoinHandle<u64> {
        thread::spawn(move || {
            for seq in 0u64.. {
                let d = loop {
                    while pause.load(Ordering::Acquire) {
                        thread::yield_now();
                    }
                    match staged(&queue, seq) {
                        Some(d) => break d,
                        None => thread::yield_now(),
                    }
                };
                complete(&queue, seq, &d);
                if d.opcode == PPTM_OP_SHUTDOWN {
                    return seq + 1;
                }
            }
            unreachable!()
        })
    }

    /// Completes items out of order, as a manifold completes independent items side by side:
    /// it takes every item already submitted (up to 8) and completes them last first. A shutdown
    /// item is a barrier: everything before it completes first.
    fn fake_device_out_of_order(queue: Arc<Queue>) -> thread::JoinHandle<u64> {
        thread::spawn(move || {
            let mut next = 0u64;
            loop {
                let mut batch = Vec::new();
                while batch.len() < 8 {
                    match staged(&queue, next) {
                        Some(d) => {
                            batch.push((next, d));
                            next += 1;
                            if d.opcode == PPTM_OP_SHUTDOWN {
                                break;
                            }
                        }
                        None if batch.is_empty() => thread::yield_now(),
                        None => break,
                    }
                }
                let shutdown = batch
                    .last()
                    .is_some_and(|(_, d)| d.opcode == PPTM_OP_SHUTDOWN)
                    .then(|| batch.pop().expect("last"));
                for (seq, d) in batch.iter().rev() {
                    complete(&queue, *seq, d);
                }
                if let Some((seq, d)) = shutdown {
                    complete(&queue, seq, &d);
                    return seq + 1;
                }
            }
        })
    }

    fn desc(opcode: u32, arg: u64) -> pptm_desc {
        let mut d = pptm_desc {
            opcode,
            ..Default::default()
        };
        d.args[0] = arg;
        d
    }

    /// Waits for `c` as a ticket does. The emulated device completes an item in microseconds;
    /// one that is not done in 10 s never will be (a protocol bug), and the test fails rather
    /// than hangs.
    fn wait(q: &Queue, c: &Cell) -> Completion {
        let t = Instant::now();
        while !q.poll(c) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "item {} never completed",
                c.seq
            );
            thread::yield_now();
        }
        c.result().unwrap().clone().unwrap()
    }

    fn push_blocking(q: &Queue, d: &pptm_desc) -> Arc<Cell> {
        loop {
            match q.try_push(d, false, "test") {
                Ok(c) => return c,
                Err(PushError::Full) => {
                    let b = q.blocking_item().unwrap();
                    wait(q, &b);
                }
                Err(PushError::Closed) => panic!("closed"),
            }
        }
    }

    #[test]
    fn every_item_completes_once_with_its_own_result_across_many_laps() {
        let q = Arc::new(Queue::new(HeapRings::new(8), 8));
        let dev = fake_device(q.clone(), Arc::new(AtomicBool::new(false)));
        let mut pending = std::collections::VecDeque::new();
        for i in 0..20_000u64 {
            pending.push_back((i, push_blocking(&q, &desc(100, i))));
            if pending.len() > 6 {
                let (i, c) = pending.pop_front().unwrap();
                assert_eq!(wait(&q, &c).value, 2.0 * i as f64);
            }
        }
        for (i, c) in pending {
            assert_eq!(wait(&q, &c).value, 2.0 * i as f64);
        }
        q.close();
        let shutdown = q
            .try_push(&desc(PPTM_OP_SHUTDOWN, 0), true, "test")
            .unwrap();
        wait(&q, &shutdown);
        assert_eq!(dev.join().unwrap(), 20_001);
    }

    #[test]
    fn many_producers_and_waiters() {
        let q = Arc::new(Queue::new(HeapRings::new(16), 16));
        let dev = fake_device(q.clone(), Arc::new(AtomicBool::new(false)));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let q = q.clone();
                thread::spawn(move || {
                    for i in 0..3_000u64 {
                        let arg = t * 1_000_000 + i;
                        let c = push_blocking(&q, &desc(100, arg));
                        // Wait on some right away, leave others for later readers.
                        if i % 3 != 0 {
                            assert_eq!(wait(&q, &c).value, 2.0 * arg as f64);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        q.close();
        assert_eq!(
            q.try_push(&desc(100, 0), false, "test").unwrap_err(),
            PushError::Closed
        );
        let c = q
            .try_push(&desc(PPTM_OP_SHUTDOWN, 0), true, "test")
            .unwrap();
        wait(&q, &c);
        assert_eq!(dev.join().unwrap(), 12_001);
    }

    /// Completions that arrive out of order (items side by side): every item of many producers
    /// completes once with its own result, slots are reused only after their completion was read,
    /// and a full queue waits for the item whose slot it needs, whichever completes first.
    #[test]
    fn out_of_order_completions_each_arrive_once() {
        let q = Arc::new(Queue::new(HeapRings::new(16), 16));
        let dev = fake_device_out_of_order(q.clone());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let q = q.clone();
                thread::spawn(move || {
                    let mut pending = std::collections::VecDeque::new();
                    for i in 0..3_000u64 {
                        let arg = t * 1_000_000 + i;
                        pending.push_back((arg, push_blocking(&q, &desc(100, arg))));
                        if pending.len() > 3 {
                            // Wait for a later one first: the earlier ones may complete after it.
                            let (arg, c) = pending.pop_back().unwrap();
                            assert_eq!(wait(&q, &c).value, 2.0 * arg as f64);
                        }
                    }
                    for (arg, c) in pending {
                        assert_eq!(wait(&q, &c).value, 2.0 * arg as f64);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        q.close();
        let shutdown = q
            .try_push(&desc(PPTM_OP_SHUTDOWN, 0), true, "test")
            .unwrap();
        wait(&q, &shutdown);
        assert_eq!(dev.join().unwrap(), 12_001);
        assert!(q.oldest_pending().is_none());
    }

    #[test]
    fn full_queue_is_backpressure_not_loss() {
        let pause = Arc::new(AtomicBool::new(true));
        let q = Arc::new(Queue::new(HeapRings::new(4), 4));
        let dev = fake_device(q.clone(), pause.clone());
        let cells: Vec<_> = (0..4)
            .map(|i| q.try_push(&desc(100, i), false, "test").unwrap())
            .collect();
        assert_eq!(
            q.try_push(&desc(100, 99), false, "test").unwrap_err(),
            PushError::Full
        );
        pause.store(false, Ordering::Release);
        for (i, c) in cells.iter().enumerate() {
            assert_eq!(wait(&q, c).value, 2.0 * i as f64);
        }
        let c = q.try_push(&desc(100, 5), false, "test").unwrap();
        assert_eq!(wait(&q, &c).value, 10.0);
        let s = q
            .try_push(&desc(PPTM_OP_SHUTDOWN, 0), true, "test")
            .unwrap();
        wait(&q, &s);
        dev.join().unwrap();
    }

    /// The u64 word at byte `offset` of the ring memory, as the device sees it.
    fn word_at(q: &Queue, offset: usize) -> &AtomicU64 {
        assert_eq!(offset % 8, 0);
        assert!(
            offset + 8 <= bytes_for(q.slots),
            "offset {offset} is outside the rings"
        );
        // SAFETY: inside the ring memory (checked above), 8-byte aligned, accessed atomically.
        unsafe { &*q.memory.base().add(offset).cast::<AtomicU64>() }
    }

    #[test]
    fn the_rings_and_control_words_sit_where_abi_h_puts_them() {
        use crate::gpu::abi::pptm_sq_slot;
        use std::mem::{offset_of, size_of};
        for slots in [1u32, 4, 64, 1024] {
            assert_eq!(cq_offset(slots), slots as usize * size_of::<pptm_sq_slot>());
            assert_eq!(
                control_offset(slots),
                cq_offset(slots) + slots as usize * size_of::<pptm_cq_entry>()
            );
            assert_eq!(
                bytes_for(slots),
                control_offset(slots) + size_of::<pptm_host_control>()
            );
        }
        let q = Queue::new(HeapRings::new(8), 8);
        assert_eq!((q.slots(), q.log2()), (8, 3));
        let ctl = control_offset(8);
        let started = word_at(&q, ctl + offset_of!(pptm_host_control, started));
        let cancel = word_at(&q, ctl + offset_of!(pptm_host_control, cancel));
        let heartbeat = word_at(&q, ctl + offset_of!(pptm_host_control, heartbeat));
        let abort = word_at(&q, ctl + offset_of!(pptm_host_control, abort));
        // The device sets `started` and `heartbeat`; the host reads them from those words.
        assert!(!q.started());
        started.store(1, Ordering::Release);
        assert!(q.started());
        heartbeat.store(0xdead_beef_1234, Ordering::Release);
        assert_eq!(q.heartbeat(), 0xdead_beef_1234);
        // The host writes `cancel` and `abort`, each its own word and nothing else.
        assert_eq!(cancel.load(Ordering::Acquire), 0);
        q.cancel_start();
        assert_eq!(cancel.load(Ordering::Acquire), 1);
        assert_eq!(abort.load(Ordering::Acquire), 0);
        q.request_abort();
        assert_eq!(abort.load(Ordering::Acquire), 1);
        assert_eq!(heartbeat.load(Ordering::Acquire), 0xdead_beef_1234);
        assert_eq!(started.load(Ordering::Acquire), 1);
    }

    #[test]
    fn a_completion_delivers_its_status_value_device_time_and_paths() {
        let q = Queue::new(HeapRings::new(4), 4);
        for seq in 0..9u64 {
            let c = q.try_push(&desc(100, seq), false, "test").unwrap();
            assert_eq!(c.seq, seq);
            assert_eq!(q.submitted(), seq + 1);
            // Nothing written yet: no completion.
            assert!(!q.poll(&c));
            let slot = (seq % 4) as usize;
            let tag = u64::from(sq_tag(seq, q.log2()));
            let value = -1.5 * seq as f64;
            let bits = value.to_bits();
            let words = [
                7 + seq,
                100,
                bits & 0xffff_ffff,
                bits >> 32,
                1000 + seq,
                seq % 16,
            ];
            let e = q.cq_words(slot);
            // Every word but the last: still not complete (a torn entry is never read).
            for (w, v) in e.iter().zip(&words).take(5) {
                w.store(v << 32 | tag, Ordering::Release);
            }
            assert!(
                !q.poll(&c),
                "item {seq}: read before its last word was written"
            );
            e[5].store(words[5] << 32 | tag, Ordering::Release);
            assert!(q.poll(&c));
            let got = c.result().unwrap().clone().unwrap();
            assert_eq!(got.status, 7 + seq as u32);
            assert_eq!(got.value, value);
            assert_eq!(got.device_ns, Some(1000 + seq));
            assert_eq!(got.paths, Some(ProductPaths::from_bits((seq % 16) as u32)));
        }
    }

    #[test]
    fn the_oldest_pending_item_is_the_one_the_device_runs() {
        let pause = Arc::new(AtomicBool::new(true));
        let q = Arc::new(Queue::new(HeapRings::new(4), 4));
        let dev = fake_device(q.clone(), pause.clone());
        assert_eq!(q.oldest_pending(), None);
        let labels = ["first", "second", "third"];
        let cells: Vec<_> = labels
            .iter()
            .enumerate()
            .map(|(i, l)| q.try_push(&desc(100, i as u64), false, l).unwrap())
            .collect();
        assert_eq!(q.oldest_pending(), Some((0, "first")));
        assert!(!q.is_closed());
        pause.store(false, Ordering::Release);
        for c in &cells {
            wait(&q, c);
        }
        assert_eq!(q.oldest_pending(), None);
        // Completed items are not failed again; pending ones are, and counted.
        pause.store(true, Ordering::Release);
        let late = q.try_push(&desc(100, 9), false, "late").unwrap();
        assert_eq!(q.oldest_pending(), Some((3, "late")));
        q.close();
        assert!(q.is_closed());
        let stopped = Failure::Stopped("test".into());
        assert_eq!(q.fail_pending(stopped.clone()), 1);
        assert_eq!(late.result(), Some(&Err(stopped)));
        for (i, c) in cells.iter().enumerate() {
            assert_eq!(c.result().unwrap().as_ref().unwrap().value, 2.0 * i as f64);
        }
        pause.store(false, Ordering::Release);
        let s = q
            .try_push(&desc(PPTM_OP_SHUTDOWN, 0), true, "test")
            .unwrap();
        wait(&q, &s);
        dev.join().unwrap();
    }

    #[test]
    fn a_full_queue_names_the_item_whose_slot_the_next_push_needs() {
        let pause = Arc::new(AtomicBool::new(true));
        let q = Arc::new(Queue::new(HeapRings::new(4), 4));
        let dev = fake_device(q.clone(), pause.clone());
        assert!(
            q.blocking_item().is_none(),
            "an empty queue has no item in the way"
        );
        let first: Vec<_> = (0..3)
            .map(|i| q.try_push(&desc(100, i), false, "test").unwrap())
            .collect();
        // Slot 3 is still free: nothing blocks the fourth push.
        assert!(q.blocking_item().is_none());
        let fourth = q.try_push(&desc(100, 3), false, "test").unwrap();
        // Full: the fifth item needs item 0's slot, then the sixth item 1's, and so on.
        assert_eq!(q.blocking_item().unwrap().seq, 0);
        assert_eq!(
            q.try_push(&desc(100, 4), false, "test").unwrap_err(),
            PushError::Full
        );
        pause.store(false, Ordering::Release);
        wait(&q, &first[0]);
        let fifth = q.try_push(&desc(100, 4), false, "test").unwrap();
        assert_eq!(fifth.seq, 4);
        assert_eq!(q.blocking_item().unwrap().seq, 1);
        for c in first.iter().chain([&fourth, &fifth]) {
            assert_eq!(wait(&q, c).value, 2.0 * c.seq as f64);
        }
        let s = q
            .try_push(&desc(PPTM_OP_SHUTDOWN, 0), true, "test")
            .unwrap();
        wait(&q, &s);
        dev.join().unwrap();
    }

    /// Ring memory that counts the calls asking it never to be freed.
    struct CountingRings(Box<HeapRings>, Arc<AtomicU64>);

    impl RingMemory for CountingRings {
        fn base(&self) -> *mut u8 {
            self.0.base()
        }
        fn leak(&self) {
            self.1.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn leaking_the_queue_leaks_its_ring_memory() {
        let leaks = Arc::new(AtomicU64::new(0));
        let q = Queue::new(Box::new(CountingRings(HeapRings::new(4), leaks.clone())), 4);
        assert_eq!(leaks.load(Ordering::Relaxed), 0);
        q.leak_memory();
        assert_eq!(leaks.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn failing_pending_items_resolves_them_with_the_reason() {
        let pause = Arc::new(AtomicBool::new(true));
        let q = Arc::new(Queue::new(HeapRings::new(4), 4));
        let _dev = fake_device(q.clone(), pause);
        let a = q.try_push(&desc(100, 1), false, "test").unwrap();
        let b = q.try_push(&desc(100, 2), false, "test").unwrap();
        q.close();
        assert_eq!(q.fail_pending(Failure::ShutDown), 2);
        assert_eq!(a.result(), Some(&Err(Failure::ShutDown)));
        assert_eq!(b.result(), Some(&Err(Failure::ShutDown)));
        assert_eq!(q.fail_pending(Failure::ShutDown), 0, "each item fails once");
    }
}
