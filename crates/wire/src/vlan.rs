//! IEEE 802.1Q / 802.1ad (QinQ) VLAN tags: a view over one 4-byte tag
//! ([`VlanTag`]), its [`VlanRepr`], and [`skip_vlan_tags`], which walks a stack
//! of tags after the Ethernet header with a hard bound on their number.
//!
//! A tag as seen here is the 2-byte TCI (PCP, DEI, VID) followed by the
//! 2-byte EtherType of what comes next; the TPID that announced the tag is the
//! preceding EtherType field.

use crate::error::{Result, WireError};
use crate::ethernet::EtherType;

/// Length of one VLAN tag (TCI + inner EtherType).
pub const TAG_LEN: usize = 4;

/// Most tags [`skip_vlan_tags`] will walk before refusing the frame.
pub const MAX_VLAN_TAGS: usize = 4;

/// A view of one VLAN tag: TCI followed by the inner EtherType.
#[derive(Debug, Clone)]
pub struct VlanTag<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> VlanTag<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a short buffer.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        VlanTag { buffer }
    }

    /// Wraps a buffer after checking it holds a whole tag.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let t = Self::new_unchecked(buffer);
        t.check_len()?;
        Ok(t)
    }

    /// Checks that accessors cannot go out of bounds.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < TAG_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    /// Returns the underlying buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline]
    fn tci(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[0], b[1]])
    }

    /// Priority code point (3 bits).
    #[inline]
    pub fn pcp(&self) -> u8 {
        (self.tci() >> 13) as u8
    }

    /// Drop eligible indicator.
    #[inline]
    pub fn dei(&self) -> bool {
        self.tci() & 0x1000 != 0
    }

    /// VLAN identifier (12 bits).
    #[inline]
    pub fn vid(&self) -> u16 {
        self.tci() & 0x0fff
    }

    /// EtherType of what follows the tag.
    #[inline]
    pub fn ethertype(&self) -> EtherType {
        let b = self.buffer.as_ref();
        EtherType(u16::from_be_bytes([b[2], b[3]]))
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> VlanTag<&'a T> {
    /// Bytes after the tag.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[TAG_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> VlanTag<T> {
    #[inline]
    fn set_tci(&mut self, tci: u16) {
        self.buffer.as_mut()[0..2].copy_from_slice(&tci.to_be_bytes());
    }

    /// Sets the priority code point (low 3 bits of `pcp`).
    #[inline]
    pub fn set_pcp(&mut self, pcp: u8) {
        let tci = (self.tci() & 0x1fff) | (((pcp & 7) as u16) << 13);
        self.set_tci(tci);
    }

    /// Sets the drop eligible indicator.
    #[inline]
    pub fn set_dei(&mut self, dei: bool) {
        let tci = (self.tci() & !0x1000) | if dei { 0x1000 } else { 0 };
        self.set_tci(tci);
    }

    /// Sets the VLAN identifier (low 12 bits of `vid`).
    #[inline]
    pub fn set_vid(&mut self, vid: u16) {
        let tci = (self.tci() & 0xf000) | (vid & 0x0fff);
        self.set_tci(tci);
    }

    /// Sets the inner EtherType.
    #[inline]
    pub fn set_ethertype(&mut self, t: EtherType) {
        self.buffer.as_mut()[2..4].copy_from_slice(&t.0.to_be_bytes());
    }

    /// Mutable bytes after the tag.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[TAG_LEN..]
    }
}

/// A parsed VLAN tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VlanRepr {
    /// Priority code point (0..=7).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (0..=4095).
    pub vid: u16,
    /// EtherType of what follows.
    pub ethertype: EtherType,
}

impl VlanRepr {
    /// Reads a tag.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(tag: &VlanTag<&T>) -> Result<VlanRepr> {
        tag.check_len()?;
        Ok(VlanRepr { pcp: tag.pcp(), dei: tag.dei(), vid: tag.vid(), ethertype: tag.ethertype() })
    }

    /// Bytes [`VlanRepr::emit`] writes.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        TAG_LEN
    }

    /// Writes the tag; `pcp`/`vid` values out of range are rejected.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, tag: &mut VlanTag<&mut T>) -> Result<()> {
        if self.pcp > 7 || self.vid > 0x0fff {
            return Err(WireError::Malformed);
        }
        tag.check_len()?;
        tag.set_tci(((self.pcp as u16) << 13) | if self.dei { 0x1000 } else { 0 } | self.vid);
        tag.set_ethertype(self.ethertype);
        Ok(())
    }
}

/// Result of [`skip_vlan_tags`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VlanStack {
    /// Number of tags skipped.
    pub count: u8,
    /// VIDs of the skipped tags, outermost first; entries past `count` are 0.
    pub vids: [u16; MAX_VLAN_TAGS],
    /// EtherType of the payload after the last tag.
    pub ethertype: EtherType,
    /// Offset of that payload from the start of the slice given to [`skip_vlan_tags`].
    pub offset: usize,
}

/// Skips 0..=`max_tags` stacked VLAN tags.
///
/// `data` starts right after the Ethernet header's EtherType field and
/// `ethertype` is that field's value. Tags are recognised by the TPIDs
/// 0x8100, 0x88a8 and 0x9100. More than `max_tags` (itself capped at
/// [`MAX_VLAN_TAGS`]) tags give [`WireError::TooManyHeaders`].
pub fn skip_vlan_tags(data: &[u8], ethertype: EtherType, max_tags: usize) -> Result<VlanStack> {
    let max = max_tags.min(MAX_VLAN_TAGS);
    let mut st = VlanStack { ethertype, ..VlanStack::default() };
    while st.ethertype.is_vlan() {
        if st.count as usize == max {
            return Err(WireError::TooManyHeaders);
        }
        let rest = data.get(st.offset..).ok_or(WireError::Truncated)?;
        let tag = VlanTag::new_checked(rest)?;
        st.vids[st.count as usize] = tag.vid();
        st.ethertype = tag.ethertype();
        st.count += 1;
        st.offset += TAG_LEN;
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    // QinQ: outer S-tag VID 100 PCP 3, inner C-tag VID 200 DEI, then IPv4.
    const STACK: [u8; 9] = [0x60, 0x64, 0x81, 0x00, 0x10, 0xc8, 0x08, 0x00, 0x45];

    #[test]
    fn qinq_stack() {
        let st = skip_vlan_tags(&STACK, EtherType::QINQ, 2).unwrap();
        assert_eq!(st.count, 2);
        assert_eq!(&st.vids[..2], &[100, 200]);
        assert_eq!(st.ethertype, EtherType::IPV4);
        assert_eq!(st.offset, 8);
        let t = VlanTag::new_checked(&STACK[..]).unwrap();
        assert_eq!((t.pcp(), t.dei(), t.vid()), (3, false, 100));
        let t2 = VlanTag::new_checked(&STACK[4..]).unwrap();
        assert_eq!((t2.pcp(), t2.dei(), t2.vid()), (0, true, 200));
        assert_eq!(t2.payload(), &[0x45]);
    }

    #[test]
    fn no_tags_and_limits() {
        let st = skip_vlan_tags(&[], EtherType::IPV6, 2).unwrap();
        assert_eq!((st.count, st.offset, st.ethertype), (0, 0, EtherType::IPV6));
        assert_eq!(skip_vlan_tags(&STACK, EtherType::QINQ, 1), Err(WireError::TooManyHeaders));
        // A tag loop of 0x8100 tags must stop at the bound.
        let many = [0x00, 0x01, 0x81, 0x00].repeat(10);
        assert_eq!(skip_vlan_tags(&many, EtherType::VLAN, 100), Err(WireError::TooManyHeaders));
        for n in 0..8 {
            assert_eq!(skip_vlan_tags(&STACK[..n], EtherType::QINQ, 2), Err(WireError::Truncated), "len {n}");
        }
    }

    #[test]
    fn emit_round_trip() {
        let r = VlanRepr { pcp: 5, dei: true, vid: 4095, ethertype: EtherType::IPV6 };
        let mut buf = [0u8; 4];
        r.emit(&mut VlanTag::new_unchecked(&mut buf[..])).unwrap();
        assert_eq!(VlanRepr::parse(&VlanTag::new_checked(&buf[..]).unwrap()).unwrap(), r);
        let bad = VlanRepr { vid: 4096, ..r };
        assert_eq!(bad.emit(&mut VlanTag::new_unchecked(&mut buf[..])), Err(WireError::Malformed));
        let mut t = VlanTag::new_unchecked(&mut buf[..]);
        t.set_vid(7);
        t.set_pcp(1);
        t.set_dei(false);
        assert_eq!((t.vid(), t.pcp(), t.dei()), (7, 1, false));
    }
}
