//! Development commands (rust-analyzer's xtask pattern):
//!
//! * `cargo xtask codegen` regenerates the generated code of every crate of the workspace with
//!   chains (generated/ and generated-dev/ of pptm, bench and tests/downstream; needs NVRTC 13.0);
//!   `--check` regenerates into a temporary folder and fails on any difference (CI runs it).
//! * `cargo xtask abi` regenerates runtime/src/gpu/abi_generated.rs from kernels/pptm/abi.h with
//!   bindgen (needs libclang); `--check` fails if the committed file differs.
//! * `cargo xtask headers DIR` writes every header generated code includes (kernels/ and the
//!   built-in ops' subset header) under DIR, for the stand-alone probes of bench/probes/, which
//!   nvcc compiles with `-I DIR` on GPU hosts without Rust.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use pptm_codegen::nvrtc::Nvrtc;
use pptm_codegen::project::plan_trees_with;

const ABI_HEADER: &str = "kernels/pptm/abi.h";
const ABI_RUST: &str = "runtime/src/gpu/abi_generated.rs";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let check = args.iter().any(|a| a == "--check");
    let result = match args.first().map(String::as_str) {
        Some("codegen") => codegen(check),
        Some("abi") => abi(check),
        Some("headers") if args.len() == 2 => headers(Path::new(&args[1])),
        _ => Err(
            "usage: cargo xtask codegen [--check] | cargo xtask abi [--check] | cargo xtask headers DIR"
                .to_string(),
        ),
    };
    match result {
        Ok(msg) => {
            println!("{msg}");
            ExitCode::SUCCESS
        }
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn headers(dir: &Path) -> Result<String, String> {
    let all = pptm_codegen::kernels::headers();
    for (name, text) in all {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(format!(
        "{} headers written under {}",
        all.len(),
        dir.display()
    ))
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// The workspace's crates that declare chains (each has a build.rs that calls
/// `pptm_codegen::build_script()`), relative to the workspace root, each with the src/ folders of
/// the crates it takes ops from (what its build.rs finds in `DEP_<LINKS>_PPTM_OP_SOURCES`).
const CRATES_WITH_CHAINS: &[(&str, &[&str])] = &[
    (".", &[]),
    ("bench", &[]),
    ("tests/downstream", &["tests/downstream-ops/src"]),
];

fn codegen(check: bool) -> Result<String, String> {
    let root = workspace_root();
    let nvrtc = Nvrtc::find().map_err(|e| e.to_string())?;
    let mut report = Vec::new();
    let mut stale = Vec::new();
    let mut trees = Vec::new();
    for (krate, op_crates) in CRATES_WITH_CHAINS {
        let dependency_ops: Vec<PathBuf> = op_crates.iter().map(|d| root.join(d)).collect();
        trees.extend(
            plan_trees_with(&root.join(krate), &dependency_ops)
                .map_err(|e| format!("{krate}: {e}"))?,
        );
    }
    for (project, plan) in &trees {
        let folder = project
            .generated
            .strip_prefix(&root)
            .unwrap_or(&project.generated)
            .display()
            .to_string();
        if check {
            let diffs = project.check(plan, &nvrtc).map_err(|e| e.to_string())?;
            if diffs.is_empty() {
                report.push(format!(
                    "{folder}/ is up to date (NVRTC {:?} at {})",
                    nvrtc.version(),
                    nvrtc.path().display()
                ));
            } else {
                stale.extend(diffs);
            }
        } else {
            let m = project
                .regenerate(plan, &nvrtc)
                .map_err(|e| e.to_string())?;
            let chains: usize = m.domains.iter().map(|d| d.chains.len()).sum();
            report.push(format!(
                "{folder}/: {} domain(s), {chains} chain(s), NVRTC {}",
                m.domains.len(),
                m.nvrtc
            ));
        }
    }
    if stale.is_empty() {
        Ok(report.join("\n"))
    } else {
        Err(format!(
            "generated code is stale:\n{}\nrun `cargo xtask codegen` and commit the generated folders",
            stale
                .iter()
                .map(|d| format!("  - {d}"))
                .collect::<Vec<_>>()
                .join("\n")
        ))
    }
}

fn abi(check: bool) -> Result<String, String> {
    let root = workspace_root();
    let bindings = bindgen::Builder::default()
        .header(root.join(ABI_HEADER).display().to_string())
        .allowlist_type("pptm_.*")
        .allowlist_var("PPTM_.*")
        .derive_default(true)
        .derive_debug(true)
        .layout_tests(true)
        .generate_comments(true)
        .use_core()
        .raw_line(format!(
            "// GENERATED from {ABI_HEADER} by `cargo xtask abi`. Do not edit."
        ))
        .generate()
        .map_err(|e| {
            format!(
                "bindgen on {ABI_HEADER}: {e} (is libclang installed? apt-get install libclang1-14)"
            )
        })?
        .to_string();
    let path = root.join(ABI_RUST);
    if check {
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed == bindings {
            Ok(format!("{ABI_RUST} matches {ABI_HEADER}"))
        } else {
            Err(format!(
                "{ABI_RUST} does not match {ABI_HEADER}; run `cargo xtask abi` and commit it"
            ))
        }
    } else {
        std::fs::write(&path, bindings).map_err(|e| format!("cannot write {ABI_RUST}: {e}"))?;
        Ok(format!("wrote {ABI_RUST}"))
    }
}
