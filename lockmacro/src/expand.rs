//! Writes the locked function: the user's signature token for token, and a body that builds the
//! key, client and options, then runs the original body as a future under the lock.
//!
//! Generated code names only `#krate::…` and `::core::…`. Its tokens carry `Span::mixed_site()`
//! (located at the user's tokens where an error should point there), so the body cannot see the
//! `__lm_` temporaries and lints such as `unused_qualifications` leave the generated paths alone.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{GenericArgument, ItemFn, Path, PathArguments, Token, Type, TypeInfer};

use crate::attr::{Configuration, Renewals};
use crate::valid::{self, LockedBody, LockedFn};

/// The whole attribute: read, check, write. On any error the function is emitted unchanged next
/// to the errors, so callers see no second error and IDEs keep working.
pub(crate) fn redis_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let config = Configuration::parse(args);
    let func = syn::parse2::<ItemFn>(item.clone())
        .map_err(valid::not_a_function)
        .and_then(|func| valid::check(&func).map(|locked| (func, locked)));
    match valid::join(config, func) {
        Ok((config, (func, locked))) => locked_fn(&config, &func, locked),
        Err(error) => {
            let mut tokens = error.into_compile_error();
            tokens.extend(item);
            tokens
        }
    }
}

fn locked_fn(config: &Configuration, func: &ItemFn, locked: LockedFn) -> TokenStream {
    let ItemFn {
        attrs, vis, sig, ..
    } = func;
    let inputs = lock_inputs(config);
    let body = match locked.body {
        LockedBody::Async(block) => {
            let run = run_locked(
                config,
                &locked.output,
                quote_spanned!(Span::mixed_site()=> async move #block),
            );
            quote_spanned!(Span::mixed_site()=> { #inputs #run })
        }
        LockedBody::AsyncTrait { boxer, future } => {
            let run = run_locked(config, &locked.output, future.into_token_stream());
            quote_spanned!(Span::mixed_site()=> { #inputs #boxer(async move { #run }) })
        }
    };
    quote_spanned!(Span::mixed_site()=> #(#attrs)* #vis #sig #body)
}

/// The key and client, evaluated by reference before the body takes its parameters, and the options.
fn lock_inputs(config: &Configuration) -> TokenStream {
    let krate = &config.krate;
    let prefix = &config.prefix;
    let key = match &config.key {
        // Spanned at the key, so "not `Display`" and "cannot find value" land on the user's tokens.
        Some(key) => quote_spanned!(at(key)=> #krate::__private::prefixed_key(#prefix, &(#key))),
        None => quote_spanned!(Span::mixed_site()=> #krate::__private::prefix_only_key(#prefix)),
    };
    let client = match &config.client {
        Some(client) => quote_spanned!(at(client)=> #krate::__private::client_from(&(#client))),
        None => quote_spanned!(Span::mixed_site()=> #krate::__private::default_client()),
    };
    let options = lock_options(config);
    quote_spanned! {Span::mixed_site()=>
        let __lm_key = #key;
        let __lm_client = #client;
        let __lm_options = #options;
    }
}

/// `LockOptions::new()` with the arguments that were given; the runtime owns the defaults.
fn lock_options(config: &Configuration) -> TokenStream {
    let krate = &config.krate;
    let mut options = quote_spanned!(Span::mixed_site()=> #krate::LockOptions::new());
    if let Some(millis) = config.ttl_millis {
        options.extend(quote_spanned!(Span::mixed_site()=>
            .ttl(#krate::__private::Duration::from_millis(#millis))
        ));
    }
    match config.max_renewals {
        Some(Renewals::Limited(renewals)) => {
            options.extend(quote_spanned!(Span::mixed_site()=> .max_renewals(#renewals)));
        }
        Some(Renewals::Unlimited) => {
            options.extend(quote_spanned!(Span::mixed_site()=> .unlimited_renewals()));
        }
        None => {}
    }
    if let Some(millis) = config.wait_millis {
        options.extend(quote_spanned!(Span::mixed_site()=>
            .wait(#krate::__private::Duration::from_millis(#millis))
        ));
    }
    if config.fencing {
        options.extend(quote_spanned!(Span::mixed_site()=> .fencing(true)));
    }
    options
}

/// Runs `future` (the original body) under the lock and turns a lock failure into the
/// function's own error type.
fn run_locked(config: &Configuration, output: &Type, future: TokenStream) -> TokenStream {
    let krate = &config.krate;
    let output = impl_trait_inferred(output);
    let lock_failed = lock_error_into(krate, &output);
    quote_spanned! {Span::mixed_site()=>
        // The return type fixes the block's output, so `?` and `return` infer as before.
        let __lm_body = #krate::__private::typed_body::<#output, _>(#future);
        match #krate::__private::run(__lm_client, __lm_key, __lm_options, __lm_body).await {
            ::core::result::Result::Ok(__lm_out) => __lm_out,
            ::core::result::Result::Err(__lm_err) => #lock_failed,
        }
    }
}

/// `Err(E::from(error))` spanned at `E` when the return type is written `Result<T, E>`, so a
/// missing `From<LockError>` is reported on the user's error type; otherwise the runtime's
/// `LockResult`, spanned at the whole return type, whose message says what to return.
fn lock_error_into(krate: &Path, output: &Type) -> TokenStream {
    match result_error_type(output) {
        Some(error) => quote_spanned! {at(error)=>
            ::core::result::Result::Err(
                <#error as ::core::convert::From<#krate::LockError>>::from(__lm_err)
            )
        },
        None => quote_spanned! {at(output)=>
            <#output as #krate::__private::LockResult>::from_lock_error(__lm_err)
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
                *ty = Type::Infer(TypeInfer { underscore_token });
            } else {
                visit_mut::visit_type_mut(self, ty);
            }
        }
    }

    let mut ty = ty.clone();
    InferImplTrait.visit_type_mut(&mut ty);
    ty
}
