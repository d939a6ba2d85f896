//! A user's small test suite with kmemcg as the global allocator, the
//! shape a user runs under Miri (`cargo +nightly miri test --test
//! miri_suite`): a `Vec` of 100, 300 boxes of 32 bytes, 40 vectors from a
//! second thread, a group entered and removed. Built with the environment
//! variable `MIRI_SUITE_SYSTEM` set, the same tests run on
//! `std::alloc::System` instead, for the time to compare against (see
//! `.ci/run`).

use std::alloc::{GlobalAlloc, Layout, System};

use kmemcg::{Kmem, OsPages};

static KMEM: Kmem = Kmem::new(OsPages::new());

/// `System` when built with `MIRI_SUITE_SYSTEM` set, else kmemcg.
const SYSTEM: bool = option_env!("MIRI_SUITE_SYSTEM").is_some();

struct Either;

// SAFETY: forwards every call to one allocator, chosen at compile time.
unsafe impl GlobalAlloc for Either {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { if SYSTEM { System.alloc(layout) } else { KMEM.alloc(layout) } }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded to the allocator that made the block.
        unsafe { if SYSTEM { System.dealloc(ptr, layout) } else { KMEM.dealloc(ptr, layout) } }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded to the allocator that made the block.
        unsafe { if SYSTEM { System.realloc(ptr, layout, new_size) } else { KMEM.realloc(ptr, layout, new_size) } }
    }
}

#[global_allocator]
static A: Either = Either;

#[test]
fn a_vec_of_100() {
    let v: Vec<u64> = (0..100).collect();
    assert_eq!(v.iter().sum::<u64>(), 4950);
}

#[test]
fn boxes_of_32_bytes() {
    let boxes: Vec<Box<[u8; 32]>> = (0..300).map(|i| Box::new([i as u8; 32])).collect();
    assert!(boxes.iter().enumerate().all(|(i, b)| b[31] == i as u8));
}

#[test]
fn vectors_from_a_second_thread() {
    let vs = std::thread::spawn(|| (0..40).map(|i| vec![i; i + 1]).collect::<Vec<Vec<usize>>>()).join().unwrap();
    assert_eq!(vs[39].len(), 40);
}

#[test]
fn a_group_entered_and_removed() {
    if SYSTEM {
        return;
    }
    let g = KMEM.root().create_child("t").unwrap();
    {
        let _in = g.enter();
        let v = vec![1u8; 4096];
        assert_eq!(v.len(), 4096);
    }
    KMEM.shrink();
    g.remove().unwrap();
}
