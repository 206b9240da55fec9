//! Lock keys: `"{prefix}:{key}"`, checked before any I/O.

use std::fmt::{Display, Write};

use crate::LockError;

/// The longest lock key accepted, in bytes (Redis itself takes 512 MiB; a lock key this long is a bug).
pub const MAX_KEY_LEN: usize = 64 * 1024;

/// The most keys one lock may cover (`key = [...]`, [`LockClient::run_locked_many`]), counted
/// once each: a lock over more is [`LockError::InvalidKey`] before any I/O. It bounds how long
/// one script blocks Redis and how many release channels a waiter may listen on.
///
/// [`LockClient::run_locked_many`]: crate::LockClient::run_locked_many
pub const MAX_KEYS: usize = 64;

/// Checks every key of a multi-key lock and drops repeats (the first of equal keys stays, in
/// the order given): at least one key, at most [`MAX_KEYS`] distinct ones.
pub(crate) fn key_list(keys: impl IntoIterator<Item = String>) -> Result<Vec<String>, LockError> {
    let mut distinct: Vec<String> = Vec::new();
    for key in keys {
        let key = check_key(key)?;
        if !distinct.contains(&key) {
            if distinct.len() == MAX_KEYS {
                return Err(invalid(
                    &distinct[0],
                    "a lock covers at most 64 distinct keys (`MAX_KEYS`); split the work",
                ));
            }
            distinct.push(key);
        }
    }
    if distinct.is_empty() {
        return Err(invalid(
            "",
            "a lock over a list of keys needs at least one key",
        ));
    }
    Ok(distinct)
}

/// Renders `"{prefix}:{key}"`, rejecting a key part that renders empty.
pub(crate) fn prefixed_key(prefix: &str, key: &dyn Display) -> Result<String, LockError> {
    let mut rendered = String::with_capacity(prefix.len() + 24);
    rendered.push_str(prefix);
    rendered.push(':');
    // Writing into a String only fails if the Display impl itself reports an error.
    if write!(rendered, "{key}").is_err() {
        return Err(invalid(
            &rendered,
            "its `Display` implementation returned an error",
        ));
    }
    if rendered.len() == prefix.len() + 1 {
        return Err(invalid(
            &rendered,
            "the `key` part rendered empty, which would serialise every such call on one lock",
        ));
    }
    check_key(rendered)
}

/// Accepts a complete key that is non-empty and at most [`MAX_KEY_LEN`] bytes.
pub(crate) fn check_key(key: String) -> Result<String, LockError> {
    if key.is_empty() {
        Err(invalid(&key, "a lock key must not be empty"))
    } else if key.len() > MAX_KEY_LEN {
        Err(invalid(&key, "a lock key must be at most 64 KiB"))
    } else {
        Ok(key)
    }
}

fn invalid(key: &str, reason: &'static str) -> LockError {
    const SHOWN: usize = 80;
    let shown: String = key.chars().take(SHOWN).collect();
    let key = if shown.len() < key.len() {
        format!("{shown}… ({} bytes)", key.len())
    } else {
        shown
    };
    LockError::InvalidKey { key, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prefix_colon_key() {
        assert_eq!(prefixed_key("Business1", &1024).unwrap(), "Business1:1024");
    }

    #[test]
    fn rejects_empty_key_part() {
        let err = prefixed_key("Business1", &"").unwrap_err();
        assert!(matches!(err, LockError::InvalidKey { .. }), "{err}");
    }

    #[test]
    fn rejects_overlong_key_with_a_short_message() {
        let err = prefixed_key("p", &"x".repeat(1 << 20)).unwrap_err();
        assert!(matches!(err, LockError::InvalidKey { .. }));
        assert!(err.to_string().len() < 300, "{err}");
    }

    #[test]
    fn key_lists_drop_repeats_and_keep_within_the_limit() {
        let keys = |n: usize| (0..n).map(|i| format!("k:{i}"));
        assert_eq!(
            key_list(["b", "a", "b"].map(String::from)).unwrap(),
            ["b", "a"]
        );
        assert_eq!(key_list(keys(MAX_KEYS)).unwrap().len(), MAX_KEYS);
        assert_eq!(
            key_list(keys(MAX_KEYS).chain(keys(MAX_KEYS)))
                .unwrap()
                .len(),
            MAX_KEYS
        );
        for refused in [
            key_list(keys(MAX_KEYS + 1)),
            key_list(keys(0)),
            key_list([String::new()]),
        ] {
            assert!(
                matches!(refused, Err(LockError::InvalidKey { .. })),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn accepts_the_longest_key() {
        assert!(check_key("k".repeat(MAX_KEY_LEN)).is_ok());
        assert!(check_key(String::new()).is_err());
    }
}
