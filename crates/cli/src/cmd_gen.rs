//! `flowplane gen`: synthetic traffic to a pcap file. Owns the `gen` options
//! ([`GenArgs`]), which `flowplane run --gen "..."` reuses (via
//! [`GenArgs::to_config`]) to generate straight into memory.
//!
//! Option values are taken as text and parsed by `to_config`, so that every
//! bad value gives one line naming the option (clap's own value errors span
//! several lines).

use std::path::PathBuf;

use flowplane_trace::gen::{self, FlowDist, GenConfig, Order, Pattern, Proto, SizeSpec};

use crate::error::CliError;

#[derive(clap::Args, Debug, Clone)]
pub struct GenArgs {
    /// Output pcap file (nanosecond timestamps).
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// Flow population.
    #[arg(long, value_name = "N", default_value = "1000")]
    pub flows: String,
    /// Packets to generate.
    #[arg(long, value_name = "N", default_value = "100000")]
    pub packets: String,
    /// Frame length in bytes (no FCS): N or MIN..MAX.
    #[arg(long, value_name = "N|MIN..MAX")]
    pub size: Option<String>,
    /// Empirical size mix: imix, "64:0.5,576:0.3,1500:0.2", or a file of "size weight" lines.
    #[arg(long, value_name = "SPEC|FILE", conflicts_with = "size")]
    pub size_mix: Option<String>,
    /// Flow popularity: uniform | zipf:A | elephants:K (or elephants:K:SHARE) | cdf:FILE.
    #[arg(long, value_name = "DIST", default_value = "uniform")]
    pub dist: String,
    /// Trace profile like the SCR evaluation's: univdc (many short flows), backbone (Zipf over 1M
    /// flows), hyperscale (web-search flow-size CDF, TCP both directions), single (one flow);
    /// sets --flows, --dist and --proto.
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// Packet order: random | burst (or burst:N).
    #[arg(long, value_name = "ORDER", default_value = "random")]
    pub order: String,
    /// Transport: udp | tcp | tcp-bidir | gtpu | amf (the `amf` NF's messages over UDP 38412, one UE per flow: a
    /// registration, then 45% service requests, 25% PDU sessions, 20% handovers, 10% deregistrations).
    #[arg(long, value_name = "PROTO", default_value = "udp")]
    pub proto: String,
    /// IPv6 outer headers (udp, tcp, tcp-bidir).
    #[arg(long)]
    pub ipv6: bool,
    /// Add K port scanners sweeping destination ports (TCP SYN probes).
    #[arg(long, value_name = "K")]
    pub portscan: Option<String>,
    /// Add port-knocking sources (SCR Appendix C: knocks on 1, 2, 3, then port 22; correct and wrong sequences).
    #[arg(long, conflicts_with = "portscan")]
    pub portknock: bool,
    /// Fraction of packets taken by --portscan/--portknock.
    #[arg(long, value_name = "F", default_value = "0.1")]
    pub pattern_share: String,
    /// Every R-th packet opens a new flow; the others go to the --flows most recent flows.
    #[arg(long, value_name = "R")]
    pub new_flow_every: Option<String>,
    /// Shifting skew: every N packets the popularity ranks move to other flows (the heavy flows change).
    #[arg(long)]
    pub shift_every: Option<String>,
    /// Packet rate for the timestamps (accepts k/M/G suffixes).
    #[arg(long, value_name = "PPS", default_value = "10M")]
    pub rate: String,
    /// UPF traffic with --proto gtpu: SESSIONSxPDRS[:ul|dl|both] (sets --flows; the session file is `flowplane upf sessions`).
    #[arg(long, value_name = "NxM[:DIR]")]
    pub upf: Option<String>,
    /// PRNG seed: same options and seed give a byte-identical trace.
    #[arg(long, value_name = "S", default_value = "1")]
    pub seed: String,
}

fn parse_u64(opt: &str, v: &str) -> Result<u64, CliError> {
    let t = v.trim().replace('_', "");
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1_000),
        Some('M') => (&t[..t.len() - 1], 1_000_000),
        Some('G') => (&t[..t.len() - 1], 1_000_000_000),
        _ => (&t[..], 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| CliError::new(format!("--{opt} '{v}': expected a non-negative integer")))
}

pub(crate) fn parse_f64(opt: &str, v: &str) -> Result<f64, CliError> {
    let t = v.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1e3),
        Some('M') => (&t[..t.len() - 1], 1e6),
        Some('G') => (&t[..t.len() - 1], 1e9),
        _ => (t, 1.0),
    };
    match num.parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x * mult),
        _ => Err(CliError::new(format!("--{opt} '{v}': expected a number"))),
    }
}

impl GenArgs {
    /// The generator configuration these options describe.
    pub fn to_config(&self) -> Result<GenConfig, CliError> {
        let size = match (&self.size, &self.size_mix) {
            (_, Some(m)) => SizeSpec::parse_mix(m)?,
            (Some(s), None) => SizeSpec::parse_size(s).map_err(|e| CliError::new(format!("--size: {e}")))?,
            (None, None) => SizeSpec::Fixed(64),
        };
        let pattern = match (&self.portscan, self.portknock) {
            (Some(k), _) => Pattern::PortScan(parse_u64("portscan", k)?),
            (None, true) => Pattern::PortKnock,
            (None, false) => Pattern::None,
        };
        let new_flow_every = self.new_flow_every.as_deref().map(|r| parse_u64("new-flow-every", r)).transpose()?;
        let upf = self.upf.as_deref().map(str::parse::<gen::UpfPlan>).transpose()?;
        let cfg = GenConfig {
            flows: match upf {
                Some(u) => u.flows(),
                None => parse_u64("flows", &self.flows)?,
            },
            packets: parse_u64("packets", &self.packets)?,
            size,
            dist: self.dist.parse::<FlowDist>()?,
            order: self.order.parse::<Order>()?,
            proto: self.proto.parse::<Proto>()?,
            ipv6: self.ipv6,
            pattern,
            pattern_share: parse_f64("pattern-share", &self.pattern_share)?,
            new_flow_every,
            rate_pps: parse_f64("rate", &self.rate)?,
            seed: parse_u64("seed", &self.seed)?,
            upf,
            shift_every: self.shift_every.as_deref().map(|r| parse_u64("shift-every", r)).transpose()?,
        };
        let cfg = match &self.profile {
            Some(p) => cfg.with_profile(p)?,
            None => cfg,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

pub fn run(args: GenArgs) -> Result<(), CliError> {
    let cfg = args.to_config()?;
    let Some(out) = args.output.as_deref() else {
        return Err(CliError::new("gen: missing output file (-o FILE.pcap)"));
    };
    let start = std::time::Instant::now();
    let sum = gen::write_pcap(cfg, out)?;
    let secs = start.elapsed().as_secs_f64();
    flowplane_trace::progress::note(&format!(
        "flowplane: wrote {} packets ({} bytes) to {} in {:.2} s ({:.1} Mpps)",
        sum.packets,
        sum.bytes,
        out.display(),
        secs,
        sum.packets as f64 / secs.max(1e-9) / 1e6
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    #[command(no_binary_name = true)]
    struct Wrap {
        #[command(flatten)]
        args: GenArgs,
    }

    fn parse_spec(s: &str) -> Result<GenArgs, clap::Error> {
        Wrap::try_parse_from(s.split_whitespace()).map(|w| w.args)
    }

    #[test]
    fn spec_round_trip() {
        let a = parse_spec("--flows 1k --packets 10000 --dist zipf:1.1 --order burst:4").expect("parse");
        let c = a.to_config().expect("config");
        assert_eq!((c.flows, c.packets, c.order), (1000, 10_000, Order::Burst(4)));
        assert_eq!(c.dist, FlowDist::Zipf(1.1));
        assert_eq!(c.rate_pps, 10e6);
        assert!(parse_spec("--bogus 3").is_err());
        let e = parse_spec("--flows x").unwrap().to_config().expect_err("bad number").to_string();
        assert!(e.contains("--flows"), "{e}");
    }
}
