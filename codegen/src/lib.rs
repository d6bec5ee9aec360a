//! Build-time code generation for pptm: chains in a crate's sources → CUDA C → PTX in `generated/`
//! (the chains of src/) and `generated-dev/` (those of tests/, examples/ and benches/).
//!
//! | step | module |
//! |---|---|
//! | find `#[derive(FusionBuilder)]` structs in `src/`, `examples/`, `tests/` | [`scan`] |
//! | one CUDA C translation unit per domain, from the op headers in `kernels/` | [`cuda`] |
//! | compile it for each target arch | [`nvrtc`] |
//! | write / verify `generated/` and its manifest | [`manifest`], [`project`] |
//! | what a build script calls | [`build_script`] |
//!
//! Without NVRTC nothing is compiled: the committed PTX is used, and its manifest's input hash is
//! checked against the sources, so a stale `generated/` fails the build with the command to run.

pub mod cuda;
pub mod kernels;
pub mod manifest;
pub mod nvrtc;
pub mod project;
pub mod scan;

mod build;
pub use build::build_script;

/// Bumped whenever the generated code changes for the same inputs (it is part of the input hash).
pub const CODEGEN_VERSION: u32 = 3;

/// PTX targets generated for every domain. compute_80 runs (JIT) on A100, Ada and Hopper;
/// compute_90 on Hopper and later; compute_90a (wgmma, TMA, tensormap.replace) only on sm_90,
/// which is what H100 and H200 load.
pub const ARCHS: &[&str] = &["compute_80", "compute_90", "compute_90a"];

/// The command that regenerates `generated/` (named in every staleness error).
pub const REGENERATE_COMMAND: &str = "cargo xtask codegen";

/// How to get the pinned NVRTC (named when NVRTC is needed and missing).
pub const NVRTC_INSTALL_HINT: &str = "python3 -m pip install nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 \
     nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85 (or set PPTM_NVRTC to the path of libnvrtc.so.13)";
