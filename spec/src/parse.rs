//! The syn front end: reads a `#[derive(FusionBuilder)]` struct into a [`ChainSpec`], keeping the
//! span of every part so validation errors point at what is wrong. Used by the derive macro and
//! by build.rs (which must agree on what a chain is, so they share this code).

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, Ident, Lit, LitBool, LitInt, LitStr, Token, Type};

use crate::chain::MAX_REPEAT;
use crate::lower::Blame;
use crate::{ChainIr, ChainSpec, Precision, StageSpec, Tolerance};

/// A parsed chain with the spans of its parts.
#[derive(Debug, Clone)]
pub struct ParsedChain {
    /// The chain as written, defaults not yet applied.
    pub spec: ChainSpec,
    /// The struct's name, with its span (where a whole-chain error points).
    pub ident: Ident,
    domain_span: Span,
    stages: Vec<StageSpans>,
}

#[derive(Debug, Clone)]
struct StageSpans {
    number: Span,
    op: Span,
    attrs: Vec<(&'static str, Span)>,
}

impl ParsedChain {
    /// Validates and lowers the chain; an error points at the offending part of the declaration.
    pub fn lower(&self) -> syn::Result<ChainIr> {
        self.lower_with(&[])
    }

    /// [`ParsedChain::lower`] with ops of the user's own (`#[pptm::op]`) available to its stages.
    pub fn lower_with(&self, extra: &[&'static crate::OpDef]) -> syn::Result<ChainIr> {
        crate::lower_with(&self.spec, extra).map_err(|e| {
            let span = match e.blame() {
                Blame::Chain => self.ident.span(),
                Blame::Domain => self.domain_span,
                Blame::StageNumber(i) => self.stages[i].number,
                Blame::StageOp(i) => self.stages[i].op,
                Blame::StageAttr(i, name) => self.stages[i]
                    .attrs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or(self.stages[i].op, |(_, s)| *s),
            };
            syn::Error::new(span, e)
        })
    }
}

/// Whether an attribute is `#[pptm::op]` or `#[op]` (with or without arguments).
pub fn is_op_attr(a: &syn::Attribute) -> bool {
    a.path().segments.last().is_some_and(|s| s.ident == "op")
}

/// The ops of the user's own declared in a file: every function with `#[pptm::op]`, at any
/// depth, translated, as [`crate::OpDef`]s (leaked) whose CPU reference is a stub (the caller,
/// build.rs or the derive macro, does not link the function). Functions the attribute macro
/// refuses are skipped: it reports them, with spans, when the crate compiles.
pub fn user_ops_in(
    file: &syn::File,
    states: &[crate::op_fn::StateDef],
) -> Vec<&'static crate::OpDef> {
    use syn::visit::Visit;
    struct Ops<'s>(Vec<&'static crate::OpDef>, &'s [crate::op_fn::StateDef]);
    impl<'ast> Visit<'ast> for Ops<'_> {
        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            if let Some(attr) = f.attrs.iter().find(|a| is_op_attr(a)) {
                let args = match &attr.meta {
                    syn::Meta::List(l) => l.tokens.clone(),
                    _ => proc_macro2::TokenStream::new(),
                };
                let def = crate::op_fn::parse_op_attr(args).ok().and_then(|attr| {
                    let op = crate::op_fn::parse_op_with_states(&attr, f, self.1).ok()?;
                    op.leak_def(&attr.tensor_names()).ok()
                });
                self.0.extend(def);
            }
            syn::visit::visit_item_fn(self, f);
        }
    }
    let mut ops = Ops(Vec::new(), states);
    ops.visit_file(file);
    ops.0
}

/// The states (`#[derive(pptm::State)]` structs, at any depth) declared in a parsed file that
/// check ([`StateDef::parse`](crate::op_fn::StateDef::parse); the derive reports the others).
pub fn user_states_in(file: &syn::File) -> Vec<crate::op_fn::StateDef> {
    use syn::visit::Visit;
    #[derive(Default)]
    struct States(Vec<crate::op_fn::StateDef>);
    impl<'ast> Visit<'ast> for States {
        fn visit_item_struct(&mut self, item: &'ast syn::ItemStruct) {
            if derives(&item.attrs, "State") {
                self.0.extend(crate::op_fn::StateDef::parse(item).ok());
            }
            syn::visit::visit_item_struct(self, item);
        }
    }
    let mut states = States::default();
    states.visit_file(file);
    states.0
}

/// Whether a derive list names FusionBuilder (by its last path segment).
pub fn derives_fusion_builder(attrs: &[syn::Attribute]) -> bool {
    derives(attrs, "FusionBuilder")
}

/// Whether a derive list names `name` (by its last path segment).
fn derives(attrs: &[syn::Attribute], name: &str) -> bool {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("derive"))
        .any(|a| {
            let mut found = false;
            let _ = a.parse_nested_meta(|meta| {
                if meta.path.segments.last().is_some_and(|s| s.ident == name) {
                    found = true;
                }
                Ok(())
            });
            found
        })
}

/// What a derive calls its struct and fields, for [`marked_fields`]'s messages.
struct Declaration {
    /// "a fusion chain", "a pipeline".
    noun: &'static str,
    /// The derive's name.
    derive: &'static str,
    /// The field attribute: "stage", "step".
    attr: &'static str,
    /// A one-line example of the struct.
    example: &'static str,
}

const CHAIN: Declaration = Declaration {
    noun: "a fusion chain",
    derive: "FusionBuilder",
    attr: "stage",
    example: "`struct Chain { #[stage(1)] a: Op, ... }`",
};

const PIPELINE: Declaration = Declaration {
    noun: "a pipeline",
    derive: "Pipeline",
    attr: "step",
    example: "`struct P { #[step(1)] a: SomeChain, ... }`",
};

/// The fields of a derive's struct, each with its name and its one `#[attr(...)]`: a struct with
/// named fields, not generic, every field marked once (errors spanned where that fails).
fn marked_fields<'a>(
    input: &'a DeriveInput,
    d: &Declaration,
) -> syn::Result<Vec<(&'a syn::Field, String, &'a syn::Attribute)>> {
    let Declaration {
        noun,
        derive,
        attr,
        example,
    } = d;
    if !input.generics.params.is_empty() {
        return Err(syn::Error::new(
            input.generics.span(),
            format!("{noun} cannot be generic"),
        ));
    }
    let fields = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(f) => &f.named,
            _ => {
                return Err(syn::Error::new(
                    input.ident.span(),
                    format!("{noun} is a struct with named fields, one per {attr}: {example}"),
                ));
            }
        },
        _ => {
            return Err(syn::Error::new(
                input.ident.span(),
                format!("#[derive({derive})] applies to structs only"),
            ));
        }
    };
    let mut out = Vec::with_capacity(fields.len());
    for field in fields {
        let name = field
            .ident
            .as_ref()
            .map(|i| i.to_string())
            .unwrap_or_default();
        let mut marks = field.attrs.iter().filter(|a| a.path().is_ident(attr));
        let Some(mark) = marks.next() else {
            return Err(syn::Error::new(
                field.span(),
                format!("field `{name}` has no #[{attr}(n)]: every field of {noun} is a {attr}"),
            ));
        };
        if let Some(extra) = marks.next() {
            return Err(syn::Error::new(
                extra.span(),
                format!("a field takes one #[{attr}(...)]"),
            ));
        }
        out.push((field, name, mark));
    }
    Ok(out)
}

/// Reads a chain declaration. Errors are spanned at the offending tokens.
pub fn parse_chain(input: &DeriveInput) -> syn::Result<ParsedChain> {
    let fields = marked_fields(input, &CHAIN)?;
    let mut domain: Option<(String, Span)> = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("fusion")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("domain") {
                if domain.is_some() {
                    return Err(meta.error("`domain` is given twice"));
                }
                let lit: LitStr = meta.value()?.parse()?;
                domain = Some((lit.value(), lit.span()));
                Ok(())
            } else {
                Err(meta.error("unknown fusion attribute; expected `domain = \"...\"`"))
            }
        })?;
    }
    let Some((domain, domain_span)) = domain else {
        return Err(syn::Error::new(
            input.ident.span(),
            "missing `#[fusion(domain = \"...\")]`: name the manifold that hosts this chain",
        ));
    };

    let mut stages = Vec::new();
    let mut spans = Vec::new();
    for (field, field_name, attr) in fields {
        let args: StageArgs = attr.parse_args()?;
        let (op, op_span) = op_name(&field.ty)?;
        stages.push(StageSpec {
            field: field_name,
            number: args.number,
            op,
            reduction: args.reduction,
            tensor_eligible: args.tensor_eligible,
            precision: args.precision,
            tolerance: args.tolerance,
            finite: args.finite,
            per_row: args.per_row,
            args: args.renames,
            repeat: args.repeat,
            tables: args.tables,
            promoted: args.promoted,
        });
        spans.push(StageSpans {
            number: args.number_span,
            op: op_span,
            attrs: args.spans,
        });
    }

    Ok(ParsedChain {
        spec: ChainSpec {
            name: input.ident.to_string(),
            domain,
            stages,
        },
        ident: input.ident.clone(),
        domain_span,
        stages: spans,
    })
}

/// Whether a derive list names `Pipeline` (by its last path segment).
pub fn derives_pipeline(attrs: &[syn::Attribute]) -> bool {
    derives(attrs, "Pipeline")
}

/// A parsed `#[derive(Pipeline)]` with the spans of its parts.
#[derive(Debug, Clone)]
pub struct ParsedPipeline {
    /// The pipeline as written.
    pub spec: crate::pipeline::PipelineSpec,
    /// The struct's name, with its span (where a whole-pipeline error points).
    pub ident: Ident,
    /// Per step (declaration order): its number's span, its chain type's span, its attributes'.
    steps: Vec<StageSpans>,
}

impl ParsedPipeline {
    /// Composes the pipeline (see [`crate::pipeline::compose`]); an error points at the
    /// offending part of the declaration.
    pub fn compose<'c>(
        &self,
        chains: &dyn Fn(&str) -> Vec<&'c ChainSpec>,
        extra: &[&'static crate::OpDef],
    ) -> syn::Result<crate::pipeline::PipelineIr> {
        use crate::pipeline::PipelineBlame;
        crate::pipeline::compose(&self.spec, chains, extra).map_err(|e| {
            let span = match e.blame() {
                PipelineBlame::Pipeline => self.ident.span(),
                PipelineBlame::StepNumber(i) => self.steps[i].number,
                PipelineBlame::StepChain(i) => self.steps[i].op,
                PipelineBlame::StepAttr(i, name) => self.steps[i]
                    .attrs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or(self.steps[i].op, |(_, s)| *s),
            };
            syn::Error::new(span, e)
        })
    }
}

/// Reads a pipeline declaration: a struct whose fields are chains marked `#[step(n, ...)]`.
pub fn parse_pipeline(input: &DeriveInput) -> syn::Result<ParsedPipeline> {
    let fields = marked_fields(input, &PIPELINE)?;
    let mut steps = Vec::new();
    let mut spans = Vec::new();
    for (field, field_name, attr) in fields {
        let args: StepArgs = attr.parse_args()?;
        let (chain, chain_span) = type_name(
            &field.ty,
            "a step's type names its chain, e.g. `KlComplexity`",
        )?;
        steps.push(crate::pipeline::StepSpec {
            field: field_name,
            number: args.number,
            chain,
            args: args.renames,
            repeat: args.repeat,
            store: args.store,
        });
        spans.push(StageSpans {
            number: args.number_span,
            op: chain_span,
            attrs: args.spans,
        });
    }
    Ok(ParsedPipeline {
        spec: crate::pipeline::PipelineSpec {
            name: input.ident.to_string(),
            steps,
        },
        ident: input.ident.clone(),
        steps: spans,
    })
}

/// `n, args(...), repeat = k, store = bool`
struct StepArgs {
    number: u32,
    number_span: Span,
    renames: Vec<(String, String)>,
    repeat: Option<u32>,
    store: Option<bool>,
    spans: Vec<(&'static str, Span)>,
}

impl Parse for StepArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let number: LitInt = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "expected the step number first, e.g. #[step(1)] or #[step(2, args(x = \"a\"))]",
            )
        })?;
        let mut args = StepArgs {
            number: number.base10_parse()?,
            number_span: number.span(),
            renames: Vec::new(),
            repeat: None,
            store: None,
            spans: Vec::new(),
        };
        while !input.is_empty() {
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            let key: Ident = input.parse()?;
            let name = attribute_key(
                &key,
                &["args", "repeat", "store"],
                "unknown step attribute",
                "`args(...)`, `repeat` or `store`",
                &args.spans,
            )?;
            args.spans.push((name, key.span()));
            match name {
                "args" => args.renames = parse_renames(input)?,
                "repeat" => {
                    input.parse::<Token![=]>()?;
                    let lit: LitInt = input.parse().map_err(|e| {
                        syn::Error::new(e.span(), "`repeat` takes a count, e.g. repeat = 8")
                    })?;
                    let times: u32 = lit.base10_parse()?;
                    if !(1..=MAX_REPEAT).contains(&times) {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!("`repeat` takes a count from 1 to {MAX_REPEAT}"),
                        ));
                    }
                    args.repeat = Some(times);
                }
                _ => {
                    input.parse::<Token![=]>()?;
                    let lit: LitBool = input.parse()?;
                    args.store = Some(lit.value);
                }
            }
        }
        Ok(args)
    }
}

/// The op named by a stage's type: the last segment of a plain path (`ops::KlDivergence`).
fn op_name(ty: &Type) -> syn::Result<(String, Span)> {
    type_name(
        ty,
        "a stage's type names its op, e.g. `pptm::ops::KlDivergence`",
    )
}

/// The last segment of a plain path type, or an error saying `what`.
fn type_name(ty: &Type, what: &str) -> syn::Result<(String, Span)> {
    if let Type::Path(p) = ty
        && p.qself.is_none()
        && let Some(last) = p.path.segments.last()
    {
        if !last.arguments.is_empty() {
            return Err(syn::Error::new(
                last.arguments.span(),
                "op and chain types take no generic arguments",
            ));
        }
        return Ok((last.ident.to_string(), last.ident.span()));
    }
    Err(syn::Error::new(ty.span(), what))
}

/// `n, reduction = bool, tensor_eligible = bool, precision = "...", tolerance = x, finite = bool,
/// per_row = bool, repeat = k, args(...)`
struct StageArgs {
    number: u32,
    number_span: Span,
    reduction: Option<bool>,
    tensor_eligible: Option<bool>,
    precision: Option<Precision>,
    tolerance: Option<Tolerance>,
    finite: Option<bool>,
    per_row: Option<bool>,
    repeat: Option<u32>,
    tables: Option<crate::DType>,
    promoted: Option<bool>,
    renames: Vec<(String, String)>,
    spans: Vec<(&'static str, Span)>,
}

impl Parse for StageArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let number: LitInt = input
            .parse()
            .map_err(|e| syn::Error::new(e.span(), "expected the stage number first, e.g. #[stage(1)] or #[stage(2, reduction = true)]"))?;
        let value: u32 = number.base10_parse()?;
        let mut args = StageArgs {
            number: value,
            number_span: number.span(),
            reduction: None,
            tensor_eligible: None,
            precision: None,
            tolerance: None,
            finite: None,
            per_row: None,
            repeat: None,
            tables: None,
            promoted: None,
            renames: Vec::new(),
            spans: Vec::new(),
        };
        while !input.is_empty() {
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            let key: Ident = input.parse()?;
            if key == "args" {
                if args.spans.iter().any(|(n, _)| *n == "args") {
                    return Err(syn::Error::new(key.span(), "`args` is given twice"));
                }
                args.renames = parse_renames(input)?;
                args.spans.push(("args", key.span()));
                continue;
            }
            input.parse::<Token![=]>()?;
            let name = attribute_key(
                &key,
                &[
                    "reduction",
                    "tensor_eligible",
                    "precision",
                    "tolerance",
                    "finite",
                    "per_row",
                    "repeat",
                    "tables",
                    "accumulate",
                ],
                "unknown stage attribute",
                "`reduction`, `tensor_eligible`, `precision`, `tolerance`, `finite`, `per_row`, \
                 `repeat`, `tables`, `accumulate` or `args(...)`",
                &args.spans,
            )?;
            match name {
                "precision" => {
                    let lit: LitStr = input.parse()?;
                    let p = lit
                        .value()
                        .parse::<Precision>()
                        .map_err(|e| syn::Error::new(lit.span(), e))?;
                    args.precision = Some(p);
                    args.spans.push((name, lit.span()));
                }
                "tolerance" => {
                    let lit: Lit = input.parse()?;
                    let value = match &lit {
                        Lit::Float(f) => f.base10_parse::<f64>()?,
                        Lit::Int(i) => i.base10_parse::<f64>()?,
                        other => {
                            return Err(syn::Error::new(
                                other.span(),
                                "`tolerance` takes a number, e.g. tolerance = 1e-2",
                            ));
                        }
                    };
                    args.tolerance = Some(Tolerance(value));
                    args.spans.push((name, lit.span()));
                }
                "tables" => {
                    let lit: LitStr = input.parse()?;
                    args.tables = Some(match lit.value().as_str() {
                        "fp32" => crate::DType::F32,
                        "fp16" => crate::DType::F16,
                        other => {
                            return Err(syn::Error::new(
                                lit.span(),
                                format!(
                                    "`tables` stores tables in \"fp32\" or \"fp16\", not \"{other}\""
                                ),
                            ));
                        }
                    });
                    args.spans.push((name, lit.span()));
                }
                "accumulate" => {
                    let lit: LitStr = input.parse()?;
                    args.promoted = Some(match lit.value().as_str() {
                        "promoted" => true,
                        "tensor" => false,
                        other => {
                            return Err(syn::Error::new(
                                lit.span(),
                                format!(
                                    "`accumulate` is \"promoted\" (partial sums added into f32 sums \
                                     every 512 of k) or \"tensor\" (the default), not \"{other}\""
                                ),
                            ));
                        }
                    });
                    args.spans.push((name, lit.span()));
                }
                "repeat" => {
                    let lit: LitInt = input.parse().map_err(|e| {
                        syn::Error::new(e.span(), "`repeat` takes a count, e.g. repeat = 8")
                    })?;
                    let times: u32 = lit.base10_parse()?;
                    if !(1..=MAX_REPEAT).contains(&times) {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!("`repeat` takes a count from 1 to {MAX_REPEAT}"),
                        ));
                    }
                    args.repeat = Some(times);
                    args.spans.push((name, lit.span()));
                }
                _ => {
                    let lit: LitBool = input.parse()?;
                    match name {
                        "reduction" => args.reduction = Some(lit.value),
                        "finite" => args.finite = Some(lit.value),
                        "per_row" => args.per_row = Some(lit.value),
                        _ => args.tensor_eligible = Some(lit.value),
                    }
                    args.spans.push((name, lit.span()));
                }
            }
        }
        Ok(args)
    }
}

/// The attribute a key names, among `known`: an error at the key for another one (`unknown`,
/// then the `expected` list) or for one already given (in `seen`).
fn attribute_key(
    key: &Ident,
    known: &[&'static str],
    unknown: &str,
    expected: &str,
    seen: &[(&'static str, Span)],
) -> syn::Result<&'static str> {
    let Some(&name) = known.iter().find(|&&k| key == k) else {
        return Err(syn::Error::new(
            key.span(),
            format!("{unknown} `{key}`; expected {expected}"),
        ));
    };
    if seen.iter().any(|(n, _)| *n == name) {
        return Err(syn::Error::new(
            key.span(),
            format!("`{name}` is given twice"),
        ));
    }
    Ok(name)
}

/// `args(param = "name", ...)`: what each named op parameter is called in the chain. A name is a
/// Rust identifier (it becomes a parameter of `submit`), not `out` (the output) and given once.
fn parse_renames(input: ParseStream) -> syn::Result<Vec<(String, String)>> {
    let content;
    syn::parenthesized!(content in input);
    let mut renames: Vec<(String, String)> = Vec::new();
    while !content.is_empty() {
        let param: Ident = content.parse()?;
        content.parse::<Token![=]>()?;
        let name: LitStr = content.parse()?;
        let value = name.value();
        if syn::parse_str::<Ident>(&value).is_err() || value.starts_with("r#") {
            return Err(syn::Error::new(
                name.span(),
                format!(
                    "`{value}` is not a Rust identifier; an argument's name becomes a parameter of `submit`"
                ),
            ));
        }
        if value == "out" || value == "guard_level" {
            return Err(syn::Error::new(
                name.span(),
                format!("`{value}` is reserved (the chain's output or the accuracy guard's level)"),
            ));
        }
        if renames.iter().any(|(p, _)| param == p.as_str()) {
            return Err(syn::Error::new(
                param.span(),
                format!("`{param}` is renamed twice"),
            ));
        }
        renames.push((param.to_string(), value));
        if content.is_empty() {
            break;
        }
        content.parse::<Token![,]>()?;
    }
    if renames.is_empty() {
        return Err(syn::Error::new(
            input.span(),
            "`args(...)` names at least one parameter, e.g. args(a = \"w2\")",
        ));
    }
    Ok(renames)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(src: &str) -> syn::Result<ChainIr> {
        let input: DeriveInput = syn::parse_str(src)?;
        parse_chain(&input)?.lower()
    }

    #[test]
    fn a_repeated_stage_takes_its_places_in_the_flow() {
        let chain = |times: u32| {
            parse(&format!(
                r#"#[fusion(domain = "t")]
                   struct R {{
                       #[stage(1, repeat = {times})] step: Axpby,
                       #[stage(2, reduction = true)] total: SumReduction,
                   }}"#
            ))
            .unwrap()
        };
        let (three, two) = (chain(3), chain(2));
        assert_eq!(three.stages.len(), 4);
        assert!(three.stages[..3].iter().all(|s| s.op.name == "Axpby"));
        // Copies 2 and 3 read what the copy before produced; every copy shares y, alpha, beta.
        assert!(matches!(three.stages[1].inputs[0], crate::Source::Stage(0)));
        assert!(matches!(three.stages[2].inputs[0], crate::Source::Stage(1)));
        let names: Vec<&str> = three.args.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["x", "y", "alpha", "beta", "n"]);
        assert_eq!(three.blocks_for(&[4096]), two.blocks_for(&[4096]));
        assert_ne!(
            three.spec_hash, two.spec_hash,
            "the count is part of the chain"
        );
        assert_eq!(chain(1).stages.len(), 2);
        assert_eq!(three.describe(), "Axpby x 3 -> SumReduction");
    }

    #[test]
    fn bad_repeats_are_refused() {
        let one = |attrs: &str, op: &str| {
            parse(&format!(
                r#"#[fusion(domain = "t")] struct R {{ #[stage(1, {attrs})] s: {op} }}"#
            ))
        };
        for bad in [
            "repeat = 0",
            "repeat = 4097",
            "repeat = 1.5",
            "repeat = true",
        ] {
            let e = one(bad, "Axpby").unwrap_err();
            assert!(
                e.to_string().contains("`repeat` takes a count"),
                "{bad}: {e}"
            );
        }
        let e = one("repeat = 2", "SumReduction").unwrap_err();
        assert!(
            e.to_string().contains("only an elementwise op repeats"),
            "{e}"
        );
        let e = one("repeat = 2, repeat = 3", "Axpby").unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
        // A spec built by hand is checked too.
        let mut spec = parse_chain(
            &syn::parse_str(r#"#[fusion(domain = "t")] struct R { #[stage(1)] s: Axpby }"#)
                .unwrap(),
        )
        .unwrap()
        .spec;
        spec.stages[0].repeat = Some(0);
        let e = crate::lower(&spec).unwrap_err();
        assert!(
            matches!(e, crate::SpecError::BadRepeat { stage: 0, .. }),
            "{e}"
        );
        assert_eq!(e.blame(), Blame::StageAttr(0, "repeat"));
    }

    #[test]
    fn stage_attributes_reach_the_chain() {
        let ir = parse(
            r#"#[fusion(domain = "t")]
               struct G {
                   #[stage(1, tensor_eligible = true, precision = "bf16", tolerance = 1e-2)] p: Matmul,
                   #[stage(2, finite = true)] g: Gelu,
               }"#,
        )
        .unwrap();
        assert_eq!(ir.stages[0].tolerance, Some(1e-2));
        assert!(ir.stages[0].tensor);
        assert!(!ir.stages[0].finite && ir.stages[1].finite);
        // An integer tolerance is a number too.
        let e = parse(
            r#"#[fusion(domain = "t")]
               struct G { #[stage(1, tensor_eligible = true, precision = "bf16", tolerance = 1)] p: Matmul }"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("between 0 and 1"), "{e}");
    }

    /// An attribute's error points at that attribute's value, not at another of the stage's.
    #[test]
    fn an_attribute_error_points_at_its_value() {
        let src = r#"#[fusion(domain = "t")] struct G { #[stage(1, tensor_eligible = true, precision = "bf16", tolerance = 2.5)] p: Matmul }"#;
        let e = parse(src).unwrap_err();
        assert!(e.to_string().contains("tolerance"), "{e}");
        assert_eq!(e.span().start().column, src.find("2.5").unwrap(), "{e}");
    }

    #[test]
    fn parses_the_design_example() {
        let ir = parse(
            r#"#[derive(FusionBuilder)]
               #[fusion(domain = "inference")]
               pub struct KlComplexity {
                   #[stage(1)] kl: KlDivergence,
                   #[stage(2, reduction = true)] total: pptm::ops::SumReduction,
               }"#,
        )
        .unwrap();
        assert_eq!(ir.name, "KlComplexity");
        assert_eq!(ir.domain, "inference");
        assert_eq!(ir.describe(), "KlDivergence -> SumReduction");
    }

    #[test]
    fn rejects_malformed_declarations_with_messages() {
        let cases = [
            (
                "struct A { #[stage(1)] a: KlDivergence }",
                "missing `#[fusion(domain",
            ),
            (
                "#[fusion(domain = \"x\")] struct A(KlDivergence);",
                "named fields",
            ),
            ("#[fusion(domain = \"x\")] enum A { B }", "structs only"),
            (
                "#[fusion(domain = \"x\")] struct A<T> { #[stage(1)] a: T }",
                "generic",
            ),
            (
                "#[fusion(domain = \"x\")] struct A { a: KlDivergence }",
                "has no #[stage(n)]",
            ),
            (
                "#[fusion(domain = \"x\")] struct A { #[stage(reduction = true)] a: KlDivergence }",
                "stage number first",
            ),
            (
                "#[fusion(domain = \"x\")] struct A { #[stage(1, fused = true)] a: KlDivergence }",
                "unknown stage attribute `fused`",
            ),
            (
                "#[fusion(domain = \"x\")] struct A { #[stage(1, precision = \"fp31\")] a: KlDivergence }",
                "unknown precision",
            ),
            (
                "#[fusion(domain = \"x\")] struct A { #[stage(1, reduction = true, reduction = true)] a: SumReduction }",
                "twice",
            ),
            (
                "#[fusion(domain = \"x\")] struct A { #[stage(1)] a: Vec<f32> }",
                "no generic arguments",
            ),
            (
                "#[fusion(domain = \"x\")] struct A { #[stage(1)] a: &'static str }",
                "names its op",
            ),
            (
                "#[fusion(domain = \"x\", shape = 3)] struct A { #[stage(1)] a: KlDivergence }",
                "unknown fusion attribute",
            ),
            (
                "#[fusion(domain = \"x\")] struct A { #[stage(1)] a: Softmax }",
                "unknown op `Softmax`",
            ),
            (
                "#[fusion(domain = \"x\")] struct A { #[stage(1)] #[stage(2)] a: KlDivergence }",
                "one #[stage",
            ),
        ];
        for (src, want) in cases {
            let err = parse(src).expect_err(src).to_string();
            assert!(err.contains(want), "{src}\n  gave: {err}\n  want: {want}");
        }
    }

    #[test]
    fn finds_the_derive() {
        let item: DeriveInput =
            syn::parse_str("#[derive(Debug, pptm::FusionBuilder)] struct A {}").unwrap();
        assert!(derives_fusion_builder(&item.attrs));
        let item: DeriveInput = syn::parse_str("#[derive(Debug)] struct A {}").unwrap();
        assert!(!derives_fusion_builder(&item.attrs));
    }

    #[test]
    fn stage_args_rename_parameters() {
        // Two Axpby stages, each with its own vector and scalars.
        let ir = parse(
            r#"#[fusion(domain = "t")] struct C {
                   #[stage(1)] p: Gemv,
                   #[stage(2)] first: Axpby,
                   #[stage(3, args(y = "y2", alpha = "alpha2", beta = "beta2"))] second: Axpby,
                   #[stage(4)] sq: Square,
                   #[stage(5, reduction = true)] t: SumReduction,
               }"#,
        )
        .unwrap();
        let names: Vec<&str> = ir.args.iter().map(|a| a.name.as_str()).collect();
        for want in ["x", "a", "y", "alpha", "beta", "y2", "alpha2", "beta2"] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        let shape = |n: &str| ir.args.iter().find(|a| a.name == n).unwrap().shape.clone();
        assert_eq!(shape("y2"), shape("y"));
        assert_eq!(ir.stages[2].renames.len(), 3);
        // The names are part of the chain's identity.
        let plain = parse(
            r#"#[fusion(domain = "t")] struct C {
                   #[stage(1)] p: Gemv,
                   #[stage(2)] first: Axpby,
                   #[stage(3)] second: Axpby,
                   #[stage(4)] sq: Square,
                   #[stage(5, reduction = true)] t: SumReduction,
               }"#,
        )
        .unwrap();
        assert_ne!(ir.spec_hash, plain.spec_hash);
        assert!(!plain.canonical.contains("args="), "{}", plain.canonical);
        assert!(
            ir.canonical.contains("args=alpha:alpha2,beta:beta2,y:y2"),
            "{}",
            ir.canonical
        );
        // Renamed, a second matrix is its own argument: the MLP is then refused for what it
        // is (two GEMVs need a grid-wide barrier), not for the name.
        let mlp = |third: &str| {
            parse(&format!(
                r#"#[fusion(domain = "t")] struct M {{ #[stage(1)] l1: Gemv, #[stage(2)] act: Relu, {third} l2: Gemv }}"#
            ))
            .unwrap_err()
            .to_string()
        };
        let same = mlp("#[stage(3)]");
        assert!(
            same.contains("argument `a` is used with another shape") && same.contains("args(...)"),
            "{same}"
        );
        let renamed = mlp(r#"#[stage(3, args(a = "w2"))]"#);
        assert!(renamed.contains("grid-wide barrier"), "{renamed}");
    }

    #[test]
    fn bad_stage_args_are_refused_where_written() {
        for (attr, needle) in [
            (
                r#"args(q = "z")"#,
                "`Gemv` does not take (its parameters: x, a)",
            ),
            (r#"args(a = "2a")"#, "not a Rust identifier"),
            (r#"args(a = "out")"#, "reserved"),
            (r#"args(a = "b", a = "c")"#, "renamed twice"),
            (r#"args()"#, "names at least one parameter"),
            (r#"args(a = "b"), args(a = "c")"#, "`args` is given twice"),
            (r#"args(a = b)"#, "expected string literal"),
        ] {
            let src =
                format!(r#"#[fusion(domain = "t")] struct C {{ #[stage(1, {attr})] p: Gemv }}"#);
            let e = parse(&src).unwrap_err().to_string();
            assert!(e.contains(needle), "{attr}: {e}");
        }
        // A later stage's flow comes from the stage before it: it has no argument to rename.
        let e = parse(
            r#"#[fusion(domain = "t")] struct C { #[stage(1)] p: Gemv, #[stage(2, args(x = "h"))] s: Square }"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("that is the stage's flow"), "{e}");
        // A by-value parameter renamed onto a buffer's name: one argument, two types.
        let e = parse(
            r#"#[fusion(domain = "t")] struct C { #[stage(1)] p: Gemv, #[stage(2, args(alpha = "a"))] s: Axpby }"#,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("argument `a` is used with another type by an earlier stage"),
            "{e}"
        );
        // The first stage's flow is an argument like any other.
        let ir =
            parse(r#"#[fusion(domain = "t")] struct C { #[stage(1, args(x = "v"))] p: Gemv }"#)
                .unwrap();
        assert_eq!(ir.args[0].name, "v");
    }

    /// Composes the `#[derive(Pipeline)]` struct of `src` with the chains declared there too.
    fn compose_in(src: &str) -> syn::Result<crate::pipeline::PipelineIr> {
        let file: syn::File = syn::parse_str(src).unwrap();
        let mut chains = Vec::new();
        let mut pipeline = None;
        for item in &file.items {
            if let syn::Item::Struct(s) = item {
                let input = DeriveInput::from(s.clone());
                if derives_fusion_builder(&input.attrs) {
                    chains.push(parse_chain(&input).unwrap().spec);
                } else if derives_pipeline(&input.attrs) {
                    pipeline = Some(parse_pipeline(&input)?);
                }
            }
        }
        let lookup = |name: &str| chains.iter().filter(|c| c.name == name).collect::<Vec<_>>();
        pipeline.expect("a pipeline").compose(&lookup, &[])
    }

    const CHAINS: &str = r#"
        #[derive(FusionBuilder)] #[fusion(domain = "d")]
        struct Blend { #[stage(1)] b: Axpby }
        #[derive(FusionBuilder)] #[fusion(domain = "d")]
        struct Total { #[stage(1)] s: Square, #[stage(2)] t: SumReduction }
        #[derive(FusionBuilder)] #[fusion(domain = "d")]
        struct Predict { #[stage(1)] g: Gemv }
        #[derive(FusionBuilder)] #[fusion(domain = "d")]
        struct Sq { #[stage(1)] s: Square }
        #[derive(FusionBuilder)] #[fusion(domain = "e")]
        struct Squares { #[stage(1)] s: Square }
    "#;

    fn steps(p: &crate::pipeline::PipelineIr) -> Vec<Vec<usize>> {
        p.parts.iter().map(|p| p.steps.clone()).collect()
    }

    #[test]
    fn steps_handing_on_their_flow_fuse_into_one_pass() {
        let p = compose_in(&format!(
            r#"{CHAINS}
            #[derive(Pipeline)]
            struct Three {{
                #[step(1)] a: Blend,
                #[step(2, args(x = "a"))] b: Blend,
                #[step(3, args(x = "b"))] total: Total,
            }}"#
        ))
        .unwrap();
        assert_eq!(steps(&p), [vec![0, 1, 2]]);
        let part = &p.parts[0];
        assert_eq!(part.spec.name, "ThreePart1");
        assert_eq!(
            part.ir.describe(),
            "Axpby -> Axpby -> Square -> SumReduction"
        );
        assert_eq!(part.output, None);
        // The intermediate buffers `a` and `b` are never stored: not arguments of the part.
        let names: Vec<&str> = part.ir.args.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["x", "y", "alpha", "beta", "n"]);
    }

    #[test]
    fn a_buffer_seen_elsewhere_ends_the_part() {
        // `a` is read by step 3 too, so step 1 stores it, and step 2 starts a part of its own.
        let p = compose_in(&format!(
            r#"{CHAINS}
            #[derive(Pipeline)]
            struct P {{
                #[step(1)] a: Blend,
                #[step(2, args(x = "a"))] b: Blend,
                #[step(3, args(x = "b", y = "a"))] c: Blend,
            }}"#
        ))
        .unwrap();
        assert_eq!(steps(&p), [vec![0], vec![1, 2]]);
        assert_eq!(p.parts[0].output.as_deref(), Some("a"));
        assert_eq!(p.parts[1].output.as_deref(), Some("c"));
        assert_eq!(p.parts[1].binding("out"), "c");
        let names: Vec<&str> = p.parts[1].ir.args.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["a", "y", "alpha", "beta", "out", "n"]);
        // `store = true` keeps a buffer the next step could have taken in registers.
        let p = compose_in(&format!(
            r#"{CHAINS}
            #[derive(Pipeline)]
            struct P {{ #[step(1, store = true)] a: Blend, #[step(2, args(x = "a"))] b: Blend }}"#
        ))
        .unwrap();
        assert_eq!(steps(&p), [vec![0], vec![1]]);
        // Another domain, or a step that does not read the one before, starts a part.
        let p = compose_in(&format!(
            r#"{CHAINS}
            #[derive(Pipeline)]
            struct P {{
                #[step(1)] a: Blend,
                #[step(2, args(x = "a"))] s: Squares,
                #[step(3, args(x = "q"))] c: Blend,
            }}"#
        ))
        .unwrap();
        assert_eq!(steps(&p), [vec![0], vec![1], vec![2]]);
        assert_eq!(p.parts[1].spec.domain, "e");
    }

    #[test]
    fn elementwise_steps_fuse_around_a_gemv() {
        // Blend computes the GEMV's vector where it is read; Sq runs on each output element.
        let p = compose_in(&format!(
            r#"{CHAINS}
            #[derive(Pipeline)]
            struct P {{
                #[step(1)] v: Blend,
                #[step(2, args(x = "v"))] pred: Predict,
                #[step(3, args(x = "pred"))] out2: Sq,
                #[step(4, args(x = "out2"))] g: Predict,
            }}"#
        ))
        .unwrap();
        // One anchor a pass: the second GEMV starts a part; what it reads is stored.
        assert_eq!(steps(&p), [vec![0, 1, 2], vec![3]]);
        assert_eq!(p.parts[0].ir.describe(), "Axpby -> Gemv -> Square");
        assert_eq!(p.parts[0].output.as_deref(), Some("out2"));
    }

    #[test]
    fn a_chain_that_borrows_working_memory_is_refused() {
        // A bf16x3 product takes working memory the runtime lends each item: not in a part.
        let e = compose_in(
            r#"
            #[derive(FusionBuilder)]
            #[fusion(domain = "t")]
            struct Split { #[stage(1, tensor_eligible = true, precision = "bf16x3")] p: Matmul }
            #[derive(Pipeline)]
            struct P { #[step(1)] s: Split }"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("bf16x3") && e.contains("runtime pipeline"),
            "{e}"
        );
    }

    #[test]
    fn repeated_steps_run_in_one_pass() {
        let p = compose_in(&format!(
            r#"{CHAINS}
            #[derive(Pipeline)]
            struct P {{ #[step(1, repeat = 170)] a: Blend, #[step(2, args(x = "a"), repeat = 3)] t: Total }}"#
        ));
        let e = p.unwrap_err().to_string();
        assert!(
            e.contains("`repeat` needs a chain that runs on its own output"),
            "{e}"
        );
        let p = compose_in(&format!(
            r#"{CHAINS}
            #[derive(Pipeline)]
            struct P {{ #[step(1, repeat = 170)] a: Blend, #[step(2, args(x = "a"))] t: Total }}"#
        ))
        .unwrap();
        assert_eq!(steps(&p), [vec![0, 1]]);
        assert_eq!(
            p.parts[0].ir.describe(),
            "Axpby x 170 -> Square -> SumReduction"
        );
        let e = compose_in(&format!(
            r#"{CHAINS}
            #[derive(Pipeline)]
            struct P {{ #[step(1, repeat = 4097)] a: Blend }}"#
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("from 1 to 4096"), "{e}");
    }

    #[test]
    fn bad_pipelines_are_refused_where_written() {
        let err = |body: &str| {
            compose_in(&format!(
                "{CHAINS}\n#[derive(Pipeline)] struct P {{ {body} }}"
            ))
            .unwrap_err()
            .to_string()
        };
        assert!(err("").contains("at least one step"));
        assert!(err("#[step(1)] a: Nope").contains("no chain `Nope` is declared"));
        assert!(err("#[step(1)] a: Blend, #[step(3)] b: Blend").contains("expected step 2"));
        assert!(err("#[step(1)] a: Blend, #[step(1)] b: Blend").contains("used twice"));
        let e = err(r#"#[step(1, args(z = "q"))] a: Blend"#);
        assert!(
            e.contains("renames `z`, which chain `Blend` does not take"),
            "{e}"
        );
        assert!(e.contains("x, y, alpha, beta, out"), "{e}");
        let e = err(r#"#[step(1)] t: Total, #[step(2, args(x = "t"))] b: Blend"#);
        assert!(e.contains("ends in a reduction"), "{e}");
        let e = err(r#"#[step(1)] a: Blend, #[step(2, args(alpha = "a"))] b: Blend"#);
        assert!(e.contains("is an f32 here but a buffer in step `a`"), "{e}");
        let e = err(r#"#[step(1, depth = 2)] a: Blend"#);
        assert!(e.contains("unknown step attribute `depth`"), "{e}");
        assert!(err("a: Blend").contains("has no #[step(n)]"));
    }

    #[test]
    fn the_documented_pipeline_composes_as_documented() {
        // docs/pipelines.md, "Build-time pipelines".
        let p = compose_in(
            r#"
            #[derive(FusionBuilder)] #[fusion(domain = "mine")]
            pub struct Blend { #[stage(1)] blend: Axpby }
            #[derive(FusionBuilder)] #[fusion(domain = "mine")]
            pub struct Product { #[stage(1)] gemv: Gemv }
            #[derive(FusionBuilder)] #[fusion(domain = "mine")]
            pub struct SumSquares { #[stage(1)] s: Square, #[stage(2)] t: SumReduction }
            #[derive(Pipeline)]
            pub struct Step {
                #[step(1, args(y = "c"))] smooth: Blend,
                #[step(2, args(x = "smooth", y = "c"), repeat = 8)] more: Blend,
                #[step(3, args(x = "more", a = "w"))] pred: Product,
                #[step(4, args(x = "pred"))] total: SumSquares,
            }"#,
        )
        .unwrap();
        assert_eq!(steps(&p), [vec![0, 1, 2, 3]]);
        assert_eq!(
            p.parts[0].ir.describe(),
            "Axpby -> Axpby x 8 -> Gemv -> Square -> SumReduction"
        );
        let names: Vec<&str> = p.parts[0].ir.args.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["x", "c", "alpha", "beta", "w", "n", "m"]);
        assert!(
            p.parts[0]
                .ir
                .dims
                .iter()
                .any(|d| d.name == "m" && d.inferred_from.is_none())
        );
    }
}
