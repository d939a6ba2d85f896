//! The bare-metal platform: one slot per CPU, held with local interrupts
//! masked, over the few facts a kernel knows about its CPUs ([`Cpu`]); and
//! the interrupt-safe spin lock kernels pass as the lock type.
//!
//! # How it keeps the slot contract
//!
//! `enter` masks local interrupts, then reads the CPU's index: from then
//! until `exit` restores the interrupt state nothing else runs on this
//! CPU (no interrupt handler, no other task), and no other CPU has this
//! index, so the slot is held by exactly one context, and an interrupt
//! handler that allocates never finds its CPU's slot busy: it runs before
//! the hold or after it. Holds never nest (the allocator holds one slot at
//! a time), so one saved interrupt state per CPU is enough.
//!
//! Magazine hits take the allocator's fast path, with compiler fences
//! only, whether or not the kernel has an all-CPU barrier:
//!
//! * with [`Cpu::BARRIER`], a drain of another CPU's magazines runs
//!   `barrier_all` (the asymmetric handshake);
//! * without it (most kernels), each slot is also a try-lock: `enter`
//!   takes its flag by one atomic read-modify-write once interrupts are
//!   masked, and `exit` gives it back with a store. A drain takes the flag
//!   of an idle CPU's slot (a steal: no handshake at all), and for a busy
//!   one waits until each CPU's current operation has ended (its heavy
//!   barrier takes and gives back every flag), which bounds the wait by
//!   one operation and needs no IPI. A CPU whose slot a drain holds takes
//!   the shared path meanwhile.
//!
//! Either way a drain runs with local interrupts masked on the draining
//! CPU, from before it takes the slot's drain flag until after it lets it
//! go (`Platform::mask`), so a preemptive kernel cannot switch tasks
//! inside it: the task switched to might wait for that flag with
//! interrupts masked (a group removal under the tree lock) and never let
//! the drainer run again.
//!
//! The flag of CPU `i`'s slot (`busy`, without `Cpu::BARRIER`):
//!
//! | transition | by | how |
//! | --- | --- | --- |
//! | 0 → 1 | CPU `i` in `enter`/`try_enter`, interrupts masked | `take`: `lock bts` on x86_64, else CAS; `Acquire`; on failure, interrupts restored and the shared path |
//! | 0 → 1 | a drain's `steal` | CAS, `Acquire` |
//! | 0 → 1 | a heavy barrier, spinning until it gets it | CAS, `AcqRel` |
//! | 1 → 0 | whoever set it: `exit` (before interrupts are restored), `unsteal`, the heavy barrier at once | store, `Release` |
//!
//! Interrupts are masked whenever CPU `i` holds the flag, so no interrupt
//! handler of CPU `i` runs meanwhile and the flag never makes one spin: a
//! handler finds it free, or (held by a drain) takes the shared path. A
//! heavy barrier or drain waits only for one operation of a holder, which
//! takes no lock a drainer holds (the lock order in the crate docs).
//!
//! Non-maskable interrupts (NMIs, SErrors) are not masked: their handlers
//! must not allocate or free.
//!
//! # Current group
//!
//! Kept per CPU. A kernel keeps it per *task* by switching it at context
//! switch: `let prev = platform.set_current_group(next.kmem_token);
//! prev_task.kmem_token = prev;` (a token is an opaque pointer that holds a
//! reference on its group, so it must be saved, never dropped). Code in
//! interrupt context ([`Cpu::in_interrupt`]) is charged to the root, as
//! Linux charges interrupt-context allocations to no task's group.
//!
//! # Interrupts and locks
//!
//! With this platform every lock of the allocator is an [`IrqSpinLock`]
//! (pass it as `Kmem`'s and `Region`'s lock type): a lock held with
//! interrupts enabled could be wanted by an interrupt handler on the same
//! CPU, which would spin forever. Allocations in interrupt context are
//! *atomic*: they never reclaim, never call shrinkers and never take the
//! group-tree lock (see `Kmem`'s docs on atomic allocations).

use core::marker::PhantomData;

use super::{MAX_CPUS, Platform, cpu_for_slot, slot_for_cpu};
#[cfg(not(loom))]
use crate::sync::atomic_bool;
use crate::sync::{AtomicBool, AtomicPtr, AtomicUsize, Ordering, UnsafeCell, atomic_null, atomic_usize, spin_hint};

/// What a kernel tells kmemcg about its CPUs: their indices, how to mask
/// and restore local interrupts, and optionally nodes and an all-CPU
/// barrier. Associated functions only: the state is the kernel's.
///
/// # Safety
///
/// An implementation must guarantee that:
/// 1. `id()`, called with local interrupts masked, returns the index of
///    the calling CPU, below [`MAX_CPUS`], different on every CPU and the
///    same until interrupts are restored (a CPU whose index is
///    `MAX_CPUS` or more gets no slot, only the shared path, and no
///    current group: it charges the root, `Cgroup::enter` there changes
///    nothing, and it runs none of the allocator's callbacks);
/// 2. `irq_save` masks maskable interrupts on the calling CPU and returns
///    a value that `irq_restore` turns back into the state before it
///    (nesting: save, save, restore, restore leaves the first state);
/// 3. `in_interrupt` is `true` in every handler that may allocate or free
///    while the interrupted code is inside the allocator with interrupts
///    enabled (in practice: in every interrupt handler);
/// 4. `node_of` returns a value below `crate::MAX_NODES`, fixed per CPU;
/// 5. if `BARRIER` is `true`, `barrier_all` runs a full memory barrier on
///    every CPU that may hold a slot before it returns (Linux
///    `membarrier`), *even when the caller and the other CPUs have
///    interrupts masked*: the allocator drains other CPUs' magazines under
///    its locks, which mask interrupts with [`IrqSpinLock`], so an IPI that
///    waits for each CPU to take an interrupt deadlocks against a CPU
///    spinning on such a lock. Most kernels leave `BARRIER` false: each
///    slot is then also a try-lock flag (one atomic read-modify-write per
///    operation, no fence, no IPI; see the module docs);
/// 6. none of these allocates, panics, or calls back into the allocator.
pub unsafe trait Cpu: 'static {
    /// Whether [`Cpu::barrier_all`] is implemented; then a slot hold takes
    /// no flag, and drains of busy CPUs call it (the asymmetric
    /// handshake). Either way the fast paths use compiler fences only.
    const BARRIER: bool = false;
    /// The calling CPU's index (with interrupts masked).
    fn id() -> usize;
    /// Masks local interrupts; returns the state to restore.
    fn irq_save() -> usize;
    /// Restores the interrupt state `irq_save` returned.
    ///
    /// # Safety
    ///
    /// `saved` came from `irq_save` on this CPU, restored in reverse order.
    unsafe fn irq_restore(saved: usize);
    /// Whether the caller runs in interrupt context.
    fn in_interrupt() -> bool {
        false
    }
    /// A monotonic clock in milliseconds, if the kernel keeps one (see
    /// [`Platform::now_ms`]).
    fn now_ms() -> Option<u64> {
        None
    }
    /// The NUMA node of CPU `cpu`.
    fn node_of(_cpu: usize) -> usize {
        0
    }
    /// Nodes in use (at most [`crate::MAX_NODES`] count).
    fn nodes() -> usize {
        1
    }
    /// A full memory barrier on every CPU (only called if `BARRIER`).
    fn barrier_all() {}
    /// Delays the running task by about `ns` nanoseconds (the `high`
    /// throttle; see [`Platform::throttle`], whose conditions hold: task
    /// context, interrupts as the task had them, no allocator lock held).
    /// The default does nothing.
    fn throttle(_ns: u64) {}
}

/// One CPU's state: 32 bytes, as the allocator's per-slot handshake state
/// and magazines are, so one shift of the slot indexes them all (aarch64
/// has no scaled register offset for a stride of 128: with cache-line
/// padding its pair took two more instructions). Two CPUs' states share a
/// cache line, slots `2k` and `2k + 1`, as their magazines do, and
/// [`slot_for_cpu`] gives the first half of the CPUs lines of their own.
/// The flag first: an exclusive load or store-release (aarch64) takes no
/// offset.
#[repr(C, align(32))]
struct CpuState {
    /// Without `Cpu::BARRIER`: 1 while the slot is held (by its CPU, or
    /// stolen by a drain), else 0: a try-lock taken with `Acquire` (see
    /// [`take`]) and given back with `Release`, so each holder adopts the
    /// magazines the last one left, and a drain can wait for the holder
    /// instead of an IPI. A word, not a `bool`: x86's `lock bts` has no
    /// byte form.
    busy: AtomicUsize,
    /// The interrupt state `enter` saved; written and read only by the
    /// slot's holder, with interrupts masked.
    saved: UnsafeCell<usize>,
    /// The current-group token of the task running here.
    group: AtomicPtr<()>,
}

// The magazine layer's per-slot entries' stride (see above).
#[cfg(all(target_pointer_width = "64", not(loom)))]
static_assertions::const_assert_eq!(core::mem::size_of::<CpuState>(), 32);

/// Takes a slot flag: whether it was free (then it is ours, `Acquire`).
///
/// On x86_64 a `fetch_or(1)` of which only bit 0 of the result is tested,
/// which compiles to `lock bts; jb`, two instructions where a
/// compare-and-swap takes four. It is the compare-and-swap `0 → 1` in all
/// but name: a read-modify-write reads the last value in the flag's
/// modification order, so it finds 0 and writes 1 (taken, with `Acquire`,
/// as a successful compare-and-swap), or finds 1 and writes 1 (not taken;
/// the value is unchanged, and its `Acquire` orders nothing we rely on).
/// Elsewhere, and under loom, the compare-and-swap itself: with
/// load-linked and store-conditional a `fetch_or` is one instruction
/// more, and loom 0.7 mis-models an unconditional read-modify-write racing
/// a store (a model of two threads taking such a flag by `fetch_or` and
/// giving it back ended with it taken: tokio-rs/loom#254), so loom checks
/// this protocol with the compare-and-swap.
#[inline(always)]
fn take(busy: &AtomicUsize) -> bool {
    if cfg!(all(target_arch = "x86_64", not(loom))) {
        busy.fetch_or(1, Ordering::Acquire) & 1 == 0
    } else {
        busy.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }
}

/// The bare-metal platform: CPU `i` owns slot [`slot_for_cpu`]`(i)`, held with interrupts
/// masked (and, without `Cpu::BARRIER`, its flag taken). See the module
/// docs.
pub struct PerCpu<C: Cpu> {
    cpus: [CpuState; MAX_CPUS],
    _cpu: PhantomData<fn() -> C>,
}

// SAFETY: the state is atomics, and `saved`, which only the holder of
// its slot touches (with interrupts masked on its CPU).
unsafe impl<C: Cpu> Sync for PerCpu<C> {}

impl<C: Cpu> Default for PerCpu<C> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Cpu> PerCpu<C> {
    crate::sync::loom_const_fn! {
        /// The platform; nothing runs until the first allocation.
        pub fn new() -> Self {
            PerCpu {
                cpus: crate::sync::repeat!(
                    CpuState {
                        busy: atomic_usize(0),
                        saved: UnsafeCell::new(0),
                        group: atomic_null(),
                    };
                    MAX_CPUS
                ),
                _cpu: PhantomData,
            }
        }
    }

    /// The calling CPU's slot, [`slot_for_cpu`] of its index; `None` for
    /// an index of [`MAX_CPUS`] or more.
    #[inline(always)]
    fn slot() -> Option<usize> {
        let cpu = C::id();
        (cpu < MAX_CPUS).then(|| slot_for_cpu(cpu))
    }

    /// Runs `f` with interrupts masked, on the calling CPU's state.
    #[inline]
    fn with_cpu<T>(&self, f: impl FnOnce(Option<&CpuState>) -> T) -> T {
        let saved = C::irq_save();
        let r = f(Self::slot().map(|s| &self.cpus[s]));
        // SAFETY: saved just above, on this CPU.
        unsafe { C::irq_restore(saved) };
        r
    }

    /// Takes the calling CPU's slot: masks interrupts, and without
    /// `Cpu::BARRIER` takes its `busy` flag too (`None` if a drain has
    /// it, or if the CPU's index is [`MAX_CPUS`] or more).
    #[inline(always)]
    fn hold(&self) -> Option<usize> {
        let saved = C::irq_save();
        match Self::slot().map(|s| (s, &self.cpus[s])) {
            Some((s, c)) if C::BARRIER || take(&c.busy) => {
                // SAFETY: we hold the slot (interrupts masked on this CPU;
                // without `BARRIER`, its flag too), so nothing else touches
                // `saved` until our `exit` reads it back.
                c.saved.with_mut(|p| unsafe { *p = saved });
                Some(s)
            }
            _ => {
                // SAFETY: saved just above, on this CPU.
                unsafe { C::irq_restore(saved) };
                None
            }
        }
    }
}

// SAFETY: (1) a slot is `slot_for_cpu` of the index of the CPU that
// holds it (a permutation of `0..MAX_CPUS`: `slot` refuses other indices), taken with interrupts masked and
// released by `exit`, which restores them: nothing else runs on that CPU
// meanwhile (interrupt handlers are masked, and the kernel cannot switch
// tasks), and `Cpu` (1) makes indices unique; without `Cpu::BARRIER` the
// slot is held only by whoever took its `busy` flag from 0 to 1 (`take`,
// `steal`, the heavy barrier) until it stores 0, so a drain that stole it
// excludes the CPU. (2) `Cpu` (4). (3) always asymmetric: with
// `Cpu::BARRIER`, `heavy_barrier` is `barrier_all` (`Cpu` (5)); without,
// it takes and gives back every slot's `busy` flag in turn, so it returns
// only after each holder has left its operation (the holder's writes
// before `exit`'s `Release` store are visible to our `Acquire`), and
// every later holder's `Acquire` take reads our `Release` store (or a
// later one in the flag's order), so sees what the caller wrote before:
// the second form of point 3. (4) without `Cpu::BARRIER`, `steal` takes
// the flag by CAS, and `enter` cannot take the slot until `unsteal` frees
// it; with it, `steal` is never granted (drains go through the
// handshake). (5) `Cpu` (6); the heavy barrier spins only until each
// holder ends one operation, which runs with interrupts masked on its CPU
// and takes no lock a drainer holds. (6) the token is stored per CPU and
// switched by the kernel at context switch (module docs); from interrupt
// context the same CPU's token is read back unchanged.
unsafe impl<C: Cpu> Platform for PerCpu<C> {
    #[inline]
    fn current_group(&self) -> *const () {
        self.with_cpu(|c| c.map_or(core::ptr::null(), |c| c.group.load(Ordering::Relaxed).cast_const()))
    }

    unsafe fn set_current_group(&self, token: *const ()) -> *const () {
        // A CPU without a slot keeps no token: it hands this one back (with
        // its reference), as `Platform` point 6 allows.
        self.with_cpu(|c| c.map_or(token, |c| c.group.swap(token.cast_mut(), Ordering::Relaxed).cast_const()))
    }

    #[inline]
    unsafe fn enter(&self) -> Option<usize> {
        self.hold()
    }

    #[inline(always)]
    unsafe fn try_enter(&self) -> Option<usize> {
        self.hold()
    }

    #[inline(always)]
    unsafe fn exit(&self, slot: usize) {
        // SAFETY: the holder's own CPU, interrupts still masked since
        // `enter` wrote it.
        let saved = self.cpus[slot].saved.with_mut(|p| unsafe { *p });
        if !C::BARRIER {
            // Release: the next holder or drain sees our magazine writes.
            self.cpus[slot].busy.store(0, Ordering::Release);
        }
        // SAFETY: saved by `enter` on this CPU, which is still masked.
        unsafe { C::irq_restore(saved) };
    }

    fn node_of(&self, slot: usize) -> usize {
        C::node_of(cpu_for_slot(slot))
    }

    fn nodes(&self) -> usize {
        C::nodes()
    }

    fn asymmetric(&self) -> bool {
        true
    }

    /// Without `Cpu::BARRIER`, slots are try-locks (the `busy` flags),
    /// which `heavy_barrier` takes and releases in turn.
    #[inline(always)]
    fn slots_are_locks(&self) -> bool {
        !C::BARRIER
    }

    fn heavy_barrier(&self) {
        if C::BARRIER {
            return C::barrier_all();
        }
        for c in &self.cpus {
            while c.busy.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                spin_hint();
            }
            c.busy.store(0, Ordering::Release);
        }
    }

    unsafe fn steal(&self, slot: usize) -> bool {
        !C::BARRIER && self.cpus[slot].busy.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    unsafe fn unsteal(&self, slot: usize) {
        self.cpus[slot].busy.store(0, Ordering::Release);
    }

    /// A drain (and the first use) runs with local interrupts masked, as a
    /// slot hold and every allocator lock do: no task switch, so no waiter
    /// for its flag runs on this CPU before it ends.
    fn mask(&self) -> usize {
        C::irq_save()
    }

    unsafe fn unmask(&self, saved: usize) {
        // SAFETY: saved by `mask` on this CPU (which the mask kept us
        // on), restored in reverse order (the caller's contract).
        unsafe { C::irq_restore(saved) }
    }

    #[inline(always)]
    fn in_interrupt(&self) -> bool {
        C::in_interrupt()
    }
    fn now_ms(&self) -> Option<u64> {
        C::now_ms()
    }

    fn throttle(&self, ns: u64) {
        C::throttle(ns)
    }
}

/// A spin lock that masks local interrupts while held, for
/// [`lock_api::Mutex`]: the lock type a kernel passes to `Kmem` and
/// `Region` with [`PerCpu`]. Guards must be released on the CPU that took
/// them, in reverse order of taking (as scoped guards are), since each
/// restores the interrupt state before its lock.
pub struct IrqSpinLock<C: Cpu> {
    locked: AtomicBool,
    /// The interrupt state before `lock`; written after taking the lock,
    /// read before releasing it.
    saved: UnsafeCell<usize>,
    _cpu: PhantomData<fn() -> C>,
}

// SAFETY: `saved` is only touched by the lock's holder.
unsafe impl<C: Cpu> Sync for IrqSpinLock<C> {}
// SAFETY: as above; the lock holds no thread-bound state while unlocked.
unsafe impl<C: Cpu> Send for IrqSpinLock<C> {}

#[cfg(not(loom))]
// SAFETY: `lock` returns only after swapping `locked` from false to true
// (Acquire), `unlock` stores false (Release), so one holder at a time, and
// the holder's accesses happen before the next holder's. Interrupts stay
// masked from before the lock is taken until after it is released.
unsafe impl<C: Cpu> lock_api::RawMutex for IrqSpinLock<C> {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = IrqSpinLock { locked: atomic_bool(false), saved: UnsafeCell::new(0), _cpu: PhantomData };
    type GuardMarker = lock_api::GuardNoSend;

    fn lock(&self) {
        let saved = C::irq_save();
        while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            while self.locked.load(Ordering::Relaxed) {
                crate::sync::spin_hint();
            }
        }
        // SAFETY: we hold the lock.
        self.saved.with_mut(|p| unsafe { *p = saved });
    }

    fn try_lock(&self) -> bool {
        let saved = C::irq_save();
        if self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            // SAFETY: we hold the lock.
            self.saved.with_mut(|p| unsafe { *p = saved });
            return true;
        }
        // SAFETY: saved just above, on this CPU.
        unsafe { C::irq_restore(saved) };
        false
    }

    unsafe fn unlock(&self) {
        // SAFETY: we hold the lock (caller contract).
        let saved = self.saved.with_mut(|p| unsafe { *p });
        self.locked.store(false, Ordering::Release);
        // SAFETY: saved by `lock` on this CPU (guards are `!Send`).
        unsafe { C::irq_restore(saved) };
    }
}
