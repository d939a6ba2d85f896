//! Fairness of the default lock with `std` ([`YieldingRawMutex`]).

use lock_api::RawMutex as _;

use super::{AtomicBool, AtomicUsize, Ordering, YieldingRawMutex};
use crate::testutil::scaled;

/// A waiter that has marked itself starving gets the lock before any
/// fresh locker: the unlock hands it over, and `try_lock` fails until the
/// waiter has had it. (The test-and-set lock this replaced let the
/// releasing thread take it straight back.)
#[test]
fn yielding_lock_hands_over_to_a_starving_waiter() {
    let m = YieldingRawMutex::INIT;
    let waiter_had_it = AtomicBool::new(false);
    m.lock();
    std::thread::scope(|s| {
        s.spawn(|| {
            m.lock();
            waiter_had_it.store(true, Ordering::Relaxed);
            // SAFETY: this thread holds the lock.
            unsafe { m.unlock() };
        });
        // The waiter marks itself after a bounded number of failed tries.
        while !m.starving.load(Ordering::Relaxed) {
            std::thread::yield_now();
        }
        // SAFETY: this thread holds the lock.
        unsafe { m.unlock() };
        while !m.try_lock() {
            std::thread::yield_now();
        }
        assert!(waiter_had_it.load(Ordering::Relaxed), "a fresh locker took the lock before a starving waiter");
        // SAFETY: this thread holds the lock.
        unsafe { m.unlock() };
    });
    assert!(!m.is_locked() && !m.starving.load(Ordering::Relaxed));
}

/// Bounded bypass: two threads re-take the lock in a tight loop (with
/// `try_lock`, so they are always fresh lockers and never mark themselves)
/// while a third takes it `rounds` times with `lock`. Each re-locker counts
/// its acquisitions made while the third was marked starving: per wait of
/// the third that is at most its holder at marking time plus one unlock
/// that read the mark just before it was visible, so at most 2 per round,
/// whatever the scheduler does. The test-and-set lock this replaced has no
/// such bound (a third thread waited up to 3 s, millions of acquisitions,
/// against two re-lockers).
#[test]
fn yielding_lock_bounds_bypasses_of_a_starving_waiter() {
    let m = YieldingRawMutex::INIT;
    let rounds = scaled(300, 30);
    let done = AtomicBool::new(false);
    let bypasses = AtomicUsize::new(0);
    let others = AtomicUsize::new(0);
    let running = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let (mut mine, mut passed) = (0, 0);
                running.fetch_add(1, Ordering::Relaxed);
                while !done.load(Ordering::Relaxed) {
                    if m.try_lock() {
                        mine += 1;
                        passed += usize::from(m.starving.load(Ordering::Relaxed));
                        // SAFETY: this thread holds the lock.
                        unsafe { m.unlock() };
                    }
                }
                others.fetch_add(mine, Ordering::Relaxed);
                bypasses.fetch_add(passed, Ordering::Relaxed);
            });
        }
        while running.load(Ordering::Relaxed) < 2 {
            std::thread::yield_now();
        }
        for _ in 0..rounds {
            m.lock();
            // A short hold, so the re-lockers find it held now and then.
            core::hint::spin_loop();
            // SAFETY: this thread holds the lock.
            unsafe { m.unlock() };
        }
        done.store(true, Ordering::Relaxed);
    });
    let (bypasses, others) = (bypasses.load(Ordering::Relaxed), others.load(Ordering::Relaxed));
    std::eprintln!("{rounds} rounds: {bypasses} bypasses of the starving waiter, {others} re-lock acquisitions");
    assert!(bypasses <= 2 * rounds, "{bypasses} bypasses of a starving waiter in {rounds} waits");
}
