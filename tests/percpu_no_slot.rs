//! `PerCpu` on a CPU without a slot (an index of `MAX_CPUS` or more, which
//! the `Cpu` contract allows: such a CPU takes the shared path), and a
//! `Cpu` that reports more nodes than there can be. Found by a review:
//! the CPU without a slot dropped the token `set_current_group` gave it,
//! so callbacks' marks were lost (an out-of-memory handler that allocated
//! was called again from inside itself, without end) and `Cgroup::enter`
//! leaked the group's reference; `nodes() == usize::MAX` made one
//! reclaim ask every shrinker about every node, without end.
//!
//! Now such a CPU keeps no current group (it charges the root; `enter`
//! there changes nothing and leaks nothing) and runs no callback, and
//! node counts above `MAX_NODES` count as `MAX_NODES`.

use std::alloc::{GlobalAlloc, Layout};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use allocator_api2::alloc::Allocator;
use kmemcg::{
    Cpu, DefaultRawMutex, Detection, IrqSpinLock, Kmem, MAX_CPUS, MAX_NODES, OsPages, PerCpu, Region, ShrinkControl,
    Shrinker,
};

/// A one-CPU machine whose CPU's index is `MAX_CPUS`.
struct HighCpu;
static IRQ: AtomicUsize = AtomicUsize::new(0);
// SAFETY: the tests using it run on one thread at a time on it (point 1
// allows an index of MAX_CPUS); save and restore nest; nothing allocates.
unsafe impl Cpu for HighCpu {
    fn id() -> usize {
        MAX_CPUS
    }
    fn irq_save() -> usize {
        IRQ.swap(1, Ordering::Relaxed)
    }
    unsafe fn irq_restore(s: usize) {
        IRQ.store(s, Ordering::Relaxed)
    }
}

type High = Kmem<Region, DefaultRawMutex, PerCpu<HighCpu>>;

fn high_kmem(bytes: usize) -> &'static High {
    let k: &'static High =
        Box::leak(Box::new(Kmem::with_platform(Region::new(), PerCpu::new()).with_detection(Detection::OFF)));
    k.source().add(Box::leak(vec![MaybeUninit::uninit(); bytes].into_boxed_slice()), 0).unwrap();
    k
}

static DEPTH: AtomicUsize = AtomicUsize::new(0);
static CALLS: AtomicUsize = AtomicUsize::new(0);

fn handler(k: &High, _pages: usize) -> bool {
    let d = DEPTH.fetch_add(1, Ordering::SeqCst) + 1;
    CALLS.fetch_add(1, Ordering::SeqCst);
    if d < 50 {
        let l = Layout::from_size_align(1 << 20, 8).unwrap();
        // SAFETY: a non-zero size; freed at once.
        let p = unsafe { k.alloc(l) };
        if !p.is_null() {
            // SAFETY: allocated just above with `l`.
            unsafe { k.dealloc(p, l) }
        }
    }
    DEPTH.fetch_sub(1, Ordering::SeqCst);
    false
}

/// Both cases share `HighCpu`'s interrupt state: one test.
#[test]
fn a_cpu_without_a_slot_keeps_no_group_and_runs_no_callback() {
    // The out-of-memory handler is not called where it could not be
    // marked as running (it would be called again from its own
    // allocation): the allocation fails at once.
    let k = high_kmem(64 << 10);
    k.set_oom_handler(Some(handler));
    let l = Layout::from_size_align(1 << 20, 8).unwrap();
    // SAFETY: a non-zero size.
    assert!(unsafe { k.alloc(l) }.is_null());
    assert_eq!(CALLS.load(Ordering::SeqCst), 0, "the handler ran on a CPU that cannot be marked");

    // `enter` changes nothing there and takes no reference it keeps: the
    // group goes once removed and dropped.
    let k = high_kmem(1 << 20);
    let g = k.root().create_child("g").unwrap();
    let guard = g.enter();
    assert_eq!(k.current_group().name(), "/");
    let l = Layout::from_size_align(64, 8).unwrap();
    // SAFETY: a non-zero size.
    let p = unsafe { k.alloc(l) };
    assert!(!p.is_null());
    assert_eq!(g.usage(), 0, "charged to the root");
    // SAFETY: allocated just above with `l`.
    unsafe { k.dealloc(p, l) };
    drop(guard);
    g.remove().unwrap();
    drop(g);
    k.shrink();
    let groups = k.slabinfo().to_string();
    let line = groups.lines().find(|l| l.starts_with("kmem_cgroup")).unwrap();
    assert_eq!(line.split_whitespace().nth(1), Some("0"), "a group record is left: {line}");
}

/// A one-CPU machine that says it has `usize::MAX` nodes.
struct ManyNodes;
static IRQ2: AtomicUsize = AtomicUsize::new(0);
// SAFETY: one thread at a time runs on it (the test's); save and restore
// nest; nothing allocates. (`nodes` is not bounded by the contract.)
unsafe impl Cpu for ManyNodes {
    fn id() -> usize {
        0
    }
    fn irq_save() -> usize {
        IRQ2.swap(1, Ordering::Relaxed)
    }
    unsafe fn irq_restore(s: usize) {
        IRQ2.store(s, Ordering::Relaxed)
    }
    fn nodes() -> usize {
        usize::MAX
    }
}

struct CountingShrinker(AtomicUsize, AtomicUsize);
impl Shrinker for CountingShrinker {
    fn count(&self, sc: &ShrinkControl) -> usize {
        self.0.fetch_add(1, Ordering::Relaxed);
        self.1.fetch_max(sc.node(), Ordering::Relaxed);
        0
    }
    fn scan(&self, _: &ShrinkControl, _: usize) -> usize {
        0
    }
}

#[test]
fn a_reclaim_asks_shrinkers_about_max_nodes_nodes_at_most() {
    type K = Kmem<OsPages<IrqSpinLock<ManyNodes>>, IrqSpinLock<ManyNodes>, PerCpu<ManyNodes>>;
    let k: &'static K = Box::leak(Box::new(Kmem::with_platform(OsPages::new(), PerCpu::new())));
    let s: &'static CountingShrinker = Box::leak(Box::new(CountingShrinker(AtomicUsize::new(0), AtomicUsize::new(0))));
    k.register_shrinker(s).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let g = k.root().create_child("g").unwrap();
        g.set_max(1 << 20).unwrap();
        let a = g.allocator();
        let l = Layout::from_size_align(64 << 10, 8).unwrap();
        let mut n = 0;
        while a.allocate(l).is_ok() {
            n += 1;
        }
        tx.send(n).unwrap();
    });
    let r = rx.recv_timeout(Duration::from_secs(60));
    let calls = s.0.load(Ordering::Relaxed);
    assert!(r.is_ok(), "reclaim did not finish in 60 s; shrinker count() called {calls} times");
    assert!(calls > 0, "the refused charge reclaimed");
    assert!(s.1.load(Ordering::Relaxed) < MAX_NODES, "a node of MAX_NODES or more was asked about");
}
