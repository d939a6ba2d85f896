//! The bare-metal platform on the host: threads play CPUs, and simulated
//! interrupts run an allocating "handler" wherever the allocator masks
//! interrupts while they are enabled (in `PerCpu::enter` and before every
//! `IrqSpinLock` is taken), that is, right before the interrupted code
//! would have masked them: inside an allocation or free that has not yet
//! reached its slot or lock.
//!
//! Checks: no deadlock (the test finishes), no overlapping blocks (every
//! block's fill pattern survives), exact counters (the root's usage and the
//! page source's pages come back to their start, the group's to zero),
//! interrupt-context allocations charge the root and never reclaim (a
//! shrinker that must not run from an interrupt is never called there, and
//! an interrupt-context charge over the group's max fails at once).

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};

use kmemcg::allocator_api2::alloc::Allocator;
use kmemcg::{
    CacheFlags, Cgroup, Cpu, IrqSpinLock, Kmem, KmemCache, PageSource, PerCpu, Region, ShrinkControl, Shrinker,
};

/// A simulated CPU: its index, whether its interrupts are masked, whether
/// it runs a handler, and its pseudo-random interrupt source.
struct SimCpu {
    id: Cell<usize>,
    masked: Cell<bool>,
    in_irq: Cell<bool>,
    rng: Cell<u64>,
}

thread_local! {
    static CPU: SimCpu = const {
        SimCpu { id: Cell::new(usize::MAX), masked: Cell::new(false), in_irq: Cell::new(false), rng: Cell::new(0) }
    };
}

/// Interrupts that ran, and allocations their handlers made.
static IRQS: AtomicUsize = AtomicUsize::new(0);
static IRQ_ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// Interrupt-context charges over the group's max that failed.
static IRQ_REFUSED: AtomicUsize = AtomicUsize::new(0);

/// The simulated kernel's CPU facts.
struct Sim;

// SAFETY: (1) each test thread sets a distinct id below MAX_CPUS before
// allocating, and keeps it; (2) `masked` is the interrupt flag and
// save/restore return and restore it, nesting; (3) the handler sets
// `in_irq` for its whole run; (4) one node; (5) no barrier; (6) nothing
// here allocates: the simulated handler runs *before* masking, as a
// hardware interrupt would, not as part of the save.
unsafe impl Cpu for Sim {
    fn id() -> usize {
        CPU.with(|c| c.id.get())
    }

    fn irq_save() -> usize {
        let was = CPU.with(|c| c.masked.get());
        if !was {
            maybe_interrupt();
        }
        CPU.with(|c| c.masked.set(true));
        was as usize
    }

    unsafe fn irq_restore(saved: usize) {
        CPU.with(|c| c.masked.set(saved != 0));
    }

    fn in_interrupt() -> bool {
        CPU.with(|c| c.in_irq.get())
    }
}

type SimKmem = Kmem<Region<IrqSpinLock<Sim>>, IrqSpinLock<Sim>, PerCpu<Sim>>;

static KMEM: SimKmem = Kmem::with_platform(Region::new(), PerCpu::new());

/// The group the workload threads run in, with a max; `None` until set up.
static GROUP: Mutex<Option<Cgroup<'static, SimKmem>>> = Mutex::new(None);
/// A typed cache the handlers allocate from, accounted.
static CACHE: Mutex<Option<KmemCache<'static, [u64; 8], SimKmem>>> = Mutex::new(None);
/// Whether handlers run (off during setup and the final checks).
static ARMED: AtomicBool = AtomicBool::new(false);

/// A shrinker that must never be called from interrupt context.
struct NotFromIrq;

static SHRINKER_IN_IRQ: AtomicUsize = AtomicUsize::new(0);
static SHRINKER_CALLS: AtomicUsize = AtomicUsize::new(0);

impl Shrinker for NotFromIrq {
    fn count(&self, _sc: &ShrinkControl) -> usize {
        SHRINKER_CALLS.fetch_add(1, Ordering::Relaxed);
        if Sim::in_interrupt() {
            SHRINKER_IN_IRQ.fetch_add(1, Ordering::Relaxed);
        }
        0
    }
    fn scan(&self, _sc: &ShrinkControl, _nr: usize) -> usize {
        0
    }
}

static NOT_FROM_IRQ: NotFromIrq = NotFromIrq;

/// xorshift on the CPU's state.
fn next_rand() -> u64 {
    CPU.with(|c| {
        let mut x = c.rng.get() | 1;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.rng.set(x);
        x
    })
}

/// One time in 16, when armed and not already in a handler: an interrupt.
fn maybe_interrupt() {
    if !ARMED.load(Ordering::Relaxed) || CPU.with(|c| c.in_irq.get() || c.id.get() == usize::MAX) {
        return;
    }
    if !next_rand().is_multiple_of(16) {
        return;
    }
    CPU.with(|c| c.in_irq.set(true));
    irq_handler();
    CPU.with(|c| c.in_irq.set(false));
}

/// What the simulated timer handler does: allocations of every kind, all
/// freed before it returns, and checks of interrupt-context rules.
fn irq_handler() {
    IRQS.fetch_add(1, Ordering::Relaxed);
    // Interrupt context charges the root, whatever group the interrupted
    // task entered.
    assert_eq!(KMEM.current_group().name(), "/", "an interrupt charged the interrupted task's group");
    let r = next_rand();
    let size = [24usize, 64, 200, 1500, 5000, 40_000][(r % 6) as usize];
    let layout = Layout::from_size_align(size, 8).unwrap();
    // SAFETY: a valid non-zero layout; freed with it below.
    let p = unsafe { KMEM.alloc(layout) };
    if !p.is_null() {
        IRQ_ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `p` is a fresh block of `size` bytes.
        unsafe {
            p.write_bytes(0xA5, size);
            KMEM.dealloc(p, layout);
        }
    }
    if let Some(cache) = CACHE.try_lock().ok().as_ref().and_then(|c| c.as_ref())
        && let Ok(b) = cache.alloc([r; 8])
    {
        IRQ_ALLOCS.fetch_add(1, Ordering::Relaxed);
        assert_eq!(*b, [r; 8]);
    }
    // A charge to the full group from interrupt context: refused at once,
    // without reclaim (the shrinker checks it is never called here).
    if let Some(g) = GROUP.try_lock().ok().as_ref().and_then(|g| g.as_ref())
        && g.usage() + (64 << 10) > g.max()
    {
        let big = Layout::from_size_align(64 << 10, 8).unwrap();
        match Allocator::allocate(&g.allocator(), big) {
            Ok(b) => {
                // The group had room after all (frees raced): give it back.
                // SAFETY: just allocated with `big`.
                unsafe { Allocator::deallocate(&g.allocator(), b.cast(), big) };
            }
            Err(_) => {
                IRQ_REFUSED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A block the workload holds, with its fill byte.
struct Held {
    p: *mut u8,
    layout: Layout,
    fill: u8,
}

// SAFETY: a block of the shared allocator, handed between threads whole.
unsafe impl Send for Held {}

#[test]
fn simulated_cpus_with_allocating_interrupts() {
    const CPUS: usize = 4;
    const OPS: usize = 20_000;
    let arena: &'static mut [std::mem::MaybeUninit<u8>] = Box::leak(Box::new_uninit_slice(96 << 20));
    KMEM.source().add(arena, 0).unwrap();
    KMEM.register_shrinker(&NOT_FROM_IRQ).unwrap();
    let g = KMEM.root().create_child("tenant").unwrap();
    g.set_max(8 << 20).unwrap();
    *GROUP.lock().unwrap() = Some(g.clone());
    *CACHE.lock().unwrap() = Some(KMEM.create_cache::<[u64; 8]>("irq-objects", CacheFlags::ACCOUNT).unwrap());
    let root_before = KMEM.root().usage();
    let pages_before = KMEM.source().stats().pages_in_use;
    // Blocks handed from one CPU to the next, freed there.
    let handoff: Vec<Mutex<Vec<Held>>> = (0..CPUS).map(|_| Mutex::new(Vec::new())).collect();
    let start = Barrier::new(CPUS);
    ARMED.store(true, Ordering::Relaxed);
    std::thread::scope(|s| {
        for cpu in 0..CPUS {
            let (handoff, start, g) = (&handoff, &start, &g);
            s.spawn(move || {
                CPU.with(|c| {
                    c.id.set(cpu);
                    c.rng.set(0x9E37_79B9_7F4A_7C15 ^ cpu as u64);
                });
                start.wait();
                let _in = g.enter();
                let mut held: Vec<Held> = Vec::new();
                for i in 0..OPS {
                    let r = next_rand();
                    if !r.is_multiple_of(3) || held.is_empty() {
                        let size = [8usize, 48, 128, 700, 3000, 20_000][(r >> 8) as usize % 6];
                        let layout = Layout::from_size_align(size, 16).unwrap();
                        // SAFETY: a valid non-zero layout.
                        let p = unsafe { KMEM.alloc(layout) };
                        if p.is_null() {
                            continue; // the group's max: fine
                        }
                        let fill = (i % 251) as u8;
                        // SAFETY: a fresh block of `size` bytes.
                        unsafe { p.write_bytes(fill, size) };
                        held.push(Held { p, layout, fill });
                    } else {
                        let h = held.swap_remove((r >> 16) as usize % held.len());
                        if r.is_multiple_of(7) {
                            handoff[(cpu + 1) % CPUS].lock().unwrap().push(h);
                        } else {
                            free_checked(h);
                        }
                    }
                    if i % 64 == 0 {
                        for h in handoff[cpu].lock().unwrap().drain(..) {
                            free_checked(h);
                        }
                    }
                }
                for h in held {
                    free_checked(h);
                }
            });
        }
    });
    ARMED.store(false, Ordering::Relaxed);
    for q in &handoff {
        for h in q.lock().unwrap().drain(..) {
            free_checked(h);
        }
    }
    // The CPUs are idle now: the second reap finds their slots unused
    // since the first and empties their magazines (it takes each idle
    // CPU's slot flag, as a steal), so no freed object of the handlers'
    // cache stays cached on any CPU.
    KMEM.reap();
    KMEM.reap();
    let cached = CACHE.lock().unwrap().as_ref().unwrap().stats().active_objects;
    assert_eq!(cached, 0, "reap left objects in idle CPUs' magazines");
    *CACHE.lock().unwrap() = None;
    *GROUP.lock().unwrap() = None;
    KMEM.shrink();
    let irqs = IRQS.load(Ordering::Relaxed);
    println!(
        "{irqs} interrupts, {} interrupt-context allocations, {} refused at the group's max; shrinker calls {}",
        IRQ_ALLOCS.load(Ordering::Relaxed),
        IRQ_REFUSED.load(Ordering::Relaxed),
        SHRINKER_CALLS.load(Ordering::Relaxed)
    );
    assert!(irqs > 100, "too few simulated interrupts ran: {irqs}");
    assert!(IRQ_ALLOCS.load(Ordering::Relaxed) > 100);
    assert_eq!(SHRINKER_IN_IRQ.load(Ordering::Relaxed), 0, "a shrinker ran in interrupt context");
    // `PerCpu` is asymmetric (its slots are try-locks): magazine hits take
    // the fast path, which counts nothing, so the slot statistics show the
    // refills and spills of each CPU's own magazines.
    for cpu in 0..CPUS {
        let st = KMEM.slot_stats(kmemcg::slot_for_cpu(cpu));
        assert!(st.hits + st.misses > 0, "cpu {cpu} never used its magazines: {st:?}");
    }
    assert_eq!(g.usage(), 0, "the group is still charged");
    assert_eq!(KMEM.root().usage(), root_before, "the root's usage did not come back");
    assert!(KMEM.source().stats().pages_in_use <= pages_before, "pages leaked");
}

/// Checks a block's fill (no other block overlapped it) and frees it.
fn free_checked(h: Held) {
    // SAFETY: a live block of `h.layout.size()` bytes, freed once here.
    unsafe {
        let bytes = std::slice::from_raw_parts(h.p, h.layout.size());
        assert!(bytes.iter().all(|&b| b == h.fill), "a block was overwritten: blocks overlap");
        KMEM.dealloc(h.p, h.layout);
    }
}

/// A second allocator, for the tests that must not disturb the first's
/// counts (tests run in parallel).
static KMEM2: SimKmem = Kmem::with_platform(Region::new(), PerCpu::new());

#[test]
fn a_cpu_beyond_max_cpus_takes_the_shared_path_and_slot_stats_take_any_index() {
    // A kernel whose CPU index is out of range (`usize::MAX`: this thread
    // never set one; `MAX_CPUS` and above, which `slot_for_cpu` would
    // alias onto a CPU's slot) gets no slot: every operation takes the
    // locked path and is still exact. `slot_stats` of any index, even
    // usize::MAX, is all zeros rather than a panic.
    let arena: &'static mut [std::mem::MaybeUninit<u8>] = Box::leak(Box::new_uninit_slice(8 << 20));
    KMEM2.source().add(arena, 0).unwrap();
    let before = KMEM2.source().stats().pages_in_use;
    let layout = Layout::from_size_align(96, 8).unwrap();
    for id in [usize::MAX, kmemcg::MAX_CPUS, kmemcg::MAX_CPUS + 1, 2 * kmemcg::MAX_CPUS] {
        CPU.with(|c| c.id.set(id));
        let blocks: Vec<*mut u8> = (0..1000)
            .map(|i| {
                // SAFETY: a valid non-zero layout.
                let p = unsafe { KMEM2.alloc(layout) };
                assert!(!p.is_null());
                // SAFETY: a fresh 96-byte block.
                unsafe { p.write_bytes(i as u8, 96) };
                p
            })
            .collect();
        for (i, &p) in blocks.iter().enumerate() {
            // SAFETY: live 96-byte blocks, checked and freed once.
            unsafe {
                assert!(std::slice::from_raw_parts(p, 96).iter().all(|&b| b == i as u8), "blocks overlap");
                KMEM2.dealloc(p, layout);
            }
        }
        for slot in (0..kmemcg::MAX_CPUS).chain([kmemcg::MAX_CPUS, usize::MAX]) {
            assert_eq!(KMEM2.slot_stats(slot), kmemcg::SlotStats::default(), "cpu {id} used slot {slot}");
        }
    }
    CPU.with(|c| c.id.set(usize::MAX));
    KMEM2.shrink();
    assert_eq!(KMEM2.root().usage(), 0);
    assert!(KMEM2.source().stats().pages_in_use <= before);
}

#[test]
fn irq_spin_lock_restores_the_interrupt_state_in_every_order() {
    // Each guard restores the state from before its lock, a failed
    // try_lock restores at once, and nested guards dropped in reverse
    // order leave interrupts as they were.
    let masked = || CPU.with(|c| c.masked.get());
    let a: lock_api::Mutex<IrqSpinLock<Sim>, u32> = lock_api::Mutex::new(0);
    let b: lock_api::Mutex<IrqSpinLock<Sim>, u32> = lock_api::Mutex::new(0);
    assert!(!masked());
    {
        let mut ga = a.lock();
        assert!(masked(), "a held IrqSpinLock must mask interrupts");
        let gb = b.lock();
        drop(gb);
        assert!(masked(), "dropping the inner guard unmasked under the outer one");
        *ga += 1;
    }
    assert!(!masked(), "interrupts stayed masked after the last guard");
    std::thread::scope(|s| {
        let held = a.lock();
        s.spawn(|| {
            assert!(a.try_lock().is_none());
            assert!(!masked(), "a failed try_lock left interrupts masked");
        })
        .join()
        .unwrap();
        drop(held);
    });
    assert!(!masked());
    assert_eq!(*a.lock(), 1);
}
