//! `generated/manifest.txt`: what was generated, from which inputs, by which NVRTC.
//!
//! A line-oriented text file so that diffs review well and the derive macro can check, in a
//! `const`, that its chain is present (it searches for `spec=<hash>`).

use std::fmt::Write;

/// The manifest's name inside the generated folder.
pub const FILE_NAME: &str = "manifest.txt";
/// The version of the manifest's layout (its `format` line); [`Manifest::parse`] refuses any other.
pub const FORMAT: u32 = 1;

/// The whole manifest: one generated folder's contents and provenance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// NVRTC that produced the PTX, e.g. `13.0 V13.0.88`.
    pub nvrtc: String,
    /// One entry per domain that has generated code.
    pub domains: Vec<DomainEntry>,
}

/// A domain's line and the `file` and `chain` lines under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainEntry {
    /// The domain's name: its folder under generated/.
    pub name: String,
    /// SHA-256 over everything that determines the generated code (see `project::input_hash`).
    pub input_hash: String,
    /// The PTX targets it was generated for ([`crate::ARCHS`]), including any whose PTX was not
    /// written because another arch's is the same but for its `.target` line.
    pub archs: Vec<String>,
    /// (path relative to generated/, SHA-256 of its contents)
    pub files: Vec<(String, String)>,
    /// The chains its translation unit holds.
    pub chains: Vec<ChainEntry>,
}

/// One chain of a domain: what the derive macro looks for to know its chain was generated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainEntry {
    /// The chain's struct name.
    pub name: String,
    /// The chain's identity ([`pptm_spec::ChainIr::spec_hash`]), searched for as `spec=<hash>`.
    pub spec_hash: String,
    /// Its opcode in the domain's manifold.
    pub opcode: u32,
    /// Its stages' op names in data-flow order, comma-separated (for reviewers of the diff).
    pub stages: String,
}

impl Manifest {
    /// The manifest as the text written to [`FILE_NAME`].
    pub fn render(&self) -> String {
        let mut s = String::new();
        s.push_str("# pptm generated code: written by pptm-codegen; do not edit.\n");
        let _ = writeln!(
            s,
            "# Regenerate with `{}` (needs NVRTC 13.0; see README.md).",
            crate::REGENERATE_COMMAND
        );
        let _ = writeln!(s, "format {FORMAT}");
        let _ = writeln!(s, "nvrtc {}", self.nvrtc);
        for d in &self.domains {
            let _ = writeln!(
                s,
                "domain {} inputs={} archs={}",
                d.name,
                d.input_hash,
                d.archs.join(",")
            );
            for (path, hash) in &d.files {
                let _ = writeln!(s, "  file {path} sha256={hash}");
            }
            for c in &d.chains {
                let _ = writeln!(
                    s,
                    "  chain {} spec={} opcode=0x{:08x} stages={}",
                    c.name, c.spec_hash, c.opcode, c.stages
                );
            }
        }
        s
    }

    /// Reads a manifest back from its text (the error names the line it cannot read, or the one
    /// that is missing).
    pub fn parse(text: &str) -> Result<Manifest, String> {
        let mut nvrtc = None;
        let mut format = None;
        let mut domains: Vec<DomainEntry> = Vec::new();
        for (no, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || format!("line {}: cannot read `{line}`", no + 1);
            let mut words = line.split_whitespace();
            let kind = words.next().ok_or_else(bad)?;
            let rest: Vec<&str> = words.collect();
            let kv = |key: &str| -> Result<String, String> {
                rest.iter()
                    .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
                    .map(str::to_string)
                    .ok_or_else(bad)
            };
            match kind {
                "format" => {
                    format = Some(
                        rest.first()
                            .and_then(|v| v.parse::<u32>().ok())
                            .ok_or_else(bad)?,
                    )
                }
                "nvrtc" => nvrtc = Some(rest.join(" ")),
                "domain" => domains.push(DomainEntry {
                    name: rest.first().ok_or_else(bad)?.to_string(),
                    input_hash: kv("inputs")?,
                    archs: kv("archs")?.split(',').map(str::to_string).collect(),
                    files: Vec::new(),
                    chains: Vec::new(),
                }),
                "file" => {
                    let d = domains.last_mut().ok_or_else(bad)?;
                    d.files
                        .push((rest.first().ok_or_else(bad)?.to_string(), kv("sha256")?));
                }
                "chain" => {
                    let opcode = kv("opcode")?;
                    let opcode = u32::from_str_radix(opcode.trim_start_matches("0x"), 16)
                        .map_err(|_| bad())?;
                    let entry = ChainEntry {
                        name: rest.first().ok_or_else(bad)?.to_string(),
                        spec_hash: kv("spec")?,
                        opcode,
                        stages: kv("stages")?,
                    };
                    domains.last_mut().ok_or_else(bad)?.chains.push(entry);
                }
                _ => return Err(bad()),
            }
        }
        match format {
            Some(FORMAT) => {}
            Some(f) => {
                return Err(format!(
                    "manifest format {f}; this pptm-codegen reads format {FORMAT}"
                ));
            }
            None => return Err("no `format` line".into()),
        }
        Ok(Manifest {
            nvrtc: nvrtc.ok_or("no `nvrtc` line")?,
            domains,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let m = Manifest {
            nvrtc: "13.0 V13.0.88".into(),
            domains: vec![DomainEntry {
                name: "inference".into(),
                input_hash: "ab".repeat(32),
                archs: vec!["compute_80".into(), "compute_90".into()],
                files: vec![("inference/compute_90.ptx".into(), "cd".repeat(32))],
                chains: vec![ChainEntry {
                    name: "KlComplexity".into(),
                    spec_hash: "ef".repeat(32),
                    opcode: 0x1234_abcd,
                    stages: "KlDivergence,SumReduction".into(),
                }],
            }],
        };
        let text = m.render();
        assert!(text.contains(&format!("spec={}", "ef".repeat(32))));
        assert_eq!(Manifest::parse(&text).unwrap(), m);
    }

    #[test]
    fn rejects_garbage_and_other_formats() {
        assert!(Manifest::parse("format 1\nbogus line\n").is_err());
        assert!(
            Manifest::parse("format 2\nnvrtc x\n")
                .unwrap_err()
                .contains("format 2")
        );
        assert!(Manifest::parse("nvrtc x\n").is_err());
        assert!(Manifest::parse("format 1\nnvrtc x\n  file a sha256=b\n").is_err());
    }
}
