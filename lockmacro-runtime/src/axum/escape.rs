//! One home for escaping: every key, holder and message the page or a response shows is user
//! data (a key can hold `<script>`), and goes through one of these on its way out.

use std::fmt::Write;

/// `text` safe as HTML text and as a quoted attribute value: `& < > " '` as entities.
pub(crate) fn html(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// `text` as a JSON string, quotes included. `<` is escaped too, so the JSON stays inert if
/// it ever lands inside HTML.
pub(crate) fn json_string(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len() + 2);
    escaped.push('"');
    for c in text.chars() {
        match c {
            '"' => escaped.push_str("\\\""),
            '\\' => escaped.push_str("\\\\"),
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            '\t' => escaped.push_str("\\t"),
            '<' => escaped.push_str("\\u003c"),
            c if c.is_control() => {
                let _ = write!(escaped, "\\u{:04x}", c as u32);
            }
            c => escaped.push(c),
        }
    }
    escaped.push('"');
    escaped
}

/// `value` percent-encoded for a URL's query string.
pub(crate) fn query_value(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::{html, json_string, query_value};

    #[test]
    fn html_escapes_markup_and_quotes() {
        assert_eq!(
            html(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
    }

    #[test]
    fn json_escapes_quotes_backslashes_and_controls() {
        assert_eq!(
            json_string("a\"b\\c\n\u{1}</script>é"),
            r#""a\"b\\c\n\u0001\u003c/script>é""#
        );
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(query_value("a b&c=d/é"), "a+b%26c%3Dd%2F%C3%A9");
    }
}
