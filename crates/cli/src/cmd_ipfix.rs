//! `flowplane ipfix read FILE|udp:PORT`: decodes IPFIX messages (an IPFIX
//! file: messages one after the other, as `run --ipfix file:PATH` writes;
//! or datagrams received on a UDP port) and prints one line per data
//! record — flow records, NAT events and usage records by name, other
//! templates field by field — or, with `--json`, one JSON object per line.

use std::io::Write;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use flowplane_wire::ipfix::{self, ie, DataRecord, Decoder, FlowRecord, NatRecord, UsageRecord};
use serde_json::json;

use crate::error::CliError;

#[derive(Args, Debug)]
pub struct IpfixArgs {
    #[command(subcommand)]
    pub which: IpfixCmd,
}

#[derive(Subcommand, Debug)]
pub enum IpfixCmd {
    /// Decode and print the data records of an IPFIX file or of datagrams on udp:PORT.
    Read {
        /// FILE, or udp:PORT (listens on every address; stops at --count records or --idle seconds without one).
        from: String,
        /// One JSON object per record and line.
        #[arg(long)]
        json: bool,
        /// udp: stop after this many data records.
        #[arg(long, value_parser = crate::num::whole::<u64>(1, 1_000_000_000_000))]
        count: Option<u64>,
        /// udp: stop after this many seconds without a datagram (default 5).
        #[arg(long, default_value_t = 5.0, value_parser = crate::num::positive(86400.0))]
        idle: f64,
    },
}

pub fn run(a: IpfixArgs) -> Result<(), CliError> {
    let IpfixCmd::Read { from, json, count, idle } = a.which;
    let mut dec = Decoder::new();
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let mut n = 0u64;
    let mut print = |recs: Vec<DataRecord>, out: &mut dyn Write| -> Result<(), CliError> {
        for r in recs {
            n += 1;
            let line = if json { to_json(&r).to_string() } else { to_text(&r) };
            writeln!(out, "{line}").map_err(CliError::stdout)?;
        }
        Ok(())
    };
    if let Some(port) = from.strip_prefix("udp:") {
        let port: u16 = port.parse().map_err(|_| CliError::new(format!("ipfix read {from}: expected udp:PORT")))?;
        if !(idle > 0.0 && idle.is_finite()) {
            return Err(CliError::new("--idle: expected a positive number of seconds"));
        }
        let sock = UdpSocket::bind(("0.0.0.0", port)).map_err(|e| CliError::new(format!("ipfix read {from}: {e}")))?;
        sock.set_read_timeout(Some(Duration::from_millis(100)))?;
        let mut buf = vec![0u8; 65536];
        let mut last = Instant::now();
        let mut seen = 0u64;
        while count.is_none_or(|c| seen < c) && last.elapsed().as_secs_f64() < idle {
            let Ok(len) = sock.recv(&mut buf) else { continue };
            last = Instant::now();
            let recs = dec.decode(&buf[..len]).map_err(|e| CliError::new(format!("ipfix read {from}: {e}")))?;
            seen += recs.len() as u64;
            print(recs, &mut out)?;
            out.flush().map_err(CliError::stdout)?;
        }
    } else {
        let bytes = std::fs::read(&from).map_err(|e| CliError::new(format!("ipfix read {from}: {e}")))?;
        let mut at = 0;
        while at < bytes.len() {
            // Each message says its own length (checked by the decoder against what is left).
            let rest = &bytes[at..];
            let len = match ipfix::Message::new_checked(rest) {
                Ok(m) => m.length() as usize,
                Err(e) => return Err(CliError::new(format!("ipfix read {from}: message at byte {at}: {e}"))),
            };
            let recs = dec
                .decode(&rest[..len])
                .map_err(|e| CliError::new(format!("ipfix read {from}: message at byte {at}: {e}")))?;
            print(recs, &mut out)?;
            at += len;
        }
    }
    out.flush().map_err(CliError::stdout)?;
    if dec.missing > 0 || dec.unknown_sets > 0 {
        eprintln!(
            "flowplane: ipfix read: {} records missing by the sequence numbers, {} data sets without their template",
            dec.missing, dec.unknown_sets
        );
    }
    Ok(())
}

fn event_name(e: u8) -> &'static str {
    match e {
        3 => "addresses_exhausted",
        4 => "nat44_session_create",
        5 => "nat44_session_delete",
        _ => "other",
    }
}

fn is_nat(r: &DataRecord) -> bool {
    r.get(ie::NAT_EVENT).is_some()
}

fn to_text(r: &DataRecord) -> String {
    if let Some(f) = FlowRecord::from_fields(r) {
        let t = f.tuple;
        return format!(
            "flow proto {} {} {} -> {} {} packets {} bytes {} start_ms {} end_ms {} reason {} ingress {}",
            t.proto(),
            t.src_ip(),
            t.src_port(),
            t.dst_ip(),
            t.dst_port(),
            f.packets,
            f.bytes,
            f.start_ms,
            f.end_ms,
            f.reason,
            f.ingress
        ) + &f.post_dst.map_or_else(String::new, |a| format!(" to {a}"));
    }
    if let Some(n) = is_nat(r).then(|| NatRecord::from_fields(r)).flatten() {
        return format!(
            "nat {} time_ms {} proto {} {} {} -> {} {} via {} {} pool {}",
            event_name(n.event),
            n.time_ms,
            n.proto,
            n.src,
            n.sport,
            n.dst,
            n.dport,
            n.post_src,
            n.post_sport,
            n.pool
        );
    }
    if let Some(u) = UsageRecord::from_fields(r) {
        return format!(
            "usage seid {} urr {} {} bytes {} packets {} time_ms {}",
            u.seid,
            u.urr,
            if u.direction == 0 { "uplink" } else { "downlink" },
            u.bytes,
            u.packets,
            u.time_ms
        );
    }
    let fields: Vec<String> = r.fields.iter().map(|(f, v)| format!("{}={}", field_name(f), hex(v))).collect();
    format!("record template {} {}", r.template, fields.join(" "))
}

fn to_json(r: &DataRecord) -> serde_json::Value {
    if let Some(f) = FlowRecord::from_fields(r) {
        let t = f.tuple;
        let mut v = json!({
            "type": "flow", "proto": t.proto(), "src": t.src_ip().to_string(), "dst": t.dst_ip().to_string(),
            "sport": t.src_port(), "dport": t.dst_port(), "packets": f.packets, "bytes": f.bytes,
            "start_ms": f.start_ms, "end_ms": f.end_ms, "reason": f.reason, "ingress": f.ingress,
            "domain": r.domain,
        });
        if let Some(a) = f.post_dst {
            // Where the flow was sent (lb's backend).
            v["post_dst"] = json!(a.to_string());
        }
        return v;
    }
    if let Some(n) = is_nat(r).then(|| NatRecord::from_fields(r)).flatten() {
        return json!({
            "type": "nat", "event": n.event, "event_name": event_name(n.event), "time_ms": n.time_ms,
            "proto": n.proto, "src": n.src.to_string(), "sport": n.sport, "dst": n.dst.to_string(), "dport": n.dport,
            "post_src": n.post_src.to_string(), "post_sport": n.post_sport, "pool": n.pool, "domain": r.domain,
        });
    }
    if let Some(u) = UsageRecord::from_fields(r) {
        return json!({
            "type": "usage", "seid": u.seid, "urr": u.urr, "direction": if u.direction == 0 { "uplink" } else { "downlink" },
            "bytes": u.bytes, "packets": u.packets, "time_ms": u.time_ms, "domain": r.domain,
        });
    }
    let fields: serde_json::Map<String, serde_json::Value> =
        r.fields.iter().map(|(f, v)| (field_name(f), json!(hex(v)))).collect();
    json!({ "type": "record", "template": r.template, "domain": r.domain, "fields": fields })
}

fn field_name(f: &ipfix::FieldSpec) -> String {
    match (f.enterprise, ie::name(f.id)) {
        (None, Some(n)) => n.to_string(),
        (None, None) => format!("ie{}", f.id),
        (Some(e), _) => format!("ie{}/{}", e, f.id),
    }
}

fn hex(v: &[u8]) -> String {
    v.iter().map(|b| format!("{b:02x}")).collect()
}
