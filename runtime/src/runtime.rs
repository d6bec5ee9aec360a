//! [`Runtime`]: picks a backend, owns the manifolds, validates and submits chains.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::Duration;

use pptm_spec::ArgKind;

use crate::buffer::Buffer;
use crate::chain::{Arg, Chain, Completion, DomainCode};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::gpu::abi::{PPTM_OP_NOOP, pptm_desc};
use crate::gpu::manifold::Gates;
use crate::gpu::signals::Signals;
use crate::gpu::{Device, Launcher, Manifold, WorkingMemory};
use crate::guard::{GuardBook, GuardNote, GuardStats};
use crate::host_pool::{HostBuffer, HostPool, HostPoolStats};
use crate::ticket::Ticket;

static NEXT_RUNTIME_ID: AtomicU64 = AtomicU64::new(1);

/// Where a submission goes.
enum Route<'r> {
    Cpu,
    Manifold(Resident<'r>),
    Launch(Arc<Launcher>),
}

/// How the GPU backend runs a chain's fused variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Variant {
    /// In the domain's persistent manifold, fed through the submission ring (what pptm is for).
    #[default]
    Fused,
    /// The same fused code, one ordinary kernel launch per item, waited for at submission: the
    /// baseline that separates what persistence buys from what fusion buys.
    FusedLaunched,
    /// Every stage its own kernel launch, one after another, each storing its output for the
    /// next (a pairwise stage stores its n×n values), waited for at submission: the debugging
    /// path and the baseline for what fusion buys.
    Unfused,
    /// The unfused launches, captured into a CUDA graph the first time an item (opcode, arguments,
    /// sizes) is seen and replayed after: the baseline for users who capture their launch
    /// sequence. Waited for at submission.
    UnfusedGraph,
}

/// A fault to inject (feature `fault-injection`; see [`Runtime::inject`]).
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injection {
    /// An item that never makes progress (it waits for the abort the watchdog sends).
    Hang,
    /// An item that runs this long, reporting progress as a long legitimate item does.
    Slow(Duration),
    /// An item that stores to an illegal address (page 1): a real device fault, which CUDA makes
    /// sticky for the whole process.
    Fault,
    /// The chain's own variant with misaligned pointers: the device's argument checks refuse it
    /// with a status word, and the manifold carries on.
    MisalignedArgument,
}

/// How `submit_impl` takes an item.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SubmitMode {
    /// Waits for a free queue slot.
    Blocking,
    /// [`Error::QueueFull`] instead of waiting.
    Try,
    /// Records it for a pipeline's plan when it would go to a manifold.
    Plan,
}

impl From<bool> for SubmitMode {
    fn from(blocking: bool) -> Self {
        if blocking {
            SubmitMode::Blocking
        } else {
            SubmitMode::Try
        }
    }
}

/// What `submit_impl` did with an item.
pub(crate) enum Routed<'a, R: crate::chain::ChainOutput> {
    /// Submitted, or run already (the CPU backend, the launched variants).
    Ran(Ticket<'a, R>),
    /// Recorded for a plan (`SubmitMode::Plan`).
    Planned(PlannedItem),
}

impl<'a, R: crate::chain::ChainOutput> Routed<'a, R> {
    fn into_ticket(self) -> Ticket<'a, R> {
        match self {
            Routed::Ran(t) => t,
            Routed::Planned(_) => unreachable!("only SubmitMode::Plan records"),
        }
    }
}

/// An item a pipeline records for a plan: its descriptor, and what the plan needs to know.
pub(crate) struct PlannedItem {
    pub code: &'static DomainCode,
    /// As a step of a plan (`blocks`: a light map step spreads wider than alone).
    pub desc: pptm_desc,
    /// Blocks the item asks for when it is dispatched alone (a plan of one step).
    pub alone_blocks: u32,
    /// A map chain with no reduction, which runs as a light step (`PPTM_STEP_LIGHT`) unless a
    /// later step waits for it: `Some(whether it checks its values are finite)`.
    pub light: Option<bool>,
    pub guard: Option<GuardNote>,
    /// For a chain of the map pattern, how its elements fall to blocks.
    pub tile: Option<Tile>,
    /// The domain's working memory the item uses (address, bytes): its pipeline orders it
    /// after the earlier items that use the same, as a writer of that buffer.
    pub scratch: Option<(usize, usize)>,
}

/// How a map-pattern item spreads its elements over blocks: two items with equal tiles give each
/// element, in every buffer of that many elements, to the same block (the patterns stride the
/// same way over the same count; 16-byte loads only when every buffer is aligned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tile {
    pub elements: usize,
    pub blocks: u32,
    /// The pass's grain (`ChainIr::map_elems_per_block`): a light pass strides over the
    /// elements, a heavy one gives each block a run of them, so only equal grains line up.
    pub per_block: usize,
    pub aligned: bool,
}

/// Runtime settings. `Config::default()` suits most uses.
#[derive(Debug, Clone)]
pub struct Config {
    /// GPU ordinal.
    pub device: usize,
    /// Submission/completion slots per manifold: the most items in flight (power of two, 2..=65536).
    pub queue_slots: u32,
    /// Blocks per SM of each manifold (capped by what the occupancy API says fits).
    pub blocks_per_sm: u32,
    /// Use at most this many SMs' worth of blocks, leaving the rest to the application's kernels.
    pub max_sms: Option<u32>,
    /// Empty polls of the submission ring before an idle manifold starts to back off.
    pub hot_polls: u32,
    /// Longest pause between two polls of an idle manifold (latency of the first item after idling).
    pub max_backoff: Duration,
    /// How long a blocking submit waits for a free slot before [`Error::Timeout`].
    pub submit_timeout: Duration,
    /// How long shutdown (and dropping a pending ticket) waits for the device. Default 5 s, or
    /// `PPTM_SHUTDOWN_TIMEOUT_MS`.
    pub shutdown_timeout: Duration,
    /// How long a manifold may take to become resident before its launch is cancelled.
    pub launch_timeout: Duration,
    /// The watchdog's deadline: pending work with no progress for this long (no item completing,
    /// no tile finishing inside the running item) fails every pending item with [`Error::Hang`]
    /// and stops the manifold; the next submission launches a new one. `None` turns it off.
    /// Default 100 ms, or `PPTM_WATCHDOG_MS` (`0`: off).
    pub watchdog: Option<Duration>,
    /// Fetcher warps polling the submission ring at staggered times (1..=8): more see a new item
    /// sooner, at the cost of more PCIe reads while busy. On an H200, two gave the lowest no-op
    /// round trip and four a higher one (the polls compete with the host's writes).
    pub fetch_pollers: u32,
    /// SMs' worth of compute blocks for named domains when several start together
    /// ([`Runtime::prepare_domains`]); domains not named share the rest equally (or overlap:
    /// [`Config::overlap_domains`]).
    pub domain_sms: Vec<(String, u32)>,
    /// Whether domains that start together without a named share each take the SMs they would
    /// alone (`max_sms`, or all) where one block of every domain fits on an SM at once, blocks of
    /// the domains then sharing each SM, instead of an equal split. A pipeline that alternates
    /// between domains then runs each step on the whole GPU (examples/active_inference_step.rs
    /// at 4096 x 4096 on an H200: 7.1 ms a step against 10.7 on halves). The cost: the manifolds
    /// hold every SM slot (two domains of two blocks an SM), so the application's kernels, the
    /// launched variants and other runtimes' kernels wait for them to park, and the manifolds'
    /// cooperative launch fails ([`Error::Launch`]) while such a kernel holds a slot. Default
    /// `false`, or `PPTM_OVERLAP_DOMAINS=1` for `true`.
    pub overlap_domains: bool,
    /// How the GPU backend runs chains (the CPU backend ignores it).
    pub variant: Variant,
    /// After this long with no item in flight and none submitted, the runtime *parks*: its
    /// manifolds drain and exit, so that the application's driver calls that wait for every
    /// kernel on the GPU (a module load, `cuMemFree`, a library's handle; docs/embedding.md) go on
    /// instead of waiting for ever. The next item launches them again (about a millisecond).
    /// `None`: resident until shutdown (such calls must then go inside [`Runtime::quiesce`]).
    /// Default 100 ms, or `PPTM_PARK_MS` (`0`: never). Persistent-manifold variant only.
    pub park_when_idle: Option<Duration>,
    /// Bytes of each manifold's two plan arenas (one in pinned host memory, one on the device),
    /// where pipelines' plans live while they run: about 230 bytes a step, plus 8 a block for a
    /// step of several blocks. Default 4 MiB (some 15,000 steps in flight per domain).
    pub plan_arena_bytes: usize,
    /// How long an item may wait on the GPU for an application stream
    /// ([`Runtime::wait_for_stream`]) before the watchdog may take the wait for a hang. Default
    /// 10 s.
    pub stream_patience: Duration,
    /// Idle bytes the pool of host buffers keeps for reuse ([`Runtime::host_buffer`]); a buffer
    /// dropped beyond that is freed. Default 1 GiB.
    pub host_pool_bytes: usize,
    /// Whether a manifold runs independent items side by side: an item that needs fewer blocks
    /// than the grid starts on free blocks while earlier items still run. Items submitted as
    /// tickets are independent (their buffers are borrowed, so no two in flight conflict); a
    /// pipeline's plan, a wait for an application stream ([`Runtime::wait_for_stream`]) and an
    /// item that needs the runtime's working memory (`precision = "bf16x3"`) still run after
    /// every earlier item and before every later one. `false`: every item in order, one at a
    /// time. Default `true`, or `PPTM_SIDE_BY_SIDE=0` for `false`.
    pub side_by_side: bool,
    /// Whether a pipeline's elementwise steps with no reduction run as light steps on the
    /// manifolds: spread one 16-byte chunk a thread, their blocks not meeting at their end where
    /// no later step waits for them (docs/pipelines.md, "Ordering"). `false`: such steps take the
    /// blocks they take alone, and every step of several blocks ends with its blocks' arrival
    /// (for comparisons). Default `true`, or `PPTM_LIGHT_STEPS=0` for `false`.
    pub light_steps: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            device: 0,
            queue_slots: 256,
            blocks_per_sm: 1,
            max_sms: None,
            hot_polls: 4096,
            max_backoff: Duration::from_micros(20),
            submit_timeout: Duration::from_secs(10),
            shutdown_timeout: ms_from_env("PPTM_SHUTDOWN_TIMEOUT_MS")
                .map_or(Duration::from_secs(5), Duration::from_millis),
            launch_timeout: Duration::from_secs(2),
            watchdog: watchdog_from_env().unwrap_or(Some(Duration::from_millis(100))),
            fetch_pollers: 2,
            domain_sms: Vec::new(),
            overlap_domains: std::env::var("PPTM_OVERLAP_DOMAINS").is_ok_and(|v| v.trim() == "1"),
            variant: Variant::Fused,
            stream_patience: Duration::from_secs(10),
            plan_arena_bytes: 4 << 20,
            host_pool_bytes: 1 << 30,
            side_by_side: std::env::var("PPTM_SIDE_BY_SIDE").map_or(true, |v| v.trim() != "0"),
            light_steps: std::env::var("PPTM_LIGHT_STEPS").map_or(true, |v| v.trim() != "0"),
            park_when_idle: ms_from_env("PPTM_PARK_MS")
                .map_or(Some(Duration::from_millis(100)), |ms| {
                    (ms > 0).then(|| Duration::from_millis(ms))
                }),
        }
    }
}

/// `PPTM_WATCHDOG_MS=n` sets the default watchdog deadline (`0` turns it off), e.g. for runs
/// under compute-sanitizer, whose kernels are many times slower.
fn watchdog_from_env() -> Option<Option<Duration>> {
    let ms = ms_from_env("PPTM_WATCHDOG_MS")?;
    Some((ms > 0).then(|| Duration::from_millis(ms)))
}

/// A number of milliseconds from the environment variable `var`; None when unset or not a number.
fn ms_from_env(var: &str) -> Option<u64> {
    std::env::var(var).ok()?.trim().parse().ok()
}

impl Config {
    fn validate(&self) -> Result<()> {
        if !self.queue_slots.is_power_of_two() || !(2..=65536).contains(&self.queue_slots) {
            return Err(Error::Config(format!(
                "queue_slots = {} is not a power of two in 2..=65536",
                self.queue_slots
            )));
        }
        if self.blocks_per_sm == 0 {
            return Err(Error::Config("blocks_per_sm must be at least 1".into()));
        }
        if !(1..=8).contains(&self.fetch_pollers) {
            return Err(Error::Config(format!(
                "fetch_pollers = {} is not in 1..=8",
                self.fetch_pollers
            )));
        }
        if !(64 << 10..=1 << 34).contains(&self.plan_arena_bytes) {
            return Err(Error::Config(format!(
                "plan_arena_bytes = {} is not in 64 KiB ..= 16 GiB",
                self.plan_arena_bytes
            )));
        }
        if self.max_sms == Some(0) {
            return Err(Error::Config("max_sms must be at least 1".into()));
        }
        if self
            .park_when_idle
            .is_some_and(|d| d < Duration::from_millis(1))
        {
            return Err(Error::Config(
                "park_when_idle must be at least 1 ms (or None to stay resident)".into(),
            ));
        }
        if self.watchdog.is_some_and(|d| d < Duration::from_millis(1)) {
            return Err(Error::Config(
                "watchdog must be at least 1 ms (or None to turn it off)".into(),
            ));
        }
        Ok(())
    }
}

/// Which backend a runtime runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// f64 reference code on the host.
    Cpu,
    /// Persistent manifolds on a CUDA GPU.
    Gpu,
}

enum Backend {
    Cpu {
        why: String,
        /// Every chain through the whole-tensor f64 reference (`Runtime::cpu_reference`), not
        /// the fused per-element path.
        reference: bool,
    },
    Gpu {
        device: Arc<Device>,
        /// The running manifolds, shared with the thread that parks them when idle.
        fleet: Arc<Fleet>,
        /// That thread (`Config::park_when_idle`), joined when the runtime drops.
        parker: Option<std::thread::JoinHandle<()>>,
        /// The thread inside [`Runtime::quiesce`]'s closure, whose submissions are refused.
        quiescer: Mutex<Option<std::thread::ThreadId>>,
        /// Re-partitions done to start a domain on demand.
        repartitions: AtomicU64,
        /// `Variant::FusedLaunched` only.
        launchers: Mutex<HashMap<&'static str, Arc<Launcher>>>,
        /// Words that order items and application streams on the GPU (gpu/signals.rs).
        signals: Arc<Signals>,
        /// Application stream points every later item follows ([`Runtime::wait_for_stream`]).
        gates: Gates,
        /// Memory lent to items (a bf16x3 product's split operands), by domain (gpu/working.rs).
        working: Box<WorkingMemory>,
    },
}

/// A runtime's running manifolds, and what parks them when the runtime is idle.
struct Fleet {
    /// Shared by a submission from finding its manifold to pushing the item; held alone to
    /// start, drain or park manifolds, so that no item is pushed to a manifold being drained.
    gate: RwLock<()>,
    manifolds: Mutex<HashMap<&'static str, Arc<Manifold>>>,
    /// Domains drained because the runtime was idle (`Config::park_when_idle`): the next item
    /// launches them again, together, on the same shares.
    parked: Mutex<Vec<Share>>,
    /// When an item was last pushed, in ns since `epoch`.
    last_push: AtomicU64,
    epoch: std::time::Instant,
    parks: AtomicU64,
    /// Tells the parker thread to end.
    stop: std::sync::atomic::AtomicBool,
}

impl Fleet {
    fn new() -> Self {
        Fleet {
            gate: RwLock::new(()),
            manifolds: Mutex::new(HashMap::new()),
            parked: Mutex::new(Vec::new()),
            last_push: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            parks: AtomicU64::new(0),
            stop: Default::default(),
        }
    }

    fn pushed(&self) {
        let now = self.epoch.elapsed().as_nanos() as u64;
        self.last_push.store(now, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let now = self.epoch.elapsed().as_nanos() as u64;
        Duration::from_nanos(now.saturating_sub(self.last_push.load(Ordering::Relaxed)))
    }

    /// Takes the parked domains, with their shares, to launch them again.
    fn take_parked(&self) -> Vec<Share> {
        std::mem::take(&mut *self.parked.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The parker thread: every quarter of `idle` (between 1 and 50 ms) it looks whether the runtime
/// has had no item in flight and none pushed for `idle`; then it drains every manifold (they
/// exit), so that the application's driver calls that wait for every kernel on the GPU (a module
/// load, `cuMemFree`, a library's handle) can go on. The next item launches them again.
fn park_when_idle(fleet: std::sync::Weak<Fleet>, idle: Duration) {
    let look = (idle / 4).clamp(Duration::from_millis(1), Duration::from_millis(50));
    loop {
        std::thread::park_timeout(look);
        let Some(f) = fleet.upgrade() else { return };
        if f.stop.load(Ordering::Acquire) {
            return;
        }
        if f.idle_for() < idle {
            continue;
        }
        // Not while a submission holds the gate (it is about to push), nor inside quiesce.
        let _alone = match f.gate.try_write() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => continue,
        };
        let mut m = f.manifolds.lock().unwrap_or_else(|e| e.into_inner());
        if m.is_empty() || f.idle_for() < idle {
            continue;
        }
        if !m.values().all(|x| x.is_idle()) {
            // Items in flight count as activity: idle time starts when they are done.
            f.pushed();
            continue;
        }
        let started = std::time::Instant::now();
        match drain(&mut m) {
            Ok(domains) => {
                tracing::debug!(
                    manifolds = domains.len(),
                    took_us = started.elapsed().as_micros() as u64,
                    "parked the idle runtime's manifolds"
                );
                f.parked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(domains);
                f.parks.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!("parking the idle runtime's manifolds: {e}"),
        }
    }
}

/// A running manifold, borrowed to push an item: while it lives no re-partition or quiesce can
/// drain the manifold.
struct Resident<'a> {
    _shared: RwLockReadGuard<'a, ()>,
    manifold: Arc<Manifold>,
}

/// Drains every manifold in `m` (each asked before any is waited for: they drain at once, and
/// under compute-sanitizer, which processes a kernel's end only once the device is idle, waiting
/// for one while the others ran hung; Manifold::begin_shutdown) and returns their domains. Every
/// item submitted to them completes first. Manifolds the watchdog aborted are dropped.
fn drain(m: &mut HashMap<&'static str, Arc<Manifold>>) -> Result<Vec<Share>> {
    let all: Vec<Arc<Manifold>> = m.drain().map(|(_, x)| x).collect();
    let mut domains: Vec<Share> = all
        .iter()
        .filter(|x| !x.was_aborted())
        .map(|x| (x.code, x.share))
        .collect();
    domains.sort_by_key(|(d, _)| d.key);
    let requests: Vec<_> = all.iter().map(|x| x.begin_shutdown()).collect();
    let mut first_err = None;
    for r in requests {
        if let Err(e) = r.finish() {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(domains), Err)
}

/// A drained manifold's domain and the SMs it had (`None`: the whole GPU, or `Config::max_sms`).
type Share = (&'static DomainCode, Option<u32>);

/// The domains of a list of drained manifolds.
fn codes(shares: &[Share]) -> Vec<&'static DomainCode> {
    shares.iter().map(|&(d, _)| d).collect()
}

/// Whether this thread is running [`Runtime::quiesce`]'s closure (it holds the gate alone, so it
/// must neither submit nor take the gate again).
/// The SM shares of domains that start together ([`Runtime::prepare_domains`]), and the SMs'
/// worth of slots their grids (compute blocks + the fetcher) take beside `running` already
/// taken: `named` shares first; the others, with `Config::overlap_domains`, the SMs they would
/// take alone (`max_sms`, or all) where one block of every domain fits on an SM at once (`fit`:
/// the blocks of each domain that fit on an SM), else an equal split of what the named ones
/// leave. Either is made smaller where the fetchers would not fit beside it (two domains whose
/// blocks take a whole SM each: 65 + 1 and 65 + 1 of 132 SMs, not 66 + 1 twice; two that
/// overlap and fit two blocks an SM: 131 + 1 each). The caller refuses a zero share or
/// `running + wanted` above `total`.
///
/// Sharing every SM lets a pipeline that alternates between domains run each step on the whole
/// GPU instead of its domain's part: examples/active_inference_step.rs at 4096 x 4096 on an
/// H200, 7.1 ms a step against 10.7 with halves. It is not the default because the manifolds then
/// hold every SM slot: with it on by default, 17 tests of tests/pipeline.rs failed in one H200
/// run (not diagnosed; likely the fused runtime's manifolds not becoming resident beside the
/// launched variants' kernels of the tests running at the same time).
fn sm_shares(
    cfg: &Config,
    total: u32,
    fit: &[u32],
    named: &[Option<u32>],
    running: f64,
) -> (Vec<u32>, f64) {
    let taken: u32 = named.iter().flatten().sum();
    let unnamed = named.iter().filter(|s| s.is_none()).count() as u32;
    let left = total.saturating_sub(taken);
    let sms_of = |blocks: u32, f: u32| f64::from(blocks) / f64::from(f.max(1));
    let shares_with =
        |equal: u32| -> Vec<u32> { named.iter().map(|s| s.unwrap_or(equal)).collect() };
    let wanted_by = |shares: &[u32]| -> f64 {
        shares
            .iter()
            .zip(fit)
            .map(|(&s, &f)| sms_of(s.min(total) * cfg.blocks_per_sm.min(f) + 1, f))
            .sum()
    };
    let per_sm_load: f64 = fit
        .iter()
        .map(|&f| f64::from(cfg.blocks_per_sm.min(f)) / f64::from(f.max(1)))
        .sum();
    let overlap = cfg.overlap_domains && fit.len() > 1 && per_sm_load <= 1.0 + 1e-9;
    let mut equal = if overlap {
        cfg.max_sms.map_or(total, |m| m.clamp(1, total))
    } else {
        left.checked_div(unnamed).unwrap_or(0)
    };
    while unnamed > 0
        && equal > 1
        && running + wanted_by(&shares_with(equal)) > f64::from(total) + 1e-9
    {
        equal -= 1;
    }
    let shares = shares_with(equal);
    let wanted = wanted_by(&shares);
    (shares, wanted)
}

/// The fleet's gate, shared (what every submission holds while it pushes). Uncontended on the
/// submission path; only when the gate is held alone (a re-partition, shutdown or quiesce) does it
/// ask whether this very thread holds it inside quiesce's closure, where waiting would never end.
fn shared_gate<'g>(
    gate: &'g RwLock<()>,
    quiescer: &Mutex<Option<std::thread::ThreadId>>,
) -> Result<RwLockReadGuard<'g, ()>> {
    match gate.try_read() {
        Ok(g) => Ok(g),
        Err(std::sync::TryLockError::Poisoned(e)) => Ok(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => {
            if inside_quiesce(quiescer) {
                return Err(Error::Quiesced);
            }
            Ok(gate.read().unwrap_or_else(|e| e.into_inner()))
        }
    }
}

fn inside_quiesce(quiescer: &Mutex<Option<std::thread::ThreadId>>) -> bool {
    *quiescer.lock().unwrap_or_else(|e| e.into_inner()) == Some(std::thread::current().id())
}

/// Loads the module of every domain linked into the binary, and `code`'s, before a first manifold
/// starts: a load waits for every kernel on the GPU, and a resident manifold's never ends. Only
/// `code`'s failure is an error here; another domain's shows when it is used.
fn load_linked_modules(device: &Arc<Device>, code: &'static DomainCode) -> Result<()> {
    device.module(code)?;
    for d in crate::chain::linked_domains() {
        if let Err(e) = device.module(d) {
            tracing::warn!(domain = d.name, "cannot load a linked domain's module: {e}");
        }
    }
    Ok(())
}

/// The entry point: owns a backend and, on the GPU, one resident manifold per domain in use.
///
/// Manifolds launch on the first submission to their domain (or on [`Runtime::prepare`]), and stay
/// resident until the runtime is dropped, which drains every submitted item first.
pub struct Runtime {
    id: u64,
    config: Config,
    backend: Backend,
    /// The accuracy guard's shapes and counters (chains with a `tolerance` stage).
    guards: Arc<GuardBook>,
    /// Host buffers for direct copies ([`Runtime::host_buffer`]): pinned on the GPU backend.
    host_pool: Arc<HostPool>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Free and total bytes of a runtime's memory ([`Runtime::memory_info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes free now.
    pub free_bytes: usize,
    /// Bytes in all.
    pub total_bytes: usize,
}

/// The host's available and total memory, from `/proc/meminfo` (Linux).
fn host_memory_info() -> Result<(usize, usize)> {
    let text = std::fs::read_to_string("/proc/meminfo").map_err(|e| Error::Unsupported {
        what: format!("reading the host's memory size (/proc/meminfo: {e})"),
    })?;
    parse_meminfo(&text).ok_or_else(|| Error::Unsupported {
        what: "reading the host's memory size (/proc/meminfo has no MemTotal/MemAvailable)".into(),
    })
}

/// (MemAvailable, MemTotal) in bytes from the text of `/proc/meminfo`.
fn parse_meminfo(text: &str) -> Option<(usize, usize)> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<usize>().ok())
            .map(|kb| kb * 1024)
    };
    Some((field("MemAvailable")?, field("MemTotal")?))
}

/// The GPU a runtime runs on ([`Runtime::gpu_info`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// The CUDA device ordinal.
    pub ordinal: usize,
    /// The driver's name for it ("NVIDIA H200").
    pub name: String,
    /// (major, minor): (9, 0) on Hopper, where wgmma paths exist.
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors.
    pub sm_count: u32,
}

impl Runtime {
    /// A runtime on the GPU if one is usable, else on the CPU; [`Runtime::describe`] says which
    /// and why. `PPTM_BACKEND=cpu` or `=gpu` forces a backend (`gpu` fails without a GPU).
    pub fn new() -> Result<Self> {
        Self::with_config(Config::default())
    }

    /// As [`Runtime::new`], with settings.
    pub fn with_config(config: Config) -> Result<Self> {
        config.validate()?;
        match std::env::var("PPTM_BACKEND").ok().as_deref() {
            Some("cpu") => Ok(Self::cpu_because(config, "PPTM_BACKEND=cpu".into())),
            Some("gpu") => Self::gpu_with(config),
            None | Some("") | Some("auto") => match Self::gpu_with(config.clone()) {
                Ok(rt) => Ok(rt),
                Err(Error::NoGpu(why)) => Ok(Self::cpu_because(config, why)),
                // A driver that is installed but fails to start: the application still runs, on
                // the CPU, and the log and `describe` say the GPU is broken, not absent.
                Err(e @ Error::Driver { call: "cuInit", .. }) => {
                    tracing::warn!("pptm: the CUDA driver failed to start, using the CPU: {e}");
                    Ok(Self::cpu_because(
                        config,
                        format!("the CUDA driver failed: {e}"),
                    ))
                }
                Err(e) => Err(e),
            },
            Some(other) => Err(Error::Config(format!(
                "PPTM_BACKEND={other}: expected cpu, gpu or auto"
            ))),
        }
    }

    /// A runtime on the CPU backend.
    pub fn cpu() -> Self {
        Self::cpu_because(Config::default(), "requested".into())
    }

    /// The CPU backend running every chain through the whole-tensor f64 reference, one stage at
    /// a time, with its inputs widened to f64 first: what tests hold the fast path (elementwise
    /// stages fused per element, in parallel chunks) against. Slower, and exact in the same way.
    pub fn cpu_reference() -> Self {
        let mut rt = Self::cpu_because(Config::default(), "requested".into());
        if let Backend::Cpu { reference, .. } = &mut rt.backend {
            *reference = true;
        }
        rt
    }

    fn cpu_because(config: Config, why: String) -> Self {
        let host_pool = HostPool::new(None, config.host_pool_bytes);
        let rt = Runtime {
            id: NEXT_RUNTIME_ID.fetch_add(1, Ordering::Relaxed),
            config,
            backend: Backend::Cpu {
                why,
                reference: false,
            },
            guards: Arc::default(),
            host_pool,
        };
        tracing::info!("pptm: {}", rt.describe());
        rt
    }

    /// A runtime on the GPU; [`Error::NoGpu`] when there is none.
    pub fn gpu() -> Result<Self> {
        Self::gpu_with(Config::default())
    }

    /// One runtime on each GPU of the host, in device order, each with `config`'s settings and
    /// its own `device`: a group to shard independent batch work over (examples/spectra.rs
    /// `--gpus`). No GPU is [`Error::NoGpu`]. Each runtime is independent (its own manifolds,
    /// buffers and queue); a buffer belongs to the runtime that made it, and
    /// [`Buffer::copy_from`] gathers results from one GPU's buffers into another's, peer to peer
    /// where the GPUs allow it (enabled here for every pair, before any manifold runs).
    pub fn every_gpu(config: &Config) -> Result<Vec<Self>> {
        let all = (0..Device::count()?)
            .map(|device| {
                Self::gpu_with(Config {
                    device,
                    ..config.clone()
                })
            })
            .collect::<Result<Vec<Self>>>()?;
        // Peer access for every pair, now that no manifold runs yet ([`Buffer::copy_from`]).
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                if let (Some(da), Some(db)) = (a.gpu_device(), b.gpu_device()) {
                    da.enable_peer_access(db);
                }
            }
        }
        Ok(all)
    }

    /// As [`Runtime::gpu`], with settings.
    pub fn gpu_with(config: Config) -> Result<Self> {
        config.validate()?;
        let device = Device::open(config.device)?;
        let signals = Signals::new(&device, config.shutdown_timeout)?;
        let fleet = Arc::new(Fleet::new());
        let parker = match (config.park_when_idle, config.variant) {
            (Some(idle), Variant::Fused) => {
                let weak = Arc::downgrade(&fleet);
                Some(
                    std::thread::Builder::new()
                        .name("pptm-parker".into())
                        .spawn(move || park_when_idle(weak, idle))
                        .map_err(|e| {
                            Error::Config(format!("cannot start the parker thread: {e}"))
                        })?,
                )
            }
            _ => None,
        };
        let host_pool = HostPool::new(Some(device.clone()), config.host_pool_bytes);
        let rt = Runtime {
            id: NEXT_RUNTIME_ID.fetch_add(1, Ordering::Relaxed),
            config,
            host_pool,
            backend: Backend::Gpu {
                working: Box::new(WorkingMemory::new(device.clone())),
                device,
                fleet,
                parker,
                quiescer: Mutex::new(None),
                repartitions: AtomicU64::new(0),
                launchers: Mutex::new(HashMap::new()),
                signals,
                gates: Gates::default(),
            },
            guards: Arc::default(),
        };
        tracing::info!("pptm: {}", rt.describe());
        Ok(rt)
    }

    /// Which backend runs this runtime's chains: the GPU, or the CPU's f64 reference code.
    pub fn backend(&self) -> BackendKind {
        match self.backend {
            Backend::Cpu { .. } => BackendKind::Cpu,
            Backend::Gpu { .. } => BackendKind::Gpu,
        }
    }

    /// The configuration the runtime was made with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// One line saying which backend runs, on what, and why.
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Cpu {
                why,
                reference: false,
            } => format!("CPU backend (f64, elementwise chains in parallel; {why})"),
            Backend::Cpu {
                why,
                reference: true,
            } => format!("CPU backend (f64 whole-tensor reference; {why})"),
            Backend::Gpu { device, fleet, .. } => {
                let mut s = format!(
                    "GPU backend: device {} {} (sm_{}{}, {} SMs)",
                    device.ordinal, device.name, device.cc.0, device.cc.1, device.sm_count
                );
                match self.config.variant {
                    Variant::Fused => {}
                    Variant::FusedLaunched => {
                        s.push_str("; fused variants as one kernel launch per item")
                    }
                    Variant::Unfused => s.push_str("; unfused: one kernel launch per stage"),
                    Variant::UnfusedGraph => s.push_str(
                        "; unfused: one kernel launch per stage, replayed as a CUDA graph",
                    ),
                }
                let m = fleet.manifolds.lock().unwrap_or_else(|e| e.into_inner());
                let mut names: Vec<_> = m.values().map(|m| format!("{m:?}")).collect();
                names.sort();
                if !names.is_empty() {
                    s.push_str(&format!("; {}", names.join(", ")));
                }
                s
            }
        }
    }

    /// The GPU this runtime runs on; `None` on the CPU backend.
    pub fn gpu_info(&self) -> Option<GpuInfo> {
        self.gpu_device().map(|d| GpuInfo {
            ordinal: d.ordinal,
            name: d.name.clone(),
            compute_capability: (d.cc.0 as u32, d.cc.1 as u32),
            sm_count: d.sm_count,
        })
    }

    pub(crate) fn gpu_device(&self) -> Option<&Arc<Device>> {
        match &self.backend {
            Backend::Gpu { device, .. } => Some(device),
            Backend::Cpu { .. } => None,
        }
    }

    /// A buffer holding a copy of `data`.
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<Buffer<T>> {
        match &self.backend {
            Backend::Cpu { .. } => Buffer::host(self.id, Some(data), data.len()),
            Backend::Gpu { device, .. } => {
                let mut b = Buffer::device(self.id, device, data.len(), 0)?;
                b.write(data)?;
                Ok(b)
            }
        }
    }

    /// A host buffer of `len` elements from this runtime's pool: pinned on the GPU backend, so
    /// [`Buffer::read_to_host`] and [`Buffer::write_from_host`] copy straight between it and the
    /// device. Memory a dropped host buffer gave back is reused (then it holds what its last user
    /// left); new memory is zeroed. See [`crate::host_pool`].
    pub fn host_buffer<T: Element>(&self, len: usize) -> Result<HostBuffer<T>> {
        self.host_pool.take(len)
    }

    /// What the pool of host buffers has allocated, reused and holds.
    pub fn host_pool_stats(&self) -> HostPoolStats {
        self.host_pool.stats()
    }

    /// Frees every idle host buffer of the pool now. (On the GPU backend, while a manifold is
    /// resident the pinned memory is released when the last one stops: `cuMemFreeHost` waits
    /// for every running kernel.)
    pub fn trim_host_pool(&self) {
        self.host_pool.trim()
    }

    /// Whether [`Buffer::copy_from`] between this runtime's buffers and `other`'s goes straight
    /// between the devices: the same GPU, or two GPUs with peer access (enabled now if neither
    /// runs a manifold; [`Runtime::every_gpu`] enables it for every pair it opens). `false` when
    /// either runtime is on the CPU backend.
    pub fn peer_access(&self, other: &Runtime) -> bool {
        match (self.gpu_device(), other.gpu_device()) {
            (Some(a), Some(b)) => a.enable_peer_access(b),
            _ => false,
        }
    }

    /// Free and total bytes of the memory this runtime's buffers live in: the GPU's memory as the
    /// driver counts it, or on the CPU backend the host's available and total memory
    /// (`/proc/meminfo`; elsewhere [`Error::Unsupported`]). A planner sizes its tiles to a
    /// fraction of the free bytes ([`crate::tiles::TilePlanner`]).
    pub fn memory_info(&self) -> Result<MemoryInfo> {
        let (free_bytes, total_bytes) = match &self.backend {
            Backend::Gpu { device, .. } => device.memory_info()?,
            Backend::Cpu { .. } => host_memory_info()?,
        };
        Ok(MemoryInfo {
            free_bytes,
            total_bytes,
        })
    }

    /// A zeroed buffer of `len` elements.
    pub fn alloc<T: Element>(&self, len: usize) -> Result<Buffer<T>> {
        match &self.backend {
            Backend::Cpu { .. } => Buffer::host(self.id, None, len),
            Backend::Gpu { device, .. } => Buffer::device(self.id, device, len, 0),
        }
    }

    /// The running manifold of `code`'s domain, started now if it is not running; `None` on the
    /// CPU backend. The item must be pushed while the returned [`Resident`] lives: it keeps a
    /// re-partition or [`Runtime::quiesce`] from draining the manifold in between.
    ///
    /// Starting a domain beside running manifolds re-partitions the GPU: they are drained (every
    /// item submitted to them completes), then all of them and the new one are launched together
    /// with new shares of the SMs, as [`Runtime::prepare_domains`] shares them. The first
    /// manifold's start loads every domain linked into the binary ([`crate::linked_domains`])
    /// first: a module load waits for every kernel on the GPU, a resident manifold's never ends.
    fn manifold(&self, code: &'static DomainCode) -> Result<Option<Resident<'_>>> {
        let Backend::Gpu {
            device,
            fleet,
            quiescer,
            repartitions,
            signals,
            ..
        } = &self.backend
        else {
            return Ok(None);
        };
        let Fleet {
            gate, manifolds, ..
        } = &**fleet;
        loop {
            {
                let shared = shared_gate(gate, quiescer)?;
                let m = manifolds.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(existing) = m.get(code.key) {
                    // One the watchdog aborted has returned: a new one takes its place. Any other
                    // stopped manifold keeps answering with the reason it stopped.
                    if !existing.was_aborted() {
                        return Ok(Some(Resident {
                            _shared: shared,
                            manifold: existing.clone(),
                        }));
                    }
                }
            }
            // Starting one: alone, with no submission between looking and launching.
            let _alone = gate.write().unwrap_or_else(|e| e.into_inner());
            let mut m = manifolds.lock().unwrap_or_else(|e| e.into_inner());
            match m.get(code.key) {
                Some(existing) if !existing.was_aborted() => continue, // another thread started it
                Some(aborted) => {
                    tracing::info!(
                        domain = code.name,
                        "relaunching the manifold after an abort"
                    );
                    let share = aborted.share;
                    m.remove(code.key);
                    let launched = Manifold::launch(device, code, &self.config, share, signals)?;
                    m.insert(code.key, launched);
                }
                None if m.is_empty() => {
                    let parked = fleet.take_parked();
                    if parked.is_empty() {
                        load_linked_modules(device, code)?;
                        let launched = Manifold::launch(device, code, &self.config, None, signals)?;
                        m.insert(code.key, launched);
                    } else {
                        // Parked while idle: all of them come back, on the same shares (and a
                        // domain not among them re-partitions as usual, on the next pass).
                        let started = std::time::Instant::now();
                        self.relaunch(device, &mut m, &parked)?;
                        tracing::debug!(
                            manifolds = parked.len(),
                            took_us = started.elapsed().as_micros() as u64,
                            "relaunched the parked manifolds"
                        );
                    }
                }
                None => {
                    let started = std::time::Instant::now();
                    let mut domains = codes(&drain(&mut m)?);
                    domains.push(code);
                    self.start_domains(device, &mut m, &domains)?;
                    repartitions.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        domain = code.name,
                        manifolds = domains.len(),
                        took_us = started.elapsed().as_micros() as u64,
                        "re-partitioned the GPU to start a domain on demand"
                    );
                }
            }
        }
    }

    /// The CUDA context pptm runs in: the primary context of its GPU (the one cudarc's
    /// `CudaContext::new`, the CUDA runtime API and most libraries use); `None` on the CPU
    /// backend. Make it current on a thread before driver calls that touch pptm's buffers.
    pub fn cuda_context(&self) -> Option<cudarc::driver::sys::CUcontext> {
        self.gpu_device().map(|d| d.context())
    }

    /// Orders every item submitted after this call returns, to any domain, after the work
    /// enqueued on `stream` so far, on the GPU and without blocking the host: pptm enqueues a
    /// write of a signal word on `stream` (`cuStreamWriteValue64`, which makes that work's memory
    /// writes visible first), and the next item of each manifold waits on the GPU until the word
    /// is written. The application may keep using the stream.
    ///
    /// If the stream does not get there within [`Config::stream_patience`], the watchdog may fail
    /// the waiting items with [`Error::Hang`]. With the launched variants the host waits for the
    /// stream instead. [`Error::ForeignStream`] for a stream of another context, or on the CPU
    /// backend.
    pub fn wait_for_stream(&self, stream: &cudarc::driver::CudaStream) -> Result<()> {
        self.check_cudarc_stream(stream)?;
        // SAFETY: a live cudarc stream (borrowed for the call) of pptm's context.
        unsafe { self.wait_for_checked_stream(stream.cu_stream()) }
    }

    /// [`Runtime::wait_for_stream`] for a raw stream handle (another library's stream).
    ///
    /// # Safety
    /// `stream` is null (the legacy default stream) or a stream of this runtime's context
    /// ([`Runtime::cuda_context`]) that has not been destroyed.
    pub unsafe fn wait_for_raw_stream(&self, stream: cudarc::driver::sys::CUstream) -> Result<()> {
        let Some(device) = self.gpu_device() else {
            return Err(Error::ForeignStream {
                reason: "the runtime runs on the CPU backend".into(),
            });
        };
        // SAFETY: the caller's promise.
        unsafe { device.check_stream(stream) }?;
        // SAFETY: checked to be of pptm's context; alive by the caller's promise.
        unsafe { self.wait_for_checked_stream(stream) }
    }

    /// `wait_for_stream` once the stream is known to be of pptm's context.
    ///
    /// # Safety
    /// `stream` is null or a live stream of pptm's context.
    unsafe fn wait_for_checked_stream(&self, stream: cudarc::driver::sys::CUstream) -> Result<()> {
        let Backend::Gpu { signals, gates, .. } = &self.backend else {
            unreachable!("checked: the GPU backend")
        };
        if self.launched() {
            // Every launched item runs to completion inside its submit: waiting here orders them.
            // SAFETY: a valid stream of our context (checked above).
            let r = unsafe { cudarc::driver::sys::cuStreamSynchronize(stream) };
            return crate::gpu::driver::check("cuStreamSynchronize", r);
        }
        // SAFETY: as above.
        let (word, value) = unsafe { signals.stream_reaches(stream) }?;
        let mut points = gates.points.lock().unwrap_or_else(|e| e.into_inner());
        let v = points.entry(word).or_insert(0);
        *v = (*v).max(value);
        gates.version.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// [`Error::ForeignStream`] unless `stream` is of this runtime's context.
    pub(crate) fn check_cudarc_stream(&self, stream: &cudarc::driver::CudaStream) -> Result<()> {
        match self.gpu_device() {
            Some(d) if stream.context().cu_ctx() == d.context() => Ok(()),
            Some(d) => Err(Error::ForeignStream {
                reason: format!(
                    "the stream's context is not pptm's (the primary context of GPU {}: CudaContext::new({}))",
                    d.ordinal, d.ordinal
                ),
            }),
            None => Err(Error::ForeignStream {
                reason: "the runtime runs on the CPU backend".into(),
            }),
        }
    }

    /// A buffer over `len` elements of device memory the application owns, at `ptr`.
    ///
    /// Checked: `ptr` is device memory of this runtime's context ([`Runtime::cuda_context`]),
    /// aligned to `T`, and the `len` elements lie inside one allocation; otherwise
    /// [`Error::ForeignMemory`]. [`Error::Config`] on the CPU backend.
    ///
    /// # Safety
    /// The memory must stay allocated, and hold `T` values, for as long as the buffer lives; pptm
    /// never frees it. Nothing else may write it while a pptm item reads or writes it, or read it
    /// while an item writes it (order the application's work against the item's ticket: wait for
    /// it, or finish the application's stream work before submitting).
    pub unsafe fn wrap_device_memory<T: Element>(&self, ptr: u64, len: usize) -> Result<Buffer<T>> {
        let device = self.foreign_device()?;
        self.check_foreign::<T>(device, ptr, len)?;
        Ok(Buffer::wrap(self.id, device, ptr, len, None))
    }

    /// A buffer over a cudarc slice's memory, which it keeps (and frees, through cudarc, when it
    /// drops). The slice's stream is synchronised first, so the application's writes to it are
    /// done; after that, order its work against the buffer's tickets as with
    /// [`Runtime::wrap_device_memory`]. The slice must be in this runtime's context
    /// (`CudaContext::new(ordinal)` is: the primary context), else [`Error::ForeignMemory`].
    pub fn wrap_cuda_slice<T>(&self, slice: cudarc::driver::CudaSlice<T>) -> Result<Buffer<T>>
    where
        T: Element + cudarc::driver::DeviceRepr,
    {
        use cudarc::driver::DevicePtr as _;
        let device = self.foreign_device()?;
        slice
            .stream()
            .synchronize()
            .map_err(|e| Error::driver("cuStreamSynchronize", e))?;
        let len = slice.len();
        let ptr = {
            let (ptr, _sync) = slice.device_ptr(slice.stream());
            ptr
        };
        self.check_foreign::<T>(device, ptr, len)?;
        Ok(Buffer::wrap(
            self.id,
            device,
            ptr,
            len,
            Some(Box::new(slice)),
        ))
    }

    fn foreign_device(&self) -> Result<&Arc<Device>> {
        self.gpu_device().ok_or_else(|| {
            Error::Config("device memory can be wrapped as a buffer only on the GPU backend".into())
        })
    }

    fn check_foreign<T: Element>(&self, device: &Device, ptr: u64, len: usize) -> Result<()> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(Error::TooLarge {
                what: "a buffer",
                len,
            })?;
        if bytes == 0 {
            return Ok(());
        }
        let bad = |reason: String| Error::ForeignMemory { reason };
        if ptr == 0 {
            return Err(bad("a null pointer".into()));
        }
        if !ptr.is_multiple_of(std::mem::align_of::<T>() as u64) {
            return Err(bad(format!(
                "{ptr:#x} is not aligned to {} ({} bytes)",
                std::any::type_name::<T>(),
                std::mem::align_of::<T>()
            )));
        }
        device.check_foreign(ptr, bytes).map_err(bad)
    }

    /// How many times the runtime parked its manifolds while idle ([`Config::park_when_idle`]).
    pub fn parks(&self) -> u64 {
        match &self.backend {
            Backend::Gpu { fleet, .. } => fleet.parks.load(Ordering::Relaxed),
            Backend::Cpu { .. } => 0,
        }
    }

    /// How many times a domain started on demand made the runtime re-partition the GPU (drain the
    /// running manifolds and launch them again, with the new one, on new shares).
    pub fn repartitions(&self) -> u64 {
        match &self.backend {
            Backend::Gpu { repartitions, .. } => repartitions.load(Ordering::Relaxed),
            Backend::Cpu { .. } => 0,
        }
    }

    /// Parks every manifold, runs `f`, and starts them again (the same domains, the same shares).
    ///
    /// What `f` is for: CUDA work of the application's own that cannot run beside a resident
    /// manifold because the driver waits for every kernel on the GPU to end first: loading or
    /// unloading a module (`cuModuleLoadData`, the first launch of a lazily loaded kernel),
    /// `cuMemFree`, `cuMemHostAlloc`, `cuCtxSynchronize`, creating a cuBLAS handle
    /// (docs/embedding.md lists what was measured). Items already submitted complete before `f`
    /// runs; submissions from other threads wait until the manifolds are back; a submission from
    /// `f` itself is [`Error::Quiesced`]. On the CPU backend and the launched variants, which
    /// keep nothing resident, this only runs `f`.
    pub fn quiesce<R>(&self, f: impl FnOnce() -> R) -> Result<R> {
        let Backend::Gpu {
            device,
            fleet,
            quiescer,
            ..
        } = &self.backend
        else {
            return Ok(f());
        };
        let Fleet {
            gate, manifolds, ..
        } = &**fleet;
        let me = std::thread::current().id();
        if inside_quiesce(quiescer) {
            return Ok(f()); // nested: already parked
        }
        let _alone = gate.write().unwrap_or_else(|e| e.into_inner());
        let domains = drain(&mut manifolds.lock().unwrap_or_else(|e| e.into_inner()))?;
        // Another runtime's manifold would keep `f`'s driver calls waiting for ever: refuse.
        let others = device.resident_manifolds();
        if others > 0 {
            if !domains.is_empty() {
                let mut m = manifolds.lock().unwrap_or_else(|e| e.into_inner());
                self.relaunch(device, &mut m, &domains)?;
            }
            return Err(Error::Config(format!(
                "Runtime::quiesce parks this runtime's manifolds, but {others} manifold(s) of another \
                 Runtime are resident on this GPU, and the driver calls quiesce is for would wait for them \
                 for ever; use one Runtime per GPU, or drop the other first"
            )));
        }
        /// Forgets the quiescing thread however `f` ends (a panic included).
        struct Quiescing<'a>(&'a Mutex<Option<std::thread::ThreadId>>);
        impl Drop for Quiescing<'_> {
            fn drop(&mut self) {
                *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
            }
        }
        *quiescer.lock().unwrap_or_else(|e| e.into_inner()) = Some(me);
        let out = {
            let _quiescing = Quiescing(quiescer);
            f()
        };
        if !domains.is_empty() {
            let mut m = manifolds.lock().unwrap_or_else(|e| e.into_inner());
            self.relaunch(device, &mut m, &domains)?;
        }
        Ok(out)
    }

    /// The launcher of `code`'s domain (`Variant::FusedLaunched`), made on first use.
    fn launcher(&self, code: &'static DomainCode) -> Result<Arc<Launcher>> {
        let Backend::Gpu {
            device, launchers, ..
        } = &self.backend
        else {
            unreachable!("launchers are GPU only")
        };
        let mut l = launchers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = l.get(code.key) {
            return Ok(existing.clone());
        }
        let sms = self
            .config
            .max_sms
            .map_or(device.sm_count, |m| m.clamp(1, device.sm_count));
        let made = Arc::new(Launcher::new(
            device,
            code,
            sms * self.config.blocks_per_sm,
            self.config.watchdog,
            self.config.variant,
        )?);
        l.insert(code.key, made.clone());
        Ok(made)
    }

    fn launched(&self) -> bool {
        matches!(self.backend, Backend::Gpu { .. }) && self.config.variant != Variant::Fused
    }

    /// Starts the manifolds of several domains together, sharing the GPU: each gets its share of
    /// the SMs, `Config::domain_sms` where it names the domain. The others each take the SMs
    /// they would alone (`Config::max_sms`, or all) where one block of every domain fits on an
    /// SM at once, blocks of several domains then sharing each SM, and an equal split of the rest
    /// where not. Domains already running are kept; if any domain here is new, the running ones are
    /// drained and everything starts again on new shares (a re-partition). Fails with
    /// [`Error::Config`] when the shares cannot all be resident at once, and with
    /// [`Error::Launch`] when one does not become resident. Any domain also starts on demand, at
    /// its first submission: this call is a warm-up, and the way to set shares up front. On the
    /// CPU backend it does nothing.
    ///
    /// ```ignore
    /// rt.prepare_domains(&[KlComplexity::DOMAIN, DistanceKth::DOMAIN, GemvAxpbySum::DOMAIN])?;
    /// ```
    pub fn prepare_domains(&self, domains: &[&'static DomainCode]) -> Result<()> {
        let Backend::Gpu {
            device,
            fleet,
            quiescer,
            ..
        } = &self.backend
        else {
            return Ok(());
        };
        let Fleet {
            gate, manifolds, ..
        } = &**fleet;
        if self.config.variant != Variant::Fused {
            for d in domains {
                self.launcher(d)?;
            }
            return Ok(());
        }
        if inside_quiesce(quiescer) {
            return Err(Error::Quiesced);
        }
        let _alone = gate.write().unwrap_or_else(|e| e.into_inner());
        let mut m = manifolds.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|_, x| !x.was_aborted());
        if domains.iter().all(|d| m.contains_key(d.key)) {
            return Ok(());
        }
        let mut all = codes(&drain(&mut m)?);
        all.extend(codes(&fleet.take_parked()));
        for &d in domains {
            if !all.iter().any(|a| a.key == d.key) {
                all.push(d);
            }
        }
        load_linked_modules(device, all[0])?;
        self.start_domains(device, &mut m, &all)
    }

    /// Launches drained manifolds again, each on the share of the SMs it had (after `quiesce`, or
    /// parking while idle): the same grids as before, so they fit as they did.
    fn relaunch(
        &self,
        device: &Arc<Device>,
        m: &mut HashMap<&'static str, Arc<Manifold>>,
        shares: &[Share],
    ) -> Result<()> {
        let Backend::Gpu { signals, .. } = &self.backend else {
            unreachable!("relaunch on the GPU backend only")
        };
        // As start_domains does: the domains that fit fewest blocks on an SM first, so that the
        // block scheduler can still pack the others two to an SM beside them (the other order
        // left a tensor manifold no room on an H200).
        let mut order = Vec::with_capacity(shares.len());
        for &(d, share) in shares {
            order.push((
                device.module(d)?.blocks_per_sm_max(device)?.max(1),
                d,
                share,
            ));
        }
        order.sort_by_key(|&(fit, d, _)| (fit, d.key));
        for (_, d, share) in order {
            let launched = Manifold::launch(device, d, &self.config, share, signals)?;
            m.insert(d.key, launched);
        }
        Ok(())
    }

    /// Launches the manifolds of `domains` together (none may be running: the caller drained
    /// them), each with its share of the SMs.
    fn start_domains(
        &self,
        device: &Arc<Device>,
        m: &mut HashMap<&'static str, Arc<Manifold>>,
        domains: &[&'static DomainCode],
    ) -> Result<()> {
        debug_assert!(m.is_empty(), "start_domains after a drain");
        let mut todo: Vec<&'static DomainCode> = Vec::new();
        for &d in domains {
            if !todo.iter().any(|t| t.key == d.key) {
                todo.push(d);
            }
        }
        if todo.is_empty() {
            return Ok(());
        }
        // Load everything before anything new runs. Domains whose blocks take a whole SM (the
        // Hopper tensor path) launch first: blocks of the others would leave no SM empty for them.
        let mut fit = Vec::with_capacity(todo.len());
        for d in &todo {
            fit.push(device.module(d)?.blocks_per_sm_max(device)?.max(1));
        }
        let mut order: Vec<usize> = (0..todo.len()).collect();
        order.sort_by_key(|&i| fit[i]);
        let todo: Vec<&'static DomainCode> = order.iter().map(|&i| todo[i]).collect();
        let fit: Vec<u32> = order.iter().map(|&i| fit[i]).collect();
        let per_sm = fit.iter().copied().min().unwrap_or(1);
        // Shares: named ones first, then the others' (`sm_shares`).
        let total = device.sm_count;
        let named: Vec<Option<u32>> = todo
            .iter()
            .map(|d| {
                self.config
                    .domain_sms
                    .iter()
                    .find(|(name, _)| name == d.name)
                    .map(|&(_, s)| s)
            })
            .collect();
        // Every grid (compute blocks + the fetcher) must fit beside those already running,
        // counted in SMs: a block of a domain that fits `f` blocks an SM takes 1/f of one.
        let running: f64 = m
            .values()
            .map(|x| f64::from(x.grid) / f64::from(x.blocks_per_sm_max.max(1)))
            .sum();
        let (shares, wanted) = sm_shares(&self.config, total, &fit, &named, running);
        let capacity = total * per_sm;
        if shares.contains(&0) || running + wanted > f64::from(total) + 1e-9 {
            return Err(Error::Config(format!(
                "cannot make {} manifold(s) resident together: SM shares {:?} of {total} SMs at {} block(s) per SM \
                 need {wanted:.1} SMs beside {running:.1} taken by running ones, and {total} exist ({capacity} \
                 blocks at the fewest per SM); set Config::domain_sms or blocks_per_sm",
                todo.len(),
                todo.iter()
                    .zip(&shares)
                    .map(|(d, s)| format!("{}={s}", d.name))
                    .collect::<Vec<_>>(),
                self.config.blocks_per_sm.min(per_sm),
            )));
        }
        let Backend::Gpu { signals, .. } = &self.backend else {
            unreachable!("start_domains on the GPU backend only")
        };
        for (d, share) in todo.into_iter().zip(shares) {
            let launched = Manifold::launch(device, d, &self.config, Some(share), signals)?;
            m.insert(d.key, launched);
        }
        Ok(())
    }

    /// Launches the manifold that hosts `C` now, rather than on its first submission.
    pub fn prepare<C: Chain>(&self) -> Result<()> {
        C::ir()?;
        if self.launched() {
            return self.launcher(C::DOMAIN).map(|_| ());
        }
        self.manifold(C::DOMAIN).map(|_| ())
    }

    /// Grid size (blocks) of the manifold hosting `C`, if it is running.
    pub fn manifold_blocks<C: Chain>(&self) -> Option<u32> {
        let Backend::Gpu { fleet, .. } = &self.backend else {
            return None;
        };
        fleet
            .manifolds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(C::DOMAIN.key)
            .map(|m| m.grid)
    }

    /// Submits a chain; waits for a free slot when the queue is full. The generated
    /// `Chain::submit(&rt, ...)` calls this with the right arguments.
    pub fn submit_chain<'a, C: Chain>(&self, args: Vec<Arg<'a>>) -> Result<Ticket<'a, C::Output>> {
        self.submit_impl::<C>(args, true).map(Routed::into_ticket)
    }

    /// As [`Runtime::submit_chain`], but [`Error::QueueFull`] instead of waiting.
    pub fn try_submit_chain<'a, C: Chain>(
        &self,
        args: Vec<Arg<'a>>,
    ) -> Result<Ticket<'a, C::Output>> {
        self.submit_impl::<C>(args, false).map(Routed::into_ticket)
    }

    /// Submits an item that does nothing, through the full dispatch path of the manifold hosting
    /// `C` (to measure dispatch).
    pub fn submit_noop<C: Chain>(&self) -> Result<Ticket<'static, ()>> {
        if self.launched() {
            let c = self.launcher(C::DOMAIN)?.run(
                &pptm_desc {
                    opcode: PPTM_OP_NOOP,
                    blocks: 1,
                    ..Default::default()
                },
                "noop",
            )?;
            return Ok(Ticket::ready("noop", C::DOMAIN.name, c));
        }
        match self.manifold(C::DOMAIN)? {
            None => Ok(Ticket::ready(
                "noop",
                C::DOMAIN.name,
                Completion {
                    status: 0,
                    value: 0.0,
                    device_ns: None,
                    paths: None,
                },
            )),
            Some(r) => {
                let m = r.manifold.clone();
                // A no-op needs one block: it measures the dispatch path, not a grid-wide arrival.
                let cell = self.push(
                    &m,
                    &pptm_desc {
                        opcode: PPTM_OP_NOOP,
                        blocks: 1,
                        ..Default::default()
                    },
                    true,
                    self.config.side_by_side,
                    "noop",
                )?;
                Ok(Ticket::pending("noop", m, cell))
            }
        }
    }

    /// Submits a fault-injection item to the manifold that hosts `C` (built with the
    /// `fault-injection` feature only): what a hang, a long item, a device fault or a descriptor
    /// the device rejects look like, to test the watchdog and fault handling (tests/reliability.rs).
    /// Persistent GPU manifolds take every kind; `Variant::FusedLaunched` takes a hang or a long
    /// item, run (and waited for, watchdog included) as one launch: a hang comes back from this
    /// call as [`Error::Hang`]. Elsewhere [`Error::Config`].
    #[cfg(feature = "fault-injection")]
    pub fn inject<C: Chain>(&self, what: Injection) -> Result<Ticket<'static, ()>> {
        use crate::gpu::abi::{PPTM_OP_DEBUG_FAULT, PPTM_OP_DEBUG_HANG, PPTM_OP_DEBUG_SLOW};
        if self.launched() {
            let (opcode, arg, name) = match (self.config.variant, what) {
                (Variant::FusedLaunched, Injection::Hang) => {
                    (PPTM_OP_DEBUG_HANG, 0, "injected hang")
                }
                (Variant::FusedLaunched, Injection::Slow(d)) => (
                    PPTM_OP_DEBUG_SLOW,
                    d.as_nanos().min(u128::from(u64::MAX)) as u64,
                    "injected slow item",
                ),
                _ => {
                    return Err(Error::Config(
                        "fault injection targets the persistent manifold (Variant::Fused); \
                         Variant::FusedLaunched takes Injection::Hang and Injection::Slow only"
                            .into(),
                    ));
                }
            };
            let mut desc = pptm_desc {
                opcode,
                blocks: 1,
                ..Default::default()
            };
            desc.args[0] = arg;
            let c = self.launcher(C::DOMAIN)?.run(&desc, name)?;
            return Ok(Ticket::ready(name, C::DOMAIN.name, c));
        }
        let Some(resident) = self.manifold(C::DOMAIN)? else {
            return Err(Error::Config(
                "fault injection needs the GPU backend".into(),
            ));
        };
        let m = resident.manifold.clone();
        let ir = C::ir()?;
        let mut desc = pptm_desc {
            blocks: 1,
            ..Default::default()
        };
        let name = match what {
            Injection::Hang => {
                desc.opcode = PPTM_OP_DEBUG_HANG;
                "injected hang"
            }
            Injection::Slow(d) => {
                desc.opcode = PPTM_OP_DEBUG_SLOW;
                desc.args[0] = d.as_nanos().min(u128::from(u64::MAX)) as u64;
                "injected slow item"
            }
            Injection::Fault => {
                desc.opcode = PPTM_OP_DEBUG_FAULT;
                "injected fault"
            }
            Injection::MisalignedArgument => {
                // The chain's own variant, every pointer odd: the device's checks must refuse it.
                desc.opcode = C::OPCODE;
                for (word, slot) in desc.args.iter_mut().zip(&ir.args) {
                    *word = match slot.kind {
                        ArgKind::Input | ArgKind::Output => 0x1001,
                        ArgKind::Len => 1,
                        _ => 0,
                    };
                }
                C::NAME
            }
        };
        let cell = m.submit(&desc, true, false, name)?;
        Ok(Ticket::pending(name, m, cell))
    }

    /// What the accuracy guard of chain `C` did (all zero for a chain without a `tolerance`
    /// stage): see [`GuardStats`].
    pub fn guard_stats<C: Chain>(&self) -> GuardStats {
        self.guards.stats(C::OPCODE)
    }

    /// Lets every shape of `C` that fell back to the next precision up try its declared
    /// precision (and the guard's check) again.
    pub fn reset_guard<C: Chain>(&self) {
        self.guards.reset(C::OPCODE)
    }

    /// Submits one item of chain `C`, or, for a pipeline (`Plan` mode), records it: an item
    /// bound for a running manifold comes back as a [`Routed::Planned`] descriptor, which the
    /// pipeline dispatches with others in one plan; any other item runs now.
    pub(crate) fn submit_impl<'a, C: Chain>(
        &self,
        args: Vec<Arg<'a>>,
        mode: impl Into<SubmitMode>,
    ) -> Result<Routed<'a, C::Output>> {
        let mode = mode.into();
        let blocking = !matches!(mode, SubmitMode::Try);
        let ir = C::ir()?;
        let (slots, sizes) = self.validate::<C>(ir, args)?;
        // A guarded chain's level for this shape, and what its ticket records on completion.
        let guard = ir.guard().map(|_| {
            let level = self.guards.level(C::OPCODE, &sizes);
            GuardNote {
                book: self.guards.clone(),
                opcode: C::OPCODE,
                sizes: sizes.clone(),
                level,
            }
        });
        let level = guard.as_ref().map_or(0, |g| g.level);
        let route = if self.launched() {
            Route::Launch(self.launcher(C::DOMAIN)?)
        } else {
            match self.manifold(C::DOMAIN)? {
                Some(r) => Route::Manifold(r),
                None => Route::Cpu,
            }
        };
        match route {
            Route::Cpu => {
                let reference = matches!(
                    self.backend,
                    Backend::Cpu {
                        reference: true,
                        ..
                    }
                );
                // A pipeline's items run one after another: it waits for each as it submits it.
                let inline = matches!(mode, SubmitMode::Plan);
                let item = crate::cpu::HostItem::new(C::NAME, ir, slots, sizes, level, reference)?;
                Ok(Routed::Ran(
                    Ticket::cpu(C::NAME, C::DOMAIN.name, item.submit(inline))?.with_guard(guard),
                ))
            }
            route => {
                // Working memory the manifold lends the item (a bf16x3 product's split
                // operands); the launched variants lend none, and such a stage runs in f32.
                let lent = match (&route, ir.scratch(&sizes), &self.backend) {
                    (Route::Manifold(_), Some((_, bytes)), Backend::Gpu { working, .. }) => {
                        Some((working.lend(C::DOMAIN.key, bytes)?, bytes))
                    }
                    _ => None,
                };
                let scratch = lent.map_or(0, |(address, _)| address);
                let mut words = C::Args::zeroed();
                let desc_words: &mut [u64] =
                    bytemuck::cast_slice_mut(bytemuck::bytes_of_mut(&mut words));
                let mut aligned = true;
                for ((word, arg), slot) in desc_words.iter_mut().zip(&slots).zip(&ir.args) {
                    *word = match (arg, slot.kind) {
                        (_, ArgKind::Len) => sizes[slot.dim.expect("len slot")] as u64,
                        (_, ArgKind::Guard) => u64::from(level),
                        (_, ArgKind::Scratch) => scratch,
                        (Some(Arg::Input(_, b)), _) => b.device_ptr(),
                        (Some(Arg::Output(_, b)), _) => b.device_ptr(),
                        (Some(Arg::F32(_, v)), _) => u64::from(v.to_bits()),
                        (Some(Arg::U32(_, v)), _) => u64::from(*v),
                        (Some(Arg::Dim(..)) | None, _) => unreachable!("validated"),
                    };
                    if matches!(arg, Some(Arg::Input(..) | Arg::Output(..))) {
                        aligned &= word.is_multiple_of(16);
                    }
                }
                let mut desc = pptm_desc {
                    opcode: C::OPCODE,
                    blocks: ir.blocks_for(&sizes),
                    ..Default::default()
                };
                desc.args[..desc_words.len()].copy_from_slice(desc_words);
                match route {
                    Route::Manifold(r) if matches!(mode, SubmitMode::Plan) => {
                        drop(r);
                        let map = ir.plan.pattern == pptm_spec::Pattern::Map;
                        // A map step with no reduction has no finish: in a plan its blocks need
                        // not meet (a light step, unless a later step waits for it), so it
                        // spreads one 16-byte chunk a thread; alone it keeps `blocks_for`'s.
                        let light = map && ir.reduction().is_none() && self.config.light_steps;
                        let alone_blocks = desc.blocks;
                        if light && !ir.maps_each() {
                            let fine = ir
                                .flow_elements(0, &sizes)
                                .div_ceil(pptm_spec::work::PLAN_MAP_ELEMS_PER_BLOCK);
                            desc.blocks = u32::try_from(fine).unwrap_or(u32::MAX).max(1);
                        }
                        // A chain that reads a table reads any element of it from any block:
                        // no tile, so its hazards wait for whole items.
                        let tile = (map && !ir.reads_tables()).then(|| Tile {
                            elements: ir.flow_elements(0, &sizes),
                            blocks: desc.blocks,
                            per_block: ir.map_elems_per_block(),
                            aligned,
                        });
                        Ok(Routed::Planned(PlannedItem {
                            code: C::DOMAIN,
                            desc,
                            alone_blocks,
                            light: light.then(|| ir.stages.iter().any(|s| s.finite)),
                            guard,
                            tile,
                            scratch: lent
                                .map(|(address, bytes)| (address as usize, bytes as usize)),
                        }))
                    }
                    Route::Manifold(r) => {
                        // Its buffers are borrowed by its ticket, so no item in flight conflicts
                        // with it; the working memory is one per domain, so an item that uses it
                        // waits for the others.
                        let independent = self.config.side_by_side && lent.is_none();
                        let cell = self.push(&r.manifold, &desc, blocking, independent, C::NAME)?;
                        Ok(Routed::Ran(
                            Ticket::pending(C::NAME, r.manifold.clone(), cell).with_guard(guard),
                        ))
                    }
                    Route::Launch(l) => {
                        let c = match self.config.variant {
                            Variant::Unfused => l.run_unfused(&desc, ir, &sizes, false, C::NAME)?,
                            Variant::UnfusedGraph => {
                                l.run_unfused(&desc, ir, &sizes, true, C::NAME)?
                            }
                            Variant::Fused | Variant::FusedLaunched => l.run(&desc, C::NAME)?,
                        };
                        Ok(Routed::Ran(
                            Ticket::ready(C::NAME, C::DOMAIN.name, c).with_guard(guard),
                        ))
                    }
                    Route::Cpu => unreachable!("handled above"),
                }
            }
        }
    }

    /// Runs `f` with the running manifolds of `codes` (started first where need be), holding the
    /// gate that re-partitions, quiesce and shutdown take alone: none of them can drain or
    /// relaunch a manifold until `f` returns. A pipeline dispatches its plans inside, so that a
    /// plan that waits on another's step never meets a manifold relaunched between the two.
    pub(crate) fn with_running<R>(
        &self,
        codes: &[&'static DomainCode],
        f: impl FnOnce(&[Arc<Manifold>]) -> Result<R>,
    ) -> Result<R> {
        let Backend::Gpu {
            fleet, quiescer, ..
        } = &self.backend
        else {
            return Err(Error::ShutDown);
        };
        loop {
            for &code in codes {
                if self.manifold(code)?.is_none() {
                    return Err(Error::ShutDown);
                }
            }
            let shared = shared_gate(&fleet.gate, quiescer)?;
            let found: Option<Vec<Arc<Manifold>>> = {
                let m = fleet.manifolds.lock().unwrap_or_else(|e| e.into_inner());
                codes
                    .iter()
                    .map(|c| m.get(c.key).filter(|x| !x.was_aborted()).cloned())
                    .collect()
            };
            if let Some(ms) = found {
                let out = f(&ms);
                drop(shared);
                return out;
            }
            // Drained or aborted between the start and the look (another thread re-partitioned):
            // start them again.
        }
    }

    /// Pushes one item to a running manifold (borrowed through a [`Resident`], or inside
    /// [`Runtime::with_running`]), after the waits for application streams it must follow
    /// ([`Runtime::wait_for_stream`]).
    pub(crate) fn push(
        &self,
        m: &Manifold,
        desc: &pptm_desc,
        blocking: bool,
        independent: bool,
        chain: &'static str,
    ) -> Result<Arc<crate::gpu::Cell>> {
        if let Backend::Gpu { gates, fleet, .. } = &self.backend {
            fleet.pushed();
            m.follow_gates(gates, blocking, self.config.stream_patience)?;
        }
        m.submit(desc, blocking, independent, chain)
    }

    /// Checks the arguments against the chain. Returns them by descriptor slot (`None` for a
    /// dimension a buffer's length gives) and every dimension's size.
    #[allow(
        clippy::type_complexity,
        reason = "private; the pair is unpacked at once"
    )]
    fn validate<'a, C: Chain>(
        &self,
        ir: &pptm_spec::ChainIr,
        args: Vec<Arg<'a>>,
    ) -> Result<(Vec<Option<Arg<'a>>>, Vec<usize>)> {
        let chain = C::NAME;
        if std::mem::size_of::<C::Args>() != 8 * ir.args.len() {
            return Err(Error::ChainMismatch {
                chain,
                reason: "its Args struct does not match its argument layout".into(),
            });
        }
        let bad = |reason: String| Error::BadArguments { chain, reason };
        let wanted: Vec<&pptm_spec::ArgSlot> = ir
            .args
            .iter()
            .filter(|a| match a.kind {
                ArgKind::Len => ir.dims[a.dim.expect("len")].inferred_from.is_none(),
                ArgKind::Guard | ArgKind::Scratch => false,
                _ => true,
            })
            .collect();
        if args.len() != wanted.len() {
            return Err(bad(format!(
                "expected {} arguments ({}), got {}",
                wanted.len(),
                wanted
                    .iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                args.len()
            )));
        }
        let mut given = args.into_iter();
        let mut slots = Vec::with_capacity(ir.args.len());
        for slot in &ir.args {
            let filled_in = match slot.kind {
                ArgKind::Len => ir.dims[slot.dim.expect("len")].inferred_from.is_some(),
                ArgKind::Guard | ArgKind::Scratch => true,
                _ => false,
            };
            if filled_in {
                slots.push(None);
                continue;
            }
            let a = given.next().expect("counted");
            let kind_ok = matches!(
                (&a, slot.kind),
                (Arg::Input(..), ArgKind::Input)
                    | (Arg::Output(..), ArgKind::Output)
                    | (Arg::F32(..), ArgKind::F32)
                    | (Arg::U32(..), ArgKind::U32)
                    | (Arg::Dim(..), ArgKind::Len)
            );
            if a.name() != slot.name || !kind_ok {
                return Err(bad(format!(
                    "argument `{}` given where `{}` ({:?}) was expected",
                    a.name(),
                    slot.name,
                    slot.kind
                )));
            }
            if let Arg::Input(name, b) = &a
                && b.dtype() != slot.dtype
            {
                return Err(Error::DTypeMismatch {
                    chain,
                    arg: name,
                    expected: slot.dtype,
                    got: b.dtype(),
                });
            }
            if a.owner().is_some_and(|o| o != self.id) {
                return Err(Error::ForeignBuffer {
                    chain,
                    arg: a.name(),
                });
            }
            slots.push(Some(a));
        }
        let values: Vec<pptm_spec::ArgValue> = slots
            .iter()
            .map(|a| a.as_ref().map_or(pptm_spec::ArgValue::Inferred, Arg::value))
            .collect();
        let sizes = ir.bind(&values).map_err(|e| match e {
            pptm_spec::BindError::Length {
                arg,
                expected,
                got,
                rule,
            } => Error::LengthMismatch {
                chain,
                arg: slots
                    .iter()
                    .flatten()
                    .map(Arg::name)
                    .find(|n| *n == arg)
                    .unwrap_or("?"),
                expected,
                got,
                rule,
            },
            other => bad(other.to_string()),
        })?;
        Ok((slots, sizes))
    }

    /// Shuts every manifold down, after every submitted item has completed. Dropping the runtime
    /// does the same; this reports failures. A later submission launches its manifold again.
    /// Inside [`Runtime::quiesce`]'s closure the manifolds are already parked, and this does
    /// nothing (they start again when `quiesce` returns).
    pub fn shutdown(&self) -> Result<()> {
        let Backend::Gpu {
            fleet, quiescer, ..
        } = &self.backend
        else {
            return Ok(());
        };
        if inside_quiesce(quiescer) {
            // Inside quiesce's closure: the manifolds are drained already, and this thread holds
            // the gate.
            return Ok(());
        }
        let _alone = fleet.gate.write().unwrap_or_else(|e| e.into_inner());
        // Parked manifolds stay stopped: a later item launches its own domain only.
        fleet.take_parked();
        drain(&mut fleet.manifolds.lock().unwrap_or_else(|e| e.into_inner())).map(|_| ())
    }
}

use bytemuck::Zeroable as _;

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Backend::Gpu { fleet, parker, .. } = &mut self.backend
            && let Some(parker) = parker.take()
        {
            fleet.stop.store(true, Ordering::Release);
            parker.thread().unpark();
            let _ = parker.join();
        }
        if let Err(e) = self.shutdown() {
            tracing::error!("pptm: shutdown: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Config, parse_meminfo, sm_shares};

    /// The shares of domains whose blocks fit `fit` an SM, on a 132-SM GPU with nothing running.
    fn shares(cfg: &Config, fit: &[u32], named: &[Option<u32>]) -> (Vec<u32>, f64) {
        sm_shares(cfg, 132, fit, named, 0.0)
    }

    #[test]
    fn overlapping_domains_that_fit_on_an_sm_together_each_take_the_whole_gpu() {
        let cfg = Config {
            overlap_domains: true,
            ..Config::default()
        };
        // One domain alone: every SM, its fetcher beside (two blocks an SM fit), or one fewer
        // where a block takes a whole SM.
        assert_eq!(shares(&cfg, &[2], &[None]).0, vec![132]);
        assert_eq!(shares(&cfg, &[1], &[None]).0, vec![131]);
        // Two domains of two blocks an SM: one block of each on every SM, 131 + 1 each.
        let (s, wanted) = shares(&cfg, &[2, 2], &[None, None]);
        assert_eq!(s, vec![131, 131]);
        assert!(wanted <= 132.0, "{wanted}");
        // Three of three an SM, and `max_sms` capping each.
        assert_eq!(shares(&cfg, &[3, 3, 3], &[None; 3]).0, vec![131; 3]);
        let capped = Config {
            max_sms: Some(60),
            ..cfg.clone()
        };
        assert_eq!(shares(&capped, &[2, 2], &[None, None]).0, vec![60, 60]);
    }

    #[test]
    fn domains_split_the_gpu_unless_they_overlap_and_fit_on_an_sm_together() {
        // Without `overlap_domains` (the default): an equal split.
        let split = Config {
            overlap_domains: false,
            ..Config::default()
        };
        assert_eq!(shares(&split, &[2, 2], &[None, None]).0, vec![66, 66]);
        let cfg = Config {
            overlap_domains: true,
            ..Config::default()
        };
        // Three domains of two blocks an SM: a third each, less room for the fetchers.
        let (s, wanted) = shares(&cfg, &[2, 2, 2], &[None; 3]);
        assert!(
            s.iter().all(|&x| x == s[0] && (40..=44).contains(&x)),
            "{s:?}"
        );
        assert!(wanted <= 132.0, "{wanted}");
        // A domain whose blocks take a whole SM beside another: halves, 65 + 1 each at most.
        let (s, wanted) = shares(&cfg, &[1, 2], &[None, None]);
        assert!(s[0] == s[1] && s[0] <= 66, "{s:?}");
        assert!(wanted <= 132.0, "{wanted}");
        // Two of one block an SM: 65 + 1 each.
        assert_eq!(shares(&cfg, &[1, 1], &[None, None]).0, vec![65, 65]);
        // Two blocks an SM asked of domains that fit two: no room for a second domain's block.
        let two = Config {
            blocks_per_sm: 2,
            ..cfg.clone()
        };
        let (s, _) = shares(&two, &[2, 2], &[None, None]);
        assert!(s[0] <= 66, "{s:?}");
    }

    #[test]
    fn named_shares_are_kept_and_the_rest_follow_the_same_rule() {
        let cfg = Config {
            overlap_domains: true,
            ..Config::default()
        };
        assert_eq!(shares(&cfg, &[2, 2], &[Some(40), None]).0, vec![40, 132]);
        // Named shares that cannot all be resident come back as they are, for the caller to
        // refuse.
        let (s, wanted) = shares(&cfg, &[2, 2], &[Some(132), Some(132)]);
        assert_eq!(s, vec![132, 132]);
        assert!(wanted > 132.0, "{wanted}");
    }

    #[test]
    fn meminfo_gives_available_and_total_bytes() {
        let text =
            "MemTotal:       24576000 kB\nMemFree:         1000 kB\nMemAvailable:   12288000 kB\n";
        assert_eq!(
            parse_meminfo(text),
            Some((12_288_000 * 1024, 24_576_000 * 1024))
        );
        assert_eq!(parse_meminfo("MemTotal: 10 kB\n"), None);
        assert_eq!(
            parse_meminfo("MemTotal: ten kB\nMemAvailable: 5 kB\n"),
            None
        );
    }
}
