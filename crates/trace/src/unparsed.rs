//! Counted reasons for records and packets a reader could not hand on.
//!
//! Owns [`Unparsed`] (why one record or packet was not read) and [`UnparsedCounts`] (a fixed-size counter per
//! reason). A capture with a bad record or packet is still a capture: readers count the problem here and go on with
//! the next record when it can be located, so a run never aborts because of one bad packet. Counting is an array
//! increment: no allocation, fit for per-packet use.

use std::fmt;

use serde::ser::{Serialize, SerializeMap, Serializer};

/// Why a record or packet was not handed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unparsed {
    /// The packet is shorter than the header of its link type.
    TooShort,
    /// A raw IP packet whose version nibble is neither 4 nor 6.
    UnknownIpVersion,
    /// The link header names a protocol with no Ethernet II form (PPP LCP, a loopback address family other than
    /// IPv4/IPv6, a Linux cooked-capture pseudo-protocol, ...).
    NoEthernetForm,
    /// A pcapng packet on an interface no Interface Description Block defined.
    UnknownInterface,
    /// A record whose fields contradict the format (its length was sound, so reading went on after it).
    CorruptRecord,
    /// The file ends inside a record (the usual shape of a capture cut short).
    TruncatedRecord,
    /// A record whose length cannot be trusted, so the next record cannot be located: the rest of the file was not
    /// read (see `TraceReader::stopped_early` for where and why).
    UnreadableRest,
}

impl Unparsed {
    /// Every reason, in the order reports list them.
    pub const ALL: [Unparsed; 7] = [
        Unparsed::TooShort,
        Unparsed::UnknownIpVersion,
        Unparsed::NoEthernetForm,
        Unparsed::UnknownInterface,
        Unparsed::CorruptRecord,
        Unparsed::TruncatedRecord,
        Unparsed::UnreadableRest,
    ];

    /// Stable snake_case key, used in JSON.
    pub fn key(self) -> &'static str {
        match self {
            Unparsed::TooShort => "too_short",
            Unparsed::UnknownIpVersion => "unknown_ip_version",
            Unparsed::NoEthernetForm => "no_ethernet_form",
            Unparsed::UnknownInterface => "unknown_interface",
            Unparsed::CorruptRecord => "corrupt_record",
            Unparsed::TruncatedRecord => "truncated_record",
            Unparsed::UnreadableRest => "unreadable_rest",
        }
    }

    /// Short human-readable text.
    pub fn text(self) -> &'static str {
        match self {
            Unparsed::TooShort => "too short for the link header",
            Unparsed::UnknownIpVersion => "unknown IP version",
            Unparsed::NoEthernetForm => "protocol with no Ethernet form",
            Unparsed::UnknownInterface => "undefined pcapng interface",
            Unparsed::CorruptRecord => "corrupt record",
            Unparsed::TruncatedRecord => "truncated record",
            Unparsed::UnreadableRest => "corrupt record, rest of file unreadable",
        }
    }

    /// True for reasons about a packet's contents (its record was read); false for reasons about the file's records.
    pub fn is_packet_level(self) -> bool {
        matches!(self, Unparsed::TooShort | Unparsed::UnknownIpVersion | Unparsed::NoEthernetForm)
    }
}

impl fmt::Display for Unparsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

/// One counter per [`Unparsed`] reason. Serializes as a JSON object with every reason's key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UnparsedCounts {
    counts: [u64; Unparsed::ALL.len()],
}

impl UnparsedCounts {
    /// Counts one record or packet.
    #[inline]
    pub fn add(&mut self, why: Unparsed) {
        self.counts[why as usize] += 1;
    }

    /// The count of one reason.
    pub fn get(&self, why: Unparsed) -> u64 {
        self.counts[why as usize]
    }

    /// All reasons together.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds another set of counts.
    pub fn merge(&mut self, other: &UnparsedCounts) {
        for (a, b) in self.counts.iter_mut().zip(other.counts) {
            *a += b;
        }
    }

    /// The reasons with a non-zero count, in [`Unparsed::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Unparsed, u64)> + '_ {
        Unparsed::ALL.into_iter().map(|w| (w, self.get(w))).filter(|&(_, n)| n > 0)
    }
}

/// `1 unknown IP version, 1 truncated record`; `none` when all are zero.
impl fmt::Display for UnparsedCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (why, n) in self.iter() {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{n} {why}")?;
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

impl Serialize for UnparsedCounts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(Unparsed::ALL.len()))?;
        for why in Unparsed::ALL {
            m.serialize_entry(why.key(), &self.get(why))?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_display_and_json() {
        let mut c = UnparsedCounts::default();
        assert_eq!(c.to_string(), "none");
        c.add(Unparsed::TruncatedRecord);
        c.add(Unparsed::UnknownIpVersion);
        c.add(Unparsed::UnknownIpVersion);
        assert_eq!(c.total(), 3);
        assert_eq!(c.to_string(), "2 unknown IP version, 1 truncated record");
        let v = serde_json::to_value(c).unwrap();
        assert_eq!(v["unknown_ip_version"], 2);
        assert_eq!(v["too_short"], 0);
        assert_eq!(v.as_object().unwrap().len(), Unparsed::ALL.len());
        let mut d = UnparsedCounts::default();
        d.merge(&c);
        d.merge(&c);
        assert_eq!(d.get(Unparsed::UnknownIpVersion), 4);
    }

    #[test]
    fn all_is_in_discriminant_order() {
        for (i, w) in Unparsed::ALL.into_iter().enumerate() {
            assert_eq!(w as usize, i);
        }
    }
}
