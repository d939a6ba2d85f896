//! `NoCpus` is `Sync` (a `static` can hold it), so safe code can share it
//! among threads.
//!
//! 1. Each thread has its own current group with `std`: an allocation
//!    reads the token and uses its group without a reference of its own,
//!    and with one token for every thread, one thread's guard drop
//!    released the group another thread was allocating in (found by a
//!    review). `enter_on_one_thread_is_not_anothers_group` checks it.
//! 2. Changing a context's marks (an atomic scope, a callback) reads the
//!    token and writes it back retagged: done as a plain read and write
//!    on a token shared by every thread, another thread's `enter` between
//!    the two was undone, its group's reference lost, and its guard later
//!    released another reference a second time, so a group was freed
//!    while a handle still held it (found by a review session's attack).
//!    Without `std` the token is still shared, and the retag is a
//!    compare-and-swap; with it, the race below must keep every reference
//!    all the same.

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kmemcg::{Kmem, NoCpus, Region, YieldingRawMutex};

type K = Kmem<Region, YieldingRawMutex, NoCpus>;

#[test]
fn atomic_scopes_racing_enters_on_nocpus_keep_every_group_reference() {
    let k: &'static K = Box::leak(Box::new(Kmem::with_platform(Region::new(), NoCpus::new())));
    k.source().add(Box::leak(vec![MaybeUninit::uninit(); 8 << 20].into_boxed_slice()), 0).unwrap();
    let g = k.root().create_child("g").unwrap();
    let g2 = k.root().create_child("g2").unwrap();
    // The shared token names `g`, with a reference of its own.
    std::mem::forget(g.enter());
    let stop: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let enters = std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            drop(g2.enter());
        }
    });
    let scopes = std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            drop(k.atomic_scope());
        }
    });
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    enters.join().unwrap();
    scopes.join().unwrap();
    // The handle and the token's reference keep `g`: removed, shrunk and
    // followed by new groups, it must still be itself.
    g.remove().unwrap();
    k.shrink();
    let others: Vec<_> = (0..8).map(|i| k.root().create_child(&format!("other{i}")).unwrap()).collect();
    assert_eq!(g.name(), "g", "g was freed and its memory reused while its handle lived");
    drop(others);
}

#[test]
fn enter_on_one_thread_is_not_anothers_group() {
    let k: &'static K = Box::leak(Box::new(Kmem::with_platform(Region::new(), NoCpus::new())));
    k.source().add(Box::leak(vec![MaybeUninit::uninit(); 8 << 20].into_boxed_slice()), 0).unwrap();
    let g = k.root().create_child("g").unwrap();
    let guard = g.enter();
    assert_eq!(k.current_group().name(), "g");
    let other = std::thread::spawn(move || {
        let name = k.current_group().name().to_string();
        let _mine = k.root().create_child("mine").unwrap().enter();
        (name, k.current_group().name().to_string())
    });
    let (seen, mine) = other.join().unwrap();
    assert_eq!(seen, "/", "another thread allocated in this thread's group, without a reference to it");
    assert_eq!(mine, "mine");
    assert_eq!(k.current_group().name(), "g", "another thread's guard changed this thread's group");
    drop(guard);
    assert_eq!(k.current_group().name(), "/");
}
