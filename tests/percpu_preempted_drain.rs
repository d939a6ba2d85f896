//! A review's finding: a drain of a CPU's magazines (`shrink`, `reap` --
//! decay runs one inside ordinary allocations) holds that slot's drainer
//! flag, and on `PerCpu` without `Cpu::BARRIER` its stolen `busy` flag,
//! across many lock holds. With local interrupts *enabled* between them,
//! as they were, a preemptive kernel may switch tasks there (a timer
//! interrupt the moment a lock's guard restores the interrupt flag). If
//! the task it switches to is a drain that waits (`Cgroup::remove`, a
//! reclaim at a group's `max`, `check_empty`), it spins for that flag
//! while holding the tree lock, an `IrqSpinLock`: interrupts masked, so it
//! is never preempted, the preempted drainer never runs again on that CPU,
//! and the CPU hangs. Now `PerCpu` keeps interrupts masked from before a
//! drain takes the flag until after it lets it go
//! (`Platform::mask`), and so does a `Kmem`'s first use, which others
//! wait for too.
//!
//! The simulation: one CPU (this thread, index 0). Task A runs the drain;
//! each time an `IrqSpinLock` guard (or slot exit) turns its interrupts
//! back on, a simulated timer interrupt preempts it and the scheduler runs
//! task B on the same CPU, to completion or forever, as a kernel would
//! (B never re-enables interrupts while it spins). B removes one group.
//! A watchdog on another thread reports the hang.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use kmemcg::{Cgroup, Cpu, Decay, IrqSpinLock, Kmem, PerCpu, Platform, Region};

struct SimCpu {
    masked: Cell<bool>,
    /// A context switch is in progress (task B runs): no nested switch.
    switching: Cell<bool>,
}

thread_local! {
    static CPU: SimCpu = const { SimCpu { masked: Cell::new(false), switching: Cell::new(false) } };
}

/// Whether a timer interrupt preempts task A when it unmasks.
static PREEMPT: AtomicBool = AtomicBool::new(false);
/// Preempt only where slot 0's flag is held (by a drain: a holder keeps
/// interrupts masked until its flag is back), probed with `try_steal`.
static ONLY_IN_DRAIN: AtomicBool = AtomicBool::new(false);
/// Times a switch came while slot 0's flag was held.
static IN_DRAIN: AtomicUsize = AtomicUsize::new(0);
/// Times task B was switched to, and times it finished.
static B_RUNS: AtomicUsize = AtomicUsize::new(0);
static B_DONE: AtomicUsize = AtomicUsize::new(0);

struct Sim;

// SAFETY: (1) one CPU, index 0, fixed; (2) `masked` is the interrupt flag,
// saved and restored, nesting; (3) no interrupt handler allocates (the
// simulated timer interrupt only switches tasks; B runs in task context);
// (4) one node; (5) no barrier; (6) nothing here allocates (the context
// switch runs task B, a task of the simulated kernel, not this code).
unsafe impl Cpu for Sim {
    fn id() -> usize {
        0
    }
    fn irq_save() -> usize {
        CPU.with(|c| c.masked.replace(true)) as usize
    }
    unsafe fn irq_restore(saved: usize) {
        CPU.with(|c| c.masked.set(saved != 0));
        if saved == 0 {
            timer_interrupt();
        }
    }
}

type SimKmem = Kmem<Region<IrqSpinLock<Sim>>, IrqSpinLock<Sim>, PerCpu<Sim>>;

/// The groups task B removes, one per switch.
static VICTIMS: Mutex<Vec<Cgroup<'static, SimKmem>>> = Mutex::new(Vec::new());
/// The allocator of the running scenario.
static CURRENT: Mutex<Option<&'static SimKmem>> = Mutex::new(None);

/// Interrupts just came back on in task A: the pending timer interrupt
/// fires, and the scheduler switches to task B on this CPU.
fn timer_interrupt() {
    if !PREEMPT.load(Ordering::Relaxed) || CPU.with(|c| c.switching.get()) {
        return;
    }
    if ONLY_IN_DRAIN.load(Ordering::Relaxed) {
        let Some(kmem) = *CURRENT.lock().unwrap() else { return };
        // SAFETY: a probe: a slot nobody holds is given back at once,
        // untouched (as a drain that found nothing to do).
        unsafe {
            if kmem.platform().try_steal(0) {
                kmem.platform().unsteal(0);
                return;
            }
        }
        IN_DRAIN.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(kmem) = FIRST_USE.lock().unwrap().take() {
        // Task B allocates in an interrupts-off section of its own.
        CPU.with(|c| c.switching.set(true));
        B_RUNS.fetch_add(1, Ordering::Relaxed);
        let was = CPU.with(|c| c.masked.replace(true));
        let l = Layout::from_size_align(64, 8).unwrap();
        // SAFETY: valid layout; freed at once with it.
        unsafe {
            let p = kmem.alloc(l);
            assert!(!p.is_null());
            kmem.dealloc(p, l);
        }
        CPU.with(|c| c.masked.set(was));
        B_DONE.fetch_add(1, Ordering::Relaxed);
        CPU.with(|c| c.switching.set(false));
        return;
    }
    let Some(g) = VICTIMS.try_lock().ok().and_then(|mut v| v.pop()) else { return };
    CPU.with(|c| c.switching.set(true));
    B_RUNS.fetch_add(1, Ordering::Relaxed);
    // Task B: an ordinary task-context call.
    g.remove().unwrap();
    drop(g);
    B_DONE.fetch_add(1, Ordering::Relaxed);
    CPU.with(|c| c.switching.set(false));
}

fn scenario(kmem: &'static SimKmem, task_a: fn(&'static SimKmem)) {
    let arena: &'static mut [std::mem::MaybeUninit<u8>] = Box::leak(Box::new_uninit_slice(16 << 20));
    kmem.source().add(arena, 0).unwrap();
    *CURRENT.lock().unwrap() = Some(kmem);
    // Groups for task B to remove; one of them charges an object on this
    // CPU first, so slot 0 has held a byte stock (removals visit it).
    let groups: Vec<_> = (0..256).map(|i| kmem.root().create_child(&format!("g{i}")).unwrap()).collect();
    {
        let _in = groups[0].enter();
        let l = Layout::from_size_align(64, 8).unwrap();
        // SAFETY: valid layout; freed at once with it.
        unsafe { kmem.dealloc(kmem.alloc(l), l) };
    }
    // Objects in this CPU's magazines, of a few classes, so a drain of the
    // slot has work that takes (and releases) list locks.
    for size in [16usize, 64, 256, 1024] {
        let l = Layout::from_size_align(size, 8).unwrap();
        // SAFETY: valid layout; each block freed once with it.
        let v: Vec<*mut u8> = (0..200).map(|_| unsafe { kmem.alloc(l) }).collect();
        for p in v {
            assert!(!p.is_null());
            // SAFETY: as above.
            unsafe { kmem.dealloc(p, l) };
        }
    }
    *VICTIMS.lock().unwrap() = groups;
    PREEMPT.store(true, Ordering::Relaxed);
    task_a(kmem);
    PREEMPT.store(false, Ordering::Relaxed);
}

/// For `the_first_use_is_not_preempted`: the allocator task B allocates
/// from, once.
static FIRST_USE: Mutex<Option<&'static SimKmem>> = Mutex::new(None);

/// The tests share the statics above: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn run(task_a: fn(&'static SimKmem), what: &str, only_in_drain: bool) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A test that hung left its switches armed, and its groups.
    PREEMPT.store(false, Ordering::Relaxed);
    std::mem::forget(std::mem::take(&mut *VICTIMS.lock().unwrap_or_else(|e| e.into_inner())));
    ONLY_IN_DRAIN.store(only_in_drain, Ordering::Relaxed);
    B_RUNS.store(0, Ordering::Relaxed);
    B_DONE.store(0, Ordering::Relaxed);
    IN_DRAIN.store(0, Ordering::Relaxed);
    let kmem: &'static SimKmem = Box::leak(Box::new(Kmem::with_platform(Region::new(), PerCpu::new())));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        scenario(kmem, task_a);
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(()) => {
            // Only switches inside a drain (`only_in_drain`) must not come.
            let runs = B_RUNS.load(Ordering::Relaxed);
            if only_in_drain {
                assert_eq!(IN_DRAIN.load(Ordering::Relaxed), 0, "{what}: a switch came inside a drain");
            } else {
                assert!(runs > 0, "task A never unmasked interrupts: nothing tested");
            }
            println!("{what}: task B ran {runs} times, all finished");
        }
        Err(_) => panic!(
            "CPU 0 hangs: task B ({}th switch, `Cgroup::remove`, tree lock held, interrupts masked) spins on \
             slot 0's drainer flag, which task A ({what}), preempted inside its drain, holds; \
             B finished {} times before",
            B_RUNS.load(Ordering::Relaxed),
            B_DONE.load(Ordering::Relaxed)
        ),
    }
}

#[test]
fn a_removal_does_not_hang_on_the_cpu_of_a_drain_between_its_lock_holds() {
    run(
        |k| {
            k.shrink();
        },
        "Kmem::shrink",
        false,
    );
}

/// The same with no explicit drain at all: task A only allocates and
/// frees, and the decay reap that one of its allocations runs (once a
/// second with a clock, per 2^20 slow paths without; 256 here) is the
/// drain that could be preempted. The switch to B happens only inside a
/// drain's window (probed): before the fix the window was reached by
/// plain allocation traffic and B hung; now no switch comes inside one.
#[test]
fn a_decay_reap_inside_an_allocation_is_not_preempted_in_its_drain() {
    run(
        |k| {
            k.set_decay(Decay::new(0, 256));
            let l = Layout::from_size_align(64, 8).unwrap();
            for _ in 0..50 {
                // SAFETY: valid layout; each block freed once with it.
                let v: Vec<*mut u8> = (0..5000).map(|_| unsafe { k.alloc(l) }).collect();
                for p in v {
                    assert!(!p.is_null());
                    // SAFETY: as above.
                    unsafe { k.dealloc(p, l) };
                }
            }
            assert!(k.decay_stats().0 > 0, "no decay reap ran");
        },
        "a decay reap inside an allocation",
        true,
    );
}

/// A `Kmem`'s first use fits its caches to the page source, taking the
/// source's lock (an `IrqSpinLock`), while every other context that uses
/// the `Kmem` waits for it. Task A's first allocation is preempted at the
/// first unmask; task B, switched to, allocates from the same `Kmem` with
/// interrupts masked (a section of its own). Had the fitting run with
/// interrupts on between its lock holds, B would have waited for it
/// forever; now B runs once A's first use is done, and both allocate.
#[test]
fn the_first_use_is_not_preempted() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    PREEMPT.store(false, Ordering::Relaxed);
    // No removals here: the groups another test left are not for us.
    std::mem::forget(std::mem::take(&mut *VICTIMS.lock().unwrap_or_else(|e| e.into_inner())));
    ONLY_IN_DRAIN.store(false, Ordering::Relaxed);
    B_RUNS.store(0, Ordering::Relaxed);
    B_DONE.store(0, Ordering::Relaxed);
    let kmem: &'static SimKmem = Box::leak(Box::new(Kmem::with_platform(Region::new(), PerCpu::new())));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let arena: &'static mut [std::mem::MaybeUninit<u8>] = Box::leak(Box::new_uninit_slice(4 << 20));
        kmem.source().add(arena, 0).unwrap();
        *FIRST_USE.lock().unwrap() = Some(kmem);
        PREEMPT.store(true, Ordering::Relaxed);
        let l = Layout::from_size_align(64, 8).unwrap();
        // SAFETY: valid layout; freed at once with it.
        unsafe {
            let p = kmem.alloc(l);
            assert!(!p.is_null());
            kmem.dealloc(p, l);
        }
        PREEMPT.store(false, Ordering::Relaxed);
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(()) => assert_eq!(B_DONE.load(Ordering::Relaxed), 1, "task B never ran: nothing tested"),
        Err(_) => panic!("CPU 0 hangs: task B, interrupts masked, waits for task A's first use, which it preempted"),
    }
}
