//! Loom models of the host half of the ring protocol (`queue.rs`), against a device emulated by a
//! loom thread that does what `queue::tests::fake_device` does: it waits for slot `seq` to hold
//! a descriptor tagged for `seq`, then writes the completion entry as tagged words,
//! one relaxed store each, in an order that changes from item to item. Host threads use only the
//! queue's own API (`try_push`, `poll`, `blocking_item`, `fail_pending`, `close`).
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p pptm-runtime --release --lib queue_loom -- --nocapture
//! ```
//!
//! Each model sets its own preemption bound; `LOOM_MAX_PREEMPTIONS` overrides them all (a larger
//! bound explores more and takes much longer). Each test prints how many executions it explored
//! and how long that took.
//!
//! Waiting without spinning: a poll that finds nothing has no effect (a `poll` that returns
//! false, a `try_push` that returns `Full`, a device that sees an untagged word change nothing),
//! so a spin loop adds no behaviour beyond its first attempt, made at any point loom chooses, and
//! its last, made once the awaited write is done. The models make exactly those two attempts,
//! blocking in between on a condition variable raised by the thread that does the write (the
//! pusher after `try_push`, the device after the last word of a completion), and the second
//! attempt must succeed. Spinning with `yield_now` instead multiplies the schedules loom explores
//! with every turn of every loop, beyond a few minutes for even two items.

use std::sync::Arc as StdArc;
use std::sync::atomic::AtomicUsize as StdAtomicUsize;
use std::time::Instant;

use loom::sync::Condvar;
use loom::thread;

use super::abi::{
    PPTM_CQ_WORDS, PPTM_OP_SHUTDOWN, PPTM_PATH_MMA_SYNC, PPTM_SQ_SLOT_WORDS, PPTM_STATUS_OK,
    from_payload, pptm_cq_entry, pptm_desc, sq_tag,
};
use super::queue::{Cell, Failure, PushError, Queue, RingMemory, bytes_for, cq_offset};
use crate::chain::Completion;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Mutex};
use crate::ticket::ProductPaths;

/// Ring memory made of loom atomics (8 bytes each, like the u64 words the queue casts it to),
/// shared by the queue and the emulated device.
struct Rings {
    words: Vec<AtomicU64>,
    /// Index of the first word on a 64-byte boundary: the queue's base.
    first: usize,
}

impl Rings {
    fn new(slots: u32) -> Arc<Self> {
        const _: () = assert!(std::mem::size_of::<AtomicU64>() == 8);
        let words: Vec<AtomicU64> = (0..bytes_for(slots) / 8 + 8)
            .map(|_| AtomicU64::new(0))
            .collect();
        let p = words.as_ptr() as usize;
        let first = (p.div_ceil(64) * 64 - p) / 8;
        Arc::new(Rings { words, first })
    }

    fn sq(&self, slot: usize) -> &[AtomicU64] {
        let n = PPTM_SQ_SLOT_WORDS as usize;
        &self.words[self.first + slot * n..][..n]
    }

    fn cq(&self, slots: u32, slot: usize) -> &[AtomicU64] {
        let at = (cq_offset(slots) + slot * std::mem::size_of::<pptm_cq_entry>()) / 8;
        &self.words[self.first + at..][..8]
    }
}

/// What the queue owns: the same words as the device's `Arc<Rings>`.
struct SharedRings(Arc<Rings>);

impl RingMemory for SharedRings {
    fn base(&self) -> *mut u8 {
        self.0.words[self.0.first..].as_ptr() as *mut u8
    }
}

/// Items (by sequence number, below 64) that reached a point: pushed, or completed by the device.
struct Flags {
    set: Mutex<u64>,
    raised: Condvar,
}

impl Flags {
    fn new() -> Self {
        Flags {
            set: Mutex::new(0),
            raised: Condvar::new(),
        }
    }

    fn raise(&self, seq: u64) {
        *self.set.lock().unwrap() |= 1 << seq;
        self.raised.notify_all();
    }

    fn wait(&self, seq: u64) {
        let mut set = self.set.lock().unwrap();
        while *set & (1 << seq) == 0 {
            set = self.raised.wait(set).unwrap();
        }
    }
}

/// The queue of a model, and what its threads block on instead of spinning.
#[derive(Clone)]
struct Harness {
    q: Arc<Queue>,
    rings: Arc<Rings>,
    slots: u32,
    /// Raised by a host thread once `try_push` returned the item.
    pushed: Arc<Flags>,
    /// Raised by the device once it wrote the item's whole completion entry.
    completed: Arc<Flags>,
}

impl Harness {
    fn new(slots: u32) -> Self {
        let rings = Rings::new(slots);
        let q = Queue::new(Box::new(SharedRings(rings.clone())), slots);
        Harness {
            q: Arc::new(q),
            rings,
            slots,
            pushed: Arc::new(Flags::new()),
            completed: Arc::new(Flags::new()),
        }
    }

    fn try_push(&self, d: &pptm_desc, allow_closed: bool) -> Result<StdArc<Cell>, PushError> {
        let r = self.q.try_push(d, allow_closed, "model");
        if let Ok(c) = &r {
            self.pushed.raise(c.seq);
        }
        r
    }

    /// Pushes, waiting for the blocking item when the queue is full.
    fn push(&self, d: &pptm_desc) -> StdArc<Cell> {
        match self.try_push(d, false) {
            Ok(c) => c,
            Err(PushError::Full) => {
                let b = self
                    .q
                    .blocking_item()
                    .expect("a full queue has an item to wait on");
                let _ = self.wait(&b);
                // One producer may take the freed slot before another: try again.
                self.push(d)
            }
            Err(PushError::Closed) => panic!("closed"),
        }
    }

    /// Polls once; if that finds nothing, polls again once the device has written the item's
    /// completion. That finds it unless a later item's completion has already replaced it: then
    /// the producer that reused the slot put it in the cell first, but nothing orders that write
    /// before this poll (the device's completion stores are relaxed, as on the GPU), so polls go
    /// on until they see it, as a waiting ticket's do. That write was made before the entry was
    /// replaced, and after a yield loom shows a thread only values it has not seen, so a few polls
    /// suffice; more mean the completion is lost. Returns what the cell holds.
    fn wait(&self, c: &Cell) -> Result<Completion, Failure> {
        if !self.q.poll(c) {
            self.completed.wait(c.seq);
            let mut polls = 0;
            while !self.q.poll(c) {
                polls += 1;
                assert!(
                    polls < 16,
                    "item {}: lost (its completion entry was replaced and its cell is empty)",
                    c.seq
                );
                thread::yield_now();
            }
        }
        c.result().expect("poll said resolved").clone()
    }

    /// The emulated device: runs items in order from item 0, as the manifold does, and returns
    /// the descriptors it ran. It stops after `items` items, or after a shutdown item. An item's
    /// result is 2 × args[0]; its device time is its sequence number.
    fn device(&self, items: u64) -> thread::JoinHandle<Vec<pptm_desc>> {
        let h = self.clone();
        thread::spawn(move || {
            let slots = h.slots;
            let log2 = slots.trailing_zeros();
            let mut ran = Vec::new();
            for seq in 0..items {
                let slot = (seq & u64::from(slots - 1)) as usize;
                let tag = sq_tag(seq, log2);
                let sq = h.rings.sq(slot);
                let payload = match read_slot(sq, seq, tag) {
                    Some(p) => p,
                    None => {
                        h.pushed.wait(seq);
                        read_slot(sq, seq, tag)
                            .unwrap_or_else(|| panic!("item {seq}: pushed but not visible"))
                    }
                };
                let d = from_payload(&payload);
                let bits = (d.args[0] as f64 * 2.0).to_bits();
                let entry = [
                    PPTM_STATUS_OK,
                    d.opcode,
                    bits as u32,
                    (bits >> 32) as u32,
                    seq as u32,
                    PPTM_PATH_MMA_SYNC,
                ];
                let e = h.rings.cq(slots, slot);
                for i in CQ_ORDERS[seq as usize % CQ_ORDERS.len()] {
                    e[i].store(
                        (u64::from(entry[i]) << 32) | u64::from(tag),
                        Ordering::Relaxed,
                    );
                }
                h.completed.raise(seq);
                ran.push(d);
                if d.opcode == PPTM_OP_SHUTDOWN {
                    break;
                }
            }
            ran
        })
    }
}

/// The orders in which the device writes the words of successive completion entries.
const CQ_ORDERS: [[usize; 6]; 3] = [[3, 1, 5, 4, 0, 2], [5, 4, 3, 2, 1, 0], [0, 1, 2, 3, 4, 5]];
const _: () = assert!(PPTM_CQ_WORDS == 6, "the emulated device writes every word");

/// The descriptor words the emulated device decodes (opcode and args[0]), if its slot holds item
/// `seq`. The host stores a slot's words in order (release), so the last is read first: once it
/// holds the item's tag, every earlier word must too, and the decoded words are checked for it (an
/// untagged one would be a torn descriptor). Reading the other words as well would change no
/// outcome (their values are then fixed) and only add schedules. A later lap's tag means the host
/// reused the slot before the device read the item.
fn read_slot(sq: &[AtomicU64], seq: u64, tag: u32) -> Option<[u32; PPTM_SQ_SLOT_WORDS as usize]> {
    let last = sq.len() - 1;
    let mut payload = [0u32; PPTM_SQ_SLOT_WORDS as usize];
    for i in [last, 0, 2, 3] {
        let v = sq[i].load(Ordering::Acquire);
        let t = v as u32;
        assert!(
            t <= tag,
            "item {seq}: its slot holds a later item (tag {t} > {tag})"
        );
        if t != tag {
            assert!(i == last, "item {seq}: word {i} is torn");
            return None;
        }
        payload[i] = (v >> 32) as u32;
    }
    Some(payload)
}

const OP: u32 = 100;

fn desc(opcode: u32, arg: u64) -> pptm_desc {
    let mut d = pptm_desc {
        opcode,
        ..Default::default()
    };
    d.args[0] = arg;
    d
}

/// The completion the emulated device writes for item `seq` submitted with `arg`.
fn expected(seq: u64, arg: u64) -> Completion {
    Completion {
        status: PPTM_STATUS_OK,
        value: 2.0 * arg as f64,
        device_ns: Some(seq),
        paths: Some(ProductPaths::from_bits(PPTM_PATH_MMA_SYNC)),
    }
}

/// Explores `model` with a preemption bound of `bound` (unless LOOM_MAX_PREEMPTIONS is set) and
/// reports the executions explored and the time taken.
fn check(name: &str, bound: usize, model: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(bound);
    }
    if std::env::var_os("LOOM_MAX_BRANCHES").is_none() {
        // 32-word descriptors make long executions.
        b.max_branches = 100_000;
    }
    let executions = StdArc::new(StdAtomicUsize::new(0));
    let count = executions.clone();
    let t = Instant::now();
    b.check(move || {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        model();
    });
    eprintln!(
        "loom model {name}: {} executions in {:.1?} (preemption bound {})",
        executions.load(std::sync::atomic::Ordering::Relaxed),
        t.elapsed(),
        b.preemption_bound.unwrap()
    );
}

/// (a) Two slots, three items: item 2 reuses item 0's slot. Item 0's completion is read by a
/// second thread (W) while the producer (P) polls it to reuse the slot; then W reads item 1's
/// and P item 2's. Every item resolves once, with its own completion, and readers agree.
#[test]
fn completions_delivered_once_across_slot_reuse() {
    check("completions_delivered_once_across_slot_reuse", 1, || {
        let h = Harness::new(2);
        let c0 = h.try_push(&desc(OP, 10), false).unwrap();
        let c1 = h.try_push(&desc(OP, 11), false).unwrap();
        let dev = h.device(3);
        let w = {
            let (h, c0, c1) = (h.clone(), c0.clone(), c1.clone());
            thread::spawn(move || (h.wait(&c0), h.wait(&c1)))
        };
        let p = {
            let h = h.clone();
            thread::spawn(move || {
                let c2 = h.push(&desc(OP, 12));
                (h.wait(&c2), c2)
            })
        };
        let (w0, w1) = w.join().unwrap();
        let (p2, c2) = p.join().unwrap();
        assert_eq!(dev.join().unwrap().len(), 3);
        for (seq, arg, c) in [(0, 10, &c0), (1, 11, &c1), (2, 12, &c2)] {
            assert_eq!(c.seq, seq);
            assert_eq!(c.result(), Some(&Ok(expected(seq, arg))), "item {seq}");
        }
        assert_eq!(w0, Ok(expected(0, 10)));
        assert_eq!(w1, Ok(expected(1, 11)));
        assert_eq!(p2, Ok(expected(2, 12)));
    });
}

/// (a) Two producers on two slots, three items: whichever pushes third reuses a slot that may
/// belong to the other producer's item, whose owner waits on it at the same time.
#[test]
fn two_producers_share_slots() {
    check("two_producers_share_slots", 2, || {
        let h = Harness::new(2);
        let dev = h.device(3);
        let a = {
            let h = h.clone();
            thread::spawn(move || {
                let mut out = Vec::new();
                for arg in [20, 21] {
                    let c = h.push(&desc(OP, arg));
                    out.push((arg, c.seq, h.wait(&c)));
                }
                out
            })
        };
        let b = {
            let h = h.clone();
            thread::spawn(move || {
                let c = h.push(&desc(OP, 30));
                vec![(30, c.seq, h.wait(&c))]
            })
        };
        let mut got = a.join().unwrap();
        got.extend(b.join().unwrap());
        let ran = dev.join().unwrap();
        let mut seqs: Vec<u64> = got.iter().map(|g| g.1).collect();
        seqs.sort_unstable();
        assert_eq!(seqs, [0, 1, 2], "each item has its own sequence number");
        for (arg, seq, r) in got {
            assert_eq!(r, Ok(expected(seq, arg)), "item {seq}");
            assert_eq!(ran[seq as usize].args[0], arg);
        }
    });
}

/// (b) A full queue is `Full`, and a slot is reused only after its item's completion is in the
/// item's cell. Two slots filled; then a producer pushes two more with `try_push` (on `Full`,
/// once more after the device completed the blocking item) while a waiter reads the first two
/// completions and the device writes them.
#[test]
fn full_queue_never_overwrites() {
    check("full_queue_never_overwrites", 1, || {
        let h = Harness::new(2);
        let c0 = h.try_push(&desc(OP, 40), false).unwrap();
        let c1 = h.try_push(&desc(OP, 41), false).unwrap();
        // Nothing has run: every slot is taken.
        assert_eq!(
            h.try_push(&desc(OP, 99), false).unwrap_err(),
            PushError::Full
        );
        assert_eq!(
            h.q.submitted(),
            2,
            "a refused push takes no sequence number"
        );
        let dev = h.device(4);
        let w = {
            let (h, c0, c1) = (h.clone(), c0.clone(), c1.clone());
            thread::spawn(move || (h.wait(&c0), h.wait(&c1)))
        };
        let p = {
            let (h, c0, c1) = (h.clone(), c0.clone(), c1.clone());
            thread::spawn(move || {
                let mut cells = Vec::new();
                for (arg, prev) in [(42, c0), (43, c1)] {
                    let c = match h.try_push(&desc(OP, arg), false) {
                        Ok(c) => c,
                        Err(PushError::Full) => {
                            let b = h.q.blocking_item().unwrap();
                            assert_eq!(b.seq, prev.seq, "the blocking item owns the next slot");
                            h.completed.wait(b.seq);
                            h.try_push(&desc(OP, arg), false)
                                .expect("the slot's item has completed")
                        }
                        Err(e) => panic!("{e:?}"),
                    };
                    // The slot's previous item was resolved before its slot was rewritten.
                    assert_eq!(
                        prev.result(),
                        Some(&Ok(expected(prev.seq, arg - 2))),
                        "item {} reused the slot of an unfinished item",
                        c.seq
                    );
                    cells.push(c);
                }
                cells
                    .into_iter()
                    .map(|c| (c.seq, h.wait(&c)))
                    .collect::<Vec<_>>()
            })
        };
        let (w0, w1) = w.join().unwrap();
        let later = p.join().unwrap();
        assert_eq!(dev.join().unwrap().len(), 4);
        assert_eq!(w0, Ok(expected(0, 40)));
        assert_eq!(w1, Ok(expected(1, 41)));
        assert_eq!(later, [(2, Ok(expected(2, 42))), (3, Ok(expected(3, 43)))]);
        assert_eq!(c0.result(), Some(&Ok(expected(0, 40))));
        assert_eq!(c1.result(), Some(&Ok(expected(1, 41))));
    });
}

/// (c) `fail_pending` from two threads racing with the device completing the two items and with a
/// waiter: each cell is resolved exactly once (its completion or a failure, never lost, never
/// changed after a reader saw it), and the failures the two calls count are the failed cells.
#[test]
fn fail_pending_races_completion() {
    check("fail_pending_races_completion", 2, || {
        let h = Harness::new(2);
        let c0 = h.try_push(&desc(OP, 50), false).unwrap();
        let c1 = h.try_push(&desc(OP, 51), false).unwrap();
        let dev = h.device(2);
        let f = {
            let h = h.clone();
            thread::spawn(move || h.q.fail_pending(Failure::Stopped("fault".into())))
        };
        let w = {
            let (h, c0, c1) = (h.clone(), c0.clone(), c1.clone());
            thread::spawn(move || {
                let r0 = h.wait(&c0);
                let failed = h.q.fail_pending(Failure::ShutDown);
                (r0, failed, h.wait(&c1))
            })
        };
        let failed_f = f.join().unwrap();
        let (r0, failed_w, r1) = w.join().unwrap();
        assert_eq!(dev.join().unwrap().len(), 2);
        let mut failed = 0;
        for (seq, arg, c, seen) in [(0, 50, &c0, r0), (1, 51, &c1, r1)] {
            let r = c.result().expect("never lost").clone();
            assert_eq!(r, seen, "item {seq} changed after it was read");
            match r {
                Ok(got) => assert_eq!(got, expected(seq, arg), "item {seq}"),
                Err(_) => failed += 1,
            }
        }
        assert_eq!(failed_f + failed_w, failed, "each failure counted once");
        assert_eq!(
            h.q.fail_pending(Failure::ShutDown),
            0,
            "each item fails once"
        );
    });
}

/// (d) `close` racing with `try_push`: a push that starts after `close` returned is `Closed`; the
/// shutdown item (`allow_closed`) goes through and is the last item the device runs, and every
/// item accepted before it completes.
#[test]
fn close_races_push() {
    check("close_races_push", 2, || {
        let h = Harness::new(4);
        let closed = Arc::new(AtomicBool::new(false));
        let dev = h.device(u64::MAX);
        let a = {
            let (h, closed) = (h.clone(), closed.clone());
            thread::spawn(move || {
                let mut accepted = Vec::new();
                for arg in [60, 61] {
                    let after_close = closed.load(Ordering::Acquire);
                    match h.try_push(&desc(OP, arg), false) {
                        Ok(c) => {
                            assert!(!after_close, "a push after close() returned succeeded");
                            accepted.push((arg, c));
                        }
                        Err(PushError::Closed) => assert!(h.q.is_closed()),
                        Err(PushError::Full) => panic!("four slots, three items at most"),
                    }
                }
                accepted
                    .into_iter()
                    .map(|(arg, c)| (arg, c.seq, h.wait(&c)))
                    .collect::<Vec<_>>()
            })
        };
        let c = {
            let (h, closed) = (h.clone(), closed.clone());
            thread::spawn(move || {
                h.q.close();
                closed.store(true, Ordering::Release);
                assert_eq!(
                    h.try_push(&desc(OP, 69), false).unwrap_err(),
                    PushError::Closed
                );
                let s = h.try_push(&desc(PPTM_OP_SHUTDOWN, 0), true).unwrap();
                (s.seq, h.wait(&s))
            })
        };
        let accepted = a.join().unwrap();
        let (shutdown_seq, shutdown) = c.join().unwrap();
        let ran = dev.join().unwrap();
        assert_eq!(
            shutdown_seq,
            accepted.len() as u64,
            "shutdown is the last item"
        );
        assert_eq!(shutdown, Ok(expected(shutdown_seq, 0)));
        assert_eq!(
            h.q.submitted(),
            shutdown_seq + 1,
            "nothing was pushed after shutdown"
        );
        assert_eq!(ran.len() as u64, shutdown_seq + 1);
        for (arg, seq, r) in accepted {
            assert_eq!(r, Ok(expected(seq, arg)), "item {seq}");
        }
    });
}
