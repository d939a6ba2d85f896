//! Decay: a program that never calls `reap()` gets its idle memory back
//! after an interval of platform time (a fake clock here), or of slow-path
//! operations without a clock; the working set it still uses stays. (The
//! allocators here turn detection off explicitly, so `KMEMCG_DEBUG` does
//! not change the memory they hold: its quarantine keeps freed objects.)

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicU64, Ordering};

use kmemcg::{Decay, DefaultRawMutex, Detection, Kmem, NoCpus, OsPages, PageSource, Platform, Threads};

/// The `Threads` platform (per-thread slots with magazines) with a clock
/// the test moves.
struct Clocked(Threads, AtomicU64);

impl Clocked {
    fn new() -> Self {
        Clocked(Threads::new(), AtomicU64::new(1_000))
    }
    fn advance(&self, ms: u64) {
        self.1.fetch_add(ms, Ordering::SeqCst);
    }
}

// SAFETY: every slot method forwards to `Threads`, which keeps the
// contract; the clock neither allocates nor blocks.
unsafe impl Platform for Clocked {
    fn current_group(&self) -> *const () {
        self.0.current_group()
    }
    unsafe fn set_current_group(&self, token: *const ()) -> *const () {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.0.set_current_group(token) }
    }
    unsafe fn enter(&self) -> Option<usize> {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.0.enter() }
    }
    unsafe fn try_enter(&self) -> Option<usize> {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.0.try_enter() }
    }
    unsafe fn exit(&self, slot: usize) {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.0.exit(slot) }
    }
    fn node_of(&self, slot: usize) -> usize {
        self.0.node_of(slot)
    }
    fn nodes(&self) -> usize {
        self.0.nodes()
    }
    fn asymmetric(&self) -> bool {
        self.0.asymmetric()
    }
    fn heavy_barrier(&self) {
        self.0.heavy_barrier()
    }
    unsafe fn steal(&self, slot: usize) -> bool {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.0.steal(slot) }
    }
    unsafe fn unsteal(&self, slot: usize) {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.0.unsteal(slot) }
    }
    fn now_ms(&self) -> Option<u64> {
        Some(self.1.load(Ordering::SeqCst))
    }
}

type CKmem = Kmem<OsPages, DefaultRawMutex, Clocked>;

/// A burst: `n` objects of `size` bytes, then all freed.
fn burst<P: Platform>(k: &Kmem<OsPages, DefaultRawMutex, P>, n: usize, size: usize) {
    let l = Layout::from_size_align(size, 8).unwrap();
    // SAFETY: valid layouts; each block freed once.
    let ptrs: Vec<*mut u8> = (0..n).map(|_| unsafe { k.alloc(l) }).collect();
    assert!(ptrs.iter().all(|p| !p.is_null()));
    for p in ptrs {
        // SAFETY: as above.
        unsafe { k.dealloc(p, l) };
    }
}

/// A light load of another size, in batches of 512 so that magazines
/// refill and spill: slow paths that give decay its chances. `n` batches.
fn trickle<P: Platform>(k: &Kmem<OsPages, DefaultRawMutex, P>, n: usize) {
    let l = Layout::from_size_align(48, 8).unwrap();
    for _ in 0..n {
        // SAFETY: a valid layout; each block freed once.
        let ptrs: Vec<*mut u8> = (0..512).map(|_| unsafe { k.alloc(l) }).collect();
        for p in ptrs {
            // SAFETY: as above.
            unsafe { k.dealloc(p, l) };
        }
    }
}

#[test]
fn idle_memory_goes_back_after_the_interval_with_no_reap_call() {
    let k: &'static CKmem =
        Box::leak(Box::new(Kmem::with_platform(OsPages::new(), Clocked::new()).with_detection(Detection::OFF)));
    k.set_decay(Decay::new(1000, 0));
    trickle(k, 20); // the first look starts the clock
    burst(k, 20_000, 1000);
    // What a burst leaves: magazines and depot full of freed objects (their
    // slabs in use), and the page source's emptied chunks, still mapped.
    let held = k.source().stats();
    assert!(held.pages_reserved > 4000, "the burst's memory is kept for reuse: {held:?}");
    // Before the interval is over: nothing goes back.
    k.platform().advance(500);
    trickle(k, 20);
    assert_eq!(k.decay_stats().0, 0);
    assert!(k.source().stats().pages_reserved >= held.pages_reserved);
    // After it: the next slow paths reap, once.
    k.platform().advance(600);
    trickle(k, 20);
    let (reaps, pages) = k.decay_stats();
    assert_eq!(reaps, 1);
    let now = k.source().stats();
    assert!(
        pages > 0 && now.pages_reserved < held.pages_reserved && now.pages_in_use <= held.pages_in_use,
        "after decay {now:?} (was {held:?}); decay gave back {pages} pages"
    );
    // What stayed in use is still served: no reap until the next interval.
    trickle(k, 100);
    assert_eq!(k.decay_stats().0, 1);
}

/// `NoCpus` has no clock, so decay counts slow paths: magazine refills and
/// spills (its one slot's magazines serve the rest). What a burst left in
/// magazines, slabs and the page source's retained memory goes back once
/// enough slow paths have passed.
#[test]
fn without_a_clock_decay_counts_slow_paths() {
    let k: &'static Kmem<OsPages, DefaultRawMutex, NoCpus> =
        Box::leak(Box::new(Kmem::with_platform(OsPages::new(), NoCpus::new()).with_detection(Detection::OFF)));
    k.set_decay(Decay::new(1000, 256));
    trickle(k, 1);
    burst(k, 20_000, 1000);
    let held = k.source().stats().pages_in_use;
    let (reaps, given) = k.decay_stats();
    // 512 objects of 48 B out and back per batch: refills and spills of
    // the magazines every batch, so 256 slow paths come within a few
    // hundred batches. A reap takes part of what the burst's class keeps
    // in its depot (its working set shrinks reap by reap; the busy slot's
    // own two magazines stay), so memory goes back over a few of them.
    let mut batches = 0;
    while (k.decay_stats().0 == reaps || k.source().stats().pages_in_use >= held) && batches < 20_000 {
        trickle(k, 1);
        batches += 1;
    }
    assert!(k.decay_stats().0 > reaps, "no decay reap in {batches} batches of 512 allocations");
    assert!(k.decay_stats().1 > given, "decay gave nothing back");
    let now = k.source().stats().pages_in_use;
    assert!(now < held, "{now} pages still in use (were {held}) after {} reaps", k.decay_stats().0 - reaps);
}

#[test]
fn decay_off_keeps_everything_until_reap() {
    let k: &'static CKmem =
        Box::leak(Box::new(Kmem::with_platform(OsPages::new(), Clocked::new()).with_detection(Detection::OFF)));
    k.set_decay(Decay::OFF);
    burst(k, 20_000, 1000);
    let held = k.source().stats().pages_reserved;
    k.platform().advance(1_000_000);
    trickle(k, 20);
    assert_eq!(k.decay_stats(), (0, 0));
    assert!(k.source().stats().pages_reserved >= held);
    assert!(k.reap() > 0);
}
