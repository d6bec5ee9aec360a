//! `#[derive(FusionBuilder)]`: declares a pptm fusion chain.
//!
//! ```ignore
//! #[derive(FusionBuilder)]
//! #[fusion(domain = "inference")]
//! pub struct KlComplexity {
//!     #[stage(1)] kl: KlDivergence,
//!     #[stage(2, reduction = true)] total: SumReduction,
//! }
//! ```
//!
//! The macro validates the chain with the same code build.rs uses (pptm-spec), so an invalid chain
//! is a compile error at the offending tokens, and emits:
//! * `KlComplexityArgs`: the descriptor's argument words, `#[repr(C)]` and bytemuck `Pod`;
//! * `impl pptm::Chain for KlComplexity`: opcode, spec hash, and the domain's PTX embedded with
//!   `include_str!` from the crate's generated/ folder;
//! * `KlComplexity::submit(&rt, q, p)`: typed buffers in, a ticket out;
//! * a `const` check that generated/manifest.txt lists this exact chain, so a stale generated/
//!   fails to compile with the command that regenerates it.

#![warn(missing_docs)]

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::{DeriveInput, parse_macro_input};

use pptm_spec::parse::{parse_chain, parse_pipeline};
use pptm_spec::{ArgKind, ChainIr, ChainOutput, DType};

/// `#[derive(FusionBuilder)]`: declares the struct a fusion chain, each field a stage
/// (`#[stage(n, ...)]`) in the domain `#[fusion(domain = "...")]` names; what it emits is listed
/// in the crate docs.
#[proc_macro_derive(FusionBuilder, attributes(fusion, stage))]
pub fn derive_fusion_builder(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn expand(input: &DeriveInput) -> syn::Result<TokenStream2> {
    let parsed = parse_chain(input)?;
    // Stages naming an op that is not built in: ops of this crate's own (`#[pptm::op]`), found in
    // its sources as build.rs finds them, and at run time through their `Op` impls.
    let own_types: Vec<&syn::Type> = match &input.data {
        syn::Data::Struct(s) => s
            .fields
            .iter()
            .zip(&parsed.spec.stages)
            .filter(|(_, st)| pptm_spec::ops::find(&st.op).is_none())
            .map(|(f, _)| &f.ty)
            .collect(),
        _ => Vec::new(),
    };
    let extra = if own_types.is_empty() {
        Vec::new()
    } else {
        crate_user_ops().map_err(|e| syn::Error::new(input.ident.span(), e))?
    };
    let ir = parsed.lower_with(&extra)?;
    let ident = &input.ident;
    // Each stage's type must be the op the stage was lowered with: an `Op` (a built-in marker or a
    // `#[pptm::op]`) of that name. A type that merely shares a built-in's name is an error here.
    let stage_checks: Vec<TokenStream2> = match &input.data {
        syn::Data::Struct(s) => s
            .fields
            .iter()
            .zip(&parsed.spec.stages)
            .map(|(f, st)| {
                let ty = &f.ty;
                let op = &st.op;
                let msg = format!(
                    "stage `{}`: its type is not the op `{op}` (the chain was lowered with `{op}`)",
                    st.field
                );
                quote::quote_spanned! {ty.span()=>
                    assert!(
                        ::pptm::__private::str_eq(<#ty as ::pptm::Op>::DEF.name, #op),
                        #msg
                    );
                }
            })
            .collect(),
        _ => Vec::new(),
    };
    let ops = quote! { &[#(<#own_types as ::pptm::Op>::DEF),*] };
    let field_idents: Vec<syn::Ident> = parsed
        .spec
        .stages
        .iter()
        .map(|s| syn::Ident::new(&s.field, Span::call_site()))
        .collect();
    let n_fields = field_idents.len();
    let items = match chain_items(&ChainItems {
        ident,
        vis: &input.vis,
        ir: &ir,
        spec: &parsed.spec,
        ops,
        checks: quote! { #(#stage_checks)* },
    }) {
        Ok(items) => items,
        // The stage types are still checked, so that error shows too.
        Err(e) => {
            let e = e.to_compile_error();
            return Ok(quote! {
                #e
                const _: () = { #(#stage_checks)* };
            });
        }
    };
    Ok(quote! {
        #items

        // The stage fields only name ops; reading them here keeps `dead_code` quiet about them.
        impl ::pptm::__private::StageFields for #ident {
            fn stage_fields(&self) -> usize {
                let _ = (#(&self.#field_idents,)*);
                #n_fields
            }
        }
    })
}

/// What [`chain_items`] needs to emit one chain's items.
struct ChainItems<'a> {
    ident: &'a syn::Ident,
    vis: &'a syn::Visibility,
    ir: &'a ChainIr,
    spec: &'a pptm_spec::ChainSpec,
    /// An expression giving the `&[&'static OpDef]` of the user's own ops its stages name.
    ops: TokenStream2,
    /// Compile-time checks to run beside the manifest check.
    checks: TokenStream2,
}

/// A chain's items: its `Args` struct, the compile-time checks (the manifest lists it), its
/// `impl Chain` with the domain's PTX embedded, and its typed `submit` and `push`. Shared by
/// `#[derive(FusionBuilder)]` and the parts of a `#[derive(Pipeline)]`.
fn chain_items(c: &ChainItems) -> syn::Result<TokenStream2> {
    let (ident, ir, own_ops, stage_checks) = (c.ident, c.ir, &c.ops, &c.checks);
    let folder = generated_folder(&ir.domain, &ir.name, ident.span())?;
    let vis = c.vis;
    let args_ident = format_ident!("{}Args", ident);

    let name = &ir.name;
    let domain = &ir.domain;
    let spec_hash = &ir.spec_hash;
    let opcode = ir.opcode;
    let describe = ir.describe();

    // The descriptor's argument words.
    let dim_names = |shape: &[usize]| -> String {
        shape
            .iter()
            .map(|&d| format!("`{}`", ir.dims[d].name))
            .collect::<Vec<_>>()
            .join(" x ")
    };
    let arg_fields = ir.args.iter().map(|a| {
        let f = syn::Ident::new(&a.name, Span::call_site());
        let doc = match a.kind {
            ArgKind::Input => format!(
                "Device address of input `{}` ({}, {}).",
                a.name,
                a.dtype,
                dim_names(&a.shape)
            ),
            ArgKind::Output => format!(
                "Device address of the output (f32, {}).",
                dim_names(&a.shape)
            ),
            ArgKind::F32 => format!("`{}`, an f32 passed by value (its bits).", a.name),
            ArgKind::U32 => format!("`{}`, a u32 passed by value.", a.name),
            ArgKind::Len => format!("Size of dimension `{}`.", a.name),
            ArgKind::Guard => "The accuracy guard's level (the runtime fills it in).".to_string(),
            ArgKind::Scratch => {
                "Working memory the runtime lends the item (the runtime fills it in).".to_string()
            }
        };
        quote! { #[doc = #doc] pub #f: u64 }
    });
    let n_args = ir.args.len();

    // The typed submit: every argument in descriptor order, except dimensions a buffer's length
    // gives.
    let mut params = Vec::new();
    let mut bindings = Vec::new();
    // The same for a pipeline's `push`: buffers as the pipeline's handles.
    let mut pparams = Vec::new();
    let mut pbindings = Vec::new();
    for a in &ir.args {
        let f = syn::Ident::new(&a.name, Span::call_site());
        let fname = &a.name;
        match a.kind {
            ArgKind::Input => {
                let elem = match a.dtype {
                    DType::F32 => quote! { f32 },
                    DType::Bf16 => quote! { ::pptm::bf16 },
                    DType::F16 => quote! { ::pptm::f16 },
                    DType::F8E4M3 => quote! { ::pptm::F8E4M3 },
                    other => {
                        return Err(syn::Error::new(
                            ident.span(),
                            format!("pptm: chains cannot read {other} buffers yet"),
                        ));
                    }
                };
                params.push(quote! { #f: &'a ::pptm::Buffer<#elem> });
                bindings.push(quote! { ::pptm::Arg::Input(#fname, ::pptm::InputBuffer::from(#f)) });
                pparams.push(quote! { #f: impl ::core::convert::Into<::pptm::PipeInput<'p>> });
                pbindings.push(quote! { ::pptm::PipeArg::Input(#fname, #f.into()) });
            }
            ArgKind::Output => {
                params.push(quote! { #f: &'a mut ::pptm::Buffer<f32> });
                bindings.push(quote! { ::pptm::Arg::Output(#fname, #f) });
                pparams.push(quote! { #f: ::pptm::PipeOutput });
                pbindings.push(quote! { ::pptm::PipeArg::Output(#fname, #f) });
            }
            ArgKind::F32 => {
                params.push(quote! { #f: f32 });
                bindings.push(quote! { ::pptm::Arg::F32(#fname, #f) });
                pparams.push(quote! { #f: f32 });
                pbindings.push(quote! { ::pptm::PipeArg::F32(#fname, #f) });
            }
            ArgKind::U32 => {
                params.push(quote! { #f: u32 });
                bindings.push(quote! { ::pptm::Arg::U32(#fname, #f) });
                pparams.push(quote! { #f: u32 });
                pbindings.push(quote! { ::pptm::PipeArg::U32(#fname, #f) });
            }
            ArgKind::Len => {
                if ir.dims[a.dim.expect("len slot")].inferred_from.is_none() {
                    params.push(quote! { #f: usize });
                    bindings.push(quote! { ::pptm::Arg::Dim(#fname, #f) });
                    pparams.push(quote! { #f: usize });
                    pbindings.push(quote! { ::pptm::PipeArg::Dim(#fname, #f) });
                }
            }
            // Filled in by the runtime.
            ArgKind::Guard | ArgKind::Scratch => {}
        }
    }
    let output_ty = match ir.output {
        ChainOutput::Scalar => quote! { f32 },
        ChainOutput::Vector => quote! { () },
    };
    let shapes: Vec<String> = ir
        .args
        .iter()
        .filter(|a| matches!(a.kind, ArgKind::Input | ArgKind::Output))
        .map(|a| format!("`{}`: {} {}", a.name, a.dtype, dim_names(&a.shape)))
        .collect();
    let resolves = match ir.output {
        ChainOutput::Scalar => "The ticket resolves to the f32 result.",
        ChainOutput::Vector => "Writes `out`; the ticket resolves once `out` holds the result.",
    };
    let submit_doc = format!(
        "Submits one fused `{describe}` pass ({:?} pattern). {resolves}\n\n\
         Shapes (row-major): {}. Every buffer must belong to `rt`; lengths that do not fit are \
         an `Error::LengthMismatch`.",
        ir.plan.pattern,
        shapes.join(", ")
    );

    let spec = spec_tokens(ir, c.spec);
    let ptx80 = format!("/{folder}/{domain}/compute_80.ptx");
    let ptx90 = format!("/{folder}/{domain}/compute_90.ptx");
    // Codegen leaves out a compute_90a.ptx that would only repeat compute_90.ptx (a domain
    // without wgmma): sm_90 runs compute_90's then.
    let ptx90a = match std::env::var("CARGO_MANIFEST_DIR") {
        Ok(dir)
            if !std::path::Path::new(&dir)
                .join(format!("{folder}/{domain}/compute_90a.ptx"))
                .exists() =>
        {
            ptx90.clone()
        }
        _ => format!("/{folder}/{domain}/compute_90a.ptx"),
    };
    let manifest = format!("/{folder}/manifest.txt");
    let needle = format!("spec={spec_hash}");
    let stale = format!(
        "pptm: {folder}/ is stale: chain `{name}` (domain `{domain}`, spec {}) is not in {folder}/manifest.txt. \
         Build once with NVRTC 13.0 installed (build.rs regenerates it) and commit {folder}/.",
        &spec_hash[..16]
    );
    let args_doc = format!(
        "Descriptor arguments of [`{name}`] ({describe}): one u64 word each, in the order the device reads them."
    );

    // Lists the chain's domain among those linked into the binary, whose code the runtime loads
    // before its first manifold starts. Not for the chains of pptm's own library (pptm::chains):
    // registering them would put every one of their domains' PTX (tens of MB) in every binary and
    // compile all of it at start; their domains load when first used (a re-partition drains the
    // manifolds first, so the load can happen).
    let pptm_library = std::env::var("CARGO_PKG_NAME").as_deref() == Ok("pptm")
        && std::env::var("CARGO_CRATE_NAME").as_deref() == Ok("pptm");
    let register = if pptm_library {
        quote! {}
    } else {
        quote! {
            const _: () = {
                #[::pptm::__private::linkme::distributed_slice(::pptm::__private::LINKED_DOMAINS)]
                #[linkme(crate = ::pptm::__private::linkme)]
                static DOMAIN: &'static ::pptm::DomainCode = <#ident as ::pptm::Chain>::DOMAIN;
            };
        }
    };

    Ok(quote! {
        #[doc = #args_doc]
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, ::pptm::__private::bytemuck::Pod, ::pptm::__private::bytemuck::Zeroable)]
        #[bytemuck(crate = "::pptm::__private::bytemuck")]
        #vis struct #args_ident {
            #(#arg_fields,)*
        }

        const _: () = {
            assert!(::core::mem::size_of::<#args_ident>() == 8 * #n_args);
            assert!(#n_args <= ::pptm::__private::DESC_ARGS);
            const MANIFEST: &[u8] = include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), #manifest));
            if !::pptm::__private::contains(MANIFEST, #needle.as_bytes()) {
                panic!(#stale);
            }
            #stage_checks
        };

        #register

        impl ::pptm::Chain for #ident {
            type Args = #args_ident;
            type Output = #output_ty;
            const NAME: &'static str = #name;
            const SPEC_HASH: &'static str = #spec_hash;
            const OPCODE: u32 = #opcode;
            const DOMAIN: &'static ::pptm::DomainCode = &::pptm::DomainCode {
                key: concat!(env!("CARGO_PKG_NAME"), "/", #domain),
                name: #domain,
                ptx_compute_80: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), #ptx80)),
                ptx_compute_90: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), #ptx90)),
                ptx_compute_90a: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), #ptx90a)),
            };
            fn ir() -> ::core::result::Result<&'static ::pptm::ChainIr, ::pptm::Error> {
                static IR: ::std::sync::OnceLock<::core::result::Result<::pptm::ChainIr, ::pptm::__private::SpecError>> =
                    ::std::sync::OnceLock::new();
                ::pptm::__private::checked_ir::<Self>(IR.get_or_init(|| ::pptm::__private::lower_with(
                    &#spec,
                    #own_ops,
                )))
            }
        }

        impl #ident {
            #[doc = #submit_doc]
            #[allow(clippy::too_many_arguments, reason = "one parameter per chain argument, in descriptor order")]
            #vis fn submit<'a>(rt: &::pptm::Runtime, #(#params),*) -> ::core::result::Result<::pptm::Ticket<'a, #output_ty>, ::pptm::Error> {
                rt.submit_chain::<Self>(::std::vec![#(#bindings),*])
            }

            /// Pushes one item to `pipeline`, after every item pushed before it: `submit`'s
            /// arguments, with buffers as the pipeline's handles (`pipeline.input(&x)`,
            /// `pipeline.output(&mut y)`;
            /// an output handle also serves as a later item's input). Returns the item, whose
            /// result the waited pipeline gives.
            #[allow(clippy::too_many_arguments, reason = "one parameter per chain argument, in descriptor order")]
            #vis fn push<'p>(pipeline: &mut ::pptm::Pipeline<'p>, #(#pparams),*) -> ::core::result::Result<::pptm::PipeItem<#output_ty>, ::pptm::Error> {
                pipeline.push_chain::<Self>(::std::vec![#(#pbindings),*])
            }
        }
    })
}

/// `#[derive(Pipeline)]`: composes chains of the crate into a fixed sequence of steps, fused into
/// the fewest passes that keep its meaning (see pptm-spec's `pipeline` module).
///
/// ```ignore
/// #[derive(Pipeline)]
/// pub struct Smooth {
///     #[step(1)] blended: Blend,                          // writes `blended`
///     #[step(2, args(x = "blended"), repeat = 8)] more: Blend,
///     #[step(3, args(x = "more"))] total: Total,          // Σ more²: fused with the steps above
/// }
/// ```
///
/// Emits one chain per part (`SmoothPart1`, ...: generated into the domain of its first step by
/// build.rs, like any chain), `Smooth::push(&mut pipeline, ...)` taking the pipeline's arguments
/// (each name once) and pushing every part, and `SmoothItems` with the item of each part.
#[proc_macro_derive(Pipeline, attributes(step))]
pub fn derive_pipeline(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand_pipeline(&input) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn expand_pipeline(input: &DeriveInput) -> syn::Result<TokenStream2> {
    let parsed = parse_pipeline(input)?;
    let ident = &input.ident;
    let vis = &input.vis;
    let scan_error = |e: String| syn::Error::new(ident.span(), e);
    let specs = crate_chain_specs().map_err(scan_error)?;
    let extra = crate_user_ops().map_err(scan_error)?;
    let lookup = |name: &str| specs.iter().filter(|c| c.name == name).collect::<Vec<_>>();
    let composed = parsed.compose(&lookup, &extra)?;
    let steps = &parsed.spec.steps;
    let types: Vec<&syn::Type> = match &input.data {
        syn::Data::Struct(s) => s.fields.iter().map(|f| &f.ty).collect(),
        _ => Vec::new(),
    };
    // Each step's type must be the chain it was composed with.
    let checks = types.iter().zip(steps).map(|(ty, st)| {
        let chain = &st.chain;
        let msg = format!(
            "step `{}`: its type is not the chain `{chain}` (the pipeline was composed with `{chain}`)",
            st.field
        );
        quote::quote_spanned! {ty.span()=>
            assert!(::pptm::__private::str_eq(<#ty as ::pptm::Chain>::NAME, #chain), #msg);
        }
    });

    // The pipeline's arguments, each name once, in order of first use.
    let outputs: Vec<&str> = composed
        .parts
        .iter()
        .filter_map(|p| p.output.as_deref())
        .collect();
    let mut params: Vec<TokenStream2> = Vec::new();
    let mut converts: Vec<TokenStream2> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    let mut parts_tokens = Vec::new();
    let mut pushes = Vec::new();
    let mut item_fields = Vec::new();
    for (k, part) in composed.parts.iter().enumerate() {
        let part_ident = syn::Ident::new(&part.spec.name, ident.span());
        let mut bindings = Vec::new();
        for a in &part.ir.args {
            let bound = part.binding(&a.name);
            let f = syn::Ident::new(bound, Span::call_site());
            let name = &a.name;
            let fresh = !seen.iter().any(|s| s == bound);
            let binding = match a.kind {
                ArgKind::Input => {
                    if fresh && outputs.contains(&bound) {
                        params.push(quote! { #f: ::pptm::PipeOutput });
                    } else if fresh {
                        params
                            .push(quote! { #f: impl ::core::convert::Into<::pptm::PipeInput<'p>> });
                        converts.push(quote! { let #f: ::pptm::PipeInput<'p> = #f.into(); });
                    }
                    quote! { ::pptm::PipeArg::Input(#name, #f.into()) }
                }
                ArgKind::Output => {
                    if fresh {
                        params.push(quote! { #f: ::pptm::PipeOutput });
                    }
                    quote! { ::pptm::PipeArg::Output(#name, #f) }
                }
                ArgKind::F32 => {
                    if fresh {
                        params.push(quote! { #f: f32 });
                    }
                    quote! { ::pptm::PipeArg::F32(#name, #f) }
                }
                ArgKind::U32 => {
                    if fresh {
                        params.push(quote! { #f: u32 });
                    }
                    quote! { ::pptm::PipeArg::U32(#name, #f) }
                }
                ArgKind::Len => {
                    if part.ir.dims[a.dim.expect("len slot")]
                        .inferred_from
                        .is_some()
                    {
                        continue;
                    }
                    if fresh {
                        params.push(quote! { #f: usize });
                    }
                    quote! { ::pptm::PipeArg::Dim(#name, #f) }
                }
                ArgKind::Guard | ArgKind::Scratch => continue,
            };
            if fresh {
                seen.push(bound.to_string());
            }
            bindings.push(binding);
        }
        let part_types: Vec<&syn::Type> = part.steps.iter().map(|&i| types[i]).collect();
        let ops =
            quote! { &::pptm::__private::step_ops(&[#(<#part_types as ::pptm::Chain>::ir),*]) };
        let items = chain_items(&ChainItems {
            ident: &part_ident,
            vis,
            ir: &part.ir,
            spec: &part.spec,
            ops,
            checks: quote! {},
        })?;
        let names: Vec<String> = part
            .steps
            .iter()
            .map(|&i| format!("`{}`", steps[i].field))
            .collect();
        let part_doc = format!(
            "Part {} of pipeline [`{ident}`]: step{} {} as one {:?} pass ({}).",
            k + 1,
            if names.len() > 1 { "s" } else { "" },
            names.join(" + "),
            part.ir.plan.pattern,
            part.ir.describe()
        );
        parts_tokens.push(quote! {
            #[doc = #part_doc]
            #[derive(Debug, Clone, Copy)]
            #vis struct #part_ident;
            #items
        });
        let last = &steps[*part.steps.last().expect("a part has a step")].field;
        let field = syn::Ident::new(last, Span::call_site());
        let out_ty = match part.ir.output {
            ChainOutput::Scalar => quote! { f32 },
            ChainOutput::Vector => quote! { () },
        };
        let field_doc = format!("The item of part {} (ending with step `{last}`).", k + 1);
        item_fields.push(quote! { #[doc = #field_doc] pub #field: ::pptm::PipeItem<#out_ty> });
        pushes.push(
            quote! { #field: pipeline.push_chain::<#part_ident>(::std::vec![#(#bindings),*])? },
        );
    }
    let items_ident = format_ident!("{}Items", ident);
    let describe = composed.describe(steps);
    let push_doc = format!(
        "Pushes the pipeline's {} part{} to `pipeline`, after every item pushed before, each \
         argument given once (buffers as the pipeline's handles). Its parts:\n\n```text\n{describe}\n```",
        composed.parts.len(),
        if composed.parts.len() > 1 { "s" } else { "" },
    );
    let items_doc = format!("The items [`{ident}::push`] pushed, one per part.");
    let field_idents: Vec<syn::Ident> = steps
        .iter()
        .map(|s| syn::Ident::new(&s.field, Span::call_site()))
        .collect();
    let n_fields = field_idents.len();
    Ok(quote! {
        const _: () = { #(#checks)* };

        #(#parts_tokens)*

        #[doc = #items_doc]
        #[derive(Debug, Clone, Copy)]
        #vis struct #items_ident {
            #(#item_fields,)*
        }

        impl #ident {
            /// The pipeline's parts, as composed at build time: one line each.
            #vis const PARTS: &'static str = #describe;

            #[doc = #push_doc]
            #[allow(clippy::too_many_arguments, reason = "one parameter per pipeline argument")]
            #vis fn push<'p>(pipeline: &mut ::pptm::Pipeline<'p>, #(#params),*) -> ::core::result::Result<#items_ident, ::pptm::Error> {
                #(#converts)*
                ::core::result::Result::Ok(#items_ident { #(#pushes,)* })
            }
        }

        // The step fields only name chains; reading them here keeps `dead_code` quiet.
        impl ::pptm::__private::StageFields for #ident {
            fn stage_fields(&self) -> usize {
                let _ = (#(&self.#field_idents,)*);
                #n_fields
            }
        }
    })
}

/// Tokens that rebuild the chain's spec at run time (the runtime lowers it for the CPU backend
/// and the argument layout, and checks the hash matches).
fn spec_tokens(ir: &ChainIr, spec: &pptm_spec::ChainSpec) -> TokenStream2 {
    let name = &ir.name;
    let domain = &ir.domain;
    let stages = spec.stages.iter().map(|s| {
        let field = &s.field;
        let number = s.number;
        let op = &s.op;
        let opt_bool = |b: Option<bool>| match b {
            Some(v) => quote! { ::core::option::Option::Some(#v) },
            None => quote! { ::core::option::Option::None },
        };
        let reduction = opt_bool(s.reduction);
        let tensor = opt_bool(s.tensor_eligible);
        let finite = opt_bool(s.finite);
        let per_row = opt_bool(s.per_row);
        let repeat = match s.repeat {
            Some(k) => quote! { ::core::option::Option::Some(#k) },
            None => quote! { ::core::option::Option::None },
        };
        let tolerance = match s.tolerance {
            Some(t) => {
                let v = t.0;
                quote! { ::core::option::Option::Some(::pptm::__private::Tolerance(#v)) }
            }
            None => quote! { ::core::option::Option::None },
        };
        let precision = match s.precision {
            Some(p) => {
                let v = format_ident!("{}", format!("{p:?}"));
                quote! { ::core::option::Option::Some(::pptm::__private::Precision::#v) }
            }
            None => quote! { ::core::option::Option::None },
        };
        let tables = match s.tables {
            Some(d) => {
                let v = format_ident!("{}", format!("{d:?}"));
                quote! { ::core::option::Option::Some(::pptm::DType::#v) }
            }
            None => quote! { ::core::option::Option::None },
        };
        let promoted = match s.promoted {
            Some(v) => quote! { ::core::option::Option::Some(#v) },
            None => quote! { ::core::option::Option::None },
        };
        let renames = s.args.iter().map(|(p, n)| {
            quote! { (::std::string::String::from(#p), ::std::string::String::from(#n)) }
        });
        quote! {
            ::pptm::__private::StageSpec {
                field: ::std::string::String::from(#field),
                number: #number,
                op: ::std::string::String::from(#op),
                reduction: #reduction,
                tensor_eligible: #tensor,
                precision: #precision,
                tolerance: #tolerance,
                finite: #finite,
                per_row: #per_row,
                args: ::std::vec![#(#renames),*],
                repeat: #repeat,
                tables: #tables,
                promoted: #promoted,
            }
        }
    });
    quote! {
        ::pptm::__private::ChainSpec {
            name: ::std::string::String::from(#name),
            domain: ::std::string::String::from(#domain),
            stages: ::std::vec![#(#stages),*],
        }
    }
}

/// The generated folder that holds a chain's domain: generated/ (the library's chains) or
/// generated-dev/ (those of tests, examples and benches), as its manifest lists the domain. An
/// error, saying how to generate it, where neither does.
fn generated_folder(domain: &str, chain: &str, span: Span) -> syn::Result<&'static str> {
    use pptm_codegen::project::{DEV_FOLDER, LIBRARY_FOLDER};
    let Ok(dir) = std::env::var("CARGO_MANIFEST_DIR") else {
        return Ok(LIBRARY_FOLDER);
    };
    let line = format!("domain {domain} ");
    let mut any = false;
    for folder in [LIBRARY_FOLDER, DEV_FOLDER] {
        let path = std::path::Path::new(&dir).join(folder).join("manifest.txt");
        if let Ok(text) = std::fs::read_to_string(path) {
            any = true;
            if text.lines().any(|l| l.starts_with(&line)) {
                return Ok(folder);
            }
        }
    }
    let msg = if any {
        format!(
            "pptm: the generated code is stale: no manifest lists domain `{domain}` of chain \
             `{chain}`. Build once with NVRTC 13.0 installed (build.rs regenerates it) and commit \
             {LIBRARY_FOLDER}/ and {DEV_FOLDER}/"
        )
    } else {
        format!(
            "pptm: this crate has no {LIBRARY_FOLDER}/manifest.txt or {DEV_FOLDER}/manifest.txt, so \
             chain PTX cannot be embedded. Add a build.rs that calls \
             `pptm_codegen::build_script()` (with pptm-codegen as a build-dependency) and build \
             once with NVRTC 13.0 available"
        )
    };
    Err(syn::Error::new(span, msg))
}

/// What a scan of the crate being compiled found, by crate root, scanned once per crate: rustc
/// expands every derive of a crate in one process, and the sources do not change while it does.
type ScanCache<T> = std::sync::OnceLock<
    std::sync::Mutex<std::collections::HashMap<String, Result<Vec<T>, String>>>,
>;

/// `scan(root)` for the crate being compiled (its `CARGO_MANIFEST_DIR`), once per crate.
fn scanned_once<T: Clone>(
    cache: &'static ScanCache<T>,
    scan: impl FnOnce(String) -> Result<Vec<T>, String>,
) -> Result<Vec<T>, String> {
    let Ok(root) = std::env::var("CARGO_MANIFEST_DIR") else {
        return Ok(Vec::new());
    };
    let mut scanned = cache
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    scanned
        .entry(root.clone())
        .or_insert_with(|| scan(root))
        .clone()
}

/// The ops of the user's own (`#[pptm::op]`) in the crate being compiled, found where build.rs
/// finds them (pptm-codegen's scan over every folder of the crate): the crate's own and those of
/// the crates it takes ops from (the folders its build.rs found, handed over in an environment
/// variable).
fn crate_user_ops() -> Result<Vec<&'static pptm_spec::OpDef>, String> {
    static SCANNED: ScanCache<&'static pptm_spec::OpDef> = std::sync::OnceLock::new();
    scanned_once(&SCANNED, |root| {
        pptm_codegen::project::Project::library(root)
            .user_ops()
            .map_err(|e| e.to_string())
    })
}

/// The states (`#[derive(pptm::State)]`) of the crate being compiled, found where build.rs finds
/// them: what an op's state flow and result are typed with.
fn crate_states() -> Result<Vec<pptm_spec::op_fn::StateDef>, String> {
    static SCANNED: ScanCache<pptm_spec::op_fn::StateDef> = std::sync::OnceLock::new();
    scanned_once(&SCANNED, |root| {
        pptm_codegen::project::Project::library(root)
            .states()
            .map_err(|e| e.to_string())
    })
}

/// `#[derive(pptm::State)]` on a `#[repr(C)]` struct of named f32/f64 fields: a state an op of
/// your own (`#[pptm::op]`) may take as its flow and return, stored by a chain as its fields,
/// interleaved (docs/ops.md, "States"). Implements `pptm::State`.
#[proc_macro_derive(State)]
pub fn derive_state(input: TokenStream) -> TokenStream {
    let item = parse_macro_input!(input as syn::ItemStruct);
    match expand_state(&item) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn expand_state(item: &syn::ItemStruct) -> syn::Result<TokenStream2> {
    use pptm_spec::op_fn::{Scalar, StateDef};
    let def = StateDef::parse(item)?;
    let ident = &item.ident;
    let names: Vec<&String> = def.fields.iter().map(|(n, _)| n).collect();
    let idents: Vec<syn::Ident> = names.iter().map(|n| format_ident!("{}", n)).collect();
    let reads = def.fields.iter().enumerate().map(|(i, (n, t))| {
        let f = format_ident!("{}", n);
        match t {
            Scalar::F32 => quote! { #f: values[#i] as f32 },
            _ => quote! { #f: values[#i] },
        }
    });
    let writes = def.fields.iter().enumerate().map(|(i, (n, t))| {
        let f = format_ident!("{}", n);
        match t {
            Scalar::F32 => quote! { out[#i] = f64::from(self.#f); },
            _ => quote! { out[#i] = self.#f; },
        }
    });
    let _ = idents;
    Ok(quote! {
        impl ::pptm::State for #ident {
            const FIELDS: &'static [&'static str] = &[#(#names),*];
            #[allow(clippy::cast_possible_truncation)]
            fn from_values(values: &[f64]) -> Self {
                Self { #(#reads),* }
            }
            fn to_values(&self, out: &mut [f64]) {
                #(#writes)*
            }
        }
    })
}

/// Every chain declared in the crate being compiled (what a pipeline's steps are looked up in).
fn crate_chain_specs() -> Result<Vec<pptm_spec::ChainSpec>, String> {
    static SCANNED: ScanCache<pptm_spec::ChainSpec> = std::sync::OnceLock::new();
    scanned_once(&SCANNED, |root| {
        pptm_codegen::project::Project::library(root)
            .chain_specs()
            .map_err(|e| e.to_string())
    })
}

/// `#[pptm::op]` on a Rust function: an elementwise op of your own (see pptm-spec's `op_fn` for
/// the subset of Rust its body may use). The function stays as it is, and is the op's CPU
/// reference; the macro checks it against the subset (an error at the offending tokens), and
/// adds the op's marker type (the function's name in CamelCase) implementing `pptm::Op` with
/// the translated device code. `#[pptm::op(tensors(obs))]` makes the parameter `obs` an input of
/// its own (one element per element of the flow); parameters after the first are otherwise passed
/// by value (f32 or u32).
#[proc_macro_attribute]
pub fn op(attr: TokenStream, item: TokenStream) -> TokenStream {
    let f = parse_macro_input!(item as syn::ItemFn);
    match expand_op(attr.into(), &f) {
        Ok(tokens) => tokens.into(),
        Err(e) => {
            let mut out = e.to_compile_error();
            // The function itself still compiles, so one error does not bring a cascade (its
            // `lanes(a..b)` loops as plain ranges: `lanes` is no function of its own).
            let f = without_lanes(&f);
            out.extend(quote! { #f });
            out.into()
        }
    }
}

/// The op's function as the CPU backend compiles it: each local array index `a[k]`, a `u32` in
/// the op subset (as on the device), becomes `a[{ let k: u32 = k; k as usize }]`, since Rust
/// indexes with `usize`. A loop variable that indexes an array is then a `u32` like any other.
/// A `for s in lanes(a..b)` loop becomes `for s in a..b` ([`without_lanes`]).
fn with_u32_indices(f: &syn::ItemFn) -> syn::ItemFn {
    use syn::visit_mut::VisitMut;
    struct Indices;
    impl VisitMut for Indices {
        fn visit_expr_index_mut(&mut self, ix: &mut syn::ExprIndex) {
            syn::visit_mut::visit_expr_index_mut(self, ix);
            let k = &ix.index;
            *ix.index = syn::parse_quote_spanned! {k.span()=>
                { let pptm_index: u32 = #k; pptm_index as usize }
            };
        }
    }
    let mut f = without_lanes(f);
    Indices.visit_item_fn_mut(&mut f);
    f
}

/// The function with each `for s in lanes(a..b)` loop as `for s in a..b`: on the CPU one lane
/// runs every iteration (`lanes` marks the loop for the device and is no function of its own).
fn without_lanes(f: &syn::ItemFn) -> syn::ItemFn {
    use syn::visit_mut::VisitMut;
    struct Lanes;
    impl VisitMut for Lanes {
        fn visit_expr_for_loop_mut(&mut self, l: &mut syn::ExprForLoop) {
            if let syn::Expr::Call(c) = &*l.expr
                && c.args.len() == 1
                && matches!(&*c.func, syn::Expr::Path(p)
                    if p.path.segments.last().is_some_and(|s| s.ident == "lanes"))
            {
                let range = c.args[0].clone();
                *l.expr = range;
            }
            syn::visit_mut::visit_expr_for_loop_mut(self, l);
        }
    }
    let mut f = f.clone();
    Lanes.visit_item_fn_mut(&mut f);
    f
}

fn expand_op(attr: TokenStream2, f: &syn::ItemFn) -> syn::Result<TokenStream2> {
    use pptm_spec::op_fn::{Scalar, parse_op_attr, parse_op_with_states};
    let attr = parse_op_attr(attr)?;
    // The crate's states, where the signature names a type that is not a number (scanned once
    // per crate, as the chains' ops are).
    let plain = |ty: &syn::Type| matches!(ty, syn::Type::Path(p) if p.path.get_ident().is_some_and(|i| i == "f32" || i == "f64" || i == "u32"));
    let names_state = f.sig.inputs.iter().any(|a| match a {
        syn::FnArg::Typed(pt) => !plain(&pt.ty),
        _ => false,
    }) || matches!(&f.sig.output, syn::ReturnType::Type(_, ty) if !plain(ty));
    let states = if names_state {
        crate_states().map_err(|e| syn::Error::new(f.sig.ident.span(), e))?
    } else {
        Vec::new()
    };
    let op = parse_op_with_states(&attr, f, &states)?;
    let (flow_channels, out_channels) = op.channels();
    let state_types = op.state_types();
    let state_tokens = |s: Option<&str>| match s {
        Some(n) => quote! { ::core::option::Option::Some(#n) },
        None => quote! { ::core::option::Option::None },
    };
    let (flow_state, out_state) = (
        state_tokens(state_types.flow),
        state_tokens(state_types.out),
    );
    let params = op.catalog_params(&attr.tensor_names()).map_err(|e| {
        syn::Error::new(
            attr.tensors
                .first()
                .map_or(f.sig.ident.span(), |t| t.span()),
            e,
        )
    })?;
    let vis = &f.vis;
    let fn_ident = &f.sig.ident;
    let marker = format_ident!("{}", op.op_name(), span = fn_ident.span());
    let cpu_ident = format_ident!("__pptm_op_cpu_{}", op.name);
    let op_name = op.op_name();
    let (cuda, device, lanes) = (&op.cuda, &op.device, op.lanes);
    let doc = format!(
        "The op `{}` (`#[pptm::op] fn {}`): name it as a stage's type in a `#[derive(FusionBuilder)]` chain.",
        op_name, op.name
    );
    let op_doc = format!("`{}`, an op of the user's own (#[pptm::op]).", op.name);
    let param_tokens = params.iter().map(|p| {
        let name = p.name;
        let ty = match p.ty {
            pptm_spec::Ty::F32 => quote! { ::pptm::__private::Ty::F32 },
            pptm_spec::Ty::U32 => quote! { ::pptm::__private::Ty::U32 },
            pptm_spec::Ty::Table(r, c) => quote! { ::pptm::__private::Ty::Table(#r, #c) },
            _ => quote! { ::pptm::__private::Ty::Like },
        };
        quote! { ::pptm::__private::Param { name: #name, ty: #ty } }
    });
    let precisions = op.precisions().iter().map(|p| {
        let v = format_ident!("{p:?}");
        quote! { ::pptm::__private::Precision::#v }
    });
    // The CPU reference: the function itself, behind the shape the CPU backend calls.
    // Class and output as pptm-spec describes the op (the same `OpFn` build.rs catalogs).
    let class = format_ident!("{}", format!("{:?}", op.class));
    let output = format_ident!("{}", format!("{:?}", op.output()));
    let (cpu_fns, cpu) = match &attr.reduction {
        Some(r) => {
            let identity = &r.identity;
            let finish_ident = format_ident!("__pptm_op_finish_{}", op.name);
            let finish_body = match &r.finish {
                None => quote! { total },
                Some(c) if c.inputs.len() == 1 => quote! {
                    let finish: fn(f64) -> f64 = #c;
                    finish(total)
                },
                Some(c) => quote! {
                    let finish: fn(f64, f64) -> f64 = #c;
                    finish(total, n as f64)
                },
            };
            (
                quote! {
                    #[doc(hidden)]
                    #[allow(unused_variables, clippy::cast_precision_loss)]
                    fn #finish_ident(total: f64, n: usize) -> f64 {
                        #finish_body
                    }
                },
                quote! {
                    ::pptm::__private::CpuImpl::Reduction {
                        identity: #identity,
                        combine: #fn_ident,
                        fold: |acc, xs| ::pptm::__private::fold_elements(acc, xs, #fn_ident),
                        finish: #finish_ident,
                    }
                },
            )
        }
        None => {
            // The CPU backend hands an elementwise op [flow, its other inputs in order, its
            // by-value arguments in order]: each of the function's parameters by its place there.
            // (A state flow is its fields, `flow_channels` values.)
            let flow_len = usize::from(flow_channels);
            // (Tables are not among the values: they come whole, in order.)
            let is_table = |p: &pptm_spec::Param| matches!(p.ty, pptm_spec::Ty::Table(..));
            let tensor_count = params
                .iter()
                .skip(1)
                .filter(|p| !p.ty.is_by_value() && !is_table(p))
                .count();
            let (mut next_tensor, mut next_scalar, mut next_table) =
                (flow_len, flow_len + tensor_count, 0usize);
            let call_args: Vec<TokenStream2> = op
                .params
                .iter()
                .zip(&params)
                .enumerate()
                .map(|(k, ((_, ty), p))| {
                    if is_table(p) {
                        next_table += 1;
                        let t = next_table - 1;
                        return quote! { tables[#t] };
                    }
                    let at = if k == 0 {
                        0
                    } else if p.ty.is_by_value() {
                        next_scalar += 1;
                        next_scalar - 1
                    } else {
                        next_tensor += 1;
                        next_tensor - 1
                    };
                    match ty {
                        Scalar::F32 => quote! { v[#at] as f32 },
                        Scalar::F64 => quote! { v[#at] },
                        Scalar::State(st) => {
                            let state = format_ident!("{}", st.name);
                            quote! { <#state as ::pptm::State>::from_values(&v[..#flow_len]) }
                        }
                        _ => quote! { v[#at] as u32 },
                    }
                })
                .collect();
            match op.ret {
                // A state (its fields to `out`), or a value from tables (`CpuImpl::PerElement`).
                _ if matches!(op.ret, Scalar::State(_)) || op.has_tables() => {
                    let store = match op.ret {
                        Scalar::State(_) => quote! {
                            ::pptm::State::to_values(&#fn_ident(#(#call_args),*), out)
                        },
                        _ => quote! {
                            out[0] = f64::from(#fn_ident(#(#call_args),*))
                        },
                    };
                    (
                        quote! {
                            #[doc(hidden)]
                            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, unused_variables)]
                            fn #cpu_ident(
                                v: &[f64],
                                tables: &[::pptm::Table<'_>],
                                out: &mut [f64],
                            ) {
                                #store
                            }
                        },
                        quote! { ::pptm::__private::CpuImpl::PerElement(#cpu_ident) },
                    )
                }
                _ => {
                    let ret_cast = if op.ret == Scalar::F32 {
                        quote! { as f64 }
                    } else {
                        quote! {}
                    };
                    (
                        quote! {
                            #[doc(hidden)]
                            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                            fn #cpu_ident(v: &[f64]) -> f64 {
                                #fn_ident(#(#call_args),*) #ret_cast
                            }
                        },
                        quote! {
                            ::pptm::__private::CpuImpl::Elementwise(::pptm::__private::ElementFn {
                                one: #cpu_ident,
                                run: |columns, out| {
                                    ::pptm::__private::run_elements(columns, out, #cpu_ident)
                                },
                            })
                        },
                    )
                }
            }
        }
    };
    let f = with_u32_indices(f);
    Ok(quote! {
        #f

        #[doc = #doc]
        #[derive(Debug, Clone, Copy, Default)]
        #vis struct #marker;

        #cpu_fns

        impl ::pptm::Op for #marker {
            const DEF: &'static ::pptm::__private::OpDef = &::pptm::__private::OpDef {
                name: #op_name,
                class: ::pptm::__private::FusionClass::#class,
                inputs: &[#(#param_tokens),*],
                output: ::pptm::__private::Ty::#output,
                flow_channels: ::core::option::Option::Some(#flow_channels),
                out_channels: ::core::option::Option::Some(#out_channels),
                states: ::pptm::__private::StateTypes {
                    flow: #flow_state,
                    out: #out_state,
                },
                precisions: &[#(#precisions),*],
                tensor_precisions: &[],
                lanes: #lanes,
                header: "",
                cuda: #cuda,
                device: #device,
                cpu: #cpu,
                check: ::core::option::Option::None,
                doc: #op_doc,
            };
        }
    })
}
