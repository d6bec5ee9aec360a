//! A crate's generated code as a whole: plan it from the sources, verify the committed copy,
//! regenerate it with NVRTC, or check that regenerating changes nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pptm_spec::ChainIr;
use sha2::{Digest, Sha256};

use crate::manifest::{self, ChainEntry, DomainEntry, Manifest};
use crate::nvrtc::{Nvrtc, NvrtcError};
use crate::scan::{self, ScanError};

/// Why a crate's generated code could not be planned, written or checked.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// The sources could not be scanned.
    #[error(transparent)]
    Scan(#[from] ScanError),
    /// NVRTC could not be loaded or did not compile a translation unit.
    #[error(transparent)]
    Nvrtc(#[from] NvrtcError),
    /// A chain of tests, examples or benches names a domain of the library's.
    #[error(
        "chain `{chain}` ({file}) joins domain `{domain}`, which the library's chains (src/) declare. \
         Chains of tests, examples and benches take domains of their own, so that the library's \
         PTX holds only the library's chains: name another domain in its #[fusion(domain = ...)]"
    )]
    SharedDomain {
        /// The chain's name.
        chain: String,
        /// The first file that declares it, relative to the crate's root.
        file: String,
        /// The library's domain it names.
        domain: String,
    },
    /// Some declarations do not compile; nothing is planned, so that their chains' code is not
    /// deleted as if they were gone.
    #[error(
        "{} declaration(s) of the crate do not compile, so its generated code is left as it is \
         until they do:\n{}",
        problems.len(),
        problems.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n")
    )]
    InvalidSources {
        /// Each declaration that does not compile, with where and why.
        problems: Vec<scan::Problem>,
    },
    /// A file or folder of the generated code could not be created, written, moved or removed
    /// (or the working directory could not be read).
    #[error("{what} {path}: {err}")]
    Io {
        /// What was being done to it ("cannot write", "cannot move into place").
        what: &'static str,
        /// The file or folder.
        path: String,
        /// What the OS said.
        err: std::io::Error,
    },
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CodegenError + 'a {
    move |err| CodegenError::Io {
        what,
        path: path.display().to_string(),
        err,
    }
}

/// Where a crate keeps its chains and its generated code: one of its two trees, the library's
/// ([`Project::library`]) or the one of its tests, examples and benches ([`Project::dev`]).
#[derive(Debug, Clone)]
pub struct Project {
    /// The crate's root (where its Cargo.toml is); every relative path here is relative to it.
    pub root: PathBuf,
    /// Folders scanned for chains, relative to `root`.
    pub source_dirs: Vec<String>,
    /// Folders scanned for ops of the crate's own (`#[pptm::op]`): all of the crate's, since a
    /// test's chain may use an op its library declares.
    pub op_dirs: Vec<String>,
    /// Paths skipped while scanning (trybuild fixtures are not part of the crate).
    pub skip: Vec<String>,
    /// The src/ folders of the crates this one takes ops from (absolute): see
    /// [`dependency_op_dirs`].
    pub dependency_ops: Vec<PathBuf>,
    /// The folder the generated code goes to.
    pub generated: PathBuf,
}

/// The build-script metadata key under which a crate with `links` publishes its src/ folder, so
/// that the crates depending on it can name its `#[pptm::op]` ops in their chains (they read it as
/// `DEP_<LINKS>_PPTM_OP_SOURCES`).
pub const OP_SOURCES_KEY: &str = "pptm_op_sources";

/// The environment variable that carries the folders of [`dependency_op_dirs`] from build.rs to
/// the derive macro (`cargo:rustc-env`). (`cargo xtask` names them itself: [`plan_trees_with`].)
pub const DEPENDENCY_OPS_ENV: &str = "PPTM_DEPENDENCY_OPS";

/// The src/ folders of the crates whose ops this crate's chains may name: from
/// [`DEPENDENCY_OPS_ENV`] when set (in the derive macro), else, in a build script, the
/// `DEP_<LINKS>_PPTM_OP_SOURCES` variable of every direct dependency that publishes its ops (one
/// with `links` whose build.rs calls `pptm_codegen::build_script()`).
pub fn dependency_op_dirs() -> Vec<PathBuf> {
    if let Some(v) = std::env::var_os(DEPENDENCY_OPS_ENV) {
        return std::env::split_paths(&v)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
    }
    let suffix = format!("_{}", OP_SOURCES_KEY.to_ascii_uppercase());
    let mut dirs: Vec<PathBuf> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let k = k.to_str()?;
            (k.starts_with("DEP_") && k.ends_with(&suffix)).then(|| PathBuf::from(v))
        })
        .collect();
    dirs.sort();
    dirs
}

/// The folders of a crate that hold its library's chains.
pub const LIBRARY_DIRS: &[&str] = &["src"];
/// The folders of a crate that hold the chains of its tests, examples and benches.
pub const DEV_DIRS: &[&str] = &["examples", "tests", "benches"];
/// The library's generated code: shipped with the crate.
pub const LIBRARY_FOLDER: &str = "generated";
/// The generated code of tests, examples and benches: not part of the library's PTX.
pub const DEV_FOLDER: &str = "generated-dev";

/// Everything to generate for one domain.
#[derive(Debug, Clone)]
pub struct DomainPlan {
    /// The domain's name: its folder in the generated code.
    pub name: String,
    /// The domain's chains (and pipeline parts), lowered.
    pub chains: Vec<ChainIr>,
    /// The CUDA C translation unit.
    pub source: String,
    /// [`input_hash`] of `source`: what decides whether the committed PTX is fresh.
    pub input_hash: String,
}

impl DomainPlan {
    fn source_file(&self) -> String {
        format!("{0}/{0}.cu", self.name)
    }

    fn ptx_file(&self, arch: &str) -> String {
        format!("{}/{arch}.ptx", self.name)
    }
}

/// NVRTC writes the sources of `-lineinfo` as `.file` lines prefixed with the process's working
/// directory. The PTX must not depend on where it was generated: the prefix goes, and headers are
/// named as they sit in the repository (`kernels/pptm/...`).
pub fn repo_relative_file_paths(ptx: &str, cwd: &Path) -> String {
    let prefix = format!("\"{}/", cwd.display());
    let mut out = String::with_capacity(ptx.len());
    for line in ptx.split_inclusive('\n') {
        if line.trim_start().starts_with(".file") && line.contains(&prefix) {
            let line = line.replace(&prefix, "\"");
            out.push_str(&line.replace("\"pptm/", "\"kernels/pptm/"));
        } else {
            out.push_str(line);
        }
    }
    out
}

/// NVRTC options for one arch. Part of the input hash.
///
/// Without source-line tables by default: they are about 40 % of the PTX, and every binary embeds
/// it. `PPTM_LINEINFO=1` adds them (`-lineinfo`), for ncu's source view and compute-sanitizer's
/// line numbers: the build then regenerates the generated code with them, for local use only
/// (commit it without).
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    let mut options = vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()];
    if std::env::var("PPTM_LINEINFO").is_ok_and(|v| v == "1") {
        options.push("-lineinfo".into());
    }
    options
}

/// SHA-256 over everything that determines a domain's generated code: the codegen version, the
/// NVRTC options per arch, the translation unit (which holds the chains) and every kernels/ header.
pub fn input_hash(source: &str) -> String {
    let mut h = Sha256::new();
    h.update(format!(
        "pptm-codegen {} manifest-format {}\n",
        crate::CODEGEN_VERSION,
        manifest::FORMAT
    ));
    for arch in crate::ARCHS {
        h.update(format!(
            "arch {arch} options {}\n",
            nvrtc_options(arch).join(" ")
        ));
    }
    h.update(source.as_bytes());
    for (name, text) in crate::kernels::headers() {
        h.update(format!("\0header {name}\0"));
        h.update(text.as_bytes());
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

impl Project {
    fn tree(root: PathBuf, dirs: &[&str], folder: &str) -> Self {
        let all = |d: &[&str]| d.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Project {
            generated: root.join(folder),
            root,
            source_dirs: all(dirs),
            op_dirs: all(&[LIBRARY_DIRS, DEV_DIRS].concat()),
            skip: vec!["tests/ui".into()],
            dependency_ops: dependency_op_dirs(),
        }
    }

    /// The project with the ops of the crates at `dirs` (their src/ folders) instead of those
    /// [`dependency_op_dirs`] found.
    pub fn with_dependency_ops(mut self, dirs: &[PathBuf]) -> Self {
        self.dependency_ops = dirs.to_vec();
        self
    }

    /// Every op of the user's own this crate's chains may name (see [`scan::all_user_ops`]).
    pub fn user_ops(&self) -> Result<Vec<&'static pptm_spec::OpDef>, scan::ScanError> {
        scan::all_user_ops(
            &self.root,
            &strs(&self.op_dirs),
            &strs(&self.skip),
            &self.dependency_ops,
        )
    }

    /// The states (`#[derive(pptm::State)]`) declared where this crate's ops are: what an op's
    /// state flow and result are typed with.
    pub fn states(&self) -> Result<Vec<pptm_spec::op_fn::StateDef>, scan::ScanError> {
        scan::states(&self.root, &strs(&self.op_dirs), &strs(&self.skip))
    }

    /// Every chain declared anywhere in the crate (src/, tests/, examples/, benches/), parsed but
    /// not validated: what a pipeline's steps are looked up in.
    pub fn chain_specs(&self) -> Result<Vec<pptm_spec::ChainSpec>, scan::ScanError> {
        scan::chain_specs(&self.root, &strs(&self.op_dirs), &strs(&self.skip))
    }

    /// The library's tree: the chains of src/, generated into generated/ (shipped).
    pub fn library(root: impl Into<PathBuf>) -> Self {
        Self::tree(root.into(), LIBRARY_DIRS, LIBRARY_FOLDER)
    }

    /// The tree of tests, examples and benches (not tests/ui/): their chains, generated into
    /// generated-dev/, so that test chains never change the library's PTX.
    pub fn dev(root: impl Into<PathBuf>) -> Self {
        Self::tree(root.into(), DEV_DIRS, DEV_FOLDER)
    }

    /// The generated folder's name (`generated`, `generated-dev`), for messages and paths.
    pub fn folder(&self) -> String {
        self.generated
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Scans the sources and generates the CUDA C of every domain (no NVRTC needed).
    pub fn plan(&self) -> Result<Vec<DomainPlan>, CodegenError> {
        self.plan_beside(&[])
    }

    /// [`Project::plan`] for a tree beside `owned`, another tree's plan (the library's): a chain
    /// declared there as well (the same spec) is that tree's, and joining one of its domains
    /// otherwise is an error.
    pub fn plan_beside(&self, owned: &[DomainPlan]) -> Result<Vec<DomainPlan>, CodegenError> {
        let found = scan::scan(
            &self.root,
            &strs(&self.source_dirs),
            &strs(&self.op_dirs),
            &strs(&self.skip),
            &self.dependency_ops,
        )?;
        // A declaration that does not compile would read as a chain removed: its domain's code
        // would be deleted. Nothing is planned until it compiles.
        if !found.problems.is_empty() {
            return Err(CodegenError::InvalidSources {
                problems: found.problems,
            });
        }
        let mut by_domain: BTreeMap<String, Vec<ChainIr>> = BTreeMap::new();
        for c in found.chains {
            if let Some(d) = owned.iter().find(|d| d.name == c.domain) {
                if d.chains.iter().any(|o| o.spec_hash == c.spec_hash) {
                    continue;
                }
                return Err(CodegenError::SharedDomain {
                    file: found
                        .origins
                        .get(&c.spec_hash)
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    chain: c.name,
                    domain: c.domain,
                });
            }
            by_domain.entry(c.domain.clone()).or_default().push(c);
        }
        Ok(by_domain
            .into_iter()
            .map(|(name, chains)| {
                let source = crate::cuda::domain_source(&name, &chains);
                let input_hash = input_hash(&source);
                DomainPlan {
                    name,
                    chains,
                    source,
                    input_hash,
                }
            })
            .collect())
    }

    /// Reasons the committed generated/ does not match `plan` (empty: fresh).
    pub fn verify(&self, plan: &[DomainPlan]) -> Vec<String> {
        let path = self.generated.join(manifest::FILE_NAME);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(_) if plan.is_empty() => return Vec::new(),
            Err(_) => return vec![format!("{} is missing", path.display())],
        };
        let m = match Manifest::parse(&text) {
            Ok(m) => m,
            Err(e) => return vec![format!("{}: {e}", path.display())],
        };
        let mut reasons = Vec::new();
        for d in plan {
            let Some(entry) = m.domains.iter().find(|e| e.name == d.name) else {
                reasons.push(format!("domain `{}` has no generated code", d.name));
                continue;
            };
            if entry.input_hash != d.input_hash {
                let had: Vec<_> = entry.chains.iter().map(|c| c.spec_hash.as_str()).collect();
                let new: Vec<_> = d
                    .chains
                    .iter()
                    .filter(|c| !had.contains(&c.spec_hash.as_str()))
                    .map(|c| c.name.as_str())
                    .collect();
                let gone: Vec<_> = entry
                    .chains
                    .iter()
                    .filter(|e| !d.chains.iter().any(|c| c.spec_hash == e.spec_hash))
                    .map(|e| e.name.as_str())
                    .collect();
                let what = match (new.is_empty(), gone.is_empty()) {
                    (true, true) => "kernels/ or the codegen changed".to_string(),
                    _ => format!(
                        "chains added or changed: [{}], removed or changed: [{}]",
                        new.join(", "),
                        gone.join(", ")
                    ),
                };
                reasons.push(format!("domain `{}` is out of date ({what})", d.name));
            }
            if entry
                .archs
                .iter()
                .map(String::as_str)
                .ne(crate::ARCHS.iter().copied())
            {
                reasons.push(format!(
                    "domain `{}` was generated for {:?}, not {:?}",
                    d.name,
                    entry.archs,
                    crate::ARCHS
                ));
            }
            for (file, hash) in &entry.files {
                match std::fs::read(self.generated.join(file)) {
                    Ok(bytes) if sha256(&bytes) == *hash => {}
                    Ok(_) => reasons.push(format!(
                        "{}/{file} was modified after generation",
                        self.folder()
                    )),
                    Err(_) => reasons.push(format!("{}/{file} is missing", self.folder())),
                }
            }
        }
        for e in &m.domains {
            if !plan.iter().any(|d| d.name == e.name) {
                reasons.push(format!("domain `{}` no longer has any chain", e.name));
            }
        }
        reasons
    }

    /// Generates everything into `out` (created; existing content replaced).
    pub fn generate_into(
        &self,
        plan: &[DomainPlan],
        nvrtc: &Nvrtc,
        out: &Path,
    ) -> Result<Manifest, CodegenError> {
        if out.exists() {
            std::fs::remove_dir_all(out).map_err(io("cannot clear", out))?;
        }
        let mut nvrtc_build = String::new();
        let mut domains = Vec::new();
        let cwd =
            std::env::current_dir().map_err(io("cannot read the working directory of", out))?;
        for d in plan {
            let dir = out.join(&d.name);
            std::fs::create_dir_all(&dir).map_err(io("cannot create", &dir))?;
            let mut files = Vec::new();
            let mut write = |rel: String, bytes: &[u8]| -> Result<(), CodegenError> {
                let path = out.join(&rel);
                std::fs::write(&path, bytes).map_err(io("cannot write", &path))?;
                files.push((rel, sha256(bytes)));
                Ok(())
            };
            write(d.source_file(), d.source.as_bytes())?;
            let mut written: Vec<String> = Vec::new();
            for arch in crate::ARCHS {
                let ptx = nvrtc.compile(
                    &format!("{}/{}", self.folder(), d.source_file()),
                    &d.source,
                    crate::kernels::headers(),
                    &nvrtc_options(arch),
                )?;
                let ptx = repo_relative_file_paths(&ptx, &cwd);
                if nvrtc_build.is_empty()
                    && let Some(line) = ptx.lines().find(|l| l.contains("Cuda compilation tools"))
                {
                    nvrtc_build = line.rsplit(", ").next().unwrap_or("").trim().to_string();
                }
                // An arch whose PTX is another's but for the `.target` line (compute_90a for a
                // domain without wgmma) is not written: the derive embeds the other's.
                if written.iter().any(|other| same_but_target(other, &ptx)) {
                    continue;
                }
                write(d.ptx_file(arch), ptx.as_bytes())?;
                written.push(ptx);
            }
            domains.push(DomainEntry {
                name: d.name.clone(),
                input_hash: d.input_hash.clone(),
                archs: crate::ARCHS.iter().map(|a| a.to_string()).collect(),
                files,
                chains: d
                    .chains
                    .iter()
                    .map(|c| ChainEntry {
                        name: c.name.clone(),
                        spec_hash: c.spec_hash.clone(),
                        opcode: c.opcode,
                        stages: c
                            .stages
                            .iter()
                            .map(|s| s.op.name)
                            .collect::<Vec<_>>()
                            .join(","),
                    })
                    .collect(),
            });
        }
        let (major, minor) = nvrtc.version();
        let m = Manifest {
            nvrtc: format!("{major}.{minor} {nvrtc_build}").trim().to_string(),
            domains,
        };
        std::fs::create_dir_all(out).map_err(io("cannot create", out))?;
        let path = out.join(manifest::FILE_NAME);
        std::fs::write(&path, m.render()).map_err(io("cannot write", &path))?;
        Ok(m)
    }

    /// Regenerates the generated folder in place (through a temporary folder, so a failure leaves
    /// the old one). A tree without chains has no folder.
    pub fn regenerate(&self, plan: &[DomainPlan], nvrtc: &Nvrtc) -> Result<Manifest, CodegenError> {
        if plan.is_empty() {
            if self.generated.exists() {
                std::fs::remove_dir_all(&self.generated)
                    .map_err(io("cannot remove", &self.generated))?;
            }
            let (major, minor) = nvrtc.version();
            return Ok(Manifest {
                nvrtc: format!("{major}.{minor}"),
                domains: Vec::new(),
            });
        }
        let tmp =
            self.generated
                .with_file_name(format!("{}.tmp-{}", self.folder(), std::process::id()));
        let m = match self.generate_into(plan, nvrtc, &tmp) {
            Ok(m) => m,
            Err(e) => {
                // A failed generation (an NVRTC error) must not leave a half-written folder
                // beside generated/, where it would be committed.
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(e);
            }
        };
        if self.generated.exists() {
            std::fs::remove_dir_all(&self.generated)
                .map_err(io("cannot replace", &self.generated))?;
        }
        std::fs::rename(&tmp, &self.generated)
            .map_err(io("cannot move into place", &self.generated))?;
        Ok(m)
    }

    /// Regenerates into a temporary folder and lists every difference with the generated folder.
    pub fn check(&self, plan: &[DomainPlan], nvrtc: &Nvrtc) -> Result<Vec<String>, CodegenError> {
        let tmp = std::env::temp_dir().join(format!(
            "pptm-codegen-check-{}-{}",
            self.folder(),
            std::process::id()
        ));
        if plan.is_empty() {
            let _ = std::fs::remove_dir_all(&tmp);
        } else if let Err(e) = self.generate_into(plan, nvrtc, &tmp) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        let folder = self.folder();
        let mut diffs = Vec::new();
        let fresh = list_files(&tmp);
        let committed = list_files(&self.generated);
        for f in &fresh {
            match (
                std::fs::read(tmp.join(f)),
                std::fs::read(self.generated.join(f)),
            ) {
                (Ok(a), Ok(b)) if a == b => {}
                (Ok(_), Ok(_)) => {
                    diffs.push(format!("{folder}/{f} differs from a fresh generation"))
                }
                _ => diffs.push(format!("{folder}/{f} is missing")),
            }
        }
        for f in committed.iter().filter(|f| !fresh.contains(f)) {
            diffs.push(format!(
                "{folder}/{f} is not produced by codegen (stale file)"
            ));
        }
        let _ = std::fs::remove_dir_all(&tmp);
        Ok(diffs)
    }
}

/// Plans both trees of the crate at `root`: the library's, then that of its tests, examples and
/// benches beside it (see [`Project::plan_beside`]).
pub fn plan_trees(root: &Path) -> Result<Vec<(Project, Vec<DomainPlan>)>, CodegenError> {
    plan_trees_with(root, &dependency_op_dirs())
}

/// [`plan_trees`] with the ops of the crates at `dependency_ops` (their src/ folders).
pub fn plan_trees_with(
    root: &Path,
    dependency_ops: &[PathBuf],
) -> Result<Vec<(Project, Vec<DomainPlan>)>, CodegenError> {
    let library = Project::library(root).with_dependency_ops(dependency_ops);
    let library_plan = library.plan()?;
    let dev = Project::dev(root).with_dependency_ops(dependency_ops);
    let dev_plan = dev.plan_beside(&library_plan)?;
    Ok(vec![(library, library_plan), (dev, dev_plan)])
}

/// Whether two PTX texts differ at most in their `.target` line.
fn same_but_target(a: &str, b: &str) -> bool {
    a.len().abs_diff(b.len()) < 16
        && a.lines()
            .filter(|l| !l.starts_with(".target"))
            .eq(b.lines().filter(|l| !l.starts_with(".target")))
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn list_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(rel) = p.strip_prefix(dir) {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str, chains: &str) -> Project {
        let dir = std::env::temp_dir().join(format!("pptm-project-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::write(dir.join("src/lib.rs"), chains).unwrap();
        Project::library(dir)
    }

    const KL: &str = r#"#[derive(FusionBuilder)] #[fusion(domain = "inference")]
        struct KlComplexity { #[stage(1)] kl: KlDivergence, #[stage(2)] s: SumReduction }"#;

    /// Writes a manifest as generation would, with placeholder PTX (no NVRTC needed).
    fn fake_generate(p: &Project, plan: &[DomainPlan]) {
        let mut domains = Vec::new();
        for d in plan {
            std::fs::create_dir_all(p.generated.join(&d.name)).unwrap();
            let mut files = Vec::new();
            for (rel, text) in [
                (d.source_file(), d.source.clone()),
                (d.ptx_file("compute_90"), "// ptx".to_string()),
            ] {
                std::fs::write(p.generated.join(&rel), &text).unwrap();
                files.push((rel, sha256(text.as_bytes())));
            }
            domains.push(DomainEntry {
                name: d.name.clone(),
                input_hash: d.input_hash.clone(),
                archs: crate::ARCHS.iter().map(|a| a.to_string()).collect(),
                files,
                chains: vec![],
            });
        }
        let m = Manifest {
            nvrtc: "13.0".into(),
            domains,
        };
        std::fs::write(p.generated.join(manifest::FILE_NAME), m.render()).unwrap();
    }

    #[test]
    fn verify_detects_every_kind_of_staleness() {
        let p = fixture("verify", KL);
        let plan = p.plan().unwrap();
        assert_eq!(plan.len(), 1);
        assert!(p.verify(&plan)[0].contains("manifest.txt is missing"));
        fake_generate(&p, &plan);
        assert_eq!(p.verify(&plan), Vec::<String>::new());

        // A hand-edited file.
        std::fs::write(p.generated.join("inference/compute_90.ptx"), "// edited").unwrap();
        assert!(
            p.verify(&plan)
                .iter()
                .any(|r| r.contains("modified after generation")),
            "{:?}",
            p.verify(&plan)
        );
        fake_generate(&p, &plan);

        // A changed chain.
        std::fs::write(
            p.root.join("src/lib.rs"),
            KL.replace("#[stage(2)] s: SumReduction", ""),
        )
        .unwrap();
        let changed = p.plan().unwrap();
        let reasons = p.verify(&changed);
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("domain `inference` is out of date")),
            "{reasons:?}"
        );

        // A new domain, and a domain that lost its chains.
        std::fs::write(p.root.join("src/lib.rs"), KL.replace("inference", "other")).unwrap();
        let moved = p.plan().unwrap();
        let reasons = p.verify(&moved);
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("domain `other` has no generated code")),
            "{reasons:?}"
        );
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("domain `inference` no longer has any chain")),
            "{reasons:?}"
        );
        std::fs::remove_dir_all(&p.root).unwrap();
    }

    #[test]
    fn declarations_that_do_not_compile_leave_generated_code_alone() {
        let p = fixture("invalid", KL);
        let plan = p.plan().unwrap();
        fake_generate(&p, &plan);
        // A typo in an op name: not "domain `inference` no longer has any chain", but the
        // macro's own message, where it is written; nothing is planned (so nothing deleted).
        std::fs::write(
            p.root.join("src/lib.rs"),
            format!("\n{}", KL.replace("KlDivergence", "KlDivergense")),
        )
        .unwrap();
        let Err(CodegenError::InvalidSources { problems }) = p.plan() else {
            panic!("a chain that does not validate must stop planning");
        };
        assert_eq!(problems.len(), 1, "{problems:?}");
        let shown = problems[0].to_string();
        assert!(
            shown.starts_with("src/lib.rs:3:") && shown.contains("unknown op `KlDivergense`"),
            "{shown}"
        );
        // A file that does not parse, and a pipeline that does not compose.
        std::fs::write(p.root.join("src/broken.rs"), "fn f( {").unwrap();
        std::fs::write(
            p.root.join("src/lib.rs"),
            format!("{KL}\n#[derive(Pipeline)] struct P {{ #[step(1)] a: Nope }}"),
        )
        .unwrap();
        let Err(e @ CodegenError::InvalidSources { .. }) = p.plan() else {
            panic!("problems must stop planning");
        };
        let e = e.to_string();
        assert!(e.contains("src/broken.rs:1:"), "{e}");
        assert!(
            e.contains("src/lib.rs:3:") && e.contains("no chain `Nope`"),
            "{e}"
        );
        assert!(e.contains("left as it is"), "{e}");
        std::fs::remove_file(p.root.join("src/broken.rs")).unwrap();
        std::fs::write(p.root.join("src/lib.rs"), KL).unwrap();
        assert_eq!(p.verify(&p.plan().unwrap()), Vec::<String>::new());
        std::fs::remove_dir_all(&p.root).unwrap();
    }

    #[test]
    fn the_regenerate_command_is_one_that_exists_where_it_is_read() {
        let dir = std::env::temp_dir().join(format!("pptm-regen-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("app/deep")).unwrap();
        assert_eq!(
            crate::regenerate_command(&dir.join("app/deep")),
            "cargo build"
        );
        std::fs::create_dir_all(dir.join(".cargo")).unwrap();
        std::fs::write(
            dir.join(".cargo/config.toml"),
            "[alias]\nxtask = \"run --package xtask --\"\n",
        )
        .unwrap();
        assert_eq!(
            crate::regenerate_command(&dir.join("app/deep")),
            "cargo xtask codegen"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ptx_file_lines_do_not_depend_on_the_working_directory() {
        let ptx = "\t.file\t1 \"/home/a/repo/pptm/manifold.cuh\"\n\t.file\t2 \"/home/a/repo/generated/x/x.cu\"\n\tld.u32 %r1, [%rd1];\n";
        let out = repo_relative_file_paths(ptx, Path::new("/home/a/repo"));
        assert_eq!(
            out,
            "\t.file\t1 \"kernels/pptm/manifold.cuh\"\n\t.file\t2 \"generated/x/x.cu\"\n\tld.u32 %r1, [%rd1];\n"
        );
        assert_eq!(repo_relative_file_paths(ptx, Path::new("/elsewhere")), ptx);
    }

    #[test]
    fn input_hash_covers_the_sources() {
        let p = fixture("hash", KL);
        let a = p.plan().unwrap()[0].input_hash.clone();
        assert_eq!(a, p.plan().unwrap()[0].input_hash, "deterministic");
        std::fs::write(p.root.join("src/lib.rs"), KL.replace("KlComplexity", "Kl2")).unwrap();
        assert_ne!(a, p.plan().unwrap()[0].input_hash);
        std::fs::remove_dir_all(&p.root).unwrap();
    }
}
