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

#![warn(missing_docs)]

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

/// The command that regenerates `generated/` in pptm's own workspace (its `xtask` alias).
pub const REGENERATE_COMMAND: &str = "cargo xtask codegen";

/// The command that regenerates the generated code of the crate at `root`, as it can be run
/// there: pptm's `cargo xtask codegen` inside a workspace that has that alias (a
/// `.cargo/config.toml` defining `xtask` in `root` or a folder above it), else a plain build,
/// whose build.rs regenerates when NVRTC is installed.
pub fn regenerate_command(root: &std::path::Path) -> String {
    let has_xtask = root.ancestors().any(|dir| {
        std::fs::read_to_string(dir.join(".cargo/config.toml"))
            .is_ok_and(|t| t.lines().any(|l| l.trim_start().starts_with("xtask")))
    });
    if has_xtask {
        REGENERATE_COMMAND.to_string()
    } else {
        "cargo build".to_string()
    }
}

/// How to get the pinned NVRTC (named when NVRTC is needed and missing).
pub const NVRTC_INSTALL_HINT: &str = "python3 -m pip install nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 \
     nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85 (or set PPTM_NVRTC to the path of libnvrtc.so.13)";
