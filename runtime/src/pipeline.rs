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
use crate::chain::{Arg, Chain, ChainOutput, InputBuffer};
use crate::error::{Error, Result};
use crate::gpu::{Cell, Manifold};
use crate::runtime::Runtime;
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
#[derive(Debug)]
pub enum PipeArg<'p> {
    Input(&'static str, PipeInput<'p>),
    Output(&'static str, PipeOutput),
    F32(&'static str, f32),
    U32(&'static str, u32),
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
    fn in_flight(&self) -> Option<(&Arc<Manifold>, &Arc<Cell>)> {
        match self {
            Pending::Scalar(t) => t.in_flight(),
            Pending::Vector(t) => t.in_flight(),
        }
    }

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

/// Who last touched a buffer: the item that wrote it last, and the items that read it since.
#[derive(Default)]
struct Access {
    writer: Option<usize>,
    readers: Vec<usize>,
}

struct Entry {
    chain: &'static str,
    pending: Pending,
}

/// Items submitted in order, each free to read what an earlier one wrote, resolved together: see
/// the module documentation and [`Runtime::pipeline`].
pub struct Pipeline<'p> {
    rt: &'p Runtime,
    id: u64,
    outputs: Vec<&'p mut Buffer<f32>>,
    /// Dropped unwaited, each pending ticket waits for its item as it drops (bounded by the
    /// shutdown timeout), oldest first, before the borrows of the buffers end.
    entries: Vec<Entry>,
    /// Per buffer (its address: borrowed for 'p, it cannot move): who touched it last.
    access: HashMap<usize, Access>,
}

impl std::fmt::Debug for Pipeline<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Pipeline({} items, {} output buffers)",
            self.entries.len(),
            self.outputs.len()
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
        }
    }
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

    /// Items pushed so far.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no item was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Submits one item of chain `C` after every item pushed before it (what the generated
    /// `push` calls). Typed errors as `submit`'s, and [`Error::BadArguments`] for a handle of
    /// another pipeline or an item that reads the buffer it writes.
    pub fn push_chain<C>(&mut self, args: Vec<PipeArg<'p>>) -> Result<PipeItem<C::Output>>
    where
        C: Chain,
        C::Output: PipeOutputType,
    {
        let bad = |reason: String| Error::BadArguments {
            chain: C::NAME,
            reason,
        };
        // Which output buffer each argument names, and the buffers (by address) it reads and
        // writes, for the hazards.
        let mut written: Option<usize> = None;
        let mut read_outputs: Vec<usize> = Vec::new();
        let mut reads: Vec<usize> = Vec::new();
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
                    Source::Shared(b) => reads.push(b.address()),
                    Source::Output(k) => {
                        read_outputs.push(k);
                        reads.push(address(self.outputs[k]));
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
        let writes: Vec<usize> = written
            .map(|w| address(self.outputs[w]))
            .into_iter()
            .collect();

        // The earlier items this one must follow: the last writer of what it reads or writes, and
        // the readers since of what it writes.
        let mut after: Vec<usize> = Vec::new();
        for a in reads.iter().chain(&writes) {
            if let Some(acc) = self.access.get(a) {
                after.extend(acc.writer);
            }
        }
        for a in &writes {
            if let Some(acc) = self.access.get(a) {
                after.extend(&acc.readers);
            }
        }
        after.sort_unstable();
        after.dedup();
        let follow: Vec<(Arc<Manifold>, Arc<Cell>)> = after
            .iter()
            .filter_map(|&j| self.entries[j].pending.in_flight())
            .map(|(m, c)| (m.clone(), c.clone()))
            .collect();

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
        for a in args {
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
        let ticket = self.rt.submit_impl::<C>(submit_args, true, &follow)?;
        // The pipeline holds the buffers' borrows until every item has resolved (`wait`, or its
        // Drop): the ticket need not.
        let pending = C::Output::erase(ticket.detach()).0;
        let index = self.entries.len();
        self.entries.push(Entry {
            chain: C::NAME,
            pending,
        });
        for a in reads {
            self.access.entry(a).or_default().readers.push(index);
        }
        for a in writes {
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

    /// Waits for every item. The first item that failed fails the pipeline:
    /// [`Error::PipelineItem`] names it (the items after it ran on what it left, so they are not
    /// reported as results). Otherwise every item's result, by [`PipeResults::get`].
    pub fn wait(self) -> Result<PipeResults> {
        let mut values = Vec::with_capacity(self.entries.len());
        let mut first_failure: Option<Error> = None;
        for (index, e) in self.entries.into_iter().enumerate() {
            // Every item is waited, failed or not: the buffers stay borrowed until the last one.
            match e.pending.wait() {
                Ok(v) => values.push(v),
                Err(source) => {
                    values.push(f32::NAN);
                    if first_failure.is_none() {
                        first_failure = Some(Error::PipelineItem {
                            item: index,
                            chain: e.chain,
                            source: Box::new(source),
                        });
                    }
                }
            }
        }
        match first_failure {
            Some(e) => Err(e),
            None => Ok(PipeResults {
                pipeline: self.id,
                values,
            }),
        }
    }
}

/// Every item's result of a waited pipeline.
#[derive(Debug, Clone)]
pub struct PipeResults {
    pipeline: u64,
    values: Vec<f32>,
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
        Ok(R::from_value(self.values[item.index]))
    }
}

fn address<T: crate::Element>(b: &Buffer<T>) -> usize {
    std::ptr::from_ref(b) as usize
}
