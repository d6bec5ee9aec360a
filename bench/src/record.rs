//! The results file, `pptm-bench/1`: what pptm-bench and bench/peers.py both write and the report
//! reads. One file per source (pptm, peers); the report merges every file it is given.

use serde::{Deserialize, Serialize};

pub const SCHEMA: &str = "pptm-bench/1";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    pub schema: String,
    /// "pptm" or "peers".
    pub source: String,
    /// UTC, ISO 8601.
    pub date: String,
    pub commit: String,
    pub quick: bool,
    /// The run stopped before its end (a time limit): the file holds what it measured until then
    /// (pptm-bench writes it after every measurement; `--resume` completes it).
    #[serde(default)]
    pub partial: bool,
    pub device: DeviceInfo,
    pub results: Vec<Measurement>,
    /// Variants that were not timed, and why (a wrong result, an error).
    pub refused: Vec<Refusal>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub driver: String,
    /// SM and memory clocks (MHz) as nvidia-smi saw them before and after the run, and the SM
    /// clock's maximum; empty when nvidia-smi is not there.
    #[serde(default)]
    pub clocks: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measurement {
    pub chain: String,
    /// small, medium or large ("-" for the dispatch floors).
    pub size: String,
    pub shape: String,
    /// The plot's size axis.
    pub x: f64,
    pub variant: String,
    /// Submit → result on the host, µs.
    pub host_us: Stat,
    /// Device time, µs, where the variant measures it.
    pub device_us: Option<Stat>,
    /// Effective rates over the host-visible median.
    pub gbps: Option<f64>,
    pub tflops: Option<f64>,
    /// Largest relative error against the f64 reference (checked before and after timing).
    pub max_rel_err: Option<f64>,
    /// The scalar result, or the sum of the output: cross-checked between pptm and PyTorch.
    pub value: Option<f64>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Stat {
    pub median: f64,
    pub p99: f64,
    pub reps: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Refusal {
    pub chain: String,
    pub size: String,
    pub variant: String,
    pub reason: String,
}
