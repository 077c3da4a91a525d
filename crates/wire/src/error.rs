//! The error type shared by every header view and parser in this crate.
//!
//! Malformed packets are normal input for a packet processor, so every check
//! that can fail reports one of these small `Copy` values instead of panicking;
//! callers typically count them as drops by kind.

use core::fmt;

/// Why a buffer could not be viewed, parsed or emitted as a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireError {
    /// The buffer is shorter than the header (or than a length field says).
    Truncated,
    /// The version field holds an unexpected value.
    BadVersion,
    /// A header length field is smaller than the fixed header or otherwise invalid.
    BadHeaderLen,
    /// A checksum does not verify.
    BadChecksum,
    /// A total/payload length field is inconsistent.
    BadLength,
    /// Well-formed, but a variant this crate does not handle.
    Unsupported,
    /// Structurally invalid content (e.g. a hop-by-hop header that is not first).
    Malformed,
    /// A chain of headers (IPv6 extensions, VLAN tags, GTP-U extensions) is longer than allowed.
    TooManyHeaders,
    /// An option (TCP option, extension header content) has a bad kind/length combination.
    BadOption,
}

impl WireError {
    /// A short, stable label (for counters and JSON reports).
    pub const fn as_str(self) -> &'static str {
        match self {
            WireError::Truncated => "truncated",
            WireError::BadVersion => "bad_version",
            WireError::BadHeaderLen => "bad_header_len",
            WireError::BadChecksum => "bad_checksum",
            WireError::BadLength => "bad_length",
            WireError::Unsupported => "unsupported",
            WireError::Malformed => "malformed",
            WireError::TooManyHeaders => "too_many_headers",
            WireError::BadOption => "bad_option",
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let msg = match self {
            WireError::Truncated => "packet truncated: buffer shorter than the header or its length field",
            WireError::BadVersion => "unexpected protocol version",
            WireError::BadHeaderLen => "invalid header length field",
            WireError::BadChecksum => "checksum mismatch",
            WireError::BadLength => "inconsistent length field",
            WireError::Unsupported => "unsupported protocol variant",
            WireError::Malformed => "malformed header",
            WireError::TooManyHeaders => "header chain too long",
            WireError::BadOption => "malformed option",
        };
        f.write_str(msg)
    }
}

impl std::error::Error for WireError {}

/// Result alias used throughout the crate.
pub type Result<T> = core::result::Result<T, WireError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_one_line_and_labels_unique() {
        let all = [
            WireError::Truncated,
            WireError::BadVersion,
            WireError::BadHeaderLen,
            WireError::BadChecksum,
            WireError::BadLength,
            WireError::Unsupported,
            WireError::Malformed,
            WireError::TooManyHeaders,
            WireError::BadOption,
        ];
        let mut labels = std::collections::HashSet::new();
        for e in all {
            let s = e.to_string();
            assert!(!s.is_empty() && !s.contains('\n'), "{s:?}");
            assert!(labels.insert(e.as_str()), "duplicate label {}", e.as_str());
        }
    }
}
