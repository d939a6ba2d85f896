//! `Threads` gives a thread's slot back from its pthread key destructor
//! (`release_slot`). glibc runs key destructors in rounds, at most
//! `PTHREAD_DESTRUCTOR_ITERATIONS` (4) of them; a key destructor that runs
//! after kmemcg's in the last round and allocates or frees through the
//! allocator made the exiting thread claim a slot again and set kmemcg's
//! key again, which glibc then never looked at: the slot stayed claimed
//! for good (its magazines stranded, no reap could take it), and its
//! `OWNER` entry named the dead thread's `FAST` word, which the next
//! revocation read (found by a review: SIGSEGV once the thread's stack was
//! unmapped). An exiting thread past kmemcg's hook now takes the shared
//! path.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};

use kmemcg::{Kmem, MAX_CPUS, OsPages, Platform, Threads};

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());
/// The tests take slots from the whole process: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
static USER_KEY: AtomicUsize = AtomicUsize::new(usize::MAX);
static DTOR_RUNS: AtomicUsize = AtomicUsize::new(0);

fn layout() -> Layout {
    Layout::from_size_align(64, 8).unwrap()
}

/// A key destructor that frees and allocates through the allocator and
/// sets its key again (as a lazily re-created per-thread cache would), so
/// glibc calls it in every round, the last included.
unsafe extern "C" fn user_dtor(v: *mut libc::c_void) {
    DTOR_RUNS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: `v` is the block the previous round (or the thread) set, of
    // `layout()`; the key is live.
    unsafe {
        KMEM.dealloc(v.cast(), layout());
        let p = KMEM.alloc(layout());
        libc::pthread_setspecific(USER_KEY.load(Ordering::Relaxed) as libc::pthread_key_t, p.cast());
    }
}

/// Slots nobody can take now (the calling thread holds none).
fn stuck_slots() -> Vec<usize> {
    (0..MAX_CPUS)
        .filter(|&s| {
            // SAFETY: taken and given back at once, touching nothing.
            unsafe {
                if Threads.steal(s) {
                    Threads.unsteal(s);
                    false
                } else {
                    true
                }
            }
        })
        .collect()
}

#[test]
fn a_key_destructor_that_allocates_in_the_last_round_keeps_no_slot() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    assert!(stuck_slots().is_empty());
    // A large stack: glibc does not cache it, so it goes at the join, with
    // the thread's static TLS (its `FAST` word) in it.
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(|| {
            // SAFETY: blocks of `layout()`, each freed once (the last one
            // by the key destructor's last round... which allocates one
            // more, leaked with the thread); a fresh key.
            unsafe {
                // The first allocation claims a slot (and creates kmemcg's
                // key, before the user's: its destructor runs first).
                let p = KMEM.alloc(layout());
                KMEM.dealloc(p, layout());
                let mut key: libc::pthread_key_t = 0;
                assert_eq!(libc::pthread_key_create(&mut key, Some(user_dtor)), 0);
                USER_KEY.store(key as usize, Ordering::Relaxed);
                libc::pthread_setspecific(key, KMEM.alloc(layout()).cast());
            }
        })
        .unwrap()
        .join()
        .unwrap();
    assert!(DTOR_RUNS.load(Ordering::Relaxed) >= 2, "the destructor ran after kmemcg's hook");
    let stuck = stuck_slots();
    assert!(stuck.is_empty(), "slot(s) {stuck:?} kept by a thread that exited");
    // Every slot taken: a new thread is turned away and revokes every
    // published holder (before the fix, the dead thread's `FAST` too).
    // SAFETY: taken here, given back below.
    let taken: Vec<usize> = (0..MAX_CPUS).filter(|&s| unsafe { Threads.steal(s) }).collect();
    std::thread::spawn(|| {
        // SAFETY: a valid layout; freed once.
        unsafe {
            let p = KMEM.alloc(layout());
            assert!(!p.is_null());
            KMEM.dealloc(p, layout());
        }
    })
    .join()
    .unwrap();
    for s in taken {
        // SAFETY: taken above by this thread.
        unsafe { Threads.unsteal(s) };
    }
}

static USER_KEY2: AtomicUsize = AtomicUsize::new(usize::MAX);
static ROUNDS2: AtomicUsize = AtomicUsize::new(0);

/// Sets its key again for three rounds, and frees and allocates through
/// the allocator only in the fourth (glibc's last).
unsafe extern "C" fn late_dtor(v: *mut libc::c_void) {
    let round = ROUNDS2.fetch_add(1, Ordering::Relaxed) + 1;
    let key = USER_KEY2.load(Ordering::Relaxed) as libc::pthread_key_t;
    // SAFETY: the key is live; `v` is this test's marker until the last
    // round, which allocates a block and leaks it with the thread.
    unsafe {
        if round < 4 {
            libc::pthread_setspecific(key, v);
        } else {
            let p = KMEM.alloc(layout());
            KMEM.dealloc(p, layout());
        }
    }
}

#[test]
fn a_thread_without_a_slot_at_exit_claims_none_in_the_last_round() {
    // A thread that used the allocator without a slot (every slot taken,
    // as when threads outnumber slots, or after giving its own up) left
    // kmemcg's key null, so no exit hook ran for it, and a key destructor
    // allocating in glibc's last round claimed a slot for good (a review
    // of the first fix). Now its key holds a value that names no slot.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: taken here, given back below, before the thread exits.
    let taken: Vec<usize> = (0..MAX_CPUS).filter(|&s| unsafe { Threads.steal(s) }).collect();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            // SAFETY: a valid layout, freed once; a fresh key whose value
            // is a marker, not memory.
            unsafe {
                // No slot is free: the shared path.
                let p = KMEM.alloc(layout());
                assert!(!p.is_null());
                KMEM.dealloc(p, layout());
                let mut key: libc::pthread_key_t = 0;
                assert_eq!(libc::pthread_key_create(&mut key, Some(late_dtor)), 0);
                USER_KEY2.store(key as usize, Ordering::Relaxed);
                libc::pthread_setspecific(key, core::ptr::without_provenance(1));
            }
            ready_tx.send(()).unwrap();
            // Slots are free again by the time its destructors run.
            go_rx.recv().unwrap();
        })
        .unwrap();
    ready_rx.recv().unwrap();
    for s in taken {
        // SAFETY: taken above by this thread.
        unsafe { Threads.unsteal(s) };
    }
    go_tx.send(()).unwrap();
    t.join().unwrap();
    assert_eq!(ROUNDS2.load(Ordering::Relaxed), 4, "the destructor ran in glibc's last round");
    let stuck = stuck_slots();
    assert!(stuck.is_empty(), "slot(s) {stuck:?} kept by a thread that exited without one");
}
