//! `Platform::one_slot` is a hint for code generation, which no safety
//! argument relies on: a platform that says `true` while it hands out
//! several slots (here `PerCpu` with four threads playing CPUs) still has
//! each slot's own magazines used, because the magazine layer indexes
//! them by the slot either way. Four threads allocate, fill, check and
//! free blocks of several classes at once through `GlobalAlloc`; every
//! block keeps its fill pattern (no block handed out twice), and the
//! page source's pages come back once everything is freed and shrunk.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use kmemcg::{Cpu, DefaultRawMutex, Kmem, PageSource, PerCpu, Platform, Region};

thread_local! {
    static ID: Cell<usize> = const { Cell::new(0) };
}
static IRQ: AtomicUsize = AtomicUsize::new(0);

/// Threads playing CPUs: each test thread sets a distinct id first.
struct Threads4;

// SAFETY: (1) each thread sets a distinct id below MAX_CPUS before it
// allocates and keeps it; (2) save and restore nest (they only count);
// (3) no interrupts; (4) one node; (5) no barrier; (6) nothing here
// allocates.
unsafe impl Cpu for Threads4 {
    fn id() -> usize {
        ID.with(Cell::get)
    }
    fn irq_save() -> usize {
        IRQ.fetch_add(1, Ordering::Relaxed);
        0
    }
    unsafe fn irq_restore(_saved: usize) {}
}

/// `PerCpu` in every respect but `one_slot`, which it gets wrong.
struct Liar(PerCpu<Threads4>);

// SAFETY: every contract method forwards to `PerCpu`, which meets the
// contract; `one_slot` is no part of it.
unsafe impl Platform for Liar {
    fn current_group(&self) -> *const () {
        self.0.current_group()
    }
    unsafe fn set_current_group(&self, token: *const ()) -> *const () {
        // SAFETY: forwarded.
        unsafe { self.0.set_current_group(token) }
    }
    unsafe fn retag_current_group(&self, current: *const (), new: *const ()) -> bool {
        // SAFETY: forwarded.
        unsafe { self.0.retag_current_group(current, new) }
    }
    unsafe fn enter(&self) -> Option<usize> {
        // SAFETY: forwarded.
        unsafe { self.0.enter() }
    }
    unsafe fn try_enter(&self) -> Option<usize> {
        // SAFETY: forwarded.
        unsafe { self.0.try_enter() }
    }
    unsafe fn exit(&self, slot: usize) {
        // SAFETY: forwarded.
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
    fn slots_are_locks(&self) -> bool {
        self.0.slots_are_locks()
    }
    fn one_slot(&self) -> bool {
        true
    }
    fn heavy_barrier(&self) {
        self.0.heavy_barrier()
    }
    unsafe fn steal(&self, slot: usize) -> bool {
        // SAFETY: forwarded.
        unsafe { self.0.steal(slot) }
    }
    unsafe fn try_steal(&self, slot: usize) -> bool {
        // SAFETY: forwarded.
        unsafe { self.0.try_steal(slot) }
    }
    unsafe fn unsteal(&self, slot: usize) {
        // SAFETY: forwarded.
        unsafe { self.0.unsteal(slot) }
    }
    fn in_interrupt(&self) -> bool {
        self.0.in_interrupt()
    }
    fn now_ms(&self) -> Option<u64> {
        self.0.now_ms()
    }
    fn throttle(&self, ns: u64) {
        self.0.throttle(ns)
    }
}

/// Four threads playing CPUs 0 to 3 allocate, fill, check and free
/// blocks of four classes through `GlobalAlloc`.
fn churn(k: &'static Kmem<Region, DefaultRawMutex, Liar>) {
    std::thread::scope(|s| {
        for t in 0..4usize {
            s.spawn(move || {
                ID.with(|id| id.set(t));
                let mut live: Vec<(*mut u8, Layout, u8)> = Vec::new();
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                for i in 0..20_000usize {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if live.len() < 64 && (x & 3 != 0 || live.is_empty()) {
                        let l = Layout::from_size_align([16, 64, 200, 1000][(x >> 8) as usize % 4], 8).unwrap();
                        // SAFETY: a valid layout.
                        let p = unsafe { k.alloc(l) };
                        assert!(!p.is_null());
                        let fill = (i as u8) ^ (t as u8).wrapping_mul(61);
                        // SAFETY: `p` is a fresh block of `l.size()` bytes.
                        unsafe { p.write_bytes(fill, l.size()) };
                        live.push((p, l, fill));
                    } else {
                        let (p, l, fill) = live.swap_remove((x >> 16) as usize % live.len());
                        check_and_free(k, t, p, l, fill);
                    }
                }
                for (p, l, fill) in live {
                    check_and_free(k, t, p, l, fill);
                }
            });
        }
    });
}

/// Checks that block `p` of `l` still holds `fill` everywhere, and frees it.
fn check_and_free(k: &'static Kmem<Region, DefaultRawMutex, Liar>, t: usize, p: *mut u8, l: Layout, fill: u8) {
    // SAFETY: a live block of `l` (the caller's), filled with `fill`.
    let bytes = unsafe { std::slice::from_raw_parts(p, l.size()) };
    assert!(bytes.iter().all(|&b| b == fill), "thread {t}: a block changed under its owner");
    // SAFETY: allocated with `l`, freed once.
    unsafe { k.dealloc(p, l) };
}

#[test]
fn a_wrong_one_slot_hint_still_gives_each_slot_its_own_magazines() {
    let k: &'static Kmem<Region, DefaultRawMutex, Liar> =
        Box::leak(Box::new(Kmem::with_platform(Region::new(), Liar(PerCpu::new()))));
    let arena = Box::leak(vec![std::mem::MaybeUninit::uninit(); 32 << 20].into_boxed_slice());
    k.source().add(arena, 0).unwrap();
    // A first round sets up what stays (the caches' first slabs, the
    // magazines' own cache); the second must give back all it took.
    churn(k);
    k.shrink();
    let before = k.source().stats().pages_in_use;
    churn(k);
    k.shrink();
    assert!(k.source().stats().pages_in_use <= before, "pages leaked");
    assert!(IRQ.load(Ordering::Relaxed) > 0, "the platform's slots were used");
}
