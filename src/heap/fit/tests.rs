use core::alloc::{GlobalAlloc, Layout};
use std::boxed::Box;
use std::sync::{Arc, Barrier};
use std::vec::Vec;

use super::super::{Kmem, SETTLING};
use crate::platform::{DefaultRawMutex, NoCpus, PAGE_SIZE, Platform, Region};
use crate::slab::classes::{GEOMETRIES, NCLASSES};
use crate::sync::{AtomicBool, Ordering};
use crate::testutil::arena;
use crate::{CacheFlags, PageSource};

/// One context whose interrupt context is a switch.
struct Switch {
    inner: NoCpus,
    interrupt: AtomicBool,
}

// SAFETY: every method forwards to `NoCpus` (which meets the contract) or
// reads the switch; nothing calls the allocator.
unsafe impl Platform for Switch {
    fn current_group(&self) -> *const () {
        self.inner.current_group()
    }
    unsafe fn set_current_group(&self, token: *const ()) -> *const () {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.inner.set_current_group(token) }
    }
    unsafe fn enter(&self) -> Option<usize> {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.inner.enter() }
    }
    unsafe fn exit(&self, slot: usize) {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.inner.exit(slot) }
    }
    fn in_interrupt(&self) -> bool {
        self.interrupt.load(Ordering::Relaxed)
    }
}

type SK = Kmem<Region<DefaultRawMutex, 4>, DefaultRawMutex, Switch>;
type TK = Kmem<Region<DefaultRawMutex, 4>>;

/// Every cache of `k` has its class's layout capped at its cap.
fn capped_everywhere<S: PageSource, P: Platform>(k: &Kmem<S, DefaultRawMutex, P>) {
    let cap = k.max_slab_order();
    for (c, base) in GEOMETRIES.iter().enumerate().take(NCLASSES) {
        assert_eq!(*k.tree.classes()[c].cache.geometry(), base.within(cap), "class {c}");
    }
    for m in [&*k.magazines, &*k.tree.groups, &*k.tree.charged_caches, &*k.tree.descriptors, &*k.tree.pressure_nodes] {
        assert!(m.geometry().order <= cap.max(1), "{:?}", m.geometry());
    }
}

/// An allocation in interrupt context that finds the first use fitting
/// the caches (the context it interrupted) fails instead of waiting for
/// it; task context waits.
#[test]
fn an_interrupt_during_the_first_use_fails_instead_of_waiting() {
    let platform = Switch { inner: NoCpus::new(), interrupt: AtomicBool::new(false) };
    let k: &'static SK = Box::leak(Box::new(Kmem::with_platform(Region::new(), platform)));
    k.source().add(arena(64 << 10), 0).unwrap();
    let me = core::ptr::from_ref(k).addr();
    // As if the interrupted context were fitting the caches.
    k.home.store(me | SETTLING, Ordering::Relaxed);
    k.platform().interrupt.store(true, Ordering::Relaxed);
    for size in [64, 5000, 64 << 10] {
        let l = Layout::from_size_align(size, 8).unwrap();
        // SAFETY: a valid layout.
        assert!(unsafe { k.alloc(l) }.is_null(), "{size} bytes");
    }
    assert_eq!(k.source().stats().pages_in_use, 0, "nothing grew");
    // The fitting context finishes: the cap is then the source's.
    // SAFETY: as in `settle_slow`: no other context uses `k`.
    unsafe { k.fit_to_source() };
    k.home.store(me, Ordering::Release);
    let l = Layout::from_size_align(64, 8).unwrap();
    // SAFETY: a valid layout; freed with it.
    unsafe {
        let p = k.alloc(l);
        assert!(!p.is_null());
        k.dealloc(p, l);
    }
    // 15 or 16 whole pages, as the leaked buffer falls.
    assert!(k.max_slab_order() <= 1);
    capped_everywhere(k);
}

/// Threads racing to make the first use agree on one layout per cache,
/// and every object is where its cache's layout says.
#[test]
fn racing_first_uses_agree() {
    for round in 0..20 {
        let k: &'static TK = Box::leak(Box::new(Kmem::new(Region::new())));
        k.source().add(arena(256 << 10), 0).unwrap();
        let start = Arc::new(Barrier::new(4));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let start = start.clone();
                std::thread::spawn(move || {
                    start.wait();
                    let l = Layout::from_size_align(8 << (t + round % 4), 8).unwrap();
                    // SAFETY: a valid layout; freed with it.
                    unsafe {
                        let p = k.alloc(l);
                        assert!(!p.is_null());
                        k.dealloc(p, l);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // 63 or 64 whole pages, as the leaked buffer falls.
        assert!((2..=3).contains(&k.max_slab_order()));
        capped_everywhere(k);
        k.check();
        k.check_accounting();
    }
}

/// Typed caches and the charged caches made after the first use get
/// capped layouts too; the cap can be fixed instead.
#[test]
fn typed_and_charged_caches_are_capped() {
    let k: &'static TK = Box::leak(Box::new(Kmem::new(Region::new())));
    k.source().add(arena(64 << 10), 0).unwrap();
    let cache = k.create_cache::<[u64; 1024]>("eight-kib", CacheFlags::ACCOUNT).unwrap();
    let g = *cache.desc().cache.cache.geometry();
    // 8-byte aligned 8 KiB objects: the header leaves no room for one up
    // to order 1, so the smallest order that holds one, exact (order 5
    // without a cap).
    assert!(k.max_slab_order() <= 1);
    assert_eq!((g.size, g.order, g.slab_pages(), g.capacity), (8192, 2, 3, 1));
    let b = cache.alloc([7; 1024]).unwrap();
    assert_eq!(b[1023], 7);
    let tenant = k.root().create_child("tenant").unwrap();
    {
        let _in = tenant.enter();
        let l = Layout::from_size_align(4096, 4096).unwrap();
        // SAFETY: a valid layout; freed with it.
        unsafe {
            let p = k.alloc(l);
            assert!(!p.is_null());
            k.dealloc(p, l);
        }
    }
    let c = crate::slab::classes::class_of(4096, 4096).unwrap();
    let charged = k.tree.class_charged(c).unwrap();
    // The class's layout with owner words, in slabs of the same order.
    assert_eq!(charged.cache.geometry().order, k.tree.classes()[c].cache.geometry().order);
    assert_eq!(Some(*charged.cache.geometry()), k.tree.classes()[c].cache.geometry().with_owners());
    assert_eq!(charged.cache.geometry().order, 1);
    drop(b);
    drop(cache);
    tenant.remove().unwrap();
    let fixed: &'static TK = Box::leak(Box::new(Kmem::new(Region::new()).with_max_slab_order(0)));
    fixed.source().add(arena(8 << 20), 0).unwrap();
    assert_eq!(fixed.max_slab_order(), 0);
    capped_everywhere(fixed);
    assert!(PAGE_SIZE << fixed.tree.classes()[NCLASSES - 1].cache.geometry().order <= 8 * PAGE_SIZE);
}
