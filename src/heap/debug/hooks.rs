//! The process hooks of detection (`std`): the quarantine checked when
//! the program exits (a write after free whose object is still
//! quarantined then would go unseen otherwise), and a `SIGSEGV` handler
//! that turns a fault on a sampled object's guard page, or on a freed
//! sampled object's pages, into a report naming the object.
//!
//! An allocator registers itself at its first poisoned free or first
//! sample (at most [`MAX`] at once; more are not checked) and is
//! unregistered when its detector is dropped. Only an allocator in the
//! program's static memory registers (a `static`, such as a
//! `#[global_allocator]`): the hooks run at exit and on any fault, and a
//! `Kmem` anywhere else can be freed without its drop running (it was
//! forgotten, or moved and left), which they could not know (a review
//! found the exit hook reading a freed `Kmem`). Under Miri, none does. One `atexit` handler and
//! one signal handler serve them all; a fault that is no allocator's goes
//! on to the handler installed before (Rust's stack-overflow handler, a
//! program's own), or to the default action.

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;

use lock_api::RawMutex;

use crate::heap::Kmem;
use crate::platform::{PageSource, Platform};
use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

/// How many allocators can be registered.
const MAX: usize = 16;

/// A registered allocator: its address (null: a free entry), and the
/// functions that check it at exit and look a fault address up (written
/// before the address is published).
struct Entry {
    kmem: AtomicPtr<()>,
    at_exit: AtomicPtr<()>,
    at_fault: AtomicPtr<()>,
}

static ENTRIES: [Entry; MAX] = [const {
    Entry {
        kmem: AtomicPtr::new(core::ptr::null_mut()),
        at_exit: AtomicPtr::new(core::ptr::null_mut()),
        at_fault: AtomicPtr::new(core::ptr::null_mut()),
    }
}; MAX];

/// Set once the hooks are being installed (by the first registration).
static INSTALLED: AtomicUsize = AtomicUsize::new(0);

/// The `SIGSEGV` action before ours, written once before ours is
/// installed, read by the handler.
struct OldAction(UnsafeCell<MaybeUninit<libc::sigaction>>);

// SAFETY: written once, by the one registration that installs the
// handler, before the handler can run; only read after.
unsafe impl Sync for OldAction {}

static OLD: OldAction = OldAction(UnsafeCell::new(MaybeUninit::zeroed()));

/// Checks the quarantine of the `Kmem<S, R, P>` at `k`.
///
/// # Safety
///
/// `k` is a live `Kmem<S, R, P>`.
unsafe fn check<S: PageSource, R: RawMutex, P: Platform>(k: *const ()) {
    // SAFETY: per the contract.
    unsafe { &*k.cast::<Kmem<S, R, P>>() }.check_quarantine();
}

/// Reports a fault at `addr` on a sampled object of the `Kmem<S, R, P>`
/// at `k` and aborts; returns if `addr` is none of its.
///
/// # Safety
///
/// `k` is a live `Kmem<S, R, P>`.
unsafe fn fault<S: PageSource, R: RawMutex, P: Platform>(k: *const (), addr: usize) {
    // SAFETY: per the contract.
    unsafe { &*k.cast::<Kmem<S, R, P>>() }.report_guard_fault(addr);
}

unsafe extern "C" {
    /// The first byte of the program's image and the end of its static
    /// data (symbols both GNU ld and lld define); only their addresses
    /// are taken.
    static __ehdr_start: u8;
    static _end: u8;
}

/// Whether `addr` lies in the program's static memory (its image, up to
/// the end of its `.bss`), which lives until the process exits.
fn in_program_image(addr: usize) -> bool {
    if cfg!(miri) {
        return false;
    }
    let (lo, hi) = (core::ptr::addr_of!(__ehdr_start).addr(), core::ptr::addr_of!(_end).addr());
    (lo..hi).contains(&addr)
}

/// Registers `k` for both hooks, installing them the first time, if it
/// is in the program's static memory (see the module docs); a `Kmem`
/// stays where it is once used, until its detector unregisters it.
pub(super) fn register<S: PageSource, R: RawMutex, P: Platform>(k: &Kmem<S, R, P>) {
    let at_exit: unsafe fn(*const ()) = check::<S, R, P>;
    let at_fault: unsafe fn(*const (), usize) = fault::<S, R, P>;
    let kmem = (k as *const Kmem<S, R, P>).cast::<()>().cast_mut();
    if !in_program_image(kmem.addr()) {
        return;
    }
    for e in &ENTRIES {
        // AcqRel/Acquire pairs with `unregister`'s Release: the entry is
        // free. Then `kmem` is published (Release) after the functions.
        if e.at_exit
            .compare_exchange(core::ptr::null_mut(), at_exit as *mut (), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            e.at_fault.store(at_fault as *mut (), Ordering::Release);
            e.kmem.store(kmem, Ordering::Release);
            k.detect.hooked.store(kmem.addr(), Ordering::Relaxed);
            break;
        }
    }
    // Relaxed: only the installation itself is guarded.
    if INSTALLED.swap(1, Ordering::Relaxed) == 0 {
        install();
    }
}

/// Installs the `atexit` handler and the `SIGSEGV` handler.
#[cold]
fn install() {
    // (1) `at_exit` is an `extern "C" fn()` that lives as long as the
    // program (glibc's `atexit` takes its own lock and uses a static table
    // for the first 32 handlers: it does not allocate through us). (2)
    // `OLD` is written here, once, before the handler that reads it is
    // installed; the action is fully initialised (zeroed, then set).
    // SAFETY: (1) and (2) above.
    unsafe {
        libc::atexit(at_exit);
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_fault as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGSEGV, &sa, (*OLD.0.get()).as_mut_ptr());
    }
}

/// Forgets the allocator at address `kmem`, if registered.
pub(super) fn unregister(kmem: usize) {
    for e in &ENTRIES {
        if e.kmem.load(Ordering::Acquire).addr() == kmem {
            e.kmem.store(core::ptr::null_mut(), Ordering::Release);
            e.at_fault.store(core::ptr::null_mut(), Ordering::Release);
            e.at_exit.store(core::ptr::null_mut(), Ordering::Release);
        }
    }
}

/// The registered allocators with their function `f` (an entry's
/// `at_exit` or `at_fault`).
fn each(f: impl Fn(&Entry) -> &AtomicPtr<()>, mut call: impl FnMut(*mut (), *mut ())) {
    for e in &ENTRIES {
        // Acquire pairs with `register`'s Release store of `kmem`, made
        // after those of the functions.
        let kmem = e.kmem.load(Ordering::Acquire);
        let func = f(e).load(Ordering::Acquire);
        if !kmem.is_null() && !func.is_null() {
            call(kmem, func);
        }
    }
}

/// The `atexit` handler: checks every registered allocator.
extern "C" fn at_exit() {
    each(
        |e| &e.at_exit,
        // SAFETY: `func` was stored from an `unsafe fn(*const ())` by
        // `register` for this `kmem`, live until its detector unregisters
        // it.
        |kmem, func| unsafe { core::mem::transmute::<*mut (), unsafe fn(*const ())>(func)(kmem) },
    );
}

/// The `SIGSEGV` handler: a report and an abort for a fault on a sampled
/// object of a registered allocator; else the action installed before.
extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid `siginfo_t` with `SA_SIGINFO`.
    let addr = unsafe { (*info).si_addr() }.addr();
    each(
        |e| &e.at_fault,
        // SAFETY: as in `at_exit`, for an `unsafe fn(*const (), usize)`.
        |kmem, func| unsafe { core::mem::transmute::<*mut (), unsafe fn(*const (), usize)>(func)(kmem, addr) },
    );
    // SAFETY: `OLD` was written before this handler was installed.
    let old = unsafe { (*OLD.0.get()).assume_init_ref() };
    let h = old.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        // Back to the default action, and return: the access faults again
        // and the process ends as it would have without us.
        // SAFETY: a default action.
        unsafe {
            let mut dfl: libc::sigaction = core::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, core::ptr::null_mut());
        }
    } else if old.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the handler installed before ours, with its arguments.
        unsafe {
            let f = core::mem::transmute::<
                libc::sighandler_t,
                extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void),
            >(h);
            f(sig, info, ctx);
        }
    } else {
        // SAFETY: as above, a handler of one argument.
        unsafe { core::mem::transmute::<libc::sighandler_t, extern "C" fn(libc::c_int)>(h)(sig) };
    }
}
