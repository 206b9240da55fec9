//! Checks the function under `#[redis_lock]`, and folds every error found into one.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::{
    Block, Error, Expr, ExprAsync, FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments,
    ReturnType, Stmt, Type, TypeParamBound,
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
        let message = if sig.receiver().is_some() {
            // A method may implement a trait whose declaration is sync, where `async` alone
            // cannot compile.
            "`#[redis_lock]` needs an `async fn`; add `async`. In a trait impl, declare the \
             method `async fn` in the trait too, or put `#[async_trait]` on the trait and on \
             the impl (above `#[redis_lock]`)"
        } else {
            "`#[redis_lock]` needs an `async fn`; add `async`"
        };
        errors.push(Error::new(sig.fn_token.span, message));
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

/// The names the function binds, which `key` may use.
pub(crate) struct Parameters {
    function: Ident,
    names: Vec<Ident>,
}

impl Parameters {
    pub(crate) fn of(func: &ItemFn) -> Self {
        let mut names = Vec::new();
        for input in &func.sig.inputs {
            match input {
                FnArg::Receiver(_) => names.push(Ident::new("self", Span::call_site())),
                FnArg::Typed(typed) => bound_names(&typed.pat, &mut names),
            }
        }
        Self {
            function: func.sig.ident.clone(),
            names,
        }
    }

    /// A key (or a part of `key = [...]`) that is a lone name (`key = user`) must name one of
    /// the parameters: otherwise the compiler's "cannot find value" would not say what the key
    /// can name. Names starting with a capital (`key = TENANT`, a constant) are left to the
    /// compiler.
    pub(crate) fn check_key_part(&self, part: &Expr) -> syn::Result<()> {
        let Expr::Path(path) = part else {
            return Ok(());
        };
        let Some(name) = path.path.get_ident() else {
            return Ok(());
        };
        let starts_lowercase = name
            .to_string()
            .starts_with(|c: char| c.is_lowercase() || c == '_');
        if path.qself.is_some() || !starts_lowercase || self.names.iter().any(|bound| bound == name)
        {
            return Ok(());
        }
        let listed = match self.names.as_slice() {
            [] => format!("`{}` takes no parameters", self.function),
            names => format!(
                "the parameters of `{}` are {}",
                self.function,
                names
                    .iter()
                    .map(|name| format!("`{name}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        Err(Error::new(
            name.span(),
            format!(
                "`key = {name}` names no parameter of this function; {listed}. `key` is an \
                 expression over the parameters, such as `key = user_id` or `key = order.id`"
            ),
        ))
    }
}

/// The names a parameter's pattern binds: `user_id`, or `user_id` in `Path(user_id)`.
fn bound_names(pat: &Pat, names: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(ident) => {
            names.push(ident.ident.clone());
            if let Some((_, sub)) = &ident.subpat {
                bound_names(sub, names);
            }
        }
        Pat::Reference(reference) => bound_names(&reference.pat, names),
        Pat::Paren(paren) => bound_names(&paren.pat, names),
        Pat::Type(typed) => bound_names(&typed.pat, names),
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|pat| bound_names(pat, names)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|pat| bound_names(pat, names)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|pat| bound_names(pat, names)),
        Pat::Struct(fields) => fields
            .fields
            .iter()
            .for_each(|field| bound_names(&field.pat, names)),
        Pat::Or(or) => or.cases.iter().for_each(|pat| bound_names(pat, names)),
        _ => {}
    }
}
