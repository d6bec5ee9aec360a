//! Stress: 8 threads share one runtime, each keeping up to 32 tickets in flight, submitting a mix
//! of KlComplexity, AccuracyPipeline and BeliefUpdateStep (a vector output) on inputs of several
//! sizes, and checking every result against its f64 reference. Counts what resolved per thread:
//! nothing lost, nothing resolved twice (on the persistent manifold every ticket has its own
//! sequence number), nothing wrong.
//!
//! Items: 8 × 125 000 on the persistent GPU variant (`gpu::`), 8 × 2 000 on the CPU backend and
//! the launched variants. `PPTM_STRESS_ITEMS` sets the count per thread on every backend.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::{REL_TOL, kl_reference, positive, rel_err, sprinkle_zeros};
use pptm::chains::{AccuracyPipeline, BeliefUpdateStep, KlComplexity};
use pptm::{BackendKind, Buffer, Error, Runtime, Ticket, Variant};
use rand::Rng;

const THREADS: usize = 8;
/// Tickets in flight per thread: two halves, one submitted while the other resolves.
const HALF: usize = 16;
/// Longer than any item should take; a ticket still pending then counts as lost.
const TICKET_TIMEOUT: Duration = Duration::from_secs(60);

fn items_per_thread(rt: &Runtime) -> usize {
    let default = if rt.backend() == BackendKind::Gpu && rt.config().variant == Variant::Fused {
        125_000
    } else {
        2_000
    };
    common::count_from_env("PPTM_STRESS_ITEMS", default)
}

fn signed(n: usize) -> Vec<f32> {
    let mut rng = common::rng();
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// KlComplexity inputs and their f64 result.
struct Kl {
    q: Buffer<f32>,
    p: Buffer<f32>,
    want: f64,
}

/// AccuracyPipeline inputs and their f64 result.
struct Accuracy {
    obs: Buffer<f32>,
    pred: Buffer<f32>,
    prec: Buffer<f32>,
    want: f64,
}

/// BeliefUpdateStep inputs (m×n Jacobian) and, per output, the f64 gradient `g` and the sum of
/// its terms' magnitudes, from which the output for any `lr` is `mu + lr g` (judged relative to
/// `|mu| + |lr| Σ|t|`).
struct Belief {
    obs: Buffer<f32>,
    pred: Buffer<f32>,
    prec: Buffer<f32>,
    jac: Buffer<f32>,
    mu: Buffer<f32>,
    n: usize,
    mu_host: Vec<f64>,
    grad: Vec<f64>,
    grad_abs: Vec<f64>,
}

struct Inputs {
    kl: Vec<Kl>,
    accuracy: Vec<Accuracy>,
    belief: Vec<Belief>,
}

fn inputs(rt: &Runtime) -> Inputs {
    let up = |v: &[f32]| rt.upload(v).unwrap();
    // From one element to several blocks' worth on the GPU (a map block takes 8192 elements;
    // a transposed GEMV block 8 columns below 4096).
    let sizes = [1usize, 333, 4096, 20_001];
    let kl = sizes
        .iter()
        .map(|&n| {
            let (mut q, p) = (positive(n), positive(n));
            sprinkle_zeros(&mut q, 50);
            Kl {
                want: kl_reference(&q, &p),
                q: up(&q),
                p: up(&p),
            }
        })
        .collect();
    let accuracy = sizes
        .iter()
        .map(|&n| {
            let (obs, pred, prec) = (signed(n), signed(n), positive(n));
            let want = obs
                .iter()
                .zip(&pred)
                .zip(&prec)
                .map(|((&o, &p), &w)| {
                    let e = f64::from(o) - f64::from(p);
                    -0.5 * f64::from(w) * e * e
                })
                .sum();
            Accuracy {
                obs: up(&obs),
                pred: up(&pred),
                prec: up(&prec),
                want,
            }
        })
        .collect();
    let belief = [(1usize, 1usize), (7, 5), (64, 33), (160, 130)]
        .iter()
        .map(|&(m, n)| {
            let (obs, pred) = (signed(m), signed(m));
            let prec: Vec<f32> = positive(m).iter().map(|w| 0.1 + 1.9 * w).collect();
            let (jac, mu) = (signed(m * n), signed(n));
            let e: Vec<f64> = (0..m)
                .map(|i| f64::from(prec[i]) * (f64::from(obs[i]) - f64::from(pred[i])))
                .collect();
            let (grad, grad_abs) = (0..n)
                .map(|c| {
                    (0..m)
                        .map(|i| f64::from(jac[i * n + c]) * e[i])
                        .fold((0.0, 0.0), |(g, a), t| (g + t, a + t.abs()))
                })
                .unzip();
            Belief {
                obs: up(&obs),
                pred: up(&pred),
                prec: up(&prec),
                jac: up(&jac),
                mu: up(&mu),
                n,
                mu_host: mu.iter().map(|&x| f64::from(x)).collect(),
                grad,
                grad_abs,
            }
        })
        .collect();
    Inputs {
        kl,
        accuracy,
        belief,
    }
}

/// A submitted item and what its result must be.
enum Pending<'a> {
    Scalar {
        item: usize,
        chain: &'static str,
        ticket: Ticket<'a, f32>,
        want: f64,
    },
    /// Writes output buffer `slot` of its half (the one for shape `shape`).
    Vector {
        item: usize,
        ticket: Ticket<'a, ()>,
        slot: usize,
        shape: usize,
        lr: f32,
    },
}

/// A resolved item, its tickets gone so that the output buffers can be read.
enum Resolved {
    Scalar {
        item: usize,
        chain: &'static str,
        got: pptm::Result<f32>,
        want: f64,
    },
    Vector {
        item: usize,
        got: pptm::Result<()>,
        slot: usize,
        shape: usize,
        lr: f32,
    },
}

/// What one thread saw.
#[derive(Default)]
struct Tally {
    submitted: usize,
    completed: usize,
    wrong: usize,
    lost: usize,
    failed: usize,
    /// Queue sequence numbers of the tickets (persistent manifold only).
    seqs: Vec<u64>,
    /// The first few problems, for the failure message.
    problems: Vec<String>,
}

impl Tally {
    fn problem(&mut self, what: String) {
        if self.problems.len() < 5 {
            self.problems.push(what);
        }
    }
}

/// One output buffer per belief shape, for each of a half's slots.
type Outputs = Vec<Vec<Buffer<f32>>>;

struct Worker<'r> {
    rt: &'r Runtime,
    inputs: &'r Inputs,
    thread: usize,
    items: usize,
    next: usize,
    tally: Tally,
    host: Vec<f32>,
}

impl<'r> Worker<'r> {
    /// Submits up to HALF items, the vector ones into `outs`; none once all items are submitted.
    fn submit_half<'a>(&mut self, outs: &'a mut Outputs) -> Vec<Pending<'a>>
    where
        'r: 'a,
    {
        let (rt, inputs, t) = (self.rt, self.inputs, self.thread);
        let mut pending = Vec::with_capacity(HALF);
        for (slot, out) in outs.iter_mut().enumerate() {
            if self.next == self.items {
                break;
            }
            let i = self.next;
            self.next += 1;
            let which = i / 3 + t;
            let p = match (i + t) % 3 {
                0 => {
                    let x = &inputs.kl[which % inputs.kl.len()];
                    Pending::Scalar {
                        item: i,
                        chain: "KlComplexity",
                        ticket: KlComplexity::submit(rt, &x.q, &x.p).unwrap(),
                        want: x.want,
                    }
                }
                1 => {
                    let x = &inputs.accuracy[which % inputs.accuracy.len()];
                    Pending::Scalar {
                        item: i,
                        chain: "AccuracyPipeline",
                        ticket: AccuracyPipeline::submit(rt, &x.obs, &x.pred, &x.prec).unwrap(),
                        want: x.want,
                    }
                }
                _ => {
                    let shape = which % inputs.belief.len();
                    let x = &inputs.belief[shape];
                    // A learning rate of its own per item, so that an output left over from an
                    // earlier item in the same buffer does not pass.
                    let lr = 0.01 + 0.001 * ((i / 3) % 97) as f32;
                    let out = &mut out[shape];
                    let ticket = BeliefUpdateStep::submit(
                        rt, &x.obs, &x.pred, &x.prec, &x.jac, &x.mu, lr, out,
                    )
                    .unwrap();
                    Pending::Vector {
                        item: i,
                        ticket,
                        slot,
                        shape,
                        lr,
                    }
                }
            };
            self.tally.submitted += 1;
            let seq = match &p {
                Pending::Scalar { ticket, .. } => ticket.seq(),
                Pending::Vector { ticket, .. } => ticket.seq(),
            };
            self.tally.seqs.extend(seq);
            pending.push(p);
        }
        pending
    }

    /// Waits for every ticket, in submission order.
    fn resolve(&mut self, pending: Vec<Pending<'_>>) -> Vec<Resolved> {
        pending
            .into_iter()
            .map(|p| match p {
                Pending::Scalar {
                    item,
                    chain,
                    mut ticket,
                    want,
                } => Resolved::Scalar {
                    item,
                    chain,
                    got: ticket.wait_timeout(TICKET_TIMEOUT),
                    want,
                },
                Pending::Vector {
                    item,
                    mut ticket,
                    slot,
                    shape,
                    lr,
                } => Resolved::Vector {
                    item,
                    got: ticket.wait_timeout(TICKET_TIMEOUT),
                    slot,
                    shape,
                    lr,
                },
            })
            .collect()
    }

    /// Counts each resolved item and checks it (vector outputs read from `outs`).
    fn check(&mut self, resolved: Vec<Resolved>, outs: &Outputs) {
        let t = self.thread;
        for r in resolved {
            let (item, got) = match &r {
                Resolved::Scalar { item, got, .. } => (*item, got.as_ref().map(|_| ())),
                Resolved::Vector { item, got, .. } => (*item, got.as_ref().map(|_| ())),
            };
            match got {
                Ok(()) => self.tally.completed += 1,
                Err(Error::Timeout { .. }) => {
                    self.tally.lost += 1;
                    self.tally
                        .problem(format!("thread {t} item {item}: not resolved in time"));
                    continue;
                }
                Err(e) => {
                    self.tally.failed += 1;
                    self.tally.problem(format!("thread {t} item {item}: {e}"));
                    continue;
                }
            }
            match r {
                Resolved::Scalar {
                    chain, got, want, ..
                } => {
                    let got = got.unwrap();
                    let err = rel_err(f64::from(got), want);
                    if err.is_nan() || err >= REL_TOL {
                        self.tally.wrong += 1;
                        self.tally.problem(format!(
                            "thread {t} item {item} ({chain}): got {got}, f64 reference {want}, \
                             relative error {err:e}"
                        ));
                    }
                }
                Resolved::Vector {
                    slot, shape, lr, ..
                } => {
                    let x = &self.inputs.belief[shape];
                    self.host.resize(x.n, 0.0);
                    outs[slot][shape].read_into(&mut self.host).unwrap();
                    let lr64 = f64::from(lr);
                    let bad = (0..x.n).find_map(|c| {
                        let want = x.mu_host[c] + lr64 * x.grad[c];
                        let scale = x.mu_host[c].abs() + lr64.abs() * x.grad_abs[c];
                        let err = (f64::from(self.host[c]) - want).abs() / scale;
                        (err.is_nan() || err >= 1e-4).then(|| (c, self.host[c], want, err))
                    });
                    if let Some((c, got, want, err)) = bad {
                        self.tally.wrong += 1;
                        self.tally.problem(format!(
                            "thread {t} item {item} (BeliefUpdateStep, n = {}, lr = {lr}): \
                             output {c} is {got}, f64 reference {want}, error {err:e} of scale",
                            x.n
                        ));
                    }
                }
            }
        }
    }
}

fn thread_body(rt: &Runtime, inputs: &Inputs, thread: usize, items: usize) -> Tally {
    let alloc_half = || -> Outputs {
        (0..HALF)
            .map(|_| {
                inputs
                    .belief
                    .iter()
                    .map(|b| rt.alloc::<f32>(b.n).unwrap())
                    .collect()
            })
            .collect()
    };
    let (mut outs_a, mut outs_b) = (alloc_half(), alloc_half());
    let mut w = Worker {
        rt,
        inputs,
        thread,
        items,
        next: 0,
        tally: Tally::default(),
        host: Vec::new(),
    };
    // Half A is in flight while half B is submitted, then A resolves and is submitted again while
    // B is in flight: up to 2 × HALF tickets outstanding.
    let mut pending_a = w.submit_half(&mut outs_a);
    while !pending_a.is_empty() {
        let pending_b = w.submit_half(&mut outs_b);
        let resolved = w.resolve(pending_a);
        w.check(resolved, &outs_a);
        pending_a = w.submit_half(&mut outs_a);
        let resolved = w.resolve(pending_b);
        w.check(resolved, &outs_b);
    }
    w.tally
}

fn many_threads_mixed_chains_every_result_checked(rt: &Runtime) {
    // The bodies of every backend and variant run at once (the test harness's threads), so the
    // launched and graph variants also run beside a resident manifold.
    let per_thread = items_per_thread(rt);
    let inputs = inputs(rt);
    let start = Instant::now();
    let tallies: Vec<Tally> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let inputs = &inputs;
                s.spawn(move || thread_body(rt, inputs, t, per_thread))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let secs = start.elapsed().as_secs_f64();

    let total = THREADS * per_thread;
    let sum = |f: fn(&Tally) -> usize| tallies.iter().map(f).sum::<usize>();
    let (completed, wrong, lost, failed) = (
        sum(|t| t.completed),
        sum(|t| t.wrong),
        sum(|t| t.lost),
        sum(|t| t.failed),
    );
    // Every ticket of the persistent manifold has a queue sequence number; none may repeat.
    let mut seqs: Vec<u64> = tallies
        .iter()
        .flat_map(|t| t.seqs.iter().copied())
        .collect();
    let with_seq = seqs.len();
    seqs.sort_unstable();
    seqs.dedup();
    let duplicated = with_seq - seqs.len();
    eprintln!(
        "stress ({:?}, {:?}): {total} items ({THREADS} threads x {per_thread}) in {secs:.2} s, \
         {:.0} items/s; lost {lost}, duplicated {duplicated}, wrong {wrong}, failed {failed}",
        rt.backend(),
        rt.config().variant,
        total as f64 / secs,
    );
    let problems: Vec<&String> = tallies.iter().flat_map(|t| &t.problems).collect();
    assert!(
        lost == 0 && duplicated == 0 && wrong == 0 && failed == 0,
        "lost {lost}, duplicated {duplicated}, wrong {wrong}, failed {failed}; first problems: \
         {problems:#?}"
    );
    for (t, tally) in tallies.iter().enumerate() {
        assert_eq!(tally.submitted, per_thread, "thread {t} submitted");
        assert_eq!(tally.completed, per_thread, "thread {t} completed");
    }
    assert_eq!(completed, total);
    if rt.backend() == BackendKind::Gpu && rt.config().variant == Variant::Fused {
        assert_eq!(
            with_seq, total,
            "every persistent ticket has a sequence number"
        );
    }
}

on_every_backend!(many_threads_mixed_chains_every_result_checked);
