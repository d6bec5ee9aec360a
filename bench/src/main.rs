//! pptm-bench: pptm against what its users run today, on one GPU, in one process.
//!
//!     pptm-bench [--quick] [--chains a,b] [--sizes small,medium,large] [--out DIR]
//!                [--resume FILE.json]
//!     pptm-bench report [--out DIR] [FILE.json | DIR]...
//!
//! The first form measures the dispatch floors (empty launch + sync, a one-node CUDA graph, a
//! mapped-memory round trip to one polling GPU thread) and every chain at three sizes on four
//! variants: pptm's persistent manifold, the same fused code as one launch per item, one launch
//! per stage, and those launches replayed as a CUDA graph. Each variant's result is checked
//! against an f64 reference before and after it is timed; one that fails is not reported, and
//! the results file says why. Writes DIR/pptm.json (default DIR: bench/results) after every
//! measurement, marked `partial` until the run ends, so a run cut short (a time limit) keeps what
//! it measured; `--resume FILE` takes such a file's measurements (same commit, same mode) and
//! times only what it lacks. Chain
//! matmul_bias_gelu_bf16 is cuBLAS and cuBLASLt alone, as baselines (src/cublas.rs); chain
//! copy_roof is a plain copy, the run's bandwidth roof (src/roof.rs).
//!
//! The second form merges results files (pptm's and bench/peers.py's) into DIR/REPORT.md and
//! DIR/latency.png (default DIR: bench; default input: bench/results).
//!
//! Timing: host clock around submit → result on the host (one item in flight), after warm-up,
//! repeated for about a second per variant (a tenth with --quick); median and p99. Device time:
//! the manifold's own %globaltimer stamps, CUDA events for the launched variants.

mod cases;
mod cublas;
/// The geodesics example's op, state and chains, shared with it (pptm's codegen follows the path).
#[allow(dead_code)]
#[path = "../../examples/geodesics/system.rs"]
mod geodesic_system;
mod inputs;
/// The MD example's model, ops, chains and pipeline, shared with it.
#[allow(dead_code)]
#[path = "../../examples/md/system.rs"]
mod md_system;
mod own_ops;
mod record;
mod report;
mod roof;
mod throughput;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use pptm::baseline::LaunchBaseline;
use pptm::chains::KlComplexity;
use pptm::{Chain, Config, Runtime, Variant};

use cases::{Case, Expect};
use record::{DeviceInfo, Measurement, Refusal, Results, Stat};

type BoxError = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = if args.first().map(String::as_str) == Some("report") {
        report::run(&args[1..])
    } else {
        Options::parse(&args).and_then(|o| bench(&o))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pptm-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Options {
    quick: bool,
    chains: Option<Vec<String>>,
    sizes: Option<Vec<String>>,
    out: PathBuf,
    /// A results file of an earlier run of this build whose measurements are kept, not repeated.
    resume: Option<PathBuf>,
}

impl Options {
    fn parse(args: &[String]) -> Result<Options, BoxError> {
        let mut o = Options {
            quick: false,
            chains: None,
            sizes: None,
            out: PathBuf::from("bench/results"),
            resume: None,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{a} needs a value"))
            };
            let list = |v: String| v.split(',').map(str::to_string).collect::<Vec<_>>();
            match a.as_str() {
                "--quick" => o.quick = true,
                "--chains" => o.chains = Some(list(value()?)),
                "--sizes" => o.sizes = Some(list(value()?)),
                "--out" => o.out = PathBuf::from(value()?),
                "--resume" => o.resume = Some(PathBuf::from(value()?)),
                "-h" | "--help" => {
                    println!("{}", USAGE);
                    std::process::exit(0);
                }
                other => return Err(format!("unknown argument `{other}`\n{USAGE}").into()),
            }
        }
        let mut known = cases::CHAINS.to_vec();
        for c in [
            cublas::CHAIN,
            cublas::BATCHED_CHAIN,
            roof::CHAIN,
            throughput::CHAIN,
        ] {
            if !known.contains(&c) {
                known.push(c);
            }
        }
        for c in o.chains.iter().flatten() {
            if !known.contains(&c.as_str()) && c != "dispatch" {
                return Err(format!("unknown chain `{c}` (dispatch, {})", known.join(", ")).into());
            }
        }
        // Sizes are small, medium and large, except the cases that name theirs ("10 atoms").
        let mut sizes = vec!["small", "medium", "large"];
        sizes.extend(cases::MD_SIZES.iter().map(|(name, _)| *name));
        for s in o.sizes.iter().flatten() {
            if !sizes.contains(&s.as_str()) {
                return Err(format!("unknown size `{s}` ({})", sizes.join(", ")).into());
            }
        }
        Ok(o)
    }

    fn wants(&self, chain: &str, size: &str) -> bool {
        self.chains
            .as_ref()
            .is_none_or(|c| c.iter().any(|x| x == chain))
            && (size == "-"
                || self
                    .sizes
                    .as_ref()
                    .is_none_or(|s| s.iter().any(|x| x == size)))
    }
}

const USAGE: &str =
    "usage: pptm-bench [--quick] [--chains a,b] [--sizes small,medium,large] [--out DIR]
                  [--resume FILE.json]
       pptm-bench report [--out DIR] [FILE.json | DIR]...";

/// The variants every chain runs on, as named in results.
const PERSISTENT: &str = "pptm fused persistent";
const LAUNCHED: [(Variant, &str); 3] = [
    (Variant::FusedLaunched, "fused, one launch per item"),
    (Variant::Unfused, "unfused, one launch per stage"),
    (Variant::UnfusedGraph, "unfused, CUDA graph replay"),
];

/// How long each variant of each case is timed for, and the most repetitions.
struct Budget {
    time: Duration,
    max_reps: usize,
}

struct Collector {
    results: Vec<Measurement>,
    refused: Vec<Refusal>,
    progress: ProgressBar,
    /// Where the results go after each measurement, and the file's other fields (`None` in
    /// unit tests).
    file: Option<(PathBuf, Results)>,
}

impl Collector {
    /// A collector that writes nothing (unit tests).
    #[cfg(test)]
    fn in_memory() -> Collector {
        Collector {
            results: Vec::new(),
            refused: Vec::new(),
            progress: ProgressBar::hidden(),
            file: None,
        }
    }

    /// Whether `variant` of `chain` at `size` was measured or refused already (a resumed run).
    fn has(&self, chain: &str, size: &str, variant: &str) -> bool {
        self.results
            .iter()
            .any(|m| m.chain == chain && m.size == size && m.variant == variant)
            || self
                .refused
                .iter()
                .any(|r| r.chain == chain && r.size == size && r.variant == variant)
    }

    /// Whether anything of `chain` was measured or refused already.
    fn has_chain(&self, chain: &str) -> bool {
        self.results.iter().any(|m| m.chain == chain)
            || self.refused.iter().any(|r| r.chain == chain)
    }

    /// Writes the results file as it stands: `partial` until the run's end.
    fn save(&self, partial: bool) -> Result<(), BoxError> {
        let Some((path, header)) = &self.file else {
            return Ok(());
        };
        let doc = Results {
            partial,
            results: self.results.clone(),
            refused: self.refused.clone(),
            ..header.clone()
        };
        // Written beside and renamed, so that a run killed mid-write leaves the last whole file.
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(&doc)?)?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    }

    fn save_or_say(&self) {
        if let Err(e) = self.save(true) {
            self.say(format!(
                "pptm-bench: could not write the results so far: {e}"
            ));
        }
    }

    /// A line above the bar, or on stderr where there is no bar (not a terminal).
    fn say(&self, line: String) {
        if self.progress.is_hidden() {
            eprintln!("{line}");
        } else {
            self.progress.println(line);
        }
    }

    fn refuse(&mut self, chain: &str, size: &str, variant: &str, reason: String) {
        self.say(format!("REFUSED {chain} {size} {variant}: {reason}"));
        self.refused.push(Refusal {
            chain: chain.into(),
            size: size.into(),
            variant: variant.into(),
            reason,
        });
        self.save_or_say();
    }

    fn report(&mut self, m: Measurement) {
        self.say(format!(
            "{:<18} {:<7} {:<30} median {:>10.2} µs  p99 {:>10.2} µs{}",
            m.chain,
            m.size,
            m.variant,
            m.host_us.median,
            m.host_us.p99,
            m.gbps
                .map(|g| format!("  {g:8.1} GB/s"))
                .unwrap_or_default()
        ));
        self.results.push(m);
        self.progress.inc(1);
        self.save_or_say();
    }
}

/// Median and p99 as the rest of pptm computes them (`timing::Stats`), in the results' schema.
fn stat(t: Vec<Duration>) -> Stat {
    let s = pptm::timing::Stats::of(t);
    Stat {
        median: s.median_us,
        p99: s.p99_us,
        reps: s.reps,
    }
}

/// Warms `f` up for a tenth of the budget (at least 3 calls), then times it for the rest.
fn time_loop<E>(
    budget: &Budget,
    mut f: impl FnMut() -> Result<Option<Duration>, E>,
) -> Result<(Stat, Option<Stat>), E> {
    let start = Instant::now();
    let mut warm = 0u32;
    while warm < 3 || start.elapsed() < budget.time / 10 {
        f()?;
        warm += 1;
    }
    let per = start.elapsed() / warm;
    let reps = ((budget.time.as_secs_f64() / per.as_secs_f64().max(1e-9)) as usize)
        .clamp(10, budget.max_reps);
    let (mut host, mut device) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        let t = Instant::now();
        let d = f()?;
        host.push(t.elapsed());
        device.extend(d);
    }
    let device = (device.len() == host.len()).then(|| stat(device));
    Ok((stat(host), device))
}

/// Times one case on one runtime, checking its result against the reference before and after.
fn measure(
    case: &Case,
    expect: &Expect,
    rt: &Runtime,
    variant: &str,
    budget: &Budget,
    out: &mut Collector,
) {
    let attempt = || -> Result<Measurement, String> {
        let mut run = (case.prepare)(rt).map_err(|e| e.to_string())?;
        let checked = |run: &mut cases::Runner| -> Result<(f64, f64), String> {
            let got = run(true)
                .map_err(|e| e.to_string())?
                .got
                .expect("asked to read");
            let err = cases::check(expect, &got)?;
            if err > 1e-4 {
                return Err(format!(
                    "relative error {err:.2e} against the f64 reference (the bar is 1e-4)"
                ));
            }
            Ok((err, got.summary()))
        };
        let (err_before, value) = checked(&mut run)?;
        let (host, device) =
            time_loop(budget, || run(false).map(|s| s.device)).map_err(|e| e.to_string())?;
        let (err_after, _) = checked(&mut run).map_err(|e| format!("after timing: {e}"))?;
        Ok(Measurement {
            chain: case.chain.into(),
            size: case.size.into(),
            shape: case.shape.clone(),
            x: case.x,
            variant: variant.into(),
            gbps: Some(case.bytes / (host.median * 1e3)),
            tflops: Some(case.flops / (host.median * 1e6)),
            host_us: host,
            device_us: device,
            max_rel_err: Some(err_before.max(err_after)),
            value: Some(value),
        })
    };
    match attempt() {
        Ok(m) => out.report(m),
        Err(reason) => {
            out.refuse(case.chain, case.size, variant, reason);
            out.progress.inc(1);
        }
    }
}

/// A dispatch-only measurement (no data, no reference).
fn floor(name: &str, stat: Stat, out: &mut Collector) {
    out.report(Measurement {
        chain: "dispatch".into(),
        size: "-".into(),
        shape: "no work".into(),
        x: 1.0,
        variant: name.into(),
        host_us: stat,
        device_us: None,
        gbps: None,
        tflops: None,
        max_rel_err: None,
        value: None,
    });
}

fn bench(o: &Options) -> Result<(), BoxError> {
    let budget = if o.quick {
        Budget {
            time: Duration::from_millis(120),
            max_reps: 2000,
        }
    } else {
        Budget {
            time: Duration::from_secs(1),
            max_reps: 20_000,
        }
    };
    let probe = Runtime::gpu().map_err(|e| format!("needs a GPU: {e}"))?;
    let mut device = device_info(&probe);
    eprintln!("pptm-bench on {}", probe.describe());

    let all = cases::all();
    let cases: Vec<&Case> = all.iter().filter(|c| o.wants(c.chain, c.size)).collect();
    let dispatch = o.wants("dispatch", "-");
    let throughput = o.wants(throughput::CHAIN, "-");
    let total = cases.len() * (1 + LAUNCHED.len())
        + if dispatch { 5 } else { 0 }
        + if throughput { throughput::count() } else { 0 }
        + cublas::count(|chain, size| o.wants(chain, size))
        + roof::count(|chain, size| o.wants(chain, size));
    let progress = ProgressBar::new(total as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed_precise} {msg}")
            .expect("a valid template"),
    );
    std::fs::create_dir_all(&o.out)?;
    let header = Results {
        schema: record::SCHEMA.into(),
        source: "pptm".into(),
        date: utc_now(),
        commit: env!("PPTM_BENCH_COMMIT").into(),
        quick: o.quick,
        partial: true,
        device: device.clone(),
        results: Vec::new(),
        refused: Vec::new(),
    };
    let mut out = Collector {
        results: Vec::new(),
        refused: Vec::new(),
        progress,
        file: Some((o.out.join("pptm.json"), header)),
    };
    if let Some(path) = &o.resume {
        let kept = resumed(path, &device.name, o.quick)?;
        eprintln!(
            "resuming {}: {} measurements and {} refusals kept",
            path.display(),
            kept.results.len(),
            kept.refused.len()
        );
        out.results = kept.results;
        out.refused = kept.refused;
        if let Some((_, header)) = &mut out.file {
            header.date = kept.date;
            header.device.clocks = kept.device.clocks;
            header
                .device
                .clocks
                .extend(device.clocks.iter().map(|c| format!("resumed, {c}")));
        }
        device = out.file.as_ref().expect("set above").1.device.clone();
    }
    // What a resumed file holds of the baselines (rows of theirs, not of pptm's variants).
    let pptm_variant = |v: &str| v == PERSISTENT || LAUNCHED.iter().any(|(_, n)| *n == v);
    let baselines_done: Vec<(String, String)> = out
        .results
        .iter()
        .filter(|m| !pptm_variant(&m.variant))
        .map(|m| (m.chain.clone(), m.size.clone()))
        .collect();
    let baseline_wanted = |chain: &str, size: &str| {
        o.wants(chain, size) && !baselines_done.iter().any(|(c, s)| c == chain && s == size)
    };

    // 1. The floors, before any manifold holds the SMs.
    const FLOORS: [&str; 3] = [
        "floor: mapped-memory round trip, one GPU thread",
        "empty kernel launch + sync",
        "one-node CUDA graph + sync",
    ];
    if dispatch && FLOORS.iter().any(|f| !out.has("dispatch", "-", f)) {
        out.progress.set_message("dispatch floors");
        let base = LaunchBaseline::new(&probe, KlComplexity::DOMAIN)?;
        let trips = base.mapped_round_trips(2000, 20_000.min(budget.max_reps * 4))?;
        floor(FLOORS[0], stat(trips), &mut out);
        let (s, _) = time_loop(&budget, || base.launch_and_sync().map(|_| None))?;
        floor(FLOORS[1], s, &mut out);
        let (s, _) = time_loop(&budget, || base.graph_and_sync().map(|_| None))?;
        floor(FLOORS[2], s, &mut out);
    }
    drop(probe);

    // 1b. cuBLAS / cuBLASLt baselines, while no pptm runtime exists (none may hold the SMs).
    cublas::run(baseline_wanted, &budget, &mut out);
    // 1c. The bandwidth roof of this run: a plain copy (src/roof.rs), also before any runtime.
    roof::run(baseline_wanted, &budget, &mut out);

    // 2. Every case, domain by domain: the launched variants first (no manifold resident), then
    //    the domain's manifold on the whole GPU.
    let mut expects: Vec<Option<Expect>> = cases.iter().map(|_| None).collect();
    let mut domains: Vec<&str> = cases.iter().map(|c| c.domain).collect();
    domains.dedup();
    if (dispatch || throughput) && !domains.contains(&KlComplexity::DOMAIN.name) {
        domains.insert(0, KlComplexity::DOMAIN.name);
    }
    for domain in domains {
        let mine: Vec<usize> = (0..cases.len())
            .filter(|&i| cases[i].domain == domain)
            .collect();
        // A resumed run skips what it has: a variant all of whose cells and floors are in the
        // file is not started, and a case none of whose variants is missing needs no reference.
        let noop_floor = |name: &str| format!("no-op item: {name}");
        let missing = |out: &Collector, name: &str, floors: bool| {
            mine.iter()
                .any(|&i| !out.has(cases[i].chain, cases[i].size, name))
                || (floors
                    && dispatch
                    && domain == KlComplexity::DOMAIN.name
                    && !out.has("dispatch", "-", &noop_floor(name)))
        };
        for &i in &mine {
            let variants = LAUNCHED.iter().map(|(_, n)| *n).chain([PERSISTENT]);
            if variants
                .clone()
                .all(|n| out.has(cases[i].chain, cases[i].size, n))
            {
                continue;
            }
            out.progress.set_message(format!(
                "f64 reference: {} {}",
                cases[i].chain, cases[i].shape
            ));
            expects[i] = Some((cases[i].expect)());
        }
        for (variant, name) in LAUNCHED {
            if !missing(&out, name, variant == Variant::FusedLaunched) {
                continue;
            }
            let rt = Runtime::gpu_with(Config {
                variant,
                ..Default::default()
            })?;
            if dispatch
                && domain == KlComplexity::DOMAIN.name
                && variant == Variant::FusedLaunched
                && !out.has("dispatch", "-", &noop_floor(name))
            {
                let (s, _) = time_loop(&budget, || {
                    rt.submit_noop::<KlComplexity>()?.wait().map(|_| None)
                })?;
                floor(&noop_floor(name), s, &mut out);
            }
            for &i in &mine {
                if out.has(cases[i].chain, cases[i].size, name) {
                    continue;
                }
                out.progress
                    .set_message(format!("{} {} {name}", cases[i].chain, cases[i].size));
                let expect = expects[i].as_ref().expect("computed above");
                measure(cases[i], expect, &rt, name, &budget, &mut out);
            }
        }
        // Many small items from many threads, side by side and in order (runtimes of their own).
        if throughput && domain == KlComplexity::DOMAIN.name && !out.has_chain(throughput::CHAIN) {
            throughput::run(o.quick, &mut out)?;
        }
        if !missing(&out, PERSISTENT, true) {
            continue;
        }
        let rt = Runtime::gpu()?;
        if dispatch
            && domain == KlComplexity::DOMAIN.name
            && !out.has("dispatch", "-", &noop_floor(PERSISTENT))
        {
            rt.prepare::<KlComplexity>()?;
            let (s, _) = time_loop(&budget, || {
                rt.submit_noop::<KlComplexity>()?.wait().map(|_| None)
            })?;
            floor(&noop_floor(PERSISTENT), s, &mut out);
        }
        for &i in &mine {
            if out.has(cases[i].chain, cases[i].size, PERSISTENT) {
                continue;
            }
            out.progress
                .set_message(format!("{} {} {PERSISTENT}", cases[i].chain, cases[i].size));
            let expect = expects[i].as_ref().expect("computed above");
            measure(cases[i], expect, &rt, PERSISTENT, &budget, &mut out);
        }
    }
    out.progress.finish_and_clear();

    device.clocks.extend(nvidia_smi_clocks("after"));
    if let Some((_, header)) = &mut out.file {
        header.device = device;
    }
    out.save(false)?;
    let path = o.out.join("pptm.json");
    eprintln!(
        "wrote {} ({} measurements, {} refused)",
        path.display(),
        out.results.len(),
        out.refused.len()
    );
    if !out.refused.is_empty() {
        return Err(format!(
            "{} variant(s) refused (see above and `refused` in {})",
            out.refused.len(),
            path.display()
        )
        .into());
    }
    Ok(())
}

/// The results file `path` of an earlier run, to resume: it must come from this build (the same
/// commit), in the same mode, on a GPU of the same name, or its figures would not compare.
fn resumed(path: &std::path::Path, device: &str, quick: bool) -> Result<Results, BoxError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--resume {}: {e}", path.display()))?;
    let r: Results =
        serde_json::from_str(&text).map_err(|e| format!("--resume {}: {e}", path.display()))?;
    let commit = env!("PPTM_BENCH_COMMIT");
    let why = if r.schema != record::SCHEMA {
        Some(format!(
            "schema {} (this build writes {})",
            r.schema,
            record::SCHEMA
        ))
    } else if r.source != "pptm" {
        Some(format!("its source is {}, not pptm", r.source))
    } else if r.commit != commit {
        Some(format!(
            "it was measured at {} (this build is {commit})",
            r.commit
        ))
    } else if r.quick != quick {
        Some(format!(
            "it was a {} run",
            if r.quick { "--quick" } else { "full" }
        ))
    } else if r.device.name != device {
        Some(format!(
            "it was measured on {} (this GPU: {device})",
            r.device.name
        ))
    } else {
        None
    };
    match why {
        Some(why) => Err(format!("--resume {}: {why}", path.display()).into()),
        None => Ok(r),
    }
}

/// The GPU's name and driver from nvidia-smi, with the clocks it reports now.
fn device_info(rt: &Runtime) -> DeviceInfo {
    let smi = nvidia_smi(&["--query-gpu=name,driver_version", "--format=csv,noheader"]);
    let (name, driver) = match smi.as_deref().and_then(|s| s.lines().next()) {
        Some(line) => {
            let mut parts = line.split(',').map(|p| p.trim().to_string());
            (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            )
        }
        None => (rt.describe(), "unknown (no nvidia-smi)".into()),
    };
    DeviceInfo {
        name,
        driver,
        clocks: nvidia_smi_clocks("before").into_iter().collect(),
    }
}

fn nvidia_smi_clocks(when: &str) -> Option<String> {
    nvidia_smi(&[
        "--query-gpu=clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw",
        "--format=csv,noheader",
    ])
    .and_then(|s| {
        s.lines()
            .next()
            .map(|l| format!("{when}: sm, mem, max sm, temperature, power = {l}"))
    })
}

fn nvidia_smi(args: &[&str]) -> Option<String> {
    let o = std::process::Command::new("nvidia-smi")
        .args(args)
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Now, UTC, as YYYY-MM-DDTHH:MM:SSZ.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (proleptic Gregorian), by 400-year eras.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measurement(chain: &str, size: &str, variant: &str) -> Measurement {
        Measurement {
            chain: chain.into(),
            size: size.into(),
            shape: "-".into(),
            x: 1.0,
            variant: variant.into(),
            host_us: Stat {
                median: 1.0,
                p99: 2.0,
                reps: 10,
            },
            device_us: None,
            gbps: None,
            tflops: None,
            max_rel_err: None,
            value: None,
        }
    }

    fn header(quick: bool) -> Results {
        Results {
            schema: record::SCHEMA.into(),
            source: "pptm".into(),
            date: utc_now(),
            commit: env!("PPTM_BENCH_COMMIT").into(),
            quick,
            partial: true,
            device: DeviceInfo {
                name: "NVIDIA H200".into(),
                ..Default::default()
            },
            results: Vec::new(),
            refused: Vec::new(),
        }
    }

    /// Every measurement reaches the file at once, marked partial; the run's end clears the
    /// mark; and a resumed run takes the file back only from the same build, mode and GPU.
    #[test]
    fn results_are_saved_as_they_come_and_resumed_only_from_the_same_run_kind() {
        let dir = std::env::temp_dir().join(format!("pptm-bench-resume-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pptm.json");
        let mut out = Collector::in_memory();
        out.file = Some((path.clone(), header(false)));
        out.report(measurement("kl_complexity", "small", PERSISTENT));
        out.refuse("te_reduction", "large", PERSISTENT, "a wrong result".into());

        let saved = resumed(&path, "NVIDIA H200", false).unwrap();
        assert!(saved.partial);
        assert_eq!(saved.results.len(), 1);
        assert_eq!(saved.refused.len(), 1);

        let mut again = Collector::in_memory();
        again.results = saved.results;
        again.refused = saved.refused;
        assert!(again.has("kl_complexity", "small", PERSISTENT));
        assert!(again.has("te_reduction", "large", PERSISTENT));
        assert!(!again.has("kl_complexity", "medium", PERSISTENT));
        assert!(!again.has("kl_complexity", "small", LAUNCHED[0].1));
        assert!(again.has_chain("te_reduction") && !again.has_chain("md"));

        out.save(false).unwrap();
        assert!(!resumed(&path, "NVIDIA H200", false).unwrap().partial);

        // Another mode, another GPU, another build: refused, saying why.
        let why = resumed(&path, "NVIDIA H200", true).unwrap_err().to_string();
        assert!(why.contains("full run"), "{why}");
        let why = resumed(&path, "NVIDIA H100 80GB HBM3", false)
            .unwrap_err()
            .to_string();
        assert!(why.contains("NVIDIA H200"), "{why}");
        let mut other = header(false);
        other.commit = "0000000".into();
        std::fs::write(&path, serde_json::to_string(&other).unwrap()).unwrap();
        let why = resumed(&path, "NVIDIA H200", false)
            .unwrap_err()
            .to_string();
        assert!(why.contains("0000000"), "{why}");
        let why = resumed(&dir.join("absent.json"), "NVIDIA H200", false).unwrap_err();
        assert!(why.to_string().contains("absent.json"), "{why}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn named_sizes_are_accepted_and_unknown_ones_refused() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = Options::parse(&args(&[
            "--chains",
            "md",
            "--sizes",
            "10 atoms,10000 atoms",
        ]))
        .unwrap();
        assert!(o.wants("md", "10 atoms") && !o.wants("md", "50 atoms"));
        let e = Options::parse(&args(&["--sizes", "huge"]))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("unknown size `huge`") && e.contains("10 atoms"),
            "{e}"
        );
        let o = Options::parse(&args(&["--resume", "bench/results/pptm.json"])).unwrap();
        assert_eq!(
            o.resume.as_deref(),
            Some(std::path::Path::new("bench/results/pptm.json"))
        );
    }
}
