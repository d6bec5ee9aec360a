//! Pipelines: items whose buffers flow from one to the next, submitted without waiting in between
//! and resolved together.
//!
//! A [`Ticket`] borrows its output buffer mutably until it resolves, so an item that reads what an
//! earlier one writes cannot be submitted before that ticket is waited on: every dependent step
//! would cost a host round trip. A pipeline takes the borrows once instead, for its whole life:
//! [`Pipeline::input`] and [`Pipeline::output`] turn buffers into handles that any number of items
//! name. Each chain's generated `push` submits one item at once and returns a [`PipeItem`];
//! [`Pipeline::wait`] resolves them all.
//!
//! Ordering, on every backend, is the order of the pushes:
//! * items of one domain run one after the other in their manifold (its queue is in order, and an
//!   item starts once the one before it has completed);
//! * an item that reads or writes a buffer an earlier item of another domain wrote or read (a
//!   read after write, write after read or write after write across domains) is preceded in its
//!   manifold by a wait, on the GPU, for that item's completion (the other manifold's domain line,
//!   gpu/signals.rs): the host does not wait;
//! * the CPU backend and the launched variants run each item inside its push.
//!
//! A pipeline that is dropped unwaited waits for its items first, as a ticket does, so the buffers
//! it borrows are never released while the device may still use them.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::buffer::Buffer;
use crate::chain::{Arg, Chain, ChainOutput, Completion, DomainCode, InputBuffer};
use crate::error::{Error, Result};
use crate::gpu::Manifold;
use crate::gpu::abi::{
    PPTM_DEP_IN_LOOP, PPTM_OP_PLAN, PPTM_OP_PLAN_LOOP, PPTM_OP_PLAN_WAIT, PPTM_OP_PLAN_WHEN,
    PPTM_PLAN_DEPS, PPTM_STATUS_OK, PPTM_STEP_CHECKS_FINITE, PPTM_STEP_DONE, PPTM_STEP_FINISHED,
    PPTM_STEP_LIGHT, PPTM_SYNC_BARRIER, PPTM_SYNC_DEPS, pptm_desc, pptm_plan_step,
};
use crate::gpu::plan::{self, Region};
use crate::guard::GuardNote;
use crate::runtime::{PlannedItem, Routed, Runtime, SubmitMode, Tile};
use crate::ticket::Ticket;

/// Tells pipelines apart, so a handle of one cannot be used in another.
static NEXT_PIPELINE: AtomicU64 = AtomicU64::new(1);

/// A buffer an item reads: a shared borrow ([`Pipeline::input`]) or a buffer the pipeline writes
/// ([`PipeOutput`], read by a later item).
#[derive(Debug, Clone, Copy)]
pub struct PipeInput<'p> {
    pipeline: u64,
    source: Source<'p>,
}

#[derive(Debug, Clone, Copy)]
enum Source<'p> {
    Shared(InputBuffer<'p>),
    Output(usize),
}

/// A buffer items of the pipeline write, and later items may read: [`Pipeline::output`].
#[derive(Debug, Clone, Copy)]
pub struct PipeOutput {
    pipeline: u64,
    index: usize,
}

impl From<PipeOutput> for PipeInput<'_> {
    fn from(o: PipeOutput) -> Self {
        PipeInput {
            pipeline: o.pipeline,
            source: Source::Output(o.index),
        }
    }
}

/// One of a pushed item's arguments, named as in the chain (the generated `push` builds these in
/// descriptor order, as `submit` builds [`Arg`]s).
#[derive(Debug, Clone, Copy)]
pub enum PipeArg<'p> {
    /// A buffer the item reads: one of [`Pipeline::input`], or a [`PipeOutput`] an earlier item
    /// writes.
    Input(&'static str, PipeInput<'p>),
    /// The buffer the item writes ([`Pipeline::output`]).
    Output(&'static str, PipeOutput),
    /// An f32 passed by value.
    F32(&'static str, f32),
    /// A u32 passed by value.
    U32(&'static str, u32),
    /// The size of a dimension no buffer's length gives (a matrix's column count).
    Dim(&'static str, usize),
}

/// An item pushed to a pipeline: its result, once the pipeline is waited, is
/// [`PipeResults::get`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipeItem<R> {
    pipeline: u64,
    index: usize,
    _output: PhantomData<fn() -> R>,
}

impl<R> PipeItem<R> {
    /// The item's position in its pipeline, from 0 (as errors name it).
    pub fn index(&self) -> usize {
        self.index
    }
}

/// What a pushed item resolves to, whatever its chain's output type.
enum Pending {
    Scalar(Ticket<'static, f32>),
    Vector(Ticket<'static, ()>),
}

impl Pending {
    fn wait(self) -> Result<f32> {
        match self {
            Pending::Scalar(t) => t.wait(),
            Pending::Vector(t) => t.wait().map(|()| 0.0),
        }
    }
}

/// Chain outputs a pipeline can hold: a scalar, or nothing (the output is in a buffer).
pub trait PipeOutputType: ChainOutput {
    #[doc(hidden)]
    fn erase(t: Ticket<'static, Self>) -> ErasedPending;
    #[doc(hidden)]
    fn from_value(v: f32) -> Self;
}

/// A pending item of either output type (what [`PipeOutputType::erase`] makes).
#[doc(hidden)]
pub struct ErasedPending(Pending);

impl PipeOutputType for f32 {
    fn erase(t: Ticket<'static, Self>) -> ErasedPending {
        ErasedPending(Pending::Scalar(t))
    }
    fn from_value(v: f32) -> Self {
        v
    }
}

impl PipeOutputType for () {
    fn erase(t: Ticket<'static, Self>) -> ErasedPending {
        ErasedPending(Pending::Vector(t))
    }
    fn from_value(_: f32) -> Self {}
}

/// A loop of a pipeline ([`Pipeline::repeat`], [`Pipeline::repeat_until`]): how many iterations
/// ran is [`PipeResults::iterations`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipeLoop {
    pipeline: u64,
    index: usize,
}

/// A conditional body of a pipeline ([`Pipeline::when`]): how many times it ran is
/// [`PipeResults::runs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipeWhen {
    pipeline: u64,
    index: usize,
}

/// Who last touched a buffer: the item that wrote it last, and the items that read it since.
#[derive(Default)]
struct Access {
    writer: Option<usize>,
    readers: Vec<usize>,
}

/// Where an item's result will come from.
enum State {
    /// Known: the item ran at its push (the CPU backend, the launched variants), or its plan
    /// completed.
    Done(Result<f32>),
    /// Step `step` of plan `plan`.
    Planned {
        plan: usize,
        step: usize,
        guard: Option<GuardNote>,
    },
    /// Never ran: inside a [`Pipeline::when`] whose condition was not met.
    Skipped,
}

struct Entry {
    chain: &'static str,
    state: State,
    /// A plan step's start and end (%globaltimer ns, the last loop iteration's).
    span: Option<(u64, u64)>,
}

/// What the pipeline knows of one step of a plan, beyond the step itself.
#[derive(Clone, Copy)]
struct StepMeta {
    tile: Option<Tile>,
    blocks: u32,
    /// Blocks the step's item asks for dispatched alone (a plan of one step).
    alone_blocks: u32,
    /// A map step with no reduction: light (`PPTM_STEP_LIGHT`) if nothing waits for it, with
    /// whether it checks its values are finite.
    light: Option<bool>,
    /// The loop step that closes the loop this step is in.
    loop_end: Option<usize>,
    /// A PLAN_WAIT step: the plan and step whose `done` word it waits for.
    wait_on: Option<(usize, usize)>,
}

/// What a wait step waits for: a step of a plan not yet dispatched (its `done` word), or the
/// completion of a plan in flight (its manifold's domain line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Wait {
    Step(usize),
    Completion(u64),
}

/// One domain's items of one dispatch: a plan (gpu/plan.rs).
struct Plan {
    code: &'static DomainCode,
    /// Its dispatch's id (NEXT_PLAN_ID), shared with the other plans of the dispatch.
    id: u64,
    steps: Vec<pptm_plan_step>,
    meta: Vec<StepMeta>,
    /// Partial slots its steps of several blocks need.
    partials: u32,
    /// Blocks it runs on: the most any step asks for (0: every block).
    blocks: u32,
    /// What of other plans it waits for already, and on how many blocks (`u32::MAX`: all).
    waits: HashMap<(usize, Wait), u32>,
    /// The first step of the loop being recorded into it.
    loop_first: Option<usize>,
    flight: Option<Flight>,
}

/// A dispatched plan.
struct Flight {
    manifold: Arc<Manifold>,
    region: Region,
    /// Until resolved.
    ticket: Option<Ticket<'static, ()>>,
    /// Whether its regions may be given back: it completed, or its manifold stopped.
    settled: bool,
    /// Whether it ran to its end: its device region holds its steps (a kept pipeline's next run
    /// need not write them again).
    copied: bool,
    /// A dispatch of one plan of one step: pushed as an ordinary item (see `submit_plan`).
    alone: bool,
}

/// The loop being recorded.
struct OpenLoop {
    /// The plan its items go to, once the first is pushed (None while none is, and on a runtime
    /// whose items run at their push).
    plan: Option<usize>,
}

/// The `when` body being recorded.
struct OpenWhen {
    /// The plan its items go to: the condition's (None on a runtime whose items run at their
    /// push).
    plan: Option<usize>,
    /// On a runtime whose items run at their push: the condition was not met, so the body's
    /// items are recorded as skipped instead of run.
    skip: bool,
}

/// The chain name of a `when`'s entry.
const WHEN: &str = "when";

/// Plan ids: never 0, unique in the process per dispatch (the plans of one dispatch share theirs:
/// a plan's `done` words hold it, and another plan of the dispatch waits for its own id there).
static NEXT_PLAN_ID: AtomicU64 = AtomicU64::new(1);

/// Held while the plans of a batch of several domains are pushed, so that every such batch enters
/// each queue it shares with another whole, before or after it. A plan waits on the device for
/// plans of its own batch (and of batches in flight before it); were two batches' pushes to
/// interleave (threads dispatching pipelines over domains a and b at once), a's queue could hold
/// batch 2 before batch 1 while b's held batch 1 before batch 2, each head waiting for a plan
/// queued behind the other: a deadlock the watchdog breaks as a hang. One domain's plans never
/// wait across queues, so a batch of one domain pushes without it.
static CROSS_DOMAIN_PUSHES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The order guard for pushing the plans of `codes`' domains: held when there are several.
fn cross_domain_order(codes: &[&'static DomainCode]) -> Option<std::sync::MutexGuard<'static, ()>> {
    let several = codes.iter().any(|c| c.key != codes[0].key);
    several.then(|| {
        CROSS_DOMAIN_PUSHES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    })
}

/// An item pushed again when a kept pipeline runs on a runtime that runs items at their push.
type Repush<'p> = Box<dyn Fn(&mut Pipeline<'p>) -> Result<()> + 'p>;

/// What a kept pipeline pushes again, in order, on a runtime that runs items at their push (the
/// CPU backend, the launched variants); on the manifolds it runs its plans again instead.
enum Recorded<'p> {
    Push(Repush<'p>),
    Loop {
        body: Vec<Repush<'p>>,
        times: u32,
        below: Option<f64>,
        /// The residual: the body's item at this position.
        residual: Option<usize>,
    },
}

/// Items submitted in order, each free to read what an earlier one wrote, resolved together: see
/// the module documentation and [`Runtime::pipeline`].
pub struct Pipeline<'p> {
    rt: &'p Runtime,
    id: u64,
    outputs: Vec<&'p mut Buffer<f32>>,
    entries: Vec<Entry>,
    /// Per buffer (its address: borrowed for 'p, it cannot move): who touched it last.
    access: HashMap<usize, Access>,
    plans: Vec<Plan>,
    /// Plans not yet dispatched, by domain key.
    open: HashMap<&'static str, usize>,
    looping: Option<OpenLoop>,
    branching: Option<OpenWhen>,
    /// Queue items (plans) submitted and items run at their push: the host's round trips.
    round_trips: u64,
    /// Dispatches so far (`flush`, `wait`).
    dispatches: u32,
    /// Items run at their push, to push again if the pipeline is kept.
    program: Vec<Recorded<'p>>,
    /// Whether pushes of items run at their push are recorded into `program` (not while a kept
    /// pipeline replays it, nor in a host loop's later iterations).
    recording: bool,
}

impl std::fmt::Debug for Pipeline<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Pipeline({} items, {} output buffers, {} plans)",
            self.entries.len(),
            self.outputs.len(),
            self.plans.len()
        )
    }
}

impl Runtime {
    /// A pipeline of items on this runtime: see [`Pipeline`].
    ///
    /// ```no_run
    /// # use pptm_runtime::{Runtime, Result};
    /// # fn demo(rt: &Runtime, x: &pptm_runtime::Buffer<f32>, y: &mut pptm_runtime::Buffer<f32>) -> Result<()> {
    /// let mut p = rt.pipeline();
    /// let x = p.input(x);
    /// let y = p.output(y);
    /// // Chains' generated `push` functions take these handles:
    /// // Scale::push(&mut p, x, y)?; Total::push(&mut p, y)?;
    /// let _ = (x, y);
    /// p.wait()?;
    /// # Ok(()) }
    /// ```
    pub fn pipeline(&self) -> Pipeline<'_> {
        Pipeline {
            rt: self,
            id: NEXT_PIPELINE.fetch_add(1, Ordering::Relaxed),
            outputs: Vec::new(),
            entries: Vec::new(),
            access: HashMap::new(),
            plans: Vec::new(),
            open: HashMap::new(),
            looping: None,
            branching: None,
            round_trips: 0,
            dispatches: 0,
            program: Vec::new(),
            recording: true,
        }
    }
}

/// Whether every element of a buffer of `len` elements that item `b` touches was touched by the
/// same block in item `a`: both are map-pattern items with equal tiles over `len` elements.
fn tiles_line_up(a: Option<Tile>, b: Option<Tile>, len: usize) -> bool {
    matches!((a, b), (Some(a), Some(b)) if a == b && a.aligned && a.elements == len)
}

impl<'p> Pipeline<'p> {
    /// A buffer items of this pipeline read and none writes, borrowed for the pipeline's life.
    pub fn input<T>(&mut self, buffer: &'p Buffer<T>) -> PipeInput<'p>
    where
        T: crate::Element,
        &'p Buffer<T>: Into<InputBuffer<'p>>,
    {
        PipeInput {
            pipeline: self.id,
            source: Source::Shared(buffer.into()),
        }
    }

    /// A buffer items of this pipeline write (and later items may read), borrowed exclusively
    /// for the pipeline's life.
    pub fn output(&mut self, buffer: &'p mut Buffer<f32>) -> PipeOutput {
        self.outputs.push(buffer);
        PipeOutput {
            pipeline: self.id,
            index: self.outputs.len() - 1,
        }
    }

    /// [`Error::BadArguments`] for a handle of another pipeline.
    fn check(&self, output: PipeOutput) -> Result<()> {
        if output.pipeline != self.id || output.index >= self.outputs.len() {
            return Err(Error::BadArguments {
                chain: "pipeline",
                reason: "the output handle belongs to another pipeline".into(),
            });
        }
        Ok(())
    }

    /// Items pushed so far.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no item was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds one item of chain `C` after every item pushed before it (what the generated `push`
    /// calls). Typed errors as `submit`'s, and [`Error::BadArguments`] for a handle of another
    /// pipeline or an item that reads the buffer it writes.
    pub fn push_chain<C>(&mut self, args: Vec<PipeArg<'p>>) -> Result<PipeItem<C::Output>>
    where
        C: Chain,
        C::Output: PipeOutputType,
    {
        let bad = |reason: String| Error::BadArguments {
            chain: C::NAME,
            reason,
        };
        // Which output buffer each argument names, and the buffers (address, length) it reads
        // and writes, for the hazards.
        let mut written: Option<usize> = None;
        let mut read_outputs: Vec<usize> = Vec::new();
        let mut reads: Vec<(usize, usize)> = Vec::new();
        for a in &args {
            let (name, pipeline) = match a {
                PipeArg::Input(n, i) => (n, i.pipeline),
                PipeArg::Output(n, o) => (n, o.pipeline),
                _ => continue,
            };
            if pipeline != self.id {
                return Err(bad(format!(
                    "argument `{name}` is a handle of another pipeline"
                )));
            }
            match a {
                PipeArg::Input(_, PipeInput { source, .. }) => match *source {
                    Source::Shared(b) => reads.push((b.address(), b.len())),
                    Source::Output(k) => {
                        read_outputs.push(k);
                        reads.push((address(self.outputs[k]), self.outputs[k].len()));
                    }
                },
                PipeArg::Output(_, o) => written = Some(o.index),
                _ => {}
            }
        }
        if let Some(w) = written
            && read_outputs.contains(&w)
        {
            return Err(bad(
                "it reads the buffer it writes; write to another buffer (an item's threads read \
                 and write its elements in no set order)"
                    .into(),
            ));
        }
        let mut writes: Vec<(usize, usize)> = written
            .map(|w| (address(self.outputs[w]), self.outputs[w].len()))
            .into_iter()
            .collect();

        // The earlier items this one must follow, each with the length of the buffer that makes
        // it a hazard: the last writer of what it reads or writes, and the readers since of what
        // it writes.
        let mut after: Vec<(usize, usize)> = Vec::new();
        for (a, len) in reads.iter().chain(&writes) {
            if let Some(w) = self.access.get(a).and_then(|acc| acc.writer) {
                after.push((w, *len));
            }
        }
        for (a, len) in &writes {
            if let Some(acc) = self.access.get(a) {
                after.extend(acc.readers.iter().map(|&r| (r, *len)));
            }
        }

        // The arguments as `submit` takes them: shared borrows of what is read, the one mutable
        // borrow of what is written.
        let mut shared: HashMap<usize, &Buffer<f32>> = HashMap::new();
        let mut exclusive: Option<&mut Buffer<f32>> = None;
        for (k, b) in self.outputs.iter_mut().enumerate() {
            if Some(k) == written {
                exclusive = Some(&mut **b);
            } else if read_outputs.contains(&k) {
                shared.insert(k, &**b);
            }
        }
        let mut submit_args: Vec<Arg<'_>> = Vec::with_capacity(args.len());
        for &a in &args {
            submit_args.push(match a {
                PipeArg::Input(n, PipeInput { source, .. }) => match source {
                    Source::Shared(b) => Arg::Input(n, b),
                    Source::Output(k) => Arg::Input(n, InputBuffer::F32(shared[&k])),
                },
                PipeArg::Output(n, _) => Arg::Output(
                    n,
                    exclusive
                        .take()
                        .ok_or_else(|| bad("it names two output buffers".into()))?,
                ),
                PipeArg::F32(n, v) => Arg::F32(n, v),
                PipeArg::U32(n, v) => Arg::U32(n, v),
                PipeArg::Dim(n, v) => Arg::Dim(n, v),
            });
        }
        // A `when` whose condition was not met, on a runtime that runs items at their push: the
        // item is recorded (a kept pipeline's next run may meet it) but does not run.
        let skip = self.branching.as_ref().is_some_and(|w| w.skip);
        // (A ticket of an item that ran is resolved already: the pipeline holds the borrows.)
        let routed = if skip {
            drop(submit_args);
            Ok(Err(()))
        } else {
            match self.rt.submit_impl::<C>(submit_args, SubmitMode::Plan)? {
                Routed::Ran(ticket) => Ok(Ok(C::Output::erase(ticket.detach()).0.wait())),
                Routed::Planned(item) => Err(item),
            }
        };
        let state = match routed {
            // The runtime runs items at their push (the CPU backend, the launched variants): it
            // never records plans, so nothing recorded comes before this item.
            Ok(outcome) => {
                if self.recording {
                    self.program
                        .push(Recorded::Push(Box::new(move |p: &mut Pipeline<'p>| {
                            p.push_chain::<C>(args.clone()).map(|_| ())
                        })));
                }
                match outcome {
                    Ok(result) => {
                        self.round_trips += 1;
                        State::Done(result)
                    }
                    Err(()) => State::Skipped,
                }
            }
            Err(item) => {
                // The domain's working memory, which each item that uses it overwrites: such
                // items follow each other as writers of one buffer do.
                let mut after = after;
                if let Some((a, len)) = item.scratch {
                    if let Some(w) = self.access.get(&a).and_then(|acc| acc.writer) {
                        after.push((w, len));
                    }
                    writes.push((a, len));
                }
                self.record(C::NAME, item, &after)?
            }
        };
        let index = self.entries.len();
        self.entries.push(Entry {
            chain: C::NAME,
            state,
            span: None,
        });
        for (a, _) in reads {
            self.access.entry(a).or_default().readers.push(index);
        }
        for (a, _) in writes {
            let acc = self.access.entry(a).or_default();
            acc.writer = Some(index);
            acc.readers.clear();
        }
        Ok(PipeItem {
            pipeline: self.id,
            index,
            _output: PhantomData,
        })
    }

    /// Records an item into its domain's open plan, after the waits its hazards call for.
    fn record(
        &mut self,
        chain: &'static str,
        item: PlannedItem,
        after: &[(usize, usize)],
    ) -> Result<State> {
        if let Some(cond) = self.branching.as_ref().and_then(|w| w.plan)
            && self.plans[cond].code.key != item.code.key
        {
            return Err(Error::PipelineWhen {
                reason: format!(
                    "`{chain}` is of domain `{}`, the condition of domain `{}`; a `when`'s items must run in the condition's domain",
                    item.code.name, self.plans[cond].code.name
                ),
            });
        }
        let p = match self.open.get(item.code.key) {
            Some(&p) => p,
            None => {
                self.plans.push(Plan {
                    code: item.code,
                    id: 0, // set at its dispatch
                    steps: Vec::new(),
                    meta: Vec::new(),
                    partials: 0,
                    blocks: 1,
                    waits: HashMap::new(),
                    loop_first: None,
                    flight: None,
                });
                self.open.insert(item.code.key, self.plans.len() - 1);
                self.plans.len() - 1
            }
        };
        self.enter_loop(p, chain)?;
        // What this step waits for: earlier steps of its plan (unless the tiles line up, or
        // both ran on block 0 alone), and steps of other domains' plans (a wait step before it).
        let mut deps: Vec<u32> = Vec::new();
        let mut cross: Vec<(usize, Wait)> = Vec::new();
        for &(j, len) in after {
            let State::Planned {
                plan: pj, step: sj, ..
            } = self.entries[j].state
            else {
                continue; // ran already
            };
            let other = &self.plans[pj];
            let target = other.meta[sj].loop_end.unwrap_or(sj);
            if pj == p {
                let m = other.meta[sj];
                if m.loop_end.is_some()
                    || tiles_line_up(m.tile, item.tile, len)
                    || (m.blocks == 1 && item.desc.blocks == 1)
                {
                    continue;
                }
                let in_loop = other.loop_first.is_some_and(|f| sj >= f);
                deps.push(sj as u32 | if in_loop { PPTM_DEP_IN_LOOP } else { 0 });
            } else if other.code.key == item.code.key {
                continue; // an earlier plan of this domain: its queue runs them in order
            } else {
                match other.flight.as_ref() {
                    None => cross.push((pj, Wait::Step(target))),
                    Some(f) => match f.ticket.as_ref() {
                        // In flight: wait for the whole plan to complete.
                        Some(t) if !t.is_ready() => {
                            let seq = t.seq().expect("a plan's ticket is pending");
                            cross.push((pj, Wait::Completion(seq)));
                        }
                        _ => continue, // completed
                    },
                }
            }
        }
        cross.sort_unstable();
        cross.dedup();
        // A wait step runs on the blocks of the step that needs it (each block walks every step
        // in order, so a block past it has waited); a later step on more blocks waits again.
        let covers = |blocks: u32| if blocks == 0 { u32::MAX } else { blocks };
        for (pj, w) in cross {
            let need = covers(item.desc.blocks);
            match self.plans[p].waits.get(&(pj, w)) {
                Some(&have) if have >= need => continue,
                _ => {
                    self.plans[p].waits.insert((pj, w), need);
                }
            }
            let mut desc = pptm_desc {
                opcode: PPTM_OP_PLAN_WAIT,
                blocks: item.desc.blocks,
                ..Default::default()
            };
            let wait_on = match w {
                Wait::Step(sj) => {
                    // args[0], the word, once both plans have their regions (`flush`). Equal to
                    // the dispatch's id, which both plans carry: a region's `done` words keep the
                    // ids of the dispatches before it.
                    desc.args[2] = 1;
                    self.plans[pj].steps[sj].flags |= PPTM_STEP_DONE;
                    Some((pj, sj))
                }
                Wait::Completion(seq) => {
                    let f = self.plans[pj].flight.as_ref().expect("in flight");
                    (desc.args[0], desc.args[1]) = f.manifold.completion_word(seq);
                    None
                }
            };
            let plan = &mut self.plans[p];
            plan.steps.push(plan::step(desc));
            plan.meta.push(StepMeta {
                tile: None,
                blocks: item.desc.blocks,
                alone_blocks: item.desc.blocks,
                light: None,
                loop_end: None,
                wait_on,
            });
        }
        deps.sort_unstable();
        deps.dedup();
        let plan = &mut self.plans[p];
        for &d in &deps {
            plan.steps[(d & !PPTM_DEP_IN_LOOP) as usize].flags |= PPTM_STEP_FINISHED;
        }
        let mut step = plan::step(item.desc);
        if deps.len() > PPTM_PLAN_DEPS as usize {
            step.sync = PPTM_SYNC_BARRIER;
        } else if !deps.is_empty() {
            step.sync = PPTM_SYNC_DEPS;
            step.deps[..deps.len()].copy_from_slice(&deps);
        }
        if item.desc.blocks != 1 {
            step.partials = plan.partials;
            // One slot per block that runs the step: a block's index within the plan is below
            // the grid's size, at most PPTM_MAX_BLOCKS, however many tiles the step asks for (a
            // large product asks for one block a tile; its blocks then loop over the tiles).
            let max = crate::gpu::abi::PPTM_MAX_BLOCKS;
            let slots = if item.desc.blocks == 0 {
                max
            } else {
                item.desc.blocks.min(max)
            };
            plan.partials = plan.partials.saturating_add(slots);
        }
        if plan.blocks != 0 {
            plan.blocks = if item.desc.blocks == 0 {
                0
            } else {
                plan.blocks.max(item.desc.blocks)
            };
        }
        plan.steps.push(step);
        plan.meta.push(StepMeta {
            tile: item.tile,
            blocks: item.desc.blocks,
            alone_blocks: item.alone_blocks,
            light: item.light,
            loop_end: None,
            wait_on: None,
        });
        Ok(State::Planned {
            plan: p,
            step: plan.steps.len() - 1,
            guard: item.guard,
        })
    }

    /// Runs `body`'s items `times` times over: on the GPU as one loop inside the plan, with no
    /// host round trip between iterations. The items must all be of one domain, and a loop may
    /// not hold another. What they compute after the last iteration is what the pipeline
    /// returns for them.
    pub fn repeat(
        &mut self,
        times: u32,
        mut body: impl FnMut(&mut Self) -> Result<()>,
    ) -> Result<PipeLoop> {
        self.run_loop(times, None, &mut |p| body(p).map(|()| None))
    }

    /// As [`Pipeline::repeat`], stopping early after the first iteration in which `residual`
    /// (an item `body` pushes, whose value the loop reads on the device) comes out below
    /// `below`. At most `max_times` iterations.
    pub fn repeat_until(
        &mut self,
        max_times: u32,
        below: f64,
        mut body: impl FnMut(&mut Self) -> Result<PipeItem<f32>>,
    ) -> Result<PipeLoop> {
        self.run_loop(max_times, Some(below), &mut |p| body(p).map(Some))
    }

    fn run_loop(
        &mut self,
        times: u32,
        below: Option<f64>,
        body: &mut dyn FnMut(&mut Self) -> Result<Option<PipeItem<f32>>>,
    ) -> Result<PipeLoop> {
        let refuse = |reason: &str| Error::PipelineLoop {
            reason: reason.into(),
        };
        if times == 0 {
            return Err(refuse(
                "a loop runs at least once: times must be at least 1",
            ));
        }
        if self.looping.is_some() {
            return Err(refuse(
                "a loop inside a loop is not supported; unroll the inner one",
            ));
        }
        if self.branching.is_some() {
            return Err(refuse(
                "a loop inside a `when` is not supported; put the `when` inside the loop",
            ));
        }
        let first = self.entries.len();
        let program_first = self.program.len();
        self.looping = Some(OpenLoop { plan: None });
        let returned = body(self);
        let opened = self.looping.take().expect("set above");
        // Closed here whatever happens next (on an error, what the body recorded stays, as
        // items after one another).
        let loop_first = opened.plan.and_then(|p| self.plans[p].loop_first.take());
        let residual = returned?;
        let count = self.entries.len() - first;
        if count == 0 {
            return Err(refuse("the loop's body pushed no item"));
        }
        let cond = match residual {
            Some(item)
                if item.pipeline != self.id || !(first..first + count).contains(&item.index) =>
            {
                return Err(refuse(
                    "the residual must be an item the loop's body pushed in this pipeline",
                ));
            }
            Some(item) => Some(item.index),
            None => None,
        };
        let until = below;
        let below = below.unwrap_or(f64::NAN);
        let state = if let Some(p) = opened.plan {
            // One loop step closes the body in the plan; the device runs the iterations.
            let plan = &mut self.plans[p];
            let first_step = loop_first.expect("set by the loop's first item");
            let cond_step = match cond.map(|c| &self.entries[c].state) {
                Some(State::Planned { step, .. }) => *step as u64 + 1,
                _ => 0,
            };
            let mut desc = pptm_desc {
                opcode: PPTM_OP_PLAN_LOOP,
                blocks: 0,
                ..Default::default()
            };
            desc.args[0] = first_step as u64;
            desc.args[1] = u64::from(times);
            desc.args[2] = cond_step;
            desc.args[3] = below.to_bits();
            let end = plan.steps.len();
            plan.steps.push(plan::step(desc));
            plan.meta.push(StepMeta {
                tile: None,
                blocks: 0,
                alone_blocks: 0,
                light: None,
                loop_end: None,
                wait_on: None,
            });
            for m in &mut plan.meta[first_step..end] {
                m.loop_end = Some(end);
            }
            State::Planned {
                plan: p,
                step: end,
                guard: None,
            }
        } else {
            // The items ran at their push: run the body again until done, keeping the last
            // iteration's results in the first iteration's entries.
            let stop = |entries: &[Entry]| {
                cond.is_some_and(
                    |c| matches!(entries[c].state, State::Done(Ok(v)) if f64::from(v) < below),
                )
            };
            // The body's pushes, once, for a kept pipeline to run again.
            if self.recording {
                let pushes: Vec<Repush<'p>> = self
                    .program
                    .drain(program_first..)
                    .filter_map(|r| match r {
                        Recorded::Push(f) => Some(f),
                        Recorded::Loop { .. } => None, // loops do not nest
                    })
                    .collect();
                self.program.push(Recorded::Loop {
                    body: pushes,
                    times,
                    below: until,
                    residual: cond.map(|c| c - first),
                });
            }
            let recording = std::mem::replace(&mut self.recording, false);
            let mut iterations = 1u32;
            while iterations < times && !stop(&self.entries) {
                // Each iteration pushes into the same entries as the first (its items' handles
                // are the first's), then takes over what the one before left where it did not
                // run.
                let earlier: Vec<Entry> = self.entries.drain(first..).collect();
                self.looping = Some(OpenLoop { plan: None });
                let again = body(self);
                self.looping = None;
                if let Err(e) = again {
                    self.recording = recording;
                    return Err(e);
                }
                if self.entries.len() - first != count {
                    self.recording = recording;
                    return Err(refuse(
                        "the loop's body pushed a different number of items in a later iteration",
                    ));
                }
                for (slot, e) in self.entries[first..].iter_mut().zip(earlier) {
                    let later = std::mem::replace(&mut slot.state, State::Skipped);
                    slot.state = match (e.state, later) {
                        // What an item computed the last time it ran, as on the device.
                        (earlier, State::Skipped) => earlier,
                        // A `when` counts the iterations its body ran in.
                        (State::Done(Ok(a)), State::Done(Ok(b))) if slot.chain == WHEN => {
                            State::Done(Ok(a + b))
                        }
                        (_, later) => later,
                    };
                }
                for acc in self.access.values_mut() {
                    acc.readers.sort_unstable();
                    acc.readers.dedup();
                }
                iterations += 1;
            }
            self.recording = recording;
            State::Done(Ok(iterations as f32))
        };
        let index = self.entries.len();
        self.entries.push(Entry {
            chain: "loop",
            state,
            span: None,
        });
        Ok(PipeLoop {
            pipeline: self.id,
            index,
        })
    }

    /// Runs the items `body` pushes only when `cond`'s result (an item pushed before, of a chain
    /// with a scalar result) is at least `at_least` (not when it is NaN). On the GPU the device
    /// reads the value and runs or skips the body itself, with no host round trip: inside a
    /// [`Pipeline::repeat`], each iteration decides anew (a neighbour list rebuilt only when atoms
    /// have moved far enough). The body's items must be of the condition's domain; a `when` may
    /// not hold another `when` or a loop.
    ///
    /// An item of the body reports what it computed the last time it ran;
    /// [`PipeResults::get`] gives [`Error::NotRun`] for one that never ran, and
    /// [`PipeResults::runs`] how many times the body ran. Items after the body see the buffers as
    /// the body left them, or as they were before it when it was skipped.
    pub fn when(
        &mut self,
        cond: PipeItem<f32>,
        at_least: f64,
        body: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<PipeWhen> {
        if cond.pipeline != self.id {
            return Err(Error::PipelineWhen {
                reason: "the condition is an item of another pipeline".into(),
            });
        }
        let mut body = Some(body);
        self.open_when(cond.index, at_least, &mut |p| {
            (body.take().expect("called once"))(p)
        })
    }

    /// Replays a recorded `when` (a kept pipeline's run on a runtime that runs items at their
    /// push; a host loop's iterations push into the same entries, so `cond` holds in each).
    fn replay_when(&mut self, cond: usize, at_least: f64, body: &[Repush<'p>]) -> Result<()> {
        self.open_when(cond, at_least, &mut |p| {
            body.iter().try_for_each(|push| push(p))
        })
        .map(|_| ())
    }

    fn open_when(
        &mut self,
        index: usize,
        at_least: f64,
        body: &mut dyn FnMut(&mut Self) -> Result<()>,
    ) -> Result<PipeWhen> {
        let refuse = |reason: &str| Error::PipelineWhen {
            reason: reason.into(),
        };
        if index >= self.entries.len() {
            return Err(refuse(
                "the condition must be an item pushed before the `when`",
            ));
        }
        if self.branching.is_some() {
            return Err(refuse(
                "a `when` inside a `when` is not supported; compute one condition for both",
            ));
        }
        if at_least.is_nan() {
            return Err(refuse("the threshold is NaN, which no value reaches"));
        }
        // On the GPU: a step that runs or skips the body, in the condition's plan.
        let (plan, skip) = match self.entries[index].state {
            State::Planned { plan, step, .. } => {
                let code = self.plans[plan].code;
                if self.open.get(code.key) != Some(&plan) {
                    return Err(refuse(
                        "the condition's item was dispatched already (`flush`); push the `when` \
                         with it, before flushing",
                    ));
                }
                self.enter_loop(plan, "when")?;
                let mut desc = pptm_desc {
                    opcode: PPTM_OP_PLAN_WHEN,
                    blocks: 0,
                    ..Default::default()
                };
                desc.args[1] = step as u64 + 1;
                desc.args[2] = at_least.to_bits();
                let plan_ = &mut self.plans[plan];
                plan_.steps.push(plan::step(desc));
                plan_.meta.push(StepMeta {
                    tile: None,
                    blocks: 0,
                    alone_blocks: 0,
                    light: None,
                    loop_end: None,
                    wait_on: None,
                });
                (Some((plan, plan_.steps.len() - 1)), false)
            }
            // (NaN meets no threshold.)
            State::Done(Ok(v)) => (
                None,
                f64::from(v)
                    .partial_cmp(&at_least)
                    .is_none_or(|o| o.is_lt()),
            ),
            // A condition that failed (the pipeline reports it) or never ran.
            State::Done(Err(_)) | State::Skipped => (None, true),
        };
        let first = self.entries.len();
        let program_first = self.program.len();
        self.branching = Some(OpenWhen {
            plan: plan.map(|(p, _)| p),
            skip,
        });
        let ran = body(self);
        self.branching = None;
        // Closed here whatever happens next: on an error, what the body recorded stays, run
        // under the condition (a step left open would fail its plan).
        if let Some((p, step)) = plan {
            let end = self.plans[p].steps.len();
            self.plans[p].steps[step].desc.args[0] = end as u64;
        }
        ran?;
        if self.entries.len() == first {
            return Err(refuse("the `when`'s body pushed no item"));
        }
        let state = match plan {
            Some((p, step)) => State::Planned {
                plan: p,
                step,
                guard: None,
            },
            None => {
                if self.recording {
                    let body: Vec<Repush<'p>> = self
                        .program
                        .drain(program_first..)
                        .filter_map(|r| match r {
                            Recorded::Push(f) => Some(f),
                            Recorded::Loop { .. } => None, // no loops in a `when`
                        })
                        .collect();
                    self.program
                        .push(Recorded::Push(Box::new(move |p: &mut Pipeline<'p>| {
                            p.replay_when(index, at_least, &body)
                        })));
                }
                State::Done(Ok(if skip { 0.0 } else { 1.0 }))
            }
        };
        let index = self.entries.len();
        self.entries.push(Entry {
            chain: WHEN,
            state,
            span: None,
        });
        Ok(PipeWhen {
            pipeline: self.id,
            index,
        })
    }

    /// Joins plan `p` to the loop being recorded, if any: its first step marks where the loop
    /// begins in it. Refused when the loop's items already run in another domain.
    fn enter_loop(&mut self, p: usize, chain: &str) -> Result<()> {
        if let Some(l) = self.looping.as_mut() {
            match l.plan {
                None => {
                    l.plan = Some(p);
                    self.plans[p].loop_first = Some(self.plans[p].steps.len());
                }
                Some(lp) if lp != p => {
                    return Err(Error::PipelineLoop {
                        reason: format!(
                            "`{chain}` is of domain `{}`, the loop's first item of domain `{}`; a loop's items must all run in one domain",
                            self.plans[p].code.name, self.plans[lp].code.name
                        ),
                    });
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Dispatches the items recorded so far (one plan per domain), without waiting for them.
    /// [`Pipeline::wait`] does this itself; call it to let the GPU start while the host pushes
    /// more. Items pushed after it go to new plans, which follow these.
    pub fn flush(&mut self) -> Result<()> {
        if self.open.is_empty() {
            return Ok(());
        }
        if self.looping.is_some() {
            return Err(Error::PipelineLoop {
                reason: "flush inside a loop's body".into(),
            });
        }
        if self.branching.is_some() {
            return Err(Error::PipelineWhen {
                reason: "flush inside a `when`'s body".into(),
            });
        }
        let batch: Vec<usize> = {
            let mut b: Vec<usize> = self.open.drain().map(|(_, p)| p).collect();
            b.sort_unstable();
            b
        };
        if batch.is_empty() {
            return Ok(());
        }
        let dispatched = self.dispatch(&batch);
        if dispatched.is_err() {
            self.release_unsent(&batch);
        }
        dispatched
    }

    /// After a failed dispatch: the plans of `batch` that did not go out give their regions back;
    /// their items stay unresolved, and `wait` reports the error.
    fn release_unsent(&mut self, batch: &[usize]) {
        for &p in batch {
            let plan = &mut self.plans[p];
            if plan.flight.as_ref().is_some_and(|f| f.ticket.is_none()) {
                let f = plan.flight.take().expect("checked");
                f.manifold.plans.release(f.region);
            }
        }
    }

    /// Reserves, writes and submits the plans of `batch`.
    fn dispatch(&mut self, batch: &[usize]) -> Result<()> {
        // Under the runtime's gate: no manifold of the batch can be drained or relaunched (a
        // re-partition for another thread's new domain) between its plans' reservations and
        // their pushes.
        let codes: Vec<&'static DomainCode> = batch.iter().map(|&p| self.plans[p].code).collect();
        let rt = self.rt;
        self.dispatches += 1;
        let _order = cross_domain_order(&codes);
        rt.with_running(&codes, |manifolds| self.dispatch_on(batch, manifolds))
    }

    /// `dispatch`, with `manifolds[i]` the running manifold of `batch[i]`'s domain.
    fn dispatch_on(&mut self, batch: &[usize], manifolds: &[Arc<Manifold>]) -> Result<()> {
        let id = NEXT_PLAN_ID.fetch_add(1, Ordering::Relaxed);
        for &p in batch {
            self.plans[p].id = id;
        }
        // Every plan's regions first: a wait step needs the address of another plan's words.
        let deadline = std::time::Instant::now() + self.rt.config().submit_timeout;
        for (&p, m) in batch.iter().zip(manifolds) {
            let plan = &self.plans[p];
            let m = m.clone();
            let n = plan.steps.len() as u64;
            let region = m.plans.reserve(
                plan::host_bytes(n),
                plan::dev_bytes(n, u64::from(plan.partials)),
                deadline,
            )?;
            self.plans[p].flight = Some(Flight {
                manifold: m,
                region,
                ticket: None,
                settled: false,
                copied: false,
                alone: batch.len() == 1 && n == 1,
            });
        }
        let patience = self.patience();
        for &p in batch {
            let mut steps = std::mem::take(&mut self.plans[p].steps);
            for (s, m) in steps.iter_mut().zip(&self.plans[p].meta) {
                // Every step that will wait for this one is recorded by now (a plan is dispatched
                // once, and later plans wait for its completion).
                if let Some(checks) = m.light
                    && s.flags & (PPTM_STEP_FINISHED | PPTM_STEP_DONE) == 0
                {
                    s.flags |= PPTM_STEP_LIGHT | if checks { PPTM_STEP_CHECKS_FINITE } else { 0 };
                }
                if let Some((pj, sj)) = m.wait_on {
                    let other = &self.plans[pj];
                    let f = other.flight.as_ref().expect("dispatched before or now");
                    let n = other.meta.len() as u64;
                    s.desc.args[0] = f
                        .manifold
                        .plans
                        .dev_address(f.region.dev + plan::done_offset(n, sj as u64));
                }
            }
            let plan = &self.plans[p];
            let f = plan.flight.as_ref().expect("reserved above");
            if !plan::write_steps(&f.manifold, f.region, &steps) {
                return Err(Error::Device {
                    chain: "pipeline plan",
                    status: crate::gpu::abi::PPTM_STATUS_BAD_ARGUMENT,
                    meaning: "the plan's region lies outside the host plan arena",
                });
            }
            self.plans[p].steps = steps;
            self.submit_plan(p, patience, false)?;
        }
        Ok(())
    }

    /// Submits plan `p`, its region reserved (and written, unless `resident`: its steps are in
    /// the device region from an earlier run).
    ///
    /// A dispatch of one plan of one step (a build-time pipeline composed into one part, or a
    /// pipeline of one item) goes as the step's own descriptor, an ordinary item: one step has
    /// nothing to hand off, and skipping the plan's step copy, its blocks' start handshake and its
    /// results' copy-out saves about 4 µs on an H200. Its one step waits for nothing (a wait is
    /// a step of its own), and another plan waits for it by its completion, as for any plan
    /// already in flight.
    fn submit_plan(&mut self, p: usize, patience: u64, resident: bool) -> Result<()> {
        let plan = &self.plans[p];
        let f = plan.flight.as_ref().expect("reserved");
        if f.alone {
            let chain = self
                .entries
                .iter()
                .find(|e| matches!(e.state, State::Planned { plan: ep, .. } if ep == p))
                .map_or("pipeline item", |e| e.chain);
            let mut desc = plan.steps[0].desc;
            desc.blocks = plan.meta[0].alone_blocks;
            let cell = self.rt.push(&f.manifold, &desc, true, false, chain)?;
            let ticket = Ticket::pending(chain, f.manifold.clone(), cell);
            let f = self.plans[p].flight.as_mut().expect("reserved");
            f.ticket = Some(ticket);
            f.settled = false;
            self.round_trips += 1;
            return Ok(());
        }
        let mut desc = pptm_desc {
            opcode: PPTM_OP_PLAN,
            blocks: plan.blocks,
            ..Default::default()
        };
        desc.args[0] = plan.steps.len() as u64;
        desc.args[1] = f.region.dev;
        desc.args[2] = f.region.host;
        desc.args[3] = plan.id;
        desc.args[4] = patience;
        desc.args[5] = u64::from(plan.partials);
        desc.args[6] = u64::from(resident);
        let cell = self
            .rt
            .push(&f.manifold, &desc, true, false, "pipeline plan")?;
        let ticket = Ticket::pending("pipeline plan", f.manifold.clone(), cell);
        let f = self.plans[p].flight.as_mut().expect("reserved");
        f.ticket = Some(ticket);
        f.settled = false;
        self.round_trips += 1;
        Ok(())
    }

    /// Runs every plan again (a kept pipeline): with their steps resident where every plan ran
    /// to its end on the manifold that runs its domain now, otherwise reserved and written anew
    /// (a manifold was relaunched since, or a plan never ran).
    fn redispatch_on(&mut self, manifolds: &[Arc<Manifold>]) -> Result<()> {
        let resident = self.plans.iter().zip(manifolds).all(|(plan, m)| {
            plan.flight
                .as_ref()
                .is_some_and(|f| f.copied && Arc::ptr_eq(&f.manifold, m))
        });
        let all: Vec<usize> = (0..self.plans.len()).collect();
        if !resident {
            for plan in &mut self.plans {
                if let Some(f) = plan.flight.take() {
                    if f.settled {
                        f.manifold.plans.release(f.region);
                    } else {
                        // (Only a plan whose wait timed out: its memory stays reserved.)
                        std::mem::forget(f);
                    }
                }
            }
            let dispatched = self.dispatch_on(&all, manifolds);
            if dispatched.is_err() {
                self.release_unsent(&all);
            }
            return dispatched;
        }
        let id = NEXT_PLAN_ID.fetch_add(1, Ordering::Relaxed);
        let patience = self.patience();
        for p in all {
            self.plans[p].id = id;
            self.submit_plan(p, patience, true)?;
        }
        Ok(())
    }

    /// How long (ns) a plan's waits for other domains report progress to the watchdog.
    fn patience(&self) -> u64 {
        self.rt
            .config()
            .stream_patience
            .as_nanos()
            .min(u128::from(u64::MAX)) as u64
    }

    /// Dispatches what is recorded and waits for every plan in flight; their items' results
    /// become known.
    fn settle(&mut self) -> Result<()> {
        self.flush()?;
        for p in 0..self.plans.len() {
            let Some(ticket) = self.plans[p].flight.as_mut().and_then(|f| f.ticket.take()) else {
                continue;
            };
            // A plan of one step pushed as an item: its result is its completion's.
            let alone = self.plans[p].flight.as_ref().is_some_and(|f| f.alone);
            let (outcome, direct) = if alone {
                match ticket.wait_completion() {
                    Ok(c) => (
                        Ok(()),
                        Some(plan::StepResult {
                            status: c.status,
                            paths: c.paths.map_or(0, |p| p.bits()),
                            value: c.value,
                            start: 0,
                            end: c.device_ns.unwrap_or(0),
                        }),
                    ),
                    Err(e) => (Err(e), None),
                }
            } else {
                (ticket.wait(), None)
            };
            let f = self.plans[p].flight.as_mut().expect("dispatched");
            f.settled = true;
            f.copied = outcome.is_ok();
            self.resolve_plan(p, outcome, direct);
        }
        Ok(())
    }

    /// Turns a completed plan's results into its items' results: those in its host region, or
    /// `direct`, the one step's result of a plan pushed as an item.
    fn resolve_plan(&mut self, p: usize, outcome: Result<()>, direct: Option<plan::StepResult>) {
        let plan = &self.plans[p];
        let f = plan.flight.as_ref().expect("dispatched");
        let n = plan.steps.len() as u64;
        let alone = f.alone;
        let results = if alone {
            None
        } else {
            plan::read_results(&f.manifold, f.region, n)
        };
        let read = |k: u64| {
            if alone {
                direct
            } else {
                results
                    .as_ref()
                    .and_then(|r| r.get(usize::try_from(k).ok()?).copied())
            }
        };
        let summary = if alone { None } else { read(n) };
        let mut failure = outcome.err();
        let why = failure.as_ref().map(ToString::to_string);
        for e in self.entries.iter_mut() {
            let State::Planned {
                plan: ep,
                step,
                guard,
            } = &mut e.state
            else {
                continue;
            };
            if *ep != p {
                continue;
            }
            let result = match (&mut failure, &why, read(*step as u64)) {
                // The plan failed as a whole (its manifold stopped, a hang): the first of its
                // items reports why, the others that they did not complete.
                (Some(_), _, _) => Err(failure.take().expect("some")),
                (None, Some(why), _) => Err(Error::ManifoldStopped {
                    domain: plan.code.name,
                    reason: format!("the plan this item was part of did not complete: {why}"),
                }),
                (None, None, None) => Err(Error::Device {
                    chain: e.chain,
                    status: crate::gpu::abi::PPTM_STATUS_BAD_ARGUMENT,
                    meaning: "the plan's results lie outside the host plan arena",
                }),
                // A step of a `when` body that never ran (the device zeroes every result
                // first; a step that ran has its end time).
                (None, None, Some(r)) if !alone && r.end == 0 && r.status == PPTM_STATUS_OK => {
                    e.state = State::Skipped;
                    continue;
                }
                // The common case, as `resolve` and the guard below would take it: a step that
                // ran and succeeded, of a chain without a guard.
                (None, None, Some(r))
                    if r.status == PPTM_STATUS_OK
                        && guard.is_none()
                        && summary.is_none_or(|s| s.status == PPTM_STATUS_OK) =>
                {
                    e.span = Some((r.start, r.end));
                    Ok(r.value as f32)
                }
                (None, None, Some(r)) => {
                    e.span = Some((r.start, r.end));
                    // A failure an earlier loop iteration saw, which a later one's result hides.
                    let status = match summary {
                        Some(s) if s.status != PPTM_STATUS_OK && s.value as u64 == *step as u64 => {
                            s.status
                        }
                        _ => r.status,
                    };
                    let c = Completion {
                        status,
                        value: r.value,
                        device_ns: Some(r.end.saturating_sub(r.start)),
                        paths: Some(crate::ticket::ProductPaths::from_bits(r.paths)),
                    };
                    let out = crate::ticket::resolve(e.chain, plan.code.name, &Ok(c));
                    if let (Ok(c), Some(g)) = (&out, guard.take()) {
                        g.book.record(&g, c.value);
                    }
                    out.map(|c| c.value as f32)
                }
            };
            e.state = State::Done(result);
        }
    }

    /// Waits for every item. The first item that failed fails the pipeline:
    /// [`Error::PipelineItem`] names it (the items after it ran on what it left, so they are not
    /// reported as results). Otherwise every item's result, by [`PipeResults::get`].
    pub fn wait(mut self) -> Result<PipeResults> {
        self.collect()
    }

    /// As [`Pipeline::wait`], for async code: dispatches what is not yet, then awaits every plan
    /// without blocking the task's thread (pptm's watcher thread wakes it), and returns what
    /// `wait` returns.
    pub async fn wait_async(mut self) -> Result<PipeResults> {
        self.flush()?;
        for p in 0..self.plans.len() {
            if let Some(ticket) = self.plans[p]
                .flight
                .as_ref()
                .and_then(|f| f.ticket.as_ref())
            {
                std::future::poll_fn(|cx| ticket.poll_ready(cx)).await;
            }
        }
        self.collect()
    }

    /// As [`Pipeline::wait`], and keeps the pipeline to run again, as many times as wanted, with
    /// the same items on the same buffers ([`KeptPipeline::run`]): like a CUDA graph, recorded
    /// once and replayed. On the manifolds each later run submits its plans again with their
    /// steps left in device memory: no pushes, nothing written but one queue item per domain.
    /// On a runtime that runs items at their push (the CPU backend, the launched variants), a
    /// run pushes them again.
    ///
    /// A pipeline that was flushed ([`Pipeline::flush`]) before cannot be kept: its later plans
    /// wait for that dispatch's completion, which a run again would not repeat
    /// ([`Error::BadArguments`], after waiting for what was dispatched).
    pub fn wait_and_keep(mut self) -> Result<(PipeResults, KeptPipeline<'p>)> {
        if self.dispatches > 0 {
            return Err(Error::BadArguments {
                chain: "pipeline",
                reason: "it was flushed before: a kept pipeline is dispatched whole at each run; \
                         keep one that was not flushed"
                    .into(),
            });
        }
        let template = self
            .entries
            .iter()
            .map(|e| match &e.state {
                State::Planned { plan, step, guard } => Some(Planned {
                    chain: e.chain,
                    plan: *plan,
                    step: *step,
                    guard: guard.clone(),
                }),
                State::Done(_) | State::Skipped => None,
            })
            .collect::<Option<Vec<_>>>();
        let results = self.collect()?;
        let template = match template {
            Some(t) if self.program.is_empty() => t,
            // Items that ran at their push: a run pushes them again.
            _ => Vec::new(),
        };
        Ok((
            results,
            KeptPipeline {
                pipeline: self,
                template,
            },
        ))
    }

    /// Dispatches what is left, waits for everything and gathers the items' results (see
    /// [`Pipeline::wait`]).
    fn collect(&mut self) -> Result<PipeResults> {
        let settled = self.settle();
        let mut values = Vec::with_capacity(self.entries.len());
        let mut not_run = Vec::new();
        let mut first_failure: Option<Error> = settled.err();
        let spans: Vec<Option<(u64, u64)>> = self.entries.iter().map(|e| e.span).collect();
        for (index, e) in std::mem::take(&mut self.entries).into_iter().enumerate() {
            match e.state {
                State::Done(Ok(v)) => values.push(v),
                State::Done(Err(source)) => {
                    values.push(f32::NAN);
                    if first_failure.is_none() {
                        first_failure = Some(Error::PipelineItem {
                            item: index,
                            chain: e.chain,
                            source: Box::new(source),
                        });
                    }
                }
                State::Planned { .. } => values.push(f32::NAN),
                State::Skipped => {
                    values.push(f32::NAN);
                    not_run.push((index, e.chain));
                }
            }
        }
        match first_failure {
            Some(e) => Err(e),
            None => Ok(PipeResults {
                pipeline: self.id,
                values,
                not_run,
                spans,
                round_trips: self.round_trips,
            }),
        }
    }

    /// Pushes the recorded program again (a kept pipeline on a runtime that runs items at their
    /// push).
    fn push_again(&mut self) -> Result<()> {
        let program = std::mem::take(&mut self.program);
        let recording = std::mem::replace(&mut self.recording, false);
        let mut outcome = Ok(());
        for r in &program {
            outcome = match r {
                Recorded::Push(push) => push(self),
                Recorded::Loop {
                    body,
                    times,
                    below,
                    residual,
                } => {
                    let mut again = |p: &mut Pipeline<'p>| -> Result<Option<PipeItem<f32>>> {
                        let base = p.entries.len();
                        for push in body {
                            push(p)?;
                        }
                        Ok(residual.map(|k| PipeItem {
                            pipeline: p.id,
                            index: base + k,
                            _output: PhantomData,
                        }))
                    };
                    self.run_loop(*times, *below, &mut again).map(|_| ())
                }
            };
            if outcome.is_err() {
                break;
            }
        }
        self.program = program;
        self.recording = recording;
        outcome
    }
}

/// An item of a kept pipeline's plans: where its result comes from at each run.
struct Planned {
    chain: &'static str,
    plan: usize,
    step: usize,
    guard: Option<GuardNote>,
}

/// A pipeline kept to run again ([`Pipeline::wait_and_keep`]): the same items, on the same
/// buffers, with the same scalars, run as many times as wanted. It keeps the borrows of its
/// buffers; [`KeptPipeline::buffer_mut`] lends one between runs (to write the next run's input,
/// or read a result).
///
/// On the manifolds its plans keep their memory (`Config::plan_arena_bytes`) until it is dropped.
pub struct KeptPipeline<'p> {
    pipeline: Pipeline<'p>,
    /// Where each item's result comes from (empty when its items run at their push).
    template: Vec<Planned>,
}

impl std::fmt::Debug for KeptPipeline<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kept{:?}", self.pipeline)
    }
}

impl<'p> KeptPipeline<'p> {
    /// Runs the items again and waits for them: results as [`Pipeline::wait`] gives them, for
    /// the same [`PipeItem`] handles.
    pub fn run(&mut self) -> Result<PipeResults> {
        let p = &mut self.pipeline;
        p.round_trips = 0;
        if !p.program.is_empty() || p.plans.is_empty() {
            p.entries.clear();
            p.access.clear();
            p.push_again()?;
            return p.collect();
        }
        p.entries = self
            .template
            .iter()
            .map(|t| Entry {
                chain: t.chain,
                state: State::Planned {
                    plan: t.plan,
                    step: t.step,
                    guard: t.guard.clone(),
                },
                span: None,
            })
            .collect();
        let codes: Vec<&'static DomainCode> = p.plans.iter().map(|plan| plan.code).collect();
        let rt = p.rt;
        let order = cross_domain_order(&codes);
        let dispatched = rt.with_running(&codes, |manifolds| p.redispatch_on(manifolds));
        drop(order);
        let results = p.collect();
        dispatched?;
        results
    }

    /// The buffer behind `output`, to read between runs.
    pub fn buffer(&self, output: PipeOutput) -> Result<&Buffer<f32>> {
        self.pipeline.check(output)?;
        Ok(&*self.pipeline.outputs[output.index])
    }

    /// The buffer behind `output`, to write between runs (the next run's input).
    pub fn buffer_mut(&mut self, output: PipeOutput) -> Result<&mut Buffer<f32>> {
        self.pipeline.check(output)?;
        Ok(&mut *self.pipeline.outputs[output.index])
    }
}

impl Drop for Pipeline<'_> {
    /// Dropped unwaited, the pipeline dispatches what it recorded and waits for it (bounded by
    /// the shutdown timeout, as a ticket's drop), so the buffers it borrows are never released
    /// while the device may use them. A plan's regions go back to its manifold's arenas only once
    /// every plan of the pipeline has settled (one may wait on another's words).
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::error!("dropping a pipeline: its last items could not be dispatched: {e}");
        }
        for plan in &mut self.plans {
            let Some(f) = plan.flight.as_mut() else {
                continue;
            };
            if let Some(mut t) = f.ticket.take() {
                let timeout = f.manifold.shutdown_timeout();
                f.settled = !matches!(t.wait_timeout(timeout), Err(Error::Timeout(_)));
                if !f.settled {
                    tracing::error!(
                        "dropped a pipeline whose plan did not finish in time; its plan memory stays reserved"
                    );
                    std::mem::forget(t);
                }
            }
        }
        for plan in &self.plans {
            if let Some(f) = &plan.flight
                && f.settled
            {
                f.manifold.plans.release(f.region);
            }
        }
    }
}

/// A waited pipeline's time on the GPU ([`PipeResults::device_time`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceTime {
    /// From the first item's start to the last item's end.
    pub span: std::time::Duration,
    /// The sum of the items' own times (start to end of each).
    pub items: std::time::Duration,
    /// Items that ran in plans.
    pub count: usize,
}

impl DeviceTime {
    /// The mean time between one item's end and the next one's start: (span − items) over
    /// count − 1 hand-offs (zero for one item).
    pub fn mean_handoff(&self) -> std::time::Duration {
        match self.count {
            0 | 1 => std::time::Duration::ZERO,
            n => self.span.saturating_sub(self.items) / (n as u32 - 1),
        }
    }
}

/// Every item's result of a waited pipeline.
#[derive(Debug, Clone)]
pub struct PipeResults {
    pipeline: u64,
    values: Vec<f32>,
    /// Items inside a `when` that never ran (index, chain), in order.
    not_run: Vec<(usize, &'static str)>,
    spans: Vec<Option<(u64, u64)>>,
    round_trips: u64,
}

impl PipeResults {
    /// The result of `item` (a scalar, or `()` for an item whose output is a buffer).
    /// [`Error::BadArguments`] for an item of another pipeline.
    pub fn get<R: PipeOutputType>(&self, item: PipeItem<R>) -> Result<R> {
        if item.pipeline != self.pipeline {
            return Err(Error::BadArguments {
                chain: "pipeline",
                reason: "the item belongs to another pipeline".into(),
            });
        }
        if let Ok(k) = self.not_run.binary_search_by_key(&item.index, |&(i, _)| i) {
            return Err(Error::NotRun {
                item: item.index,
                chain: self.not_run[k].1,
            });
        }
        Ok(R::from_value(self.values[item.index]))
    }

    /// How many times the body of `when` ran: 0 or 1, or over a loop's iterations up to their
    /// count ([`Error::BadArguments`] for a `when` of another pipeline).
    pub fn runs(&self, when: PipeWhen) -> Result<u32> {
        if when.pipeline != self.pipeline {
            return Err(Error::BadArguments {
                chain: "pipeline",
                reason: "the `when` belongs to another pipeline".into(),
            });
        }
        Ok(self.values[when.index] as u32)
    }

    /// How many iterations `lp` ran ([`Error::BadArguments`] for a loop of another pipeline).
    pub fn iterations(&self, lp: PipeLoop) -> Result<u32> {
        if lp.pipeline != self.pipeline {
            return Err(Error::BadArguments {
                chain: "pipeline",
                reason: "the loop belongs to another pipeline".into(),
            });
        }
        Ok(self.values[lp.index] as u32)
    }

    /// Where `item` ran in a plan: its start and end on the GPU's clock (%globaltimer, ns; the
    /// last iteration's for an item of a loop). `None` for an item that ran at its push.
    pub fn device_span<R>(&self, item: PipeItem<R>) -> Option<(u64, u64)> {
        (item.pipeline == self.pipeline)
            .then(|| self.spans.get(item.index).copied().flatten())
            .flatten()
    }

    /// The plans' time on the GPU, from the first item's start to the last one's end, and the
    /// part of it that items ran (the sum of their spans): the rest went to the hand-offs
    /// between them. `None` when no item ran in a plan.
    pub fn device_time(&self) -> Option<DeviceTime> {
        let spans: Vec<(u64, u64)> = self.spans.iter().flatten().copied().collect();
        let first = spans.iter().map(|s| s.0).min()?;
        let last = spans.iter().map(|s| s.1).max()?;
        let busy: u64 = spans.iter().map(|s| s.1.saturating_sub(s.0)).sum();
        Some(DeviceTime {
            span: std::time::Duration::from_nanos(last.saturating_sub(first)),
            items: std::time::Duration::from_nanos(busy),
            count: spans.len(),
        })
    }

    /// Times the host handed work to the device and learnt of its end: one per plan (a domain's
    /// items of one dispatch, whatever their number and however many times their loops ran),
    /// and one per item run at its push (the CPU backend, the launched variants).
    pub fn round_trips(&self) -> u64 {
        self.round_trips
    }
}

fn address<T: crate::Element>(b: &Buffer<T>) -> usize {
    std::ptr::from_ref(b) as usize
}
