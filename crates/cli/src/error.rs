//! The CLI's error: one line of text, exit code 2.

use std::fmt;

/// A user-facing error: printed as `flowplane: error: <message>` and exit code 2.
#[derive(Debug)]
pub struct CliError(pub String);

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keep it to one line whatever the source error printed.
        let one_line = self.0.replace('\n', " ");
        f.write_str(one_line.trim())
    }
}

impl CliError {
    pub fn new(msg: impl Into<String>) -> Self {
        CliError(msg.into())
    }
}

/// `?` on any displayable error yields a one-line CliError.
impl<E: std::error::Error> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError(e.to_string())
    }
}
