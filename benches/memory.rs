//! Memory, not time: how many pages kmemcg holds for a workload.
//!
//! Run with: `cargo bench --bench memory`
//!
//! Runs the `random` workload of `benches/alloc.rs` (10k live slots,
//! log-uniform sizes 8..=4096, fixed seed) on its own `Kmem<OsPages>`, then
//! frees everything and reaps. Prints CSV: phase, live bytes, peak live
//! bytes, pages in use from the page source, pages mapped, and the ratio of
//! bytes held to peak live bytes; then the slabs left per cache. On
//! stderr: where the pages over the live bytes go, the pages in use at
//! their most, and the floor of any allocator that keeps each size
//! class's slots to that class (`segregated_bound`).
//!
//! Then the footprint against peers: the same 2M steps, each allocator
//! alone in a fresh process (this binary run again with
//! `KMEMCG_FOOTPRINT=<allocator>`), the process's peak resident memory
//! (`VmHWM`) less what it held before the first step (`VmRSS`), over the
//! peak live bytes; three runs per allocator, interleaved, medians.

#[path = "../examples/support/workloads.rs"]
mod workloads;

use std::alloc::{GlobalAlloc, Layout, System};

use kmemcg::{Kmem, OsPages, PAGE_SIZE, PageSource};
use mimalloc::MiMalloc;
use talc::TalcLock;
use talc::source::GlobalAllocSource;
use tikv_jemallocator::Jemalloc;
use workloads::{Alloc, Rng};

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());
static TALC: TalcLock<spin::mutex::SpinMutex<()>, GlobalAllocSource<System>> =
    TalcLock::new(GlobalAllocSource::new(System));

const ALLOCATORS: [(&str, Alloc); 5] =
    [("kmemcg", &KMEM), ("jemalloc", &Jemalloc), ("mimalloc", &MiMalloc), ("system", &System), ("talc", &TALC)];

const LIVE: usize = 10_000;
const STEPS: usize = 2_000_000;

fn row(k: &Kmem<OsPages>, phase: &str, live: usize, peak: usize) {
    let st = k.source().stats();
    println!(
        "{phase},{live},{peak},{},{},{:.3}",
        st.pages_in_use,
        st.pages_reserved,
        (st.pages_in_use * PAGE_SIZE) as f64 / peak.max(1) as f64
    );
}

/// The `random` workload's steps: (slot, size).
fn plan() -> Vec<(usize, usize)> {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    (0..STEPS)
        .map(|_| {
            let bits = 3 + rng.next() % 10;
            let size = ((1usize << bits) + (rng.next() as usize % (1usize << bits))).min(4096);
            (rng.next() as usize % LIVE, size)
        })
        .collect()
}

/// One step of the workload on `a`: frees `slots[slot]`, refills it with
/// `size` bytes (written through when `touch`), and returns the live bytes
/// after it.
fn step(
    a: &dyn GlobalAlloc,
    slots: &mut [(*mut u8, usize)],
    (slot, size): (usize, usize),
    live: usize,
    touch: bool,
) -> usize {
    let (old, old_size) = slots[slot];
    // SAFETY: each live block is freed once with its layout; a block is
    // written only within its size.
    unsafe {
        if !old.is_null() {
            a.dealloc(old, Layout::from_size_align_unchecked(old_size, 8));
        }
        let p = a.alloc(Layout::from_size_align_unchecked(size, 8));
        assert!(!p.is_null());
        if touch {
            p.write_bytes(0x5a, size);
        }
        slots[slot] = (p, size);
    }
    live - old_size + size
}

/// A field of `/proc/self/status` in bytes (`VmRSS`, `VmHWM`).
fn proc_status(field: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 1024
}

/// Child mode: the `random` steps on allocator `name` in this fresh
/// process; prints `name,peak_live,resident_growth`.
fn footprint_child(name: &str) {
    let (_, a) = ALLOCATORS.iter().find(|(n, _)| *n == name).unwrap();
    let steps = plan();
    let mut slots: Vec<(*mut u8, usize)> = vec![(std::ptr::null_mut(), 0); LIVE];
    let base = proc_status("VmRSS:");
    let (mut live, mut peak) = (0usize, 0usize);
    for &st in &steps {
        // Touch every block as a program would: a fresh page is not
        // resident until written.
        live = step(*a, &mut slots, st, live, true);
        peak = peak.max(live);
    }
    let hwm = proc_status("VmHWM:");
    println!("{name},{peak},{}", hwm.saturating_sub(base));
}

/// Runs every allocator's child three times, interleaved; prints CSV rows
/// of medians and the ratio to the best peer.
fn footprint() {
    let exe = std::env::current_exe().unwrap();
    let mut runs: Vec<(&str, Vec<f64>)> = ALLOCATORS.iter().map(|(n, _)| (*n, Vec::new())).collect();
    for _ in 0..3 {
        for (name, ratios) in runs.iter_mut() {
            let out = std::process::Command::new(&exe).env("KMEMCG_FOOTPRINT", &**name).output().unwrap();
            assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
            let line = String::from_utf8(out.stdout).unwrap();
            let cols: Vec<f64> = line.trim().split(',').skip(1).map(|c| c.parse().unwrap()).collect();
            ratios.push(cols[1] / cols[0]);
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let best_peer = runs.iter().filter(|(n, _)| *n != "kmemcg").map(|(_, r)| median(r)).fold(f64::MAX, f64::min);
    println!();
    println!("allocator,resident_over_peak_live_median,runs,over_best_peer");
    for (name, r) in &runs {
        let m = median(r);
        let all: Vec<String> = r.iter().map(|x| format!("{x:.3}")).collect();
        println!("{name},{m:.3},{},{:.2}x", all.join(" "), m / best_peer);
    }
}

fn main() {
    if let Ok(name) = std::env::var("KMEMCG_FOOTPRINT") {
        footprint_child(&name);
        return;
    }
    pages_held();
    footprint();
}

/// Where the pages over the live bytes go at the end of the workload, from
/// `slabinfo` (objects held in magazines and depots count as active).
fn breakdown(k: &Kmem<OsPages>, live: usize) {
    let (mut active, mut slots, mut pages) = (0usize, 0usize, 0usize);
    for line in k.slabinfo().to_string().lines().filter(|l| l.starts_with("kmalloc-")) {
        let c: Vec<usize> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap_or(0)).collect();
        let size = c[2];
        active += c[0] * size;
        slots += c[1] * size;
        pages += c[9];
    }
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    eprintln!(
        "breakdown at the end: live {:.2} MiB requested; {:.2} MiB in class sizes, with objects cached in magazines and depots; {:.2} MiB of slab slots; {:.2} MiB of slab pages",
        mib(live),
        mib(active),
        mib(slots),
        mib(pages * PAGE_SIZE)
    );
}

/// kmemcg's own page count through the `random` workload and after it.
fn pages_held() {
    let k: &'static Kmem<OsPages> = Box::leak(Box::new(Kmem::new(OsPages::new())));
    let mut slots: Vec<(*mut u8, usize)> = vec![(std::ptr::null_mut(), 0); LIVE];
    let (mut live, mut peak, mut most) = (0usize, 0usize, 0usize);
    println!("phase,live_bytes,peak_live_bytes,pages_in_use,pages_mapped,held_over_peak");
    for (i, st) in plan().into_iter().enumerate() {
        live = step(k, &mut slots, st, live, false);
        peak = peak.max(live);
        if i % 1000 == 0 {
            most = most.max(k.source().stats().pages_in_use);
        }
        if i == STEPS / 2 {
            row(k, "random-midway", live, peak);
        }
    }
    row(k, "random-end", live, peak);
    eprintln!(
        "pages in use at their most (looked at every 1,000 steps): {most}, {:.3} of peak live",
        (most * PAGE_SIZE) as f64 / peak as f64
    );
    breakdown(k, live);
    segregated_bound(k);
    for (p, size) in slots.drain(..) {
        // SAFETY: as above.
        unsafe { k.dealloc(p, Layout::from_size_align_unchecked(size, 8)) };
    }
    row(k, "all-freed", 0, peak);
    k.reap();
    row(k, "after-reap", 0, peak);
    // Bonwick's reap gives back what went unused since the previous reap:
    // the burst of frees above was in use during the first interval.
    k.reap();
    row(k, "after-second-reap", 0, peak);
    println!();
    println!("cache,slabs_after_reap");
    for line in k.slabinfo().to_string().lines().skip(2) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() > 6 && cols[6] != "0" {
            println!("{},{}", cols[0], cols[6]);
        }
    }
}

/// The least any allocator that keeps each size class's slots to that
/// class can hold for the `random` steps, over their peak live bytes:
/// every class must at some point hold its own highest count of live
/// objects, and a slot that held an object of one class serves no other
/// until its whole slab is empty. So the pages of class `c` are at least
/// `max_t live_c(t) * size_c`, and the sum of those over the classes is a
/// floor (no magazines, no headers, no partly filled slabs), against
/// which kmemcg's figure and the goal are read. The classes are this
/// `Kmem`'s (`kmalloc-*` rows of its `slabinfo`); a request aligned to 8
/// goes to the first class of at least its size whose size is a multiple
/// of 8 (classes are naturally aligned).
fn segregated_bound(k: &Kmem<OsPages>) {
    let sizes: Vec<usize> = k
        .slabinfo()
        .to_string()
        .lines()
        .filter(|l| l.starts_with("kmalloc-"))
        .filter_map(|l| l.split_whitespace().nth(3)?.parse().ok())
        .filter(|s: &usize| s.is_multiple_of(8))
        .collect();
    let class = |size: usize| sizes.iter().position(|&c| c >= size).unwrap();
    let (mut count, mut highest) = (vec![0usize; sizes.len()], vec![0usize; sizes.len()]);
    let mut slots = vec![0usize; LIVE];
    let (mut live, mut peak, mut rounded, mut rounded_at_peak) = (0usize, 0usize, 0usize, 0usize);
    for (slot, size) in plan() {
        if slots[slot] != 0 {
            let c = class(slots[slot]);
            count[c] -= 1;
            live -= slots[slot];
            rounded -= sizes[c];
        }
        let c = class(size);
        count[c] += 1;
        highest[c] = highest[c].max(count[c]);
        slots[slot] = size;
        live += size;
        rounded += sizes[c];
        if live > peak {
            (peak, rounded_at_peak) = (live, rounded);
        }
    }
    let floor: usize = highest.iter().zip(&sizes).map(|(n, s)| n * s).sum();
    eprintln!(
        "segregated-fit floor, over peak live: class sizes at the peak {:.3}; every class at its own highest count {:.3}",
        rounded_at_peak as f64 / peak as f64,
        floor as f64 / peak as f64
    );
}
