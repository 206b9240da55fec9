//! Cross-site request forgery, for the page's one request that changes anything (a forced
//! release). A POST is accepted only when (1) the browser says it comes from the page's own
//! origin (`Sec-Fetch-Site: same-origin`, or, from a browser too old to send it, an `Origin`
//! naming the request's `Host`) and (2) its form carries the token the page was rendered with,
//! which must equal the token in the page's cookie.
//!
//! The token is bound to the browser that loaded the page: it lives in an `HttpOnly`,
//! `SameSite=Strict` cookie (no other site's request carries it, no script reads it) and in the
//! page itself (no other site can read the page). It is not bound to a user: the page does not
//! know the application's users; the application's own auth layer decides who reaches the page
//! at all. Being stateless, it works across several instances of the application behind one
//! load balancer. A cookie planted by a sibling subdomain (the weakness of a plain
//! double-submit cookie) is stopped by (1): such a request is `same-site`, not `same-origin`.

use axum::http::{HeaderMap, HeaderValue, header};

/// The cookie holding the token.
pub(crate) const COOKIE: &str = "lockmacro_locks_csrf";

/// A token: 32 hexadecimal digits, 122 random bits.
fn is_token(value: &str) -> bool {
    value.len() == 32 && value.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The token for a page about to be rendered: the browser's own when its cookie holds one
/// (so pages open in several tabs keep working), else a new one with the `Set-Cookie` to send.
/// Without `Path`, the cookie is scoped by the browser to the page's directory, which holds
/// the page's release endpoint also when a proxy rewrites the path.
pub(crate) fn token_for(headers: &HeaderMap) -> (String, Option<HeaderValue>) {
    if let Some(token) = cookie(headers, COOKIE).filter(|token| is_token(token)) {
        return (token.to_owned(), None);
    }
    let token = uuid::Uuid::new_v4().simple().to_string();
    let set_cookie =
        HeaderValue::from_str(&format!("{COOKIE}={token}; HttpOnly; SameSite=Strict")).ok();
    (token, set_cookie)
}

/// Why a forced release was refused, for the 403's body.
pub(crate) fn refusal(headers: &HeaderMap, form_token: &str) -> Option<&'static str> {
    if !same_origin(headers) {
        return Some("refused: the request did not come from this page's origin");
    }
    match cookie(headers, COOKIE) {
        Some(token) if is_token(token) && equal(token.as_bytes(), form_token.as_bytes()) => None,
        _ => Some("refused: the page's token is missing or stale; reload the page"),
    }
}

/// What the browser says about where the request comes from. A request with neither header
/// is not from a browser, so not a forgery (the token is still required).
fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return site == "same-origin";
    }
    match headers.get(header::ORIGIN) {
        None => true,
        Some(origin) => {
            let host = headers
                .get(header::HOST)
                .and_then(|host| host.to_str().ok());
            let origin_host = origin
                .to_str()
                .ok()
                .and_then(|origin| origin.split_once("://"))
                .map(|(_, authority)| authority);
            matches!((origin_host, host), (Some(origin), Some(host)) if origin.eq_ignore_ascii_case(host))
        }
    }
}

/// The value of cookie `name`, from every `Cookie` header.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// Compares in time independent of where the two differ.
fn equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue, header};

    use super::{COOKIE, refusal, token_for};

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn a_new_browser_gets_a_new_token_in_a_strict_http_only_cookie() {
        let (token, set_cookie) = token_for(&HeaderMap::new());
        let set_cookie = set_cookie.unwrap();
        let set_cookie = set_cookie.to_str().unwrap();
        assert_eq!(token.len(), 32);
        assert!(set_cookie.starts_with(&format!("{COOKIE}={token};")));
        assert!(set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"));
        let (again, _) = token_for(&HeaderMap::new());
        assert_ne!(token, again, "tokens are random");
    }

    #[test]
    fn a_browser_keeps_its_token() {
        let token = "0123456789abcdef0123456789abcdef";
        let cookie = format!("theme=dark; {COOKIE}={token}");
        let (kept, set_cookie) = token_for(&headers(&[("cookie", &cookie)]));
        assert_eq!(kept, token);
        assert!(set_cookie.is_none());
        let (replaced, set_cookie) =
            token_for(&headers(&[("cookie", &format!("{COOKIE}=<script>"))]));
        assert_ne!(replaced, "<script>");
        assert!(set_cookie.is_some());
    }

    #[test]
    fn only_a_same_origin_request_with_the_cookies_token_passes() {
        let token = "0123456789abcdef0123456789abcdef";
        let cookie = format!("{COOKIE}={token}");
        let same = [
            ("cookie", cookie.as_str()),
            ("sec-fetch-site", "same-origin"),
        ];
        assert_eq!(refusal(&headers(&same), token), None);
        assert!(refusal(&headers(&same), "0123456789abcdef0123456789abcdee").is_some());
        assert!(refusal(&headers(&same), "").is_some());
        assert!(refusal(&headers(&same[1..]), token).is_some(), "no cookie");
        for site in ["same-site", "cross-site", "none"] {
            let request = headers(&[("cookie", &cookie), ("sec-fetch-site", site)]);
            assert!(refusal(&request, token).is_some(), "{site}");
        }
        let old_browser = |origin: &str| {
            headers(&[
                ("cookie", &cookie),
                ("origin", origin),
                (header::HOST.as_str(), "admin.example:8080"),
            ])
        };
        assert_eq!(
            refusal(&old_browser("https://admin.example:8080"), token),
            None
        );
        assert!(refusal(&old_browser("https://evil.example"), token).is_some());
        assert!(refusal(&old_browser("null"), token).is_some());
        // Not a browser (curl, a script): no forgery possible, the token still required.
        assert_eq!(refusal(&headers(&[("cookie", &cookie)]), token), None);
    }
}
