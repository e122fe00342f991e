//! Interactive SVG flamegraph through inferno.

use std::io::{self, Write};

use crate::Profile;

/// Writes the flamegraph of `profile`, titled `title`; an error when the profile has no
/// sample.
pub fn write(profile: &Profile, title: &str, w: &mut dyn Write) -> io::Result<()> {
    let lines: Vec<String> = crate::folded::collapse(profile)
        .into_iter()
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect();
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_owned();
    options.count_name = "samples".to_owned();
    if lines.is_empty() {
        return Err(io::Error::other("the profile is empty: no samples to draw"));
    }
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut svg)
        .map_err(io::Error::other)?;
    w.write_all(&show_base(svg))
}

/// What a flamegraph taller than the window opens on: its base (the roots, at the bottom),
/// not the empty top above a few deep stacks. The SVG is scrolled to its bottom once loaded,
/// after inferno's own `init`; an SVG not as inferno writes it is left as it is.
const SHOW_BASE: &str = "<script type=\"text/ecmascript\"><![CDATA[\
function superprofShowBase() { var d = document.documentElement; \
if (d.getBoundingClientRect().height > window.innerHeight) { \
window.scrollTo(0, d.getBoundingClientRect().height); } }\
]]></script>";

fn show_base(svg: Vec<u8>) -> Vec<u8> {
    let text = match String::from_utf8(svg) {
        Ok(t) => t,
        Err(e) => return e.into_bytes(),
    };
    let onload = "onload=\"init(evt)\"";
    let (Some(at), Some(open)) = (text.find(onload), text.find("<svg ")) else {
        return text.into_bytes();
    };
    let Some(end) = text[open..].find('>').map(|e| open + e + 1) else {
        return text.into_bytes();
    };
    if at > end {
        return text.into_bytes();
    }
    let mut out = String::with_capacity(text.len() + SHOW_BASE.len() + 32);
    out.push_str(&text[..at]);
    out.push_str("onload=\"init(evt); superprofShowBase()\"");
    out.push_str(&text[at + onload.len()..end]);
    out.push_str(SHOW_BASE);
    out.push_str(&text[end..]);
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_base_is_shown_once_loaded() {
        let svg = br#"<?xml?><svg version="1.1" onload="init(evt)" x="1"><g/></svg>"#.to_vec();
        let out = String::from_utf8(super::show_base(svg)).unwrap();
        assert!(out.starts_with(
            r#"<?xml?><svg version="1.1" onload="init(evt); superprofShowBase()" x="1"><script"#
        ));
        assert!(out.ends_with("</script><g/></svg>"));
        // Not inferno's: left alone.
        let other = br#"<svg x="1"><g onload="init(evt)"/></svg>"#.to_vec();
        assert_eq!(super::show_base(other.clone()), other);
    }
}
