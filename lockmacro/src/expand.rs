//! Writes the locked function: the user's signature token for token, and a body that builds the
//! key, client and options, then runs the original body as a future under the lock.
//!
//! Generated code names only `#runtime::__private::vX_Y_Z::…`, the runtime's private module of
//! this very version (so a macro and a runtime of different versions fail to compile rather than
//! disagree), and `::core::…`. Its tokens carry `Span::mixed_site()` (located at the user's tokens
//! where an error should point there), so the body cannot see the `__lm_` temporaries and lints
//! such as `unused_qualifications` leave the generated paths alone.

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{ToTokens, format_ident, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{Expr, GenericArgument, ItemFn, Path, PathArguments, Token, Type, TypeInfer};

use crate::attr::{Configuration, Kind, Length, Renewals};
use crate::valid::{self, LockedBody, LockedFn};

/// The whole attribute: read, check, write. On any error the function is emitted unchanged next
/// to the errors, so callers see no second error and IDEs keep working.
pub(crate) fn redis_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let func = syn::parse2::<ItemFn>(item.clone()).map_err(valid::not_a_function);
    // The parameters the key may name, so a key naming none is reported among the arguments.
    let parameters = func.as_ref().ok().map(valid::Parameters::of);
    let config = Configuration::parse(args, parameters.as_ref()).map(|config| {
        let private = private_module(&config);
        (config, private)
    });
    let func = func.and_then(|func| valid::check(&func).map(|locked| (func, locked)));
    match valid::join(config, func) {
        Ok(((config, private), (func, locked))) => locked_fn(&config, &private, &func, locked),
        Err(error) => {
            let mut tokens = error.into_compile_error();
            tokens.extend(item);
            tokens
        }
    }
}

/// `#runtime::__private::vX_Y_Z`: where generated code finds the runtime. The runtime is where
/// `crate = "..."` says, else `::lockmacro_runtime` (as `#[tokio::main]` assumes `::tokio`): a
/// crate that renames the dependency, or re-exports the attribute, says so with `crate =`.
fn private_module(config: &Configuration) -> Path {
    let runtime: Path = match &config.krate {
        Some(path) => path.clone(),
        None => syn::parse_quote_spanned!(Span::mixed_site()=> ::lockmacro_runtime),
    };
    let version = format_ident!(
        "v{}_{}_{}",
        env!("CARGO_PKG_VERSION_MAJOR"),
        env!("CARGO_PKG_VERSION_MINOR"),
        env!("CARGO_PKG_VERSION_PATCH"),
        span = Span::mixed_site()
    );
    syn::parse_quote_spanned!(Span::mixed_site()=> #runtime::__private::#version)
}

fn locked_fn(
    config: &Configuration,
    private: &Path,
    func: &ItemFn,
    locked: LockedFn,
) -> TokenStream {
    let ItemFn {
        attrs, vis, sig, ..
    } = func;
    let inputs = lock_inputs(config, private);
    let body = match locked.body {
        LockedBody::Async(block) => {
            let run = run_locked(
                config,
                private,
                &locked.output,
                quote_spanned!(Span::mixed_site()=> async move #block),
            );
            quote_spanned!(Span::mixed_site()=> #inputs #run)
        }
        LockedBody::AsyncTrait { boxer, future } => {
            let run = run_locked(config, private, &locked.output, future.into_token_stream());
            quote_spanned!(Span::mixed_site()=> #inputs #boxer(async move { #run }))
        }
    };
    // The body's braces are the user's: an item that ends in generated tokens counts as macro
    // output, and the compiler would not warn that an unused locked function is never used.
    let mut body = Group::new(Delimiter::Brace, body);
    body.set_span(func.block.brace_token.span.join());
    quote_spanned!(Span::mixed_site()=> #(#attrs)* #vis #sig #body)
}

/// The key, client and run-time lengths, evaluated by reference before the body takes its
/// parameters, and the options.
fn lock_inputs(config: &Configuration, private: &Path) -> TokenStream {
    let prefix = &config.prefix;
    let key = match &config.key {
        // Each spanned at its own tokens: "not `Display`" lands on the key that is not.
        Some(Expr::Array(list)) => {
            let parts = list
                .elems
                .iter()
                .map(|key| quote_spanned!(at(key)=> #private::key_part(&(#key))));
            quote_spanned!(Span::mixed_site()=> #private::prefixed_keys(#prefix, &[#(#parts),*]))
        }
        // Spanned at the key, so "not `Display`" and "cannot find value" land on the user's tokens.
        Some(key) => quote_spanned!(at(key)=> #private::prefixed_key(#prefix, &(#key))),
        None => quote_spanned!(Span::mixed_site()=> #private::prefix_only_key(#prefix)),
    };
    let client = match &config.client {
        Some(client) => quote_spanned!(at(client)=> #private::client_from(&(#client))),
        None => quote_spanned!(Span::mixed_site()=> #private::default_client()),
    };
    let options = lock_options(config, private);
    quote_spanned! {Span::mixed_site()=>
        let __lm_key = #key;
        let __lm_client = #client;
        let __lm_options = #options;
    }
}

/// `LockOptions::new()` with the arguments that were given (the runtime owns the defaults), and
/// the lengths given as expressions, checked when called.
fn lock_options(config: &Configuration, private: &Path) -> TokenStream {
    let mut options = quote_spanned!(Span::mixed_site()=> #private::LockOptions::new());
    match config.max_renewals {
        Some(Renewals::Limited(renewals)) => {
            options.extend(quote_spanned!(Span::mixed_site()=> .max_renewals(#renewals)));
        }
        Some(Renewals::Unlimited) => {
            options.extend(quote_spanned!(Span::mixed_site()=> .unlimited_renewals()));
        }
        None => {}
    }
    if config.fencing {
        options.extend(quote_spanned!(Span::mixed_site()=> .fencing(true)));
    }
    match config.kind {
        Some(Kind::Read) => options.extend(quote_spanned!(Span::mixed_site()=> .read())),
        Some(Kind::Write) => options.extend(quote_spanned!(Span::mixed_site()=> .write())),
        Some(Kind::Permits(permits)) => {
            options.extend(quote_spanned!(Span::mixed_site()=> .permits(#permits)));
        }
        None => {}
    }
    if config.fair {
        options.extend(quote_spanned!(Span::mixed_site()=> .fair(true)));
    }
    // Literal lengths join the chain (checked here already: the options are then a constant
    // the compiler folds); lengths given as expressions are checked when called.
    let lengths = [
        ("ttl", config.ttl.as_ref()),
        ("wait", config.wait.as_ref()),
        ("hold_at_least", config.hold_at_least.as_ref()),
    ];
    for (argument, length) in lengths {
        if let Some(Length::Millis(millis)) = length {
            let setter = format_ident!("{argument}", span = Span::mixed_site());
            options.extend(quote_spanned!(Span::mixed_site()=>
                .#setter(#private::Duration::from_millis(#millis))
            ));
        }
    }
    if !lengths
        .iter()
        .any(|(_, length)| matches!(length, Some(Length::Expr(_))))
    {
        return quote_spanned!(Span::mixed_site()=>
            ::core::result::Result::Ok::<#private::LockOptions, #private::LockError>(#options)
        );
    }
    let [ttl, wait, hold] =
        lengths.map(|(argument, length)| self::length(private, argument, length));
    quote_spanned!(Span::mixed_site()=> #private::options(#options, #ttl, #wait, #hold))
}

/// An `Option<Result<Duration, LockError>>`: the expression's value converted (and checked)
/// when called, spanned at it so a wrong type is reported there; `None` for a length not given
/// or given as a literal (in the options already).
fn length(private: &Path, argument: &str, length: Option<&Length>) -> TokenStream {
    match length {
        None | Some(Length::Millis(_)) => {
            quote_spanned!(Span::mixed_site()=> ::core::option::Option::None)
        }
        Some(Length::Expr(value)) => quote_spanned!(at(value)=>
            ::core::option::Option::Some(#private::length(#argument, &(#value)))
        ),
    }
}

/// Runs `future` (the original body) under the lock and turns a lock failure into the
/// function's own error type.
fn run_locked(
    config: &Configuration,
    private: &Path,
    output: &Type,
    future: TokenStream,
) -> TokenStream {
    let output = impl_trait_inferred(output);
    let lock_failed = lock_error_into(private, &output);
    let prefix = &config.prefix;
    let run = match &config.key {
        Some(Expr::Array(_)) => format_ident!("run_many", span = Span::mixed_site()),
        _ => format_ident!("run", span = Span::mixed_site()),
    };
    quote_spanned! {Span::mixed_site()=>
        // The return type fixes the block's output, so `?` and `return` infer as before.
        let __lm_body = #private::typed_body::<#output, _>(#future);
        let __lm_failed = |__lm_out: &#output| {
            use #private::{JudgeOther as _, JudgeResult as _};
            (&#private::Judge(__lm_out)).failed()
        };
        match #private::#run(__lm_client, __lm_key, __lm_options, #prefix, __lm_body, __lm_failed)
            .await
        {
            ::core::result::Result::Ok(__lm_out) => __lm_out,
            ::core::result::Result::Err(__lm_err) => #lock_failed,
        }
    }
}

/// `Err(E::from(error))` spanned at `E` when the return type is written `Result<T, E>`, so a
/// missing `From<LockError>` is reported on the user's error type; otherwise the runtime's
/// `LockResult`, spanned at the whole return type, whose message says what to return.
fn lock_error_into(private: &Path, output: &Type) -> TokenStream {
    match result_error_type(output) {
        Some(error) => quote_spanned! {at(error)=>
            ::core::result::Result::Err(<#error as #private::IntoError>::from_lock_error(__lm_err))
        },
        None => quote_spanned! {at(output)=>
            <#output as #private::LockResult>::from_lock_error(__lm_err)
        },
    }
}

/// `E` when `ty` is written `Result<T, E>`.
fn result_error_type(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = ty else {
        return None;
    };
    let last = path.path.segments.last()?;
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let mut args = args.args.iter();
    match (
        path.qself.is_none() && last.ident == "Result",
        args.next(),
        args.next(),
        args.next(),
    ) {
        (true, Some(GenericArgument::Type(_)), Some(GenericArgument::Type(error)), None) => {
            Some(error)
        }
        _ => None,
    }
}

/// Generated tokens that resolve as generated code but point at the user's tokens.
fn at(tokens: &impl Spanned) -> Span {
    Span::mixed_site().located_at(tokens.span())
}

/// The return type with each `impl Trait` replaced by `_`, usable as a type argument.
fn impl_trait_inferred(ty: &Type) -> Type {
    struct InferImplTrait;

    impl VisitMut for InferImplTrait {
        fn visit_type_mut(&mut self, ty: &mut Type) {
            if let Type::ImplTrait(impl_trait) = ty {
                let underscore_token = Token![_](impl_trait.impl_token.span);
                *ty = Type::Infer(TypeInfer {
                    attrs: Vec::new(),
                    underscore_token,
                });
            } else {
                visit_mut::visit_type_mut(self, ty);
            }
        }
    }

    let mut ty = ty.clone();
    InferImplTrait.visit_type_mut(&mut ty);
    ty
}
