//! The fast paths. Uplink: the GTP-U layout nearly every gNB sends — a G-PDU
//! with E set (S and PN clear) and exactly one extension, an UL PDU Session
//! Container, carrying an IPv4 packet without options — recognised with a
//! few fixed-offset loads and two compares of the layout bytes, and its
//! classification fields read at fixed offsets. It accepts a packet only if
//! the general path (UDP and GTP-U lengths, [`GtpuPacket::layout`], the
//! inner IPv4 header) would accept it with the same result; anything else
//! (other flags, several or other extensions, a DL container, IP options,
//! lengths that do not add up, a short frame) returns `None` and takes the
//! general path, which counts malformed packets by reason. Downlink: an
//! IPv4 packet without options, read at fixed offsets ([`downlink_v4`]).
//!
//! [`GtpuPacket::layout`]: flowplane_wire::gtpu::GtpuPacket::layout

use flowplane_wire::frame::PktMeta;

use super::cls;

/// What the fast path read of an uplink packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastUl {
    /// Classification fields (`ue_ok` false: the caller sets it).
    pub pkt: cls::Pkt,
    /// Frame offset of the inner IPv4 header.
    pub inner_at: usize,
    /// The inner packet's length by its own header.
    pub inner_len: usize,
}

/// Bytes read from the UDP header on: UDP (8), GTP-U with the container
/// (16), the inner IPv4 header (20) and its ports (4).
const SPAN: usize = 48;

/// GTP-U bytes 0-1: version 1, PT, E (no S, no PN); G-PDU.
const FLAGS_TYPE: [u8; 2] = [0x34, 0xff];

/// GTP-U bytes 8-15 as a little-endian u64 under [`EXT_MASK`]: next
/// extension type 0x85 (PDU Session Container), its length 1 (4 octets),
/// PDU type 1 (UL PDU SESSION INFORMATION), no further extension. The
/// sequence number, N-PDU number, spare bits and the QFI byte are not
/// compared (the general parser does not check them either).
const EXT_MASK: u64 = u64::from_le_bytes([0, 0, 0, 0xff, 0xff, 0xf0, 0, 0xff]);
const EXT_WANT: u64 = u64::from_le_bytes([0, 0, 0, 0x85, 0x01, 0x10, 0, 0x00]);

/// The fast path over an IPv4 N3 frame (`m` its outer parse: `m.l4` the
/// UDP header); `None`: take the general path.
#[inline(always)]
pub fn uplink_v4(data: &[u8], m: &PktMeta) -> Option<FastUl> {
    if m.v6 {
        return None;
    }
    let (l3, l4) = (usize::from(m.l3), usize::from(m.l4));
    let b: &[u8; SPAN] = data.get(l4..l4 + SPAN)?.try_into().ok()?;
    let ext = u64::from_le_bytes([b[16], b[17], b[18], b[19], b[20], b[21], b[22], b[23]]);
    if [b[8], b[9]] != FLAGS_TYPE || ext & EXT_MASK != EXT_WANT || b[24] != 0x45 {
        return None;
    }
    // Lengths: the UDP datagram within the outer IP packet and the frame,
    // the GTP-U message within the datagram, the inner packet within the
    // message and long enough for the ports the general path reads.
    let ip_len = u16::from_be_bytes([*data.get(l3 + 2)?, *data.get(l3 + 3)?]) as usize;
    let ulen = u16::from_be_bytes([b[4], b[5]]) as usize;
    let gend = 8 + u16::from_be_bytes([b[10], b[11]]) as usize;
    let inner_len = u16::from_be_bytes([b[26], b[27]]) as usize;
    let room = gend.checked_sub(16)?;
    if l4 + ulen > l3 + ip_len || l4 + ulen > data.len() || gend + 8 > ulen || inner_len > room || inner_len < 24 {
        return None;
    }
    let proto = b[33];
    let (ue_port, remote_port) = ports(proto, [b[30], b[31]], [b[44], b[45], b[46], b[47]]);
    Some(FastUl {
        pkt: cls::Pkt {
            proto,
            qfi: b[22] & 0x3f,
            ue: u32::from_be_bytes([b[36], b[37], b[38], b[39]]),
            remote: u32::from_be_bytes([b[40], b[41], b[42], b[43]]),
            ue_port,
            remote_port,
            ue_ok: false,
        },
        inner_at: l4 + 24,
        inner_len,
    })
}

/// The (source, destination) ports of an inner IPv4 packet of protocol
/// `proto` whose flags/fragment-offset field is `frag` and whose first four
/// L4 bytes are `l4`: (0, 0) for a protocol without ports or a later fragment.
#[inline(always)]
fn ports(proto: u8, frag: [u8; 2], l4: [u8; 4]) -> (u16, u16) {
    let first = u16::from_be_bytes(frag) & 0x1fff == 0;
    match proto {
        6 | 17 | 132 | 136 if first => (u16::from_be_bytes([l4[0], l4[1]]), u16::from_be_bytes([l4[2], l4[3]])),
        _ => (0, 0),
    }
}

/// The downlink counterpart: an N6 frame carrying IPv4 without options
/// (`m` its parse), read at fixed offsets as the UE sees it (the
/// destination is the UE end; `ue_ok` set, as the destination found the
/// session; no QFI); with the packet's length. `None`: the general path.
#[inline(always)]
pub fn downlink_v4(data: &[u8], m: &PktMeta) -> Option<(cls::Pkt, usize)> {
    if m.v6 {
        return None;
    }
    let l3 = usize::from(m.l3);
    let b: &[u8; 24] = data.get(l3..l3 + 24)?.try_into().ok()?;
    let len = u16::from_be_bytes([b[2], b[3]]) as usize;
    if b[0] != 0x45 || len < 24 || len > data.len() - l3 {
        return None;
    }
    let proto = b[9];
    let (remote_port, ue_port) = ports(proto, [b[6], b[7]], [b[20], b[21], b[22], b[23]]);
    let pkt = cls::Pkt {
        proto,
        qfi: cls::NO_QFI,
        ue: u32::from_be_bytes([b[16], b[17], b[18], b[19]]),
        remote: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
        ue_port,
        remote_port,
        ue_ok: true,
    };
    Some((pkt, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{gtpu4, udp4};
    use flowplane_wire::gtpu::{self, GtpuPacket};
    use proptest::prelude::*;

    const UE: [u8; 4] = [10, 45, 0, 7];
    const DN: [u8; 4] = [203, 0, 113, 5];

    /// The general path's reading of an uplink frame, as the NF does it:
    /// (QFI or NO_QFI, inner fields as a fast-path result), or None when it
    /// is not a well-formed G-PDU carrying IPv4.
    fn general(data: &[u8]) -> Option<FastUl> {
        let m = PktMeta::parse(data);
        let g0 = usize::from(m.l4) + 8;
        let end = super::super::udp_end(data, &m)?;
        let g = GtpuPacket::new_unchecked(&data[g0..end]);
        let layout = g.layout().ok()?;
        if g.msg_type() != gtpu::msg_type::G_PDU {
            return None;
        }
        let inner_at = g0 + layout.header_len;
        let (f, inner_len, v6) = super::super::inner_fields(&data[inner_at..g0 + layout.end])?;
        if v6 {
            return None;
        }
        Some(FastUl {
            pkt: cls::Pkt {
                proto: f.proto,
                qfi: layout.pdu_session.map_or(cls::NO_QFI, |p| p.qfi),
                ue: f.ue as u32,
                remote: f.remote as u32,
                ue_port: f.ue_port,
                remote_port: f.remote_port,
                ue_ok: false,
            },
            inner_at,
            inner_len,
        })
    }

    fn inner() -> Vec<u8> {
        udp4(UE, DN, 4000, 5060)[14..].to_vec()
    }

    #[test]
    fn the_common_layout_takes_the_fast_path_with_the_general_paths_result() {
        let f = gtpu4([198, 51, 100, 10], [192, 0, 2, 1], 100, Some(9), &inner());
        let m = PktMeta::parse(&f);
        let fast = uplink_v4(&f, &m).expect("fast path");
        assert_eq!(Some(fast), general(&f));
        assert_eq!((fast.pkt.qfi, fast.pkt.proto, fast.pkt.ue_port, fast.pkt.remote_port), (9, 17, 4000, 5060));
        assert_eq!((fast.pkt.ue, fast.pkt.remote), (u32::from_be_bytes(UE), u32::from_be_bytes(DN)));
        // An Ethernet trailer after the UDP datagram is fine (lengths come from the headers).
        let mut t = f.clone();
        t.extend_from_slice(&[0; 6]);
        assert_eq!(uplink_v4(&t, &PktMeta::parse(&t)), Some(fast));
    }

    #[test]
    fn other_layouts_take_the_general_path() {
        let base = gtpu4([198, 51, 100, 10], [192, 0, 2, 1], 100, Some(9), &inner());
        let g0 = 14 + 20 + 8;
        // No container (no optional block): well-formed, general path only.
        let plain = gtpu4([198, 51, 100, 10], [192, 0, 2, 1], 100, None, &inner());
        assert!(uplink_v4(&plain, &PktMeta::parse(&plain)).is_none());
        assert!(general(&plain).is_some());
        type Change = fn(&mut Vec<u8>, usize);
        let cases: [(&str, Change); 8] = [
            ("S flag set", |f, g| f[g] |= 0x02),
            ("reserved flag bit", |f, g| f[g] |= 0x08),
            ("DL PDU type", |f, g| f[g + 13] &= 0x0f),
            ("a second extension", |f, g| f[g + 15] = 0x40),
            ("inner IP options", |f, g| f[g + 16] = 0x46),
            ("end marker", |f, g| f[g + 1] = 254),
            ("GTP-U length past the datagram", |f, g| f[g + 3] = f[g + 3].wrapping_add(1)),
            ("inner length past the message", |f, g| f[g + 19] = f[g + 19].wrapping_add(1)),
        ];
        for (what, change) in cases {
            let mut f = base.clone();
            change(&mut f, g0);
            assert!(uplink_v4(&f, &PktMeta::parse(&f)).is_none(), "{what}");
        }
        // Truncated frames.
        for n in [g0, g0 + 16, g0 + 40, base.len() - 1] {
            assert!(uplink_v4(&base[..n], &PktMeta::parse(&base[..n])).is_none(), "{n}");
        }
    }

    /// The general path's reading of a downlink frame (as `classify_downlink`).
    fn general_dl(data: &[u8]) -> Option<(cls::Pkt, usize)> {
        let m = PktMeta::parse(data);
        let (f, len, v6) = super::super::inner_fields(data.get(usize::from(m.l3)..)?)?;
        if v6 {
            return None;
        }
        let pkt = cls::Pkt {
            proto: f.proto,
            qfi: cls::NO_QFI,
            ue: f.remote as u32,
            remote: f.ue as u32,
            ue_port: f.remote_port,
            remote_port: f.ue_port,
            ue_ok: true,
        };
        Some((pkt, len))
    }

    #[test]
    fn downlink_fast_path_and_fallback() {
        let f = udp4(DN, UE, 5060, 4000);
        let (p, len) = downlink_v4(&f, &PktMeta::parse(&f)).expect("fast path");
        assert_eq!(Some((p, len)), general_dl(&f));
        assert_eq!(
            (p.ue, p.remote, p.ue_port, p.remote_port, len),
            (u32::from_be_bytes(UE), u32::from_be_bytes(DN), 4000, 5060, f.len() - 14)
        );
        let mut opts = f.clone();
        opts[14] = 0x46;
        assert!(downlink_v4(&opts, &PktMeta::parse(&opts)).is_none());
        let short = &f[..f.len() - 1];
        assert!(downlink_v4(short, &PktMeta::parse(short)).is_none());
    }

    /// Sets the bytes `edits` name (positions past the end are ignored).
    fn overwrite(f: &mut [u8], edits: &[(usize, u8)]) {
        for &(at, v) in edits {
            if let Some(b) = f.get_mut(at) {
                *b = v;
            }
        }
    }

    proptest! {
        /// Whatever bytes change, the downlink fast path declines or agrees.
        #[test]
        fn downlink_fast_path_agrees_with_the_general_path(
            edits in proptest::collection::vec((0usize..50, any::<u8>()), 0..4),
            proto in prop::sample::select(vec![1u8, 6, 17, 132, 136]),
        ) {
            let mut f = udp4(DN, UE, 5060, 4000);
            f[23] = proto;
            overwrite(&mut f, &edits);
            let m = PktMeta::parse(&f);
            if let Some(fast) = downlink_v4(&f, &m) {
                prop_assert_eq!(Some(fast), general_dl(&f));
            }
        }

        /// Whatever bytes change, the fast path either declines or agrees with the general path.
        #[test]
        fn fast_path_agrees_with_the_general_path(
            edits in proptest::collection::vec((0usize..90, any::<u8>()), 0..4),
            proto in prop::sample::select(vec![1u8, 6, 17, 132, 136]),
            qfi in 0u8..64,
        ) {
            let mut i = inner();
            i[9] = proto;
            let mut f = gtpu4([198, 51, 100, 10], [192, 0, 2, 1], 100, Some(qfi), &i);
            overwrite(&mut f, &edits);
            let m = PktMeta::parse(&f);
            if let Some(fast) = uplink_v4(&f, &m) {
                prop_assert_eq!(Some(fast), general(&f));
            }
        }
    }
}
