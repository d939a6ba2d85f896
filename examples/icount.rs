//! Run with: `cargo run --release --example icount -- <case> [N]`
//!
//! The loops whose instructions per operation CI holds to a budget
//! (`scripts/icount.sh`, `.ci/icount-budget`): run under
//! `valgrind --tool=callgrind` at N and 2N operations, (2N - N) / N is the
//! cost of one, start-up cancelled. kmemcg is the global allocator. Cases:
//!
//! * `generic`: 64-byte alloc+free pairs through `GlobalAlloc`, in a loop
//!   generic over the allocator (as a user's code inlines it);
//! * `box`: a `Box<u64>` made and dropped (through `#[global_allocator]`);
//! * `box-group`: the same inside an entered group (the accounted path);
//! * `typed`: a typed cache's `alloc` and the drop of its `CacheBox`;
//! * `typed-group`: an accounted typed cache's, inside an entered group;
//! * `nocpus`: `generic` on a `Kmem` with the single-context platform
//!   (`NoCpus`, the default without `std`);
//! * `percpu`: `generic` on a `Kmem` with the bare-metal platform
//!   (`PerCpu`, without an all-CPU barrier) and `IrqSpinLock`s, over a
//!   host `Cpu` whose interrupt masking costs nothing: the kernel path's
//!   instructions, less the kernel's own `cli`/`popf` (or DAIF writes);
//! * `sampled`: `generic` on a `Kmem` with guard-page sampling alone
//!   (`Detection::SAMPLED`), the mode meant to be left on (its first
//!   allocation is a sample, freed at once: no sampled object lives
//!   during the loop);
//! * `sampled-live`: the same while one sampled object lives (kept from
//!   the first allocation): what every free pays while one does;
//! * `numa`: `generic` on a `Kmem` with `NumaThreads` (on a one-node
//!   host: what asking for the node count on every free costs).
//!
//! Decay is off: under valgrind the loop runs tens of times slower, so a
//! reap once a second of wall time would come tens of times as often per
//! operation as in a real run, and the counts would depend on the
//! machine's speed.

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;

use kmemcg::{
    CacheFlags, Cpu, Decay, DefaultRawMutex, Detection, IrqSpinLock, Kmem, NoCpus, NumaThreads, OsPages, PerCpu,
};

#[global_allocator]
static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

static SINGLE: Kmem<OsPages, DefaultRawMutex, NoCpus> = Kmem::with_platform(OsPages::new(), NoCpus::new());

static SAMPLED: Kmem<OsPages> = Kmem::new(OsPages::new()).with_detection(Detection::SAMPLED);

static SAMPLED_LIVE: Kmem<OsPages> = Kmem::new(OsPages::new()).with_detection(Detection::SAMPLED);

static NUMA: Kmem<OsPages, DefaultRawMutex, NumaThreads> = Kmem::with_platform(OsPages::new(), NumaThreads::new());

/// One CPU whose interrupts cannot fire: what `PerCpu` costs besides the
/// kernel's own interrupt masking.
struct OneCpu;

// SAFETY: used from one thread only (the `percpu` case runs on the main
// thread): (1) it is CPU 0, the only one; (2) no interrupt can fire, so
// save and restore have nothing to do; (3) never in interrupt context;
// (4) one node; (5) no barrier; (6) nothing here allocates.
unsafe impl Cpu for OneCpu {
    fn id() -> usize {
        0
    }
    fn irq_save() -> usize {
        0
    }
    unsafe fn irq_restore(_saved: usize) {}
}

static PERCPU: Kmem<OsPages<IrqSpinLock<OneCpu>>, IrqSpinLock<OneCpu>, PerCpu<OneCpu>> =
    Kmem::with_platform(OsPages::with_max_chunks(1024), PerCpu::new());

/// `n` 64-byte pairs through `a`, monomorphised for its type. Each case
/// is a function of its own (`inline(never)`), so that a change to one
/// case's code does not move another's count through the register
/// allocation of one big `main`.
#[inline(never)]
fn pairs<A: GlobalAlloc>(a: &A, n: usize) {
    let layout = Layout::from_size_align(64, 8).unwrap();
    for _ in 0..n {
        // SAFETY: a valid layout; freed at once with it.
        unsafe {
            let p = a.alloc(black_box(layout));
            a.dealloc(black_box(p), layout);
        }
    }
}

#[inline(never)]
fn boxes(n: usize) {
    for i in 0..n {
        drop(black_box(Box::new(black_box(i as u64))));
    }
}

#[inline(never)]
fn typed(n: usize, flags: CacheFlags) {
    let cache = KMEM.create_cache::<[u64; 8]>("icount", flags).unwrap();
    for i in 0..n {
        drop(black_box(cache.alloc([i as u64; 8]).unwrap()));
    }
}

fn main() {
    KMEM.set_decay(Decay::OFF);
    let args: Vec<String> = std::env::args().collect();
    let case = args.get(1).map_or("generic", String::as_str);
    let n: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let group = case.ends_with("-group").then(|| KMEM.root().create_child("icount").unwrap());
    let _in = group.as_ref().map(|g| g.enter());
    match case {
        "generic" => pairs(&KMEM, n),
        "nocpus" => {
            SINGLE.set_decay(Decay::OFF);
            pairs(&SINGLE, n)
        }
        "percpu" => {
            PERCPU.set_decay(Decay::OFF);
            pairs(&PERCPU, n)
        }
        "sampled" => {
            SAMPLED.set_decay(Decay::OFF);
            pairs(&SAMPLED, n)
        }
        "sampled-live" => {
            SAMPLED_LIVE.set_decay(Decay::OFF);
            let layout = Layout::from_size_align(64, 8).unwrap();
            // SAFETY: a valid layout; kept to the end of the process.
            let kept = unsafe { SAMPLED_LIVE.alloc(layout) };
            assert!((kept.addr() + 64).is_multiple_of(4096), "the first allocation is a sample");
            pairs(&SAMPLED_LIVE, n)
        }
        "numa" => {
            NUMA.set_decay(Decay::OFF);
            pairs(&NUMA, n)
        }
        "box" | "box-group" => boxes(n),
        "typed" => typed(n, CacheFlags::NONE),
        "typed-group" => typed(n, CacheFlags::ACCOUNT),
        other => {
            eprintln!("unknown case {other}");
            std::process::exit(2);
        }
    }
}
