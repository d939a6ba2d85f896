//! Run with: `cargo run --release --example decay`
//!
//! Decay gives idle memory back without anyone calling `reap()`. Three
//! allocators over `OsPages` on the default `Threads` platform run the
//! same program one after the other: a burst (two threads each allocate
//! 128 MiB in sizes from 16 B to 64 KiB, write every byte, and after a
//! barrier free it all), then 4 s of a light trickle (every millisecond,
//! 384 objects of 48 bytes allocated and freed: magazine refills and
//! spills, the slow paths on which decay looks at the clock).
//!
//! | run | decay | the trickle runs on |
//! |---|---|---|
//! | `on` | `Decay::DEFAULT` | the main thread, which has a slot of its own |
//! | `on-burst-thread` | `Decay::DEFAULT` | a burst thread, whose slot still holds the magazines of every size it freed |
//! | `off` | `Decay::OFF` | the main thread |
//!
//! Every 50 ms the trickle samples, for the allocator under test, the
//! pages it has taken from its source (`pages_in_use`) and the pages the
//! source holds mapped (`pages_reserved`: the memory held), the decay
//! reaps so far, and the RSS of the whole process (`/proc/self/statm`).
//! After its trickle a run calls `reap()` once and then `shrink()`, so the
//! next run starts from a process that holds (almost) nothing; a run's RSS
//! is that baseline plus its own. The samples go to
//! `target/kmemcg-results/decay.csv` for
//! `cargo run --release -p kmemcg-plots`; a summary is printed.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use kmemcg::{Decay, Kmem, OsPages, PAGE_SIZE, PageSource, SourceStats};

#[path = "support/results.rs"]
mod results;

const MIB: f64 = (1 << 20) as f64;
/// Burst threads, and the bytes each allocates before freeing it all.
const BURST_THREADS: usize = 2;
const BURST_BYTES: usize = 128 << 20;
/// Smallest and largest burst size; sizes are log-uniform between them.
const MIN_SIZE: usize = 16;
const MAX_SIZE: usize = 64 << 10;
/// The trickle: a batch of `BATCH` objects of `SMALL` bytes per `TICK`.
const SMALL: usize = 48;
const BATCH: usize = 384;
const TICK: Duration = Duration::from_millis(1);
/// How long the trickle runs after the burst, and how often it samples.
const RUN: Duration = Duration::from_secs(4);
const SAMPLE: Duration = Duration::from_millis(50);
/// The times after the burst the summary reports (ms).
const REPORT_MS: [f64; 3] = [1000.0, 2000.0, 4000.0];

static ON: Kmem<OsPages> = Kmem::new(OsPages::new());
static ON_BURST_THREAD: Kmem<OsPages> = Kmem::new(OsPages::new());
static OFF: Kmem<OsPages> = Kmem::new(OsPages::new());

/// Which thread runs the trickle after the burst.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Trickler {
    /// The main thread, which took its slot before the burst.
    Main,
    /// The first burst thread, right after its frees.
    BurstThread,
}

/// One run of the program.
struct Config {
    name: &'static str,
    kmem: &'static Kmem<OsPages>,
    decay: Decay,
    trickler: Trickler,
}

static CONFIGS: [Config; 3] = [
    Config { name: "on", kmem: &ON, decay: Decay::DEFAULT, trickler: Trickler::Main },
    Config { name: "on-burst-thread", kmem: &ON_BURST_THREAD, decay: Decay::DEFAULT, trickler: Trickler::BurstThread },
    Config { name: "off", kmem: &OFF, decay: Decay::OFF, trickler: Trickler::Main },
];

/// xorshift64: a fixed, allocation-free sequence.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A size between `MIN_SIZE` and `MAX_SIZE`, log-uniform: a power of
    /// two, then a random step up to the next one.
    fn size(&mut self) -> usize {
        let steps = (MAX_SIZE / MIN_SIZE).trailing_zeros() as u64;
        let base = MIN_SIZE << (self.next() % steps);
        base + (self.next() as usize % base)
    }
}

/// The whole process's resident memory in bytes, from `/proc/self/statm`
/// (0 where it cannot be read).
fn rss_bytes() -> usize {
    // SAFETY: sysconf only reads a configuration value.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as usize;
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|r| r.parse::<usize>().ok()).unwrap_or(0) * page
}

fn mib(pages: usize) -> f64 {
    (pages * PAGE_SIZE) as f64 / MIB
}

/// One sample: ms since the burst ended, the source's counters, the
/// process RSS (bytes) and the decay reaps run so far.
#[derive(Clone, Copy)]
struct Sample {
    ms: f64,
    source: SourceStats,
    rss: usize,
    reaps: usize,
}

impl Sample {
    fn take(kmem: &Kmem<OsPages>, ms: f64) -> Sample {
        Sample { ms, source: kmem.source().stats(), rss: rss_bytes(), reaps: kmem.decay_stats().0 }
    }
    /// `held/in use` in MiB.
    fn cell(&self) -> String {
        format!("{:.1}/{:.1}", mib(self.source.pages_reserved), mib(self.source.pages_in_use))
    }
}

/// One burst thread: `BURST_BYTES` of mixed sizes, each written; waits at
/// `peak` twice (the main thread samples in between), then frees it all.
fn burst(kmem: &Kmem<OsPages>, seed: u64, peak: &Barrier) {
    let mut rng = Rng(seed);
    // The pointers live on the system heap, not in `kmem`.
    let mut live = Vec::with_capacity(BURST_BYTES / 4096);
    let mut bytes = 0;
    while bytes < BURST_BYTES {
        let l = Layout::from_size_align(rng.size(), 8).unwrap();
        // SAFETY: a valid layout of nonzero size.
        let p = unsafe { kmem.alloc(l) };
        assert!(!p.is_null(), "the burst ran out of memory");
        // SAFETY: `p` is a fresh block of `l.size()` bytes.
        unsafe { p.write_bytes(0xA5, l.size()) };
        live.push((p, l));
        bytes += l.size();
    }
    peak.wait();
    peak.wait();
    for (p, l) in live {
        // SAFETY: each block is freed once, with its layout.
        unsafe { kmem.dealloc(p, l) };
    }
}

/// Allocates and frees one batch of small objects into `batch` (kept on
/// the system heap so that it never grows).
fn small_batch(kmem: &Kmem<OsPages>, batch: &mut Vec<*mut u8>) {
    let small = Layout::from_size_align(SMALL, 8).unwrap();
    for _ in 0..BATCH {
        // SAFETY: a valid layout of nonzero size.
        let p = unsafe { kmem.alloc(small) };
        assert!(!p.is_null(), "the trickle ran out of memory");
        batch.push(p);
    }
    for p in batch.drain(..) {
        // SAFETY: each block is freed once, with its layout.
        unsafe { kmem.dealloc(p, small) };
    }
}

/// The trickle, from `end` (the end of the burst) for `RUN`, sampling
/// every `SAMPLE`.
fn trickle(kmem: &Kmem<OsPages>, end: Instant) -> Vec<Sample> {
    let mut batch = Vec::with_capacity(BATCH);
    let mut samples = vec![Sample::take(kmem, 0.0)];
    let (mut next_sample, mut next_tick) = (SAMPLE, Duration::ZERO);
    while end.elapsed() < RUN {
        small_batch(kmem, &mut batch);
        let now = end.elapsed();
        if now >= next_sample {
            samples.push(Sample::take(kmem, now.as_secs_f64() * 1e3));
            next_sample += SAMPLE;
        }
        next_tick += TICK;
        if let Some(wait) = next_tick.checked_sub(end.elapsed()) {
            thread::sleep(wait);
        }
    }
    samples.push(Sample::take(kmem, end.elapsed().as_secs_f64() * 1e3));
    samples
}

/// What one run saw.
struct Run {
    /// At the burst's peak (ms < 0: before the burst ended).
    peak: Sample,
    /// From the end of the burst on.
    samples: Vec<Sample>,
    /// After the trickle: one `reap()` (pages it gave back, then the
    /// source), then `shrink()`.
    reaped: (usize, SourceStats),
    shrunk: (usize, SourceStats),
}

impl Run {
    /// The last sample taken at or before `ms`.
    fn at(&self, ms: f64) -> Sample {
        *self.samples.iter().rev().find(|s| s.ms <= ms).unwrap_or(&self.samples[0])
    }
}

fn run(c: &Config) -> Run {
    let kmem = c.kmem;
    kmem.set_decay(c.decay);
    if c.trickler == Trickler::Main {
        // The main thread takes its slot now, so it adopts none a burst
        // thread leaves (slots are process-wide: after the first run it
        // has one already).
        small_batch(kmem, &mut Vec::with_capacity(BATCH));
    }
    let (peak, done) = (Barrier::new(BURST_THREADS + 1), Barrier::new(BURST_THREADS + 1));
    let (mut top, peak_at, end, samples) = thread::scope(|s| {
        let threads: Vec<_> = (0..BURST_THREADS)
            .map(|t| {
                let (peak, done) = (&peak, &done);
                s.spawn(move || {
                    burst(kmem, 0x9E37_79B9_7F4A_7C15 ^ t as u64, peak);
                    done.wait();
                    let end = Instant::now();
                    (t == 0 && c.trickler == Trickler::BurstThread).then(|| trickle(kmem, end))
                })
            })
            .collect();
        peak.wait();
        let top = Sample::take(kmem, 0.0);
        let peak_at = Instant::now();
        peak.wait();
        // The burst ends when every burst thread has freed everything.
        done.wait();
        let end = Instant::now();
        let mine = (c.trickler == Trickler::Main).then(|| trickle(kmem, end));
        let theirs = threads.into_iter().filter_map(|t| t.join().expect("a burst thread panicked")).next();
        (top, peak_at, end, mine.or(theirs).expect("one thread ran the trickle"))
    });
    top.ms = -(end - peak_at).as_secs_f64() * 1e3;
    let reaped = (kmem.reap(), kmem.source().stats());
    let shrunk = (kmem.shrink(), kmem.source().stats());
    Run { peak: top, samples, reaped, shrunk }
}

fn main() {
    println!(
        "burst: {BURST_THREADS} threads x {} MiB in sizes {MIN_SIZE} B..{} KiB, written, then freed; \
         then {} s of {BATCH} x {SMALL} B allocated and freed every {} ms",
        BURST_BYTES >> 20,
        MAX_SIZE >> 10,
        RUN.as_secs(),
        TICK.as_millis()
    );
    println!(
        "held = pages the OsPages source keeps mapped; in use = pages the allocator took from it\n\
         RSS = the whole process: a baseline (binary, system heap, what earlier runs kept after shrink()) plus this run\n"
    );
    let runs: Vec<Run> = CONFIGS.iter().map(run).collect();

    let w = CONFIGS.iter().map(|c| c.name.len()).max().unwrap_or(0);
    println!(
        "{:<w$} {:>13} {:>13} {:>13} {:>13} {:>13}   decay reaps (pages)",
        "decay", "peak", "burst end", "+1 s", "+2 s", "+4 s"
    );
    for (c, r) in CONFIGS.iter().zip(&runs) {
        let (reaps, pages) = c.kmem.decay_stats();
        let [a, b, d] = REPORT_MS.map(|ms| r.at(ms).cell());
        println!(
            "{:<w$} {:>13} {:>13} {a:>13} {b:>13} {d:>13}   {reaps} ({pages})",
            c.name,
            r.peak.cell(),
            r.samples[0].cell()
        );
    }
    println!("(MiB held by the source / in use by the allocator)\n");

    println!("{:<w$} {:>9} {:>9} {:>9} {:>9} {:>9}", "RSS", "peak", "burst end", "+1 s", "+2 s", "+4 s");
    for (c, r) in CONFIGS.iter().zip(&runs) {
        let rss = |s: Sample| format!("{:.1}", s.rss as f64 / MIB);
        let [a, b, d] = REPORT_MS.map(|ms| rss(r.at(ms)));
        println!("{:<w$} {:>9} {:>9} {a:>9} {b:>9} {d:>9}", c.name, rss(r.peak), rss(r.samples[0]));
    }
    println!("(MiB of process RSS)\n");

    println!("after the trickle: one reap(), then shrink()");
    for (c, r) in CONFIGS.iter().zip(&runs) {
        let ((rp, rs), (sp, ss)) = (r.reaped, r.shrunk);
        println!(
            "{:<w$} reap(): {rp:>6} pages back, {:>12} MiB    shrink(): {sp:>6} pages back, {:>10} MiB",
            c.name,
            format!("{:.1}/{:.1}", mib(rs.pages_reserved), mib(rs.pages_in_use)),
            format!("{:.1}/{:.1}", mib(ss.pages_reserved), mib(ss.pages_in_use)),
        );
    }

    let rows: Vec<String> = CONFIGS
        .iter()
        .zip(&runs)
        .flat_map(|(c, r)| {
            std::iter::once(&r.peak).chain(&r.samples).map(move |s| {
                format!(
                    "{},{:.1},{},{},{:.2},{:.2},{:.2},{}",
                    c.name,
                    s.ms,
                    s.source.pages_in_use,
                    s.source.pages_reserved,
                    mib(s.source.pages_in_use),
                    mib(s.source.pages_reserved),
                    s.rss as f64 / MIB,
                    s.reaps
                )
            })
        })
        .collect();
    let header = "run,ms,pages_in_use,pages_reserved,in_use_mib,held_mib,rss_mib,decay_reaps";
    results::write_csv("decay.csv", header, &rows);
}
