//! The build-script entry point: keep generated/ in step with the crate's chains.

use std::path::PathBuf;

use crate::nvrtc::{Nvrtc, NvrtcError};
use crate::project::CodegenError;
use crate::project::{
    DEPENDENCY_OPS_ENV, DEV_FOLDER, LIBRARY_FOLDER, OP_SOURCES_KEY, Project, plan_trees,
};

/// Call from a crate's `build.rs` (its whole `main`):
///
/// ```no_run
/// pptm_codegen::build_script();
/// ```
///
/// It scans the crate for chains and compares each of its two generated trees with them: the
/// library's (src/ → generated/) and that of its tests, examples and benches (→ generated-dev/).
/// When fresh, it does nothing. When stale, it regenerates the tree if NVRTC 13.0 is available
/// (and says so in a warning: commit the result), and otherwise fails the build with the command
/// that fixes it. `PPTM_CODEGEN=verify` never writes (CI uses it); `PPTM_NVRTC` points at
/// libnvrtc.so.13.
///
/// Ops across crates: a crate with a `links` key publishes its src/ folder as build-script
/// metadata, and the crates that depend on it directly may name its `#[pptm::op]` ops in their
/// chains (this function finds them, and hands them to the derive macro; docs/ops.md).
pub fn build_script() {
    let root =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("run from a build script"));
    // Only folders that exist: a missing path makes cargo rerun the script (and rebuild the
    // crate) on every build.
    let library = Project::library(&root);
    for dir in library
        .op_dirs
        .iter()
        .map(String::as_str)
        .chain([LIBRARY_FOLDER, DEV_FOLDER])
    {
        let path = root.join(dir);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    // Modules that a `#[path = "..."]` brings in from outside those folders (scan::rust_files).
    let skip: Vec<&str> = library.skip.iter().map(String::as_str).collect();
    let dirs: Vec<&str> = library.op_dirs.iter().map(String::as_str).collect();
    if let Ok(files) = crate::scan::rust_files(&root, &dirs, &skip) {
        for f in files
            .iter()
            .filter(|f| f.starts_with("..") || f.is_absolute())
        {
            println!("cargo:rerun-if-changed={}", root.join(f).display());
        }
    }
    // The ops of the crates this one depends on, for this crate's chains (their edits change its
    // generated code), and this crate's own for its dependents.
    let dependency_ops = crate::project::dependency_op_dirs();
    for dir in &dependency_ops {
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    match std::env::join_paths(&dependency_ops) {
        Ok(joined) => println!(
            "cargo:rustc-env={DEPENDENCY_OPS_ENV}={}",
            joined.to_string_lossy()
        ),
        Err(e) => fail(&format!(
            "pptm codegen: the folders of the crates this one takes ops from do not join into \
             one variable ({e}): {dependency_ops:?}"
        )),
    }
    if std::env::var_os("CARGO_MANIFEST_LINKS").is_some() {
        println!(
            "cargo:{OP_SOURCES_KEY}={}",
            root.join(crate::project::LIBRARY_DIRS[0]).display()
        );
    }
    println!("cargo:rerun-if-env-changed=PPTM_CODEGEN");
    println!("cargo:rerun-if-env-changed=PPTM_NVRTC");
    println!("cargo:rerun-if-env-changed=PPTM_LINEINFO");

    let trees = match plan_trees(&root) {
        Ok(t) => t,
        // A chain or file that does not compile: rustc and the derive report it where it is
        // written, and generated code stays as it is meanwhile (nothing is deleted).
        Err(CodegenError::InvalidSources { problems }) => {
            for p in &problems {
                println!(
                    "cargo:warning=pptm: {p} (generated code is left as it is until this compiles)"
                );
            }
            return;
        }
        Err(e) => fail(&format!("pptm codegen: {e}")),
    };
    let verify_only = std::env::var("PPTM_CODEGEN").is_ok_and(|v| v == "verify");
    let mut nvrtc = None;
    for (project, plan) in &trees {
        let stale = project.verify(plan);
        if stale.is_empty() {
            continue;
        }
        let folder = project.folder();
        let reasons = stale
            .iter()
            .map(|r| format!("  - {r}"))
            .collect::<Vec<_>>()
            .join("\n");
        if nvrtc.is_none() && !verify_only {
            nvrtc = match Nvrtc::find() {
                Ok(n) => Some(n),
                // Not installed: the error below says how to get it.
                Err(NvrtcError::NotFound { .. }) => None,
                // PPTM_NVRTC naming nothing, a library that does not load, the wrong version.
                Err(e) => fail(&format!(
                    "pptm: {folder}/ is stale:\n{reasons}\nand NVRTC cannot regenerate it: {e}"
                )),
            };
        }
        match &nvrtc {
            Some(nvrtc) => match project.regenerate(plan, nvrtc) {
                Ok(_) => {
                    for r in &stale {
                        println!(
                            "cargo:warning=pptm: regenerated {folder}/ ({r}); commit the result"
                        );
                    }
                }
                Err(e) => fail(&format!(
                    "pptm codegen: {folder}/ is stale:\n{reasons}\nand regenerating it failed: {e}"
                )),
            },
            None => fail(&format!(
                "pptm: {folder}/ is stale:\n{reasons}\n\
                 Run `{}` on a machine with NVRTC 13.0 (build.rs regenerates it) and commit \
                 {folder}/.\n\
                 NVRTC: {}{}",
                crate::regenerate_command(&root),
                crate::NVRTC_INSTALL_HINT,
                if verify_only {
                    "\n(PPTM_CODEGEN=verify: this build does not regenerate)"
                } else {
                    ""
                }
            )),
        }
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("{msg}");
    std::process::exit(1)
}
