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
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), w)
        .map_err(io::Error::other)
}
