//! Checks the function under `#[redis_lock]`, and folds every error found into one.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::{
    Block, Error, Expr, ExprAsync, GenericArgument, ItemFn, PathArguments, ReturnType, Stmt, Type,
    TypeParamBound,
};

/// Every error found so far, reported together (serde's `Ctxt`).
#[derive(Default)]
pub(crate) struct Errors(Option<Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: Error) {
        match &mut self.0 {
            Some(errors) => errors.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

/// Both values, or every error of both.
pub(crate) fn join<A, B>(a: syn::Result<A>, b: syn::Result<B>) -> syn::Result<(A, B)> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok((a, b)),
        (Err(mut a), Err(b)) => {
            a.combine(b);
            Err(a)
        }
        (Err(error), Ok(_)) | (Ok(_), Err(error)) => Err(error),
    }
}

/// A function the lock can wrap.
pub(crate) struct LockedFn {
    /// What the function's future yields: the declared return type.
    pub(crate) output: Type,
    pub(crate) body: LockedBody,
}

/// The future that runs under the lock.
pub(crate) enum LockedBody {
    /// An `async fn`: its block becomes an `async move` block.
    Async(Block),
    /// A method already rewritten by `#[async_trait]`: `boxer(future)`, where `boxer` is
    /// `Box::pin` and `future` the `async move` block holding the original body.
    AsyncTrait { boxer: Box<Expr>, future: ExprAsync },
}

/// The item is not a function with a body.
pub(crate) fn not_a_function(error: Error) -> Error {
    Error::new(
        error.span(),
        "`#[redis_lock]` can only be used on an `async fn` with a body",
    )
}

/// Checks the function's shape, reporting every problem at once.
pub(crate) fn check(func: &ItemFn) -> syn::Result<LockedFn> {
    if func.sig.asyncness.is_none()
        && let Some(locked) = async_trait_method(func)
    {
        return Ok(locked);
    }
    let sig = &func.sig;
    let mut errors = Errors::default();
    if let Some(constness) = &sig.constness {
        errors.push(Error::new(
            constness.span,
            "`#[redis_lock]` cannot be used on a `const fn`; remove `const`",
        ));
    }
    if sig.asyncness.is_none() {
        errors.push(Error::new(
            sig.fn_token.span,
            "`#[redis_lock]` needs an `async fn`; add `async`",
        ));
    }
    if let Some(variadic) = &sig.variadic {
        errors.push(Error::new_spanned(
            variadic,
            "`#[redis_lock]` cannot be used on a variadic function; remove `...`",
        ));
    }
    let output = match &sig.output {
        ReturnType::Type(_, output) => Ok((**output).clone()),
        ReturnType::Default => Err(Error::new_spanned(
            name_and_inputs(func),
            "`#[redis_lock]` functions must return `Result<T, E>` where `E: From<LockError>`; \
             add a return type",
        )),
    };
    let ((), output) = join(errors.finish(), output)?;
    Ok(LockedFn {
        output,
        body: LockedBody::Async((*func.block).clone()),
    })
}

/// `name(inputs)`, where a missing return type belongs.
fn name_and_inputs(func: &ItemFn) -> TokenStream {
    let mut tokens = func.sig.ident.to_token_stream();
    func.sig
        .paren_token
        .surround(&mut tokens, |tokens| func.sig.inputs.to_tokens(tokens));
    tokens
}

/// Recognises the shape `#[async_trait]` gives an `async fn` (as `tracing::instrument` does):
/// `fn f(..) -> Pin<Box<dyn Future<Output = R> + Send + 'async_trait>> { Box::pin(async move { .. }) }`.
fn async_trait_method(func: &ItemFn) -> Option<LockedFn> {
    let ReturnType::Type(_, boxed) = &func.sig.output else {
        return None;
    };
    let output = boxed_future_output(boxed)?;
    let [Stmt::Expr(Expr::Call(call), None)] = func.block.stmts.as_slice() else {
        return None;
    };
    let Expr::Path(boxer) = &*call.func else {
        return None;
    };
    let mut segments = boxer.path.segments.iter().rev();
    let is_box_pin = segments.next().is_some_and(|pin| pin.ident == "pin")
        && segments.next().is_some_and(|boxed| boxed.ident == "Box");
    let mut args = call.args.iter();
    let (true, Some(Expr::Async(future)), None) = (is_box_pin, args.next(), args.next()) else {
        return None;
    };
    future.capture?;
    Some(LockedFn {
        output: output.clone(),
        body: LockedBody::AsyncTrait {
            boxer: call.func.clone(),
            future: future.clone(),
        },
    })
}

/// `R` in `Pin<Box<dyn Future<Output = R> + ..>>`.
fn boxed_future_output(ty: &Type) -> Option<&Type> {
    let pinned = single_type_argument(ty, "Pin")?;
    let Type::TraitObject(object) = single_type_argument(pinned, "Box")? else {
        return None;
    };
    object.bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(bound) = bound else {
            return None;
        };
        let future = bound.path.segments.last()?;
        let PathArguments::AngleBracketed(args) = &future.arguments else {
            return None;
        };
        if future.ident != "Future" {
            return None;
        }
        args.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(output) if output.ident == "Output" => Some(&output.ty),
            _ => None,
        })
    })
}

/// `T` in `name<T>`, matching the last path segment only.
fn single_type_argument<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(path) = ty else {
        return None;
    };
    let last = path.path.segments.last()?;
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match (last.ident == name, args.args.first(), args.args.len()) {
        (true, Some(GenericArgument::Type(inner)), 1) => Some(inner),
        _ => None,
    }
}
