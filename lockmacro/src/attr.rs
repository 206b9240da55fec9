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

use crate::valid::{Errors, Parameters};

mod kw {
    syn::custom_keyword!(prefix);
    syn::custom_keyword!(key);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(max_renewals);
    syn::custom_keyword!(wait);
    syn::custom_keyword!(hold_at_least);
    syn::custom_keyword!(client);
    syn::custom_keyword!(fencing);
    syn::custom_keyword!(mode);
    syn::custom_keyword!(permits);
    syn::custom_keyword!(fair);
    syn::custom_keyword!(unlimited);
    syn::custom_keyword!(read);
    syn::custom_keyword!(write);
}

/// What one `#[redis_lock(...)]` asks for, every value checked.
pub(crate) struct Configuration {
    /// Path of the runtime crate in generated code, when `crate = "..."` names it.
    pub(crate) krate: Option<Path>,
    /// The key namespace, non-empty.
    pub(crate) prefix: LitStr,
    /// The user's key expression, if any.
    pub(crate) key: Option<Expr>,
    /// The user's client expression, if any.
    pub(crate) client: Option<Expr>,
    /// Lease length; `None` keeps the runtime's default.
    pub(crate) ttl: Option<Length>,
    /// `None` keeps the runtime's default.
    pub(crate) max_renewals: Option<Renewals>,
    /// How long to wait for a busy lock; `None` fails fast.
    pub(crate) wait: Option<Length>,
    /// How long after it was taken the key is kept at least; `None` frees it at release.
    pub(crate) hold_at_least: Option<Length>,
    /// Whether to hand out fencing tokens.
    pub(crate) fencing: bool,
    /// Who may hold the key at once; `None` is exclusive.
    pub(crate) kind: Option<Kind>,
    /// Whether waiters are served in arrival order.
    pub(crate) fair: bool,
}

/// A length of time given to `ttl`, `wait` or `hold_at_least`.
pub(crate) enum Length {
    /// A literal, checked here: milliseconds, non-zero.
    Millis(u64),
    /// Any other expression (`LOCK_TTL`, `self.wait`, `Duration::from_secs(5)`): a `Duration`
    /// or integer seconds, evaluated when called and checked then.
    Expr(Expr),
}

/// The lock kind asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
    Permits(u32),
}

/// The value of `max_renewals`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewals {
    Limited(u32),
    Unlimited,
}

impl Configuration {
    /// Reads the attribute's arguments, reporting every bad one at once. `parameters` are the
    /// names the function binds, when it is one, for the check of `key`.
    pub(crate) fn parse(tokens: TokenStream, parameters: Option<&Parameters>) -> syn::Result<Self> {
        let mut fields = Fields {
            parameters,
            ..Fields::default()
        };
        let mut errors = Errors::default();
        let parsed = (|input: ParseStream| fields.parse_all(input, &mut errors)).parse2(tokens);
        match parsed {
            Err(syntax) => errors.push(syntax),
            Ok(()) if !fields.seen.contains(&Argument::Prefix) => errors.push(missing_prefix()),
            Ok(()) => {}
        }
        fields.key_list_clashes(&mut errors);
        errors.finish()?;
        Ok(Self {
            krate: fields.krate,
            prefix: fields.prefix.ok_or_else(missing_prefix)?,
            key: fields.key,
            client: fields.client,
            ttl: fields.ttl,
            max_renewals: fields.max_renewals,
            wait: fields.wait,
            hold_at_least: fields.hold_at_least,
            fencing: fields.fencing,
            kind: fields.mode.or(fields.permits),
            fair: fields.fair,
        })
    }
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
    HoldAtLeast,
    Client,
    Fencing,
    Mode,
    Permits,
    Fair,
    Crate,
}

/// The names other lock libraries give what an argument does, and what they mean here.
const OTHER_NAMES: &[(&[&str], &str)] = &[
    (
        &["timeout", "lock_timeout", "acquire_timeout"],
        "`wait` (how long to wait for a busy lock) or `ttl` (the lease length)",
    ),
    (
        &[
            "lease",
            "lease_time",
            "expire",
            "expiry",
            "expires",
            "lock_at_most_for",
        ],
        "`ttl`",
    ),
    (
        &[
            "wait_time",
            "wait_timeout",
            "try_for",
            "retries",
            "retry_count",
        ],
        "`wait`",
    ),
    (
        &[
            "renewals",
            "max_renew",
            "try_count",
            "renew_count",
            "max_extensions",
        ],
        "`max_renewals`",
    ),
    (
        &["lock_at_least_for", "min_hold", "hold", "hold_for"],
        "`hold_at_least`",
    ),
    (&["name", "namespace", "key_prefix"], "`prefix`"),
    (&["keys"], "`key`"),
    (&["fence", "fencing_token", "fenced"], "`fencing`"),
    (&["semaphore", "max_holders", "permit"], "`permits`"),
    (
        &["read", "write", "shared", "kind", "read_only"],
        "`mode = read`",
    ),
    (&["fifo", "ordered", "queued"], "`fair = true`"),
];

/// What an unknown argument most likely meant: an argument spelled another way (`max_renewal`,
/// `maxRenewals`) or named as another library names it (`timeout`).
fn did_you_mean(unknown: &str) -> Option<String> {
    let lowered = unknown.to_lowercase();
    if let Some((_, meant)) = OTHER_NAMES
        .iter()
        .find(|(names, _)| names.contains(&lowered.as_str()))
    {
        return Some((*meant).to_owned());
    }
    // Case and underscores aside, at most one edit in three letters (as rustc's suggestions).
    let bare = |name: &str| name.to_lowercase().replace('_', "");
    let unknown = bare(unknown);
    ARGUMENT_NAMES
        .iter()
        .map(|name| (edit_distance(&unknown, &bare(name)), name))
        .filter(|(distance, _)| *distance <= unknown.chars().count().max(3) / 3)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| format!("`{name}`"))
}

/// `` `prefix`, `key`, ... ``, for "expected one of" messages.
fn valid_names() -> String {
    ARGUMENT_NAMES.map(|name| format!("`{name}`")).join(", ")
}

const ARGUMENT_NAMES: [&str; 12] = [
    "prefix",
    "key",
    "ttl",
    "max_renewals",
    "wait",
    "hold_at_least",
    "client",
    "fencing",
    "mode",
    "permits",
    "fair",
    "crate",
];

/// Levenshtein distance: insertions, deletions and substitutions.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, a) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, b) in b.iter().enumerate() {
            let substituted = diagonal + usize::from(a != *b);
            diagonal = row[j + 1];
            row[j + 1] = substituted.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

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
        } else if input.peek(kw::hold_at_least) {
            Self::HoldAtLeast
        } else if input.peek(kw::client) {
            Self::Client
        } else if input.peek(kw::fencing) {
            Self::Fencing
        } else if input.peek(kw::mode) {
            Self::Mode
        } else if input.peek(kw::permits) {
            Self::Permits
        } else if input.peek(kw::fair) {
            Self::Fair
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
            Self::HoldAtLeast => "hold_at_least = \"5m\"",
            Self::Client => "client = self.locks",
            Self::Fencing => "fencing = true",
            Self::Mode => "mode = read",
            Self::Permits => "permits = 3",
            Self::Fair => "fair = true",
            Self::Crate => "crate = \"::lockmacro_runtime\"",
        }
    }
}

/// The arguments read so far.
#[derive(Default)]
struct Fields<'f> {
    /// What the function's parameters are called, when the item is a function.
    parameters: Option<&'f Parameters>,
    seen: Vec<Argument>,
    krate: Option<Path>,
    prefix: Option<LitStr>,
    key: Option<Expr>,
    client: Option<Expr>,
    ttl: Option<Length>,
    max_renewals: Option<Renewals>,
    wait: Option<Length>,
    hold_at_least: Option<Length>,
    fencing: bool,
    /// `mode = ...` and where it was written, for the clash with `permits`.
    mode: Option<Kind>,
    mode_span: Option<Span>,
    permits: Option<Kind>,
    permits_span: Option<Span>,
    fair: bool,
    /// Where `fencing = true` and `fair = true` were written, for the clash with a key list.
    fencing_span: Option<Span>,
    fair_span: Option<Span>,
}

impl Fields<'_> {
    /// Reads `name = value, ...`. Bad values go to `errors`; broken syntax ends the reading.
    fn parse_all(&mut self, input: ParseStream<'_>, errors: &mut Errors) -> syn::Result<()> {
        while !input.is_empty() {
            let argument = Argument::peek(input);
            if !input.peek(Ident::peek_any) {
                return Err(input.error(format!(
                    "expected an argument name in `#[redis_lock]`, one of {}",
                    valid_names()
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
            let message = match did_you_mean(&name.to_string()) {
                Some(meant) => {
                    format!("unknown argument `{name}` in `#[redis_lock]`; did you mean {meant}?")
                }
                None => format!(
                    "unknown argument `{name}` in `#[redis_lock]`; expected one of {}",
                    valid_names()
                ),
            };
            return Err(Error::new(name.span(), message));
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
            Argument::Key => self.key = Some(key(value, self.parameters)?),
            Argument::Ttl => self.ttl = Some(ttl(value)?),
            Argument::MaxRenewals => self.max_renewals = Some(max_renewals(&value)?),
            Argument::Wait => self.wait = Some(wait(value)?),
            Argument::HoldAtLeast => self.hold_at_least = Some(hold_at_least(value)?),
            Argument::Client => self.client = Some(value),
            Argument::Fencing => {
                self.fencing = boolean("fencing", &value)?;
                self.fencing_span = self.fencing.then(|| name.span());
            }
            Argument::Mode => {
                self.mode_span = Some(name.span());
                self.mode = Some(mode(&value)?);
                self.clash()?;
            }
            Argument::Permits => {
                self.permits_span = Some(name.span());
                self.permits = Some(permits(&value)?);
                self.clash()?;
            }
            Argument::Fair => {
                self.fair = boolean("fair", &value)?;
                self.fair_span = self.fair.then(|| name.span());
            }
            Argument::Crate => self.krate = Some(crate_path(&value)?),
        }
        Ok(())
    }

    /// A lock over a list of keys is exclusive, unfenced and not fair: each argument that asks
    /// otherwise is an error at its own name.
    fn key_list_clashes(&self, errors: &mut Errors) {
        if !matches!(self.key, Some(Expr::Array(_))) {
            return;
        }
        let clashes = [
            (
                self.mode_span.filter(|_| self.mode == Some(Kind::Read)),
                "`mode = read` cannot be combined with a list of keys: a lock over several keys is \
                 exclusive; lock one key to share it with readers, or remove `mode`",
            ),
            (
                self.permits_span,
                "`permits` cannot be combined with a list of keys: a lock over several keys is \
                 exclusive; lock one key as a semaphore, or remove `permits`",
            ),
            (
                self.fencing_span,
                "`fencing = true` cannot be combined with a list of keys: a lock over several keys \
                 hands out no fencing token; fence with a lock on one key, or remove `fencing`",
            ),
            (
                self.fair_span,
                "`fair = true` cannot be combined with a list of keys: waiters for several keys are \
                 not served in arrival order; lock one key, or remove `fair`",
            ),
        ];
        for (span, message) in clashes {
            if let Some(span) = span {
                errors.push(Error::new(span, message));
            }
        }
    }

    /// `mode` and `permits` together make no sense: a semaphore's holders share it already.
    fn clash(&self) -> syn::Result<()> {
        match (self.mode_span, self.permits_span) {
            (Some(mode), Some(permits)) => {
                let mut error = Error::new(
                    permits,
                    "`permits` cannot be combined with `mode`: a semaphore's holders already share \
                     the key; remove `mode`",
                );
                error.combine(Error::new(mode, "`mode` given here"));
                Err(error)
            }
            _ => Ok(()),
        }
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
        }) if prefix.value().ends_with(':') => Err(Error::new(
            prefix.span(),
            format!(
                "`prefix` must not end with `:`; the attribute puts the `:` between prefix and key \
                 (`prefix = \"books\", key = id` makes `books:<id>`); write `prefix = {:?}`",
                prefix.value().trim_end_matches(':')
            ),
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

/// Any expression over the parameters; a bracketed list (`key = [from.id, to.id]`, several keys
/// at once) names at least one key. Each part is checked where it is written: an empty string
/// literal, or a lone name that is no parameter.
fn key(value: Expr, parameters: Option<&Parameters>) -> syn::Result<Expr> {
    let parts: Vec<&Expr> = match &value {
        Expr::Array(list) if list.elems.is_empty() => {
            return Err(Error::new_spanned(
                list,
                "`key = []` names no key; list the keys to lock together, such as \
                 `key = [from.id, to.id]`, or omit `key` to lock the prefix alone",
            ));
        }
        Expr::Array(list) => list.elems.iter().collect(),
        other => vec![other],
    };
    let mut errors = Errors::default();
    for part in parts {
        if let Expr::Lit(ExprLit {
            lit: Lit::Str(text),
            ..
        }) = part
            && text.value().is_empty()
        {
            errors.push(Error::new(
                text.span(),
                "`key` must not be an empty string: every call would be refused with \
                 `LockError::InvalidKey`; name what to lock, such as `key = user_id`, or omit \
                 `key` to lock the prefix alone",
            ));
        }
        if let Some(Err(error)) = parameters.map(|parameters| parameters.check_key_part(part)) {
            errors.push(error);
        }
    }
    errors.finish()?;
    Ok(value)
}

fn ttl(value: Expr) -> syn::Result<Length> {
    length(
        "ttl",
        value,
        "`ttl` must be greater than zero; write a lease length such as `ttl = 30`",
    )
}

fn wait(value: Expr) -> syn::Result<Length> {
    length(
        "wait",
        value,
        "`wait` must be greater than zero; omit `wait` to fail fast when the lock is busy",
    )
}

fn hold_at_least(value: Expr) -> syn::Result<Length> {
    length(
        "hold_at_least",
        value,
        "`hold_at_least` must be greater than zero; omit `hold_at_least` to free the key at release",
    )
}

/// A literal is checked now (`if_zero` when it is zero); anything else is an expression of
/// type `Duration` or integer seconds, checked when called.
fn length(argument: &str, value: Expr, if_zero: &str) -> syn::Result<Length> {
    if !matches!(value, Expr::Lit(_)) {
        return Ok(Length::Expr(value));
    }
    match duration_millis(argument, &value)? {
        0 => Err(Error::new_spanned(&value, if_zero)),
        millis => Ok(Length::Millis(millis)),
    }
}

/// `3` (seconds) or `"500ms"` / `"3s"` / `"2m"` / `"1h"`, in milliseconds.
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
                "`{argument}` must be an integer of seconds, a string with a unit `ms`, `s`, `m` or `h`, \
                 or an expression of type `Duration`; write `{argument} = 3`, `{argument} = \"500ms\"` \
                 or `{argument} = LOCK_TTL`"
            ),
        )),
    }
}

fn is_unit(suffix: &str) -> bool {
    matches!(suffix, "ms" | "s" | "m" | "h")
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
    /// A duration written another way (`"5 s"`, `"5sec"`, `"2d"`): how to write it.
    Respell(String),
    UnknownUnit(String),
    TooLarge,
}

impl DurationError {
    fn message(&self, argument: &str) -> String {
        match self {
            Self::NoNumber => format!(
                "`{argument}` must be a whole number followed by a unit `ms`, `s`, `m` or `h`, such as `{argument} = \"500ms\"`"
            ),
            Self::Fraction => format!(
                "`{argument}` takes whole numbers; use a smaller unit, such as `{argument} = \"1500ms\"` for 1.5 s"
            ),
            Self::NoUnit => format!(
                "`{argument}` needs a unit after the number: `ms`, `s`, `m` or `h`, such as `{argument} = \"3s\"`; or write the integer `{argument} = 3` for seconds"
            ),
            Self::Respell(instead) => format!(
                "`{argument}` takes a whole number directly followed by `ms`, `s`, `m` or `h`; write `{argument} = \"{instead}\"`"
            ),
            Self::UnknownUnit(unit) => format!(
                "unknown unit `{unit}` in `{argument}`; use `ms`, `s`, `m` or `h`, such as `{argument} = \"500ms\"`"
            ),
            Self::TooLarge => {
                format!("`{argument}` is too large; it must fit in a `u64` of milliseconds")
            }
        }
    }
}

/// `"500ms"`, `"3s"`, `"2m"` or `"1h"` in milliseconds: digits, then the unit, nothing else. A
/// duration written another way that means one (`"5 s"`, `"2 mins"`, `"1d"`) is refused with
/// how to write it.
fn parse_duration(text: &str) -> Result<u64, DurationError> {
    strict_duration(text).map_err(|error| match (&error, respelled(text)) {
        (DurationError::NoNumber | DurationError::UnknownUnit(_), Some(instead)) => {
            DurationError::Respell(instead)
        }
        _ => error,
    })
}

/// `text` in this attribute's spelling, when it is a whole number and a unit spelled another
/// way: spaces around, a word for the unit, capitals, days.
fn respelled(text: &str) -> Option<String> {
    let text = text.trim();
    let digits_end = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = text.split_at(digits_end);
    let number: u64 = digits.parse().ok()?;
    Some(match unit.trim().to_lowercase().as_str() {
        "ms" | "msec" | "msecs" | "millis" | "millisecond" | "milliseconds" => {
            format!("{number}ms")
        }
        "s" | "sec" | "secs" | "second" | "seconds" => format!("{number}s"),
        "m" | "min" | "mins" | "minute" | "minutes" => format!("{number}m"),
        "h" | "hr" | "hrs" | "hour" | "hours" => format!("{number}h"),
        "d" | "day" | "days" => format!("{}h", number.checked_mul(24)?),
        _ => return None,
    })
}

fn strict_duration(text: &str) -> Result<u64, DurationError> {
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
        "h" => 3_600_000,
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

fn boolean(argument: &str, value: &Expr) -> syn::Result<bool> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(flag),
            ..
        }) => Ok(flag.value),
        other => Err(Error::new_spanned(
            other,
            format!("`{argument}` must be `true` or `false`; write `{argument} = true`"),
        )),
    }
}

fn mode(value: &Expr) -> syn::Result<Kind> {
    if let Ok(kw::read { .. }) = syn::parse2(value.to_token_stream()) {
        return Ok(Kind::Read);
    }
    if let Ok(kw::write { .. }) = syn::parse2(value.to_token_stream()) {
        return Ok(Kind::Write);
    }
    Err(Error::new_spanned(
        value,
        "`mode` must be `read` or `write`; write `mode = read` to share the key with other readers",
    ))
}

fn permits(value: &Expr) -> syn::Result<Kind> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(count),
            ..
        }) if count.suffix().is_empty() => match count.base10_parse::<u32>() {
            Ok(0) => Err(Error::new(
                count.span(),
                "`permits` must be at least 1; a semaphore of no permits is never free",
            )),
            Ok(permits) => Ok(Kind::Permits(permits)),
            Err(_) => Err(Error::new(count.span(), "`permits` must fit in a `u32`")),
        },
        other => Err(Error::new_spanned(
            other,
            "`permits` must be a positive integer literal; write `permits = 3`",
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
impl Configuration {
    /// The arguments alone, as for an item that is no function.
    fn parse_arguments(tokens: TokenStream) -> syn::Result<Self> {
        Self::parse(tokens, None)
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
        assert_eq!(parse_duration("2h"), Ok(7_200_000));
        assert_eq!(parse_duration("0s"), Ok(0));
        assert_eq!(parse_duration("007ms"), Ok(7));
    }

    #[test]
    fn duration_refusals() {
        assert_eq!(parse_duration(""), Err(DurationError::NoNumber));
        assert_eq!(parse_duration("s"), Err(DurationError::NoNumber));
        assert_eq!(
            parse_duration(" 3s"),
            Err(DurationError::Respell("3s".into()))
        );
        assert_eq!(parse_duration("-3s"), Err(DurationError::NoNumber));
        assert_eq!(parse_duration("3"), Err(DurationError::NoUnit));
        assert_eq!(parse_duration("1.5s"), Err(DurationError::Fraction));
        assert_eq!(
            parse_duration("2w"),
            Err(DurationError::UnknownUnit("w".into()))
        );
        for (written, instead) in [
            ("3 s", "3s"),
            ("3S", "3s"),
            ("2d", "48h"),
            ("5 mins", "5m"),
            ("250 Milliseconds", "250ms"),
        ] {
            assert_eq!(
                parse_duration(written),
                Err(DurationError::Respell(instead.into())),
                "{written}"
            );
        }
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
        let config = super::Configuration::parse_arguments(quote!(prefix = "p", ttl = 3)).unwrap();
        assert!(matches!(config.ttl, Some(super::Length::Millis(3_000))));
        let config =
            super::Configuration::parse_arguments(quote!(ttl = "250ms", prefix = "p")).unwrap();
        assert!(matches!(config.ttl, Some(super::Length::Millis(250))));
        let config =
            super::Configuration::parse_arguments(quote!(ttl = LOCK_TTL, prefix = "p")).unwrap();
        assert!(matches!(config.ttl, Some(super::Length::Expr(_))));
    }

    #[test]
    fn hold_at_least_takes_the_forms_of_ttl() {
        let config =
            super::Configuration::parse_arguments(quote!(prefix = "p", hold_at_least = "5m"))
                .unwrap();
        assert!(matches!(
            config.hold_at_least,
            Some(super::Length::Millis(300_000))
        ));
        let config =
            super::Configuration::parse_arguments(quote!(prefix = "p", hold_at_least = 2)).unwrap();
        assert!(matches!(
            config.hold_at_least,
            Some(super::Length::Millis(2_000))
        ));
        let config =
            super::Configuration::parse_arguments(quote!(prefix = "p", hold_at_least = HOLD))
                .unwrap();
        assert!(matches!(config.hold_at_least, Some(super::Length::Expr(_))));
        assert!(
            super::Configuration::parse_arguments(quote!(prefix = "p", hold_at_least = "0s"))
                .is_err()
        );
        assert!(
            super::Configuration::parse_arguments(quote!(prefix = "p", hold_at_least = 0)).is_err()
        );
        assert!(
            super::Configuration::parse_arguments(quote!(prefix = "p"))
                .unwrap()
                .hold_at_least
                .is_none()
        );
    }

    #[test]
    fn renewals_and_defaults() {
        let config =
            super::Configuration::parse_arguments(quote!(prefix = "p", max_renewals = unlimited))
                .unwrap();
        assert_eq!(config.max_renewals, Some(Renewals::Unlimited));
        assert!(config.ttl.is_none());
        assert!(config.wait.is_none());
        assert!(!config.fencing);
        let config =
            super::Configuration::parse_arguments(quote!(prefix = "p", max_renewals = 0, wait = 1))
                .unwrap();
        assert_eq!(config.max_renewals, Some(Renewals::Limited(0)));
        assert!(matches!(config.wait, Some(super::Length::Millis(1_000))));
    }

    #[test]
    fn kinds() {
        let config =
            super::Configuration::parse_arguments(quote!(prefix = "p", mode = read)).unwrap();
        assert_eq!(config.kind, Some(super::Kind::Read));
        let config =
            super::Configuration::parse_arguments(quote!(prefix = "p", permits = 3, fair = true))
                .unwrap();
        assert_eq!(config.kind, Some(super::Kind::Permits(3)));
        assert!(config.fair);
        assert!(
            super::Configuration::parse_arguments(quote!(prefix = "p", mode = read, permits = 2))
                .is_err()
        );
        assert!(super::Configuration::parse_arguments(quote!(prefix = "p", permits = 0)).is_err());
        assert!(
            super::Configuration::parse_arguments(quote!(prefix = "p", mode = banana)).is_err()
        );
        assert!(super::Configuration::parse_arguments(quote!(prefix = "p", fair = "yes")).is_err());
    }

    #[test]
    fn key_lists_name_a_key_and_are_exclusive() {
        let parse = |tokens| super::Configuration::parse_arguments(tokens).map(drop);
        assert!(parse(quote!(prefix = "p", key = [a, b], mode = write, wait = 3)).is_ok());
        assert!(parse(quote!(prefix = "p", key = [a])).is_ok());
        let empty = parse(quote!(prefix = "p", key = [])).unwrap_err();
        assert!(
            empty.to_string().contains("`key = []` names no key"),
            "{empty}"
        );
        let every = parse(quote!(
            prefix = "p",
            key = [a, b],
            mode = read,
            fencing = true,
            fair = true
        ))
        .unwrap_err();
        assert_eq!(
            every.into_iter().count(),
            3,
            "each clash at its own argument"
        );
        let permits = parse(quote!(prefix = "p", permits = 2, key = [a, b])).unwrap_err();
        assert!(
            permits.to_string().contains("`permits` cannot be combined"),
            "{permits}"
        );
        // Off, they clash with nothing; on one key, nothing clashes.
        assert!(
            parse(quote!(
                prefix = "p",
                key = [a, b],
                fencing = false,
                fair = false
            ))
            .is_ok()
        );
        assert!(parse(quote!(prefix = "p", key = a, mode = read, fencing = true)).is_ok());
    }

    #[test]
    fn near_misses_name_the_argument_meant() {
        assert_eq!(
            super::did_you_mean("max_renewal").as_deref(),
            Some("`max_renewals`")
        );
        assert_eq!(
            super::did_you_mean("maxRenewals").as_deref(),
            Some("`max_renewals`")
        );
        assert_eq!(super::did_you_mean("tll").as_deref(), Some("`ttl`"));
        assert_eq!(
            super::did_you_mean("holdAtLeast").as_deref(),
            Some("`hold_at_least`")
        );
        assert!(super::did_you_mean("timeout").unwrap().contains("`wait`"));
        assert_eq!(super::did_you_mean("bogus"), None);
        assert_eq!(super::did_you_mean("x"), None);
    }

    #[test]
    fn every_bad_argument_is_reported() {
        let error =
            super::Configuration::parse_arguments(quote!(ttl = 0, bogus = 1, wait = "2d", ttl = 1))
                .err()
                .unwrap();
        assert_eq!(error.into_iter().count(), 5);
    }
}
