//! A typed cache's descriptor freed while another thread was still inside
//! the cache (found by a review): a quarantine eviction gave the cache's
//! last objects back, the slab count fell to zero as their slab went back
//! to the page source, and the cache's destruction (or a later `shrink`)
//! saw no slab and freed the descriptor, which the evicting thread then
//! read (the slab's page count, garbage at opt-level 0: a counter
//! underflow). Now a cache is retired only once no object is on its way
//! back from the quarantine, and the give-back holds a read guard, so a
//! retired descriptor is freed only after it.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::collections::HashSet;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kmemcg::{CacheFlags, DefaultRawMutex, Detection, Kmem, OsPages, Ownership, PageRun, PageSource, SourceStats};

#[path = "support/hooked.rs"]
mod hooked;
use hooked::Hooked;

thread_local! {
    /// Marks the evicting thread: its page frees are slow, and it gets no
    /// slot (its frees go straight to the slabs).
    static SLOW: Cell<bool> = const { Cell::new(false) };
}
/// The run the slow thread is giving back right now (0: none).
static CUR_RUN: AtomicUsize = AtomicUsize::new(0);

fn slow(run: NonNull<u8>) {
    if SLOW.with(Cell::get) {
        CUR_RUN.store(run.as_ptr() as usize, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        CUR_RUN.store(0, Ordering::SeqCst);
    }
}

/// `OsPages` whose frees on the slow thread take 100 ms.
struct SlowSrc(OsPages);

// SAFETY: every method forwards to `OsPages`; the sleep allocates nothing
// and calls nothing of the allocator.
unsafe impl PageSource for SlowSrc {
    fn alloc_pages(&self, order: u32, node: usize) -> Option<PageRun> {
        self.0.alloc_pages(order, node)
    }
    unsafe fn free_pages(&self, addr: NonNull<u8>, order: u32) {
        slow(addr);
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.0.free_pages(addr, order) }
    }
    unsafe fn free_pages_bulk(&self, runs: &[NonNull<u8>], order: u32) {
        slow(runs[0]);
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.0.free_pages_bulk(runs, order) }
    }
    fn ownership(&self, addr: usize) -> Ownership {
        self.0.ownership(addr)
    }
    fn stats(&self) -> SourceStats {
        self.0.stats()
    }
    fn trim(&self) -> usize {
        self.0.trim()
    }
    fn rebase(&self, ptr: NonNull<u8>) -> NonNull<u8> {
        self.0.rebase(ptr)
    }
    unsafe fn protect(&self, at: NonNull<u8>, pages: usize, off: bool) -> bool {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.0.protect(at, pages, off) }
    }
}

/// No slot for the slow thread.
fn slot_unless_slow() -> bool {
    !SLOW.with(Cell::get)
}

type SKmem = Kmem<SlowSrc, DefaultRawMutex, Hooked>;

/// Active objects of the descriptor cache, from `slabinfo`.
fn descriptors(k: &SKmem) -> usize {
    let info = k.slabinfo().to_string();
    let row = info.lines().find(|l| l.starts_with("kmem_cache ")).expect("the descriptors' row");
    row.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_cache_is_not_freed_while_a_give_back_is_inside_it() {
    let k: &'static SKmem = Box::leak(Box::new(
        Kmem::with_platform(SlowSrc(OsPages::new()), Hooked::new(slot_unless_slow))
            .with_detection(Detection::ALL.quarantine(1 << 20).guard_pages(0)),
    ));
    k.shrink();
    let root0 = k.root().usage();
    let c = k.create_cache::<[u8; 48]>("victim", CacheFlags::ACCOUNT).unwrap();
    let objs: Vec<_> = (0..3000).map(|i| c.alloc([i as u8; 48]).unwrap()).collect();
    let st = c.stats();
    let slab = st.pages / st.slabs * 4096;
    assert!(slab.is_power_of_two());
    let bases: HashSet<usize> = objs.iter().map(|b| (&**b as *const [u8; 48] as usize) & !(slab - 1)).collect();
    drop(objs);
    // Frees of the other thread's own push the victims out of the
    // quarantine; giving them back releases the victim's slabs, slowly.
    let evictor = std::thread::spawn(move || {
        let l = Layout::new::<[u8; 48]>();
        // SAFETY: a non-zero size.
        let ps: Vec<_> = (0..40_000).map(|_| unsafe { k.alloc(l) }).collect();
        assert!(ps.iter().all(|p| !p.is_null()));
        SLOW.with(|s| s.set(true));
        for p in ps {
            // SAFETY: allocated above with `l`.
            unsafe { k.dealloc(p, l) };
        }
        SLOW.with(|s| s.set(false));
    });
    while !bases.contains(&CUR_RUN.load(Ordering::SeqCst)) {
        assert!(!evictor.is_finished(), "a victim slab was given back slowly");
        std::thread::yield_now();
    }
    drop(c);
    while !evictor.is_finished() {
        k.shrink();
        let run = CUR_RUN.load(Ordering::SeqCst);
        assert!(
            descriptors(k) == 1 || !bases.contains(&run),
            "the descriptor was freed while the other thread gave back a slab of it"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    evictor.join().unwrap();
    k.shrink();
    assert_eq!(descriptors(k), 0, "retired once the give-back is done");
    assert_eq!(k.root().usage(), root0);
}
