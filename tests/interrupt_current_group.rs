//! An interrupt handler may call safe code that changes the current
//! group: `Kmem::reset_current_group`, `Cgroup::enter`, a guard's drop.
//! On a per-CPU platform the current group is the CPU's, which the
//! interrupted task may be allocating in on its token's reference alone:
//! a handler that reset it, removed the group and shrank let the task's
//! allocation go on in freed memory, charging a group made in its place
//! (found by a review). In interrupt context these calls now leave the
//! interrupted code's current group alone.
//!
//! The simulated CPU runs the "interrupt" at the `n`-th `irq_save` of the
//! allocation, before it masks, as a real interrupt right after an
//! `irq_restore` would.

use std::cell::{Cell, RefCell};
use std::sync::Mutex;

use kmemcg::{CacheFlags, Cgroup, CgroupGuard, Cpu, IrqSpinLock, Kmem, KmemCache, PerCpu, Platform, Region};

thread_local! {
    static MASKED: Cell<bool> = const { Cell::new(false) };
    static IN_IRQ: Cell<bool> = const { Cell::new(false) };
    static COUNTDOWN: Cell<usize> = const { Cell::new(0) };
    /// The task's guard on its group, which the handler reaches.
    static TASK_GUARD: RefCell<Option<CgroupGuard<'static, K>>> = const { RefCell::new(None) };
}

struct Sim;

// SAFETY: one test thread on CPU 0; masking nests (the saved state comes
// back); `in_interrupt` is true exactly while the handler runs, which
// happens with interrupts unmasked, before `irq_save` masks.
unsafe impl Cpu for Sim {
    fn id() -> usize {
        0
    }
    fn irq_save() -> usize {
        let was = MASKED.with(Cell::get);
        if !was && !IN_IRQ.with(Cell::get) {
            let n = COUNTDOWN.with(Cell::get);
            if n == 1 {
                IN_IRQ.with(|c| c.set(true));
                handler();
                IN_IRQ.with(|c| c.set(false));
            }
            COUNTDOWN.with(|c| c.set(n.saturating_sub(1)));
        }
        MASKED.with(|m| m.set(true));
        usize::from(was)
    }
    unsafe fn irq_restore(saved: usize) {
        MASKED.with(|m| m.set(saved != 0));
    }
    fn in_interrupt() -> bool {
        IN_IRQ.with(Cell::get)
    }
}

type K = Kmem<Region<IrqSpinLock<Sim>>, IrqSpinLock<Sim>, PerCpu<Sim>>;
static KMEM: K = Kmem::with_platform(Region::new(), PerCpu::new());
static VICTIM: Mutex<Option<Cgroup<'static, K>>> = Mutex::new(None);
static MADE: Mutex<Option<Cgroup<'static, K>>> = Mutex::new(None);

/// Safe code in an interrupt handler: drops the task's guard, enters the
/// CPU's current group and leaves it, makes the root current (each would
/// let go of the task's group), removes the group, shrinks, and makes a
/// group that may take its memory.
fn handler() {
    drop(TASK_GUARD.with(|g| g.borrow_mut().take()));
    if let Some(v) = VICTIM.lock().unwrap().take() {
        drop(v.enter());
        KMEM.reset_current_group();
        v.remove().unwrap();
    }
    KMEM.shrink();
    *MADE.lock().unwrap() = Some(KMEM.root().create_child("y").unwrap());
}

#[test]
fn an_interrupt_handler_leaves_the_interrupted_tasks_group_alone() {
    let arena: &'static mut [std::mem::MaybeUninit<u8>] = Box::leak(Box::new_uninit_slice(16 << 20));
    KMEM.source().add(arena, 0).unwrap();
    let cache: &'static KmemCache<'static, [u64; 32], K> =
        Box::leak(Box::new(KMEM.create_cache::<[u64; 32]>("objs", CacheFlags::ACCOUNT).unwrap()));
    let mut interrupted = 0;
    for countdown in 1..8 {
        let x = KMEM.root().create_child("x").unwrap();
        let guard = x.enter();
        TASK_GUARD.with(|g| *g.borrow_mut() = Some(guard));
        let token = KMEM.platform().current_group();
        *VICTIM.lock().unwrap() = Some(x);
        COUNTDOWN.with(|c| c.set(countdown));
        let b = cache.alloc([7; 32]);
        COUNTDOWN.with(|c| c.set(0));
        assert!(b.is_ok(), "countdown {countdown}: x has no limit");
        assert_eq!(
            KMEM.platform().current_group(),
            token,
            "countdown {countdown}: the handler changed the task's group"
        );
        drop(b);
        if let Some(y) = MADE.lock().unwrap().take() {
            interrupted += 1;
            assert_eq!(
                y.usage(),
                0,
                "countdown {countdown}: the task's allocation charged a group made in the handler"
            );
            y.remove().unwrap();
        }
        VICTIM.lock().unwrap().take();
        drop(TASK_GUARD.with(|g| g.borrow_mut().take()));
        KMEM.reset_current_group();
        KMEM.shrink();
    }
    assert!(interrupted >= 4, "the handler ran inside {interrupted} allocations");
}
