//! Loom models of `Threads`' revocation protocol (`platform/revoke.rs`):
//! a thread turned away for want of a slot switches every armed holder's
//! fast-path word to counting, through pointers the holders publish and
//! withdraw.

use loom::sync::Arc;
use loom::thread;

use crate::platform::revoke::{NONE, Revoker, armed, fast_hold as hold};
use crate::sync::{AtomicUsize, Ordering};

/// A holder publishes its word, arms, holds once and withdraws, then
/// its word's memory is used again (here: the value 0, an armed word
/// of slot 0, as a new thread on the same stack would write) while a
/// thread turned away revokes: the revoker must never write the word
/// after the withdrawal, so it still reads 0 at the end.
#[test]
fn loom_a_revocation_never_writes_a_withdrawn_word() {
    loom::model(|| {
        let rev = Arc::new(Revoker::new());
        let word = Arc::new(AtomicUsize::new(NONE));
        let holder = {
            let (rev, word) = (rev.clone(), word.clone());
            thread::spawn(move || {
                // SAFETY: the word outlives the model's threads (the
                // `Arc`), and is withdrawn below.
                unsafe { rev.publish(0, &word) };
                rev.arm(0, &word);
                assert_eq!(hold(&word), Some(0));
                rev.withdraw(0);
                word.store(0, Ordering::Relaxed);
            })
        };
        let turned_away = {
            let rev = rev.clone();
            thread::spawn(move || rev.contend())
        };
        holder.join().unwrap();
        turned_away.join().unwrap();
        assert_eq!(word.load(Ordering::Relaxed), 0, "a revoker wrote a withdrawn word");
    });
}

/// A holder arming while a thread turned away raises contention: once
/// both are done, the holder counts (its word is not armed), whichever
/// came first, so no holder stays armed, uncounted, through contention.
#[test]
fn loom_no_holder_stays_armed_through_contention() {
    loom::model(|| {
        let rev = Arc::new(Revoker::new());
        let word = Arc::new(AtomicUsize::new(NONE));
        let holder = {
            let (rev, word) = (rev.clone(), word.clone());
            thread::spawn(move || {
                // SAFETY: as above; withdrawn before the model ends.
                unsafe { rev.publish(1, &word) };
                rev.arm(1, &word);
            })
        };
        rev.contend();
        holder.join().unwrap();
        assert!(rev.contended());
        assert_ne!(word.load(Ordering::Relaxed), armed(1), "armed through contention");
        assert_eq!(hold(&word), Some(1), "a counting word grants counted holds");
        rev.withdraw(1);
    });
}
