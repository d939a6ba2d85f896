//! The TCP buffer demo shared by `examples/tcp_buffers.rs` and
//! `tests/tcp_buffers.rs`: an echo server on 127.0.0.1 whose connections
//! belong to tenant groups and charge their receive buffers to the
//! tenant's `"tcp"` pressure resource, and a client driving the tenants.
//!
//! A connection's buffer starts at 4 KiB and doubles (up to 256 KiB) when
//! a read fills it, charging the growth first: under pressure it does not
//! grow and drops back to 4 KiB (as TCP shrinks its windows); refused, it
//! does not grow and the connection backs off for a millisecond before
//! reading again (backpressure the client feels as slower echoes, never as
//! an error).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use kmemcg::{Cgroup, Kmem, OsPages, Pressure, PressureState, Thresholds};

pub const KIB: usize = 1 << 10;
const MIN_BUF: usize = 4 * KIB;
const MAX_BUF: usize = 256 * KIB;

/// One tenant: its group, its `"tcp"` resource, and what happened to it.
pub struct Tenant {
    pub name: &'static str,
    pub group: Cgroup<'static, Kmem<OsPages>>,
    pub tcp: Pressure<'static, Kmem<OsPages>>,
    /// Bytes the client got back.
    pub echoed: AtomicUsize,
    /// Connections the client opens, and the size of each request.
    pub conns: usize,
    pub request: usize,
}

/// Creates the host group (its `tcp` max covers every tenant) and the
/// tenants: two modest ones and a greedy one.
pub fn tenants(kmem: &'static Kmem<OsPages>) -> Vec<Arc<Tenant>> {
    let host = kmem.root().create_child("host").unwrap();
    host.pressure("tcp", Thresholds { min: 256 * KIB, pressure: 1024 * KIB, max: 4096 * KIB }).unwrap();
    let mk = |name: &'static str, conns: usize, request: usize| {
        let group = host.create_child(name).unwrap();
        let tcp = group.pressure("tcp", Thresholds { min: 64 * KIB, pressure: 384 * KIB, max: 512 * KIB }).unwrap();
        Arc::new(Tenant { name, group, tcp, echoed: AtomicUsize::new(0), conns, request })
    };
    vec![mk("alpha", 2, 2 * KIB), mk("beta", 2, 4 * KIB), mk("greedy", 8, 256 * KIB)]
}

/// Serves one connection of `t` until the client closes it.
fn serve(mut s: TcpStream, t: Arc<Tenant>) {
    let _in = t.group.enter();
    let mut buf = vec![0u8; MIN_BUF];
    t.tcp.charge(MIN_BUF);
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if s.write_all(&buf[..n]).is_err() {
            break;
        }
        if n == buf.len() && buf.len() < MAX_BUF {
            let grow = buf.len();
            match t.tcp.charge(grow) {
                PressureState::Normal => buf.resize(buf.len() * 2, 0),
                PressureState::UnderPressure => {
                    // Do not grow; give back what is above the minimum.
                    t.tcp.uncharge(grow).expect("charged before");
                    let extra = buf.len() - MIN_BUF;
                    buf.truncate(MIN_BUF);
                    buf.shrink_to_fit();
                    t.tcp.uncharge(extra).expect("charged before");
                }
                PressureState::Refused => thread::sleep(Duration::from_millis(1)),
            }
        }
    }
    t.tcp.uncharge(buf.len()).expect("charged before");
}

/// Runs the server and the client for `run`; returns when every
/// connection is closed.
pub fn run(tenants: &[Arc<Tenant>], run: Duration) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let total: usize = tenants.iter().map(|t| t.conns).sum();
    let server = {
        let tenants: Vec<_> = tenants.to_vec();
        thread::spawn(move || {
            let mut hs = Vec::new();
            for _ in 0..total {
                let (mut s, _) = listener.accept().unwrap();
                let mut id = [0u8];
                s.read_exact(&mut id).unwrap();
                let t = tenants[id[0] as usize].clone();
                hs.push(thread::spawn(move || serve(s, t)));
            }
            for h in hs {
                h.join().unwrap();
            }
        })
    };
    let mut clients = Vec::new();
    for (i, t) in tenants.iter().enumerate() {
        for _ in 0..t.conns {
            let (t, stop) = (t.clone(), stop.clone());
            clients.push(thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_nodelay(true).unwrap();
                s.write_all(&[i as u8]).unwrap();
                let out = vec![7u8; t.request];
                let mut back = vec![0u8; t.request];
                while !stop.load(Ordering::Relaxed) {
                    s.write_all(&out).unwrap();
                    s.read_exact(&mut back).unwrap();
                    assert!(back.iter().all(|&b| b == 7), "echo corrupted");
                    t.echoed.fetch_add(t.request, Ordering::Relaxed);
                }
            }));
        }
    }
    let start = Instant::now();
    while start.elapsed() < run {
        thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    server.join().unwrap();
}

/// The per-tenant table.
pub fn table(tenants: &[Arc<Tenant>]) -> String {
    let mut s = format!(
        "{:<8} {:>12} {:>10} {:>10} {:>10} {:>12}\n",
        "tenant", "echoed KiB", "peak KiB", "max KiB", "entries", "refusals"
    );
    for t in tenants {
        s += &format!(
            "{:<8} {:>12} {:>10} {:>10} {:>10} {:>12}\n",
            t.name,
            t.echoed.load(Ordering::Relaxed) / KIB,
            t.tcp.peak() / KIB,
            t.tcp.thresholds().max / KIB,
            t.tcp.entered(),
            t.tcp.refused()
        );
    }
    s
}
