//! The CLI's error: one line of text, exit code 2 — or a closed stdout,
//! which ends the command quietly, as Unix tools do (`flowplane ... | head`).

use std::fmt;
use std::io;

/// A user-facing error: printed as `flowplane: error: <message>` and exit code 2.
#[derive(Debug)]
pub struct CliError {
    msg: String,
    stdout_closed: bool,
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keep it to one line whatever the source error printed.
        let one_line = self.msg.replace('\n', " ");
        f.write_str(one_line.trim())
    }
}

impl CliError {
    /// An error with this message.
    pub fn new(msg: impl Into<String>) -> Self {
        CliError { msg: msg.into(), stdout_closed: false }
    }

    /// A failed write to stdout: the reader went away (broken pipe) or a real error.
    pub fn stdout(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::BrokenPipe {
            CliError { msg: "stdout closed".to_string(), stdout_closed: true }
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
