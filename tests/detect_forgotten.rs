//! A `Kmem` with detection that is freed without its drop running (a
//! `ManuallyDrop` in a `Box`, all safe code) is not left registered for
//! the process's exit and fault hooks, which would read it after it is
//! gone (found by a review: the exit hook's quarantine check faulted on
//! the freed `Kmem`, SIGSEGV after every test had passed). Only `Kmem`s in
//! the program's static memory register. A test binary of its own: the
//! failure is the process's exit.

use core::mem::ManuallyDrop;

use kmemcg::{Detection, Kmem, OsPages};

#[test]
fn a_forgotten_kmem_is_not_checked_at_exit() {
    let b: Box<ManuallyDrop<Kmem>> =
        Box::new(ManuallyDrop::new(Kmem::new(OsPages::new()).with_detection(Detection::ALL.guard_pages(0))));
    let mut v = allocator_api2::vec::Vec::new_in(&**b);
    v.push(1u64);
    // A poisoned free: before, it registered `*b` for the exit hook.
    drop(v);
    // Frees the `Kmem`'s memory (large enough that glibc unmaps it); its
    // drop, which unregistered it, never runs.
    drop(b);
}
