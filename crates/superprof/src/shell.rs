//! What a shell and `man` want of superprof: completion scripts (clap_complete) and man pages
//! (clap_mangen), both made from the same clap definition as the parser, so they cannot drift
//! from it.

use std::io::Write;

use anyhow::{anyhow, Result};
use clap::CommandFactory;

use crate::cli::Cli;

/// Writes the completion script for `shell` to stdout.
pub fn completions(shell: clap_complete::Shell) -> Result<i32> {
    let mut cmd = Cli::command();
    let hidden: Vec<String> = cmd
        .get_subcommands()
        .filter(|c| c.is_hide_set())
        .map(|c| c.get_name().to_owned())
        .collect();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "superprof", &mut out);
    let text = String::from_utf8_lossy(&out);
    write_stdout(offer_no_hidden(shell, &text, &hidden).as_bytes())
}

/// The script without the lines that would offer a hidden subcommand (superprof's internal
/// entry points): clap_complete offers them in fish, and in zsh's list of subcommands. Each
/// fish line is a command of its own; in zsh only the list entries (`'NAME:about'`) go.
fn offer_no_hidden(shell: clap_complete::Shell, text: &str, hidden: &[String]) -> String {
    use clap_complete::Shell;
    let offers = |line: &str| match shell {
        Shell::Fish => hidden.iter().any(|h| line.contains(h.as_str())),
        Shell::Zsh => hidden.iter().any(|h| line.starts_with(&format!("'{h}:"))),
        _ => false,
    };
    let mut kept: String = text
        .lines()
        .filter(|l| !offers(l))
        .collect::<Vec<_>>()
        .join("\n");
    kept.push('\n');
    kept
}

/// Writes the man page of superprof (`superprof(1)`), or of one subcommand
/// (`superprof-record(1)`), to stdout.
pub fn man(subcommand: Option<&str>) -> Result<i32> {
    let mut cmd = Cli::command();
    cmd.build();
    let page = match subcommand {
        None => cmd,
        Some(name) => {
            let sub = cmd
                .get_subcommands()
                .find(|c| c.get_name() == name && !c.is_hide_set())
                .ok_or_else(|| {
                    let names: Vec<&str> = cmd
                        .get_subcommands()
                        .filter(|c| !c.is_hide_set())
                        .map(|c| c.get_name())
                        .collect();
                    anyhow!(
                        "no subcommand '{}' (one of: {})",
                        superprof_profile::escape(name),
                        names.join(", ")
                    )
                })?;
            let full = format!("superprof-{}", sub.get_name());
            sub.clone().name(full.clone()).bin_name(full)
        }
    };
    let mut out = Vec::new();
    clap_mangen::Man::new(page).render(&mut out)?;
    write_stdout(&out)
}

/// Writes to stdout; a reader that went away (`| head`) is no error.
fn write_stdout(bytes: &[u8]) -> Result<i32> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::offer_no_hidden;
    use clap_complete::Shell;

    #[test]
    fn hidden_entries_go_and_the_script_stays_whole() {
        let hidden = vec!["__x".to_owned()];
        let fish = "complete -c s -a \"rec\"\ncomplete -c s -a \"__x\" -d 'internal'\n";
        assert_eq!(
            offer_no_hidden(Shell::Fish, fish, &hidden),
            "complete -c s -a \"rec\"\n"
        );
        let zsh = "commands=(\n'rec:Record' \\\n'__x:Internal' \\\n)\n(__x)\n;;\n";
        assert_eq!(
            offer_no_hidden(Shell::Zsh, zsh, &hidden),
            "commands=(\n'rec:Record' \\\n)\n(__x)\n;;\n"
        );
        let bash = "case x in\n__x) ;;\nesac\n";
        assert_eq!(offer_no_hidden(Shell::Bash, bash, &hidden), bash);
    }
}
