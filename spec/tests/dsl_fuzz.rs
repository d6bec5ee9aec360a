//! Fuzzes the chain DSL's front end (`parse_chain`) and lowering (`ParsedChain::lower`, then
//! `ChainIr::bind` and the CPU reference) with proptest, over token streams:
//!
//! * `structured_chains`: plausible `#[derive(FusionBuilder)]` structs with random `#[fusion]`
//!   and `#[stage]` attributes (numbers with duplicates, gaps, huge and negative values; junk keys
//!   and values) and op types (catalog names, junk, paths with generics);
//! * `attribute_soup`: random token trees inside the attributes and as field types;
//! * `item_soup`: random token trees as whole items;
//! * `mutated_chains`: the shipped chains with tokens deleted, replaced, inserted, duplicated,
//!   wrapped in groups or ungrouped;
//! * `valid_chains_bind_and_evaluate`: op sequences from the catalog, declared in any order; for
//!   those that lower, random submission arguments through `bind`, and the f64 reference.
//!
//! The property: nothing panics, and every error is a `syn::Error` whose span points at tokens of
//! the input (a non-empty range of the text, with a line and column inside it), never a blank
//! call-site span. Inputs syn itself rejects as a `DeriveInput` are skipped (and counted).
//!
//! `cargo test` runs 1000 cases of each (`PROPTEST_CASES=N` sets how many).
//! `PPTM_FUZZ_SECONDS=N` instead makes `timed_fuzz` run every target in turn, in batches with
//! fresh seeds, until N seconds have passed, and print how many cases ran:
//!
//! ```sh
//! PPTM_FUZZ_SECONDS=600 cargo test -p pptm-spec --release --test dsl_fuzz -- --nocapture
//! ```

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pptm_spec::parse::parse_chain;
use pptm_spec::{ArgKind, ArgValue, ChainIr, EvalArg, Evaluated};
use proc_macro2::{Delimiter, Group, TokenStream, TokenTree};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

// ---------------------------------------------------------------------------------------------
// The property
// ---------------------------------------------------------------------------------------------

/// What became of one input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    /// proc-macro2 could not lex the text (only soup and mutations produce such text).
    Unlexable,
    /// Not a `DeriveInput` for syn: the compiler would have refused it before the derive ran.
    SynRejected,
    /// `parse_chain` refused it, with a spanned error.
    ParseError,
    /// `lower` refused it, with a spanned error.
    LowerError,
    /// It lowered.
    Lowered,
    /// `valid_chains_bind_and_evaluate`: random arguments that `bind` accepted.
    Bound,
    /// ... and were small enough to run the f64 reference on.
    Evaluated,
}

/// Parses and lowers `text` as the derive macro would, and checks every error's span.
fn check_text(text: &str) -> Result<(Outcome, Option<ChainIr>), TestCaseError> {
    // Each case parses a fresh "file"; forget the previous ones so the source map stays small.
    proc_macro2::extra::invalidate_current_thread_spans();
    let Ok(tokens) = TokenStream::from_str(text) else {
        return Ok((Outcome::Unlexable, None));
    };
    let Ok(input) = syn::parse2::<syn::DeriveInput>(tokens) else {
        return Ok((Outcome::SynRejected, None));
    };
    let parsed = match parse_chain(&input) {
        Ok(p) => p,
        Err(e) => {
            check_error(text, &e, "parse_chain")?;
            return Ok((Outcome::ParseError, None));
        }
    };
    prop_assert_eq!(&parsed.spec.name, &input.ident.to_string());
    prop_assert_eq!(&parsed.ident, &input.ident);
    if let syn::Data::Struct(s) = &input.data {
        prop_assert_eq!(parsed.spec.stages.len(), s.fields.len());
    }
    match parsed.lower() {
        Ok(ir) => {
            check_ir(&ir, &parsed.spec)?;
            Ok((Outcome::Lowered, Some(ir)))
        }
        Err(e) => {
            check_error(text, &e, "lower")?;
            // The spec-level error is the same one, without a span.
            prop_assert!(pptm_spec::lower(&parsed.spec).is_err());
            Ok((Outcome::LowerError, None))
        }
    }
}

/// Every message of `err` is non-empty and spanned at a non-empty range of `text`.
fn check_error(text: &str, err: &syn::Error, stage: &str) -> Result<(), TestCaseError> {
    let lines: Vec<&str> = text.split('\n').collect();
    for e in err.clone() {
        let msg = e.to_string();
        prop_assert!(!msg.trim().is_empty(), "{stage}: empty error message");
        let span = e.span();
        let Some(blamed) = span.source_text() else {
            return Err(TestCaseError::fail(format!(
                "{stage}: error `{msg}` has a call-site span, not one of the input's tokens"
            )));
        };
        let range = span.byte_range();
        prop_assert!(
            range.start < range.end && range.end <= text.len(),
            "{stage}: error `{msg}` spans bytes {range:?} of a {}-byte input",
            text.len()
        );
        prop_assert_eq!(&text[range.clone()], blamed.as_str());
        for (what, at) in [("start", span.start()), ("end", span.end())] {
            prop_assert!(
                at.line >= 1 && at.line <= lines.len(),
                "{stage}: error `{msg}`: {what} line {} of {}",
                at.line,
                lines.len()
            );
            let width = lines[at.line - 1].chars().count();
            prop_assert!(
                at.column <= width,
                "{stage}: error `{msg}`: {what} column {} past line {} ({width} characters)",
                at.column,
                at.line
            );
        }
    }
    Ok(())
}

/// What a lowered chain promises whatever it was declared as.
fn check_ir(ir: &ChainIr, spec: &pptm_spec::ChainSpec) -> Result<(), TestCaseError> {
    prop_assert_eq!(&ir.name, &spec.name);
    prop_assert_eq!(&ir.domain, &spec.domain);
    prop_assert_eq!(ir.stages.len(), spec.stages.len());
    prop_assert!(!ir.stages.is_empty());
    for (pos, st) in ir.stages.iter().enumerate() {
        prop_assert_eq!(st.number as usize, pos + 1, "data-flow order");
    }
    prop_assert!(ir.args.len() <= pptm_spec::DESC_ARGS);
    prop_assert!(ir.opcode >= pptm_spec::FIRST_VARIANT_OPCODE);
    prop_assert_eq!(ir.spec_hash.len(), 64);
    for d in &ir.dims {
        prop_assert_eq!(ir.args[d.slot].kind, ArgKind::Len);
        if let Some(src) = d.inferred_from {
            prop_assert!(matches!(
                ir.args[src].kind,
                ArgKind::Input | ArgKind::Output
            ));
        }
    }
    let mut names: Vec<&str> = ir.args.iter().map(|a| a.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    prop_assert_eq!(names.len(), ir.args.len(), "argument names are unique");
    // Lowering is a function of the spec: again, the same identity.
    let again = pptm_spec::lower(spec).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&again.spec_hash, &ir.spec_hash);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------------

fn catalog_names() -> Vec<&'static str> {
    pptm_spec::ops::CATALOG.iter().map(|op| op.name).collect()
}

/// Whitespace between tokens, so spans land on many lines and columns.
fn sep() -> impl Strategy<Value = &'static str> {
    prop_oneof![6 => Just(" "), 2 => Just("\n"), 1 => Just("\n        "), 1 => Just("\t"), 1 => Just("")]
}

fn ident() -> BoxedStrategy<String> {
    prop_oneof![
        6 => "[a-z][a-z0-9_]{0,8}",
        4 => "[A-Z][A-Za-z0-9]{0,10}",
        1 => "_[a-z0-9_]{0,4}",
        1 => select(vec![
            "stage", "fusion", "domain", "reduction", "tensor_eligible", "precision",
            "tolerance", "finite", "r#type", "r#stage", "self", "Self", "crate", "super", "struct", "fn",
            "_", "_x", "µ", "é", "Ω", "x_1", "NaN", "inf", "true", "false", "out",
        ])
        .prop_map(String::from),
    ]
    .boxed()
}

fn literal() -> BoxedStrategy<String> {
    prop_oneof![
        any::<u64>().prop_map(|v| v.to_string()),
        (0u32..20).prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| format!("{v:e}")),
        select(vec![
            "0",
            "1",
            "-1",
            "1.0",
            "0.",
            "1e-2",
            "1e999",
            "1e-999",
            "1e-400",
            "-0.0",
            "1e",
            "1e-2f32",
            "1e-2f64",
            "1u8",
            "1usize",
            "0x1F",
            "0b101",
            "0o17",
            "1_000",
            "340282366920938463463374607431768211456",
            "\"\"",
            "\"fp32\"",
            "\"bf16\"",
            "\"inference\"",
            "\"a b\"",
            "\"\\n\"",
            "\"\\u{1F600}\"",
            "r\"raw\"",
            "r#\"raw \" hash\"#",
            "b\"bytes\"",
            "br\"raw bytes\"",
            "c\"cstr\"",
            "'x'",
            "'\\n'",
            "b'x'",
            "'\\u{10FFFF}'",
        ])
        .prop_map(String::from),
        "\"[a-z0-9 _/.-]{0,12}\"",
    ]
    .boxed()
}

fn punct() -> impl Strategy<Value = String> {
    select(vec![
        ",", "=", "#", ":", "::", ";", "<", ">", "-", "&", "'a", "!", ".", "..", "=>", "->", "@",
        "$", "?", "+", "*", "/", "%", "^", "|", "~", "_", "==", "<=", "&&", "'static",
    ])
    .prop_map(String::from)
}

/// One token tree: a leaf, or a group of token trees (up to three deep).
fn token_tree() -> BoxedStrategy<String> {
    let leaf = prop_oneof![3 => ident(), 2 => literal(), 2 => punct()];
    leaf.prop_recursive(3, 32, 6, |inner| {
        (
            select(vec![("(", ")"), ("[", "]"), ("{", "}")]),
            prop::collection::vec((inner, sep()), 0..6),
        )
            .prop_map(|((open, close), items)| {
                let body: String = items.into_iter().map(|(t, s)| t + s).collect();
                format!("{open}{body}{close}")
            })
    })
    .boxed()
}

fn soup(max: usize) -> BoxedStrategy<String> {
    prop::collection::vec((token_tree(), sep()), 0..max)
        .prop_map(|items| items.into_iter().map(|(t, s)| t + s).collect())
        .boxed()
}

/// A stage's op type: a catalog op (mostly), a near miss or junk, written plainly, as a path, or
/// inside some other type.
fn op_type() -> BoxedStrategy<String> {
    let name = prop_oneof![
        5 => select(catalog_names()).prop_map(String::from),
        1 => select(vec![
            "Softmax", "KlDivergance", "matmul", "SUM_REDUCTION", "Sumreduction", "GemvT2",
            "Gemvt", "Ops", "f32", "Vec", "Self", "r#Matmul", "MatMul", "KthSmalest",
        ])
        .prop_map(String::from),
        1 => "[A-Z][A-Za-z0-9]{0,12}",
    ];
    (name, 0u8..40, soup(3))
        .prop_map(|(n, how, s)| match how {
            0..=7 | 16..=39 => n,
            8 => format!("pptm::ops::{n}"),
            9 => format!("::pptm::ops::{n}"),
            10 => format!("crate::ops::{n}"),
            11 => format!("{n}<f32>"),
            12 => format!("{n}<{s}>"),
            13 => [
                format!("{n}<>"),
                format!("{n}::<T>"),
                format!("Vec<{n}>"),
                format!("{n}<'a>"),
                format!("{n}<{{ 3 }}>"),
                format!("{n}()"),
                format!("{n}(f32) -> f32"),
                format!("{n}<N = 3>"),
                format!("self::{n}"),
                format!("super::{n}"),
            ][s.len() % 10]
                .clone(),
            14 => [
                format!("&'static {n}"),
                format!("({n}, {n})"),
                format!("[{n}; 3]"),
                format!("<{n} as Trait>::Out"),
                format!("fn() -> {n}"),
                format!("dyn {n}"),
                format!("impl {n}"),
                "_".to_string(),
                "!".to_string(),
                format!("*const {n}"),
                format!("{n}!()"),
                format!("Option<{n}>"),
                "()".to_string(),
                format!("[{n}]"),
            ][s.len() % 14]
                .clone(),
            _ => s,
        })
        .boxed()
}

/// Stands for the field's position in the declaration (plus one) in a generated chain: most
/// stages are numbered 1, 2, 3, ... so that more chains get past the numbering checks.
const POSITION: &str = "@N";

/// The `n` of `#[stage(n)]`.
fn stage_number() -> BoxedStrategy<String> {
    prop_oneof![
        12 => Just(POSITION.to_string()),
        6 => (0u64..8).prop_map(|v| v.to_string()),
        1 => select(vec![
            "4294967295", "4294967296", "18446744073709551616", "99999999999999999999999999",
            "-1", "- 1", "1u8", "1u32", "1i64", "1usize", "1.0", "1e3", "0x1", "0b10", "0o7",
            "1_000", "01", "\"1\"", "true", "'1'", "x", "(1)", "1 2",
        ])
        .prop_map(String::from),
    ]
    .boxed()
}

fn attr_value() -> BoxedStrategy<String> {
    prop_oneof![
        3 => select(vec!["true", "false"]).prop_map(String::from),
        3 => select(vec![
            "\"fp64\"", "\"fp32\"", "\"bf16\"", "\"fp16\"", "\"fp8\"", "\"FP32\"", "\"fp31\"",
            "\"\"", "\"f32\"", "\"tf32\"", "\"fp32 \"", "r\"bf16\"", "b\"fp16\"",
        ])
        .prop_map(String::from),
        3 => select(vec![
            "1e-2", "0.5", "1", "0", "0.0", "-1e-2", "1e999", "1e-999", "1e-400", "NaN",
            "f64::NAN", "inf", "1e-2f32", "1e-2f64", "1.", "0.999999999", "1.0000000001",
            "0x10", "\"1e-2\"", "-0.0", "- 1e-2", "(1e-2)", "[1]", "{1}", "1e-2 1", "5e-324",
            "0.99999999999999999999", "1_0e-3",
        ])
        .prop_map(String::from),
        1 => literal(),
        1 => ident(),
        1 => soup(3),
    ]
    .boxed()
}

fn attr_key() -> BoxedStrategy<String> {
    prop_oneof![
        6 => select(vec!["reduction", "tensor_eligible", "precision", "tolerance", "finite"])
            .prop_map(String::from),
        1 => select(vec!["fused", "Reduction", "r#reduction", "domain", "stage", "k", "_"])
            .prop_map(String::from),
        1 => ident(),
    ]
    .boxed()
}

/// A known stage attribute with a value of the type it takes (mostly valid).
fn typed_entry() -> BoxedStrategy<String> {
    prop_oneof![
        2 => (select(vec!["reduction", "tensor_eligible", "finite"]), prop_oneof![
            8 => select(vec!["true", "false"]),
            1 => select(vec!["1", "\"true\"", "yes", "True", "-true", "!true"]),
        ])
            .prop_map(|(k, v)| format!("{k} = {v}")),
        1 => prop_oneof![
            8 => select(vec!["\"fp64\"", "\"fp32\"", "\"bf16\"", "\"fp16\"", "\"fp8\""]),
            1 => select(vec!["\"FP32\"", "\"fp31\"", "\"\"", "fp32", "32", "r\"bf16\""]),
        ]
            .prop_map(|v| format!("precision = {v}")),
        1 => prop_oneof![
            6 => select(vec![
                "1e-2", "0.5", "1e-3", "0.25", "1", "0", "0.0", "1e999", "1e-400", "5e-324",
                "0.99999999999999999999", "1.0000000001", "1e-2f32", "0x1", "1_0e-3",
            ])
            .prop_map(String::from),
            1 => select(vec!["-1e-2", "NaN", "inf", "\"1e-2\"", "- 0.5", "(1e-2)", "1e-2 1"])
                .prop_map(String::from),
            1 => any::<f64>().prop_map(|v| format!("{:e}", v.abs())),
        ]
            .prop_map(|v| format!("tolerance = {v}")),
    ]
    .boxed()
}

/// One `key = value` entry of a stage attribute, or a malformed one.
fn attr_entry() -> BoxedStrategy<String> {
    prop_oneof![3 => typed_entry(), 1 => junk_entry()].boxed()
}

fn junk_entry() -> BoxedStrategy<String> {
    (attr_key(), attr_value(), 0u8..12)
        .prop_map(|(k, v, how)| match how {
            0..=7 => format!("{k} = {v}"),
            8 => k,
            9 => format!("{k} {v}"),
            10 => format!("= {v}"),
            _ => [format!("{k} ="), format!("{k}({v})"), format!("{k}: {v}")][v.len() % 3].clone(),
        })
        .boxed()
}

/// The inside of `#[stage(...)]`.
fn stage_args() -> BoxedStrategy<String> {
    (
        prop::option::weighted(0.9, stage_number()),
        prop::collection::vec((attr_entry(), sep()), 0..4),
        select(vec!["", "", "", ",", ",,", " , "]),
    )
        .prop_map(|(number, entries, tail)| {
            let mut parts: Vec<String> = number.into_iter().collect();
            parts.extend(entries.into_iter().map(|(e, s)| format!("{s}{e}")));
            parts.join(", ") + tail
        })
        .boxed()
}

/// An attribute of a field: mostly one `#[stage(...)]`.
fn field_attr() -> BoxedStrategy<String> {
    prop_oneof![
        12 => stage_args().prop_map(|a| format!("#[stage({a})]")),
        1 => stage_args().prop_map(|a| {
            [
                format!("#[stage[{a}]]"), format!("#[stage{{{a}}}]"),
                format!("#[pptm::stage({a})]"), format!("#[other({a})]"),
                "#[stage]".to_string(), "#[stage = 1]".to_string(),
                "#[doc = \"a stage\"]".to_string(), "/// a stage\n".to_string(),
                "#[stage()]".to_string(), "#[allow(dead_code)]".to_string(),
            ][a.len() % 10]
                .clone()
        }),
        1 => soup(6).prop_map(|s| format!("#[stage({s})]")),
    ]
    .boxed()
}

fn field() -> BoxedStrategy<String> {
    (
        prop::collection::vec((field_attr(), sep()), 0..3),
        prop::bool::weighted(0.8),
        select(vec!["", "", "", "pub ", "pub(crate) ", "pub(super) "]),
        ident(),
        op_type(),
        sep(),
    )
        .prop_map(|(attrs, one, vis, name, ty, s)| {
            // Mostly exactly one attribute.
            let attrs: Vec<_> = if one && !attrs.is_empty() {
                attrs.into_iter().take(1).collect()
            } else {
                attrs
            };
            let attrs: String = attrs.into_iter().map(|(a, s)| a + s).collect();
            format!("{attrs}{vis}{name}:{s}{ty}")
        })
        .boxed()
}

/// A field as a careful user writes it: one `#[stage(n, ...)]` with attributes of the right
/// types, a plain name, a catalog op.
fn clean_field() -> BoxedStrategy<String> {
    (
        prop_oneof![19 => Just(POSITION.to_string()), 1 => stage_number()],
        prop::option::weighted(0.3, prop::collection::vec(typed_entry(), 1..3)),
        "[a-z][a-z0-9_]{0,6}",
        select(catalog_names()),
        select(vec!["", "", "pptm::ops::", "crate::ops::", "::pptm::ops::"]),
        sep(),
    )
        .prop_map(|(number, entries, name, op, path, s)| {
            let mut args = vec![number];
            args.extend(entries.unwrap_or_default());
            format!("#[stage({})]{s}{name}: {path}{op}", args.join(", "))
        })
        .boxed()
}

fn domain_value() -> BoxedStrategy<String> {
    prop_oneof![
        4 => select(vec!["inference", "linear_algebra", "transfer_entropy", "x", "a1_", "d"])
            .prop_map(|d| format!("\"{d}\"")),
        2 => "[a-z][a-z0-9_]{0,10}".prop_map(|d| format!("\"{d}\"")),
        2 => select(vec![
            "\"\"", "\"Inference\"", "\"a/b\"", "\"1x\"", "\"a-b\"", "\"é\"", "\" inference\"",
            "\"inference\\n\"", "r\"inference\"", "b\"inference\"", "c\"inference\"",
            "inference", "3", "true", "\"_x\"",
        ])
        .prop_map(String::from),
        1 => (60usize..70).prop_map(|n| format!("\"{}\"", "a".repeat(n))),
        1 => literal(),
    ]
    .boxed()
}

/// `#[fusion(...)]` and its malformed relatives.
fn fusion_attr() -> BoxedStrategy<String> {
    let entry =
        (domain_value(), ident(), literal(), 0u8..16).prop_map(|(d, k, l, how)| match how {
            0..=11 => format!("domain = {d}"),
            12 => format!("{k} = {l}"),
            13 => "domain".to_string(),
            14 => "domain =".to_string(),
            _ => format!("shape = {l}"),
        });
    (
        prop::collection::vec(entry, 1..3),
        prop::bool::weighted(0.8),
        0u8..24,
        soup(5),
    )
        .prop_map(|(entries, one, how, s)| {
            let entries = if one && !entries.is_empty() {
                entries[..1].to_vec()
            } else {
                entries
            };
            let args = entries.join(", ");
            match how {
                0..=20 => format!("#[fusion({args})]"),
                21 => format!("#[fusion({s})]"),
                22 => [
                    "#[fusion]",
                    "#[fusion = \"inference\"]",
                    "#[fusion[domain = \"x\"]]",
                ][s.len() % 3]
                    .to_string(),
                _ => format!("#[pptm::fusion({args})]"),
            }
        })
        .boxed()
}

fn item_attr() -> BoxedStrategy<String> {
    prop_oneof![
        1 => fusion_attr(),
        2 => Just("#[derive(FusionBuilder)]".to_string()),
        1 => Just("#[derive(Debug, pptm::FusionBuilder)]".to_string()),
        1 => Just("/// A chain.\n".to_string()),
        1 => (ident(), soup(4)).prop_map(|(p, s)| format!("#[{p}({s})]")),
        1 => soup(4).prop_map(|s| format!("#[{s}]")),
    ]
    .boxed()
}

/// A plausible chain declaration, and some that are not quite.
fn structured_chain() -> BoxedStrategy<String> {
    (
        prop::option::weighted(0.9, fusion_attr()),
        prop::collection::vec((item_attr(), sep()), 0..3),
        any::<prop::sample::Index>(),
        select(vec!["", "", "pub ", "pub(crate) "]),
        prop_oneof![
            40 => Just("struct"),
            1 => Just("enum"),
            1 => Just("union"),
        ],
        ident(),
        prop_oneof![
            30 => Just(String::new()),
            1 => select(vec!["<T>", "<'a>", "<const N: usize>", "<T: Copy>", "<>"])
                .prop_map(String::from),
        ],
        prop_oneof![
            prop::collection::vec((field(), sep()), 0..6),
            prop::collection::vec((clean_field(), sep()), 1..6),
        ],
        0u8..40,
    )
        .prop_map(
            |(fusion, attrs, at, vis, kw, name, generics, fields, body)| {
                let mut attrs: Vec<String> = attrs.into_iter().map(|(a, s)| a + s).collect();
                if let Some(f) = fusion {
                    attrs.insert(at.index(attrs.len() + 1), f + "\n");
                }
                let attrs = attrs.concat();
                let fields: Vec<String> = fields
                    .into_iter()
                    .enumerate()
                    .map(|(i, (f, s))| f.replace(POSITION, &(i + 1).to_string()) + s)
                    .collect();
                let body = match body {
                    0..=33 => format!("{{\n    {}\n}}", fields.join(",\n    ")),
                    34..=37 if !fields.is_empty() => format!("{{ {}, }}", fields.join(", ")),
                    34..=37 => "{}".to_string(),
                    38 => "(f32);".to_string(),
                    _ => ";".to_string(),
                };
                format!("{attrs}{vis}{kw} {name}{generics} {body}")
            },
        )
        .boxed()
}

/// Token soup inside the attributes and as field types of an otherwise well-formed struct.
fn soup_in_attributes() -> BoxedStrategy<String> {
    (
        soup(8),
        prop::collection::vec(
            (soup(6), soup(3), prop::bool::weighted(0.15), any::<bool>()),
            0..5,
        ),
    )
        .prop_map(|(fusion, fields)| {
            let fields: Vec<String> = fields
                .into_iter()
                .enumerate()
                .map(|(i, (args, ty, soup_ty, numbered))| {
                    let ty = if soup_ty {
                        ty
                    } else {
                        "KlDivergence".to_string()
                    };
                    if numbered {
                        format!("#[stage({}, {args})] f{i}: {ty}", i + 1)
                    } else {
                        format!("#[stage({args})] f{i}: {ty}")
                    }
                })
                .collect();
            format!(
                "#[fusion({fusion})]\nstruct Soup {{\n    {}\n}}",
                fields.join(",\n    ")
            )
        })
        .boxed()
}

/// Token soup as a whole item, or as the body of a struct.
fn soup_items() -> BoxedStrategy<String> {
    // Tokens a struct is made of, so that syn accepts some of the soup.
    let struct_ish = prop_oneof![
        4 => token_tree(),
        4 => select(vec![
            "#", "[stage(1)]", "[stage(2, reduction = true)]", "[fusion(domain = \"x\")]",
            "struct", "pub", "S", "a", "b", ":", ",", "KlDivergence", "SumReduction", "Matmul",
            "{ a: KlDivergence }", "{ #[stage(1)] a: Matmul, }",
        ])
        .prop_map(String::from),
    ];
    (
        prop::collection::vec((struct_ish, sep()), 0..24),
        soup(10),
        0u8..3,
    )
        .prop_map(|(items, s, how)| {
            let flat: String = items.into_iter().map(|(t, s)| t + s).collect();
            match how {
                0 => flat,
                1 => format!("#[fusion(domain = \"x\")] struct S {{ {flat} }}"),
                _ => s,
            }
        })
        .boxed()
}

/// The chains pptm ships (src/chains.rs), as written there.
const SHIPPED: &[&str] = &[
    r#"#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct KlComplexity {
    #[stage(1)]
    kl: KlDivergence,
    #[stage(2, reduction = true)]
    total: SumReduction,
}"#,
    r#"#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct BeliefUpdateStep {
    #[stage(1)]
    error: PredictionError,
    #[stage(2)]
    weighted: PrecisionWeight,
    #[stage(3)]
    gradient: GemvT,
    #[stage(4)]
    update: crate::ops::BeliefUpdate,
}"#,
    r#"#[derive(FusionBuilder)]
#[fusion(domain = "transfer_entropy")]
pub struct TeReduction {
    #[stage(1)]
    distances: SubspaceDistances,
    #[stage(2)]
    counts: RadiusCount,
    #[stage(3)]
    terms: KsgDigamma,
    #[stage(4, reduction = true)]
    mean: MeanReduction,
    #[stage(5)]
    estimate: AddDigamma,
}"#,
    r#"#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct GemvAxpbySum {
    #[stage(1)]
    product: Gemv,
    #[stage(2)]
    axpby: Axpby,
    #[stage(3)]
    square: Square,
    #[stage(4, reduction = true)]
    total: SumReduction,
}"#,
    r#"#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct MatmulBiasGeluGuarded {
    #[stage(1, tensor_eligible = true, precision = "fp16", tolerance = 1e-2)]
    product: Matmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Gelu,
}"#,
    r#"#[derive(FusionBuilder)]
#[fusion(domain = "transfer_entropy")]
pub struct DistanceKth {
    #[stage(1)]
    distances: ChebyshevDistance,
    #[stage(2)]
    kth: KthSmallest,
}"#,
];

/// One edit of a token stream, at the `at`-th token tree (counted depth first, modulo the count).
#[derive(Debug, Clone)]
enum Edit {
    Delete(u32),
    Replace(u32, String),
    Insert(u32, String),
    Duplicate(u32),
    Wrap(u32, u8),
    Unwrap(u32),
}

fn edit() -> BoxedStrategy<Edit> {
    let leaf = prop_oneof![3 => ident(), 3 => literal(), 2 => punct(), 1 => token_tree()];
    prop_oneof![
        (any::<u32>()).prop_map(Edit::Delete),
        (any::<u32>(), leaf.clone()).prop_map(|(a, t)| Edit::Replace(a, t)),
        (any::<u32>(), leaf).prop_map(|(a, t)| Edit::Insert(a, t)),
        (any::<u32>()).prop_map(Edit::Duplicate),
        (any::<u32>(), 0u8..3).prop_map(|(a, d)| Edit::Wrap(a, d)),
        (any::<u32>()).prop_map(Edit::Unwrap),
    ]
    .boxed()
}

fn count_trees(ts: &TokenStream) -> usize {
    ts.clone()
        .into_iter()
        .map(|t| match t {
            TokenTree::Group(g) => 1 + count_trees(&g.stream()),
            _ => 1,
        })
        .sum()
}

/// Applies `edit` at token tree number `target` (depth first); `seen` counts the trees passed.
fn apply(ts: TokenStream, edit: &Edit, target: usize, seen: &mut usize) -> TokenStream {
    let mut out: Vec<TokenTree> = Vec::new();
    for tree in ts {
        let here = *seen == target;
        *seen += 1;
        if here {
            match edit {
                Edit::Delete(_) => continue,
                Edit::Replace(_, t) | Edit::Insert(_, t) => {
                    if let Ok(new) = TokenStream::from_str(t) {
                        out.extend(new);
                    }
                    if matches!(edit, Edit::Replace(..)) {
                        continue;
                    }
                }
                Edit::Duplicate(_) => out.push(tree.clone()),
                Edit::Wrap(_, d) => {
                    let delim = [Delimiter::Parenthesis, Delimiter::Bracket, Delimiter::Brace]
                        [usize::from(*d) % 3];
                    out.push(TokenTree::Group(Group::new(delim, tree.into())));
                    continue;
                }
                Edit::Unwrap(_) => {
                    if let TokenTree::Group(g) = &tree {
                        out.extend(g.stream());
                        continue;
                    }
                }
            }
        }
        match tree {
            TokenTree::Group(g) => {
                let inner = apply(g.stream(), edit, target, seen);
                out.push(TokenTree::Group(Group::new(g.delimiter(), inner)));
            }
            other => out.push(other),
        }
    }
    out.into_iter().collect()
}

fn mutate(base: &str, edits: &[Edit]) -> String {
    let mut ts = TokenStream::from_str(base).expect("the shipped chains lex");
    for e in edits {
        let n = count_trees(&ts).max(1);
        let at = match e {
            Edit::Delete(a)
            | Edit::Replace(a, _)
            | Edit::Insert(a, _)
            | Edit::Duplicate(a)
            | Edit::Wrap(a, _)
            | Edit::Unwrap(a) => *a as usize % n,
        };
        ts = apply(ts, e, at, &mut 0);
    }
    ts.to_string()
}

/// A chain of catalog ops numbered in data-flow order, declared in a random order, with an
/// attribute now and then.
#[derive(Debug, Clone)]
struct OpChain {
    ops: Vec<&'static str>,
    /// The declaration order: a permutation of the stages.
    order: Vec<usize>,
    attrs: Vec<&'static str>,
    domain: &'static str,
}

impl OpChain {
    fn text(&self, order: &[usize]) -> String {
        let mut s = format!(
            "#[fusion(domain = \"{}\")]\nstruct Fuzzed {{\n",
            self.domain
        );
        for &i in order {
            s.push_str(&format!(
                "    #[stage({}{})] s{}: pptm::ops::{},\n",
                i + 1,
                self.attrs[i],
                i + 1,
                self.ops[i]
            ));
        }
        s.push('}');
        s
    }
}

fn op_chain() -> BoxedStrategy<OpChain> {
    let attr = prop_oneof![
        12 => Just(""),
        1 => select(vec![
            ", reduction = true", ", reduction = false", ", tensor_eligible = true",
            ", tensor_eligible = false", ", finite = true", ", finite = false", ", precision = \"fp32\"", ", precision = \"bf16\"",
            ", tensor_eligible = true, precision = \"bf16\"",
            ", tensor_eligible = true, precision = \"fp16\", tolerance = 1e-2",
            ", tensor_eligible = true, precision = \"bf16\", tolerance = 0.5",
        ]),
    ];
    // Op sequences that lower (the shipped chains' and a few more), with an op appended or
    // replaced now and then, so that most chains get through lowering to `bind`.
    let known = select(vec![
        vec!["KlDivergence", "SumReduction"],
        vec!["KlDivergence"],
        vec!["KlDivergence", "MeanReduction"],
        vec!["PredictionError", "Accuracy", "SumReduction"],
        vec!["PredictionError", "MaxReduction"],
        vec![
            "PredictionError",
            "PrecisionWeight",
            "GemvT",
            "BeliefUpdate",
        ],
        vec!["ChebyshevDistance", "KthSmallest"],
        vec![
            "SubspaceDistances",
            "RadiusCount",
            "KsgDigamma",
            "MeanReduction",
            "AddDigamma",
        ],
        vec!["Gemv", "Axpby", "Square", "SumReduction"],
        vec!["Matmul", "AddBias", "Gelu"],
        vec!["Matmul", "AddBias", "Relu"],
        vec!["Matmul"],
        vec!["Gemv"],
        vec!["GemvT"],
    ]);
    let stages = prop_oneof![
        1 => prop::collection::vec(select(catalog_names()), 1..6),
        2 => (known, select(catalog_names()), any::<prop::sample::Index>(), 0u8..4).prop_map(
            |(mut ops, op, at, how)| {
                match how {
                    0 => ops.push(op),
                    1 => {
                        let i = at.index(ops.len());
                        ops[i] = op;
                    }
                    _ => {}
                }
                ops
            }
        ),
    ];
    (stages, prop::collection::vec(attr, 6))
        .prop_map(|(ops, attrs)| ops.into_iter().zip(attrs).collect::<Vec<_>>())
        .prop_flat_map(|stages| {
            let n = stages.len();
            (
                Just(stages),
                Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
                select(vec!["inference", "linear_algebra", "transfer_entropy"]),
            )
        })
        .prop_map(|(stages, order, domain)| OpChain {
            ops: stages.iter().map(|s| s.0).collect(),
            attrs: stages.iter().map(|s| s.1).collect(),
            order,
            domain,
        })
        .boxed()
}

/// Submission arguments for a lowered chain: a size per dimension, then per-slot deviations.
#[derive(Debug, Clone)]
struct Submission {
    sizes: Vec<usize>,
    /// Per slot: 0 as intended, 1 a length off by one, 2 another kind, 3 a huge length.
    faults: Vec<u8>,
    values: Vec<f32>,
    k: Vec<u32>,
}

fn submission() -> BoxedStrategy<Submission> {
    let size = prop_oneof![
        12 => 0usize..6,
        1 => Just(usize::MAX),
        1 => Just(usize::MAX / 3),
        1 => Just(1usize << 32),
        1 => any::<usize>(),
    ];
    let fault = prop_oneof![20 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)];
    let value = prop_oneof![
        4 => -4.0f32..4.0,
        1 => select(vec![
            0.0f32, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE / 2.0,
            f32::MAX, -f32::MAX, 1e-45,
        ]),
    ];
    (
        prop::collection::vec(size, 8),
        prop::collection::vec(fault, 16),
        prop::collection::vec(value, 64),
        prop::collection::vec(prop_oneof![4 => 0u32..6, 1 => any::<u32>()], 16),
    )
        .prop_map(|(sizes, faults, values, k)| Submission {
            sizes,
            faults,
            values,
            k,
        })
        .boxed()
}

/// Binds random arguments to `ir` and, when they fit and are small, evaluates the f64 reference.
fn check_bind(ir: &ChainIr, sub: &Submission) -> Result<(), TestCaseError> {
    let sizes: Vec<usize> = (0..ir.dims.len())
        .map(|d| sub.sizes[d % sub.sizes.len()])
        .collect();
    let len_of = |shape: &[usize]| {
        shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(sizes[d]))
            .unwrap_or(usize::MAX)
    };
    let mut faulty = false;
    let mut scalar_at = 0;
    let values: Vec<ArgValue> = ir
        .args
        .iter()
        .enumerate()
        .map(|(slot, a)| {
            let fault = sub.faults[slot % sub.faults.len()];
            let v = match a.kind {
                ArgKind::Input | ArgKind::Output => ArgValue::Buffer(match fault {
                    1 => len_of(&a.shape).wrapping_add(1),
                    3 => usize::MAX / 2,
                    _ => len_of(&a.shape),
                }),
                ArgKind::F32 => {
                    scalar_at += 1;
                    ArgValue::F32(sub.values[scalar_at % sub.values.len()])
                }
                ArgKind::U32 => {
                    scalar_at += 1;
                    ArgValue::U32(sub.k[scalar_at % sub.k.len()])
                }
                ArgKind::Len => match ir.dims[a.dim.expect("len slot")].inferred_from {
                    Some(_) => ArgValue::Inferred,
                    None => ArgValue::Dim(sizes[a.dim.expect("len slot")]),
                },
                ArgKind::Guard | ArgKind::Scratch => ArgValue::Inferred,
            };
            if fault == 2 {
                faulty = true;
                return match v {
                    ArgValue::Buffer(n) => ArgValue::Dim(n),
                    ArgValue::Dim(n) => ArgValue::Buffer(n),
                    ArgValue::Inferred => ArgValue::Dim(1),
                    ArgValue::F32(_) => ArgValue::U32(1),
                    ArgValue::U32(_) => ArgValue::Inferred,
                };
            }
            faulty |= fault != 0 && matches!(a.kind, ArgKind::Input | ArgKind::Output);
            v
        })
        .collect();
    let Ok(bound) = ir.bind(&values) else {
        return Ok(());
    };
    tally("valid_chains_bind_and_evaluate", Outcome::Bound);
    prop_assert_eq!(bound.len(), ir.dims.len());
    // Every buffer's length is the product of its dimensions, and that fits in memory.
    for (a, v) in ir.args.iter().zip(&values) {
        if let ArgValue::Buffer(n) = v {
            let want = a
                .shape
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(bound[d]));
            prop_assert_eq!(want, Some(*n), "`{}`", a.name);
        }
    }
    if !faulty {
        prop_assert_eq!(
            &bound,
            &sizes,
            "bind recovers the sizes the arguments were made from"
        );
    }
    // What the GPU paths compute from the sizes must not overflow.
    let _ = ir.blocks_for(&bound);
    for s in 0..ir.stages.len() {
        let _ = ir.stage_blocks(s, &bound);
        let _ = ir.stage_output_len(s, &bound);
        let _ = ir.flow_elements(s, &bound);
    }
    // Small buffers and stage outputs: run the f64 reference on random data. Its work must be
    // bounded by those, whatever sizes the parameters claim (a matmul with k = n = 0 and
    // m = 2^64 - 1 has no output at all).
    let small = values.iter().all(|v| match v {
        ArgValue::Buffer(n) => *n <= 64,
        _ => true,
    }) && (0..ir.stages.len()).all(|s| ir.stage_output_len(s, &bound) <= 1 << 16);
    if !small {
        return Ok(());
    }
    let data: Vec<Vec<f32>> = values
        .iter()
        .map(|v| match v {
            ArgValue::Buffer(n) => (0..*n)
                .map(|i| sub.values[(i * 7 + 3) % sub.values.len()])
                .collect(),
            _ => Vec::new(),
        })
        .collect();
    let eval: Vec<EvalArg<'_>> = ir
        .args
        .iter()
        .zip(&values)
        .zip(&data)
        .map(|((a, v), d)| match (a.kind, v) {
            (ArgKind::Input, _) => EvalArg::Input(d),
            (_, ArgValue::F32(x)) => EvalArg::Value(f64::from(*x)),
            (_, ArgValue::U32(x)) => EvalArg::Value(f64::from(*x)),
            _ => EvalArg::None,
        })
        .collect();
    tally("valid_chains_bind_and_evaluate", Outcome::Evaluated);
    match ir.eval_f64(&eval, &bound) {
        Evaluated::Scalar(_) => {
            prop_assert_eq!(ir.output, pptm_spec::ChainOutput::Scalar)
        }
        Evaluated::Vector(v) => {
            let out = ir.output_slot().expect("a vector chain has an output");
            prop_assert_eq!(
                ArgValue::Buffer(v.len()),
                values[out],
                "one value per output"
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Targets and the runner
// ---------------------------------------------------------------------------------------------

/// Outcome counts per target, for the report.
static TALLY: Mutex<BTreeMap<(&'static str, Outcome), u64>> = Mutex::new(BTreeMap::new());

fn tally(target: &'static str, outcome: Outcome) {
    *TALLY
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry((target, outcome))
        .or_default() += 1;
}

fn check_and_tally(target: &'static str, text: &str) -> Result<Option<ChainIr>, TestCaseError> {
    let (outcome, ir) = check_text(text)
        .map_err(|e| TestCaseError::fail(format!("{e}\n--- input ---\n{text}\n-------------")))?;
    tally(target, outcome);
    Ok(ir)
}

/// A fuzz target: a name, and one batch of `cases` cases from a fresh seed.
struct Target {
    name: &'static str,
    batch: fn(u32) -> Result<(), String>,
}

fn run_batch<S>(
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) -> Result<(), String>
where
    S: Strategy,
    S::Value: Debug,
{
    let config = Config {
        cases,
        // A failing case is saved, and replayed first by every later run, in
        // spec/proptest-regressions/dsl_fuzz.txt: commit it with the fix.
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(
                "proptest-regressions/dsl_fuzz.txt",
            ),
        )),
        max_shrink_iters: 4096,
        ..Config::default()
    };
    match TestRunner::new(config).run(&strategy, test) {
        Ok(()) => Ok(()),
        Err(TestError::Fail(reason, value)) => {
            Err(format!("{reason}\nminimal failing case: {value:#?}"))
        }
        Err(TestError::Abort(reason)) => Err(format!("aborted: {reason}")),
    }
}

fn structured_batch(cases: u32) -> Result<(), String> {
    run_batch(cases, structured_chain(), |text| {
        check_and_tally("structured_chains", &text).map(drop)
    })
}

fn attribute_soup_batch(cases: u32) -> Result<(), String> {
    run_batch(cases, soup_in_attributes(), |text| {
        check_and_tally("attribute_soup", &text).map(drop)
    })
}

fn item_soup_batch(cases: u32) -> Result<(), String> {
    run_batch(cases, soup_items(), |text| {
        check_and_tally("item_soup", &text).map(drop)
    })
}

fn mutated_batch(cases: u32) -> Result<(), String> {
    let strategy = (0..SHIPPED.len(), prop::collection::vec(edit(), 1..5));
    run_batch(cases, strategy, |(base, edits)| {
        let text = mutate(SHIPPED[base], &edits);
        check_and_tally("mutated_chains", &text).map(drop)
    })
}

fn valid_batch(cases: u32) -> Result<(), String> {
    run_batch(cases, (op_chain(), submission()), |(chain, sub)| {
        let target = "valid_chains_bind_and_evaluate";
        let text = chain.text(&chain.order);
        let Some(ir) = check_and_tally(target, &text)? else {
            return Ok(());
        };
        // The declaration order does not matter: in data-flow order, the same chain.
        let ordered: Vec<usize> = (0..chain.ops.len()).collect();
        let Some(same) = check_and_tally(target, &chain.text(&ordered))? else {
            return Err(TestCaseError::fail(format!(
                "lowers declared as\n{text}\nbut not in data-flow order"
            )));
        };
        prop_assert_eq!(&same.spec_hash, &ir.spec_hash);
        check_bind(&ir, &sub)
            .map_err(|e| TestCaseError::fail(format!("{e}\n--- chain ---\n{text}")))
    })
}

const TARGETS: &[Target] = &[
    Target {
        name: "structured_chains",
        batch: structured_batch,
    },
    Target {
        name: "attribute_soup",
        batch: attribute_soup_batch,
    },
    Target {
        name: "item_soup",
        batch: item_soup_batch,
    },
    Target {
        name: "mutated_chains",
        batch: mutated_batch,
    },
    Target {
        name: "valid_chains_bind_and_evaluate",
        batch: valid_batch,
    },
];

fn fuzz_seconds() -> Option<u64> {
    std::env::var("PPTM_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
}

fn default_cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1000)
}

fn print_tally(only: Option<&str>) {
    let tally = TALLY.lock().unwrap_or_else(|e| e.into_inner());
    for ((target, outcome), n) in tally.iter() {
        if only.is_none_or(|o| o == *target) {
            eprintln!("  {target:32} {outcome:?}: {n}");
        }
    }
}

/// A target's default run (`cargo test`), or nothing when the timed run is asked for.
fn run_default(name: &str) {
    if fuzz_seconds().is_some() {
        eprintln!("{name}: covered by timed_fuzz (PPTM_FUZZ_SECONDS is set)");
        return;
    }
    let target = TARGETS.iter().find(|t| t.name == name).expect("a target");
    let cases = default_cases();
    if let Err(e) = (target.batch)(cases) {
        panic!("{name}: {e}");
    }
    eprintln!("{name}: {cases} cases passed");
    print_tally(Some(name));
}

#[test]
fn structured_chains() {
    run_default("structured_chains");
}

#[test]
fn attribute_soup() {
    run_default("attribute_soup");
}

#[test]
fn item_soup() {
    run_default("item_soup");
}

#[test]
fn mutated_chains() {
    run_default("mutated_chains");
}

#[test]
fn valid_chains_bind_and_evaluate() {
    run_default("valid_chains_bind_and_evaluate");
}

/// Found by `valid_chains_bind_and_evaluate`: with no points, the coordinate counts of a pairwise
/// op are unconstrained by the (empty) buffers, and their sum overflowed in the op's check
/// (`attempt to add with overflow` in a debug build; in a release build it wrapped, and the check
/// passed).
#[test]
fn regression_coordinate_counts_that_overflow_are_a_bind_error() {
    let text = SHIPPED
        .iter()
        .find(|s| s.contains("TeReduction"))
        .expect("shipped");
    let (_, ir) = check_text(text).expect("the shipped chain passes");
    let ir = ir.expect("the shipped chain lowers");
    let values = |dx: usize| -> Vec<ArgValue> {
        ir.args
            .iter()
            .map(|a| match (a.kind, a.name.as_str()) {
                (ArgKind::Input | ArgKind::Output, _) => ArgValue::Buffer(0),
                (ArgKind::U32, _) => ArgValue::U32(1),
                (ArgKind::F32, _) => ArgValue::F32(0.0),
                (ArgKind::Len, "dx") => ArgValue::Dim(dx),
                (ArgKind::Len, "dy") => ArgValue::Dim(2),
                (ArgKind::Len, _) => match ir.dims[a.dim.expect("len")].inferred_from {
                    Some(_) => ArgValue::Inferred,
                    None => ArgValue::Dim(0),
                },
                (ArgKind::Guard | ArgKind::Scratch, _) => ArgValue::Inferred,
            })
            .collect()
    };
    // Sizes from MAX_DIM on are refused before any op's check (descriptors do not carry them);
    // below it, the op's check refuses the count without overflowing.
    match ir.bind(&values(usize::MAX)) {
        Err(pptm_spec::BindError::DimTooLarge { dim, .. }) => assert_eq!(dim, "dx"),
        other => panic!("expected DimTooLarge, got {other:?}"),
    }
    match ir.bind(&values(pptm_spec::MAX_DIM as usize - 1)) {
        Err(pptm_spec::BindError::Op { op, reason }) => {
            assert_eq!(op, "SubspaceDistances");
            assert!(reason.contains("at most 128"), "{reason}");
        }
        other => panic!("expected an op error, got {other:?}"),
    }
}

/// With `PPTM_FUZZ_SECONDS=N`: every target in turn, a batch at a time from a fresh seed, until N
/// seconds have passed (on one thread). Prints the cases run per target and in all.
#[test]
fn timed_fuzz() {
    let Some(seconds) = fuzz_seconds() else {
        return;
    };
    const BATCH: u32 = 500;
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let mut batches: BTreeMap<&str, u64> = BTreeMap::new();
    let mut last_report = start;
    'outer: loop {
        for t in TARGETS {
            if Instant::now() >= deadline {
                break 'outer;
            }
            if let Err(e) = (t.batch)(BATCH) {
                print_tally(None);
                panic!("{} failed after {:.0?}: {e}", t.name, start.elapsed());
            }
            *batches.entry(t.name).or_default() += 1;
        }
        if last_report.elapsed() >= Duration::from_secs(60) {
            last_report = Instant::now();
            let cases: u64 = batches.values().sum::<u64>() * u64::from(BATCH);
            eprintln!(
                "timed_fuzz: {:.0?} elapsed, {cases} cases so far",
                start.elapsed()
            );
        }
    }
    let elapsed = start.elapsed();
    eprintln!("timed_fuzz: ran for {elapsed:.1?} (asked for {seconds} s)");
    let mut total = 0;
    for (name, n) in &batches {
        let cases = n * u64::from(BATCH);
        total += cases;
        eprintln!("  {name:32} {cases} cases ({n} batches of {BATCH}, fresh seed each)");
    }
    eprintln!("timed_fuzz: {total} cases in all, no failure; outcomes:");
    print_tally(None);
}
