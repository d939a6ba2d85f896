//! Seed 003's netperf TCP_RR analog: 1-byte request/response over loopback
//! TCP for a fixed time, with and without buffer accounting.
//!
//! Run with: `cargo bench --bench tcp_rr`
//!
//! One client and one server thread over 127.0.0.1. With accounting, the
//! server charges and uncharges its receive buffer to a tenant's `"tcp"`
//! pressure resource around every request, as a stack that accounts socket
//! memory per packet would. Runs of 2 s alternate (6 each, each kind
//! first in every other pair); the table gives transactions per second
//! (median) and the ratio, beside the seed's (26996 vs 27291: within 1%).
//!
//! On a shared machine two runs of the same loop differ by more than 1%
//! (an A/A pair, both without accounting, is in the table for the noise
//! floor), so the bench also times what accounting adds to a transaction,
//! the server's `charge` and `uncharge`, on their own (a loop of 1M
//! pairs, median of 5), and gives it as a share of a transaction's time:
//! that share is the throughput cost, and it is resolvable.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use kmemcg::{Kmem, OsPages, Pressure, PressureState, Thresholds};

#[global_allocator]
static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

fn round(tcp: Option<Arc<Pressure<'static, Kmem<OsPages>>>>) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut b = [0u8; 1];
        loop {
            if let Some(t) = &tcp
                && t.charge(1) == PressureState::Refused
            {
                thread::yield_now();
            }
            if s.read_exact(&mut b).is_err() {
                break;
            }
            s.write_all(&b).unwrap();
            if let Some(t) = &tcp {
                t.uncharge(1).unwrap();
            }
        }
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    let t = Instant::now();
    let mut n = 0u64;
    let mut b = [1u8; 1];
    while t.elapsed() < Duration::from_secs(2) {
        c.write_all(&b).unwrap();
        c.read_exact(&mut b).unwrap();
        n += 1;
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    drop(c);
    server.join().unwrap();
    rate
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let g = KMEM.root().create_child("tenant").unwrap();
    let tcp = Arc::new(g.pressure("tcp", Thresholds { min: 1 << 20, pressure: 4 << 20, max: 8 << 20 }).unwrap());
    let (mut off, mut on, mut again) = (Vec::new(), Vec::new(), Vec::new());
    // Rounds alternate, and so does which kind goes first: the second run
    // of a pair would otherwise always be the accounted one.
    for i in 0..6 {
        if i % 2 == 0 {
            off.push(round(None));
            on.push(round(Some(tcp.clone())));
            again.push(round(None));
        } else {
            on.push(round(Some(tcp.clone())));
            again.push(round(None));
            off.push(round(None));
        }
    }
    let (off, on, again) = (median(off), median(on), median(again));
    let calls = accounting_ns(&tcp);
    println!("| TCP_RR (1 byte) | transactions/s | ratio |");
    println!("|---|---|---|");
    println!("| without accounting | {off:.0} | 1.000 |");
    println!("| with accounting | {on:.0} | {:.3} |", on / off);
    println!("| without accounting again (A/A: the noise floor) | {again:.0} | {:.3} |", again / off);
    println!("| seed 003 (netperf) | 27291 vs 26996 | 0.989 |");
    let txn_ns = 1e9 / off;
    println!(
        "accounting per transaction (charge + uncharge, timed alone): {calls:.1} ns of {:.1} us, {:.4}% of a transaction",
        txn_ns / 1e3,
        100.0 * calls / txn_ns
    );
}

/// One `charge(1)` and `uncharge(1)` of the resource, as the server makes
/// per transaction, in ns: the median of 5 loops of 1M.
fn accounting_ns(tcp: &Pressure<'static, Kmem<OsPages>>) -> f64 {
    const N: u32 = 1_000_000;
    let loops = (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..N {
                std::hint::black_box(tcp.charge(1));
                tcp.uncharge(1).unwrap();
            }
            t.elapsed().as_nanos() as f64 / f64::from(N)
        })
        .collect();
    median(loops)
}
