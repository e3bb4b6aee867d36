//! What reaches the user's terminal: text from files or from a remote dataplane (route ids,
//! hosts, an admin listener's error body) may hold escape sequences that would retitle the
//! window, rewrite earlier lines or hide text. Every text the CLI prints goes through
//! [`sanitize`] first.

use std::borrow::Cow;

/// `text` with every control character except newline and tab (C0, DEL, C1: ESC, CR, BEL,
/// ...) and every bidirectional override or isolate (which reorder what is shown) replaced
/// by its `\u{..}` escape; text without them is returned as is.
pub fn sanitize(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_unsafe(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn is_unsafe(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_overrides_are_escaped_and_the_rest_kept() {
        for (raw, shown) in [
            ("\u{1b}]0;pwned\u{7}", "\\u{1b}]0;pwned\\u{7}"),
            ("a\u{1b}[2Jb", "a\\u{1b}[2Jb"),
            ("over\rwrite", "over\\u{d}write"),
            ("c1 \u{9b}31m", "c1 \\u{9b}31m"),
            ("del\u{7f}", "del\\u{7f}"),
            ("rtl \u{202e}gnp.exe", "rtl \\u{202e}gnp.exe"),
            ("iso \u{2066}x\u{2069}", "iso \\u{2066}x\\u{2069}"),
        ] {
            assert_eq!(sanitize(raw), shown, "{raw:?}");
        }
        for kept in ["plain", "two\nlines\tand tab", "héllo → 世界 🚀"] {
            assert!(matches!(sanitize(kept), Cow::Borrowed(_)), "{kept:?}");
        }
    }
}
