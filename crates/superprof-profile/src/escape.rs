//! Names made safe to print. Function, thread and module names come from the profiled
//! program or from a file, so they may hold line breaks, tabs or terminal escape sequences
//! (`\x1b[2J`...). Every text writer prints them through [`escape`], which writes control
//! characters the way strace and perf do (`\n`, `\t`, `\e`, `\xNN`) and keeps every other
//! character, UTF-8 included, as it is: a name takes one line and cannot drive the terminal.

use std::borrow::Cow;

/// `name` with its control characters escaped: `\n`, `\r`, `\t`, `\v`, `\f`, `\e` (ESC),
/// `\\` (a backslash, so that the output reads back unambiguously), `\xNN` for the other
/// ASCII controls and DEL, `\u{NN}` for C1 controls and for the Unicode characters that
/// reorder or break lines (bidirectional overrides, line and paragraph separators).
/// Borrowed when nothing needs escaping.
///
/// ```
/// use superprof_profile::escape;
/// assert_eq!(escape("main"), "main");
/// assert_eq!(escape("a\nb\x1b[31m"), "a\\nb\\e[31m");
/// assert_eq!(escape("naïve"), "naïve");
/// ```
pub fn escape(name: &str) -> Cow<'_, str> {
    if !name.chars().any(needs_escape) {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            '\x0c' => out.push_str("\\f"),
            '\x1b' => out.push_str("\\e"),
            '\\' => out.push_str("\\\\"),
            c if c.is_ascii() && needs_escape(c) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c == '\\'
        || c.is_control()
        || matches!(
            c,
            '\u{200e}' | '\u{200f}' | '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

#[cfg(test)]
mod tests {
    use super::escape;
    use std::borrow::Cow;

    #[test]
    fn plain_names_are_borrowed() {
        for s in [
            "main",
            "std::vec::Vec<T>::push",
            "operator()",
            "[unknown]",
            "",
        ] {
            assert!(matches!(escape(s), Cow::Borrowed(b) if b == s), "{s}");
        }
    }

    #[test]
    fn controls_are_escaped_like_strace() {
        assert_eq!(escape("a\nb"), "a\\nb");
        assert_eq!(escape("\r\t\x0b\x0c"), "\\r\\t\\v\\f");
        assert_eq!(escape("\x1b[2J\x1b]0;title\x07"), "\\e[2J\\e]0;title\\x07");
        assert_eq!(escape("nul\0del\x7f"), "nul\\x00del\\x7f");
        assert_eq!(escape("back\\slash"), "back\\\\slash");
    }

    #[test]
    fn unicode_is_kept_but_c1_and_bidi_are_escaped() {
        assert_eq!(escape("Grüße_日本語_🔥"), "Grüße_日本語_🔥");
        assert_eq!(escape("\u{fffd}"), "\u{fffd}");
        // CSI as a C1 control, a right-to-left override, a line separator.
        assert_eq!(escape("a\u{9b}2Jb"), "a\\u{9b}2Jb");
        assert_eq!(escape("x\u{202e}y"), "x\\u{202e}y");
        assert_eq!(escape("x\u{2028}y"), "x\\u{2028}y");
    }

    #[test]
    fn the_result_is_one_line_without_controls() {
        let all: String = (0u32..0x3000).filter_map(char::from_u32).collect();
        let e = escape(&all);
        assert!(!e.chars().any(|c| c.is_control()));
        assert_eq!(e.lines().count(), 1);
    }
}
