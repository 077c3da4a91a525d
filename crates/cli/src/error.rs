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
        // Keep it to one line whatever the source error printed.
        let one_line = self.msg.replace('\n', " ");
        f.write_str(one_line.trim())
    }
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
