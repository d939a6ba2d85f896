//! NUMA: two simulated nodes (a `Region` each) and a platform that pins
//! threads to nodes. Allocations come from the thread's node; a free of a
//! remote object goes back to its home node, not into the freeing CPU's
//! magazines.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use kmemcg::{Kmem, MAX_CPUS, PageSource, Platform, Region};

thread_local! {
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

static TAKEN: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];

/// Slot `i` runs on node `i % 2`; a thread pins itself with `pin(slot)`.
struct TwoNodes;

fn pin(slot: usize) {
    assert!(!TAKEN[slot].swap(true, Ordering::AcqRel), "slot {slot} pinned twice");
    SLOT.with(|s| s.set(slot));
}

fn unpin(slot: usize) {
    SLOT.with(|s| s.set(usize::MAX));
    TAKEN[slot].store(false, Ordering::Release);
}

// SAFETY: (1) `pin` hands each slot to one thread at a time; (2) nodes 0
// and 1; (3) not asymmetric; (4) `steal` takes only unpinned slots, by
// the same flag; (5) nothing here allocates; (6) this test uses no
// groups, so every context stays in the root.
unsafe impl Platform for TwoNodes {
    fn current_group(&self) -> *const () {
        core::ptr::null()
    }
    unsafe fn set_current_group(&self, _token: *const ()) -> *const () {
        core::ptr::null()
    }
    unsafe fn enter(&self) -> Option<usize> {
        let s = SLOT.with(Cell::get);
        (s != usize::MAX).then_some(s)
    }
    unsafe fn exit(&self, _slot: usize) {}
    fn node_of(&self, slot: usize) -> usize {
        slot % 2
    }
    fn nodes(&self) -> usize {
        2
    }
    unsafe fn steal(&self, slot: usize) -> bool {
        !TAKEN[slot].swap(true, Ordering::AcqRel)
    }
    unsafe fn unsteal(&self, slot: usize) {
        TAKEN[slot].store(false, Ordering::Release);
    }
}

const ARENA: usize = 16 << 20;

#[test]
fn allocations_are_node_local_and_remote_frees_go_home() {
    let k: &'static Kmem<Region, kmemcg::DefaultRawMutex, TwoNodes> =
        Box::leak(Box::new(Kmem::with_platform(Region::new(), TwoNodes)));
    let mut ranges = Vec::new();
    for node in 0..2 {
        let mem = Box::leak(vec![MaybeUninit::<u8>::uninit(); ARENA].into_boxed_slice());
        let lo = mem.as_ptr() as usize;
        ranges.push(lo..lo + ARENA);
        k.source().add(mem, node).unwrap();
    }
    let node_of = move |p: usize| ranges.iter().position(|r| r.contains(&p)).unwrap();
    let node_of2 = node_of.clone();
    let layout = Layout::from_size_align(64, 8).unwrap();

    // A thread on node 1 allocates; everything comes from node 1.
    let remote: Vec<usize> = thread::spawn(move || {
        pin(1);
        // SAFETY: valid layout.
        let v: Vec<usize> = (0..5000).map(|_| unsafe { k.alloc(layout) } as usize).collect();
        assert!(v.iter().all(|&p| node_of2(p) == 1), "node-1 thread got node-0 memory");
        unpin(1);
        v
    })
    .join()
    .unwrap();

    // A thread on node 0 frees them (remote frees) and then allocates: it
    // must only ever get node-0 objects, so none of the node-1 objects can
    // have gone into its magazines.
    thread::spawn(move || {
        pin(0);
        for &p in &remote {
            // SAFETY: live blocks, freed once.
            unsafe { k.dealloc(p as *mut u8, layout) };
        }
        // SAFETY: valid layout.
        let mine: Vec<usize> = (0..5000).map(|_| unsafe { k.alloc(layout) } as usize).collect();
        assert!(mine.iter().all(|&p| node_of(p) == 0), "a remote free landed in a local magazine");
        for p in mine {
            // SAFETY: freed once.
            unsafe { k.dealloc(p as *mut u8, layout) };
        }
        unpin(0);
    })
    .join()
    .unwrap();

    // The node-1 objects went home: node 1's slabs are all empty again.
    k.shrink();
    assert_eq!(k.source().stats().pages_in_use, 0);
    assert_eq!(k.source().free_pages_on(1) + k.source().free_pages_on(0), k.source().stats().pages_reserved);
}
