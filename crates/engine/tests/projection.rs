//! `--virtual-cores`: N logical workers taking turns on one real core,
//! each with its own ring and tables; the projected throughput (packets /
//! the busiest worker's own busy time) for N = 2 matches a real 2-core run
//! within 15%, the real run measured the same way (packets / its busiest
//! core's busy time: the machine is shared, and time a core spends
//! descheduled between batches is not the chain's). Its own test binary:
//! nothing else runs beside it.

use flowplane_engine::exec::ExecConfig;
use flowplane_engine::runner::{run_input, Input, Output};
use flowplane_engine::spec::parse;
use flowplane_engine::RunConfig;
use flowplane_trace::gen::{GenConfig, Generator};
use std::time::Duration;

fn mpps(cores: usize, virt: Option<usize>) -> f64 {
    let cfg = RunConfig {
        cores,
        virtual_cores: virt,
        pin: true,
        loops: None,
        duration: Some(Duration::from_millis(600)),
        warmup: Some(Duration::from_millis(200)),
        exec: ExecConfig { flows: 1 << 17, hugepages: false, ..ExecConfig::default() },
        ..RunConfig::default()
    };
    let gen = GenConfig { flows: 50_000, packets: 400_000, seed: 3, ..GenConfig::default() };
    let r = run_input(
        &cfg,
        &parse("lb -> fsc -> ratelimit").unwrap(),
        Input::Generated(Box::new(Generator::new(gen).unwrap())),
        false,
        Output::Discard,
    )
    .unwrap()
    .report;
    let sc = r.scale.unwrap();
    match virt {
        Some(_) => sc.projected_mpps.unwrap(),
        None => sc.busy_mpps,
    }
}

/// CPU time (jiffies) of the whole machine (busy, incl. steal) and of this process.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let f: Vec<u64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal: all but idle and iowait.
    let busy = f.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, v)| v).sum();
    let me = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let rest: Vec<&str> = me.rsplit_once(')')?.1.split_whitespace().collect();
    let mine = rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?;
    Some((busy, mine))
}

/// Wall time of a fixed amount of arithmetic (no memory traffic) on each of
/// `threads` threads pinned to CPUs 0.. at once; the slowest thread's.
fn spin_seconds(threads: usize) -> f64 {
    let hs: Vec<_> = (0..threads)
        .map(|c| {
            std::thread::spawn(move || {
                flowplane_io::cpu::pin_current_thread(c);
                let t = std::time::Instant::now();
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ c as u64;
                for _ in 0..60_000_000u32 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                }
                std::hint::black_box(x);
                t.elapsed().as_secs_f64()
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).fold(0.0, f64::max)
}

/// Whether two CPUs run at once as fast as one alone. A projection adds
/// up one core's work and assumes independent cores; two vCPUs that are
/// hyperthreads of one physical core (or a host oversubscribed under the
/// VM) break that assumption, and no projection can match such a machine.
fn cpus_independent() -> bool {
    let best = |n| (0..3).map(|_| spin_seconds(n)).fold(f64::MAX, f64::min);
    let (one, two) = (best(1), best(2));
    eprintln!("fixed work: one CPU alone {:.1} ms, two at once {:.1} ms", one * 1e3, two * 1e3);
    two <= one * 1.10
}

/// One round: best of five each, the real and projected runs interleaved.
/// None when the machine was too busy or noisy for a comparison to hold.
fn round() -> Option<(f64, f64)> {
    // Best of five each: other processes on the machine only ever slow a run down.
    let spread = |v: &[f64]| {
        let (lo, hi) = v.iter().fold((f64::MAX, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
        (hi, (hi - lo) / hi.max(1e-9))
    };
    // Interleaved: a slow spell of the machine hits both alike.
    let (mut r, mut p) = (Vec::new(), Vec::new());
    let (t0, c0) = (std::time::Instant::now(), cpu_jiffies());
    for _ in 0..5 {
        r.push(mpps(2, None));
        p.push(mpps(1, Some(2)));
    }
    // Other processes' share of the machine meanwhile (steal included): two
    // real cores contend with them for the CPUs and the caches, one core
    // taking turns much less, so a busy machine skews the ratio itself.
    if let (Some((b0, m0)), Some((b1, m1))) = (c0, cpu_jiffies()) {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let jiffies = t0.elapsed().as_secs_f64() * 100.0 * cpus;
        let others = (b1 - b0).saturating_sub(m1 - m0) as f64 / jiffies.max(1.0);
        if others > 0.15 {
            eprintln!("other processes had {:.0}% of the CPUs during the round", others * 100.0);
            return None;
        }
    }
    let (real, noise_r) = spread(&r);
    let (projected, noise_p) = spread(&p);
    if noise_r.max(noise_p) > 0.3 {
        // Runs of one configuration disagree by more than the tolerance.
        eprintln!("round too noisy to compare (spread {noise_r:.2} / {noise_p:.2})");
        return None;
    }
    Some((real, projected))
}

/// A performance figure checked against a tolerance, on a shared machine:
/// busy time counts a batch the OS interrupted at the worker's recent cost
/// (`busy_on_cpu`), so time off the CPU is not the chain's. Up to six
/// rounds: the projection holds when one round lands within 15%; it fails
/// when two rounds that could compare missed and none landed (one miss among
/// rounds too noisy to compare is not evidence: a neighbour's burst can pass
/// the noise checks once). Every comparable round is printed.
#[test]
fn two_virtual_cores_project_a_real_two_core_run() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("one CPU: skipped");
        return;
    }
    if !cpus_independent() {
        eprintln!("the two CPUs slow each other down on fixed arithmetic (shared physical core or host): skipped");
        return;
    }
    let mut missed = Vec::new();
    for _ in 0..6 {
        let Some((real, projected)) = round() else { continue };
        let ratio = projected / real;
        eprintln!("real 2 cores {real:.2} Mpps, projected {projected:.2} Mpps, ratio {ratio:.3}");
        if (0.85..=1.15).contains(&ratio) {
            return;
        }
        missed.push(format!("real {real:.2}, projected {projected:.2}"));
        if missed.len() == 2 {
            break;
        }
    }
    assert!(missed.len() < 2, "projection off by more than 15% in every comparable round: {}", missed.join("; "));
    eprintln!("fewer than two rounds quiet enough to compare: skipped");
}
