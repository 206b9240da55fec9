//! What reaches the terminal: a key, a holder's host or application name, a token hint and a
//! server's answer are whatever someone wrote to Redis, so their control characters are shown
//! as escapes, never sent to the terminal (an `ESC [2J` in a key would clear the screen).

use std::borrow::Cow;
use std::fmt::Write;

/// `text` as printed in human output: control characters as `\x1b` (below 0x80) or `\u{9b}`,
/// as are the invisible marks that reorder a line (bidi overrides), and `\` as `\\`, so an
/// escape in the output always stands for the character, never for itself (as `ls -b`).
pub(crate) fn escaped(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c == '\\' || hidden(c)) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        let _ = match c {
            '\\' => write!(shown, "\\\\"),
            c if hidden(c) && c.is_ascii() => write!(shown, "\\x{:02x}", u32::from(c)),
            c if hidden(c) => write!(shown, "\\u{{{:x}}}", u32::from(c)),
            c => write!(shown, "{c}"),
        };
    }
    Cow::Owned(shown)
}

/// A JSON value as one line: serde_json escapes the control characters below 0x20; the others
/// that [`escaped`] hides (DEL, the C1 controls, bidi overrides) become `\u00XX` escapes too,
/// so the line is safe on a terminal and still the same JSON. They can only stand inside a JSON
/// string (outside strings JSON is ASCII), where `\uXXXX` means the same character.
pub(crate) fn json_line(value: &serde_json::Value) -> String {
    let text = value.to_string();
    if !text.chars().any(hidden) {
        return text;
    }
    let mut safe = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        let _ = match c {
            // Every hidden character is in the Basic Multilingual Plane: one `\uXXXX`.
            c if hidden(c) => write!(safe, "\\u{:04x}", u32::from(c)),
            c => write!(safe, "{c}"),
        };
    }
    safe
}

/// A character a terminal acts on or hides instead of showing: a control character (C0, DEL,
/// C1), or a mark that changes the direction of the text around it.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::{escaped, json_line};

    #[test]
    fn control_characters_and_backslashes_are_escaped() {
        assert_eq!(escaped("orders:1"), "orders:1");
        assert_eq!(
            escaped("evil\u{1b}[2J\u{1b}[31m:1"),
            "evil\\x1b[2J\\x1b[31m:1"
        );
        assert_eq!(escaped("a\nb\tc\u{7f}"), "a\\x0ab\\x09c\\x7f");
        assert_eq!(escaped("csi\u{9b}2J"), "csi\\u{9b}2J");
        assert_eq!(escaped("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(escaped("C:\\x1b"), "C:\\\\x1b");
        assert_eq!(escaped("naïve ключ 鍵"), "naïve ключ 鍵");
    }

    #[test]
    fn json_lines_stay_the_same_json_and_hide_nothing() {
        let value = serde_json::json!({"key": "a\u{1b}b\u{7f}c\u{9b}d\u{202e}e\\f\"g"});
        let line = json_line(&value);
        assert!(
            line.chars().all(|c| !c.is_control() && c != '\u{202e}'),
            "{line}"
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&line).unwrap(),
            value
        );
    }
}
