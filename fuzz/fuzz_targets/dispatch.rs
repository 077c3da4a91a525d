//! The live-port dispatcher: any bytes as packets, under every spread, with
//! flow-director rules, the symmetric key, ICMP by quoted flow and RETA moves
//! started mid-stream. Never panics; every packet received is handed to a
//! worker or counted (ring full, oversize); a moved key's packets wait for its
//! state and each worker sees its packets in arrival order.
#![no_main]

use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use flowplane_fuzz::for_each_record;
use flowplane_io::dispatch::{DispatchedSource, Dispatcher, Spread};
use flowplane_io::port::RxQueue;
use flowplane_io::{Rx, Source};
use flowplane_packet::{Batch, PacketPool, PoolConfig, MAX_BATCH};
use flowplane_scale::steer::{Classifier, FdirRule, HashOn, Steering};
use libfuzzer_sys::fuzz_target;

/// Frames handed out up to 32 per burst.
struct Frames(std::collections::VecDeque<Vec<u8>>);

impl RxQueue for Frames {
    fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize) -> usize {
        let mut n = 0;
        while n < max.min(32) {
            let Some(f) = self.0.pop_front() else { break };
            // Frames the pool cannot hold are the port's oversize drops, not the dispatcher's.
            if batch.push_copy(pool, &f, n as u64) {
                n += 1;
            }
        }
        n
    }
}

fn drain(s: &mut DispatchedSource, pool: &mut PacketPool, b: &mut Batch, got: &mut Vec<Vec<u8>>) {
    while let Rx::Packets(_) = s.rx_burst(pool, b, MAX_BATCH, 0) {
        for i in 0..b.len() {
            got.push(b.data(i).to_vec());
        }
        b.free_all(pool).unwrap();
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, data)) = data.split_first() else { return };
    let mut frames = Vec::new();
    let mut cuts = Vec::new();
    for_each_record(data, 2048, |f, gap| {
        frames.push(f.to_vec());
        if gap.flush() {
            cuts.push(frames.len());
        }
    });
    let rules = if cfg & 4 != 0 {
        vec![FdirRule { proto: None, dst: Some((Ipv4Addr::new(203, 0, 113, 1), 32)), dst_ports: (0, 32767), queue: 1 }]
    } else {
        Vec::new()
    };
    let Ok(c) = Classifier::new(64, cfg & 1 != 0, HashOn::FiveTuple, cfg & 2 != 0, rules) else { return };
    let st = Arc::new(Steering::new(2, &c, &[]).unwrap());
    let pool = PacketPool::new(PoolConfig { buffers: 1024, ..PoolConfig::default() }).unwrap();
    let spread = if cfg & 8 != 0 { Spread::Spray } else { Spread::Table };
    let total = frames.len();
    let input = Frames(frames.iter().cloned().collect());
    let (d, mut srcs) =
        Dispatcher::new(vec![(Box::new(input), pool)], c.clone(), Arc::clone(&st), spread, 512).unwrap();
    let mut d = if cfg & 16 != 0 { d.with_moves() } else { d };
    let stats = d.stats();
    let mut wpool = PacketPool::new(PoolConfig { buffers: 1024, ..PoolConfig::default() }).unwrap();
    let mut b = Batch::new(&wpool);
    let mut got = [Vec::new(), Vec::new()];
    let mut cut = cuts.into_iter();
    loop {
        let n = d.poll();
        // A move of the next cut's key, its state handed over at once (the old owner's marker first).
        if let (true, Some(i)) = (cfg & 16 != 0, cut.next()) {
            if let Some((key, _)) = frames.get(i).and_then(|f| c.classify(f)) {
                let to = 1 - st.owners()[key as usize];
                let _ = st.start_move(key, to);
            }
        }
        for w in 0..2 {
            drain(&mut srcs[w], &mut wpool, &mut b, &mut got[w]);
            while let Some(mv) = srcs[w].take_due() {
                st.imported(mv);
            }
        }
        if n == 0 && d.poll() == 0 {
            break;
        }
    }
    for w in 0..2 {
        drain(&mut srcs[w], &mut wpool, &mut b, &mut got[w]);
    }
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let (pk, dl, ov) = (l(&stats.packets), l(&stats.delivered), l(&stats.oversize));
    let full: u64 = stats.ring_full.iter().map(l).sum();
    assert_eq!(pk as usize, total, "every frame received");
    assert_eq!(pk, dl + ov + full, "delivered or counted");
    assert_eq!((got[0].len() + got[1].len()) as u64, dl, "what was delivered reached a worker");
    // Each worker's packets are a subsequence of the input (arrival order kept).
    for g in &got {
        let mut it = frames.iter();
        for f in g {
            assert!(it.any(|x| x == f), "a worker's packets keep the input's order");
        }
    }
});
