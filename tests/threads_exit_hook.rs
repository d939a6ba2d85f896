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
