//! The `--url`s, checked before the runtime reads them so that a mistake is named: redis-rs
//! says of every malformed URL only that it "did not parse".

/// The schemes the runtime reads: one server (TCP or a Unix socket), or the sentinels of one.
const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "valkey",
    "valkeys",
    "redis+unix",
    "valkey+unix",
    "unix",
    "redis+sentinel",
    "rediss+sentinel",
    "valkey+sentinel",
    "valkeys+sentinel",
];

/// What is wrong with `url`, if anything this check sees, said with the URL (its password
/// redacted) and what to write instead.
pub(crate) fn check(url: &str) -> Result<(), String> {
    let wrong = |why: String| Err(format!("cannot use `{}`: {why}", redacted(url)));
    let Some((scheme, _)) = url.split_once("://") else {
        return match url.split_once(':') {
            Some((scheme, rest)) if known(scheme) => wrong(format!(
                "`{scheme}:` is followed by `//`: write {}",
                redacted(&format!("{scheme}://{}", rest.trim_start_matches('/')))
            )),
            _ => wrong(format!(
                "missing scheme: write {}",
                redacted(&format!("redis://{url}"))
            )),
        };
    };
    if !known(scheme) {
        return wrong(format!(
            "unknown scheme `{scheme}://`: write redis:// (rediss:// for TLS), or \
             redis+sentinel:// (rediss+sentinel://) for the sentinels of a master"
        ));
    }
    if scheme.ends_with("+sentinel") {
        // The runtime reads the sentinels' host list itself, and says what is wrong with it.
        return Ok(());
    }
    match url::Url::parse(url) {
        Ok(_) => Ok(()),
        Err(error) => wrong(error.to_string()),
    }
}

fn known(scheme: &str) -> bool {
    SCHEMES.contains(&scheme.to_ascii_lowercase().as_str())
}

/// `url` safe to print: a password (after the first `:` of what comes before the last `@`) as
/// `***`, whether or not the rest reads as a URL.
pub(crate) fn redacted(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (&url[..scheme.len() + 3], rest),
        None => ("", url),
    };
    match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}{user}:***@{hosts}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{check, redacted};

    #[test]
    fn a_malformed_url_is_named_with_what_to_write() {
        assert_eq!(
            check("127.0.0.1:6501").unwrap_err(),
            "cannot use `127.0.0.1:6501`: missing scheme: write redis://127.0.0.1:6501"
        );
        assert_eq!(
            check(":s3cret@cache:6379").unwrap_err(),
            "cannot use `:***@cache:6379`: missing scheme: write redis://:***@cache:6379"
        );
        assert_eq!(
            check("redis:/cache:6379").unwrap_err(),
            "cannot use `redis:/cache:6379`: `redis:` is followed by `//`: write redis://cache:6379"
        );
        let http = check("http://:hunter2@nowhere").unwrap_err();
        assert!(http.starts_with("cannot use `http://:***@nowhere`: unknown scheme `http://`"));
        assert!(!http.contains("hunter2"), "{http}");
        assert_eq!(
            check("redis://user:pw@127.0.0.1:65536").unwrap_err(),
            "cannot use `redis://user:***@127.0.0.1:65536`: invalid port number"
        );
        for fine in [
            "redis://127.0.0.1:6379",
            "REDIS://127.0.0.1",
            "rediss://:pw@cache:6380/2#insecure",
            "valkey://cache",
            "unix:///run/redis.sock",
            "redis+sentinel://s1:26379,s2:26379/locks",
        ] {
            assert_eq!(check(fine), Ok(()), "{fine}");
        }
    }

    #[test]
    fn passwords_are_redacted_wherever_they_stand() {
        assert_eq!(redacted("redis://:pa/ss@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redacted("user:pw@h"), "user:***@h");
        assert_eq!(redacted("redis://user@h"), "redis://user@h");
        assert_eq!(redacted("redis://h:6379"), "redis://h:6379");
    }
}
