//! Reads the arguments of `#[redis_lock(...)]` into a typed [`Configuration`].
//!
//! Each argument is read on its own, so one bad argument does not hide the next: every error is
//! collected and reported at its own tokens. Only broken syntax (no `=`, no `,`, an expression
//! that does not parse) stops the reading.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Error, Expr, ExprLit, Ident, Lit, LitInt, LitStr, Path, Token};

use crate::valid::Errors;

mod kw {
    syn::custom_keyword!(prefix);
    syn::custom_keyword!(key);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(max_renewals);
    syn::custom_keyword!(wait);
    syn::custom_keyword!(client);
    syn::custom_keyword!(fencing);
    syn::custom_keyword!(unlimited);
}

/// What one `#[redis_lock(...)]` asks for, every value checked.
pub(crate) struct Configuration {
    /// Path of the runtime crate in generated code.
    pub(crate) krate: Path,
    /// The key namespace, non-empty.
    pub(crate) prefix: LitStr,
    /// The user's key expression, if any.
    pub(crate) key: Option<Expr>,
    /// The user's client expression, if any.
    pub(crate) client: Option<Expr>,
    /// Lease length in milliseconds, non-zero; `None` keeps the runtime's default.
    pub(crate) ttl_millis: Option<u64>,
    /// `None` keeps the runtime's default.
    pub(crate) max_renewals: Option<Renewals>,
    /// How long to wait for a busy lock in milliseconds, non-zero; `None` fails fast.
    pub(crate) wait_millis: Option<u64>,
    /// Whether to hand out fencing tokens.
    pub(crate) fencing: bool,
}

/// The value of `max_renewals`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewals {
    Limited(u32),
    Unlimited,
}

impl Configuration {
    /// Reads the attribute's arguments, reporting every bad one at once.
    pub(crate) fn parse(tokens: TokenStream) -> syn::Result<Self> {
        let mut fields = Fields::default();
        let mut errors = Errors::default();
        let parsed = (|input: ParseStream| fields.parse_all(input, &mut errors)).parse2(tokens);
        match parsed {
            Err(syntax) => errors.push(syntax),
            Ok(()) if !fields.seen.contains(&Argument::Prefix) => errors.push(missing_prefix()),
            Ok(()) => {}
        }
        errors.finish()?;
        Ok(Self {
            krate: fields.krate.unwrap_or_else(default_crate),
            prefix: fields.prefix.ok_or_else(missing_prefix)?,
            key: fields.key,
            client: fields.client,
            ttl_millis: fields.ttl_millis,
            max_renewals: fields.max_renewals,
            wait_millis: fields.wait_millis,
            fencing: fields.fencing,
        })
    }
}

fn default_crate() -> Path {
    syn::parse_quote_spanned!(Span::mixed_site()=> ::lockmacro_runtime)
}

fn missing_prefix() -> Error {
    Error::new(
        Span::call_site(),
        "`#[redis_lock]` needs a `prefix`; add `prefix = \"...\"`",
    )
}

/// The arguments the attribute knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Argument {
    Prefix,
    Key,
    Ttl,
    MaxRenewals,
    Wait,
    Client,
    Fencing,
    Crate,
}

const VALID_NAMES: &str =
    "`prefix`, `key`, `ttl`, `max_renewals`, `wait`, `client`, `fencing`, `crate`";

impl Argument {
    fn peek(input: ParseStream<'_>) -> Option<Self> {
        Some(if input.peek(kw::prefix) {
            Self::Prefix
        } else if input.peek(kw::key) {
            Self::Key
        } else if input.peek(kw::ttl) {
            Self::Ttl
        } else if input.peek(kw::max_renewals) {
            Self::MaxRenewals
        } else if input.peek(kw::wait) {
            Self::Wait
        } else if input.peek(kw::client) {
            Self::Client
        } else if input.peek(kw::fencing) {
            Self::Fencing
        } else if input.peek(Token![crate]) {
            Self::Crate
        } else {
            return None;
        })
    }

    /// How the argument is written, for "write `...`" hints.
    fn example(self) -> &'static str {
        match self {
            Self::Prefix => "prefix = \"orders\"",
            Self::Key => "key = user_id",
            Self::Ttl => "ttl = 30",
            Self::MaxRenewals => "max_renewals = 3",
            Self::Wait => "wait = \"5s\"",
            Self::Client => "client = self.locks",
            Self::Fencing => "fencing = true",
            Self::Crate => "crate = \"::lockmacro_runtime\"",
        }
    }
}

/// The arguments read so far.
#[derive(Default)]
struct Fields {
    seen: Vec<Argument>,
    krate: Option<Path>,
    prefix: Option<LitStr>,
    key: Option<Expr>,
    client: Option<Expr>,
    ttl_millis: Option<u64>,
    max_renewals: Option<Renewals>,
    wait_millis: Option<u64>,
    fencing: bool,
}

impl Fields {
    /// Reads `name = value, ...`. Bad values go to `errors`; broken syntax ends the reading.
    fn parse_all(&mut self, input: ParseStream<'_>, errors: &mut Errors) -> syn::Result<()> {
        while !input.is_empty() {
            let argument = Argument::peek(input);
            if !input.peek(Ident::peek_any) {
                return Err(input.error(format!(
                    "expected an argument name in `#[redis_lock]`, one of {VALID_NAMES}"
                )));
            }
            let name = input.call(Ident::parse_any)?;
            let value = if input.peek(Token![=]) {
                input.parse::<Token![=]>()?;
                Some(input.parse::<Expr>()?)
            } else if input.is_empty() || input.peek(Token![,]) {
                None
            } else {
                let example = argument.map_or("name = value", Argument::example);
                return Err(input.error(format!("expected `=` after `{name}`; write `{example}`")));
            };
            if let Err(error) = self.read(argument, &name, value) {
                errors.push(error);
            }
            if input.is_empty() {
                break;
            }
            if !input.peek(Token![,]) {
                return Err(input.error("expected `,` between `#[redis_lock]` arguments"));
            }
            input.parse::<Token![,]>()?;
        }
        Ok(())
    }

    fn read(
        &mut self,
        argument: Option<Argument>,
        name: &Ident,
        value: Option<Expr>,
    ) -> syn::Result<()> {
        let Some(argument) = argument else {
            return Err(Error::new(
                name.span(),
                format!(
                    "unknown argument `{name}` in `#[redis_lock]`; expected one of {VALID_NAMES}"
                ),
            ));
        };
        if self.seen.contains(&argument) {
            return Err(Error::new(
                name.span(),
                format!("duplicate argument `{name}` in `#[redis_lock]`; give each argument once"),
            ));
        }
        self.seen.push(argument);
        let Some(value) = value else {
            return Err(Error::new(
                name.span(),
                format!(
                    "argument `{name}` needs a value; write `{}`",
                    argument.example()
                ),
            ));
        };
        match argument {
            Argument::Prefix => self.prefix = Some(prefix(value)?),
            Argument::Key => self.key = Some(value),
            Argument::Ttl => self.ttl_millis = Some(ttl(&value)?),
            Argument::MaxRenewals => self.max_renewals = Some(max_renewals(&value)?),
            Argument::Wait => self.wait_millis = Some(wait(&value)?),
            Argument::Client => self.client = Some(value),
            Argument::Fencing => self.fencing = fencing(&value)?,
            Argument::Crate => self.krate = Some(crate_path(&value)?),
        }
        Ok(())
    }
}

fn prefix(value: Expr) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(prefix),
            ..
        }) if prefix.value().is_empty() => Err(Error::new(
            prefix.span(),
            "`prefix` must not be empty; name the lock, such as `prefix = \"orders\"`",
        )),
        Expr::Lit(ExprLit {
            lit: Lit::Str(prefix),
            ..
        }) => Ok(prefix),
        other => Err(Error::new_spanned(
            other,
            "`prefix` must be a string literal; write `prefix = \"orders\"`",
        )),
    }
}

fn ttl(value: &Expr) -> syn::Result<u64> {
    match duration_millis("ttl", value)? {
        0 => Err(Error::new_spanned(
            value,
            "`ttl` must be greater than zero; write a lease length such as `ttl = 30`",
        )),
        millis => Ok(millis),
    }
}

fn wait(value: &Expr) -> syn::Result<u64> {
    match duration_millis("wait", value)? {
        0 => Err(Error::new_spanned(
            value,
            "`wait` must be greater than zero; omit `wait` to fail fast when the lock is busy",
        )),
        millis => Ok(millis),
    }
}

/// `3` (seconds) or `"500ms"` / `"3s"` / `"2m"`, in milliseconds.
fn duration_millis(argument: &str, value: &Expr) -> syn::Result<u64> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(seconds),
            ..
        }) if seconds.suffix().is_empty() => seconds
            .base10_parse::<u64>()
            .ok()
            .and_then(|seconds| seconds.checked_mul(1000))
            .ok_or_else(|| Error::new(seconds.span(), DurationError::TooLarge.message(argument))),
        Expr::Lit(ExprLit {
            lit: Lit::Int(suffixed),
            ..
        }) if is_unit(suffixed.suffix()) => Err(unit_outside_string(argument, suffixed)),
        Expr::Lit(ExprLit {
            lit: Lit::Str(text),
            ..
        }) => parse_duration(&text.value())
            .map_err(|error| Error::new(text.span(), error.message(argument))),
        other => Err(Error::new_spanned(
            other,
            format!(
                "`{argument}` must be an integer of seconds or a string with a unit `ms`, `s` or `m`; \
                 write `{argument} = 3` or `{argument} = \"500ms\"`"
            ),
        )),
    }
}

fn is_unit(suffix: &str) -> bool {
    matches!(suffix, "ms" | "s" | "m")
}

fn unit_outside_string(argument: &str, literal: &LitInt) -> Error {
    Error::new(
        literal.span(),
        format!(
            "`{argument}` takes its unit inside a string; write `{argument} = \"{}{}\"`",
            literal.base10_digits(),
            literal.suffix()
        ),
    )
}

/// Why a duration string was refused.
#[derive(Debug, PartialEq, Eq)]
enum DurationError {
    NoNumber,
    Fraction,
    NoUnit,
    UnknownUnit(String),
    TooLarge,
}

impl DurationError {
    fn message(&self, argument: &str) -> String {
        match self {
            Self::NoNumber => format!(
                "`{argument}` must be a whole number followed by a unit `ms`, `s` or `m`, such as `{argument} = \"500ms\"`"
            ),
            Self::Fraction => format!(
                "`{argument}` takes whole numbers; use a smaller unit, such as `{argument} = \"1500ms\"` for 1.5 s"
            ),
            Self::NoUnit => format!(
                "`{argument}` needs a unit after the number: `ms`, `s` or `m`, such as `{argument} = \"3s\"`; or write the integer `{argument} = 3` for seconds"
            ),
            Self::UnknownUnit(unit) => format!(
                "unknown unit `{unit}` in `{argument}`; use `ms`, `s` or `m`, such as `{argument} = \"500ms\"`"
            ),
            Self::TooLarge => {
                format!("`{argument}` is too large; it must fit in a `u64` of milliseconds")
            }
        }
    }
}

/// `"500ms"`, `"3s"` or `"2m"` in milliseconds: digits, then the unit, nothing else.
fn parse_duration(text: &str) -> Result<u64, DurationError> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(DurationError::NoNumber);
    }
    let factor = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "" => return Err(DurationError::NoUnit),
        fraction if fraction.starts_with(['.', ',']) => return Err(DurationError::Fraction),
        other => return Err(DurationError::UnknownUnit(other.to_owned())),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|number| number.checked_mul(factor))
        .ok_or(DurationError::TooLarge)
}

fn max_renewals(value: &Expr) -> syn::Result<Renewals> {
    if let Ok(kw::unlimited { .. }) = syn::parse2(value.to_token_stream()) {
        return Ok(Renewals::Unlimited);
    }
    match value {
        Expr::Lit(ExprLit { lit: Lit::Int(count), .. }) if count.suffix().is_empty() => {
            count.base10_parse().map(Renewals::Limited).map_err(|_| {
                Error::new(
                    count.span(),
                    "`max_renewals` must fit in a `u32`; write `max_renewals = unlimited` for no limit",
                )
            })
        }
        other => Err(Error::new_spanned(
            other,
            "`max_renewals` must be a non-negative integer or `unlimited`; \
             write `max_renewals = 3` or `max_renewals = unlimited`",
        )),
    }
}

fn fencing(value: &Expr) -> syn::Result<bool> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(fencing),
            ..
        }) => Ok(fencing.value),
        other => Err(Error::new_spanned(
            other,
            "`fencing` must be `true` or `false`; write `fencing = true`",
        )),
    }
}

fn crate_path(value: &Expr) -> syn::Result<Path> {
    match value {
        Expr::Lit(ExprLit { lit: Lit::Str(path), .. }) => path.parse_with(Path::parse_mod_style).map_err(|_| {
            Error::new(
                path.span(),
                format!(
                    "`crate` must hold a path, such as `crate = \"::lockmacro_runtime\"`; `{:?}` is not a path",
                    path.value()
                ),
            )
        }),
        Expr::Path(path) => Err(Error::new_spanned(
            path,
            format!(
                "`crate` takes its path as a string literal; write `crate = \"{}\"`",
                path.to_token_stream().to_string().replace(' ', "")
            ),
        )),
        other => Err(Error::new_spanned(
            other,
            "`crate` takes a string literal holding a path; write `crate = \"::lockmacro_runtime\"`",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::{DurationError, Renewals, parse_duration};
    use quote::quote;

    #[test]
    fn duration_units() {
        assert_eq!(parse_duration("500ms"), Ok(500));
        assert_eq!(parse_duration("3s"), Ok(3_000));
        assert_eq!(parse_duration("2m"), Ok(120_000));
        assert_eq!(parse_duration("0s"), Ok(0));
        assert_eq!(parse_duration("007ms"), Ok(7));
    }

    #[test]
    fn duration_refusals() {
        assert_eq!(parse_duration(""), Err(DurationError::NoNumber));
        assert_eq!(parse_duration("s"), Err(DurationError::NoNumber));
        assert_eq!(parse_duration(" 3s"), Err(DurationError::NoNumber));
        assert_eq!(parse_duration("-3s"), Err(DurationError::NoNumber));
        assert_eq!(parse_duration("3"), Err(DurationError::NoUnit));
        assert_eq!(parse_duration("1.5s"), Err(DurationError::Fraction));
        assert_eq!(
            parse_duration("2h"),
            Err(DurationError::UnknownUnit("h".into()))
        );
        assert_eq!(
            parse_duration("3 s"),
            Err(DurationError::UnknownUnit(" s".into()))
        );
        assert_eq!(
            parse_duration("3S"),
            Err(DurationError::UnknownUnit("S".into()))
        );
        assert_eq!(
            parse_duration("99999999999999999999ms"),
            Err(DurationError::TooLarge)
        );
        assert_eq!(
            parse_duration("18446744073709551615s"),
            Err(DurationError::TooLarge)
        );
    }

    #[test]
    fn integer_ttl_is_seconds() {
        let config = super::Configuration::parse(quote!(prefix = "p", ttl = 3)).unwrap();
        assert_eq!(config.ttl_millis, Some(3_000));
        let config = super::Configuration::parse(quote!(ttl = "250ms", prefix = "p")).unwrap();
        assert_eq!(config.ttl_millis, Some(250));
    }

    #[test]
    fn renewals_and_defaults() {
        let config =
            super::Configuration::parse(quote!(prefix = "p", max_renewals = unlimited)).unwrap();
        assert_eq!(config.max_renewals, Some(Renewals::Unlimited));
        assert_eq!(config.ttl_millis, None);
        assert_eq!(config.wait_millis, None);
        assert!(!config.fencing);
        let config =
            super::Configuration::parse(quote!(prefix = "p", max_renewals = 0, wait = 1)).unwrap();
        assert_eq!(config.max_renewals, Some(Renewals::Limited(0)));
        assert_eq!(config.wait_millis, Some(1_000));
    }

    #[test]
    fn every_bad_argument_is_reported() {
        let error = super::Configuration::parse(quote!(ttl = 0, bogus = 1, wait = "2h", ttl = 1))
            .err()
            .unwrap();
        assert_eq!(error.into_iter().count(), 5);
    }
}
