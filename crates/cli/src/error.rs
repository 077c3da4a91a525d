//! The CLI's error: one line of text, exit code 2 — or a closed stdout,
//! which ends the command quietly, as Unix tools do (`flowplane ... | head`).
//! A run that completed and reported but could not write all its results
//! (an output or an export) ends with exit code 1 instead.

use std::fmt;
use std::io;

/// A user-facing error: printed as `flowplane: error: <message>` and exit code 2.
#[derive(Debug)]
pub struct CliError {
    msg: String,
    stdout_closed: bool,
    incomplete: bool,
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&printable(&self.msg))
    }
}

/// `msg` as one printable line: line breaks become spaces (a source error's lines, or a newline in user
/// input), every other control character is escaped (`\u{1b}`, `\r`, `\t`, `\u{9b}`), so no user input echoed
/// in an error can move the cursor, clear the terminal or break the line (issue 35: `--chain $'\x1b[2J'`
/// cleared the screen).
pub fn printable(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    for c in msg.trim().chars() {
        match c {
            '\n' => out.push(' '),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

impl CliError {
    /// An error with this message.
    pub fn new(msg: impl Into<String>) -> Self {
        CliError { msg: msg.into(), stdout_closed: false, incomplete: false }
    }

    /// A run that reported but lost results (packets not written to an output, exports not written): exit code 1.
    pub fn incomplete(msg: impl Into<String>) -> Self {
        CliError { msg: msg.into(), stdout_closed: false, incomplete: true }
    }

    /// The process exit code: 1 for lost results, 2 for bad input and every other error.
    pub fn exit_code(&self) -> u8 {
        if self.incomplete {
            1
        } else {
            2
        }
    }

    /// A failed write to stdout: the reader went away (broken pipe) or a real error.
    pub fn stdout(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::BrokenPipe {
            CliError { msg: "stdout closed".to_string(), stdout_closed: true, incomplete: false }
        } else {
            CliError::new(format!("stdout: {e}"))
        }
    }

    /// Whoever read our output stopped reading: not an error to report.
    pub fn is_stdout_closed(&self) -> bool {
        self.stdout_closed
    }
}

/// `?` on any displayable error yields a one-line CliError.
impl<E: std::error::Error> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError::new(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_printable_line() {
        let e = CliError::new("chain 'a\x1b[2J\rb\tc\u{9b}':\nunknown NF\n");
        let shown = e.to_string();
        assert_eq!(shown, "chain 'a\\u{1b}[2J\\rb\\tc\\u{9b}': unknown NF");
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert_eq!(printable("plain – ünïcode"), "plain – ünïcode");
    }
}
