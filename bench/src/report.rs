//! `pptm-bench report`: merges results files into a markdown report and a latency plot.
//!
//! Peers are the PyTorch variants (bench/peers.py), and for the dependent-steps cases hand-written
//! CUDA (launches, a graph, a graph with PDL); every ratio is the best peer's median over the
//! variant's (above 1: faster than any peer at that size).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::BoxError;
use crate::cases::CHAINS;
use crate::record::{Measurement, Results, SCHEMA};

const PERSISTENT: &str = crate::PERSISTENT;
const SIZES: [&str; 3] = ["small", "medium", "large"];

pub fn run(args: &[String]) -> Result<(), BoxError> {
    let mut out = PathBuf::from("bench");
    let mut inputs = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => out = PathBuf::from(it.next().ok_or("--out needs a folder")?),
            other if other.starts_with('-') => {
                return Err(format!("unknown argument `{other}`\n{}", crate::USAGE).into());
            }
            path => inputs.push(PathBuf::from(path)),
        }
    }
    if inputs.is_empty() {
        inputs.push(PathBuf::from("bench/results"));
    }
    let files = load(&inputs)?;
    std::fs::create_dir_all(&out)?;
    let md = markdown(&files);
    std::fs::write(out.join("REPORT.md"), md)?;
    plot(&files, &out.join("latency.png"))?;
    eprintln!(
        "wrote {} and {} from {} results file(s)",
        out.join("REPORT.md").display(),
        out.join("latency.png").display(),
        files.len()
    );
    Ok(())
}

/// Every results file named, or found in a named folder, sorted by path.
fn load(inputs: &[PathBuf]) -> Result<Vec<(PathBuf, Results)>, BoxError> {
    let mut paths = Vec::new();
    for p in inputs {
        if p.is_dir() {
            for e in std::fs::read_dir(p)? {
                let e = e?.path();
                if e.extension().is_some_and(|x| x == "json") {
                    paths.push(e);
                }
            }
        } else {
            paths.push(p.clone());
        }
    }
    paths.sort();
    if paths.is_empty() {
        return Err(format!("no results files in {inputs:?}").into());
    }
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            let r: Results =
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
            if r.schema != SCHEMA {
                return Err(
                    format!("{}: schema {} (expected {SCHEMA})", p.display(), r.schema).into(),
                );
            }
            Ok((p, r))
        })
        .collect()
}

fn is_peer(r: &Results) -> bool {
    r.source == "peers"
}

/// Measurements of one chain, by (size, variant), in the order variants first appear.
struct Table<'a> {
    variants: Vec<(&'a str, bool)>,
    cells: BTreeMap<(&'a str, &'a str), &'a Measurement>,
}

fn table<'a>(files: &'a [(PathBuf, Results)], chain: &str) -> Table<'a> {
    let mut t = Table {
        variants: Vec::new(),
        cells: BTreeMap::new(),
    };
    for (_, r) in files {
        for m in r.results.iter().filter(|m| m.chain == chain) {
            if !t.variants.iter().any(|(v, _)| *v == m.variant) {
                t.variants.push((&m.variant, is_peer(r)));
            }
            t.cells.insert((&m.size, &m.variant), m);
        }
    }
    t
}

impl<'a> Table<'a> {
    /// The sizes measured, smallest problem first (by the measurements' `x`, then as SIZES
    /// orders small, medium and large): a case may name sizes of its own ("10 atoms").
    fn sizes(&self) -> Vec<&'a str> {
        let mut sizes: Vec<(&'a str, f64)> = Vec::new();
        for ((size, _), m) in &self.cells {
            if !sizes.iter().any(|(s, _)| s == size) {
                sizes.push((size, m.x));
            }
        }
        let rank = |s: &str| SIZES.iter().position(|z| *z == s).unwrap_or(SIZES.len());
        sizes.sort_by(|a, b| {
            a.1.total_cmp(&b.1)
                .then(rank(a.0).cmp(&rank(b.0)))
                .then(a.0.cmp(b.0))
        });
        sizes.into_iter().map(|(s, _)| s).collect()
    }

    fn best_peer(&self, size: &str) -> Option<&'a Measurement> {
        self.variants
            .iter()
            .filter(|(_, peer)| *peer)
            .filter_map(|(v, _)| self.cells.get(&(size, *v)).copied())
            .min_by(|a, b| a.host_us.median.total_cmp(&b.host_us.median))
    }
}

/// The chains whose time is the time to move their bytes (one pass over their inputs, a few
/// flops a byte): held to the run's copy roof. The products (`matmul_*`) are held to the
/// tensor-core or CUDA-core peak instead; the pairwise chains are bound by neither.
const MEMORY_BOUND: [&str; 9] = [
    "kl_complexity",
    "accuracy_pipeline",
    "squared_residual",
    "row_squared_residual",
    "belief_update",
    "belief_update_bf16",
    "gemv_axpby_sum",
    "gemv_axpby_sum_bf16",
    "gemv_axpby_sum_fp16",
];

/// Dense peaks from NVIDIA's data sheets, TFLOP/s: (name contains, BF16 tensor cores, FP32 CUDA
/// cores). The first match wins, so the PCIe card comes before the SXM part of the same name.
const PEAKS: [(&str, f64, f64); 3] = [
    ("H100 PCIe", 756.0, 51.2),
    ("H100", 989.4, 66.9),
    ("H200", 989.4, 66.9),
];

/// The products and the peak each is held to: (chain, uses tensor cores, tensor-core products per
/// product: a bf16x3 product is three bf16 ones, so its roof is a third of the bf16 peak).
const PRODUCTS: [(&str, bool, f64); 3] = [
    ("matmul_bias_gelu", false, 1.0),
    ("matmul_bias_gelu_bf16x3", true, 3.0),
    ("matmul_bias_gelu_bf16", true, 1.0),
];

/// Bytes a measurement moved, from its rate over its host median.
fn bytes_of(m: &Measurement) -> Option<f64> {
    m.gbps.map(|g| g * m.host_us.median * 1e3)
}

/// "Against the roofs": each memory-bound chain's pptm rate as a share of the copy roof of its
/// size (src/roof.rs, the faster of the two copies), host-visible and on the device; each
/// product's TFLOP/s as a share of the device's peak.
/// Items per second of many small independent items (src/throughput.rs), side by side and in
/// order, and the no-op item's latency against the mapped-memory round trip of the same run.
fn throughput(files: &[(PathBuf, Results)], s: &mut String) {
    let ms: Vec<&Measurement> = files
        .iter()
        .flat_map(|(_, r)| &r.results)
        .filter(|m| m.chain == crate::throughput::CHAIN)
        .collect();
    if ms.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n## Many small items: throughput\n");
    let _ = writeln!(
        s,
        "Items per second over whole bursts (the median burst; p99 in brackets), every thread \
         keeping its window of tickets in flight. `side by side`: independent items start on free \
         blocks while earlier ones run (`Config::side_by_side`, the default); `in order`: one at \
         a time.\n"
    );
    let _ = writeln!(
        s,
        "| items | side by side, items/s | in order, items/s | side by side / in order |"
    );
    let _ = writeln!(s, "|---|---|---|---|");
    let mut shapes: Vec<&str> = Vec::new();
    for m in &ms {
        if !shapes.contains(&m.shape.as_str()) {
            shapes.push(&m.shape);
        }
    }
    let rate = |m: &Measurement| 1e6 / m.host_us.median;
    for shape in shapes {
        let find = |v: &str| ms.iter().find(|m| m.shape == shape && m.variant == v);
        let cell = |m: Option<&&Measurement>| {
            m.map_or("-".into(), |m| {
                format!("{:.0} ({:.0})", rate(m), 1e6 / m.host_us.p99)
            })
        };
        let (a, b) = (find("side by side"), find("in order"));
        let ratio = match (a, b) {
            (Some(a), Some(b)) => format!("{:.2}×", rate(a) / rate(b)),
            _ => "-".into(),
        };
        let _ = writeln!(s, "| {shape} | {} | {} | {ratio} |", cell(a), cell(b));
    }
    let floor = |name: &str| {
        files
            .iter()
            .flat_map(|(_, r)| &r.results)
            .find(|m| m.chain == "dispatch" && m.variant.starts_with(name))
            .map(|m| m.host_us.median)
    };
    if let (Some(noop), Some(trip)) = (
        floor(&format!("no-op item: {PERSISTENT}")),
        floor("floor: mapped-memory round trip"),
    ) {
        let _ = writeln!(
            s,
            "\nOne no-op item, submitted and waited for alone: {noop:.2} µs, {:.2}× the \
             mapped-memory round trip of the same run ({trip:.2} µs).",
            noop / trip
        );
    }
}

fn roofs(files: &[(PathBuf, Results)], s: &mut String) {
    let copies = table(files, crate::roof::CHAIN);
    // The roof of a size: the highest rate among the copies, host-visible and device.
    let roof = |size: &str| -> Option<(f64, Option<f64>)> {
        let ms: Vec<&Measurement> = copies
            .variants
            .iter()
            .filter_map(|(v, _)| copies.cells.get(&(size, *v)).copied())
            .collect();
        let host = ms
            .iter()
            .filter_map(|m| m.gbps)
            .fold(None, |a: Option<f64>, g| Some(a.map_or(g, |a| a.max(g))))?;
        let device = ms
            .iter()
            .filter_map(|m| Some(bytes_of(m)? / (m.device_us?.median * 1e3)))
            .fold(None, |a: Option<f64>, g| Some(a.map_or(g, |a| a.max(g))));
        Some((host, device))
    };
    let _ = writeln!(s, "\n## Against the roofs\n");
    let _ = writeln!(
        s,
        "Memory-bound chains: pptm's rate (the bytes the chain must move over its median) as a \
         share of the fastest plain copy of the same element count in this run (chain `{}`: a \
         copy kernel and `cuMemcpyDtoDAsync`), host-visible and in device time.\n",
        crate::roof::CHAIN
    );
    let _ = writeln!(
        s,
        "| chain | size | shape | pptm GB/s | copy roof GB/s | share | pptm GB/s (device) | roof (device) | share (device) |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    let mut rows = 0;
    for chain in MEMORY_BOUND {
        let t = table(files, chain);
        for size in t.sizes() {
            let (Some(ours), Some((roof_host, roof_dev))) =
                (t.cells.get(&(size, PERSISTENT)), roof(size))
            else {
                continue;
            };
            let Some(gbps) = ours.gbps else { continue };
            let dev = bytes_of(ours)
                .zip(ours.device_us)
                .map(|(b, d)| b / (d.median * 1e3));
            let cell = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
            let share = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.0}%", 100.0 * a / b),
                _ => "-".into(),
            };
            let _ = writeln!(
                s,
                "| {chain} | {size} | {} | {gbps:.0} | {roof_host:.0} | {} | {} | {} | {} |",
                ours.shape,
                share(Some(gbps), Some(roof_host)),
                cell(dev),
                cell(roof_dev),
                share(dev, roof_dev)
            );
            rows += 1;
        }
    }
    if rows == 0 {
        let _ = writeln!(
            s,
            "| (no copy roof or no pptm result in these files) | | | | | | | | |"
        );
    }
    let device = files
        .iter()
        .find(|(_, r)| !is_peer(r))
        .map(|(_, r)| r.device.name.as_str())
        .unwrap_or("");
    let _ = writeln!(
        s,
        "\nProducts: pptm's TFLOP/s as a share of the data-sheet dense peak of {} (BF16 on tensor \
         cores; FP32 on CUDA cores, the path pptm's f32 product runs).\n",
        if device.is_empty() {
            "the device"
        } else {
            device
        }
    );
    let Some(&(_, bf16_peak, fp32_peak)) = PEAKS.iter().find(|(n, ..)| device.contains(n)) else {
        let _ = writeln!(s, "(no data-sheet peak known for `{device}`)");
        return;
    };
    let _ = writeln!(s, "| chain | size | shape | pptm TFLOP/s | peak | share |");
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for (chain, tensor, per) in PRODUCTS {
        let t = table(files, chain);
        let peak = if tensor { bf16_peak / per } else { fp32_peak };
        for size in t.sizes() {
            let Some(tf) = t.cells.get(&(size, PERSISTENT)).and_then(|m| m.tflops) else {
                continue;
            };
            let shape = &t.cells[&(size, PERSISTENT)].shape;
            let _ = writeln!(
                s,
                "| {chain} | {size} | {shape} | {tf:.1} | {peak:.1} ({}) | {:.0}% |",
                if tensor && per > 1.0 {
                    "a third of BF16 tensor cores'"
                } else if tensor {
                    "BF16 tensor cores"
                } else {
                    "FP32 CUDA cores"
                },
                100.0 * tf / peak
            );
        }
    }
}

fn markdown(files: &[(PathBuf, Results)]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# pptm benchmark report\n");
    let _ = writeln!(
        s,
        "Generated by `pptm-bench report` from the results files below; every figure is \
         host-visible latency (submit → result on the host, one item in flight), median over \
         repetitions after warm-up, unless marked otherwise. Ratios are the best peer's median \
         over the variant's: above 1 is faster than any peer at that size. Peers are PyTorch's \
         variants, and for the dependent-steps cases also hand-written CUDA kernels launched one \
         by one, as a CUDA graph, and as a graph with programmatic dependent launch \
         (bench/probes/dependent_steps.cu).\n"
    );
    let _ = writeln!(
        s,
        "| file | source | date (UTC) | commit | device | driver | mode |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for (p, r) in files {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            p.file_name()
                .map(|f| f.to_string_lossy())
                .unwrap_or_default(),
            r.source,
            r.date,
            r.commit,
            r.device.name,
            r.device.driver,
            match (r.quick, r.partial) {
                (true, false) => "quick",
                (false, false) => "full",
                (true, true) => "quick, stopped early (partial)",
                (false, true) => "full, stopped early (partial)",
            }
        );
    }
    let clocks: Vec<String> = files
        .iter()
        .flat_map(|(_, r)| {
            r.device
                .clocks
                .iter()
                .map(move |c| format!("{}: {c}", r.source))
        })
        .collect();
    if !clocks.is_empty() {
        let _ = writeln!(s, "\nClocks seen (nvidia-smi): {}.", clocks.join("; "));
    }

    // Summary: pptm persistent against the best peer, every chain and size.
    let _ = writeln!(s, "\n## pptm's persistent manifold against the best peer\n");
    let _ = writeln!(
        s,
        "| chain | size | shape | pptm fused persistent µs | best peer | its µs | ratio | result vs PyTorch (rel.) |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    for chain in CHAINS {
        let t = table(files, chain);
        for size in t.sizes() {
            let Some(ours) = t.cells.get(&(size, PERSISTENT)) else {
                continue;
            };
            let (peer, peer_us, ratio, cross) = match t.best_peer(size) {
                Some(p) => (
                    p.variant.as_str(),
                    format!("{:.1}", p.host_us.median),
                    format!("**{:.2}×**", p.host_us.median / ours.host_us.median),
                    match (ours.value, p.value) {
                        (Some(a), Some(b)) => format!("{:.1e}", (a - b).abs() / b.abs().max(1e-30)),
                        _ => "-".into(),
                    },
                ),
                None => ("(no peer results)", "-".into(), "-".into(), "-".into()),
            };
            let _ = writeln!(
                s,
                "| {chain} | {size} | {} | {:.1} | {peer} | {peer_us} | {ratio} | {cross} |",
                ours.shape, ours.host_us.median
            );
        }
    }

    roofs(files, &mut s);
    throughput(files, &mut s);

    // Per chain: every variant and peer.
    let _ = writeln!(s, "\n## Every variant, chain by chain\n");
    let _ = writeln!(
        s,
        "Cells: median µs (p99 µs), ×ratio to the best peer at that size.\n"
    );
    for chain in std::iter::once("dispatch")
        .chain(CHAINS)
        .chain([crate::roof::CHAIN])
    {
        let t = table(files, chain);
        if t.variants.is_empty() {
            continue;
        }
        let sizes: Vec<&str> = if chain == "dispatch" {
            vec!["-"]
        } else {
            t.sizes()
        };
        let _ = writeln!(s, "### {chain}\n");
        let shapes: Vec<String> = sizes
            .iter()
            .filter_map(|z| {
                t.cells
                    .iter()
                    .find(|((s, _), _)| s == z)
                    .map(|(_, m)| format!("{z}: {}", m.shape))
            })
            .collect();
        if chain != "dispatch" {
            let _ = writeln!(s, "{}\n", shapes.join("; "));
        }
        let _ = write!(s, "| variant |");
        for z in &sizes {
            let _ = write!(s, " {} |", if *z == "-" { "latency" } else { z });
        }
        let _ = writeln!(s, "\n|---|{}", "---|".repeat(sizes.len()));
        for (v, peer) in &t.variants {
            let name = if *v == PERSISTENT {
                format!("**{v}**")
            } else if *peer && !v.contains("hand-written") {
                format!("PyTorch: {v}")
            } else if *peer {
                format!("peer: {v}")
            } else {
                v.to_string()
            };
            let _ = write!(s, "| {name} |");
            for z in &sizes {
                match t.cells.get(&(*z, *v)) {
                    Some(m) => {
                        let ratio = t
                            .best_peer(z)
                            .map(|p| format!(", ×{:.2}", p.host_us.median / m.host_us.median))
                            .unwrap_or_default();
                        let _ = write!(
                            s,
                            " {:.1} ({:.1}){ratio} |",
                            m.host_us.median, m.host_us.p99
                        );
                    }
                    None => {
                        let _ = write!(s, " - |");
                    }
                }
            }
            let _ = writeln!(s);
        }
        let _ = writeln!(s);
    }

    // Everything, with device time and rates.
    let _ = writeln!(s, "## All measurements\n");
    let _ = writeln!(
        s,
        "Device time: the manifold's %globaltimer stamps (first block takes the item → last block \
         finishes it), CUDA events around the launches otherwise. Rates use the host-visible \
         median and the bytes and flops the chain must move and do.\n"
    );
    let _ = writeln!(
        s,
        "| source | chain | size | shape | variant | median µs | p99 µs | reps | device median µs | GB/s | TFLOP/s | max rel. err | value |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let opt = |v: Option<f64>, f: fn(f64) -> String| v.map(f).unwrap_or_else(|| "-".into());
    for (_, r) in files {
        for m in &r.results {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {} |",
                r.source,
                m.chain,
                m.size,
                m.shape,
                m.variant,
                m.host_us.median,
                m.host_us.p99,
                m.host_us.reps,
                opt(m.device_us.map(|d| d.median), |v| format!("{v:.2}")),
                opt(m.gbps, |v| format!("{v:.1}")),
                opt(m.tflops, |v| format!("{v:.3}")),
                opt(m.max_rel_err, |v| format!("{v:.1e}")),
                opt(m.value, |v| format!("{v:.6e}")),
            );
        }
    }
    let refused: Vec<_> = files
        .iter()
        .flat_map(|(_, r)| r.refused.iter().map(move |x| (r.source.as_str(), x)))
        .collect();
    let _ = writeln!(s, "\n## Refused\n");
    if refused.is_empty() {
        let _ = writeln!(s, "None: every variant's result passed its check.");
    }
    for (src, x) in refused {
        let _ = writeln!(
            s,
            "- {src}: {} {} {}: {}",
            x.chain, x.size, x.variant, x.reason
        );
    }
    s
}

/// Latency against size, log-log, one panel per chain, one line per variant; the eighth panel is
/// the legend.
fn plot(files: &[(PathBuf, Results)], path: &Path) -> Result<(), BoxError> {
    static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| "the bundled font does not load")?;
    let err = |e: DrawingAreaErrorKind<_>| -> BoxError { format!("plot: {e}").into() };

    let mut variants: Vec<(String, bool)> = Vec::new();
    for (_, r) in files {
        for m in r.results.iter().filter(|m| m.chain != "dispatch") {
            if !variants.iter().any(|(v, _)| *v == m.variant) {
                variants.push((m.variant.clone(), is_peer(r)));
            }
        }
    }
    // pptm's persistent manifold first: it gets the first (red, thick) line.
    variants.sort_by_key(|(v, _)| v != PERSISTENT);
    let color = |i: usize| -> RGBColor {
        const C: [RGBColor; 10] = [
            RGBColor(214, 39, 40),
            RGBColor(31, 119, 180),
            RGBColor(255, 127, 14),
            RGBColor(44, 160, 44),
            RGBColor(148, 103, 189),
            RGBColor(140, 86, 75),
            RGBColor(227, 119, 194),
            RGBColor(127, 127, 127),
            RGBColor(188, 189, 34),
            RGBColor(23, 190, 207),
        ];
        C[i % C.len()]
    };

    // One panel per chain and one for the legend, four a row.
    let rows = (CHAINS.len() + 1).div_ceil(4);
    let root = BitMapBackend::new(path, (2000, 375 * rows as u32 + 100)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let device = files
        .iter()
        .find(|(_, r)| r.source == "pptm")
        .or(files.first())
        .map(|(_, r)| format!("{}, driver {}, {}", r.device.name, r.device.driver, r.date))
        .unwrap_or_default();
    let root = root
        .titled(
            &format!("host-visible latency (median µs) against size — {device}"),
            ("sans-serif", 26),
        )
        .map_err(err)?;
    let panels = root.split_evenly((rows, 4));
    debug_assert!(panels.len() > CHAINS.len());
    for (chain, area) in CHAINS.iter().zip(panels.iter()) {
        let ms: Vec<&Measurement> = files
            .iter()
            .flat_map(|(_, r)| r.results.iter())
            .filter(|m| m.chain == *chain)
            .collect();
        if ms.is_empty() {
            continue;
        }
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for m in &ms {
            x0 = x0.min(m.x);
            x1 = x1.max(m.x);
            y0 = y0.min(m.host_us.median);
            y1 = y1.max(m.host_us.median);
        }
        let (x0, x1) = (x0 / 1.5, x1 * 1.5);
        let (y0, y1) = (y0 / 1.5, y1 * 1.5);
        let x_desc = match *chain {
            "kl_complexity"
            | "accuracy_pipeline"
            | "squared_residual"
            | "squared_residual_own_ops"
            | "row_squared_residual" => "elements",
            "distance_kth" | "te_reduction" => "points",
            "dependent_steps_waited"
            | "dependent_steps_pipeline"
            | "dependent_steps_kept"
            | "dependent_steps_fused"
            | "dependent_gemv_waited"
            | "dependent_gemv_pipeline"
            | "dependent_gemv_kept" => "dependent steps",
            "matmul_bias_gelu" | "matmul_bias_gelu_bf16x3" => "m (shapes in REPORT.md)",
            "geodesics" => "RK4 steps",
            "md" => "atoms",
            _ => "matrix side (m = n)",
        };
        let mut chart = ChartBuilder::on(area)
            .caption(*chain, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc("µs")
            .label_style(("sans-serif", 14))
            .max_light_lines(1)
            .x_labels(6)
            .y_labels(6)
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()
            .map_err(err)?;
        for (i, (v, _)) in variants.iter().enumerate() {
            let mut pts: Vec<(f64, f64)> = ms
                .iter()
                .filter(|m| m.variant == *v)
                .map(|m| (m.x, m.host_us.median))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let width = if v == PERSISTENT { 4 } else { 2 };
            chart
                .draw_series(LineSeries::new(pts.clone(), color(i).stroke_width(width)))
                .map_err(err)?;
            chart
                .draw_series(
                    pts.into_iter()
                        .map(|p| Circle::new(p, 4, color(i).filled())),
                )
                .map_err(err)?;
        }
    }
    // The legend.
    let legend = &panels[CHAINS.len().min(panels.len() - 1)];
    for (i, (v, peer)) in variants.iter().enumerate() {
        let y = 40 + 32 * i as i32;
        legend
            .draw(&PathElement::new(
                vec![(20, y), (70, y)],
                color(i).stroke_width(if v == PERSISTENT { 4 } else { 2 }),
            ))
            .map_err(err)?;
        let label = if *peer && !v.contains("hand-written") {
            format!("PyTorch: {v}")
        } else if *peer {
            format!("peer: {v}")
        } else {
            v.clone()
        };
        legend
            .draw(&Text::new(label, (80, y - 9), ("sans-serif", 18)))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{DeviceInfo, Stat};

    fn measurement(
        chain: &str,
        size: &str,
        variant: &str,
        us: f64,
        dev_us: f64,
        bytes: f64,
    ) -> Measurement {
        let stat = |median: f64| Stat {
            median,
            p99: median,
            reps: 100,
        };
        Measurement {
            chain: chain.into(),
            size: size.into(),
            shape: "n = 67108864".into(),
            x: 1.0,
            variant: variant.into(),
            host_us: stat(us),
            device_us: Some(stat(dev_us)),
            gbps: Some(bytes / (us * 1e3)),
            tflops: Some(1.0),
            max_rel_err: Some(0.0),
            value: None,
        }
    }

    fn pptm_file(results: Vec<Measurement>, device: &str) -> (PathBuf, Results) {
        (
            PathBuf::from("pptm.json"),
            Results {
                schema: SCHEMA.into(),
                source: "pptm".into(),
                date: "2026-11-28T00:00:00Z".into(),
                commit: "test".into(),
                quick: false,
                partial: false,
                device: DeviceInfo {
                    name: device.into(),
                    ..Default::default()
                },
                results,
                refused: Vec::new(),
            },
        )
    }

    #[test]
    fn memory_bound_chains_are_shares_of_the_fastest_copy() {
        let gb = 1e9;
        let files = vec![pptm_file(
            vec![
                // Copies of 4 GB: 1000 µs (4000 GB/s) and 800 µs (5000 GB/s, the roof); on the
                // device 900 and 750 µs.
                measurement(
                    crate::roof::CHAIN,
                    "large",
                    crate::roof::KERNEL,
                    1000.0,
                    900.0,
                    4.0 * gb,
                ),
                measurement(
                    crate::roof::CHAIN,
                    "large",
                    crate::roof::MEMCPY,
                    800.0,
                    750.0,
                    4.0 * gb,
                ),
                // 2 GB in 500 µs: 4000 GB/s, 80% of the roof; 375 µs on the device: 5333 GB/s,
                // the memcpy's own device rate (100%).
                measurement("kl_complexity", "large", PERSISTENT, 500.0, 375.0, 2.0 * gb),
                // A pptm result with no roof of its size is left out.
                measurement("kl_complexity", "small", PERSISTENT, 5.0, 1.0, 1e5),
            ],
            "NVIDIA H200",
        )];
        let mut s = String::new();
        roofs(&files, &mut s);
        let row = s
            .lines()
            .find(|l| l.starts_with("| kl_complexity | large"))
            .expect("a row for the large size");
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(
            &cells[4..10],
            ["4000", "5000", "80%", "5333", "5333", "100%"]
        );
        assert!(!s.contains("| kl_complexity | small"), "{s}");
    }

    #[test]
    fn products_are_held_to_the_devices_peak_and_unknown_devices_say_so() {
        let mut product = measurement("matmul_bias_gelu_bf16", "large", PERSISTENT, 1.0, 1.0, 1.0);
        product.tflops = Some(494.7);
        let mut s = String::new();
        roofs(
            &[pptm_file(vec![product.clone()], "NVIDIA H100 80GB HBM3")],
            &mut s,
        );
        assert!(
            s.contains("| 494.7 | 989.4 (BF16 tensor cores) | 50% |"),
            "{s}"
        );
        let mut s = String::new();
        roofs(&[pptm_file(vec![product], "NVIDIA L4")], &mut s);
        assert!(
            s.contains("no data-sheet peak known for `NVIDIA L4`"),
            "{s}"
        );
    }
}
