//! Finds the fusion chains declared in a crate's sources: every struct with
//! `#[derive(FusionBuilder)]`, at any depth (modules, function bodies), and the parts of every
//! `#[derive(Pipeline)]` (each a chain of its own). Ops of the crate's own (`#[pptm::op]`
//! functions, in any of its files) are found first, so chains can name them.
//!
//! Files that do not parse, and chains or pipelines that do not validate, are listed as
//! [`Problem`]s (file, line, the macro's message): while there are any, generated code is left as
//! it is (a typo must not delete a domain's PTX), and rustc and the derive macro report them, with
//! spans, when the crate itself compiles.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pptm_spec::parse::{
    derives_fusion_builder, derives_pipeline, parse_chain, parse_pipeline, user_ops_in,
    user_states_in,
};
use pptm_spec::{ChainIr, ChainSpec};
use syn::visit::Visit;

/// A declaration that does not compile: a file that does not parse, a chain or a pipeline that
/// does not validate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Relative to the crate's root.
    pub file: PathBuf,
    /// The line the error points at, from 1.
    pub line: usize,
    /// The column the error points at, from 1 (as compilers print it).
    pub column: usize,
    /// What the derive macro (or rustc's parser) says.
    pub message: String,
}

impl Problem {
    fn of(file: &Path, e: &syn::Error) -> Self {
        let at = e.span().start();
        Problem {
            file: file.to_path_buf(),
            line: at.line,
            column: at.column + 1,
            message: e.to_string(),
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file.display(),
            self.line,
            self.column,
            self.message
        )
    }
}

/// Chains found, one per distinct spec (identical declarations in several files count once).
#[derive(Debug, Default)]
pub struct Found {
    /// The chains (and pipeline parts) that lower, sorted by domain, name and spec hash.
    pub chains: Vec<ChainIr>,
    /// Declarations that do not compile (see [`Problem`]).
    pub problems: Vec<Problem>,
    /// Every .rs file read for chains, relative to the root.
    pub files: Vec<PathBuf>,
    /// The first file (relative to the root) that declares each chain, by spec hash.
    pub origins: BTreeMap<String, PathBuf>,
}

/// Why the sources could not be scanned (a declaration that does not compile is a [`Problem`]
/// instead, collected in [`Found::problems`]).
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// A source file or folder could not be read.
    #[error("cannot read {path}: {err}")]
    Io {
        /// The file or folder, as given (joined to the root).
        path: String,
        /// What the OS said.
        err: std::io::Error,
    },
    /// Two chains of one domain hash to the same opcode, so the manifold could not tell their
    /// items apart.
    #[error(
        "chains `{a}` and `{b}` of domain `{domain}` have the same opcode 0x{opcode:08x}; rename one"
    )]
    OpcodeCollision {
        /// The domain both chains join.
        domain: String,
        /// One chain's name (the first in name order).
        a: String,
        /// The other's.
        b: String,
        /// The opcode both have.
        opcode: u32,
    },
}

/// Every .rs file under `dirs` of `root` (relative to it, sorted), skipping any path that starts
/// with one of `skip`, and the files that their `#[path = "..."]` modules name wherever those
/// are: a module shared with another crate (an example's op that a benchmark also runs) is part
/// of each crate that declares it, and may lie outside the crate's folder (then its path
/// starts with `..`).
pub fn rust_files(root: &Path, dirs: &[&str], skip: &[&str]) -> Result<Vec<PathBuf>, ScanError> {
    let mut files = Vec::new();
    for dir in dirs {
        collect_rs(root, &root.join(dir), skip, &mut files)?;
    }
    let mut next = 0;
    while next < files.len() {
        for found in path_modules(root, &files[next]) {
            let rel = found.to_string_lossy().replace('\\', "/");
            if !files.contains(&found) && !skip.iter().any(|s| rel.starts_with(s)) {
                files.push(found);
            }
        }
        next += 1;
    }
    files.sort();
    Ok(files)
}

/// The existing files that the `#[path = "..."]` module declarations (`mod m;`) of `file` name,
/// relative to `root`. As rustc resolves them: from the declaring file's folder, and inside
/// inline modules from a folder per module (after one named after the file, unless it is a
/// crate root or a mod.rs). A file that does not parse names none (rustc reports it).
fn path_modules(root: &Path, file: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(root.join(file)) else {
        return Vec::new();
    };
    if !text.contains("path") {
        return Vec::new();
    }
    let Ok(parsed) = syn::parse_file(&text) else {
        return Vec::new();
    };
    let dir = file.parent().unwrap_or(Path::new("")).to_path_buf();
    let crate_root = file.parent().is_some_and(|d| {
        ["src", "src/bin", "examples", "tests", "benches"]
            .iter()
            .any(|r| d == Path::new(r))
    });
    let mod_rs = crate_root || file.file_name().is_some_and(|n| n == "mod.rs");
    let nested = if mod_rs {
        dir.clone()
    } else {
        dir.join(file.file_stem().unwrap_or_default())
    };
    let mut out = Vec::new();
    path_modules_in(root, &parsed.items, &dir, &nested, &mut out);
    out
}

/// [`path_modules`] over `items`, whose `#[path]`s resolve from `dir`; inline modules among
/// them resolve theirs from `nested`/name.
fn path_modules_in(
    root: &Path,
    items: &[syn::Item],
    dir: &Path,
    nested: &Path,
    out: &mut Vec<PathBuf>,
) {
    for item in items {
        let syn::Item::Mod(m) = item else { continue };
        match &m.content {
            Some((_, inner)) => {
                let here = nested.join(m.ident.to_string());
                path_modules_in(root, inner, &here, &here, out);
            }
            None => {
                let path = m.attrs.iter().find_map(|a| match &a.meta {
                    syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
                        syn::Expr::Lit(syn::ExprLit {
                            lit: syn::Lit::Str(s),
                            ..
                        }) => Some(s.value()),
                        _ => None,
                    },
                    _ => None,
                });
                if let Some(path) = path {
                    let rel = lexically_normal(&dir.join(path));
                    if root.join(&rel).is_file() {
                        out.push(rel);
                    }
                }
            }
        }
    }
}

/// `path` with `.` removed and each `..` taking the folder before it away, where there is one:
/// `examples/../../x.rs` is `../x.rs`.
fn lexically_normal(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut parts: Vec<Component<'_>> = Vec::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if matches!(parts.last(), Some(Component::Normal(_))) => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    parts.iter().collect()
}

/// The files among `files` (relative to `root`) that parse, with their paths; the others are
/// [`Problem`]s in `problems` (rustc reports them too).
fn parse_files_noting(
    root: &Path,
    files: &[PathBuf],
    problems: &mut Vec<Problem>,
) -> Result<Vec<(PathBuf, syn::File)>, ScanError> {
    let mut parsed = Vec::with_capacity(files.len());
    for rel in files {
        let path = root.join(rel);
        let text = std::fs::read_to_string(&path).map_err(|err| ScanError::Io {
            path: path.display().to_string(),
            err,
        })?;
        match syn::parse_file(&text) {
            Ok(file) => parsed.push((rel.clone(), file)),
            Err(e) => problems.push(Problem::of(rel, &e)),
        }
    }
    Ok(parsed)
}

/// [`parse_files_noting`] where the caller does not report problems.
fn parse_files(root: &Path, files: &[PathBuf]) -> Result<Vec<(PathBuf, syn::File)>, ScanError> {
    parse_files_noting(root, files, &mut Vec::new())
}

/// The ops of the crate's own (`#[pptm::op]` functions) in `dirs` of `root`: what build.rs lowers
/// chains with, and what the derive macro reads when a chain names an op that is not built in.
pub fn user_ops(
    root: &Path,
    dirs: &[&str],
    skip: &[&str],
) -> Result<Vec<&'static pptm_spec::OpDef>, ScanError> {
    let files = rust_files(root, dirs, skip)?;
    let parsed = parse_files(root, &files)?;
    // The crate's states first: an op in one file may take a state declared in another.
    let states = user_states(&parsed);
    Ok(parsed
        .iter()
        .flat_map(|(_, f)| user_ops_in(f, &states))
        .collect())
}

/// The states (`#[derive(pptm::State)]`) declared in parsed files.
fn user_states(parsed: &[(PathBuf, syn::File)]) -> Vec<pptm_spec::op_fn::StateDef> {
    parsed.iter().flat_map(|(_, f)| user_states_in(f)).collect()
}

/// The states (`#[derive(pptm::State)]`) declared in `dirs` of `root`: what the `#[pptm::op]`
/// macro types an op's state flow and result with.
pub fn states(
    root: &Path,
    dirs: &[&str],
    skip: &[&str],
) -> Result<Vec<pptm_spec::op_fn::StateDef>, ScanError> {
    let files = rust_files(root, dirs, skip)?;
    Ok(user_states(&parse_files(root, &files)?))
}

/// Every chain declared in `dirs` of `root` (parsed, not validated): what a pipeline's steps are
/// looked up in, by name.
pub fn chain_specs(root: &Path, dirs: &[&str], skip: &[&str]) -> Result<Vec<ChainSpec>, ScanError> {
    let files = rust_files(root, dirs, skip)?;
    let mut specs = Vec::new();
    for (_, file) in parse_files(root, &files)? {
        let mut v = Visitor::default();
        v.visit_file(&file);
        specs.extend(v.chains.into_iter().map(|c| c.spec));
    }
    Ok(specs)
}

/// The ops a crate's chains may name besides the built-in ones: its own (in `op_dirs` of `root`)
/// and those of the crates it takes ops from (`dependency_ops`: their src/ folders). Two of one
/// name, or one named like a built-in op, are an error where a stage names them (lowering's
/// `OpTwice`, `OpShadowed`), not here: an op no chain names harms nothing.
pub fn all_user_ops(
    root: &Path,
    op_dirs: &[&str],
    skip: &[&str],
    dependency_ops: &[PathBuf],
) -> Result<Vec<&'static pptm_spec::OpDef>, ScanError> {
    let mut ops = user_ops(root, op_dirs, skip)?;
    for dir in dependency_ops {
        ops.extend(user_ops(dir, &[""], &[])?);
    }
    Ok(ops)
}

/// Scans `dirs` (relative to `root`) for chains, with the ops of the crate's own found in
/// `op_dirs` and those of `dependency_ops` (see [`all_user_ops`]), skipping any path that starts
/// with one of `skip`.
pub fn scan(
    root: &Path,
    dirs: &[&str],
    op_dirs: &[&str],
    skip: &[&str],
    dependency_ops: &[PathBuf],
) -> Result<Found, ScanError> {
    let ops = all_user_ops(root, op_dirs, skip, dependency_ops)?;
    let specs = chain_specs(root, op_dirs, skip)?;
    let lookup = |name: &str| specs.iter().filter(|c| c.name == name).collect::<Vec<_>>();
    let files = rust_files(root, dirs, skip)?;
    let mut problems = Vec::new();
    let parsed = parse_files_noting(root, &files, &mut problems)?;
    let mut by_hash: BTreeMap<String, ChainIr> = BTreeMap::new();
    let mut origins = BTreeMap::new();
    for (rel, file) in &parsed {
        let mut v = Visitor::default();
        v.visit_file(file);
        problems.extend(v.errors.iter().map(|e| Problem::of(rel, e)));
        let mut irs: Vec<ChainIr> = Vec::new();
        for chain in &v.chains {
            match chain.lower_with(&ops) {
                Ok(ir) => irs.push(ir),
                Err(e) => problems.push(Problem::of(rel, &e)),
            }
        }
        // A pipeline's parts.
        for p in &v.pipelines {
            match p.compose(&lookup, &ops) {
                Ok(ir) => irs.extend(ir.parts.into_iter().map(|part| part.ir)),
                Err(e) => problems.push(Problem::of(rel, &e)),
            }
        }
        for ir in irs {
            origins
                .entry(ir.spec_hash.clone())
                .or_insert_with(|| rel.clone());
            by_hash.entry(ir.spec_hash.clone()).or_insert(ir);
        }
    }
    let mut chains: Vec<ChainIr> = by_hash.into_values().collect();
    chains.sort_by(|a, b| {
        (&a.domain, &a.name, &a.spec_hash).cmp(&(&b.domain, &b.name, &b.spec_hash))
    });
    for (i, a) in chains.iter().enumerate() {
        if let Some(b) = chains[i + 1..]
            .iter()
            .find(|b| b.domain == a.domain && b.opcode == a.opcode)
        {
            return Err(ScanError::OpcodeCollision {
                domain: a.domain.clone(),
                a: a.name.clone(),
                b: b.name.clone(),
                opcode: a.opcode,
            });
        }
    }
    Ok(Found {
        chains,
        problems,
        files,
        origins,
    })
}

fn collect_rs(
    root: &Path,
    dir: &Path,
    skip: &[&str],
    out: &mut Vec<PathBuf>,
) -> Result<(), ScanError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let path = entry
            .map_err(|err| ScanError::Io {
                path: dir.display().to_string(),
                err,
            })?
            .path();
        let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
        let rel_str = rel.to_string_lossy().replace('\\', "/");
        if skip.iter().any(|s| rel_str.starts_with(s)) {
            continue;
        }
        if path.is_dir() {
            // A folder with a Cargo.toml of its own is another crate (a fixture in tests/): its
            // chains are its own.
            if path.join("Cargo.toml").exists() {
                continue;
            }
            collect_rs(root, &path, skip, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(rel);
        }
    }
    Ok(())
}

/// The chain and pipeline declarations of one file, and the errors of those that do not parse.
#[derive(Default)]
struct Visitor {
    chains: Vec<pptm_spec::parse::ParsedChain>,
    pipelines: Vec<pptm_spec::parse::ParsedPipeline>,
    errors: Vec<syn::Error>,
}

impl<'ast> Visit<'ast> for Visitor {
    fn visit_item_struct(&mut self, item: &'ast syn::ItemStruct) {
        if derives_fusion_builder(&item.attrs) {
            let input = syn::DeriveInput::from(item.clone());
            match parse_chain(&input) {
                Ok(p) => self.chains.push(p),
                Err(e) => self.errors.push(e),
            }
        } else if derives_pipeline(&item.attrs) {
            let input = syn::DeriveInput::from(item.clone());
            match parse_pipeline(&input) {
                Ok(p) => self.pipelines.push(p),
                Err(e) => self.errors.push(e),
            }
        }
        syn::visit::visit_item_struct(self, item);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_chains_anywhere_and_skips_invalid_ones() {
        let dir = std::env::temp_dir().join(format!("pptm-scan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("src/deep")).unwrap();
        std::fs::create_dir_all(dir.join("tests/ui")).unwrap();
        let kl = r#"
            #[derive(FusionBuilder)]
            #[fusion(domain = "inference")]
            pub struct KlComplexity { #[stage(1)] kl: KlDivergence, #[stage(2)] total: SumReduction }
        "#;
        std::fs::write(dir.join("src/lib.rs"), kl).unwrap();
        // The same chain again, inside a function, counts once.
        std::fs::write(dir.join("src/deep/again.rs"), format!("fn f() {{ {kl} }}")).unwrap();
        std::fs::write(
            dir.join("src/deep/other.rs"),
            r#"mod m { #[derive(Debug, pptm::FusionBuilder)] #[fusion(domain = "stats")] struct Total { #[stage(1)] s: SumReduction } }"#,
        )
        .unwrap();
        std::fs::write(dir.join("src/deep/broken.rs"), "this is not rust").unwrap();
        std::fs::write(
            dir.join("src/deep/invalid.rs"),
            r#"#[derive(FusionBuilder)] #[fusion(domain = "x")] struct Bad { #[stage(2)] s: SumReduction }"#,
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("tests/nested/src")).unwrap();
        std::fs::write(dir.join("tests/nested/Cargo.toml"), "[package]").unwrap();
        std::fs::write(
            dir.join("tests/nested/src/lib.rs"),
            kl.replace("KlComplexity", "OfAnotherCrate"),
        )
        .unwrap();
        std::fs::write(
            dir.join("tests/ui/skipped.rs"),
            kl.replace("KlComplexity", "Skipped"),
        )
        .unwrap();
        let dirs = ["src", "tests", "examples"];
        let found = scan(&dir, &dirs, &dirs, &["tests/ui"], &[]).unwrap();
        let names: Vec<_> = found
            .chains
            .iter()
            .map(|c| (c.domain.as_str(), c.name.as_str()))
            .collect();
        assert_eq!(names, [("inference", "KlComplexity"), ("stats", "Total")]);
        // What does not compile is listed where it is written.
        let problems: Vec<String> = found.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].starts_with("src/deep/broken.rs:1:"),
            "{problems:?}"
        );
        assert!(
            problems[1].starts_with("src/deep/invalid.rs:1:")
                && problems[1].contains("expected stage 1 here, found 2"),
            "{problems:?}"
        );
        assert_eq!(found.files.len(), 5);
        assert_eq!(
            found.origins.get(&found.chains[0].spec_hash),
            Some(&PathBuf::from("src/deep/again.rs")),
            "the first file, in sorted order"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn modules_at_a_path_are_scanned_wherever_they_are() {
        let dir = std::env::temp_dir().join(format!("pptm-scan-path-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["app/src/inner", "app/examples/nest/deep", "shared"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let chain = |name: &str| {
            format!(
                r#"#[derive(FusionBuilder)] #[fusion(domain = "d")]
                   struct {name} {{ #[stage(1)] s: Square, #[stage(2)] t: SumReduction }}"#
            )
        };
        // A module outside the crate (shared with another), one nested in an inline module of a
        // crate root, one in an inline module of a non-root file, and a path that names nothing.
        std::fs::write(
            dir.join("app/src/lib.rs"),
            r#"#[path = "../../shared/./sys.rs"] mod sys;
               mod inner;
               #[path = "missing.rs"] mod missing;"#,
        )
        .unwrap();
        std::fs::write(dir.join("shared/sys.rs"), chain("Shared")).unwrap();
        std::fs::write(
            dir.join("app/src/inner.rs"),
            r#"mod a { #[path = "x.rs"] mod x; }"#,
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("app/src/inner/a")).unwrap();
        std::fs::write(dir.join("app/src/inner/a/x.rs"), chain("Inner")).unwrap();
        std::fs::write(
            dir.join("app/examples/e.rs"),
            r#"mod nest { #[path = "deep/y.rs"] mod y; }"#,
        )
        .unwrap();
        std::fs::write(dir.join("app/examples/nest/deep/y.rs"), chain("Deep")).unwrap();
        let app = dir.join("app");
        let files = rust_files(&app, &["src", "examples"], &[]).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.to_string_lossy().replace('\\', "/"))
            .collect();
        assert_eq!(
            names,
            [
                "../shared/sys.rs",
                "examples/e.rs",
                "examples/nest/deep/y.rs",
                "src/inner/a/x.rs",
                "src/inner.rs",
                "src/lib.rs"
            ]
        );
        let found = scan(&app, &["src"], &["src"], &[], &[]).unwrap();
        let mut chains: Vec<&str> = found.chains.iter().map(|c| c.name.as_str()).collect();
        chains.sort();
        assert_eq!(chains, ["Inner", "Shared"]);
        // Skipped paths stay skipped, whoever names them.
        let files = rust_files(&app, &["src"], &["../shared"]).unwrap();
        assert!(!files.contains(&PathBuf::from("../shared/sys.rs")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn chains_name_the_ops_of_the_crates_they_take_ops_from() {
        let dir = std::env::temp_dir().join(format!("pptm-scan-deps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["app/src", "ops/src", "clash/src", "builtin/src"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let softplus = "#[op] pub fn softplus(x: f64) -> f64 { x.exp().ln_1p() }";
        std::fs::write(dir.join("ops/src/lib.rs"), softplus).unwrap();
        std::fs::write(
            dir.join("app/src/lib.rs"),
            r#"#[derive(FusionBuilder)] #[fusion(domain = "app")]
               struct Soft { #[stage(1)] s: ops::Softplus, #[stage(2)] t: SumReduction }"#,
        )
        .unwrap();
        let app = dir.join("app");
        // Without the ops crate the chain does not lower (the derive reports it) and is skipped.
        assert!(
            scan(&app, &["src"], &["src"], &[], &[])
                .unwrap()
                .chains
                .is_empty()
        );
        let found = scan(&app, &["src"], &["src"], &[], &[dir.join("ops/src")]).unwrap();
        assert_eq!(found.chains.len(), 1);
        assert_eq!(found.chains[0].stages[0].op.name, "Softplus");
        assert!(
            found.chains[0].stages[0]
                .op
                .cuda
                .contains("pptm_user_softplus")
        );

        // The same name in two crates: the chain that names it does not lower (the derive
        // reports lowering's OpTwice at the stage), and a crate of ops no chain uses is harmless.
        std::fs::write(
            dir.join("clash/src/lib.rs"),
            "#[op] pub fn softplus(x: f64) -> f64 { x.max(0.0) }",
        )
        .unwrap();
        let deps = [dir.join("ops/src"), dir.join("clash/src")];
        assert!(
            scan(&app, &["src"], &["src"], &[], &deps)
                .unwrap()
                .chains
                .is_empty()
        );
        let ops = all_user_ops(&app, &["src"], &[], &deps).unwrap();
        assert_eq!(ops.len(), 2);
        let decl: syn::DeriveInput = syn::parse_str(
            r#"#[derive(FusionBuilder)] #[fusion(domain = "app")]
               struct Soft { #[stage(1)] s: Softplus }"#,
        )
        .unwrap();
        let e = parse_chain(&decl)
            .unwrap()
            .lower_with(&ops)
            .unwrap_err()
            .to_string();
        assert!(e.contains("two ops of your own have this name"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
