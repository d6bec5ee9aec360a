//! README.md against the code: its table of shipped chains names every chain of `pptm::chains`
//! with its real domain and stages, and no chain the code lacks; the README stays a user's page
//! (at most 250 lines); its first two commands are the quickstart and `cargo test`.
//!
//! The files are read at compile time (`include_str!`): the GPU hosts run test binaries away from
//! the source tree. No GPU is needed.

use std::collections::BTreeSet;

use pptm::Chain;
use pptm::chains::*;

const README: &str = include_str!("../README.md");
/// The declarations of the shipped chains: `SHIPPED` below must name each of them.
const CHAINS_RS: &str = include_str!("../src/chains.rs");

const MAX_LINES: usize = 250;
const FIRST_COMMANDS: [&str; 2] = ["cargo run --release --example quickstart", "cargo test"];

/// A chain as the code declares it.
struct Declared {
    name: &'static str,
    domain: String,
    /// The stages' ops in order, as `ChainIr::describe` writes them, with `→` for `->`.
    stages: String,
}

fn declared<C: Chain>() -> Declared {
    let ir = C::ir().unwrap_or_else(|e| panic!("{}: its IR does not lower: {e}", C::NAME));
    assert_eq!(ir.name, C::NAME);
    let stages = ir.describe().replace(" -> ", " → ");
    // describe() collapses a repeated stage to `Op x k`; the shipped chains repeat none, so the
    // text is exactly the stages' ops in order.
    let ops: Vec<&str> = ir.stages.iter().map(|s| s.op.name).collect();
    assert_eq!(
        stages,
        ops.join(" → "),
        "{}: describe() and its stages",
        C::NAME
    );
    Declared {
        name: C::NAME,
        domain: ir.domain.clone(),
        stages,
    }
}

macro_rules! shipped {
    ($($chain:ty),* $(,)?) => {
        vec![$(declared::<$chain>()),*]
    };
}

/// Every chain of `pptm::chains` (src/chains.rs). `shipped_list_is_complete` fails when a chain is
/// declared there and missing here.
fn shipped() -> Vec<Declared> {
    shipped![
        KlComplexity,
        KlTerms,
        AccuracyPipeline,
        BeliefUpdateStep,
        BeliefUpdateStepBf16,
        DistanceKth,
        TeReduction,
        GemvAxpbySum,
        GemvAxpbySumBf16,
        GemvBf16,
        GemvAxpbySumFp8,
        GemvFp8,
        GemvAxpbySumFp16,
        GemvFp16,
        GemvTBf16,
        GemvTFp16,
        GemvTFp8,
        MatmulBiasGelu,
        MatmulBiasRelu,
        MatmulBiasSigmoid,
        MatmulBiasTanh,
        MatmulBiasGeluBf16,
        MatmulBiasGeluBf16x3,
        BatchedMatmulBiasGeluBf16,
        MatmulBiasGeluFp8,
        MatmulBiasGeluF16,
        MatmulBiasGeluGuarded,
    ]
}

/// The names of the structs that src/chains.rs derives `FusionBuilder` for.
fn declared_in_source() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut derive = false;
    for line in CHAINS_RS.lines().map(str::trim) {
        if line.starts_with("#[derive(") && line.contains("FusionBuilder") {
            derive = true;
        } else if derive && let Some(rest) = line.strip_prefix("pub struct ") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            names.insert(name);
            derive = false;
        }
    }
    names
}

/// One chain named by a row of the README's chain table.
#[derive(Debug)]
struct Row {
    line: usize,
    domain: String,
    chain: String,
    stages: String,
}

/// The chain names of a table cell: names in backticks separated by commas, each with at most one
/// `{A,B}` group standing for several names (`` `MatmulBias{Relu,Gelu}` `` is MatmulBiasRelu and
/// MatmulBiasGelu). Anything else is kept whole, to be reported as no chain of the code.
fn chain_names(cell: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = cell;
    while let Some(start) = rest.find('`') {
        let Some(len) = rest[start + 1..].find('`') else {
            break;
        };
        let name = &rest[start + 1..start + 1 + len];
        rest = &rest[start + len + 2..];
        match (name.find('{'), name.find('}')) {
            (Some(open), Some(close)) if open < close => {
                let (head, tail) = (&name[..open], &name[close + 1..]);
                for alt in name[open + 1..close].split(',') {
                    names.push(format!("{head}{}{tail}", alt.trim()));
                }
            }
            _ => names.push(name.to_string()),
        }
    }
    if names.is_empty() {
        names.push(cell.to_string());
    }
    names
}

/// The rows of the table under the README's heading that names `pptm::chains`.
fn readme_rows() -> Vec<Row> {
    let lines: Vec<&str> = README.lines().collect();
    let heading = lines
        .iter()
        .position(|l| l.starts_with('#') && l.contains("pptm::chains"))
        .expect("README.md has a heading naming `pptm::chains` above its table of shipped chains");
    let mut rows = Vec::new();
    let mut in_table = false;
    for (i, line) in lines.iter().enumerate().skip(heading + 1) {
        let line = line.trim();
        if line.starts_with('#') {
            break;
        }
        if !line.starts_with('|') {
            if in_table {
                break;
            }
            continue;
        }
        let cells: Vec<String> = line
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect();
        if !in_table {
            // The header row.
            in_table = true;
            assert_eq!(
                cells
                    .get(..3)
                    .map(|c| c.iter().map(String::as_str).collect::<Vec<_>>()),
                Some(vec!["domain", "chain", "stages"]),
                "README.md line {}: the chain table's first columns are domain, chain, stages",
                i + 1
            );
            continue;
        }
        if cells
            .iter()
            .all(|c| c.chars().all(|ch| matches!(ch, '-' | ':')))
        {
            continue; // the separator row
        }
        assert!(
            cells.len() >= 3,
            "README.md line {}: a chain row needs domain, chain and stages: {line}",
            i + 1
        );
        for chain in chain_names(&cells[1]) {
            rows.push(Row {
                line: i + 1,
                domain: cells[0].trim_matches('`').to_string(),
                chain,
                stages: cells[2].split_whitespace().collect::<Vec<_>>().join(" "),
            });
        }
    }
    assert!(!rows.is_empty(), "README.md: no rows in the chain table");
    rows
}

#[test]
fn shipped_list_is_complete() {
    let listed: BTreeSet<String> = shipped().iter().map(|c| c.name.to_string()).collect();
    let source = declared_in_source();
    assert!(
        !source.is_empty(),
        "no #[derive(FusionBuilder)] struct found in src/chains.rs"
    );
    let missing: Vec<_> = source.difference(&listed).collect();
    let extra: Vec<_> = listed.difference(&source).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "tests/readme.rs's shipped() and src/chains.rs disagree: declared but not listed here \
         {missing:?}, listed here but not declared {extra:?}"
    );
}

#[test]
fn chain_table_matches_the_code() {
    let rows = readme_rows();
    let chains = shipped();
    let mut problems = Vec::new();
    for row in &rows {
        if !chains.iter().any(|c| c.name == row.chain) {
            problems.push(format!(
                "line {}: `{}` is not a chain of pptm::chains",
                row.line, row.chain
            ));
        }
    }
    for chain in &chains {
        let found: Vec<&Row> = rows.iter().filter(|r| r.chain == chain.name).collect();
        match found.as_slice() {
            [] => problems.push(format!(
                "`{}` (domain {}, {}) has no row",
                chain.name, chain.domain, chain.stages
            )),
            [row] => {
                if row.domain != chain.domain {
                    problems.push(format!(
                        "line {}: `{}` is in domain `{}`, not `{}`",
                        row.line, chain.name, chain.domain, row.domain
                    ));
                }
                if row.stages.replace("->", "→") != chain.stages {
                    problems.push(format!(
                        "line {}: `{}`'s stages are `{}`, not `{}`",
                        row.line, chain.name, chain.stages, row.stages
                    ));
                }
            }
            more => problems.push(format!(
                "`{}` has {} rows (lines {:?})",
                chain.name,
                more.len(),
                more.iter().map(|r| r.line).collect::<Vec<_>>()
            )),
        }
    }
    assert!(
        problems.is_empty(),
        "README.md's table of shipped chains disagrees with pptm::chains:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn readme_is_short() {
    let n = README.lines().count();
    assert!(
        n <= MAX_LINES,
        "README.md has {n} lines; at most {MAX_LINES} (reference material goes under docs/)"
    );
}

/// The shell commands of the README, in order: the lines of its `sh`/`bash`/`shell`/`console`
/// (or untagged) code blocks, without prompts, comments and blank lines.
fn readme_commands() -> Vec<String> {
    let mut out = Vec::new();
    let mut in_block: Option<bool> = None; // Some(is a shell block) inside a fence
    for line in README.lines() {
        let trimmed = line.trim();
        if let Some(tag) = trimmed.strip_prefix("```") {
            in_block = match in_block {
                Some(_) => None,
                None => Some(matches!(
                    tag.trim(),
                    "" | "sh" | "bash" | "shell" | "console"
                )),
            };
            continue;
        }
        if in_block != Some(true) {
            continue;
        }
        let command = trimmed.strip_prefix("$ ").unwrap_or(trimmed);
        let command = command.split(" #").next().unwrap_or("").trim();
        if command.is_empty() || command.starts_with('#') {
            continue;
        }
        out.push(command.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    out
}

#[test]
fn first_commands_are_quickstart_and_test() {
    let commands = readme_commands();
    let first: Vec<&str> = commands.iter().take(2).map(String::as_str).collect();
    assert_eq!(
        first, FIRST_COMMANDS,
        "README.md's first two commands (all of them: {commands:?})"
    );
}
