//! A self-contained HTML report (`-o profile.html`): speedscope's viewer (the release bundle of
//! its npm package, MIT; vendored in assets/speedscope, the script zstd-compressed) with the
//! profile embedded as speedscope JSON. Opened from disk it asks nothing of the network, nor
//! of the disk: the profile comes in through speedscope's own `localProfilePath` hook (the
//! script it would load is caught and the call made in the page), and the font is inlined.
//!
//! Its views: Left Heavy, the flamegraph (icicle: roots on top; a click gives a frame's
//! figures, a double click zooms to it, `0` zooms out, Ctrl-F searches), Time Order, the
//! timeline of each thread's samples, and Sandwich, the top table (self and total per
//! function, with its callers and callees).

use std::io::{self, Write};

use base64::Engine as _;

use crate::Profile;

const SCRIPT_ZST: &[u8] = include_bytes!("../../../assets/speedscope/speedscope.js.zst");
const STYLE: &str = include_str!("../../../assets/speedscope/speedscope.css");
const FONT: &[u8] = include_bytes!("../../../assets/speedscope/SourceCodePro-Regular.woff2");

/// The viewer's script, as the page embeds it.
fn script() -> io::Result<String> {
    let js = zstd::decode_all(SCRIPT_ZST)?;
    let js = String::from_utf8(js).map_err(io::Error::other)?;
    Ok(end_tags_escaped(&js))
}

/// `text` with every `</script` (any case) written `<\/script`, which JavaScript reads the
/// same in a string, a template or a regular expression, and which cannot end the page's
/// script element early.
fn end_tags_escaped(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (at, _) in lower.match_indices("</script") {
        out.push_str(&text[last..at]);
        out.push_str("<\\/");
        last = at + 2;
    }
    out.push_str(&text[last..]);
    out
}

/// The stylesheet with its font inlined.
fn style() -> String {
    let font = format!(
        "url(\"data:font/woff2;base64,{}\")",
        base64::engine::general_purpose::STANDARD.encode(FONT)
    );
    match STYLE.find("url(\"./SourceCodePro") {
        Some(at) => match STYLE[at..].find("\")") {
            Some(len) => format!("{}{font}{}", &STYLE[..at], &STYLE[at + len + 2..]),
            None => STYLE.to_owned(),
        },
        None => STYLE.to_owned(),
    }
}

/// `s` as HTML text.
fn html_escaped(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Writes the HTML report of `profile`, `title` in its tab; an error when the profile has
/// no sample.
pub fn write(profile: &Profile, title: &str, w: &mut dyn Write) -> io::Result<()> {
    if profile.samples.is_empty() {
        return Err(io::Error::other("the profile is empty: no samples to show"));
    }
    // A JavaScript string literal of the title (JSON's is one), safe inside a script element.
    let title_js = end_tags_escaped(&serde_json::to_string(title).map_err(io::Error::other)?);
    write!(
        w,
        "<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"UTF-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1.0\">\n\
         <meta name=\"generator\" content=\"superprof; viewer: speedscope (MIT)\">\n\
         <title>{}</title>\n<style>{}</style>\n</head>\n<body>\n",
        html_escaped(title),
        style()
    )?;
    // The profile (base64, in a string), and speedscope's `localProfilePath` hook: with that
    // hash parameter it defines `speedscope.loadFileFromBase64` and appends a script from a
    // file of that path, which would call it. The page catches that script before it is
    // appended (no request is made) and makes the call itself. A view or title the address
    // already names is kept.
    // The speedscope document, base64-encoded as it is written (never whole in memory).
    w.write_all(b"<script>\nwindow.SUPERPROF_PROFILE = \"")?;
    {
        let mut enc =
            base64::write::EncoderWriter::new(&mut *w, &base64::engine::general_purpose::STANDARD);
        crate::speedscope::write(profile, &mut enc)?;
        enc.finish()?;
    }
    write!(
        w,
        "\";\n(function () {{\n\
         var marker = 'superprof-embedded-profile';\n\
         var append = HTMLHeadElement.prototype.appendChild;\n\
         HTMLHeadElement.prototype.appendChild = function (node) {{\n\
         if (node && node.tagName === 'SCRIPT' && String(node.src).indexOf(marker) >= 0) {{\n\
         HTMLHeadElement.prototype.appendChild = append;\n\
         setTimeout(function () {{\n\
         window.speedscope.loadFileFromBase64('superprof.speedscope.json', \
         window.SUPERPROF_PROFILE);\n}}, 0);\n\
         return node;\n}}\n\
         return append.call(this, node);\n}};\n\
         var kept = location.hash.replace(/^#/, '').split('&').filter(function (p) {{\n\
         return p && p.indexOf('profileURL=') !== 0 && p.indexOf('localProfilePath=') !== 0;\n\
         }});\n\
         var has = function (k) {{\n\
         return kept.some(function (p) {{ return p.indexOf(k + '=') === 0; }});\n}};\n\
         if (!has('view')) kept.push('view=left-heavy');\n\
         if (!has('title')) kept.push('title=' + encodeURIComponent({title_js}));\n\
         kept.push('localProfilePath=' + marker);\n\
         history.replaceState(null, '', '#' + kept.join('&'));\n}})();\n</script>\n"
    )?;
    write!(w, "<script>{}</script>\n</body>\n</html>\n", script()?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_tags_cannot_close_the_script() {
        assert_eq!(
            end_tags_escaped("a</script>b</SCRIPT >c</scrip"),
            "a<\\/script>b<\\/SCRIPT >c</scrip"
        );
    }

    #[test]
    fn the_page_holds_the_viewer_the_font_and_the_profile() {
        let mut p = Profile::default();
        let t = p.add_thread(1, 1, "t");
        let f = p.intern_frame_named("hot</script>", "m", None, 0, 1, false);
        let s = p.intern_stack(None, f);
        p.add_sample(0, t, 0, 1, Some(s));
        let mut out = Vec::new();
        write(&p, "run <1> \"x\"</script>", &mut out).unwrap();
        let page = String::from_utf8(out).unwrap();
        assert!(page.contains("<title>run &lt;1&gt; &quot;x&quot;&lt;/script&gt;</title>"));
        // One script element for the loader, one for the viewer: no other end tag.
        assert_eq!(page.to_ascii_lowercase().matches("</script").count(), 2);
        assert!(page.contains("data:font/woff2;base64,"));
        assert!(!page.contains("./SourceCodePro"));
        // The profile, decodable, with the frame's name.
        let b64 = page
            .split("window.SUPERPROF_PROFILE = \"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap();
        let json = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        let json = String::from_utf8(json).unwrap();
        assert!(json.contains("hot</script>"), "{json}");
        assert!(page.contains("loadFileFromBase64"));
    }
}
