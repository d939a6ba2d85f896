//! The one module that names `core::sync::atomic` or `loom`.
//!
//! Every other module imports its atomics, fences and spin hints from here,
//! so a `--cfg loom` build swaps the whole crate onto loom's model-checked
//! primitives without touching any other file. `.ci/run` greps the tree to
//! keep it that way.

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicUsize, Ordering, compiler_fence, fence,
};
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicUsize, Ordering, fence};

/// Under loom: statics made afresh in every model execution
/// (`model_static!`, loom's `lazy_static!`) and model thread-locals whose
/// values drop when their model thread ends (`model_thread_local!`), for
/// the loom build of the `Threads` platform.
#[cfg(all(loom, feature = "std"))]
pub(crate) use loom::{lazy_static as model_static, thread_local as model_thread_local};

/// `&s[i]` without a bounds check, for the allocation paths: what
/// `get_unchecked` is once optimised, without its debug precondition
/// check. A user's debug build compiles kmemcg's generic paths in the
/// user's crate, at opt-level 0 with debug assertions on, where every
/// `get_unchecked` is two calls and a check.
///
/// # Safety
///
/// `i < s.len()`.
#[inline(always)]
pub(crate) unsafe fn at<T>(s: &[T], i: usize) -> &T {
    // SAFETY: in bounds (caller).
    unsafe { &*s.as_ptr().add(i) }
}

/// `base + off + disp` (bytes; `disp` a constant) as a pointer, formed by
/// one `lea` into a register of its own (x86_64 outside Miri) that the
/// compiler cannot see through: the loads and stores of the fields
/// behind it then address them as that register plus a displacement,
/// never with the offset as an index register. For a slot's cells (its
/// magazines, its byte stock), whose offset `off` is the slot's.
///
/// Why: on the Intel cores the benchmarks ran on (family 6 model 167,
/// `lscpu`), a load addressed base + index that reads what a store just
/// wrote takes about twice as long to get the value as one addressed
/// base + displacement. A magazine pair is two such chains (the pop's
/// load of `top` reads the last push's store, and the push's reads the
/// pop's): a 64-byte pair took 5.4 ns folded, 2.7 ns formed. The `lea`
/// is one instruction an access where the index had been free.
///
/// Elsewhere (other targets, Miri): the same address, by pointer
/// arithmetic.
///
/// The caller's part (the expansion has an `unsafe` block that relies on
/// it): `base + disp + off` is within the object `base` points to.
macro_rules! formed_address {
    ($base:expr, $off:expr, $disp:expr) => {{
        let base: *const u8 = core::ptr::from_ref($base).cast::<u8>();
        let off: usize = $off;
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        let p: *const u8 = {
            let p: *const u8;
            // The block reads no memory, writes no flags, and hands back
            // the pointer `base` offset by `off + disp`, as
            // `base.wrapping_byte_add(off + disp)` would: the result keeps
            // `base`'s provenance (an asm block acts as Rust code that
            // could do what it does). `nomem` is right: the block computes
            // an address, it touches nothing behind it.
            #[allow(clippy::pointers_in_nomem_asm_block)]
            // SAFETY: one `lea`, as argued just above.
            unsafe {
                core::arch::asm!(
                    "lea {p}, [{b} + {o} + {d}]",
                    p = lateout(reg) p,
                    b = in(reg) base,
                    o = in(reg) off,
                    d = const $disp,
                    options(pure, nomem, nostack, preserves_flags),
                )
            };
            p
        };
        #[cfg(not(all(target_arch = "x86_64", not(miri))))]
        let p: *const u8 = {
            let disp: usize = $disp;
            // SAFETY: within the object at `base` (the caller's part).
            unsafe { base.add(disp).add(off) }
        };
        p
    }};
}
pub(crate) use formed_address;

/// An array of `Sync` values shared by reference, stored in one
/// `UnsafeCell`: it hands out only shared references to its elements, so it
/// behaves as the plain array would. Why it exists: Miri retags a
/// reference by walking every `UnsafeCell` inside the type it points to,
/// so a `&Kmem` whose size classes (and the page map's leaves) sat in plain
/// arrays of atomics cost thousands of steps on every method call, about
/// half a second per allocation under Miri. One cell around the array is
/// one step; an element's reference is retagged alone, when it is made.
#[repr(transparent)]
pub(crate) struct CellArray<T, const N: usize>(core::cell::UnsafeCell<[T; N]>);

// SAFETY: only `&T` ever leaves a shared `CellArray` (and `&mut` only from
// `&mut self`), exactly as for `[T; N]`, which is `Sync` when `T` is.
unsafe impl<T: Sync, const N: usize> Sync for CellArray<T, N> {}
// SAFETY: as above; the array is owned inline.
unsafe impl<T: Send, const N: usize> Send for CellArray<T, N> {}

impl<T, const N: usize> CellArray<T, N> {
    /// The array `a`.
    pub(crate) const fn new(a: [T; N]) -> Self {
        CellArray(core::cell::UnsafeCell::new(a))
    }

    /// The element at `i`, if `i < N`.
    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        // SAFETY: in bounds (checked).
        if i < N { Some(unsafe { self.get_unchecked(i) }) } else { None }
    }

    /// The element at `i`, unchecked.
    ///
    /// # Safety
    ///
    /// `i < N`.
    #[inline(always)]
    pub(crate) unsafe fn get_unchecked(&self, i: usize) -> &T {
        // SAFETY: in bounds (caller); nothing ever writes the array through
        // the cell while `&self` lives (see the type), so a shared
        // reference to an element is as valid as one into `[T; N]`.
        unsafe { &*self.0.get().cast::<T>().add(i) }
    }

    /// The first element's address (the array's): for `Rseq`'s sections,
    /// built on x86_64 Linux with `std` only.
    #[allow(dead_code)] // unused where `Rseq` is not built
    #[inline(always)]
    pub(crate) fn as_ptr(&self) -> *const T {
        self.0.get().cast::<T>()
    }

    /// The elements, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        // SAFETY: every index below N.
        (0..N).map(move |i| unsafe { self.get_unchecked(i) })
    }

    /// The elements, mutably (exclusive access).
    #[cfg(feature = "std")]
    pub(crate) fn get_mut(&mut self) -> &mut [T; N] {
        self.0.get_mut()
    }
}

impl<'a, T, const N: usize> IntoIterator for &'a CellArray<T, N> {
    type Item = &'a T;
    type IntoIter = core::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        // SAFETY: nothing writes the array through the cell while `&self`
        // lives (see the type), so a shared reference to it is valid.
        unsafe { &*self.0.get() }.iter()
    }
}

impl<T, const N: usize> core::ops::Index<usize> for CellArray<T, N> {
    type Output = T;
    #[inline(always)]
    fn index(&self, i: usize) -> &T {
        match self.get(i) {
            Some(t) => t,
            None => panic!("CellArray index out of bounds"),
        }
    }
}

/// A value shared by reference, stored in one `UnsafeCell`: it derefs to
/// `&T` only, so it behaves as the plain value would. Like [`CellArray`],
/// for Miri: a struct holding a large interior-mutable part (a `Tree`, a
/// `Cache`) inline is walked in full on every retag of a reference to the
/// struct; behind one cell, the part is walked only when a reference to
/// the part itself is made.
#[repr(transparent)]
pub(crate) struct OneCell<T>(core::cell::UnsafeCell<T>);

// SAFETY: only `&T` ever leaves a shared `OneCell` (and `&mut T` only from
// `&mut self`), exactly as for `T` itself.
unsafe impl<T: Sync> Sync for OneCell<T> {}
// SAFETY: as above; the value is owned inline.
unsafe impl<T: Send> Send for OneCell<T> {}

impl<T> OneCell<T> {
    /// The value `v`.
    pub(crate) const fn new(v: T) -> Self {
        OneCell(core::cell::UnsafeCell::new(v))
    }

    /// The value, mutably (exclusive access; usable in `const fn`).
    pub(crate) const fn get_mut(&mut self) -> &mut T {
        self.0.get_mut()
    }
}

impl<T> core::ops::Deref for OneCell<T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: nothing ever writes the value through the cell while
        // `&self` lives (see the type), so this is as valid as `&T`.
        unsafe { &*self.0.get() }
    }
}

impl<T> core::ops::DerefMut for OneCell<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        self.get_mut()
    }
}

/// Loom has no compiler fence, and needs none: it never reorders one
/// thread's own accesses, and a compiler fence orders nothing between
/// threads. So it is nothing here, as on the hardware: a model of an
/// asymmetric platform (the slot try-locks of `NoCpus` and `PerCpu`)
/// must prove the slot handshake without it. (It was a full fence, which
/// made the holder's half of the handshake stronger in the models than in
/// the code they check.)
#[cfg(loom)]
#[inline(always)]
pub(crate) fn compiler_fence(_order: Ordering) {}

/// An `UnsafeCell` with loom's `with`/`with_mut` API on both sides, so loom
/// can check every access to per-CPU state for races.
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(#[cfg(not(loom))] core::cell::UnsafeCell<T>, #[cfg(loom)] loom::cell::UnsafeCell<T>);

impl<T> UnsafeCell<T> {
    loom_const_fn! {
        pub(crate) fn new(v: T) -> Self {
            #[cfg(not(loom))]
            let cell = core::cell::UnsafeCell::new(v);
            #[cfg(loom)]
            let cell = loom::cell::UnsafeCell::new(v);
            UnsafeCell(cell)
        }
    }
    /// Runs `f` with a mutable raw pointer to the contents.
    #[inline(always)]
    pub(crate) fn with_mut<F: FnOnce(*mut T) -> U, U>(&self, f: F) -> U {
        #[cfg(not(loom))]
        return f(self.0.get());
        #[cfg(loom)]
        return self.0.with_mut(f);
    }
}

/// The lock of `--cfg loom` builds (their `DefaultRawMutex`): a flag
/// under a loom mutex, with a loom condition variable its waiters sleep
/// on, so loom sees every acquisition and a waiter is *blocked* in the
/// model until the holder lets go (`spin`'s lock uses `core` atomics,
/// which loom cannot see, and would spin forever on a lock a descheduled
/// thread holds).
///
/// Not a spin lock over a loom atomic, as it was: a waiter that yields
/// stays runnable, and with two waiters on a lock a third thread holds,
/// loom may switch from one waiter to the other at every yield (a switch
/// after a yield costs nothing of its preemption bound), so the model has
/// executions of any length in which the holder never runs again. Three
/// threads taking one such lock once exceeded loom's branch limit, and
/// with 100,000 branches ran for minutes; so did a model of two CPUs
/// refilling from one depot whose lock a drain held. A blocked waiter is
/// not runnable, so loom runs the holder, and a real deadlock is reported
/// as one instead of spinning.
///
/// `RawMutex::INIT` is a `const`, and loom's objects are not, so the
/// lock's mutex and condition variable are made on first use, under a
/// mutex loom sees; every other thread takes that mutex once before its
/// first use of the lock, so loom sees them made before anyone touches
/// them (a lock made in one model thread and first taken in another is no
/// causality error).
#[cfg(loom)]
pub struct LoomRawMutex(std::sync::OnceLock<(usize, LoomLock)>);

/// A [`LoomRawMutex`]'s model objects.
#[cfg(loom)]
struct LoomLock {
    /// Whether the lock is held; its mutex is held only inside `lock`,
    /// `try_lock` and `unlock`.
    held: loom::sync::Mutex<bool>,
    /// Signalled by `unlock`: a waiter re-checks `held`.
    released: loom::sync::Condvar,
}

#[cfg(loom)]
loom::lazy_static! {
    /// Serialises making locks' model objects; holds the last lock id given.
    static ref LOOM_LOCKS: loom::sync::Mutex<usize> = loom::sync::Mutex::new(0);
}

#[cfg(loom)]
loom::thread_local! {
    /// Ids of the locks this model thread has synchronised with.
    static SEEN: core::cell::RefCell<std::vec::Vec<usize>> = core::cell::RefCell::new(std::vec::Vec::new());
}

#[cfg(loom)]
impl LoomRawMutex {
    fn state(&self) -> &LoomLock {
        if let Some((id, state)) = self.0.get()
            && SEEN.with(|s| s.borrow().contains(id))
        {
            return state;
        }
        // This thread's first use: through the mutex the objects were made
        // under (ids are never reused within a model execution, so a lock
        // made at the address of a freed one is new to every thread).
        let mut last = LOOM_LOCKS.lock().unwrap();
        let (id, state) = self.0.get_or_init(|| {
            *last += 1;
            (*last, LoomLock { held: loom::sync::Mutex::new(false), released: loom::sync::Condvar::new() })
        });
        SEEN.with(|s| s.borrow_mut().push(*id));
        state
    }
}

// SAFETY: `lock` and `try_lock` return holding the lock only after turning
// `held` from false to true under its mutex, and `unlock` turns it back
// under the same mutex: one holder at a time, and the mutex orders each
// holder's accesses before the next holder's.
#[cfg(loom)]
unsafe impl lock_api::RawMutex for LoomRawMutex {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = LoomRawMutex(std::sync::OnceLock::new());
    type GuardMarker = lock_api::GuardSend;
    fn lock(&self) {
        let l = self.state();
        let mut held = l.held.lock().unwrap();
        while *held {
            held = l.released.wait(held).unwrap();
        }
        *held = true;
    }
    fn try_lock(&self) -> bool {
        !core::mem::replace(&mut *self.state().held.lock().unwrap(), true)
    }
    unsafe fn unlock(&self) {
        let l = self.state();
        *l.held.lock().unwrap() = false;
        // One waiter: each unlock wakes the next (a waiter that finds the
        // lock taken again sleeps until that holder's unlock).
        l.released.notify_one();
    }
}

/// The default lock with `std` (outside loom): a spin lock whose waiters
/// give the CPU up, and that a waiter cannot starve in.
///
/// A waiter spins `SPINS_BEFORE_YIELD` (128) times, for the short critical
/// sections of two threads on two CPUs, then calls
/// [`std::thread::yield_now`] between attempts: with more runnable threads
/// than CPUs a lock holder can be preempted, and pure spinners then burn
/// whole time slices before it runs again (`benches/alloc.rs`,
/// `threads100-pair`: threads without a CPU slot share the slab locks).
///
/// Fairness (parking_lot's idea, with a handoff instead of a queue): a
/// plain test-and-set lock lets a thread that re-locks in a tight loop take
/// the lock again before a yielding waiter looks, so a third thread against
/// two re-lockers waited up to 3 s for it. A waiter that has failed
/// `SPINS_BEFORE_STARVING` (128) times marks itself *starving* (one such waiter
/// at a time); an unlock that sees the mark hands the lock over
/// (`HANDOFF`) instead of freeing it, so no fresh locker can take it first,
/// and only the starving waiter takes a handed-over lock. Once marked, a
/// waiter is bypassed by at most the acquisitions whose unlock read the
/// mark before it was visible: in practice at most one.
///
/// | `state` | meaning | who moves it |
/// | --- | --- | --- |
/// | `UNLOCKED` | free | any locker: CAS to `LOCKED` (Acquire) |
/// | `LOCKED` | held | its holder: store `UNLOCKED`, or `HANDOFF` if `starving` (Release) |
/// | `HANDOFF` | released to the starving waiter, not yet taken | only that waiter: CAS to `LOCKED` (Acquire) |
///
/// `starving` is set iff a waiter has marked itself (CAS `false` → `true`,
/// Acquire, pairing with the clear below) and not yet returned from `lock`;
/// that waiter clears it (Release) after taking the lock, before it
/// returns, so its own unlock, and every later holder's (ordered after it
/// through the lock's Release/Acquire chain), reads the clear or a newer
/// mark. An unlock reads it `Relaxed`: a mark set after that read is missed
/// for that one unlock only, which costs fairness for one acquisition,
/// never exclusion (the lock is still taken only by a CAS from `UNLOCKED`
/// or, by the marked waiter alone, from `HANDOFF`), and never progress
/// (`HANDOFF` is stored only while the marked waiter is still waiting).
///
/// Uncontended, `lock` + `unlock` cost one CAS and one Release store (plus
/// a load of `starving`, from the cache line the CAS just took).
#[cfg(all(feature = "std", not(loom)))]
pub struct YieldingRawMutex {
    /// `UNLOCKED`, `LOCKED` or `HANDOFF` (table above).
    state: AtomicU8,
    /// Set iff a waiter has marked itself starving and not yet returned
    /// from `lock`.
    starving: AtomicBool,
}

/// [`YieldingRawMutex::state`]: free.
#[cfg(all(feature = "std", not(loom)))]
const UNLOCKED: u8 = 0;
/// [`YieldingRawMutex::state`]: held.
#[cfg(all(feature = "std", not(loom)))]
const LOCKED: u8 = 1;
/// [`YieldingRawMutex::state`]: released to the starving waiter, which
/// alone may take it.
#[cfg(all(feature = "std", not(loom)))]
const HANDOFF: u8 = 2;

/// Failed attempts a [`YieldingRawMutex`] waiter spins through before it
/// starts yielding.
#[cfg(all(feature = "std", not(loom)))]
const SPINS_BEFORE_YIELD: u32 = 128;

/// Failed attempts after which a [`YieldingRawMutex`] waiter marks itself
/// starving: when it stops spinning and starts giving its CPU up. Two
/// threads contending on two CPUs keep the unfair lock's throughput (their
/// waits end within the spin), and a waiter never yields unmarked: a yield
/// can hand its CPU to a re-locker for a whole time slice, and an unmarked
/// waiter would be passed over throughout it.
#[cfg(all(feature = "std", not(loom)))]
const SPINS_BEFORE_STARVING: u32 = SPINS_BEFORE_YIELD;

// SAFETY: the lock is taken only by a CAS from `UNLOCKED` (Acquire), or,
// by the one waiter that marked itself starving, by a CAS from `HANDOFF`
// (Acquire); `unlock`, by the holder alone, stores `UNLOCKED` or `HANDOFF`
// with Release. So one holder at a time, and each holder sees what the
// previous one wrote.
#[cfg(all(feature = "std", not(loom)))]
unsafe impl lock_api::RawMutex for YieldingRawMutex {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = YieldingRawMutex { state: AtomicU8::new(UNLOCKED), starving: AtomicBool::new(false) };
    type GuardMarker = lock_api::GuardSend;
    #[inline]
    fn lock(&self) {
        if !self.try_lock() {
            self.lock_contended();
        }
    }
    #[inline]
    fn try_lock(&self) -> bool {
        self.state.compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }
    #[inline]
    unsafe fn unlock(&self) {
        // Relaxed: a mark this misses costs one acquisition's fairness
        // (type docs); the clear of an earlier mark is ordered before us
        // by the lock's Release/Acquire chain.
        let next = if self.starving.load(Ordering::Relaxed) { HANDOFF } else { UNLOCKED };
        self.state.store(next, Ordering::Release);
    }
    #[inline]
    fn is_locked(&self) -> bool {
        self.state.load(Ordering::Relaxed) != UNLOCKED
    }
}

#[cfg(all(feature = "std", not(loom)))]
impl YieldingRawMutex {
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let mut fails: u32 = 0;
        let mut marked = false;
        loop {
            // Wait with loads, not CASes, so waiters do not take the line
            // from the holder.
            let from = match self.state.load(Ordering::Relaxed) {
                UNLOCKED => Some(UNLOCKED),
                // Ours alone while marked: no one else moves it.
                HANDOFF if marked => Some(HANDOFF),
                _ => None,
            };
            if let Some(from) = from
                && self.state.compare_exchange(from, LOCKED, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                break;
            }
            fails = fails.saturating_add(1);
            if !marked && fails >= SPINS_BEFORE_STARVING {
                // Acquire pairs with the previous marked waiter's clear,
                // so we never read its `HANDOFF` as ours.
                marked = self.starving.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok();
            }
            if fails < SPINS_BEFORE_YIELD {
                core::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if marked {
            // Release: a waiter that marks itself next (Acquire) sees
            // `state` moved off our `HANDOFF` first.
            self.starving.store(false, Ordering::Release);
        }
    }
}

#[cfg(all(test, feature = "std", not(loom)))]
mod tests;

/// One step of a spin-wait loop: a CPU pause hint normally, a yield to the
/// scheduler under loom (so a model with a spinning thread still terminates).
#[inline]
#[allow(dead_code)]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}

/// Step `i` (counted from 0) of a wait for another thread that may be
/// preempted: a CPU pause hint for the first few steps, then, with `std`,
/// a yield of the CPU, which the waited-for thread may be waiting for (a
/// drain that spins on two CPUs shared by three threads waits out the
/// scheduler's whole time slice, milliseconds: `examples/drain_cost.rs`).
/// Without `std` (a kernel, whose holders mask interrupts) always a pause.
#[inline]
#[allow(dead_code)]
pub(crate) fn wait_step(i: usize) {
    #[cfg(all(feature = "std", not(loom)))]
    if i >= 64 {
        return std::thread::yield_now();
    }
    let _ = i;
    spin_hint();
}

/// Spins until `done` holds, a bounded while (`SETTLE_TRIES` tries, with
/// `std` yielding the CPU between them after the first few, then with
/// `std` outside Miri up to `SETTLE_TIME` (2 s) more, sleeping between
/// looks); returns whether it did. For waits on other threads' work in
/// flight outside an allocation path (`Cgroup::check_empty`, a typed
/// cache's destruction), where the waited-for thread may be preempted
/// or slow, and where the wait must end even if the caller is itself
/// what it waits for (a callback from inside that work).
pub(crate) fn wait_until(mut done: impl FnMut() -> bool) -> bool {
    const SETTLE_TRIES: usize = 1 << 16;
    for i in 0..SETTLE_TRIES {
        if done() {
            return true;
        }
        wait_step(i);
    }
    #[cfg(all(feature = "std", not(loom), not(miri)))]
    {
        let start = std::time::Instant::now();
        while start.elapsed() < SETTLE_TIME {
            if done() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
    done()
}

/// How long `wait_until` goes on waiting, by the clock, once its tries
/// are spent (`std`, outside Miri). The tries (about 65,000 yields) last
/// some 20-30 ms where the other CPU is free; a quarantined 32 MiB
/// object's poison, checked by the thread that took it out, took longer
/// in a debug build on a two-CPU Intel host, and `check_empty` then
/// reported its group charged (`tests/detect.rs`,
/// `check_empty_waits_for_objects_another_thread_releases`, 44 of 60
/// runs alone).
#[cfg(all(feature = "std", not(loom), not(miri)))]
const SETTLE_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// Defines a function `const` in normal builds and plain under loom, whose
/// atomics are built at run time (crossbeam's `const_fn!` pattern): one
/// body serves both, and loom models call it at run time.
macro_rules! loom_const_fn {
    ($(#[$m:meta])* $vis:vis fn $($rest:tt)*) => {
        #[cfg(not(loom))]
        $(#[$m])* $vis const fn $($rest)*
        #[cfg(loom)]
        $(#[$m])* $vis fn $($rest)*
    };
    ($(#[$m:meta])* $vis:vis unsafe fn $($rest:tt)*) => {
        #[cfg(not(loom))]
        $(#[$m])* $vis const unsafe fn $($rest)*
        #[cfg(loom)]
        $(#[$m])* $vis unsafe fn $($rest)*
    };
}
pub(crate) use loom_const_fn;

/// `[$e; $n]` with `$e` built `$n` times: a `const` block in normal builds,
/// `array::from_fn` under loom (whose atomics are not `const`).
macro_rules! repeat {
    ($e:expr; $n:expr) => {{
        #[cfg(not(loom))]
        let a = [const { $e }; $n];
        #[cfg(loom)]
        let a = core::array::from_fn(|_| $e);
        a
    }};
}
pub(crate) use repeat;

/// Constructors for atomics, `const` in normal builds.
macro_rules! atomic_ctor {
    ($name:ident, $ty:ty, $arg:ty) => {
        loom_const_fn! {
            #[inline]
            pub(crate) fn $name(v: $arg) -> $ty {
                <$ty>::new(v)
            }
        }
    };
}
atomic_ctor!(atomic_usize, AtomicUsize, usize);
atomic_ctor!(atomic_bool, AtomicBool, bool);
atomic_ctor!(atomic_u8, AtomicU8, u8);
atomic_ctor!(atomic_u32, AtomicU32, u32);

loom_const_fn! {
    /// A null `AtomicPtr`.
    #[inline]
    pub(crate) fn atomic_null<T>() -> AtomicPtr<T> {
        AtomicPtr::new(core::ptr::null_mut())
    }
}

/// A process-wide sequence number, for telling apart things that may
/// reuse an address (slabs); never a synchronisation decision. Under loom,
/// where statics cannot hold its atomics, always 0.
pub(crate) fn next_sequence() -> u32 {
    #[cfg(not(loom))]
    {
        static SEQ: AtomicU32 = AtomicU32::new(1);
        SEQ.fetch_add(1, Ordering::Relaxed)
    }
    #[cfg(loom)]
    0
}

/// A statistics counter: `Relaxed` increments and reads.
///
/// Relaxed is enough because no decision that guards memory safety is taken
/// on a statistic; readers (reports, tests after joining threads) tolerate a
/// value that is momentarily behind. Tests read them after a join, which
/// orders all earlier increments.
pub(crate) struct Stat(AtomicUsize);

impl Stat {
    loom_const_fn! {
        pub(crate) fn new() -> Self {
            Stat(atomic_usize(0))
        }
    }
    #[inline]
    pub(crate) fn add(&self, n: usize) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    #[inline]
    pub(crate) fn sub(&self, n: usize) {
        self.0.fetch_sub(n, Ordering::Relaxed);
    }
    #[inline]
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// Stores pointer `v` in the word at `p` as a `Relaxed` atomic (a pointer,
/// so the value keeps its provenance): a word in memory
/// the allocator owns that a report may read while its holder writes it
/// (a slab's owner words). Always `core`'s atomic, also under loom: its
/// order comes from handing the object over, which the models check.
///
/// # Safety
///
/// `p` is valid, aligned, and only ever accessed through these functions.
#[inline(always)]
pub(crate) unsafe fn word_store(p: *mut *mut (), v: *mut ()) {
    // SAFETY: per the contract.
    unsafe { core::sync::atomic::AtomicPtr::from_ptr(p) }.store(v, core::sync::atomic::Ordering::Relaxed)
}

/// A `Release` fence between [`word_store_shared`]s, for a reader that
/// loads them with [`word_load_if_aligned`] and [`shared_acquire_fence`]
/// in the other order (a seqlock's writer). Not loom's: these words are
/// plain atomics under loom too.
#[inline(always)]
pub(crate) fn shared_release_fence() {
    core::sync::atomic::fence(core::sync::atomic::Ordering::Release);
}

/// The reader's half of [`shared_release_fence`].
#[inline(always)]
pub(crate) fn shared_acquire_fence() {
    core::sync::atomic::fence(core::sync::atomic::Ordering::Acquire);
}

/// Stores `v` at `p`: a relaxed atomic store where `p` is aligned to a
/// word, else a plain unaligned write. For words another thread may read
/// meanwhile with [`word_load_if_aligned`] (detection's slot headers,
/// which `Cgroup::stat` reads while their owners write them).
///
/// # Safety
///
/// `p` is valid for a write of a word; where it is aligned, every
/// access that may race this one is atomic.
pub(crate) unsafe fn word_store_shared(p: *mut usize, v: usize) {
    if p.is_aligned() {
        // SAFETY: aligned and valid (caller).
        unsafe { core::sync::atomic::AtomicUsize::from_ptr(p) }.store(v, core::sync::atomic::Ordering::Relaxed)
    } else {
        // SAFETY: valid (caller); no reader reads it concurrently.
        unsafe { p.write_unaligned(v) }
    }
}

/// [`word_store_shared`] of a pointer.
///
/// # Safety
///
/// As for [`word_store_shared`].
pub(crate) unsafe fn ptr_store_shared(p: *mut *const (), v: *const ()) {
    if p.is_aligned() {
        // SAFETY: aligned and valid (caller).
        unsafe { core::sync::atomic::AtomicPtr::from_ptr(p.cast::<*mut ()>()) }
            .store(v.cast_mut(), core::sync::atomic::Ordering::Relaxed)
    } else {
        // SAFETY: valid (caller); no reader reads it concurrently.
        unsafe { p.write_unaligned(v) }
    }
}

/// The word at `p` by a relaxed atomic load, if `p` is aligned to a word
/// (see [`word_store_shared`]); `None` otherwise, without reading.
///
/// # Safety
///
/// `p` is valid for a read of a word; every write that may race this
/// read is atomic.
pub(crate) unsafe fn word_load_if_aligned(p: *mut usize) -> Option<usize> {
    // SAFETY: aligned and valid (caller).
    p.is_aligned()
        .then(|| unsafe { core::sync::atomic::AtomicUsize::from_ptr(p) }.load(core::sync::atomic::Ordering::Relaxed))
}

/// Loads the word at `p` stored by [`word_store`].
///
/// # Safety
///
/// As for [`word_store`].
#[inline(always)]
pub(crate) unsafe fn word_load(p: *mut *mut ()) -> *mut () {
    // SAFETY: per the contract.
    unsafe { core::sync::atomic::AtomicPtr::from_ptr(p) }.load(core::sync::atomic::Ordering::Relaxed)
}
